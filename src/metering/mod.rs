//! Metering: what requests cost. Budgets, spend and the audit log build on this.

mod credits;

pub use credits::Credits;
