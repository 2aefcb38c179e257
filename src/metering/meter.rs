//! The meter: rate limits, budgets, spend and audit for the request path, and the background
//! flush that exchanges them with the store.
//!
//! On the request path everything is in memory: [`Meter::admit`] decides from local state,
//! [`Meter::finish`] adds to local accumulators and queues an audit record. Every
//! `flush_interval` one task sends the batch: one store call for spend, budgets and rate
//! counts, one for audit records.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::audit::{audit_log, AuditLog, AuditWriter, PendingAudit, AUDIT_BATCH};
use super::month::month_of;
use super::ratelimit::{Decision, Limit, RateLimiter, WindowCounts};
use super::spool;
use super::store::{AuditStore, UsageStore};
use super::usage::{
    BudgetScope, KeyBudget, PendingSpend, RateFlush, SpendByMonth, SpendSpool, Usage, UsageFlush,
    Verdict, WorkspaceFlush,
};
use crate::error::ApiError;
use crate::keys::{CachedKey, Environment};

/// How the meter is set up.
#[derive(Debug, Clone)]
pub struct MeterConfig {
    /// How often spend, rate counts and audit records go to the store.
    pub flush_interval: Duration,
    /// Limits of live keys (and their scoped tokens).
    pub live_limit: Limit,
    /// Limits of test keys (and their scoped tokens).
    pub test_limit: Limit,
    /// Where spend and audit records wait when the store is unreachable at shutdown, or for
    /// long.
    pub spool_dir: PathBuf,
    /// Audit records kept in memory while the store is unreachable, before spooling to disk.
    pub audit_backlog: usize,
    /// Monthly budgets per `(workspace, project)` from the configuration (micro-credits).
    pub project_budgets: HashMap<(String, String), i64>,
}

/// Rate limits, budgets, spend and audit.
pub struct Meter {
    usage: Usage,
    rate: RateLimiter,
    audit: AuditLog,
    store: Arc<dyn UsageStore>,
    config: MeterConfig,
    /// Where the next flush resumes refreshing idle keys' global counts.
    idle_cursor: std::sync::atomic::AtomicUsize,
    /// Spend spool files held until exit and left in place: unreadable, or written and not
    /// removable (emptied, if they could be). Held so that they are not read again meanwhile
    /// (their spend would be charged again).
    kept_spools: Mutex<Vec<spool::Taken>>,
    /// The spend checkpoint, while there is one.
    checkpoint: Mutex<Option<Checkpoint>>,
}

/// This process's spend file: a spool file taken in (one at a time), or one written at the
/// first failed flush. While the store does not take flushes it is rewritten every
/// [`SPEND_CHECKPOINT_INTERVAL`], so a crash (or a SIGKILL) in an outage loses at most that
/// much of spend, not all of it. Held while the process lives; after a crash the next start,
/// or another process on the directory, takes it as any spool file.
///
/// It never holds spend that went out to the store under an id it does not show: a new batch
/// is written into it before it is sent ([`Meter::begin_batch`]), so replaying it after a
/// crash charges nothing twice. It is always rewritten in place, in one rename (at shutdown
/// too), so no crash leaves its spend in two files.
struct Checkpoint {
    taken: spool::Taken,
    /// When it was last written.
    written: std::time::Instant,
    /// The id of the batch it holds, if it holds one.
    batch: Option<String>,
    /// Whether it holds spend besides that batch: if not, it holds nothing the store lacks
    /// once the batch lands, and goes.
    holds_pending: bool,
}

impl Checkpoint {
    /// The file's name in the spool directory.
    fn name(&self) -> Option<String> {
        let name = self.taken.path().file_name()?;
        Some(name.to_string_lossy().into_owned())
    }
}

/// While the store does not take flushes, how often the spend kept in memory is written to the
/// checkpoint ([`Checkpoint`]).
const SPEND_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

/// How often the flush task looks for spend spooled by another process (the one a graceful
/// upgrade replaced, at its exit).
const SPEND_SPOOL_LOOK_INTERVAL: Duration = Duration::from_secs(5);

/// Flushes at shutdown, at most: a batch in flight goes alone, the spend behind it next.
const CLOSING_FLUSHES: usize = 3;

/// How soon the flush after one that left spend or rate counts behind
/// ([`super::MAX_FLUSH_ENTRIES`]) goes.
const DEFERRED_FLUSH_DELAY: Duration = Duration::from_millis(20);

