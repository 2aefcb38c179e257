//! An in-process store: the zero-config demo and unit tests. State lives and dies with the
//! process, so it serves exactly one gateway replica.

mod webhooks;

use async_trait::async_trait;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use tokio::sync::Notify;

use super::{
    too_many_endpoints, AfterAttempt, AuditStore, ClaimRequest, ClaimedDelivery, DeliveryQueue,
    EndpointChange, EndpointRetry, EventFeed, EventLog, EventPage, KeyChange, KeyChanges, KeyStore,
    ListenSlots, MintedTokens, NoticeStore, QueueStats, Rotation, Saved, StoreError, StoreHealth,
    UsageReport, UsageStore, WorkspaceChange,
};
use crate::events::Event;
use crate::ids::unix_now;
use crate::keys::Environment;
use crate::keys::KeyStatus;
use crate::keys::{KeyHash, KeyRecord, Workspace};
use crate::metering::audit::{AuditQuery, AuditRecord};
use crate::metering::usage::{RateTotals, UsageFlush, UsageSnapshot, WorkspaceTotals};
use crate::webhooks::delivery::{Delivery, DeliverySummary};
use crate::webhooks::endpoint::Endpoint;
use crate::webhooks::endpoint::EndpointStatus;
use crate::webhooks::notice::PauseNotice;
use std::time::Duration;

/// The workspace the demo store starts with, so a newcomer can create a key at once.
pub const DEMO_WORKSPACE: &str = "ws_demo";

/// How many key changes are remembered for [`KeyStore::key_changes_since`].
pub(crate) const CHANGE_LOG_LEN: usize = 10_000;

#[derive(Default)]
struct Inner {
    workspaces: HashMap<String, Workspace>,
    keys: HashMap<String, Arc<KeyRecord>>,
    ids_by_hash: HashMap<KeyHash, String>,
    epoch: u64,
    /// `(epoch, hash)` of the latest changes, oldest first.
    changes: VecDeque<(u64, KeyHash)>,
    /// `(expires_at, id)` of scoped tokens, in minting order, for clean-up.
    tokens: VecDeque<(u64, String)>,
    /// The event log and the webhook delivery queue.
    webhooks: webhooks::WebhookState,
    /// Spend per `(workspace, month)`.
    spend: HashMap<(String, String), SpendRow>,
    /// Project budgets per workspace (micro-credits).
    budgets: HashMap<String, HashMap<String, i64>>,
    /// Requests per `(key id, minute window)`.
    rate: HashMap<(String, u64), u64>,
    /// Audit records per workspace, oldest first.
    audit: HashMap<String, VecDeque<AuditRecord>>,
    /// Webhook endpoints per workspace, oldest first.
    endpoints: HashMap<String, Vec<Endpoint>>,
    /// Ids of the latest usage batches added, so a retry adds nothing.
    flushes: VecDeque<String>,
    /// Listen-stream slots per key id: stream → lease end (unix ms).
    listen_slots: HashMap<String, HashMap<String, u64>>,
    /// Ids of the latest audit spool writes appended, so a replay appends nothing.
    audit_batches: VecDeque<String>,
    /// Idempotency salts by scope, with when they are forgotten (unix seconds).
    salts: HashMap<String, (String, u64)>,
}

/// How many audit records the memory store keeps per workspace.
const AUDIT_KEPT: usize = 100_000;

#[derive(Default)]
struct SpendRow {
    total: i64,
    keys: HashMap<String, i64>,
    projects: HashMap<String, i64>,
    low_fired: bool,
}

impl Inner {
    fn record_change(&mut self, hash: KeyHash) {
        self.epoch += 1;
        if self.changes.len() == CHANGE_LOG_LEN {
            self.changes.pop_front();
        }
        self.changes.push_back((self.epoch, hash));
    }
}

