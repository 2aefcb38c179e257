//! Spend, rate counts and budgets in memory.

use super::*;
use crate::metering::lease::{lease_grant, LEASE_TTL_MS, NO_LIMIT};
use crate::metering::usage::{
    LeaseGrant, LeaseRequest, RateTotals, UsageFlush, UsageSnapshot, WorkspaceTotals,
};
use crate::store::{StoreError, UsageReport, UsageStore};
use async_trait::async_trait;
use std::collections::HashMap;

#[async_trait]
impl UsageStore for MemoryStore {
    async fn flush_usage(&self, flush: &UsageFlush) -> Result<UsageSnapshot, StoreError> {
        let mut guard = self.write();
        let inner = &mut *guard;
        let fresh = first_sight(&mut inner.flushes, &flush.id);
        let fresh_rate = flush.rate.iter().any(|r| r.count > 0)
            && first_sight(&mut inner.flushes, &flush.rate_id);
        let mut snapshot = UsageSnapshot::default();
        for w in &flush.workspaces {
            let w = &if fresh {
                w.clone()
            } else {
                // A retried batch: read the totals, add nothing.
                crate::metering::usage::WorkspaceFlush {
                    total: 0,
                    keys: HashMap::new(),
                    projects: HashMap::new(),
                    ..w.clone()
                }
            };
            let month = w.month.as_ref().unwrap_or(&flush.month);
            let row = inner
                .spend
                .entry((w.workspace.clone(), month.clone()))
                .or_default();
            // Saturating, as Redis's script clamps: absurd reported costs must not overflow.
            row.total = row.total.saturating_add(w.total);
            for (k, v) in &w.keys {
                let sum = row.keys.entry(k.clone()).or_default();
                *sum = sum.saturating_add(*v);
            }
            for (p, v) in &w.projects {
                let sum = row.projects.entry(p.clone()).or_default();
                *sum = sum.saturating_add(*v);
            }
            // Spend of an earlier month is added to that month; only this month's is read.
            if *month != flush.month {
                continue;
            }
            let now_ms = crate::ids::unix_millis();
            for l in &w.leases {
                let scope = (w.workspace.clone(), month.clone(), l.scope.clone());
                let Some(entries) = inner.leases.get_mut(&scope) else {
                    continue;
                };
                if let Some(entry) = entries.get_mut(&l.id) {
                    entry.spent = entry.spent.max(l.spent);
                    entry.expires_ms = now_ms + LEASE_TTL_MS;
                    if l.release {
                        entries.remove(&l.id);
                    }
                }
            }
            let budgets = inner.budgets.get(&w.workspace);
            let mut totals = WorkspaceTotals {
                total: row.total,
                ..Default::default()
            };
            for k in &w.watch_keys {
                totals
                    .keys
                    .insert(k.clone(), row.keys.get(k).copied().unwrap_or(0));
            }
            for p in &w.watch_projects {
                totals
                    .projects
                    .insert(p.clone(), row.projects.get(p).copied().unwrap_or(0));
            }
            if let Some(budgets) = budgets {
                totals.project_budgets.extend(budgets.clone());
            }
            if let Some(ws) = inner.workspaces.get(&w.workspace) {
                if let Some(credits) = ws.monthly_credits {
                    totals.monthly_credits = Some(credits.micros());
                    if let Some(threshold) = ws.credits_low_threshold {
                        let remaining = credits.micros() - row.total;
                        if remaining < threshold.micros() && !row.low_fired {
                            row.low_fired = true;
                            inner
                                .webhooks
                                .log(crate::metering::usage::credits_low_event(
                                    w,
                                    flush,
                                    remaining,
                                    threshold.micros(),
                                ));
                        } else if remaining >= threshold.micros() {
                            row.low_fired = false;
                        }
                    }
                }
            }
            snapshot.workspaces.insert(w.workspace.clone(), totals);
        }
        for r in &flush.rate {
            let current = {
                let c = inner.rate.entry((r.key.clone(), r.window)).or_default();
                if fresh_rate {
                    *c += r.count;
                }
                *c
            };
            if fresh_rate && r.count > 0 {
                let used = inner.last_used.entry(r.key.clone()).or_default();
                *used = (*used).max(r.window * 60);
            }
            let previous = inner
                .rate
                .get(&(r.key.clone(), r.window.saturating_sub(1)))
                .copied()
                .unwrap_or(0);
            snapshot.rate.insert(
                r.key.clone(),
                RateTotals {
                    window: r.window,
                    previous,
                    current,
                },
            );
        }
        // Old windows are of no use after two minutes.
        if let Some(newest) = flush.rate.iter().map(|r| r.window).max() {
            inner.rate.retain(|(_, w), _| w + 2 >= newest);
        }
        drop(guard);
        self.logged.notify_waiters();
        Ok(snapshot)
    }

