//! The meter: rate limits, budgets, spend and audit for the request path, and the background
//! flush that exchanges them with the store.
//!
//! On the request path everything is in memory: [`Meter::admit`] decides from local state,
//! [`Meter::finish`] adds to local accumulators and queues an audit record. Every
//! `flush_interval` one task sends the batch: one store call for spend, budgets and rate
//! counts, one for audit records.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::audit::{audit_log, AuditLog, AuditWriter, PendingAudit, AUDIT_BATCH};
use super::config::StoreDown;
use super::lease::FetchSlot;
use super::month::month_of;
use super::ratelimit::{Decision, Limit, RateLimiter, WindowCounts};
use super::refused::RefusedAudit;
use super::spend_spool::Checkpoint;
use super::spool;
use super::store::{AuditStore, UsageStore};
use super::usage::{Admit, BudgetScope, KeyBudget, RateFlush, Reservation, Usage, UsageFlush};
use crate::error::ApiError;
use crate::keys::{CachedKey, Environment, RateLimit};
use crate::shared::Credits;
use std::sync::atomic::Ordering;

/// How the meter is set up.
#[derive(Debug, Clone)]
pub struct MeterConfig {
    /// How often spend, rate counts and audit records go to the store.
    pub flush_interval: Duration,
    /// Limits of live keys (and their scoped tokens).
    pub live_limit: Limit,
    /// Limits of test keys (and their scoped tokens).
    pub test_limit: Limit,
    /// Scoped tokens one key may mint.
    pub token_mints: Limit,
    /// The largest metadata of a scoped token, as JSON (bytes).
    pub token_metadata_bytes: usize,
    /// Where spend and audit records wait when the store is unreachable at shutdown, or for
    /// long.
    pub spool_dir: PathBuf,
    /// Audit records kept in memory while the store is unreachable, before spooling to disk.
    pub audit_backlog: usize,
    /// The memory those records may hold (bytes), before spooling to disk.
    pub audit_backlog_bytes: usize,
    /// Audit records kept per key and second of requests whose credential was refused.
    pub refused_audit_per_second: u32,
    /// Monthly budgets per `(workspace, project)` from the configuration (micro-credits).
    pub project_budgets: HashMap<(String, String), i64>,
    /// The most a backend's `Service-Credits` may report for one request.
    pub max_credits_per_request: Credits,
    /// What becomes of a request whose budgets cannot be checked because the store is down.
    pub budget_when_store_down: StoreDown,
}

/// A spent budget's answer.
fn spent(scope: BudgetScope) -> ApiError {
    crate::metrics::record_policy_rejection(match scope {
        BudgetScope::Key => "budget_key",
        BudgetScope::Project => "budget_project",
        BudgetScope::Workspace => "budget_workspace",
    });
    ApiError::BudgetExceeded(format!("the {} monthly budget is spent", scope.as_str()).into())
}

/// Rate limits, budgets, spend and audit.
pub struct Meter {
    pub(super) usage: Usage,
    pub(super) rate: RateLimiter,
    pub(super) audit: AuditLog,
    /// Which records of refused credentials are kept.
    refused: RefusedAudit,
    pub(super) store: Arc<dyn UsageStore>,
    pub(super) config: MeterConfig,
    /// Where the next flush resumes refreshing idle keys' global counts.
    pub(super) idle_cursor: std::sync::atomic::AtomicUsize,
    /// Spend spool files held until exit and left in place: unreadable, or written and not
    /// removable (emptied, if they could be). Held so that they are not read again meanwhile
    /// (their spend would be charged again).
    pub(super) kept_spools: Mutex<Vec<spool::Taken>>,
    /// The spend checkpoint, while there is one.
    pub(super) checkpoint: Mutex<Option<Checkpoint>>,
}

/// How often the flush task looks for spend spooled by another process (the one a graceful
/// upgrade replaced, at its exit).
const SPEND_SPOOL_LOOK_INTERVAL: Duration = Duration::from_secs(5);

/// Flushes at shutdown, at most: a batch in flight goes alone, the spend behind it next.
const CLOSING_FLUSHES: usize = 3;