/// Workspaces and keys in process memory.
#[derive(Default)]
pub struct MemoryStore {
    inner: Arc<RwLock<Inner>>,
    changed: Arc<Notify>,
    minted: Arc<MintedTokens>,
    /// Woken whenever an event is logged.
    logged: Arc<Notify>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store holding the workspace [`DEMO_WORKSPACE`].
    pub fn with_demo_workspace() -> Self {
        let store = Self::new();
        store.write().workspaces.insert(
            DEMO_WORKSPACE.to_string(),
            Workspace {
                id: DEMO_WORKSPACE.to_string(),
                name: "Demo workspace".to_string(),
                admin_emails: Vec::new(),
                monthly_credits: None,
                credits_low_threshold: None,
                created_at: unix_now(),
            },
        );
        store
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated (every write is a
        // single insert), so a poisoned lock is still consistent.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// [`DeliveryQueue::update_endpoint`]; with `restart`, the endpoint starts afresh even if
    /// neither its URL nor its status changes ([`DeliveryQueue::resume_endpoint`]).
    fn change_endpoint(
        &self,
        workspace: &str,
        id: &str,
        change: EndpointChange<'_>,
        restart: bool,
    ) -> Result<Option<Endpoint>, StoreError> {
        let mut inner = self.write();
        let Some(current) = inner
            .endpoints
            .get_mut(workspace)
            .and_then(|list| list.iter_mut().find(|e| e.id == id))
        else {
            return Ok(None);
        };
        let mut next = current.clone();
        change(&mut next);
        next.id = current.id.clone();
        next.workspace = current.workspace.clone();
        next.environment = current.environment;
        next.secret = current.secret.clone();
        let fresh_start = restart || next.url != current.url || next.status != current.status;
        *current = next.clone();
        if fresh_start {
            inner.webhooks.restart(id, crate::ids::unix_millis());
        }
        Ok(Some(next))
    }
}

impl MemoryStore {
    /// Every logged event, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.read().webhooks.events().cloned().collect()
    }

    fn update(
        &self,
        id: &str,
        change: KeyChange<'_>,
        event: Option<&Event>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        let mut inner = self.write();
        let Some(current) = inner.keys.get(id) else {
            return Ok(None);
        };
        let mut next = KeyRecord::clone(current);
        change(&mut next);
        // Identity fields are fixed: a change that touched them is ignored for those fields.
        next.id = current.id.clone();
        next.workspace = current.workspace.clone();
        next.hash = current.hash;
        if next == **current {
            // Nothing to write, and no event: whoever made it so emitted it.
            return Ok(Some(current.clone()));
        }
        let next = Arc::new(next);
        inner.keys.insert(id.to_string(), next.clone());
        inner.record_change(next.hash);
        if let Some(event) = event {
            inner.webhooks.log(event.clone());
        }
        drop(inner);
        self.changed.notify_one();
        if event.is_some() {
            self.logged.notify_waiters();
        }
        Ok(Some(next))
    }
}

#[async_trait]
impl StoreHealth for MemoryStore {
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[async_trait]
impl KeyStore for MemoryStore {
    async fn workspaces(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Workspace>, bool), StoreError> {
        let inner = self.read();
        let mut all: Vec<&Workspace> = inner.workspaces.values().collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        let start = after
            .and_then(|id| all.iter().position(|w| w.id == id))
            .map_or(0, |i| i + 1);
        let rest = all.len().saturating_sub(start);
        let page = all.into_iter().skip(start).take(limit).cloned().collect();
        Ok((page, rest > limit))
    }

    async fn create_workspace(&self, workspace: &Workspace) -> Result<(), StoreError> {
        let mut inner = self.write();
        if inner.workspaces.contains_key(&workspace.id) {
            return Err(StoreError::Conflict(format!(
                "workspace {} exists",
                workspace.id
            )));
        }
        inner
            .workspaces
            .insert(workspace.id.clone(), workspace.clone());
        Ok(())
    }

    async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError> {
        Ok(self.read().workspaces.get(id).cloned())
    }

