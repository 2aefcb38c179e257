//! The ledger: this replica's unflushed spend and the month totals it has read, and how a
//! request's cost is charged to it.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use super::flush::{WorkspaceFlush, WorkspaceTotals};
use super::lease::{Leases, Reservation};
use super::usage::{SpendByMonth, Usage};
use crate::keys::CachedKey;
use crate::shared::month::month_of;
use crate::shared::Credits;

/// Spend of one workspace not yet flushed.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingSpend {
    pub(super) total: i64,
    pub(super) keys: FastMap<String, i64>,
    pub(super) projects: FastMap<String, i64>,
}

impl PendingSpend {
    /// The workspace's spend, micro-credits.
    pub fn total(&self) -> i64 {
        self.total
    }

    /// Keeps the total and at most `*room` key and project entries (projects first), takes
    /// what it keeps from `room`, and returns the rest, with no total, if there is any.
    pub(super) fn split_off(&mut self, room: &mut usize) -> Option<PendingSpend> {
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

    pub(super) fn add(&mut self, other: &PendingSpend) {
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

/// The replica's spend and the month totals it has read, behind [`Usage`]'s lock.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Spend since the last flush of requests that arrived in `month`, per workspace.
    pub(super) pending: FastMap<String, PendingSpend>,
    /// Spend since the last flush of requests that arrived in another month, by month and
    /// workspace: a request that arrived before midnight at a month's end and finished after
    /// the month turned here, or spend kept through an outage or restored from a spool.
    pub(super) pending_other: FastMap<(String, String), PendingSpend>,
    /// The part of `month` in the flush still under way or failed (retried as the same batch):
    /// what budget checks count besides `pending`.
    pub(super) in_flight: FastMap<String, PendingSpend>,
    /// That batch, with its id, until the store confirms it.
    pub(super) in_flight_batch: Option<(String, Vec<WorkspaceFlush>)>,
    /// Whether the last batch begun left spend behind ([`MAX_FLUSH_ENTRIES`]).
    pub(super) deferred: bool,
    /// Month totals from the last flush.
    pub(super) totals: FastMap<String, Totals>,
    /// What to read back at the next flush, per workspace.
    pub(super) watched: FastMap<String, Watched>,
    /// Flushes begun so far: the clock of [`Watched`].
    pub(super) flushes: u64,
    /// The number of the batch in flight (retries keep it).
    pub(super) batch_flush: u64,
    /// The month of the totals and of `pending`.
    pub(super) month: String,
    /// The month the last flush begun reads totals of: when a request turned `month` since,
    /// what it reads back is the month that ended, and not kept.
    pub(super) flush_month: String,
    /// Its unix milliseconds: a request that arrived in them is charged to `pending`.
    pub(super) month_ms: std::ops::Range<u64>,
    /// This replica's budget leases for `month`.
    pub(super) leases: Leases,
    /// When the last flush attempt began (unix ms): what it renews counts from then.
    pub(super) attempt_ms: u64,
}

impl Ledger {
    /// Makes `month` the month of the totals and of `pending`: spend pending for the month it
    /// replaces is flushed as that month's, and last month's totals no longer apply.
    pub(super) fn turn_to(&mut self, month: &str, bounds_ms: std::ops::Range<u64>) {
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
        // Leases are slices of a month's budgets; the store forgets the last month's itself.
        self.leases.by_workspace.clear();
    }
}

/// [`WorkspaceTotals`] as the ledger keeps them, in [`FastMap`]s.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub(super) total: i64,
    pub(super) monthly_credits: Option<i64>,
    pub(super) keys: FastMap<String, i64>,
    pub(super) projects: FastMap<String, i64>,
    pub(super) project_budgets: FastMap<String, i64>,
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
pub(super) struct Watched {
    pub(super) seen: u64,
    pub(super) keys: FastMap<Box<str>, u64>,
    pub(super) projects: FastMap<Box<str>, u64>,
}

/// Flushes after which a key or project no request has checked stops being watched (two minutes
/// at the default 200 ms interval). Its total is read again on its next use.
pub const WATCH_IDLE_FLUSHES: u64 = 600;

/// Marks `name` as checked at flush `now`, allocating only the first time.
pub(super) fn touch(map: &mut FastMap<Box<str>, u64>, name: &str, now: u64) {
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
pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

impl Usage {
    /// Charges `cost` to the key, the project and the workspace, in the month of `arrived_ms`
    /// (unix milliseconds).
    pub fn charge(&self, key: &CachedKey, project: Option<&str>, cost: Credits, arrived_ms: u64) {
        self.settle(key, project, cost, arrived_ms, None);
    }

    /// Charges a finished request as [`Usage::charge`] does, and settles what it reserved
    /// against this replica's budget leases: the reservation is released, and the cost is
    /// spent against the leases.
    pub fn settle(
        &self,
        key: &CachedKey,
        project: Option<&str>,
        cost: Credits,
        arrived_ms: u64,
        reservation: Option<Reservation>,
    ) {
        let mut ledger = self.ledger();
        let ledger = &mut *ledger;
        let ws = &*key.workspace;
        let this_month = ledger.month_ms.contains(&arrived_ms);
        if this_month && !ledger.leases.by_workspace.is_empty() {
            let billed = key.billed_key_id();
            ledger
                .leases
                .settle(ws, billed, project, cost.micros(), reservation);
        }
        if cost.micros() <= 0 {
            return;
        }
        // To the month the request arrived in (UTC), whenever it is flushed.
        let pending = if this_month {
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
}

/// Adds `spend` to the ledger's pending spend, each to its month.
pub(super) fn restore(ledger: &mut Ledger, spend: SpendByMonth) {
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
pub(super) fn add(map: &mut FastMap<String, i64>, name: &str, amount: i64) {
    match map.get_mut(name) {
        Some(v) => *v = v.saturating_add(amount),
        None => {
            map.insert(name.to_string(), amount);
        }
    }
}