/// How soon the flush after one that left spend or rate counts behind
/// ([`super::MAX_FLUSH_ENTRIES`]) goes.
const DEFERRED_FLUSH_DELAY: Duration = Duration::from_millis(20);

/// Keys without new requests whose global counts one flush refreshes, at most: a flush stays
/// bounded whatever the number of keys in use, and an idle key's view is at most
/// `active keys / IDLE_REFRESH_PER_FLUSH` flushes old when its next request arrives.
const IDLE_REFRESH_PER_FLUSH: usize = 1_000;

/// Adds to a flush's rate batch up to [`IDLE_REFRESH_PER_FLUSH`] of the keys with a rate
/// state in `limiter` that have no counts in it, round robin from `cursor`, to have their
/// global counts refreshed. (A set, not a scan of the batch per key: with tens of thousands of
/// keys that was quadratic.)
fn add_idle_refreshes(
    rate: &mut Vec<RateFlush>,
    limiter: &RateLimiter,
    cursor: &std::sync::atomic::AtomicUsize,
    window: u64,
) {
    let counted: std::collections::HashSet<&str> = rate.iter().map(|r| r.key.as_str()).collect();
    let from = cursor.load(std::sync::atomic::Ordering::Relaxed);
    let (idle, passed) =
        limiter.keys_round_robin(from, IDLE_REFRESH_PER_FLUSH, |key| counted.contains(key));
    cursor.fetch_add(passed, std::sync::atomic::Ordering::Relaxed);
    rate.extend(idle.iter().map(|key| RateFlush {
        key: key.to_string(),
        window,
        count: 0,
    }));
}

impl Meter {
    /// A meter over `store`, writing audit records to `audit_store`, and the audit writer
    /// [`Meter::run`] drives.
    pub fn new(
        store: Arc<dyn UsageStore>,
        audit_store: Arc<dyn AuditStore>,
        config: MeterConfig,
    ) -> (Arc<Self>, AuditWriter) {
        let (audit, writer) =
            audit_log(audit_store, config.spool_dir.clone(), config.audit_backlog);
        let writer = writer.with_max_backlog_bytes(config.audit_backlog_bytes);
        let meter = Arc::new(Self {
            usage: Usage::new(config.project_budgets.clone()),
            rate: RateLimiter::new(),
            audit,
            refused: RefusedAudit::new(config.refused_audit_per_second),
            store,
            config,
            idle_cursor: Default::default(),
            kept_spools: Mutex::default(),
            checkpoint: Mutex::default(),
        });
        meter.take_spooled_spend();
        (meter, writer)
    }

    /// The limit that applies to `key`: `set` (the billed key's own, or its workspace's), else
    /// its environment's.
    #[inline]
    pub fn limit_for(&self, key: &CachedKey, set: Option<RateLimit>) -> Limit {
        match (set, key.effective_environment()) {
            (Some(set), _) => Limit {
                requests_per_minute: set.requests_per_minute,
                burst: set.burst(),
            },
            (None, Environment::Test) => self.config.test_limit,
            (None, _) => self.config.live_limit,
        }
    }

