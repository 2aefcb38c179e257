//! Prometheus metrics, registered in the default registry that the metrics listener serves.
//!
//! Label sets stay bounded: route templates (not raw paths), status codes, environments and
//! fixed reason names. Never key ids or workspace ids.

use prometheus::{
    register_gauge, register_histogram, register_histogram_vec, register_int_counter_vec,
    register_int_gauge, Gauge, Histogram, HistogramVec, IntCounterVec, IntGauge,
};
use std::sync::LazyLock;
use std::time::Duration;

use crate::shared::environment::Environment;

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

static LEAKS_FOUND: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_leaked_keys_total",
        "Keys found where they must not be, by scanner (github, browser, request_body, webhook, \
         admin) and what was done (revoked, reported, refused, not_found).",
        &["scanner", "action"]
    )
    .expect("metric registers once")
});

static SIMULATED_JOBS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_simulated_job_events_total",
        "Events of simulated sandbox jobs put into the event log, by event type.",
        &["type"]
    )
    .expect("metric registers once")
});

static POLICY_REJECTIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_policy_rejections_total",
        "Requests refused by policy, by reason (rate_limit, token_mint_rate, budget_key, budget_project, budget_workspace, budget_unchecked).",
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

/// The buckets of `svcgate_gateway_overhead_seconds` (seconds): fine around 0.3 ms, the added
/// latency the gateway is held to at half load. (The load benchmark's bare Pingora times
/// itself into the same.)
pub const OVERHEAD_BUCKETS: [f64; 15] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025, 0.1, 1.0,
];

static OVERHEAD: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "svcgate_gateway_overhead_seconds",
        "Time from a forwarded request's header being read to its header going to the backend (the last attempt's, if a pooled connection failed and it was sent again): what the gateway adds before the backend sees it (key, route, scope, limits, budget, and a connection to the backend, pooled or new). The body streams after it.",
        OVERHEAD_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});

static REPORTED_CREDITS_REFUSED: LazyLock<prometheus::IntCounter> = LazyLock::new(|| {
    prometheus::register_int_counter!(
        "svcgate_reported_credits_refused_total",
        "Responses whose Service-Credits exceeded metering.max_credits_per_request: not charged as sent; the route's price applied."
    )
    .expect("metric registers once")
});

static AUDIT_SUPPRESSED: LazyLock<prometheus::IntCounter> = LazyLock::new(|| {
    prometheus::register_int_counter!(
        "svcgate_audit_records_suppressed_total",
        "Audit records of refused credentials not kept: past metering.refused_audit_per_second for their key."
    )
    .expect("metric registers once")
});

static AUDIT_DROPPED: LazyLock<prometheus::IntCounter> = LazyLock::new(|| {
    prometheus::register_int_counter!(
        "svcgate_audit_records_dropped_total",
        "Audit records lost: over metering.audit_backlog_bytes in memory while neither the store nor the spool directory took them."
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

static DIRECTORY_KEYS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_key_directory_keys",
        "Digests in the key directory: every key the store holds, cached or not, and the scoped tokens its listings found."
    )
    .expect("metric registers once")
});

static DIRECTORY_TOKENS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_key_directory_tokens",
        "Scoped tokens minted on any replica, not yet expired, that the key directory lists."
    )
    .expect("metric registers once")
});

static DIRECTORY_COMPLETE: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_key_directory_complete",
        "1 once the key directory lists every key the store holds; 0 while it is being listed."
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

static DELIVERIES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_webhook_deliveries_total",
        "Webhook delivery attempts, by outcome (succeeded, failed_retrying, failed_final, skipped, superseded, rate_limited).",
        &["outcome"]
    )
    .expect("metric registers once")
});

static DELIVERY_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "svcgate_webhook_delivery_duration_seconds",
        "Time of one delivery attempt, from sending to the endpoint's answer, by outcome.",
        &["outcome"],
        vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
    )
    .expect("metric registers once")
});

static DELIVERY_LAG: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "svcgate_webhook_delivery_lag_seconds",
        "Time from a delivery being queued (its event fanned out, or replayed) to the end of its successful attempt.",
        vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0]
    )
    .expect("metric registers once")
});

static QUEUE_DEPTH: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_webhook_queue_depth",
        "Deliveries queued for a first attempt or a retry, or in flight (all workers)."
    )
    .expect("metric registers once")
});

static OLDEST_PENDING: LazyLock<Gauge> = LazyLock::new(|| {
    register_gauge!(
        "svcgate_webhook_oldest_pending_seconds",
        "How long the most overdue queued delivery has been due (0 when none is overdue)."
    )
    .expect("metric registers once")
});

static PAUSED_ENDPOINTS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_webhook_paused_endpoints",
        "Endpoints paused after every retry failed (all workspaces)."
    )
    .expect("metric registers once")
});

static IN_FLIGHT: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_webhook_in_flight",
        "Delivery attempts this worker has in flight."
    )
    .expect("metric registers once")
});

