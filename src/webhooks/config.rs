//! `[webhooks]` and `[smtp]`: deliveries and admin e-mails, and their checks.

use serde::{Deserialize, Serialize};

use crate::shared::problem::Problem;

/// `[webhooks]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhooksConfig {
    /// Waits before each retry, counted from the previous failure (seconds). After the last
    /// one fails, the endpoint is paused.
    pub retry_schedule_seconds: Vec<u64>,
    /// A delivery succeeds on a 2xx within this time (seconds).
    pub timeout_seconds: u64,
    /// Allow `http://` endpoints and internal addresses (development and tests only).
    pub allow_insecure_targets: bool,
    /// Where admin e-mails are written when no `[smtp]` host is configured.
    pub outbox_dir: String,
    /// Deliveries one worker has in flight at most.
    pub max_in_flight: usize,
    /// Deliveries one worker has in flight to one endpoint at most.
    pub max_in_flight_per_endpoint: usize,
    /// The longest wait a receiver's `Retry-After` (on a 429 or 503) is honoured for, in
    /// seconds; the schedule's wait applies when it is longer.
    pub max_retry_after_seconds: u64,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            retry_schedule_seconds: vec![60, 300, 1_800, 7_200, 43_200],
            timeout_seconds: 10,
            allow_insecure_targets: false,
            outbox_dir: "data/outbox".to_string(),
            max_in_flight: 512,
            max_in_flight_per_endpoint: 16,
            max_retry_after_seconds: 3_600,
        }
    }
}

impl WebhooksConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let w = self;
        if w.retry_schedule_seconds.len() > 20 {
            problems.push(Problem::new(
                "webhooks.retry_schedule_seconds",
                "at most 20 retries",
            ));
        }
        // Retries of events the log still holds (30 days), each at least a second apart.
        let schedule: u64 = w
            .retry_schedule_seconds
            .iter()
            .fold(0, |sum, s| sum.saturating_add(*s));
        if w.retry_schedule_seconds.contains(&0) || schedule > crate::events::RETENTION_SECS {
            problems.push(Problem::new(
                "webhooks.retry_schedule_seconds",
                "each wait at least 1 s, all of them within 30 days",
            ));
        }
        if w.timeout_seconds == 0 || w.timeout_seconds > 60 {
            problems.push(Problem::new("webhooks.timeout_seconds", "must be 1-60"));
        }
        if w.max_in_flight == 0 {
            problems.push(Problem::new("webhooks.max_in_flight", "must be at least 1"));
        }
        if w.max_in_flight_per_endpoint == 0 || w.max_in_flight_per_endpoint > w.max_in_flight {
            problems.push(Problem::new(
                "webhooks.max_in_flight_per_endpoint",
                "must be 1 to webhooks.max_in_flight",
            ));
        }
        if w.max_retry_after_seconds > 86_400 {
            problems.push(Problem::new(
                "webhooks.max_retry_after_seconds",
                "at most 86400 (a day)",
            ));
        }
        problems
    }
}

pub use crate::shared::mail::{SmtpConfig, SmtpTls};