    /// Rate limit (429), then — for a `billable` request, one a backend answers — budgets
    /// (402), reserving `reserve` (the route's price, or its `reserve`) against this replica's
    /// leases of them. The rate decision comes back either way: its `RateLimit-*` headers go
    /// on every answer. `budget` is the billed key's monthly budget: a scoped token's parent's.
    /// A request whose totals this replica has not read yet waits for the flush that reads them
    /// (the first request of a workspace, key or project here, or after two idle minutes); one
    /// whose leases are missing or short waits for the store to grant more.
    // Each argument is a plain value the request path already holds; a struct for them would
    // be built and taken apart on every request.
    #[allow(clippy::too_many_arguments)]
    pub async fn admit(
        &self,
        key: &CachedKey,
        rate_limit: Option<RateLimit>,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        billable: bool,
        reserve: Credits,
        now_ms: u64,
    ) -> (Decision, Result<Option<Reservation>, ApiError>) {
        let limit = self.limit_for(key, rate_limit);
        let billed = || key.billed_key_id_shared();
        let decision = self
            .rate
            .check_shared(key.billed_key_id(), billed, limit, now_ms);
        if !decision.allowed {
            crate::metrics::record_policy_rejection("rate_limit");
            let err = ApiError::RateLimited {
                message: format!(
                    "rate limit of {} requests per minute exceeded for this key",
                    limit.requests_per_minute
                )
                .into(),
                retry_after_secs: decision.reset_secs,
            };
            return (decision, Err(err));
        }
        // Test keys are never billed, so no budget can be spent by them; managing tokens and
        // webhooks costs nothing either.
        if !billable || key.effective_environment() == Environment::Test {
            return (decision, Ok(None));
        }
        let need = reserve.micros();
        let admitted = match self.usage.admit_budget(key, budget, project, need, now_ms) {
            Admit::Reserved(r) => Ok(Some(r)),
            Admit::Spent(scope) => Err(spent(scope)),
            // New to this replica, or forgotten, or short of a lease: ask the store first
            // (boxed, so the request path's future does not carry the wait's state).
            first => Box::pin(self.admit_slowly(first, key, budget, project, need, now_ms)).await,
        };
        (decision, admitted)
    }