    async fn lease_budget(&self, request: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        let now_ms = crate::ids::unix_millis();
        let mut guard = self.write();
        let inner = &mut *guard;
        let (ws, month) = (&request.workspace, &request.month);
        let row = inner.spend.get(&(ws.clone(), month.clone()));
        let mut grants = Vec::with_capacity(request.asks.len());
        for ask in &request.asks {
            let spent_of = |field: &dyn Fn(&super::SpendRow) -> i64| row.map_or(0, field);
            let (limit, spent, scopes) = if let Some(id) = ask.scope.strip_prefix("key:") {
                let ids: Vec<&str> = std::iter::once(id)
                    .chain(ask.peers.iter().map(String::as_str))
                    .collect();
                let spent = ids
                    .iter()
                    .map(|id| spent_of(&|r| r.keys.get(*id).copied().unwrap_or(0)))
                    .fold(0i64, i64::saturating_add);
                let scopes = ids.iter().map(|id| format!("key:{id}")).collect();
                (ask.limit, spent, scopes)
            } else if let Some(p) = ask.scope.strip_prefix("project:") {
                let limit = inner
                    .budgets
                    .get(ws)
                    .and_then(|b| b.get(p))
                    .copied()
                    .or(ask.limit);
                let spent = spent_of(&|r| r.projects.get(p).copied().unwrap_or(0));
                (limit, spent, vec![ask.scope.clone()])
            } else {
                let limit = inner
                    .workspaces
                    .get(ws)
                    .and_then(|w| w.monthly_credits)
                    .map(|c| c.micros());
                (limit, spent_of(&|r| r.total), vec![ask.scope.clone()])
            };
            let mut outstanding = 0i64;
            for scope in scopes {
                if let Some(entries) = inner.leases.get_mut(&(ws.clone(), month.clone(), scope)) {
                    entries.retain(|_, e| e.expires_ms > now_ms);
                    for e in entries.values() {
                        outstanding = outstanding.saturating_add((e.granted - e.spent).max(0));
                    }
                }
            }
            let free = limit
                .unwrap_or(NO_LIMIT)
                .saturating_sub(spent)
                .saturating_sub(outstanding);
            let grant = lease_grant(free, ask.ask, request.share, request.unit);
            let entry = inner
                .leases
                .entry((ws.clone(), month.clone(), ask.scope.clone()))
                .or_default()
                .entry(ask.id.clone())
                .or_default();
            entry.granted = entry.granted.saturating_add(grant);
            entry.expires_ms = now_ms + request.ttl_ms;
            grants.push(LeaseGrant {
                granted: entry.granted,
                free: free - grant,
            });
        }
        Ok(grants)
    }

    async fn project_budgets(&self, workspace: &str) -> Result<HashMap<String, i64>, StoreError> {
        Ok(self
            .read()
            .budgets
            .get(workspace)
            .cloned()
            .unwrap_or_default())
    }

    async fn set_project_budget(
        &self,
        workspace: &str,
        project: &str,
        budget: Option<i64>,
    ) -> Result<(), StoreError> {
        let mut inner = self.write();
        let budgets = inner.budgets.entry(workspace.to_string()).or_default();
        match budget {
            Some(b) => budgets.insert(project.to_string(), b),
            None => budgets.remove(project),
        };
        Ok(())
    }

    async fn keys_last_used(&self, ids: &[&str]) -> Result<Vec<Option<u64>>, StoreError> {
        let inner = self.read();
        Ok(ids
            .iter()
            .map(|id| inner.last_used.get(*id).copied())
            .collect())
    }

    async fn usage_report(&self, workspace: &str, month: &str) -> Result<UsageReport, StoreError> {
        let inner = self.read();
        Ok(inner
            .spend
            .get(&(workspace.to_string(), month.to_string()))
            .map(|row| UsageReport {
                total: row.total,
                keys: row.keys.clone(),
                projects: row.projects.clone(),
            })
            .unwrap_or_default())
    }
}
