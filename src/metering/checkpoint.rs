//! Checkpoints: the spend a shutdown spools, and taking it back at start.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use super::flush::WorkspaceFlush;
use super::ledger::{restore, PendingSpend};
use super::usage::Usage;

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

impl Usage {
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