    /// [`Meter::admit`]'s budgets when the store must be asked first: for the totals (wait for
    /// the flush that reads them), or for leases (one request of a workspace asks at a time,
    /// for what every request waiting reserves).
    async fn admit_slowly(
        &self,
        mut found: Admit,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        need: i64,
        now_ms: u64,
    ) -> Result<Option<Reservation>, ApiError> {
        let ws = &*key.workspace;
        let mut slot = None;
        // A read-back, then a lease for each budget, and one more should a month's turn have
        // come between.
        for _ in 0..5 {
            match found {
                Admit::Reserved(r) => return self.leave(ws, slot, need, Ok(Some(r))),
                Admit::Spent(scope) => return self.leave(ws, slot, need, Err(spent(scope))),
                Admit::Unknown { flush } => {
                    self.usage.read_back(flush).await;
                    found = self.usage.admit_budget(key, budget, project, need, now_ms);
                    if let Admit::Unknown { .. } = found {
                        // Still unknown: the store is slow or down.
                        return self.leave(ws, slot, need, self.store_down());
                    }
                    continue;
                }
                Admit::Fetch(_) => {
                    let joined = slot
                        .get_or_insert_with(|| self.usage.fetches.join(ws, need))
                        .clone();
                    let turn = joined.lock.lock().await;
                    // The request before may have brought enough.
                    let mut request =
                        match self.usage.admit_budget(key, budget, project, need, now_ms) {
                            Admit::Fetch(request) => request,
                            other => {
                                drop(turn);
                                found = other;
                                continue;
                            }
                        };
                    let waiting = joined.waiting.load(Ordering::Relaxed);
                    for ask in &mut request.asks {
                        ask.ask = ask.ask.max(waiting);
                    }
                    let start_ms = crate::ids::unix_millis();
                    let asked = self.store.lease_budget(&request).await;
                    drop(turn);
                    drop(joined);
                    match asked {
                        Ok(grants) => {
                            found = self.usage.admit_granted(
                                &request, &grants, start_ms, key, budget, project, need, now_ms,
                            );
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "budget lease not granted");
                            return self.leave(ws, slot, need, self.store_down());
                        }
                    }
                }
            }
        }
        let last = match found {
            Admit::Reserved(r) => Ok(Some(r)),
            Admit::Spent(scope) => Err(spent(scope)),
            // Leases granted and gone again round after round (a month turning meanwhile):
            // refused rather than admitted unreserved.
            _ => Err(ApiError::ServiceUnavailable(
                "budgets could not be checked in time; retry later".into(),
            )),
        };
        self.leave(ws, slot, need, last)
    }

    /// Leaves the workspace's lease queue, if the request joined it, answering `result`.
    fn leave<T>(&self, ws: &str, slot: Option<Arc<FetchSlot>>, need: i64, result: T) -> T {
        if let Some(slot) = slot {
            self.usage.fetches.leave(ws, slot, need);
        }
        result
    }

    /// A request's budgets cannot be checked (the store is unreachable or slow):
    /// `metering.budget_when_store_down` decides.
    fn store_down(&self) -> Result<Option<Reservation>, ApiError> {
        match self.config.budget_when_store_down {
            StoreDown::Admit => Ok(None),
            StoreDown::Refuse => {
                crate::metrics::record_policy_rejection("budget_unchecked");
                Err(ApiError::ServiceUnavailable(
                    "budgets cannot be checked: the store is unreachable; retry later".into(),
                ))
            }
        }
    }

    /// The largest metadata of a scoped token, as JSON (bytes).
    pub fn token_metadata_bytes(&self) -> usize {
        self.config.token_metadata_bytes
    }

    /// Whether `key` may mint a scoped token now (`token_mints` per key, across replicas, as
    /// request rates are): past it, 429. Its count is kept under `mint:<key id>`.
    pub fn admit_mint(&self, key: &CachedKey, now_ms: u64) -> Result<(), ApiError> {
        let limit = self.config.token_mints;
        let name = format!("mint:{}", key.billed_key_id());
        let decision = self.rate.check(&name, limit, now_ms);
        if decision.allowed {
            return Ok(());
        }
        crate::metrics::record_policy_rejection("token_mint_rate");
        Err(ApiError::RateLimited {
            message: format!(
                "this key may mint {} scoped tokens per minute; retry later",
                limit.requests_per_minute
            )
            .into(),
            retry_after_secs: decision.reset_secs,
        })
    }

    /// The cost a backend reported in `Service-Credits`, if it is to be charged as sent:
    /// a figure over `max_credits_per_request` is a backend fault, not a price, and is
    /// logged and counted instead (the caller then charges the route's price).
    pub fn reported_cost(&self, reported: Credits, route: &str) -> Option<Credits> {
        if reported <= self.config.max_credits_per_request {
            return Some(reported);
        }
        tracing::warn!(
            route,
            reported = %reported,
            max = %self.config.max_credits_per_request,
            "Service-Credits over metering.max_credits_per_request; the route's price applies"
        );
        crate::metrics::record_reported_credits_refused();
        None
    }

    /// After the response: charges the cost (never for test keys), settling what the request
    /// reserved, and queues the audit record.
    pub fn finish(&self, record: PendingAudit, reservation: Option<Reservation>) {
        let key = &record.key;
        if key.effective_environment() != Environment::Test {
            self.usage.settle(
                key,
                record.project.as_deref(),
                record.credits,
                record.time_ms,
                reservation,
            );
        }
        self.audit.record(record);
    }

    /// After the answer to a refused credential (a key or token that exists, refused): its
    /// audit record is queued if its key has had fewer than `refused_audit_per_second` this
    /// second, with the number left out before it; otherwise it is only counted.
    pub fn finish_refused(&self, mut record: PendingAudit) {
        let key = record.key.billed_key_id_shared();
        if let Some(suppressed) = self.refused.admit(&key, record.time_ms) {
            record.suppressed = Some(suppressed);
            record.credits = Credits::ZERO;
            self.audit.record(record);
        }
    }

    /// One flush of spend and rate counts. Returns whether the store took it.
    pub async fn flush_usage(&self) -> bool {
        let now = crate::ids::unix_now();
        let month = month_of(now);
        let Some((id, workspaces)) = self.begin_batch(&month) else {
            // A spool file holds this spend as pending and can be neither rewritten nor
            // removed: sent now, the spend would be charged again when the file is replayed.
            self.usage.flush_failed();
            return false;
        };
        let window = now / 60;
        let batch = self.rate.next_batch();
        let mut rate: Vec<RateFlush> = batch
            .counts
            .iter()
            .map(|(key, window, count)| RateFlush {
                key: key.to_string(),
                window: *window,
                count: *count,
            })
            .collect();
        // Keys used recently but not since the last flush still want fresh global counts.
        add_idle_refreshes(&mut rate, &self.rate, &self.idle_cursor, window);
        if workspaces.is_empty() && rate.is_empty() {
            return true;
        }
        let flush = UsageFlush {
            id,
            month,
            now,
            workspaces,
            rate,
            rate_id: batch.id.clone(),
        };
        match self.store.flush_usage(&flush).await {
            Ok(snapshot) => {
                self.usage.finish_flush(&snapshot);
                for (key, r) in &snapshot.rate {
                    self.rate.set_global(
                        key,
                        WindowCounts {
                            window: r.window,
                            previous: r.previous,
                            current: r.current,
                        },
                    );
                }
                self.rate.forget_idle(window);
                self.checkpoint_landed(&flush.id);
                true
            }
            Err(e) => {
                // The batch stays as it is and goes again, under the same id, next time; so do
                // the rate counts, under theirs (a batch the store took despite the error adds
                // nothing more).
                tracing::debug!(error = %e, "usage flush failed; it will be retried");
                self.rate.not_sent(batch);
                self.usage.flush_failed();
                self.checkpoint_if_due();
                false
            }
        }
    }

    /// Flushes spend, rate counts and audit records every `flush_interval` until `shutdown`
    /// fires, then once more, spooling what the store will not take. In between, audit records
    /// go out early whenever a request thread has queued [`AUDIT_BATCH`] of them.
    ///
    /// Rendering audit records is this task's main work: at 15,000 requests/s a 200 ms batch
    /// is a burst of several milliseconds of CPU, long enough to delay requests on a machine
    /// whose cores are all busy. Batches of [`AUDIT_BATCH`] are a few tenths of a millisecond; a
    /// quiet gateway still writes one batch per interval. The task wakes for those, and
    /// otherwise only for the interval: it does not poll, which would take a core the request
    /// workers share, busy or idle.
    pub async fn run(
        self: Arc<Self>,
        mut writer: AuditWriter,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut last_usage = tokio::time::Instant::now();
        let mut last_spool_look = last_usage;
        let mut usage_ok = true;
        let mut failing = false;
        // The last flush left spend or rate counts behind (`MAX_FLUSH_ENTRIES`): the next goes
        // [`DEFERRED_FLUSH_DELAY`] later, not a whole interval later.
        let mut more = false;
        loop {
            let next = match more {
                true => tokio::time::Instant::now() + DEFERRED_FLUSH_DELAY,
                false => last_usage + self.config.flush_interval,
            };
            // A request that found totals unknown here (a workspace, key or project new to this
            // replica, or forgotten) waits for them: it is flushed for at once.
            let wanted = tokio::select! {
                _ = tokio::time::sleep_until(next) => false,
                _ = self.usage.flush_wanted() => !failing,
                _ = writer.batch_ready(), if !failing => false,
                _ = shutdown.changed() => break,
            };
            if last_spool_look.elapsed() >= SPEND_SPOOL_LOOK_INTERVAL {
                last_spool_look = tokio::time::Instant::now();
                self.take_spooled_spend();
            }
            if wanted || more || last_usage.elapsed() >= self.config.flush_interval {
                last_usage = tokio::time::Instant::now();
                usage_ok = self.flush_usage().await;
                more = usage_ok && (self.usage.deferred() || self.rate.deferred());
            } else if failing || writer.queued() < AUDIT_BATCH {
                // Early batches only while the store takes them; retries keep the interval.
                continue;
            }
            writer.flush().await;
            let ok = usage_ok && writer.backlog_len() == 0;
            match (ok, failing) {
                (false, false) => {
                    failing = true;
                    tracing::warn!(
                        "store unreachable: spend and audit records are kept until it is back"
                    );
                }
                (true, true) => {
                    failing = false;
                    tracing::info!("store reachable again: kept spend and audit records written");
                }
                _ => {}
            }
        }
        self.close(writer).await;
    }

    /// Last flush, returning every budget lease; what cannot be written is spooled for the
    /// next start.
    pub async fn close(&self, writer: AuditWriter) {
        self.usage.return_leases();
        for _ in 0..CLOSING_FLUSHES {
            if !self.flush_usage().await || self.usage.spool().is_empty() {
                break;
            }
        }
        self.spool_spend();
        writer.close().await;
    }
}
#[cfg(test)]
mod idle_refresh_tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A limiter with a state for each of `n` keys.
    fn keys(n: usize) -> RateLimiter {
        let limiter = RateLimiter::new();
        let limit = Limit {
            requests_per_minute: 60,
            burst: 10,
        };
        for i in 0..n {
            limiter.check(&format!("key_{i}"), limit, 1_000);
        }
        limiter
    }

    #[test]
    fn a_flush_refreshes_a_bounded_rotating_share_of_idle_keys() {
        let cursor = AtomicUsize::new(0);
        let counted = || {
            vec![RateFlush {
                key: "key_0".into(),
                window: 7,
                count: 3,
            }]
        };
        let limiter = keys(2_500);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3 {
            let mut batch = counted();
            add_idle_refreshes(&mut batch, &limiter, &cursor, 7);
            assert_eq!(batch.len(), 1 + IDLE_REFRESH_PER_FLUSH);
            assert_eq!(
                batch.iter().filter(|r| r.key == "key_0").count(),
                1,
                "not twice"
            );
            assert!(batch[1..].iter().all(|r| r.count == 0 && r.window == 7));
            seen.extend(batch[1..].iter().map(|r| r.key.clone()));
        }
        assert_eq!(seen.len(), 2_499, "three flushes cover every idle key");
        let mut few = counted();
        add_idle_refreshes(&mut few, &keys(10), &cursor, 7);
        assert_eq!(
            few.len(),
            10,
            "fewer idle keys than the bound: all of them, once"
        );
    }
}

