//! Small types and checks every area uses; this module imports nothing else from the crate,
//! so any module may depend on it without forming a loop.
//!
//! - [`credits`]: credit amounts, exact to the micro-credit;
//! - [`environment`]: live, test and scoped;
//! - [`ids`]: identifiers (`req_…`, `key_…`) and the wall clock;
//! - [`mail`]: `[smtp]` and the mailer (SMTP, or an outbox directory);
//! - [`month`]: the calendar months spend is charged to;
//! - [`bearer`]: the `Authorization: Bearer` header;
//! - [`net`]: the internal-address check;
//! - [`problem`]: what a configuration check reports;
//! - [`project`]: the names of projects that spend is attributed to;
//! - [`rfc3339`]: instants as people read them;
//! - [`store`]: why a store call failed, and the store's health as a whole.

pub mod bearer;
pub mod credits;
pub mod environment;
pub mod ids;
pub mod mail;
pub mod month;
pub mod net;
pub mod problem;
pub mod project;
pub mod rfc3339;
pub mod router_service;
pub mod store;

pub use credits::Credits;
