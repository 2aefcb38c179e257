//! Webhooks: signed deliveries of events to customer endpoints.
//!
//! - [`endpoint`]: where a workspace wants its events (URL rules, event filters);
//! - [`catalog`]: the event types, each with a description and a JSON Schema of its `data`;
//! - [`delivery`]: one event on its way to one endpoint, and its attempts;
//! - [`schedule`]: how long a failed endpoint waits before its next attempt;
//! - [`manage`]: what the customers' and the operators' APIs do with an endpoint;
//! - [`signature`]: the signing scheme and the receiver-side [`verify`];
//! - [`sender`]: one signed POST, guarded against server-side request forgery;
//! - [`dns`]: endpoint names resolved in process and asynchronously;
//! - [`mail`]: e-mail to workspace admins when an endpoint is paused;
//! - [`notice`]: the pause notices the store keeps until that e-mail is sent, and the loop
//!   that sends them;
//! - [`worker`]: consumes the event log and delivers, retries and pauses;
//! - [`store`]: the storage webhooks need (event log, delivery queue, notices, listen slots).

pub mod catalog;
pub mod config;
pub mod delivery;
pub mod dns;
pub mod endpoint;
pub mod mail;
pub mod manage;
pub mod notice;
pub mod schedule;
pub mod sender;
pub mod signature;
pub mod slots;
pub mod store;
pub mod worker;

pub use signature::{sign, verify, VerifyError};
pub use worker::{Worker, WorkerSettings};
