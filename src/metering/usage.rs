//! Credit spend and monthly budgets, with no store round trip per request.
//!
//! Each replica adds what its requests cost to local accumulators and, every flush interval,
//! sends them to the store in one batch ([`UsageStore::flush_usage`](super::store::UsageStore::flush_usage)) — which
//! adds them atomically, fires `billing.credits.low` once per crossing, and answers with the
//! month's totals of every workspace, key and project this replica watches (its own spend and
//! every other replica's). Budget checks compare a budget with those totals plus what this
//! replica has spent since; a total not read yet is unknown, and the request waits for the flush
//! that reads it ([`Verdict::Unknown`]).
//!
//! Across replicas a budget can be overshot by at most what the other replicas admitted during
//! one flush interval, plus the requests in flight when it ran out (their cost is only known
//! when they finish).

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::month::{bounds_of_month, month_bounds_ms, month_of};
use super::{Credits, MAX_FLUSH_ENTRIES};
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

/// What a budget check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every budget that applies has room.
    Within,
    /// This budget is spent.
    Spent(BudgetScope),
    /// A total the check needs has not been read from the store yet: the workspace, key or
    /// project is new to this replica, or went unused long enough to be forgotten, or the month
    /// just began. Flush number `flush` is the first to read it, and has been asked for
    /// ([`Usage::read_back`] waits for it). Nothing known so far spends a budget.
    Unknown {
        /// The flush that reads the missing totals.
        flush: u64,
    },
}

/// How long a request whose totals are unknown waits for the flush that reads them. Past it
/// (a slow or unreachable store), the request is admitted, as every request is while the store
/// is down: spend is still counted, and charged when the store is back.
pub const READ_BACK_WAIT: Duration = Duration::from_secs(2);

/// The flushes as [`Usage::read_back`] waits on them.
#[derive(Debug, Clone, Copy, Default)]
struct FlushState {
    /// The number of the last flush the store took.
    done: u64,
    /// Whether the last attempt failed (no use waiting for the next one).
    failing: bool,
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
    /// The rate counts' own batch id, as [`UsageFlush::id`] is the spend's: a retry sends the
    /// same counts under it, while spend that arrived meanwhile may join the retried spend.
    pub rate_id: String,
}

/// One workspace's part of a flush.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceFlush {
    /// `ws_…`
    pub workspace: String,
    /// The month (`YYYY-MM`) this spend is charged to, when it is not the flush's: spend of
    /// requests that arrived in an earlier month (flushed after it ended, or kept through an
    /// outage or a restart). Such a part only adds spend; it reads nothing back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub month: Option<String>,
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
    /// Every project budget of the workspace.
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

/// Unflushed spend by month (`YYYY-MM`) and workspace: what a shutdown spools.
pub type SpendByMonth = HashMap<String, HashMap<String, PendingSpend>>;

/// What a shutdown spools of unflushed spend: the batch the store may already have taken (its
/// answer lost), kept with its id so the store adds it once, and the spend no batch holds.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpendSpool {
    /// The batch in flight, every part with its month.
    #[serde(default)]
    pub batch: Option<(String, Vec<WorkspaceFlush>)>,
    /// The rest, by month and workspace.
    #[serde(default)]
    pub pending: SpendByMonth,
}

impl SpendSpool {
    /// Whether there is nothing to keep.
    pub fn is_empty(&self) -> bool {
        self.batch.is_none() && self.pending.is_empty()
    }

    /// The spool with its pending spend made a batch, under a new id, if it has no batch: once
    /// that is written down, whoever sends it sends that id, and the store adds it once.
    /// `None` if it has a batch already, or no spend.
    pub fn pinned(&self) -> Option<SpendSpool> {
        if self.batch.is_some() || self.pending.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        for (month, workspaces) in &self.pending {
            for (ws, spend) in workspaces {
                parts.push(WorkspaceFlush {
                    workspace: ws.clone(),
                    month: Some(month.clone()),
                    total: spend.total,
                    keys: spend.keys.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                    projects: spend
                        .projects
                        .iter()
                        .map(|(k, v)| (k.clone(), *v))
                        .collect(),
                    event_id: crate::ids::new_id("evt"),
                    ..WorkspaceFlush::default()
                });
            }
        }
        Some(SpendSpool {
            batch: Some((crate::ids::new_id("flush"), parts)),
            pending: SpendByMonth::new(),
        })
    }
}

/// Spend of one workspace not yet flushed.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingSpend {
    total: i64,
    keys: FastMap<String, i64>,
    projects: FastMap<String, i64>,
}

impl PendingSpend {
    /// The workspace's spend, micro-credits.
    pub fn total(&self) -> i64 {
        self.total
    }

