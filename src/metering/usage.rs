//! Credit spend and monthly budgets, with no store round trip per request.
//!
//! Each replica adds what its requests cost to local accumulators and, every flush interval,
//! sends them to the store in one batch ([`Store::flush_usage`](crate::store::Store)) — which
//! adds them atomically, fires `billing.credits.low` once per crossing, and answers with the
//! month's totals of every workspace, key and project this replica watches (its own spend and
//! every other replica's). Budget checks compare a budget with those totals plus what this
//! replica has spent since.
//!
//! Across replicas a budget can be overshot by at most what the other replicas admitted during
//! one flush interval, plus the requests in flight when it ran out (their cost is only known
//! when they finish).

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::Credits;
use crate::keys::CachedKey;

/// Which budget refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetScope {
    /// The key's monthly budget.
    Key,
    /// The `Service-Project`'s monthly budget.
    Project,
    /// The workspace's monthly credits.
    Workspace,
}

impl BudgetScope {
    /// The word used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::Project => "project",
            Self::Workspace => "workspace",
        }
    }
}

/// One flush: what to add, and what to read back. Amounts are micro-credits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageFlush {
    /// Unique per batch, and the same when a batch is retried: the store adds a batch once,
    /// even if the answer to an earlier attempt was lost.
    pub id: String,
    /// `YYYY-MM` (UTC) the spend is charged to.
    pub month: String,
    /// Unix seconds, for events.
    pub now: u64,
    /// Per workspace.
    pub workspaces: Vec<WorkspaceFlush>,
    /// Requests admitted per key and minute window, for shared rate limits.
    pub rate: Vec<RateFlush>,
}

/// One workspace's part of a flush.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceFlush {
    /// `ws_…`
    pub workspace: String,
    /// Spend to add to the workspace total.
    pub total: i64,
    /// Spend to add per key id.
    pub keys: HashMap<String, i64>,
    /// Spend to add per project.
    pub projects: HashMap<String, i64>,
    /// Keys whose month totals to read back.
    pub watch_keys: Vec<String>,
    /// Projects whose month totals (and budgets) to read back.
    pub watch_projects: Vec<String>,
    /// Id for a `billing.credits.low` event, used only if this flush crosses the threshold.
    pub event_id: String,
}

/// Requests a key was admitted in one minute window, on this replica since the last flush.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateFlush {
    /// Key id.
    pub key: String,
    /// `unix / 60`.
    pub window: u64,
    /// Requests to add.
    pub count: u64,
}

/// What the store answers to a flush.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageSnapshot {
    /// Per workspace.
    #[serde(default)]
    pub workspaces: HashMap<String, WorkspaceTotals>,
    /// Per key: the rate windows after the flush.
    #[serde(default)]
    pub rate: HashMap<String, RateTotals>,
}

/// A workspace's month so far, across every replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceTotals {
    /// Spend of the month.
    #[serde(default)]
    pub total: i64,
    /// The workspace's monthly credits, if capped.
    #[serde(default)]
    pub monthly_credits: Option<i64>,
    /// Spend per watched key.
    #[serde(default)]
    pub keys: HashMap<String, i64>,
    /// Spend per watched project.
    #[serde(default)]
    pub projects: HashMap<String, i64>,
    /// Budgets of watched projects that have one.
    #[serde(default)]
    pub project_budgets: HashMap<String, i64>,
}

/// A key's rate windows across every replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RateTotals {
    /// `unix / 60`.
    pub window: u64,
    /// Requests in the previous window.
    pub previous: u64,
    /// Requests in this window.
    pub current: u64,
}

/// Spend of one workspace not yet flushed.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingSpend {
    total: i64,
    keys: FastMap<String, i64>,
    projects: FastMap<String, i64>,
}

