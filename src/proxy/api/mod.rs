//! The gateway's own `/v1` endpoints, answered without a backend: scoped tokens
//! ([`tokens`]), webhook endpoints ([`webhooks`]), and `svcgate listen` streams ([`listen`])
//! fed by one reader of the event log ([`event_hub`]).

pub mod event_hub;
pub mod listen;
pub mod tokens;
pub mod webhooks;
