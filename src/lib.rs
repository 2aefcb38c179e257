//! svcgate: an authentication gateway for AI APIs, built on Pingora.
//!
//! The module tree is the architecture:
//! - [`proxy`]: the request path (auth → route → policy → upstream), as Pingora phases;
//! - [`keys`]: the key model (format, records, scopes);
//! - [`store`]: shared state (memory; Redis), implementing each area's storage trait;
//! - [`shared`]: leaf types every area may use;
//! - [`metering`]: credits (budgets, spend and audit build on it);
//! - [`admin`]: the operators' API; [`dashboard`]: the workspaces' web UI; [`cli`]: the command line;
//! - [`shared`]: the leaf every area may use (credits, ids, bearer parsing, address checks);
//! - [`telemetry`]: traces over OTLP and the W3C trace context;
//! - [`config`], [`metrics`], [`logging`], [`server`], [`shutdown`]: the process around them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod cli;
pub mod config;
pub mod dashboard;
pub mod error;
pub mod events;
pub mod keys;
pub mod logging;
pub mod metering;
pub mod metrics;
pub mod openapi;
pub mod proxy;
pub mod sandbox;
pub mod scanners;
pub mod server;
pub mod shared;
pub mod shutdown;
pub mod store;
pub mod telemetry;
pub mod webhooks;

pub use shared::ids;