impl PendingSpend {
    fn add(&mut self, other: &PendingSpend) {
        self.total += other.total;
        for (k, v) in &other.keys {
            *self.keys.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.projects {
            *self.projects.entry(k.clone()).or_default() += v;
        }
    }
}

#[derive(Debug, Default)]
struct Ledger {
    /// Spend since the last flush, per workspace.
    pending: FastMap<String, PendingSpend>,
    /// Spend taken by a flush still under way or failed (retried as the same batch).
    in_flight: FastMap<String, PendingSpend>,
    /// That batch, with its id, until the store confirms it.
    in_flight_batch: Option<(String, Vec<WorkspaceFlush>)>,
    /// Month totals from the last flush.
    totals: FastMap<String, Totals>,
    /// What to read back at the next flush, per workspace.
    watched: FastMap<String, Watched>,
    /// Flushes begun so far: the clock of [`Watched`].
    flushes: u64,
    /// The month the totals are for.
    month: String,
}

/// [`WorkspaceTotals`] as the ledger keeps them, in [`FastMap`]s.
#[derive(Debug, Default)]
struct Totals {
    total: i64,
    monthly_credits: Option<i64>,
    keys: FastMap<String, i64>,
    projects: FastMap<String, i64>,
    project_budgets: FastMap<String, i64>,
}

impl From<&WorkspaceTotals> for Totals {
    fn from(t: &WorkspaceTotals) -> Self {
        let fast = |m: &HashMap<String, i64>| m.iter().map(|(k, v)| (k.clone(), *v)).collect();
        Self {
            total: t.total,
            monthly_credits: t.monthly_credits,
            keys: fast(&t.keys),
            projects: fast(&t.projects),
            project_budgets: fast(&t.project_budgets),
        }
    }
}

/// A workspace whose totals the flush reads back, with the keys and projects whose totals it
/// reads too, each with the flush count when a request last checked it: those unused for
/// [`WATCH_IDLE_FLUSHES`] are dropped, so the watch lists (and each flush) grow with what is in
/// use, not with every key and project name ever seen.
#[derive(Debug, Default)]
struct Watched {
    seen: u64,
    keys: FastMap<Box<str>, u64>,
    projects: FastMap<Box<str>, u64>,
}

/// Flushes after which a key or project no request has checked stops being watched (two minutes
/// at the default 200 ms interval). Its total is read again on its next use.
pub const WATCH_IDLE_FLUSHES: u64 = 600;

/// Marks `name` as checked at flush `now`, allocating only the first time.
/// A key's monthly budget as the check needs it: the cap, and the other keys whose spend it
/// counts (those it replaced in rotations and, during its grace period, its successor).
#[derive(Debug, Clone, Copy)]
pub struct KeyBudget<'a> {
    /// The monthly cap.
    pub limit: Credits,
    /// The other keys of the rotation lineage.
    pub peers: &'a [Arc<str>],
}

impl<'a> KeyBudget<'a> {
    /// `key`'s own budget, if it has one.
    pub fn of(key: &'a CachedKey) -> Option<Self> {
        key.monthly_budget.map(|limit| KeyBudget {
            limit,
            peers: &key.budget_peers,
        })
    }
}

fn touch(map: &mut FastMap<Box<str>, u64>, name: &str, now: u64) {
    match map.get_mut(name) {
        Some(seen) => *seen = now,
        None => {
            map.insert(name.into(), now);
        }
    }
}

/// The ledger's maps: looked up a dozen times per billable request, by names that are not
/// secrets, so a fast seeded hash rather than SipHash (foldhash's quality variant: still
/// seeded per process, for `Service-Project` names chosen by callers).
type FastMap<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// This replica's view of the month's spend, and its unflushed spend.
pub struct Usage {
    ledger: Mutex<Ledger>,
    /// Budgets per workspace and project from the configuration; the store's win. Nested, so
    /// a lookup borrows the names instead of building a `(String, String)` key per request.
    configured_project_budgets: FastMap<String, FastMap<String, i64>>,
    /// Signalled when a request checks a workspace this replica has no totals for: until a
    /// flush brings them, it knows neither the workspace's credits nor its projects' budgets.
    flush_wanted: tokio::sync::Notify,
}

impl Usage {
    /// An empty ledger with budgets from the configuration.
    pub fn new(configured_project_budgets: HashMap<(String, String), i64>) -> Self {
        let mut nested: FastMap<String, FastMap<String, i64>> = FastMap::default();
        for ((ws, project), budget) in configured_project_budgets {
            nested.entry(ws).or_default().insert(project, budget);
        }
        Self {
            ledger: Mutex::new(Ledger::default()),
            configured_project_budgets: nested,
            flush_wanted: tokio::sync::Notify::new(),
        }
    }