/// Keys without new requests whose global counts one flush refreshes, at most. Refreshing
/// every active key on every flush made each flush (and its Redis script) grow with the
/// number of keys in use; this way a flush stays bounded, and an idle key's view is at most
/// `active keys / IDLE_REFRESH_PER_FLUSH` flushes old when its next request arrives (its
/// own counts go out with the flush right after).
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
        let meter = Arc::new(Self {
            usage: Usage::new(config.project_budgets.clone()),
            rate: RateLimiter::new(),
            audit,
            store,
            config,
            idle_cursor: Default::default(),
            kept_spools: Mutex::default(),
            checkpoint: Mutex::default(),
        });
        meter.take_spooled_spend();
        (meter, writer)
    }

    /// The limit that applies to `key`.
    pub fn limit_for(&self, key: &CachedKey) -> Limit {
        match key.effective_environment() {
            Environment::Test => self.config.test_limit,
            _ => self.config.live_limit,
        }
    }

    /// Rate limit (429), then — for a `billable` request, one a backend answers — budgets
    /// (402). The rate decision comes back either way: its `RateLimit-*` headers go on every
    /// answer. `budget` is the billed key's monthly budget: a scoped token's parent's. A
    /// request whose totals this replica has not read yet waits for the flush that reads them
    /// (the first request of a workspace, key or project here, or after two idle minutes).
    pub async fn admit(
        &self,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        billable: bool,
        now_ms: u64,
    ) -> (Decision, Result<(), ApiError>) {
        let limit = self.limit_for(key);
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
            return (decision, Ok(()));
        }
        let verdict = match self.usage.check(key, budget, project, now_ms) {
            Verdict::Unknown { flush } => {
                // New to this replica, or forgotten: read the totals first (boxed, so the
                // request path's future does not carry the wait's state).
                Box::pin(self.usage.read_back(flush)).await;
                self.usage.check(key, budget, project, now_ms)
            }
            verdict => verdict,
        };
        let verdict = match verdict {
            // Still unknown: the store is slow or down, and requests go on meanwhile.
            Verdict::Within | Verdict::Unknown { .. } => Ok(()),
            Verdict::Spent(scope) => {
                crate::metrics::record_policy_rejection(match scope {
                    BudgetScope::Key => "budget_key",
                    BudgetScope::Project => "budget_project",
                    BudgetScope::Workspace => "budget_workspace",
                });
                Err(ApiError::BudgetExceeded(
                    format!("the {} monthly budget is spent", scope.as_str()).into(),
                ))
            }
        };
        (decision, verdict)
    }

    /// After the response: charges the cost (never for test keys) and queues the audit record.
    pub fn finish(&self, record: PendingAudit) {
        let key = &record.key;
        if key.effective_environment() != Environment::Test {
            self.usage.charge(
                key,
                record.project.as_deref(),
                record.credits,
                record.time_ms,
            );
        }
        self.audit.record(record);
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
    /// otherwise only for the interval: until session 26 it looked every 20 ms, 50 wakeups a
    /// second on a core the request workers share, busy or idle.
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

    /// Last flush; what cannot be written is spooled for the next start.
    pub async fn close(&self, writer: AuditWriter) {
        for _ in 0..CLOSING_FLUSHES {
            if !self.flush_usage().await || self.usage.spool().is_empty() {
                break;
            }
        }
        self.spool_spend();
        writer.close().await;
    }

    /// Writes what is unflushed to a spool file for the next start: in place of the checkpoint,
    /// if there is one (one rename: a crash never leaves both), else a new file.
    fn spool_spend(&self) {
        let unflushed = self.usage.spool();
        if unflushed.is_empty() {
            self.drop_checkpoint();
            return;
        }
        let mut checkpoint = self.checkpoint();
        let name = checkpoint
            .as_ref()
            .and_then(Checkpoint::name)
            .unwrap_or_else(|| spool::new_name("spend", "json"));
        let written = spool::write(&self.config.spool_dir, &name, |out| {
            Ok(serde_json::to_writer(out, &unflushed)?)
        });
        match written {
            Ok(path) => {
                tracing::warn!(path = %path.display(), "unflushed spend spooled for the next start");
                // Its path names the new file now: let go, not removed.
                *checkpoint = None;
            }
            // The checkpoint, if any, stays: it holds what it held.
            Err(e) => tracing::error!(error = %e, "unflushed spend lost: cannot spool"),
        }
    }

    /// The next batch of spend ([`Usage::begin_flush`]), if it may go out. While there is a
    /// checkpoint, a batch it does not hold is written into it first: were it to hold that
    /// spend as pending, a crash after the batch landed would charge it again. `None` if the
    /// checkpoint can be neither rewritten nor removed: the batch waits.
    fn begin_batch(&self, month: &str) -> Option<(String, Vec<WorkspaceFlush>)> {
        let (id, parts) = self.usage.begin_flush(month);
        let unpinned = self
            .checkpoint()
            .as_ref()
            .is_some_and(|c| c.batch.as_deref() != Some(id.as_str()));
        if unpinned && !parts.is_empty() && !self.write_checkpoint(true) {
            return None;
        }
        Some((id, parts))
    }

    /// After a failed flush: writes the checkpoint if there is none, or it is
    /// [`SPEND_CHECKPOINT_INTERVAL`] old.
    fn checkpoint_if_due(&self) {
        let due = self
            .checkpoint()
            .as_ref()
            .is_none_or(|c| c.written.elapsed() >= SPEND_CHECKPOINT_INTERVAL);
        if due {
            self.write_checkpoint(false);
        }
    }

    /// Batch `id` landed: a checkpoint that held it and nothing else goes, and the next spool
    /// file, if there is one, is taken in.
    fn checkpoint_landed(&self, id: &str) {
        let done = self
            .checkpoint()
            .take_if(|c| !c.holds_pending && c.batch.as_deref() == Some(id));
        if let Some(done) = done {
            tracing::info!(path = %done.taken.path().display(), "checkpointed or spooled spend written");
            self.remove_spool(done.taken);
            self.take_spooled_spend();
        }
    }

    /// Writes all unflushed spend to the checkpoint, in place, or to a new one if there is none.
    /// If it cannot be written and a batch is `sending`, the checkpoint there was is removed
    /// (or emptied): it may hold as pending spend that the batch sends, which a crash after the
    /// batch landed would charge again. Otherwise it stays, holding what it held. Returns
    /// whether a batch may go out: false only if the old checkpoint could not be removed or
    /// emptied either.
    fn write_checkpoint(&self, sending: bool) -> bool {
        let state = self.usage.spool();
        if state.is_empty() {
            self.drop_checkpoint();
            return true;
        }
        let mut checkpoint = self.checkpoint();
        let name = checkpoint
            .as_ref()
            .and_then(Checkpoint::name)
            .unwrap_or_else(|| spool::new_name("spend", "json"));
        let written = spool::write_taken(&self.config.spool_dir, &name, |out| {
            Ok(serde_json::to_writer(out, &state)?)
        });
        let e = match written {
            Ok(taken) => {
                if checkpoint.is_none() {
                    tracing::warn!(path = %taken.path().display(), "store unreachable: unflushed spend checkpointed to disk");
                }
                // Replaces the old file's handle, if any: its path names the new file now.
                *checkpoint = Some(Checkpoint {
                    taken,
                    written: std::time::Instant::now(),
                    batch: state.batch.map(|(id, _)| id),
                    holds_pending: !state.pending.is_empty(),
                });
                return true;
            }
            Err(e) => e,
        };
        if !sending {
            tracing::error!(error = %e, "cannot update the spend checkpoint; it holds what it held");
            if let Some(old) = checkpoint.as_mut() {
                old.written = std::time::Instant::now(); // tried again in an interval
            }
            return true;
        }
        let Some(old) = checkpoint.take() else {
            tracing::error!(error = %e, "cannot checkpoint unflushed spend; it is kept in memory");
            return true;
        };
        let Checkpoint {
            taken,
            written,
            batch,
            holds_pending,
        } = old;
        match taken.remove() {
            Ok(()) => {
                tracing::error!(error = %e, "cannot checkpoint unflushed spend; it is kept in memory");
                true
            }
            Err((removal, taken)) => {
                tracing::error!(error = %e, removal = %removal, path = %taken.path().display(), "cannot rewrite or remove the spend checkpoint; spend waits");
                *checkpoint = Some(Checkpoint {
                    taken,
                    written,
                    batch,
                    holds_pending,
                });
                false
            }
        }
    }

    /// Removes the checkpoint: what it held is written, or in a spool file written since.
    fn drop_checkpoint(&self) {
        let old = self.checkpoint().take();
        if let Some(old) = old {
            self.remove_spool(old.taken);
        }
    }

    fn checkpoint(&self) -> std::sync::MutexGuard<'_, Option<Checkpoint>> {
        self.checkpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `pinned` over the spool file `taken` before any of it is sent: a batch whose id is
    /// on disk goes out under that id however often the file is read again (after a crash,
    /// say, with Redis having taken it and its answer lost). The new file is held from the
    /// moment it replaces the old one. If it cannot be written, the file is kept as it was,
    /// and its spend sent as new spend (once the checkpoint it becomes is rewritten, or gone).
    fn pin(&self, taken: spool::Taken, pinned: &SpendSpool) -> (spool::Taken, bool) {
        let name = match taken.path().file_name() {
            Some(name) => name.to_string_lossy().into_owned(),
            None => return (taken, false),
        };
        let written = spool::write_taken(&self.config.spool_dir, &name, |out| {
            Ok(serde_json::to_writer(out, pinned)?)
        });
        match written {
            Ok(new) => (new, true),
            Err(e) => {
                tracing::warn!(error = %e, path = %taken.path().display(), "cannot write a spend spool's batch id down; sent as new spend");
                (taken, false)
            }
        }
    }

    /// Removes a spool file whose spend is written; one that cannot be removed is kept held.
    fn remove_spool(&self, taken: spool::Taken) {
        if let Err((e, taken)) = taken.remove() {
            tracing::error!(error = %e, path = %taken.path().display(), "cannot remove a written spend spool");
            self.kept().push(taken);
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<spool::Taken>> {
        self.kept_spools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in a spend spool file no process holds, if this process has no spend file of its
    /// own ([`Checkpoint`]): at start, after a file's spend is written, and from time to time
    /// (a process that hands over in a graceful upgrade spools at its exit). The file taken in
    /// becomes the checkpoint; one at a time, so that the spend of two files never goes into
    /// one, which a crash could leave beside one of them.
    fn take_spooled_spend(&self) {
        if self.checkpoint().is_some() {
            return;
        }
        let kept: Vec<PathBuf> = self.kept().iter().map(|t| t.path().into()).collect();
        let files = spool::list(&self.config.spool_dir, |name| {
            name == "spend.json" || (name.starts_with("spend-") && name.ends_with(".json"))
        });
        for path in files.into_iter().filter(|p| !kept.contains(p)) {
            let Some(mut taken) = spool::take(&path) else {
                continue;
            };
            let spooled = taken.read().map_err(|e| e.to_string()).and_then(|bytes| {
                // Emptied once written, by a process that could not remove it.
                match bytes.iter().all(u8::is_ascii_whitespace) {
                    true => Ok(SpendSpool::default()),
                    false => read_spend_spool(&path, &bytes).map_err(|e| e.to_string()),
                }
            });
            let spooled = match spooled {
                Ok(spooled) if spooled.is_empty() => {
                    self.remove_spool(taken);
                    continue;
                }
                Ok(spooled) => spooled,
                Err(e) => {
                    tracing::error!(error = %e, path = %path.display(), "spooled spend unreadable; left in place");
                    self.kept().push(taken);
                    continue;
                }
            };
            let (taken, spooled) = match spooled.pinned() {
                Some(pinned) => match self.pin(taken, &pinned) {
                    (taken, true) => (taken, pinned),
                    (taken, false) => (taken, spooled),
                },
                None => (taken, spooled),
            };
            let checkpoint = Checkpoint {
                taken,
                written: std::time::Instant::now(),
                batch: spooled.batch.as_ref().map(|(id, _)| id.clone()),
                holds_pending: !spooled.pending.is_empty(),
            };
            // Taken again once the batch in flight has landed, if it holds a batch of its own.
            if self.usage.restore_spool(spooled) {
                tracing::info!(path = %path.display(), "spooled spend restored");
                *self.checkpoint() = Some(checkpoint);
                return;
            }
        }
    }
}

/// A spend spool file: this version's, by month with the batch in flight apart (since
/// session 11), or by month alone (session 9), or by workspace alone, the month it was
/// written in.
fn read_spend_spool(path: &Path, bytes: &[u8]) -> serde_json::Result<SpendSpool> {
    serde_json::from_slice::<SpendSpool>(bytes)
        .or_else(|_| {
            serde_json::from_slice::<SpendByMonth>(bytes).map(|pending| SpendSpool {
                batch: None,
                pending,
            })
        })
        .or_else(|e| {
            serde_json::from_slice::<HashMap<String, PendingSpend>>(bytes)
                .map(|spend| {
                    let written = std::fs::metadata(path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or_else(crate::ids::unix_now, |d| d.as_secs());
                    SpendSpool {
                        batch: None,
                        pending: SpendByMonth::from([(month_of(written), spend)]),
                    }
                })
                .map_err(|_| e)
        })
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
mod spool_tests {
    use super::*;
    use crate::store::MemoryStore;

    fn meter(spool_dir: &std::path::Path) -> Arc<Meter> {
        let limit = Limit {
            requests_per_minute: 60,
            burst: 10,
        };
        let config = MeterConfig {
            flush_interval: Duration::from_millis(200),
            live_limit: limit,
            test_limit: limit,
            spool_dir: spool_dir.to_path_buf(),
            audit_backlog: 10,
            project_budgets: HashMap::new(),
        };
        let store = Arc::new(MemoryStore::new());
        Meter::new(store.clone(), store, config).0
    }

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
            spool_dir: dir.path().to_path_buf(),
            audit_backlog: 10_000,
            project_budgets: HashMap::new(),
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

    #[test]
    fn spend_spooled_by_an_earlier_version_is_restored_to_the_month_it_was_written_in() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spend.json");
        // One month's spend by workspace, as spooled before months were kept.
        std::fs::write(
            &spool,
            r#"{"ws_1": {"total": 5, "keys": {"key_1": 5}, "projects": {}}}"#,
        )
        .unwrap();
        let meter = meter(dir.path());
        let month = month_of(crate::ids::unix_now());
        let spend: PendingSpend =
            serde_json::from_str(r#"{"total": 5, "keys": {"key_1": 5}, "projects": {}}"#).unwrap();
        assert_eq!(meter.usage.unflushed()[&month]["ws_1"], spend);
        // Kept until it is written: a crash before then leaves it for the next start.
        assert!(spool.exists(), "a restored spool stays until written");
        // What this version spools comes back by month, written over it.
        meter.spool_spend();
        let files = spool::list(dir.path(), |n| n.starts_with("spend"));
        assert_eq!(
            files,
            std::slice::from_ref(&spool),
            "the new spool replaces it"
        );
        assert!(std::fs::read_to_string(&spool).unwrap().contains(&month));
        drop(meter);
        let again = self::meter(dir.path());
        assert_eq!(again.usage.unflushed()[&month]["ws_1"], spend);
    }

    #[test]
    fn spooled_spend_gets_a_batch_id_on_disk_before_it_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spend.json");
        let month = month_of(crate::ids::unix_now());
        std::fs::write(
            &spool,
            format!(r#"{{"pending": {{"{month}": {{"ws_1": {{"total": 5, "keys": {{"key_1": 5}}, "projects": {{}}}}}}}}}}"#),
        )
        .unwrap();
        let first = meter(dir.path());
        let (id, parts) = first.usage.begin_flush(&month);
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 5);
        let on_disk: SpendSpool = serde_json::from_slice(&std::fs::read(&spool).unwrap()).unwrap();
        assert_eq!(on_disk.batch.as_ref().map(|(id, _)| id), Some(&id));
        assert!(on_disk.pending.is_empty());
        // Killed before its flush landed (Redis may have taken it): the next start sends the
        // same batch, which Redis adds once.
        drop(first);
        let again = meter(dir.path());
        let (retried, parts) = again.usage.begin_flush(&month);
        assert_eq!(retried, id);
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 5);
    }

    #[test]
    fn an_emptied_spend_spool_holds_nothing_and_goes() {
        // What a process leaves when it wrote a spool's spend and could not remove the file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spend-00000000000000000001-s_x.json");
        std::fs::write(&path, b"").unwrap();
        let meter = meter(dir.path());
        assert!(meter.usage.unflushed().is_empty());
        assert!(!path.exists());
        assert!(meter.kept().is_empty());
    }

    #[tokio::test]
    async fn a_spend_spool_is_taken_by_one_meter_and_removed_once_written() {
        let dir = tempfile::tempdir().unwrap();
        let spooling = meter(dir.path());
        let key = CachedKey::new(
            &crate::keys::tests::record(crate::keys::KeyStatus::Active, None),
            "ws_1".into(),
            Arc::new(crate::keys::Scopes::default()),
        );
        let now_ms = crate::ids::unix_now() * 1000;
        spooling
            .usage
            .charge(&key, None, crate::metering::Credits::from_micros(7), now_ms);
        spooling.spool_spend();
        let files = spool::list(dir.path(), |n| n.starts_with("spend-"));
        assert_eq!(files.len(), 1);

        // Two processes on one spool directory (a graceful upgrade): one takes it.
        let (first, second) = (meter(dir.path()), meter(dir.path()));
        let month = month_of(crate::ids::unix_now());
        let holds = |m: &Meter| {
            m.usage
                .unflushed()
                .get(&month)
                .is_some_and(|ws| ws.contains_key("ws_1"))
        };
        assert!(holds(&first) != holds(&second), "exactly one takes it");
        let (taker, other) = match holds(&first) {
            true => (first, second),
            false => (second, first),
        };
        other.take_spooled_spend();
        assert!(!holds(&other), "a held spool is not taken twice");
        assert!(files[0].exists());
        assert!(taker.flush_usage().await);
        assert!(!files[0].exists(), "written, then removed");
        assert!(!holds(&taker));
    }

    /// A key of `ws_1`, and a function that charges it `micros`.
    fn charger() -> impl Fn(&Meter, i64) {
        let key = CachedKey::new(
            &crate::keys::tests::record(crate::keys::KeyStatus::Active, None),
            "ws_1".into(),
            Arc::new(crate::keys::Scopes::default()),
        );
        move |meter: &Meter, micros| {
            let now_ms = crate::ids::unix_now() * 1000;
            meter.usage.charge(
                &key,
                None,
                crate::metering::Credits::from_micros(micros),
                now_ms,
            );
        }
    }

    /// The one spend spool file in `dir`.
    fn spend_file(dir: &Path) -> SpendSpool {
        let files = spool::list(dir, |n| n.starts_with("spend-"));
        assert_eq!(files.len(), 1, "{files:?}");
        serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap()
    }

    fn batch_total(spool: &SpendSpool) -> i64 {
        spool
            .batch
            .iter()
            .flat_map(|(_, parts)| parts)
            .map(|p| p.total)
            .sum()
    }

    fn pending_total(spool: &SpendSpool) -> i64 {
        spool
            .pending
            .values()
            .flat_map(|ws| ws.values())
            .map(PendingSpend::total)
            .sum()
    }

    /// The spool of a meter that `spend` is made on, moved into `dir`: a process of its own, not
    /// one that takes the files already there.
    fn spooled_elsewhere(dir: &Path, spend: impl FnOnce(&Meter)) {
        let own = tempfile::tempdir().unwrap();
        let spooling = meter(own.path());
        spend(&spooling);
        spooling.spool_spend();
        for file in spool::list(own.path(), |_| true) {
            std::fs::rename(&file, dir.join(file.file_name().unwrap())).unwrap();
        }
    }

    /// Spend of 5 in a batch the store did not take, 3 more since, checkpointed.
    fn checkpointed(dir: &Path) -> (Arc<Meter>, String) {
        let meter = meter(dir);
        let charge = charger();
        let month = month_of(crate::ids::unix_now());
        charge(&meter, 5);
        // What `flush_usage` does when the store does not answer.
        let (a, _) = meter.begin_batch(&month).unwrap();
        meter.usage.flush_failed();
        meter.checkpoint_if_due();
        let on_disk = spend_file(dir);
        assert_eq!(on_disk.batch.as_ref().map(|(id, _)| id), Some(&a));
        assert_eq!((batch_total(&on_disk), pending_total(&on_disk)), (5, 0));
        charge(&meter, 3);
        meter.checkpoint_if_due();
        assert_eq!(pending_total(&spend_file(dir)), 0, "not due again yet");
        meter.write_checkpoint(false);
        let on_disk = spend_file(dir);
        assert_eq!((batch_total(&on_disk), pending_total(&on_disk)), (5, 3));
        (meter, a)
    }

    #[test]
    fn spend_checkpointed_in_an_outage_survives_a_crash_and_goes_out_under_its_batch_id() {
        let dir = tempfile::tempdir().unwrap();
        let (meter, a) = checkpointed(dir.path());
        // The checkpoint is this process's while it lives.
        assert!(self::meter(dir.path()).usage.unflushed().is_empty());
        drop(meter); // a crash
        let again = self::meter(dir.path());
        let month = month_of(crate::ids::unix_now());
        assert_eq!(again.usage.unflushed()[&month]["ws_1"].total(), 8);
        let (retried, parts) = again.usage.begin_flush(&month);
        assert_eq!(
            retried, a,
            "the batch the store may have taken goes under its id"
        );
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 5);
    }

    #[tokio::test]
    async fn a_checkpoint_holds_each_batch_before_it_goes_out_and_goes_once_all_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let (meter, a) = checkpointed(dir.path());
        let month = month_of(crate::ids::unix_now());
        // The store is back: the batch in flight lands; the 3 since are still only on disk.
        assert!(meter.flush_usage().await);
        let on_disk = spend_file(dir.path());
        assert_eq!(on_disk.batch.as_ref().map(|(id, _)| id), Some(&a));
        assert_eq!(pending_total(&on_disk), 3);
        // The next batch is written down under its id before it goes: sent, landed and then
        // replayed from a checkpoint that held it as pending, it would be charged twice.
        let (b, parts) = meter.begin_batch(&month).unwrap();
        assert_ne!(b, a);
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 3);
        let on_disk = spend_file(dir.path());
        assert_eq!(on_disk.batch.as_ref().map(|(id, _)| id), Some(&b));
        assert_eq!((batch_total(&on_disk), pending_total(&on_disk)), (3, 0));
        // Say it failed, and then went through: the checkpoint goes.
        meter.usage.flush_failed();
        assert!(meter.flush_usage().await);
        assert!(spool::list(dir.path(), |_| true).is_empty());
        let report = meter.store.usage_report("ws_1", &month).await.unwrap();
        assert_eq!(report.total, 8);
    }

    #[test]
    fn a_spool_file_taken_in_is_the_checkpoint_rewritten_in_place_and_files_go_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let month = month_of(crate::ids::unix_now());
        // Two processes' shutdown spools, each with a batch in flight and spend behind it.
        for amount in [7, 11] {
            spooled_elsewhere(dir.path(), |spooling| {
                charger()(spooling, amount);
                spooling.usage.begin_flush(&month);
                charger()(spooling, 1);
            });
        }
        let names = || spool::list(dir.path(), |_| true);
        let before = names();
        assert_eq!(before.len(), 2);
        let meter = meter(dir.path());
        let held = |m: &Meter| m.usage.unflushed()[&month]["ws_1"].total();
        assert_eq!(held(&meter), 8, "one file taken in, the oldest");
        // An outage: the file taken in is rewritten where it is, never copied into another.
        meter.usage.flush_failed();
        charger()(&meter, 2);
        meter.write_checkpoint(false);
        assert_eq!(names(), before);
        let on_disk: SpendSpool =
            serde_json::from_slice(&std::fs::read(&before[0]).unwrap()).unwrap();
        assert_eq!((batch_total(&on_disk), pending_total(&on_disk)), (7, 3));
        meter.take_spooled_spend();
        assert_eq!(held(&meter), 10, "the other file waits its turn");
        // A crash now: the files hold it all, once.
        drop(meter);
        let again = self::meter(dir.path());
        assert_eq!(held(&again), 10);
    }

    #[tokio::test]
    async fn spooled_files_are_written_one_after_the_other() {
        let dir = tempfile::tempdir().unwrap();
        for amount in [7, 11] {
            spooled_elsewhere(dir.path(), |spooling| charger()(spooling, amount));
        }
        let meter = meter(dir.path());
        for _ in 0..4 {
            assert!(meter.flush_usage().await);
        }
        assert!(spool::list(dir.path(), |_| true).is_empty());
        let month = month_of(crate::ids::unix_now());
        let report = meter.store.usage_report("ws_1", &month).await.unwrap();
        assert_eq!(report.total, 18);
    }

    #[tokio::test]
    async fn a_checkpoint_that_cannot_be_rewritten_goes_before_a_batch_of_its_spend_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let (meter, _) = checkpointed(dir.path());
        assert!(meter.flush_usage().await, "the batch it holds lands");
        let files = spool::list(dir.path(), |_| true);
        assert_eq!(files.len(), 1);
        // Its 3 pending go out next; the file cannot be rewritten (its temporary name is taken).
        let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
        std::fs::create_dir(dir.path().join(format!("{name}.tmp"))).unwrap();
        let month = month_of(crate::ids::unix_now());
        let (_, parts) = meter
            .begin_batch(&month)
            .expect("the file is removed instead");
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 3);
        assert!(
            !files[0].exists(),
            "no file holds as pending what the batch sends"
        );
    }
}