static PAUSE_MAILS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_webhook_pause_mails_total",
        "Tries to e-mail a workspace's admins that an endpoint was paused, by outcome (sent, failed, dropped: workspace or endpoint deleted, or no address that can be mailed).",
        &["outcome"]
    )
    .expect("metric registers once")
});

static PAUSE_NOTICES: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_webhook_pause_notices_pending",
        "E-mails to admins about paused endpoints not yet sent (all workers); retried until sent."
    )
    .expect("metric registers once")
});

static LISTEN_STREAMS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "svcgate_listen_streams",
        "`svcgate listen` streams open on this gateway (all read the event log through one connection)."
    )
    .expect("metric registers once")
});

static LISTEN_STREAMS_CUT: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "svcgate_listen_streams_cut_total",
        "`svcgate listen` streams the gateway ended, by reason (fell_behind: more than 1,000 events queued for a client that did not take them; log_unreadable: the event log failed or hung; reader_stopped: the gateway's reader of the log ended unexpectedly).",
        &["reason"]
    )
    .expect("metric registers once")
});

/// Registers every metric so `/metrics` lists them before the first request.
pub fn init() {
    LazyLock::force(&LISTEN_STREAMS);
    // Each reason's series from 0, so the first cut shows as an increase.
    for reason in ["fell_behind", "log_unreadable", "reader_stopped"] {
        LISTEN_STREAMS_CUT.with_label_values(&[reason]);
    }
    LazyLock::force(&REQUESTS);
    LazyLock::force(&REQUEST_DURATION);
    LazyLock::force(&AUTH_FAILURES);
    LazyLock::force(&KEY_LOOKUPS);
    LazyLock::force(&KEY_LOOKUP_SERIES);
    LazyLock::force(&POLICY_REJECTIONS);
    LazyLock::force(&LEAKS_FOUND);
    LazyLock::force(&SIMULATED_JOBS);
    LazyLock::force(&UPSTREAM_DURATION);
    LazyLock::force(&OVERHEAD);
    LazyLock::force(&REPORTED_CREDITS_REFUSED);
    LazyLock::force(&AUDIT_SUPPRESSED);
    LazyLock::force(&AUDIT_DROPPED);
    LazyLock::force(&CACHE_KEYS);
    LazyLock::force(&CACHE_SYNC_AGE);
}

/// Registers the webhook worker's metrics: only where a worker runs, so a gateway without one
/// (`serve --no-worker`) exports no queue gauges stuck at 0 that would hide workers that are
/// all down.
pub fn init_webhooks() {
    LazyLock::force(&DELIVERIES);
    LazyLock::force(&DELIVERY_DURATION);
    LazyLock::force(&DELIVERY_LAG);
    LazyLock::force(&QUEUE_DEPTH);
    LazyLock::force(&OLDEST_PENDING);
    LazyLock::force(&PAUSED_ENDPOINTS);
    LazyLock::force(&IN_FLIGHT);
    LazyLock::force(&PAUSE_MAILS);
    LazyLock::force(&PAUSE_NOTICES);
}

/// Counts one response whose `Service-Credits` was over the cap.
pub fn record_reported_credits_refused() {
    REPORTED_CREDITS_REFUSED.inc();
}

/// Counts one audit record of a refused credential that was not kept.
pub fn record_audit_suppressed() {
    AUDIT_SUPPRESSED.inc();
}

/// Counts `n` audit records lost at the backlog's bound.
pub fn record_audit_dropped(n: usize) {
    AUDIT_DROPPED.inc_by(n as u64);
}

/// Records the time a forwarded request spent in the gateway before it went to the backend.
pub fn record_overhead(elapsed: Duration) {
    OVERHEAD.observe(elapsed.as_secs_f64());
}

/// How many `svcgate listen` streams are open.
pub fn record_listen_streams(open: usize) {
    LISTEN_STREAMS.set(i64::try_from(open).unwrap_or(i64::MAX));
}

/// Counts `n` listen streams the gateway ended for `reason` (`fell_behind`, `log_unreadable`,
/// `reader_stopped`).
pub fn record_listen_streams_cut(reason: &'static str, n: usize) {
    LISTEN_STREAMS_CUT
        .with_label_values(&[reason])
        .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
}

/// Counts one delivery outcome; `attempt` is how long the attempt took, if one was made.
pub fn record_delivery(outcome: &'static str, attempt: Option<Duration>) {
    DELIVERIES.with_label_values(&[outcome]).inc();
    if let Some(took) = attempt {
        DELIVERY_DURATION
            .with_label_values(&[outcome])
            .observe(took.as_secs_f64());
    }
}

/// Records the time from an event's creation to its delivery.
pub fn record_delivery_lag(lag: Duration) {
    DELIVERY_LAG.observe(lag.as_secs_f64());
}

/// Publishes the delivery queue's state.
pub fn record_webhook_queue(depth: u64, oldest_overdue: Duration, paused: u64, in_flight: usize) {
    QUEUE_DEPTH.set(depth as i64);
    OLDEST_PENDING.set(oldest_overdue.as_secs_f64());
    PAUSED_ENDPOINTS.set(paused as i64);
    IN_FLIGHT.set(in_flight as i64);
}

