//! Flushes: the batch of spend and rate counts sent to the store, and the totals it answers.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

use super::lease::LeaseFlush;
use super::ledger::{FastMap, Ledger, WATCH_IDLE_FLUSHES};
use super::usage::Usage;
use super::MAX_FLUSH_ENTRIES;
use crate::shared::month::bounds_of_month;
use crate::shared::Credits;

/// The flushes as [`Usage::read_back`] waits on them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FlushState {
    /// The number of the last flush the store took.
    pub(super) done: u64,
    /// Whether the last attempt failed (no use waiting for the next one).
    pub(super) failing: bool,
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
    /// This replica's budget leases in the workspace to settle, renew or return.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<LeaseFlush>,
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

impl Usage {
    /// The next batch for a flush of `month`: the one that failed last time, unchanged (same
    /// id), or else the unflushed spend and the watch lists.
    pub fn begin_flush(&self, month: &str) -> (String, Vec<WorkspaceFlush>) {
        let mut ledger = self.ledger();
        if ledger.month != month {
            ledger.turn_to(month, bounds_of_month(month));
        }
        ledger.flush_month = month.to_string();
        let now_ms = crate::ids::unix_millis();
        ledger.attempt_ms = now_ms;
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
        workspaces.extend(ledger.leases.workspaces().cloned());
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
            let l = &mut *ledger;
            // A lease's spend is recorded with the flush that carries all of it.
            let rest = l.pending.get(&ws);
            let leases = l.leases.for_flush(&ws, now_ms, |scope| {
                let Some(rest) = rest else { return true };
                match (scope.strip_prefix("key:"), scope.strip_prefix("project:")) {
                    (Some(id), _) => !rest.keys.contains_key(id),
                    (_, Some(p)) => !rest.projects.contains_key(p),
                    _ => true,
                }
            });
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
                leases,
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

    /// Every lease goes back to the store with the next flush: the replica is stopping.
    pub fn return_leases(&self) {
        self.ledger().leases.closing = true;
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
        let batch = ledger.in_flight_batch.take();
        if ledger.flush_month == ledger.month {
            let start_ms = ledger.attempt_ms;
            for w in batch.iter().flat_map(|(_, parts)| parts) {
                ledger.leases.flushed(&w.workspace, &w.leases, start_ms);
            }
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
        traceparent: None,
    }
}