    /// Keeps the total and at most `*room` key and project entries (projects first), takes
    /// what it keeps from `room`, and returns the rest, with no total, if there is any.
    fn split_off(&mut self, room: &mut usize) -> Option<PendingSpend> {
        let entries = self.keys.len() + self.projects.len();
        if entries <= *room {
            *room -= entries;
            return None;
        }
        let mut kept = 0;
        let mut keep = |_: &String, _: &mut i64| {
            kept += 1;
            kept > *room
        };
        let rest = PendingSpend {
            total: 0,
            projects: self.projects.extract_if(&mut keep).collect(),
            keys: self.keys.extract_if(&mut keep).collect(),
        };
        *room = 0;
        Some(rest)
    }

    fn add(&mut self, other: &PendingSpend) {
        // Sums saturate: a backend reporting absurd costs must not overflow them.
        self.total = self.total.saturating_add(other.total);
        for (k, v) in &other.keys {
            let sum = self.keys.entry(k.clone()).or_default();
            *sum = sum.saturating_add(*v);
        }
        for (k, v) in &other.projects {
            let sum = self.projects.entry(k.clone()).or_default();
            *sum = sum.saturating_add(*v);
        }
    }
}

#[derive(Debug, Default)]
struct Ledger {
    /// Spend since the last flush of requests that arrived in `month`, per workspace.
    pending: FastMap<String, PendingSpend>,
    /// Spend since the last flush of requests that arrived in another month, by month and
    /// workspace: a request that arrived before midnight at a month's end and finished after
    /// the month turned here, or spend kept through an outage or restored from a spool.
    pending_other: FastMap<(String, String), PendingSpend>,
    /// The part of `month` in the flush still under way or failed (retried as the same batch):
    /// what budget checks count besides `pending`.
    in_flight: FastMap<String, PendingSpend>,
    /// That batch, with its id, until the store confirms it.
    in_flight_batch: Option<(String, Vec<WorkspaceFlush>)>,
    /// Whether the last batch begun left spend behind ([`MAX_FLUSH_ENTRIES`]).
    deferred: bool,
    /// Month totals from the last flush.
    totals: FastMap<String, Totals>,
    /// What to read back at the next flush, per workspace.
    watched: FastMap<String, Watched>,
    /// Flushes begun so far: the clock of [`Watched`].
    flushes: u64,
    /// The number of the batch in flight (retries keep it).
    batch_flush: u64,
    /// The month of the totals and of `pending`.
    month: String,
    /// The month the last flush begun reads totals of: when a request turned `month` since,
    /// what it reads back is the month that ended, and not kept.
    flush_month: String,
    /// Its unix milliseconds: a request that arrived in them is charged to `pending`.
    month_ms: std::ops::Range<u64>,
}

impl Ledger {
    /// Makes `month` the month of the totals and of `pending`: spend pending for the month it
    /// replaces is flushed as that month's, and last month's totals no longer apply.
    fn turn_to(&mut self, month: &str, bounds_ms: std::ops::Range<u64>) {
        let old = std::mem::replace(&mut self.month, month.to_string());
        for (ws, spend) in std::mem::take(&mut self.pending) {
            self.pending_other
                .entry((old.clone(), ws))
                .or_default()
                .add(&spend);
        }
        let mut kept: FastMap<(String, String), PendingSpend> = FastMap::default();
        for ((m, ws), spend) in std::mem::take(&mut self.pending_other) {
            match m == month {
                true => self.pending.entry(ws).or_default().add(&spend),
                false => kept.entry((m, ws)).or_default().add(&spend),
            }
        }
        self.pending_other = kept;
        self.month_ms = bounds_ms;
        self.totals.clear();
        // What is in flight was spent in the month that ended: not this month's spend.
        self.in_flight.clear();
    }
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
    /// Signalled when a request checks totals this replica has not read ([`Verdict::Unknown`]).
    flush_wanted: tokio::sync::Notify,
    /// Where flushes stand, for requests waiting on totals ([`Usage::read_back`]).
    flushed: tokio::sync::watch::Sender<FlushState>,
}

impl Usage {
    /// An empty ledger with budgets from the configuration.
    pub fn new(configured_project_budgets: HashMap<(String, String), i64>) -> Self {
        let mut nested: FastMap<String, FastMap<String, i64>> = FastMap::default();
        for ((ws, project), budget) in configured_project_budgets {
            nested.entry(ws).or_default().insert(project, budget);
        }
        Self {
            ledger: Mutex::new({
                let now = crate::ids::unix_now();
                Ledger {
                    month: month_of(now),
                    month_ms: month_bounds_ms(now),
                    ..Ledger::default()
                }
            }),
            configured_project_budgets: nested,
            flush_wanted: tokio::sync::Notify::new(),
            flushed: tokio::sync::watch::Sender::new(FlushState::default()),
        }
    }

