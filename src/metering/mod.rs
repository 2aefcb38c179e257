//! Metering: what requests cost, who pays, how fast they may come, and the record of each.
//!
//! - [`usage`]: credit spend per key, project and workspace, and monthly budgets;
//! - [`ratelimit`]: per-key limits shared across replicas;
//! - [`audit`]: one record per authenticated request, off the request path;
//! - [`meter`]: the three together, and the background flush that talks to the store;
//! - [`store`]: the storage metering needs (usage and budgets; audit).

pub mod audit;
mod credits;
pub mod meter;
pub mod month;
pub mod ratelimit;
mod spool;
pub mod store;
pub mod usage;

pub use credits::Credits;
pub use meter::Meter;

/// Keys and projects one flush carries at most, in spend and in rate counts each; the rest
/// waits for the next flush.
///
/// A flush is one Redis script, and Redis runs nothing else while it runs. Unbounded, a flush
/// after 100,000 keys had spent (a spell of distinct keys, or spend kept through an outage)
/// carried 9.5 MB and ran for 0.85 s, past the client's 500 ms timeout: it was sent again,
/// under the same id, and ran again, every time, and Redis answered nothing else. Bounded, a
/// flush ran for 10–25 ms there; the flush task sends the next 20 ms later while anything is
/// left.
pub const MAX_FLUSH_ENTRIES: usize = 2_000;