/// Counts one try to mail a pause notice.
pub fn record_pause_mail(outcome: &'static str) {
    PAUSE_MAILS.with_label_values(&[outcome]).inc();
}

/// Publishes how many pause notices wait to be mailed.
pub fn record_pause_notices(pending: u64) {
    PAUSE_NOTICES.set(pending as i64);
}

/// Publishes the key cache's size and the age of its last successful sync, and what the key
/// directory holds.
pub fn record_key_cache(entries: usize, sync_age: Duration, directory: DirectorySize) {
    CACHE_KEYS.set(entries as i64);
    CACHE_SYNC_AGE.set(sync_age.as_secs_f64());
    DIRECTORY_KEYS.set(directory.keys as i64);
    DIRECTORY_TOKENS.set(directory.tokens as i64);
    DIRECTORY_COMPLETE.set(i64::from(directory.complete));
}

/// What the key directory holds, for [`record_key_cache`].
pub struct DirectorySize {
    /// Key digests.
    pub keys: usize,
    /// Scoped tokens heard of, not yet swept out.
    pub tokens: usize,
    /// Whether it lists every key the store holds.
    pub complete: bool,
}

/// Counts one request refused by a rate limit or a budget.
pub fn record_policy_rejection(reason: &'static str) {
    POLICY_REJECTIONS.with_label_values(&[reason]).inc();
}

/// Counts one answered request that matched no route (a matched one counts through its
/// [`RouteMetrics`]).
pub fn record_request(route: &str, status: u16, environment: &str, elapsed: Duration) {
    count_request(route, status, environment);
    REQUEST_DURATION
        .with_label_values(&[route])
        .observe(elapsed.as_secs_f64());
}

fn count_request(route: &str, status: u16, environment: &str) {
    let mut buf = itoa::Buffer::new();
    REQUESTS
        .with_label_values(&[route, buf.format(status), environment])
        .inc();
}

/// One route's series, looked up once when the route table is built: a request's metrics then
/// cost no label hashing. Statuses other than 200 take the labelled path.
#[derive(Clone)]
pub struct RouteMetrics {
    route: Box<str>,
    duration: Histogram,
    upstream: Histogram,
    /// `status="200"` per environment, in the order of [`Environment::ALL`].
    ok: [prometheus::IntCounter; 3],
}

impl RouteMetrics {
    /// The series of the route `template`.
    pub fn new(template: &str) -> Self {
        Self {
            route: template.into(),
            duration: REQUEST_DURATION.with_label_values(&[template]),
            upstream: UPSTREAM_DURATION.with_label_values(&[template]),
            ok: Environment::ALL
                .map(|env| REQUESTS.with_label_values(&[template, "200", env.as_str()])),
        }
    }

    /// Counts one answered request of this route; `environment` is the caller's key's, if
    /// one was authenticated.
    pub fn record_request(&self, status: u16, environment: Option<Environment>, elapsed: Duration) {
        match (status, environment) {
            (200, Some(env)) => self.ok[env as usize].inc(),
            _ => count_request(
                &self.route,
                status,
                environment.map_or("none", Environment::as_str),
            ),
        }
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// Records how long the backend took to answer.
    pub fn record_upstream(&self, elapsed: Duration) {
        self.upstream.observe(elapsed.as_secs_f64());
    }
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RouteMetrics").field(&self.route).finish()
    }
}

/// The same route, the same series.
impl PartialEq for RouteMetrics {
    fn eq(&self, other: &Self) -> bool {
        self.route == other.route
    }
}

/// Counts one key a scanner found, and what was done with it.
pub fn record_leak(scanner: &str, action: &str) {
    LEAKS_FOUND.with_label_values(&[scanner, action]).inc();
}

/// Counts one event of a simulated job put into the event log.
pub fn record_simulated_event(event_type: &str) {
    SIMULATED_JOBS.with_label_values(&[event_type]).inc();
}

/// Counts one authentication failure.
pub fn record_auth_failure(reason: &str) {
    AUTH_FAILURES.with_label_values(&[reason]).inc();
}

/// The key-lookup series, resolved once (hit, negative_hit, miss): a
/// lookup is counted without label hashing.
static KEY_LOOKUP_SERIES: LazyLock<[prometheus::IntCounter; 3]> =
    LazyLock::new(|| ["hit", "negative_hit", "miss"].map(|o| KEY_LOOKUPS.with_label_values(&[o])));

/// How the key cache answered a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Answered from memory.
    Hit,
    /// Answered "unknown" from memory.
    NegativeHit,
    /// Fetched from the store.
    Miss,
}

/// Counts one key lookup by cache outcome.
pub fn record_key_lookup(outcome: CacheOutcome) {
    let [hit, negative_hit, miss] = &*KEY_LOOKUP_SERIES;
    match outcome {
        CacheOutcome::Hit => hit.inc(),
        CacheOutcome::NegativeHit => negative_hit.inc(),
        CacheOutcome::Miss => miss.inc(),
    }
}
