//! Metering: what requests cost, who pays, how fast they may come, and the record of each.
//!
//! - [`usage`]: credit spend per key, project and workspace, and monthly budgets;
//! - [`ratelimit`]: per-key limits shared across replicas;
//! - [`audit`]: one record per authenticated request, off the request path;
//! - [`meter`]: the three together, and the background flush that talks to the store.

pub mod audit;
mod credits;
pub mod meter;
pub mod month;
pub mod ratelimit;
mod spool;
pub mod usage;

pub use credits::Credits;
pub use meter::Meter;