    /// Completes when a request found a workspace whose budgets are not known yet.
    pub async fn flush_wanted(&self) {
        self.flush_wanted.notified().await
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses a request whose key, project or workspace has spent its monthly budget.
    pub fn check(
        &self,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
    ) -> Result<(), BudgetScope> {
        let mut ledger = self.ledger();
        let ws = &*key.workspace;
        let billed = key.billed_key_id();
        let now = ledger.flushes;
        let watched = match ledger.watched.get_mut(ws) {
            Some(w) => w,
            None => ledger.watched.entry(ws.to_string()).or_default(),
        };
        watched.seen = now;
        // Only a key with a budget needs its total read back; the others are charged, not read.
        if let Some(budget) = &budget {
            touch(&mut watched.keys, billed, now);
            for peer in budget.peers {
                touch(&mut watched.keys, peer, now);
            }
        }
        if let Some(p) = project {
            touch(&mut watched.projects, p, now);
        }
        let totals = ledger.totals.get(ws);
        if totals.is_none() {
            self.flush_wanted.notify_one();
        }
        let pending = ledger.pending.get(ws);
        let in_flight = ledger.in_flight.get(ws);
        let spent = |pick: &dyn Fn(&PendingSpend) -> i64, base: i64| {
            base + pending.map_or(0, pick) + in_flight.map_or(0, pick)
        };
        if let Some(budget) = budget {
            let spent_by = |id: &str| {
                let base = totals.and_then(|t| t.keys.get(id)).copied().unwrap_or(0);
                spent(&|p| p.keys.get(id).copied().unwrap_or(0), base)
            };
            let used = spent_by(billed) + budget.peers.iter().map(|p| spent_by(p)).sum::<i64>();
            if used >= budget.limit.micros() {
                return Err(BudgetScope::Key);
            }
        }
        if let Some(p) = project {
            let budget = totals
                .and_then(|t| t.project_budgets.get(p))
                .copied()
                .or_else(|| {
                    self.configured_project_budgets
                        .get(ws)
                        .and_then(|projects| projects.get(p))
                        .copied()
                });
            if let Some(budget) = budget {
                let base = totals.and_then(|t| t.projects.get(p)).copied().unwrap_or(0);
                let used = spent(&|s| s.projects.get(p).copied().unwrap_or(0), base);
                if used >= budget {
                    return Err(BudgetScope::Project);
                }
            }
        }
        if let Some(credits) = totals.and_then(|t| t.monthly_credits) {
            let base = totals.map_or(0, |t| t.total);
            if spent(&|p| p.total, base) >= credits {
                return Err(BudgetScope::Workspace);
            }
        }
        Ok(())
    }

    /// Charges `cost` to the key, the project and the workspace.
    pub fn charge(&self, key: &CachedKey, project: Option<&str>, cost: Credits) {
        if cost.micros() <= 0 {
            return;
        }
        let mut ledger = self.ledger();
        let pending = match ledger.pending.get_mut(&*key.workspace) {
            Some(p) => p,
            None => ledger.pending.entry(key.workspace.to_string()).or_default(),
        };
        pending.total += cost.micros();
        add(&mut pending.keys, key.billed_key_id(), cost.micros());
        if let Some(p) = project {
            add(&mut pending.projects, p, cost.micros());
        }
    }

    /// The next batch for a flush of `month`: the one that failed last time, unchanged (same
    /// id), or else the unflushed spend and the watch lists.
    pub fn begin_flush(&self, month: &str) -> (String, Vec<WorkspaceFlush>) {
        let mut ledger = self.ledger();
        if ledger.month != month {
            // A new month: last month's totals no longer apply.
            ledger.month = month.to_string();
            ledger.totals.clear();
        }
        if let Some(batch) = &ledger.in_flight_batch {
            return batch.clone();
        }
        ledger.flushes += 1;
        let idle_before = ledger.flushes.saturating_sub(WATCH_IDLE_FLUSHES);
        ledger.watched.retain(|_, w| {
            w.keys.retain(|_, seen| *seen >= idle_before);
            w.projects.retain(|_, seen| *seen >= idle_before);
            w.seen >= idle_before
        });
        let Ledger {
            watched, totals, ..
        } = &mut *ledger;
        totals.retain(|ws, _| watched.contains_key(ws));
        let pending = std::mem::take(&mut ledger.pending);
        let mut workspaces: HashSet<String> = pending.keys().cloned().collect();
        workspaces.extend(ledger.watched.keys().cloned());
        let mut out = Vec::with_capacity(workspaces.len());
        for ws in workspaces {
            let spend = pending.get(&ws).cloned().unwrap_or_default();
            ledger.in_flight.entry(ws.clone()).or_default().add(&spend);
            let names = |m: &FastMap<Box<str>, u64>| m.keys().map(|k| k.to_string()).collect();
            let (watch_keys, watch_projects) = ledger
                .watched
                .get(&ws)
                .map(|w| (names(&w.keys), names(&w.projects)))
                .unwrap_or_default();
            out.push(WorkspaceFlush {
                watch_keys,
                watch_projects,
                total: spend.total,
                keys: spend.keys.into_iter().collect(),
                projects: spend.projects.into_iter().collect(),
                event_id: crate::ids::new_id("evt"),
                workspace: ws,
            });
        }
        let batch = (crate::ids::new_id("flush"), out);
        if !batch.1.is_empty() {
            ledger.in_flight_batch = Some(batch.clone());
        }
        batch
    }

    /// The flush landed: its spend is in the totals now.
    pub fn finish_flush(&self, snapshot: &UsageSnapshot) {
        let mut ledger = self.ledger();
        ledger.in_flight.clear();
        ledger.in_flight_batch = None;
        for (ws, totals) in &snapshot.workspaces {
            ledger.totals.insert(ws.clone(), totals.into());
        }
    }

    /// Unflushed spend (also what a flush under way took), for the spool at shutdown.
    pub fn unflushed(&self) -> HashMap<String, PendingSpend> {
        let ledger = self.ledger();
        let mut all = ledger.pending.clone();
        for (ws, spend) in &ledger.in_flight {
            all.entry(ws.clone()).or_default().add(spend);
        }
        all.into_iter().collect()
    }

    /// Adds spend recovered from the spool.
    pub fn restore(&self, spend: HashMap<String, PendingSpend>) {
        let mut ledger = self.ledger();
        for (ws, s) in spend {
            ledger.pending.entry(ws).or_default().add(&s);
        }
    }
}

/// Adds `amount` to `map[name]`, allocating the name only the first time.
fn add(map: &mut FastMap<String, i64>, name: &str, amount: i64) {
    match map.get_mut(name) {
        Some(v) => *v += amount,
        None => {
            map.insert(name.to_string(), amount);
        }
    }
}

/// The `billing.credits.low` event a flush of `w` fires when it takes the workspace's
/// remaining credits below `threshold` (both in micro-credits).
pub fn credits_low_event(
    w: &WorkspaceFlush,
    flush: &UsageFlush,
    remaining: i64,
    threshold: i64,
) -> crate::events::Event {
    crate::events::Event {
        id: w.event_id.clone(),
        event_type: "billing.credits.low".into(),
        created: flush.now,
        workspace: w.workspace.clone(),
        environment: crate::keys::Environment::Live,
        data: serde_json::json!({
            "workspace": w.workspace,
            "remaining": Credits::from_micros(remaining.max(0)).as_f64(),
            "threshold": Credits::from_micros(threshold).as_f64(),
            "month": flush.month,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Environment, KeyStatus, Scopes};

    fn key(budget: Option<i64>) -> CachedKey {
        CachedKey {
            id: "key_1".into(),
            workspace: "ws_1".into(),
            environment: Environment::Live,
            scopes: Arc::new(Scopes::default()),
            status: KeyStatus::Active,
            grace_until: None,
            monthly_budget: budget.map(Credits::from_micros),
            budget_peers: Box::default(),
            scoped: None,
            last4: *b"abcd",
        }
    }

    #[test]
    fn a_key_budget_counts_flushed_and_unflushed_spend() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(3_000_000));
        assert_eq!(usage.check(&k, KeyBudget::of(&k), None), Ok(()));
        usage.charge(&k, None, Credits::from_micros(1_000_000));
        let (_, flush) = usage.begin_flush("2026-11");
        assert_eq!(flush[0].total, 1_000_000);
        assert_eq!(flush[0].watch_keys, vec!["key_1".to_string()]);
        // Another replica spent 1.5 meanwhile; the store reports 2.5 in all.
        let mut totals = WorkspaceTotals {
            total: 2_500_000,
            ..Default::default()
        };
        totals.keys.insert("key_1".into(), 2_500_000);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        assert_eq!(usage.check(&k, KeyBudget::of(&k), None), Ok(()));
        usage.charge(&k, None, Credits::from_micros(500_000));
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None),
            Err(BudgetScope::Key)
        );
    }

    #[test]
    fn a_failed_flush_is_retried_as_the_same_batch() {
        let usage = Usage::new(HashMap::new());
        let k = key(None);
        usage.charge(&k, Some("p"), Credits::from_micros(7));
        let (id, first) = usage.begin_flush("2026-11");
        assert_eq!(first[0].total, 7);
        usage.charge(&k, Some("p"), Credits::from_micros(3));
        // No answer from the store: the same batch goes again, the new spend waits.
        let (retry_id, retry) = usage.begin_flush("2026-11");
        assert_eq!((retry_id.as_str(), retry[0].total), (id.as_str(), 7));
        assert_eq!(retry[0].event_id, first[0].event_id);
        assert_eq!(usage.unflushed()["ws_1"].total, 10);
        usage.finish_flush(&UsageSnapshot::default());
        let (next_id, next) = usage.begin_flush("2026-11");
        assert_ne!(next_id, id);
        assert_eq!(next[0].total, 3);
        assert_eq!(next[0].projects["p"], 3);
    }

    #[test]
    fn project_and_workspace_budgets_apply() {
        let mut configured = HashMap::new();
        configured.insert(("ws_1".to_string(), "p".to_string()), 5);
        let usage = Usage::new(configured);
        let k = key(None);
        usage.charge(&k, Some("p"), Credits::from_micros(5));
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("p")),
            Err(BudgetScope::Project)
        );
        assert_eq!(usage.check(&k, KeyBudget::of(&k), Some("q")), Ok(()));
        usage.begin_flush("2026-11");
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert(
            "ws_1".into(),
            WorkspaceTotals {
                total: 100,
                monthly_credits: Some(100),
                ..Default::default()
            },
        );
        usage.finish_flush(&snapshot);
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("q")),
            Err(BudgetScope::Workspace)
        );
        // A new month starts from zero.
        usage.begin_flush("2026-12");
        assert_eq!(usage.check(&k, KeyBudget::of(&k), Some("q")), Ok(()));
    }

    #[test]
    fn nothing_is_charged_for_free_requests() {
        let usage = Usage::new(HashMap::new());
        usage.charge(&key(None), None, Credits::ZERO);
        assert!(usage.unflushed().is_empty());
    }

    #[test]
    fn only_budgeted_keys_are_read_back_and_idle_ones_are_forgotten() {
        let usage = Usage::new(HashMap::new());
        let capped = key(Some(10));
        let mut free = key(None);
        free.id = "key_2".into();
        usage.check(&free, KeyBudget::of(&free), Some("p")).unwrap();
        usage.check(&capped, KeyBudget::of(&capped), None).unwrap();
        let (_, batch) = usage.begin_flush("2026-11");
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
        assert_eq!(batch[0].watch_projects, vec!["p".to_string()]);
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), 10);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        assert_eq!(
            usage.check(&capped, KeyBudget::of(&capped), None),
            Err(BudgetScope::Key)
        );
        // The budgeted key stays in use; the project is not named again.
        for _ in 0..WATCH_IDLE_FLUSHES {
            usage
                .check(&capped, KeyBudget::of(&capped), None)
                .unwrap_err();
            let (_, batch) = usage.begin_flush("2026-11");
            usage.finish_flush(&snapshot);
            assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
        }
        let (_, batch) = usage.begin_flush("2026-11");
        usage.finish_flush(&UsageSnapshot::default());
        assert!(batch[0].watch_projects.is_empty(), "idle project dropped");
        // Nothing used the workspace for as long: it and its totals go too.
        for _ in 0..=WATCH_IDLE_FLUSHES {
            let (_, batch) = usage.begin_flush("2026-11");
            if batch.is_empty() {
                assert_eq!(
                    usage.check(&capped, KeyBudget::of(&capped), None),
                    Ok(()),
                    "stale totals dropped"
                );
                return;
            }
            usage.finish_flush(&snapshot);
        }
        panic!("an idle workspace is never forgotten");
    }
}
