//! The gateway's own `/v1` endpoints, answered without a backend: scoped tokens
//! ([`tokens`]), webhook endpoints ([`webhooks`]), `svcgate listen` streams ([`listen`])
//! fed by one reader of the event log ([`event_hub`]), GitHub's secret-scanning alerts
//! ([`secret_scanning`]), and the gateway's OpenAPI document ([`openapi`]).

pub mod event_hub;
pub mod listen;
pub mod openapi;
pub mod secret_scanning;
pub mod tokens;
pub mod webhooks;