    /// Completes when a request found totals not known yet.
    pub async fn flush_wanted(&self) {
        self.flush_wanted.notified().await
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the request's key, project and workspace have budget left, by the month totals
    /// of the last flush and what this replica has spent since.
    ///
    /// A total not read yet counts as unknown, not as zero: a key idle long enough to be
    /// forgotten, or first seen after a restart, would otherwise be admitted whatever it has
    /// spent, once per idle spell. The check then asks for a flush that reads it.
    ///
    /// `now_ms` is the request's arrival (unix milliseconds): in a month (UTC) that began since
    /// the last flush, last month's totals say nothing, and are dropped.
    pub fn check(
        &self,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        now_ms: u64,
    ) -> Verdict {
        let mut ledger = self.ledger();
        if now_ms >= ledger.month_ms.end {
            let unix = now_ms / 1000;
            ledger.turn_to(&month_of(unix), month_bounds_ms(unix));
        }
        let ws = &*key.workspace;
        let billed = key.billed_key_id();
        let now = ledger.flushes;
        // A project's spend is read back only if it has a budget. Every flush reads all of a
        // workspace's project budgets, so once it has been read a project with none needs
        // nothing: a client making up project names costs no reads and no extra flushes.
        let budgeted = project.filter(|p| {
            ledger
                .totals
                .get(ws)
                .is_none_or(|t| t.project_budgets.contains_key(*p))
                || self
                    .configured_project_budgets
                    .get(ws)
                    .is_some_and(|projects| projects.contains_key(*p))
        });
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
        if let Some(p) = budgeted {
            touch(&mut watched.projects, p, now);
        }
        let totals = ledger.totals.get(ws);
        let mut known = totals.is_some();
        let pending = ledger.pending.get(ws);
        let in_flight = ledger.in_flight.get(ws);
        let spent = |pick: &dyn Fn(&PendingSpend) -> i64, base: i64| {
            base.saturating_add(pending.map_or(0, pick))
                .saturating_add(in_flight.map_or(0, pick))
        };
        let mut verdict = Verdict::Within;
        if let Some(budget) = budget {
            let mut spent_by = |id: &str| {
                let base = totals.and_then(|t| t.keys.get(id).copied());
                known &= base.is_some();
                spent(&|p| p.keys.get(id).copied().unwrap_or(0), base.unwrap_or(0))
            };
            let used = budget
                .peers
                .iter()
                .fold(spent_by(billed), |sum, p| sum.saturating_add(spent_by(p)));
            if used >= budget.limit.micros() {
                verdict = Verdict::Spent(BudgetScope::Key);
            }
        }
        if let (Some(p), Verdict::Within) = (budgeted, verdict) {
            // A project's budget is read with the workspace's (a configured one applies until
            // then), its total once it is watched.
            let base = totals.and_then(|t| t.projects.get(p).copied());
            known &= base.is_some();
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
                let used = spent(
                    &|s| s.projects.get(p).copied().unwrap_or(0),
                    base.unwrap_or(0),
                );
                if used >= budget {
                    verdict = Verdict::Spent(BudgetScope::Project);
                }
            }
        }
        if let (Some(credits), Verdict::Within) = (totals.and_then(|t| t.monthly_credits), verdict)
        {
            let base = totals.map_or(0, |t| t.total);
            if spent(&|p| p.total, base) >= credits {
                verdict = Verdict::Spent(BudgetScope::Workspace);
            }
        }
        if verdict == Verdict::Within && !known {
            // The next batch begun reads what this check added to the watch lists; a batch
            // under way or being retried does not.
            let flush = ledger.flushes + 1;
            drop(ledger);
            self.flush_wanted.notify_one();
            return Verdict::Unknown { flush };
        }
        verdict
    }

    /// Waits (at most [`READ_BACK_WAIT`]) until flush number `flush` has landed, or a flush
    /// has failed: a [`Verdict::Unknown`] is then checked again.
    pub async fn read_back(&self, flush: u64) {
        let mut state = self.flushed.subscribe();
        let landed = state.wait_for(|s| s.done >= flush || s.failing);
        let _ = tokio::time::timeout(READ_BACK_WAIT, landed).await;
    }

    /// The store did not take a flush: requests stop waiting for totals until one lands.
    pub fn flush_failed(&self) {
        self.flushed.send_modify(|s| s.failing = true);
    }

