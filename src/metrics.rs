//! Prometheus metrics, registered in the default registry that the metrics listener serves.
//!
//! Label sets stay bounded: route templates (not raw paths), status codes, environments and
//! fixed reason names. Never key ids or workspace ids.

use prometheus::{
    register_gauge, register_histogram_vec, register_int_counter_vec, register_int_gauge, Gauge,
    HistogramVec, IntCounterVec, IntGauge,
};
use std::sync::LazyLock;
use std::time::Duration;

static REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_requests_total",
        "Requests answered, by route template, status and key environment.",
        &["route", "status", "environment"]
    )
    .expect("metric registers once")
});

static REQUEST_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "svcgate_request_duration_seconds",
        "Time from request arrival to the end of the response, by route template.",
        &["route"],
        vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0
        ]
    )
    .expect("metric registers once")
});

static AUTH_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_auth_failures_total",
        "Requests refused by authentication, by reason.",
        &["reason"]
    )
    .expect("metric registers once")
});

static KEY_LOOKUPS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_key_cache_lookups_total",
        "Key lookups on the request path, by outcome (hit, negative_hit, miss).",
        &["outcome"]
    )
    .expect("metric registers once")
});

static POLICY_REJECTIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_policy_rejections_total",
        "Requests refused by policy, by reason (rate_limit, budget_key, budget_project, budget_workspace).",
        &["reason"]
    )
    .expect("metric registers once")
});

static UPSTREAM_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "svcgate_upstream_duration_seconds",
        "Time from sending a request to the backend to its response header, by route template.",
        &["route"],
        vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0
        ]
    )
    .expect("metric registers once")
});

static CACHE_KEYS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_key_cache_entries",
        "Keys held in the in-process key cache."
    )
    .expect("metric registers once")
});

static CACHE_SYNC_AGE: LazyLock<Gauge> = LazyLock::new(|| {
    register_gauge!(
        "svcgate_key_cache_sync_age_seconds",
        "Seconds since the key cache last caught up with the store (staleness while it is away)."
    )
    .expect("metric registers once")
});

/// Registers every metric so `/metrics` lists them before the first request.
pub fn init() {
    LazyLock::force(&REQUESTS);
    LazyLock::force(&REQUEST_DURATION);
    LazyLock::force(&AUTH_FAILURES);
    LazyLock::force(&KEY_LOOKUPS);
    LazyLock::force(&POLICY_REJECTIONS);
    LazyLock::force(&UPSTREAM_DURATION);
    LazyLock::force(&CACHE_KEYS);
    LazyLock::force(&CACHE_SYNC_AGE);
}

/// Records how long the backend took to answer.
pub fn record_upstream(route: &str, elapsed: Duration) {
    UPSTREAM_DURATION
        .with_label_values(&[route])
        .observe(elapsed.as_secs_f64());
}

/// Publishes the key cache's size and the age of its last successful sync.
pub fn record_key_cache(entries: usize, sync_age: Duration) {
    CACHE_KEYS.set(entries as i64);
    CACHE_SYNC_AGE.set(sync_age.as_secs_f64());
}

/// Counts one request refused by a rate limit or a budget.
pub fn record_policy_rejection(reason: &'static str) {
    POLICY_REJECTIONS.with_label_values(&[reason]).inc();
}

/// Counts one answered request.
pub fn record_request(route: &str, status: u16, environment: &str, elapsed: Duration) {
    let mut buf = itoa::Buffer::new();
    REQUESTS
        .with_label_values(&[route, buf.format(status), environment])
        .inc();
    REQUEST_DURATION
        .with_label_values(&[route])
        .observe(elapsed.as_secs_f64());
}

/// Counts one authentication failure.
pub fn record_auth_failure(reason: &str) {
    AUTH_FAILURES.with_label_values(&[reason]).inc();
}

/// Counts one key lookup by cache outcome.
pub fn record_key_lookup(outcome: &'static str) {
    KEY_LOOKUPS.with_label_values(&[outcome]).inc();
}
