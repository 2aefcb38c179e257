//! The gateway's own `/v1` endpoints, answered without a backend: scoped tokens
//! ([`tokens`]), webhook endpoints ([`webhooks`]), `svcgate listen` streams ([`listen`])
//! fed by one reader of the event log ([`event_hub`]), and the gateway's OpenAPI document
//! ([`openapi`]).

pub mod event_hub;
pub mod listen;
pub mod openapi;
pub mod tokens;
pub mod webhooks;