    /// Charges `cost` to the key, the project and the workspace, in the month of `arrived_ms`
    /// (unix milliseconds).
    pub fn charge(&self, key: &CachedKey, project: Option<&str>, cost: Credits, arrived_ms: u64) {
        if cost.micros() <= 0 {
            return;
        }
        let mut ledger = self.ledger();
        let ledger = &mut *ledger;
        let ws = &*key.workspace;
        // To the month the request arrived in (UTC), whenever it is flushed.
        let pending = if ledger.month_ms.contains(&arrived_ms) {
            match ledger.pending.get_mut(ws) {
                Some(p) => p,
                None => ledger.pending.entry(ws.to_string()).or_default(),
            }
        } else {
            let month = month_of(arrived_ms / 1000);
            ledger
                .pending_other
                .entry((month, ws.to_string()))
                .or_default()
        };
        pending.total = pending.total.saturating_add(cost.micros());
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
            ledger.turn_to(month, bounds_of_month(month));
        }
        ledger.flush_month = month.to_string();
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
        let mut pending = std::mem::take(&mut ledger.pending);
        let earlier = std::mem::take(&mut ledger.pending_other);
        let mut workspaces: HashSet<String> = pending.keys().cloned().collect();
        workspaces.extend(ledger.watched.keys().cloned());
        let mut out = Vec::with_capacity(workspaces.len());
        let mut room = MAX_FLUSH_ENTRIES;
        ledger.deferred = false;
        for ws in workspaces {
            let mut spend = pending.remove(&ws).unwrap_or_default();
            if let Some(rest) = spend.split_off(&mut room) {
                ledger.pending.entry(ws.clone()).or_default().add(&rest);
                ledger.deferred = true;
            }
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
                month: Some(ledger.month.clone()),
                total: spend.total,
                keys: spend.keys.into_iter().collect(),
                projects: spend.projects.into_iter().collect(),
                event_id: crate::ids::new_id("evt"),
                workspace: ws,
            });
        }
        // Spend of other months goes to those months, and reads nothing back.
        for ((month, ws), mut spend) in earlier {
            if let Some(rest) = spend.split_off(&mut room) {
                let left = ledger.pending_other.entry((month.clone(), ws.clone()));
                left.or_default().add(&rest);
                ledger.deferred = true;
            }
            out.push(WorkspaceFlush {
                month: Some(month),
                total: spend.total,
                keys: spend.keys.into_iter().collect(),
                projects: spend.projects.into_iter().collect(),
                event_id: crate::ids::new_id("evt"),
                workspace: ws,
                ..WorkspaceFlush::default()
            });
        }
        let batch = (crate::ids::new_id("flush"), out);
        ledger.batch_flush = ledger.flushes;
        if !batch.1.is_empty() {
            ledger.in_flight_batch = Some(batch.clone());
        }
        batch
    }

    /// Whether the last batch begun left spend behind for the next: more than
    /// [`MAX_FLUSH_ENTRIES`] keys and projects had spend waiting.
    pub fn deferred(&self) -> bool {
        self.ledger().deferred
    }

    /// The flush landed: its spend is in the totals now.
    pub fn finish_flush(&self, snapshot: &UsageSnapshot) {
        let mut ledger = self.ledger();
        ledger.in_flight.clear();
        ledger.in_flight_batch = None;
        if ledger.flush_month == ledger.month {
            for (ws, totals) in &snapshot.workspaces {
                ledger.totals.insert(ws.clone(), totals.into());
            }
        }
        let done = ledger.batch_flush;
        drop(ledger);
        self.flushed.send_replace(FlushState {
            done,
            failing: false,
        });
    }

    /// Unflushed spend (also what a flush under way took), for the spool at shutdown.
    pub fn unflushed(&self) -> SpendByMonth {
        let ledger = self.ledger();
        let mut all = SpendByMonth::new();
        let mut put = |month: &str, ws: &str, spend: &PendingSpend| {
            let months = all.entry(month.to_string()).or_default();
            months.entry(ws.to_string()).or_default().add(spend);
        };
        for (ws, spend) in &ledger.pending {
            put(&ledger.month, ws, spend);
        }
        for ((month, ws), spend) in &ledger.pending_other {
            put(month, ws, spend);
        }
        for w in ledger.in_flight_batch.iter().flat_map(|(_, batch)| batch) {
            let spend = PendingSpend {
                total: w.total,
                keys: w.keys.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                projects: w.projects.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            };
            put(
                w.month.as_deref().unwrap_or(&ledger.month),
                &w.workspace,
                &spend,
            );
        }
        all.retain(|_, months| {
            months.retain(|_, s| s.total != 0 || !s.keys.is_empty() || !s.projects.is_empty());
            !months.is_empty()
        });
        all
    }

    /// What to spool at shutdown ([`SpendSpool`]).
    pub fn spool(&self) -> SpendSpool {
        let ledger = self.ledger();
        let mut pending = SpendByMonth::new();
        let mut put = |month: &str, ws: &str, spend: &PendingSpend| {
            if spend.total != 0 || !spend.keys.is_empty() || !spend.projects.is_empty() {
                let months = pending.entry(month.to_string()).or_default();
                months.entry(ws.to_string()).or_default().add(spend);
            }
        };
        for (ws, spend) in &ledger.pending {
            put(&ledger.month, ws, spend);
        }
        for ((month, ws), spend) in &ledger.pending_other {
            put(month, ws, spend);
        }
        // A part without a month is the month of the flush it went out with.
        let batch = ledger.in_flight_batch.clone().map(|(id, mut parts)| {
            for part in &mut parts {
                part.month.get_or_insert_with(|| ledger.month.clone());
            }
            (id, parts)
        });
        SpendSpool { batch, pending }
    }

    /// Takes back what [`spool`](Self::spool) kept: the batch goes out first, under its id (the
    /// store adds a batch it has already taken nothing), then the rest. A spool with a batch
    /// is not taken while another batch is in flight (`false`): its id would be lost.
    pub fn restore_spool(&self, spool: SpendSpool) -> bool {
        let mut ledger = self.ledger();
        if let Some(batch) = spool.batch {
            if ledger.in_flight_batch.is_some() {
                return false;
            }
            ledger.in_flight_batch = Some(batch);
        }
        restore(&mut ledger, spool.pending);
        true
    }

    /// Adds spend recovered from the spool, each to its month.
    pub fn restore(&self, spend: SpendByMonth) {
        restore(&mut self.ledger(), spend);
    }
}