    async fn update_workspace(
        &self,
        id: &str,
        change: WorkspaceChange<'_>,
    ) -> Result<Option<Workspace>, StoreError> {
        let mut inner = self.write();
        let Some(workspace) = inner.workspaces.get_mut(id) else {
            return Ok(None);
        };
        let mut next = workspace.clone();
        change(&mut next);
        next.id = workspace.id.clone();
        next.created_at = workspace.created_at;
        *workspace = next.clone();
        Ok(Some(next))
    }

    async fn insert_key(&self, key: &KeyRecord) -> Result<(), StoreError> {
        let mut inner = self.write();
        if inner.keys.contains_key(&key.id) || inner.ids_by_hash.contains_key(&key.hash) {
            return Err(StoreError::Conflict(format!("key {} exists", key.id)));
        }
        inner.ids_by_hash.insert(key.hash, key.id.clone());
        inner.keys.insert(key.id.clone(), Arc::new(key.clone()));
        inner.record_change(key.hash);
        drop(inner);
        self.changed.notify_one();
        Ok(())
    }

    async fn key_by_hash(&self, hash: &KeyHash) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        let inner = self.read();
        Ok(inner
            .ids_by_hash
            .get(hash)
            .and_then(|id| inner.keys.get(id))
            .cloned())
    }

    async fn key_by_id(&self, id: &str) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        Ok(self.read().keys.get(id).cloned())
    }

    fn minted_tokens(&self) -> Arc<MintedTokens> {
        self.minted.clone()
    }

    /// All of them in one page (tokens left out).
    async fn key_digests(&self, _cursor: u64) -> Result<(Vec<KeyHash>, u64), StoreError> {
        let inner = self.read();
        let keys = inner.keys.values().filter(|key| key.scoped.is_none());
        Ok((keys.map(|key| key.hash).collect(), 0))
    }