#[cfg(test)]
mod audit_tests {
    use super::*;
    use crate::store::MemoryStore;

    /// A thread's batch of audit records is written when it is ready, not at the interval (an
    /// hour here).
    #[tokio::test]
    async fn a_batch_of_audit_records_goes_out_without_waiting_for_the_interval() {
        use crate::keys::{KeyStatus, Scopes};
        use crate::metering::audit::AuditQuery;
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let config = MeterConfig {
            flush_interval: Duration::from_secs(3600),
            live_limit: Limit {
                requests_per_minute: 60,
                burst: 10,
            },
            test_limit: Limit {
                requests_per_minute: 60,
                burst: 10,
            },
            token_mints: Limit {
                requests_per_minute: 60,
                burst: 60,
            },
            token_metadata_bytes: 4096,
            spool_dir: dir.path().to_path_buf(),
            audit_backlog: 10_000,
            audit_backlog_bytes: usize::MAX,
            refused_audit_per_second: 5,
            project_budgets: HashMap::new(),
            max_credits_per_request: crate::metering::config::DEFAULT_MAX_CREDITS_PER_REQUEST,
            budget_when_store_down: StoreDown::Admit,
        };
        let (meter, writer) = Meter::new(store.clone(), store.clone(), config);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let run = tokio::spawn(meter.clone().run(writer, stopped));
        let record = crate::keys::tests::record(KeyStatus::Active, None);
        let key = Arc::new(CachedKey::new(
            &record,
            "ws_1".into(),
            Arc::new(Scopes::default()),
        ));
        for i in 0..AUDIT_BATCH {
            meter.audit.record(PendingAudit {
                time_ms: i as u64,
                request_id: crate::ids::request_id(),
                key: key.clone(),
                project: None,
                method: http::Method::POST,
                path: "/v1/chat/completions".into(),
                model: None,
                status: 200,
                credits: crate::metering::Credits::ZERO,
                client_ip: None,
                latency_ms: 1,
                suppressed: None,
                tunnel: None,
            });
        }
        let query = AuditQuery {
            workspace: "ws_1".into(),
            limit: 1000,
            ..AuditQuery::default()
        };
        let written = async {
            while store.audit(&query).await.unwrap().len() < AUDIT_BATCH {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), written)
            .await
            .expect("the batch was written before the interval");
        stop.send(true).unwrap();
        run.await.unwrap();
    }
}
