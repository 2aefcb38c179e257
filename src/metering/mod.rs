//! Metering: what requests cost, who pays, how fast they may come, and the record of each.
//!
//! - [`usage`]: credit spend per key, project and workspace, and monthly budgets; its parts are
//!   the budget arithmetic ([`budget`]), the ledger of unflushed spend, the flush to the store
//!   ([`flush`]) and the spend kept over a shutdown ([`checkpoint`]);
//! - [`ratelimit`]: per-key limits shared across replicas;
//! - [`audit`]: one record per authenticated request, off the request path; [`refused`]: how
//!   many of those of refused credentials are kept;
//! - [`meter`]: the three together, and the background flush that talks to the store; the
//!   spend it keeps on disk while the store is away is in `spend_spool.rs`;
//! - [`config`]: the `[metering]` and `[limits]` sections;
//! - [`store`]: the storage metering needs (usage and budgets; audit).

pub mod audit;
mod audit_query;
mod audit_spool;
pub mod budget;
pub mod checkpoint;
pub mod config;
pub mod flush;
pub mod lease;
mod ledger;
pub mod meter;
pub mod ratelimit;
pub mod refused;
mod spend_spool;
mod spool;
pub mod store;
pub mod usage;

pub use crate::shared::month;
pub use crate::shared::Credits;
pub use meter::Meter;

/// Keys and projects one flush carries at most, in spend and in rate counts each; the rest
/// waits for the next flush. A flush is one Redis script, which blocks Redis: unbounded, one
/// after 100,000 keys ran past the client's timeout and was retried forever.
pub const MAX_FLUSH_ENTRIES: usize = 2_000;