    async fn keys_in_workspace(
        &self,
        workspace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Arc<KeyRecord>>, StoreError> {
        let mut keys: Vec<_> = self
            .read()
            .keys
            .values()
            .filter(|k| k.workspace == workspace && k.scoped.is_none())
            .cloned()
            .collect();
        keys.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        let start = match after {
            Some(id) => keys.iter().position(|k| k.id == id).map_or(0, |i| i + 1),
            None => 0,
        };
        Ok(keys.into_iter().skip(start).take(limit).collect())
    }

    async fn update_key(
        &self,
        id: &str,
        change: KeyChange<'_>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        self.update(id, change, None)
    }

    async fn update_key_emitting(
        &self,
        id: &str,
        change: KeyChange<'_>,
        event: &Event,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        self.update(id, change, Some(event))
    }

    /// Its history lives and ends with the process: one mark for every change.
    async fn key_changes_since(&self, epoch: u64, _mark: &str) -> Result<KeyChanges, StoreError> {
        let inner = self.read();
        let oldest = inner.changes.front().map_or(inner.epoch + 1, |(e, _)| *e);
        let changed = if epoch > inner.epoch || epoch + 1 < oldest {
            None
        } else {
            Some(
                inner
                    .changes
                    .iter()
                    .filter(|(e, _)| *e > epoch)
                    .map(|(_, h)| *h)
                    .collect(),
            )
        };
        Ok(KeyChanges {
            epoch: inner.epoch,
            mark: "0".into(),
            changed,
        })
    }

    fn key_change_signal(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    async fn rotate_key(
        &self,
        old_id: &str,
        successor: &KeyRecord,
        grace_until: u64,
    ) -> Result<Rotation, StoreError> {
        let mut inner = self.write();
        if inner.ids_by_hash.contains_key(&successor.hash) {
            return Ok(Rotation::AlreadyRotated);
        }
        let Some(old) = inner.keys.get(old_id) else {
            return Ok(Rotation::NotFound);
        };
        if old.status != KeyStatus::Active {
            return Ok(Rotation::NotRotatable(old.status));
        }
        let mut successor = successor.clone();
        crate::keys::inherit(&mut successor, old);
        let successor = Arc::new(successor);
        let mut rotated = KeyRecord::clone(old);
        rotated.status = KeyStatus::Rotating;
        rotated.grace_until = Some(grace_until);
        rotated.rotated_to = Some(successor.id.clone());
        let rotated = Arc::new(rotated);
        // Keys before it still in grace count the new key against their budget too.
        let now = unix_now();
        let extended: Vec<KeyRecord> = rotated
            .predecessors
            .iter()
            .filter_map(|id| inner.keys.get(id))
            .filter_map(|p| crate::keys::with_descendant(p, &successor.id, now))
            .collect();
        for predecessor in extended {
            let hash = predecessor.hash;
            inner
                .keys
                .insert(predecessor.id.clone(), Arc::new(predecessor));
            inner.record_change(hash);
        }
        inner.keys.insert(old_id.to_string(), rotated.clone());
        inner.record_change(rotated.hash);
        inner
            .ids_by_hash
            .insert(successor.hash, successor.id.clone());
        inner.keys.insert(successor.id.clone(), successor.clone());
        inner.record_change(successor.hash);
        drop(inner);
        self.changed.notify_one();
        Ok(Rotation::Rotated {
            old: rotated,
            successor,
        })
    }

    async fn idempotency_salt(
        &self,
        scope: &str,
        fresh: &str,
        ttl_secs: u64,
    ) -> Result<String, StoreError> {
        let now = unix_now();
        let mut inner = self.write();
        inner.salts.retain(|_, (_, until)| *until > now);
        let (salt, _) = inner
            .salts
            .entry(scope.to_string())
            .or_insert_with(|| (fresh.to_string(), now.saturating_add(ttl_secs.max(1))));
        Ok(salt.clone())
    }

    async fn insert_token(&self, token: &KeyRecord, ttl_secs: u64) -> Result<(), StoreError> {
        let now = unix_now();
        let mut inner = self.write();
        // Forget expired tokens, oldest first (lifetimes differ, so some linger a little).
        while let Some((expires_at, _)) = inner.tokens.front() {
            if *expires_at > now {
                break;
            }
            if let Some((_, id)) = inner.tokens.pop_front() {
                if let Some(old) = inner.keys.remove(&id) {
                    inner.ids_by_hash.remove(&old.hash);
                }
            }
        }
        if inner.ids_by_hash.contains_key(&token.hash) {
            return Err(StoreError::Conflict(format!("token {} exists", token.id)));
        }
        inner.ids_by_hash.insert(token.hash, token.id.clone());
        inner.keys.insert(token.id.clone(), Arc::new(token.clone()));
        if let Some(grant) = &token.scoped {
            self.minted.add(&token.hash, grant.expires_at);
        }
        inner
            .tokens
            .push_back((now.saturating_add(ttl_secs), token.id.clone()));
        Ok(())
    }
}

#[async_trait]
impl ListenSlots for MemoryStore {
    async fn hold_listen_slot(
        &self,
        key_id: &str,
        stream: &str,
        max: usize,
        lease_ms: u64,
    ) -> Result<bool, StoreError> {
        let now_ms = crate::ids::unix_millis();
        let mut inner = self.write();
        let slots = inner.listen_slots.entry(key_id.to_string()).or_default();
        slots.retain(|_, until| *until > now_ms);
        if !slots.contains_key(stream) && slots.len() >= max {
            return Ok(false);
        }
        slots.insert(stream.to_string(), now_ms.saturating_add(lease_ms));
        Ok(true)
    }

    async fn release_listen_slot(&self, key_id: &str, stream: &str) -> Result<(), StoreError> {
        let mut inner = self.write();
        if let Some(slots) = inner.listen_slots.get_mut(key_id) {
            slots.remove(stream);
            if slots.is_empty() {
                inner.listen_slots.remove(key_id);
            }
        }
        Ok(())
    }
}

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

#[async_trait]
impl AuditStore for MemoryStore {
    async fn append_audit(
        &self,
        records: &[AuditRecord],
        once: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut inner = self.write();
        if let Some(id) = once {
            if !first_sight(&mut inner.audit_batches, id) {
                return Ok(());
            }
        }
        for r in records {
            let log = inner.audit.entry(r.workspace.to_string()).or_default();
            if log.len() == AUDIT_KEPT {
                log.pop_front();
            }
            log.push_back(r.clone());
        }
        Ok(())
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        let inner = self.read();
        let Some(log) = inner.audit.get(&query.workspace) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<AuditRecord> = log.iter().filter(|r| query.matches(r)).cloned().collect();
        AuditRecord::sort_listing(&mut out);
        out.truncate(query.limit);
        Ok(out)
    }
}

#[async_trait]
impl EventLog for MemoryStore {
    async fn append_event(&self, event: &Event) -> Result<(), StoreError> {
        self.write().webhooks.log(event.clone());
        self.logged.notify_waiters();
        Ok(())
    }

    async fn tail_events(&self) -> Result<Box<dyn EventFeed>, StoreError> {
        Ok(self.tail())
    }

    async fn event_log_floor(&self) -> Result<Option<String>, StoreError> {
        Ok(self.log_floor())
    }

    async fn consume_events(
        &self,
        _consumer: &str,
        reclaim_after: Duration,
    ) -> Result<Box<dyn EventFeed>, StoreError> {
        Ok(self.consume(reclaim_after))
    }
}

#[async_trait]
impl DeliveryQueue for MemoryStore {
    async fn create_endpoint(&self, endpoint: &Endpoint, most: usize) -> Result<(), StoreError> {
        let mut inner = self.write();
        let list = inner
            .endpoints
            .entry(endpoint.workspace.clone())
            .or_default();
        let same_environment = list
            .iter()
            .filter(|e| e.environment == endpoint.environment);
        if same_environment.count() >= most {
            return Err(too_many_endpoints(endpoint, most));
        }
        if list.iter().any(|e| e.id == endpoint.id) {
            return Err(StoreError::Conflict(format!(
                "endpoint {} exists",
                endpoint.id
            )));
        }
        list.push(endpoint.clone());
        Ok(())
    }

    async fn endpoints(&self, workspace: &str) -> Result<Vec<Endpoint>, StoreError> {
        Ok(self
            .read()
            .endpoints
            .get(workspace)
            .cloned()
            .unwrap_or_default())
    }

    async fn update_endpoint(
        &self,
        workspace: &str,
        id: &str,
        change: EndpointChange<'_>,
    ) -> Result<Option<Endpoint>, StoreError> {
        self.change_endpoint(workspace, id, change, false)
    }

    async fn queued_deliveries(&self, endpoint: &str) -> Result<u64, StoreError> {
        Ok(self.read().webhooks.queued(endpoint))
    }

    async fn resume_endpoint(
        &self,
        workspace: &str,
        id: &str,
    ) -> Result<Option<Endpoint>, StoreError> {
        let resume =
            |e: &mut Endpoint| e.status = crate::webhooks::endpoint::EndpointStatus::Active;
        self.change_endpoint(workspace, id, &resume, true)
    }

    async fn delete_endpoint(&self, workspace: &str, id: &str) -> Result<bool, StoreError> {
        let mut inner = self.write();
        let Some(list) = inner.endpoints.get_mut(workspace) else {
            return Ok(false);
        };
        let before = list.len();
        list.retain(|e| e.id != id);
        let removed = list.len() != before;
        inner.webhooks.release(id);
        Ok(removed)
    }

    async fn enqueue_deliveries(
        &self,
        entries: &[String],
        events: &[&Event],
        deliveries: &[Delivery],
    ) -> Result<(), StoreError> {
        self.write().webhooks.enqueue(entries, events, deliveries);
        Ok(())
    }

    async fn claim_deliveries(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let mut guard = self.write();
        let inner = &mut *guard;
        Ok(inner.webhooks.claim(request, &inner.endpoints))
    }

    async fn save_delivery(
        &self,
        delivery: &Delivery,
        after: AfterAttempt<'_>,
    ) -> Result<Saved, StoreError> {
        let mut guard = self.write();
        let inner = &mut *guard;
        let endpoint = inner
            .endpoints
            .get_mut(&delivery.workspace)
            .and_then(|list| list.iter_mut().find(|e| e.id == delivery.endpoint));
        let failures = match after {
            AfterAttempt::Failing(n) | AfterAttempt::Pause(_, n) => Some(n),
            _ => None,
        };
        if let (Some(_), Some(e), Some(url)) = (failures, &endpoint, delivery.attempted_url()) {
            if e.url != url {
                return Ok(Saved::Superseded);
            }
        }
        // A retry's failure whose hold is gone (a resume, or an answer, since its claim;
        // another delivery's failure may have made a new one), unless this is that very save
        // again (its reply was lost).
        if failures.is_some_and(|n| n >= 2)
            && !inner.webhooks.is_probe(&delivery.endpoint, &delivery.id)
            && !inner.webhooks.is_saved_as(delivery)
        {
            return Ok(Saved::Superseded);
        }
        let active = endpoint
            .as_ref()
            .is_some_and(|e| e.status == EndpointStatus::Active);
        inner.webhooks.save(delivery, after, active);
        let pause = match after {
            AfterAttempt::Pause(notice, _) => Some(notice),
            _ => None,
        };
        match (endpoint, pause) {
            (Some(e), Some(notice)) if e.status == EndpointStatus::Active => {
                e.status = EndpointStatus::Paused;
                inner.webhooks.queue_notice(notice);
                Ok(Saved::Paused)
            }
            _ => Ok(Saved::Done),
        }
    }

    async fn endpoint_retry(&self, endpoint: &str) -> Result<Option<EndpointRetry>, StoreError> {
        Ok(self.read().webhooks.retry_of(endpoint))
    }

    async fn deliveries(
        &self,
        endpoint: &str,
        limit: usize,
    ) -> Result<Vec<DeliverySummary>, StoreError> {
        Ok(self.read().webhooks.deliveries(endpoint, limit))
    }

    async fn event(
        &self,
        workspace: &str,
        environment: Environment,
        id: &str,
    ) -> Result<Option<Event>, StoreError> {
        Ok(self.read().webhooks.event(workspace, environment, id))
    }

    async fn events_since(
        &self,
        workspace: &str,
        environment: Environment,
        since: u64,
        after: Option<&str>,
        max: usize,
    ) -> Result<EventPage, StoreError> {
        let inner = self.read();
        let mut events: Vec<&Event> = inner
            .webhooks
            .replayable()
            .filter(|e| e.workspace == workspace && e.environment == environment)
            .filter(|e| match after {
                Some(after) => (e.created, e.id.as_str()) > (since, after),
                None => e.created >= since,
            })
            .collect();
        events.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        let events: Vec<Event> = events.into_iter().take(max).cloned().collect();
        let next = match events.last() {
            Some(last) if events.len() == max => Some((last.created, last.id.clone())),
            _ => None,
        };
        Ok(EventPage { events, next })
    }

    async fn queue_stats(&self) -> Result<QueueStats, StoreError> {
        let inner = self.read();
        let paused = inner
            .endpoints
            .values()
            .flatten()
            .filter(|e| e.status == EndpointStatus::Paused)
            .count();
        Ok(QueueStats {
            paused_endpoints: paused as u64,
            ..inner.webhooks.stats()
        })
    }
}

#[async_trait]
impl NoticeStore for MemoryStore {
    async fn claim_pause_notices(
        &self,
        now_ms: u64,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<PauseNotice>, StoreError> {
        Ok(self.write().webhooks.claim_notices(now_ms, lease, max))
    }

    async fn retry_pause_notice(
        &self,
        notice: &PauseNotice,
        due_ms: u64,
    ) -> Result<(), StoreError> {
        self.write().webhooks.retry_notice(notice, due_ms);
        Ok(())
    }

    async fn remove_pause_notice(&self, id: &str) -> Result<(), StoreError> {
        self.write().webhooks.remove_notice(id);
        Ok(())
    }
}

/// Whether batch `id` is new to `seen` (the last 1,000 ids); notes it.
fn first_sight(seen: &mut std::collections::VecDeque<String>, id: &str) -> bool {
    if seen.iter().any(|s| s == id) {
        return false;
    }
    if seen.len() == 1_000 {
        seen.pop_front();
    }
    seen.push_back(id.to_string());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{format, Environment, KeyStatus, Scopes};

    fn key(workspace: &str, created_at: u64) -> KeyRecord {
        let new = format::generate(Environment::Live);
        KeyRecord {
            id: crate::ids::new_id("key"),
            workspace: workspace.into(),
            name: "k".into(),
            environment: Environment::Live,
            scopes: Scopes::new(["models:read"]),
            monthly_budget: None,
            status: KeyStatus::Active,
            created_at,
            grace_until: None,
            prefix: "svc_live_".into(),
            last4: format::last4(&new.value).into(),
            hash: new.hash,
            rotated_from: None,
            rotated_to: None,
            descendants: Vec::new(),
            predecessors: Vec::new(),
            scoped: None,
        }
    }

    #[tokio::test]
    async fn keys_are_found_by_hash_id_and_workspace() {
        let store = MemoryStore::with_demo_workspace();
        assert!(store.workspace(DEMO_WORKSPACE).await.unwrap().is_some());
        let a = key(DEMO_WORKSPACE, 2);
        let b = key(DEMO_WORKSPACE, 1);
        let other = key("ws_other", 0);
        for k in [&a, &b, &other] {
            store.insert_key(k).await.unwrap();
        }
        assert_eq!(*store.key_by_hash(&a.hash).await.unwrap().unwrap(), a);
        assert_eq!(*store.key_by_id(&b.id).await.unwrap().unwrap(), b);
        let ids: Vec<_> = store
            .keys_in_workspace(DEMO_WORKSPACE, None, usize::MAX)
            .await
            .unwrap()
            .iter()
            .map(|k| k.id.clone())
            .collect();
        assert_eq!(ids, [b.id.clone(), a.id.clone()]);
        assert!(store
            .key_by_hash(&KeyHash::of("nope"))
            .await
            .unwrap()
            .is_none());
        assert!(matches!(
            store.insert_key(&a).await,
            Err(StoreError::Conflict(_))
        ));
    }

    #[tokio::test]
    async fn update_changes_the_record_but_not_its_identity() {
        let store = MemoryStore::new();
        let a = key("ws_1", 0);
        store.insert_key(&a).await.unwrap();
        let updated = store
            .update_key(&a.id, &|k: &mut KeyRecord| {
                k.status = KeyStatus::Revoked;
                k.workspace = "ws_evil".into();
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(updated.status, KeyStatus::Revoked);
        assert_eq!(updated.workspace, "ws_1");
        let by_hash = store.key_by_hash(&a.hash).await.unwrap().unwrap();
        assert_eq!(by_hash.status, KeyStatus::Revoked);
        assert!(store
            .update_key("key_missing", &|_: &mut KeyRecord| {})
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn an_emitting_update_logs_its_event_with_the_change() {
        let store = MemoryStore::new();
        let a = key("ws_1", 0);
        store.insert_key(&a).await.unwrap();
        let event = Event::new(
            "key.auto_revoked",
            "ws_1",
            crate::keys::Environment::Live,
            serde_json::json!({"key_id": a.id}),
        );
        store
            .update_key_emitting(
                &a.id,
                &|k: &mut KeyRecord| k.status = KeyStatus::Revoked,
                &event,
            )
            .await
            .unwrap();
        assert_eq!(store.events(), vec![event]);
        store
            .update_key(&a.id, &|k: &mut KeyRecord| k.name = "x".into())
            .await
            .unwrap();
        assert_eq!(store.events().len(), 1);
    }
}
