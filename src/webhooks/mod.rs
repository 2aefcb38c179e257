//! Webhooks: signed deliveries of events to customer endpoints.
//!
//! Landed so far: [`signature`], the signing scheme and the receiver-side [`verify`]. The
//! endpoints API, the delivery worker, retries, pausing, replay and `svcgate listen` come next.

pub mod delivery;
pub mod endpoint;
pub mod signature;

pub use signature::{sign, verify, VerifyError};