/// Adds `spend` to the ledger's pending spend, each to its month.
fn restore(ledger: &mut Ledger, spend: SpendByMonth) {
    for (month, workspaces) in spend {
        for (ws, s) in workspaces {
            let to = match month == ledger.month {
                true => ledger.pending.entry(ws).or_default(),
                false => ledger.pending_other.entry((month.clone(), ws)).or_default(),
            };
            to.add(&s);
        }
    }
}

/// Adds `amount` to `map[name]`, allocating the name only the first time.
fn add(map: &mut FastMap<String, i64>, name: &str, amount: i64) {
    match map.get_mut(name) {
        Some(v) => *v = v.saturating_add(amount),
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

    /// Now, in unix milliseconds.
    fn now_ms() -> u64 {
        crate::ids::unix_millis()
    }

    /// The month of now.
    fn this_month() -> String {
        month_of(now_ms() / 1000)
    }

    /// The month after it.
    fn next_month() -> String {
        month_of(bounds_of_month(&this_month()).end / 1000)
    }

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
        // Nothing read yet: unknown, and the next flush (the first) reads it.
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Unknown { flush: 1 }
        );
        usage.charge(&k, None, Credits::from_micros(1_000_000), now_ms());
        let (_, flush) = usage.begin_flush(&this_month());
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
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Within
        );
        usage.charge(&k, None, Credits::from_micros(500_000), now_ms());
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Spent(BudgetScope::Key)
        );
    }

    /// What a flush reads back when `key_1` of `ws_1` has spent `micros` this month.
    fn key_1_spent(micros: i64) -> UsageSnapshot {
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), micros);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        snapshot
    }

    #[test]
    fn a_new_month_does_not_check_against_the_last_one() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(1_000_000));
        usage.check(&k, KeyBudget::of(&k), None, now_ms());
        usage.begin_flush(&this_month());
        usage.finish_flush(&key_1_spent(1_000_000));
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Spent(BudgetScope::Key)
        );
        // The first request of the next month (UTC), before any flush: last month's spend
        // says nothing of it; its totals are read first.
        let next_month_ms = bounds_of_month(&next_month()).start;
        assert!(matches!(
            usage.check(&k, KeyBudget::of(&k), None, next_month_ms),
            Verdict::Unknown { .. }
        ));
        let (_, flush) = usage.begin_flush(&next_month());
        assert_eq!(flush[0].watch_keys, vec!["key_1".to_string()]);
    }

    #[test]
    fn a_flush_of_the_month_that_ended_brings_no_totals_into_the_new_one() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(1_000_000));
        usage.check(&k, KeyBudget::of(&k), None, now_ms());
        // A flush of this month is on its way at midnight; the first request of the next
        // month turns the ledger; then the flush lands with this month's spent totals.
        usage.begin_flush(&this_month());
        let next_month_ms = bounds_of_month(&next_month()).start;
        usage.check(&k, KeyBudget::of(&k), None, next_month_ms);
        usage.finish_flush(&key_1_spent(1_000_000));
        assert!(
            matches!(
                usage.check(&k, KeyBudget::of(&k), None, next_month_ms),
                Verdict::Unknown { .. }
            ),
            "not refused on last month's spend"
        );
    }

    #[test]
    fn a_failed_flush_is_retried_as_the_same_batch() {
        let usage = Usage::new(HashMap::new());
        let k = key(None);
        usage.charge(&k, Some("p"), Credits::from_micros(7), now_ms());
        let (id, first) = usage.begin_flush(&this_month());
        assert_eq!(first[0].total, 7);
        usage.charge(&k, Some("p"), Credits::from_micros(3), now_ms());
        // No answer from the store: the same batch goes again, the new spend waits.
        let (retry_id, retry) = usage.begin_flush(&this_month());
        assert_eq!((retry_id.as_str(), retry[0].total), (id.as_str(), 7));
        assert_eq!(retry[0].event_id, first[0].event_id);
        assert_eq!(usage.unflushed()[&this_month()]["ws_1"].total, 10);
        usage.finish_flush(&UsageSnapshot::default());
        let (next_id, next) = usage.begin_flush(&this_month());
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
        usage.charge(&k, Some("p"), Credits::from_micros(5), now_ms());
        // What this replica spent is enough to refuse, before any total is read.
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("p"), now_ms()),
            Verdict::Spent(BudgetScope::Project)
        );
        assert!(matches!(
            usage.check(&k, KeyBudget::of(&k), Some("q"), now_ms()),
            Verdict::Unknown { .. }
        ));
        let (_, batch) = usage.begin_flush(&this_month());
        assert_eq!(batch[0].watch_projects.len(), 2);
        let mut totals = WorkspaceTotals {
            total: 99,
            monthly_credits: Some(100),
            ..Default::default()
        };
        totals.projects.insert("p".into(), 5);
        totals.projects.insert("q".into(), 0);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("q"), now_ms()),
            Verdict::Within
        );
        // Once the workspace's budgets are read, a project without one needs no reading: made
        // up names are neither watched nor a reason to flush.
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("r"), now_ms()),
            Verdict::Within
        );
        assert!(!usage.ledger().watched["ws_1"].projects.contains_key("r"));
        usage.charge(&k, Some("q"), Credits::from_micros(1), now_ms());
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("q"), now_ms()),
            Verdict::Spent(BudgetScope::Workspace)
        );
        // A spent workspace refuses whatever is unknown about the project.
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("s"), now_ms()),
            Verdict::Spent(BudgetScope::Workspace)
        );
        // A new month: last month's totals no longer apply, and this month's are read first.
        usage.begin_flush(&next_month());
        assert!(matches!(
            usage.check(&k, KeyBudget::of(&k), Some("q"), now_ms()),
            Verdict::Unknown { .. }
        ));
    }

    #[test]
    fn spend_is_charged_to_the_month_the_request_arrived_in() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(100));
        let (month, next) = (this_month(), next_month());
        let start = bounds_of_month(&month).start;
        let last = month_of((start - 1) / 1000);
        // A request from the last second of last month, finished now: last month's spend,
        // which this month's budget does not count.
        usage.charge(&k, Some("p"), Credits::from_micros(100), start - 1);
        usage.charge(&k, Some("p"), Credits::from_micros(7), start);
        let (_, batch) = usage.begin_flush(&month);
        let part = |batch: &[WorkspaceFlush], m: &str| {
            batch
                .iter()
                .find(|w| w.month.as_deref() == Some(m))
                .cloned()
                .unwrap_or_else(|| panic!("no part for {m}: {batch:?}"))
        };
        let earlier = part(&batch, &last);
        assert_eq!(
            (earlier.total, earlier.keys["key_1"], earlier.projects["p"]),
            (100, 100, 100)
        );
        assert!(earlier.watch_keys.is_empty() && earlier.watch_projects.is_empty());
        assert_eq!(part(&batch, &month).total, 7);
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), 7);
        totals.projects.insert("p".into(), 7);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("p"), now_ms()),
            Verdict::Within
        );

        // The month turns between a request and its flush: the spend stays this month's, and
        // goes out so even in a batch retried after the turn.
        usage.charge(&k, None, Credits::from_micros(5), now_ms());
        let (id, before) = usage.begin_flush(&next);
        assert_eq!(part(&before, &month).total, 5);
        let (retry_id, retried) = usage.begin_flush(&next);
        assert_eq!((retry_id, retried), (id, before));
        // Spooled at shutdown and restored, spend keeps its month.
        let spooled = usage.unflushed();
        assert_eq!(spooled[&month]["ws_1"].total, 5);
        let restored = Usage::new(HashMap::new());
        restored.restore(spooled);
        let (_, batch) = restored.begin_flush(&next);
        assert_eq!(part(&batch, &month).total, 5);
    }

    #[test]
    fn a_batch_whose_answer_was_lost_is_spooled_with_its_id_and_goes_out_once() {
        let usage = Usage::new(HashMap::new());
        let k = key(None);
        let month = this_month();
        usage.charge(&k, Some("p"), Credits::from_micros(7), now_ms());
        // The store may have taken this batch; its answer never came. Then more spend, and a
        // shutdown while the store is down.
        let (id, sent) = usage.begin_flush(&month);
        usage.charge(&k, None, Credits::from_micros(3), now_ms());
        let spooled = serde_json::to_vec(&usage.spool()).unwrap();

        let restored = Usage::new(HashMap::new());
        assert!(restored.restore_spool(serde_json::from_slice(&spooled).unwrap()));
        // The batch goes first, as it was (the store adds a batch id it knows nothing), with
        // its month written down; the rest follows in a batch of its own.
        let (retry_id, retried) = restored.begin_flush(&month);
        assert_eq!(retry_id, id);
        assert_eq!(retried.len(), 1);
        assert_eq!(retried[0].total, 7);
        assert_eq!(retried[0].projects["p"], 7);
        assert_eq!(retried[0].event_id, sent[0].event_id);
        assert_eq!(retried[0].month.as_deref(), Some(month.as_str()));
        restored.finish_flush(&UsageSnapshot::default());
        let (next_id, next) = restored.begin_flush(&month);
        assert_ne!(next_id, id);
        assert_eq!(next.iter().map(|w| w.total).sum::<i64>(), 3);
        // Nothing left over: every micro-credit went out exactly once.
        restored.finish_flush(&UsageSnapshot::default());
        assert!(restored.spool().is_empty());
    }

    #[test]
    fn a_spooled_batch_waits_while_another_is_in_flight() {
        let month = this_month();
        let spooled = |amount| {
            let usage = Usage::new(HashMap::new());
            usage.charge(&key(None), None, Credits::from_micros(amount), now_ms());
            usage.begin_flush(&month);
            usage.spool()
        };
        let usage = Usage::new(HashMap::new());
        assert!(usage.restore_spool(spooled(5)));
        // Its id would be lost behind the batch in flight: not taken now.
        assert!(!usage.restore_spool(spooled(9)));
        usage.begin_flush(&month);
        usage.finish_flush(&UsageSnapshot::default());
        assert!(usage.restore_spool(spooled(9)));
        let (_, batch) = usage.begin_flush(&month);
        assert_eq!(batch.iter().map(|w| w.total).sum::<i64>(), 9);
    }

    #[test]
    fn absurd_costs_saturate_instead_of_overflowing() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(10));
        for _ in 0..3 {
            usage.charge(&k, Some("p"), Credits::from_micros(i64::MAX / 2), now_ms());
        }
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("p"), now_ms()),
            Verdict::Spent(BudgetScope::Key)
        );
        assert_eq!(usage.unflushed()[&this_month()]["ws_1"].total, i64::MAX);
    }

    #[test]
    fn nothing_is_charged_for_free_requests() {
        let usage = Usage::new(HashMap::new());
        usage.charge(&key(None), None, Credits::ZERO, now_ms());
        assert!(usage.unflushed().is_empty());
    }

    #[test]
    fn only_budgeted_keys_are_read_back_and_idle_ones_are_forgotten() {
        let usage = Usage::new(HashMap::new());
        let capped = key(Some(10));
        let mut free = key(None);
        free.id = "key_2".into();
        let unknown = |v| matches!(v, Verdict::Unknown { .. });
        assert!(unknown(usage.check(
            &free,
            KeyBudget::of(&free),
            Some("p"),
            now_ms()
        )));
        assert!(unknown(usage.check(
            &capped,
            KeyBudget::of(&capped),
            None,
            now_ms()
        )));
        let (_, batch) = usage.begin_flush(&this_month());
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
        assert_eq!(batch[0].watch_projects, vec!["p".to_string()]);
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), 10);
        totals.projects.insert("p".into(), 0);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        let spent = Verdict::Spent(BudgetScope::Key);
        assert_eq!(
            usage.check(&capped, KeyBudget::of(&capped), None, now_ms()),
            spent
        );
        // The budgeted key stays in use; the project is not named again.
        for _ in 0..WATCH_IDLE_FLUSHES {
            assert_eq!(
                usage.check(&capped, KeyBudget::of(&capped), None, now_ms()),
                spent
            );
            let (_, batch) = usage.begin_flush(&this_month());
            usage.finish_flush(&snapshot);
            assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
        }
        let (_, batch) = usage.begin_flush(&this_month());
        usage.finish_flush(&UsageSnapshot::default());
        assert!(batch[0].watch_projects.is_empty(), "idle project dropped");
        // Nothing used the workspace for as long: it and its totals go too. Forgotten is not
        // zero: the next request waits for its spent total to be read again, and is refused.
        for _ in 0..=WATCH_IDLE_FLUSHES {
            let (_, batch) = usage.begin_flush(&this_month());
            if batch.is_empty() {
                let Verdict::Unknown { flush } =
                    usage.check(&capped, KeyBudget::of(&capped), None, now_ms())
                else {
                    panic!("a forgotten total taken as known");
                };
                let (_, batch) = usage.begin_flush(&this_month());
                assert_eq!(usage.ledger().flushes, flush, "the flush asked for");
                assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
                usage.finish_flush(&snapshot);
                assert_eq!(
                    usage.check(&capped, KeyBudget::of(&capped), None, now_ms()),
                    spent
                );
                return;
            }
            usage.finish_flush(&snapshot);
        }
        panic!("an idle workspace is never forgotten");
    }

    #[tokio::test]
    async fn a_request_waits_for_the_flush_that_reads_its_totals_and_no_longer() {
        let usage = Arc::new(Usage::new(HashMap::new()));
        let k = key(Some(10));
        let Verdict::Unknown { flush } = usage.check(&k, KeyBudget::of(&k), None, now_ms()) else {
            panic!("nothing read yet");
        };
        let waiting = tokio::spawn({
            let usage = usage.clone();
            async move { usage.read_back(flush).await }
        });
        // A retried batch begun before the check does not read the key; it does not end the
        // wait.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        let (_, batch) = usage.begin_flush(&this_month());
        assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), 10);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the wait ends when the flush lands")
            .unwrap();
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Spent(BudgetScope::Key)
        );

        // With the store down, nobody waits for a flush that will not come.
        let mut other = key(Some(10));
        other.workspace = "ws_2".into();
        let Verdict::Unknown { flush } = usage.check(&other, KeyBudget::of(&other), None, now_ms())
        else {
            panic!("ws_2 not read yet");
        };
        usage.flush_failed();
        tokio::time::timeout(Duration::from_millis(500), usage.read_back(flush))
            .await
            .expect("a failed flush ends the wait");
    }

    #[test]
    fn a_flush_carries_a_bounded_share_of_the_spend_and_the_rest_follows() {
        let usage = Usage::new(HashMap::new());
        let keys = 2 * MAX_FLUSH_ENTRIES + 10;
        for i in 0..keys {
            let mut k = key(None);
            k.id = format!("key_{i}").into();
            usage.charge(&k, Some("p"), Credits::from_micros(i as i64 + 1), now_ms());
        }
        let month = this_month();
        let mut spent: HashMap<String, i64> = HashMap::new();
        let (mut total, mut project, mut batches) = (0, 0, 0);
        loop {
            let flushed_before: HashSet<String> = spent.keys().cloned().collect();
            let (_, batch) = usage.begin_flush(&month);
            let entries: usize = batch.iter().map(|w| w.keys.len() + w.projects.len()).sum();
            assert!(
                entries <= MAX_FLUSH_ENTRIES,
                "{entries} entries in one flush"
            );
            for part in batch {
                total += part.total;
                project += part.projects.get("p").copied().unwrap_or(0);
                for (k, v) in part.keys {
                    assert!(spent.insert(k, v).is_none(), "a key's spend goes once");
                }
            }
            batches += 1;
            // Nothing is counted twice or lost while the spend is split: what the ledger
            // counts for a key is its spend, whichever batch holds it.
            {
                let ledger = usage.ledger();
                let counted = |pick: &dyn Fn(&PendingSpend) -> i64| -> i64 {
                    [&ledger.pending, &ledger.in_flight]
                        .iter()
                        .filter_map(|m| m.get("ws_1"))
                        .map(pick)
                        .sum()
                };
                for i in [0, MAX_FLUSH_ENTRIES, keys - 1] {
                    let id = format!("key_{i}");
                    let key_spend = counted(&|p| p.keys.get(&id).copied().unwrap_or(0));
                    // Landed earlier: in the totals the store returns (none here).
                    let expected = match flushed_before.contains(&id) {
                        true => 0,
                        false => i as i64 + 1,
                    };
                    assert_eq!(key_spend, expected, "{id}");
                }
            }
            usage.finish_flush(&UsageSnapshot::default());
            if !usage.deferred() {
                break;
            }
            assert!(batches < 10, "the rest follows");
        }
        assert_eq!(batches, 3);
        assert_eq!(spent.len(), keys);
        assert!(spent.iter().all(|(k, v)| *k == format!("key_{}", v - 1)));
        let expected: i64 = (1..=keys as i64).sum();
        assert_eq!(
            total, expected,
            "the workspace's total goes whole, with the first part"
        );
        assert_eq!(project, expected);
        let (_, empty) = usage.begin_flush(&month);
        assert!(empty.is_empty() && !usage.deferred());
    }
}
