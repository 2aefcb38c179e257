//! `[metering]` and `[limits]`: spend, audit, their flush, and rate limits; and their checks.

use serde::{Deserialize, Serialize};

use crate::shared::problem::Problem;
use crate::shared::Credits;

/// `[metering]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeteringConfig {
    /// How often spend, rate counts and audit records are sent to the store (ms).
    pub flush_interval_ms: u64,
    /// Where spend and audit records wait when the store cannot take them.
    pub spool_dir: String,
    /// Audit records held in memory while the store is unreachable, before spooling to disk
    /// (they are spooled after 5 s in any case).
    pub audit_backlog: usize,
    /// The memory those records may hold (bytes) before spooling to disk; past it, while
    /// the spool directory refuses them too, the oldest are dropped (spend is kept apart and
    /// never dropped).
    pub audit_backlog_bytes: usize,
    /// Audit records kept per key and second of requests whose credential is refused
    /// (revoked, past its grace period, an expired token, a token whose parent is gone); the
    /// rest are counted.
    pub refused_audit_per_second: u32,
    /// How long audit records are kept in Redis (days).
    pub audit_retention_days: u64,
    /// Monthly budgets of projects, set here rather than through the admin API.
    pub project_budgets: Vec<ProjectBudgetConfig>,
    /// The most a backend's `Service-Credits` may report for one request; a larger figure is
    /// not charged as sent (a backend bug must not drain a budget): the route's price applies.
    pub max_credits_per_request: Credits,
    /// What becomes of a billable request whose budgets cannot be checked because the store
    /// is unreachable (its totals unread, or a lease it needs not granted): admitted, its
    /// spend charged when the store is back, or refused with 503.
    pub budget_when_store_down: StoreDown,
}

/// `metering.budget_when_store_down`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreDown {
    /// Admitted: an outage does not stop the service; budgets may be overspent meanwhile.
    #[default]
    Admit,
    /// Refused with 503 `service_unavailable`: no budget is overspent.
    Refuse,
}

/// The least `audit_backlog_bytes` may be: room for one record with a path of the longest
/// audited length.
pub const MIN_AUDIT_BACKLOG_BYTES: usize = 4096;

/// 1,000,000 credits: far above any one request's real cost, far below what would overflow.
pub const DEFAULT_MAX_CREDITS_PER_REQUEST: Credits = Credits::from_micros(1_000_000 * 1_000_000);

impl Default for MeteringConfig {
    fn default() -> Self {
        Self {
            flush_interval_ms: 200,
            spool_dir: "data/spool".into(),
            audit_backlog: 100_000,
            audit_backlog_bytes: 64 * 1024 * 1024,
            refused_audit_per_second: 5,
            audit_retention_days: 30,
            project_budgets: Vec::new(),
            max_credits_per_request: DEFAULT_MAX_CREDITS_PER_REQUEST,
            budget_when_store_down: StoreDown::Admit,
        }
    }
}

/// One `[[metering.project_budgets]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectBudgetConfig {
    /// `ws_…`
    pub workspace: String,
    /// The `Service-Project` value.
    pub project: String,
    /// Credits per calendar month (UTC).
    pub monthly_budget: Credits,
}

impl MeteringConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.audit_retention_days == 0 {
            // Every write would trim the whole audit log.
            problems.push(Problem::new(
                "metering.audit_retention_days",
                "must be at least 1",
            ));
        }
        if self.audit_backlog_bytes < MIN_AUDIT_BACKLOG_BYTES {
            problems.push(Problem::new(
                "metering.audit_backlog_bytes",
                format!("must be at least {MIN_AUDIT_BACKLOG_BYTES} (one record's worth)"),
            ));
        }
        if self.flush_interval_ms == 0 {
            problems.push(Problem::new(
                "metering.flush_interval_ms",
                "must be greater than 0",
            ));
        }
        if self.max_credits_per_request <= Credits::ZERO {
            problems.push(Problem::new(
                "metering.max_credits_per_request",
                "must be greater than 0",
            ));
        }
        if self.spool_dir.trim().is_empty() {
            problems.push(Problem::new("metering.spool_dir", "must not be empty"));
        }
        for (i, b) in self.project_budgets.iter().enumerate() {
            if !crate::shared::project::is_valid_project(&b.project) {
                problems.push(Problem::new(
                    format!("metering.project_budgets[{i}].project"),
                    "must be 1-64 characters of [A-Za-z0-9._-]",
                ));
            }
        }
        problems
    }
}

/// `[limits]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Requests per minute of a live key, across every replica.
    pub live_requests_per_minute: u32,
    /// Requests a live key may send at once.
    pub live_burst: u32,
    /// Keys that do not exist one client address may present per minute (per replica); past
    /// it, its requests with keys that are not cached are refused without a store read.
    pub unknown_keys_per_minute: u32,
    /// Keys that do not exist all clients together may present per minute (per replica,
    /// clients without an address of their own included); past it, every request with a key
    /// that is not cached is refused without a store read.
    pub unknown_keys_per_minute_total: u32,
    /// Requests per minute of a test key.
    pub test_requests_per_minute: u32,
    /// Requests a test key may send at once.
    pub test_burst: u32,
    /// Scoped tokens one key may mint per minute, across every replica (as many at once).
    pub token_mints_per_minute: u32,
    /// The largest `metadata` of a scoped token, as JSON (bytes).
    pub token_metadata_bytes: usize,
}

/// The most `limits.token_metadata_bytes` may be: a mint's whole body is 16 KiB at most.
pub const MAX_TOKEN_METADATA_BYTES: usize = 8 * 1024;

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            live_requests_per_minute: 6_000,
            live_burst: 200,
            unknown_keys_per_minute: 60,
            unknown_keys_per_minute_total: 6_000,
            // Relaxed, as the service promises test keys: free, simulated, and limited
            // no more than live keys.
            test_requests_per_minute: 12_000,
            test_burst: 400,
            token_mints_per_minute: 120,
            token_metadata_bytes: 4 * 1024,
        }
    }
}

impl LimitsConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        for (key, v) in [
            (
                "limits.live_requests_per_minute",
                self.live_requests_per_minute,
            ),
            ("limits.live_burst", self.live_burst),
            (
                "limits.test_requests_per_minute",
                self.test_requests_per_minute,
            ),
            ("limits.test_burst", self.test_burst),
            ("limits.token_mints_per_minute", self.token_mints_per_minute),
            (
                "limits.unknown_keys_per_minute",
                self.unknown_keys_per_minute,
            ),
            (
                "limits.unknown_keys_per_minute_total",
                self.unknown_keys_per_minute_total,
            ),
        ] {
            if v == 0 {
                problems.push(Problem::new(key, "must be greater than 0"));
            }
        }
        if !(2..=MAX_TOKEN_METADATA_BYTES).contains(&self.token_metadata_bytes) {
            problems.push(Problem::new(
                "limits.token_metadata_bytes",
                format!("must be 2-{MAX_TOKEN_METADATA_BYTES} (an empty object is 2 bytes)"),
            ));
        }
        problems
    }
}
