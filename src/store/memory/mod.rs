//! An in-process store: the zero-config demo and unit tests. State lives and dies with the
//! process, so it serves exactly one gateway replica.

mod audit;
mod deliveries;
mod events;
mod keys;
mod listen;
mod notices;
mod operators;
mod sandbox;
mod sessions;
mod usage;
mod webhooks;

use super::{StoreError, StoreHealth};
use crate::events::Event;
use crate::ids::unix_now;
use crate::keys::directory::MintedTokens;
use crate::keys::{KeyHash, KeyRecord, Workspace};
use crate::metering::audit::AuditRecord;
use crate::webhooks::endpoint::Endpoint;
use async_trait::async_trait;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use tokio::sync::Notify;

/// The workspace the demo store starts with, so a newcomer can create a key at once.
pub const DEMO_WORKSPACE: &str = "ws_demo";

/// How many key changes are remembered for [`KeyStore::key_changes_since`](crate::store::KeyStore::key_changes_since).
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
    /// The start (unix seconds) of the latest minute window each key id had requests in.
    last_used: HashMap<String, u64>,
    /// Operator tokens by digest.
    operators: HashMap<String, crate::keys::operators::OperatorToken>,
    /// Budget leases per `(workspace, month, scope)`: lease id → its entry.
    leases: HashMap<(String, String, String), HashMap<String, LeaseEntry>>,
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
    /// Simulated jobs: id → (record JSON, forgotten at unix ms).
    sandbox_jobs: HashMap<String, (String, u64)>,
    /// Simulated jobs' events by (due ms, event id), not yet in the log.
    sandbox_due: std::collections::BTreeMap<(u64, String), Event>,
    /// Dashboard sessions, sign-in links and sign-in attempts.
    dashboard: sessions::DashboardState,
}

/// One budget lease: granted and spent against it since it began (micro-credits), and when
/// it expires (unix ms).
#[derive(Default, Clone, Copy)]
struct LeaseEntry {
    granted: i64,
    spent: i64,
    expires_ms: u64,
}

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
                rate_limit: None,
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
}

impl MemoryStore {
    /// Every logged event, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.read().webhooks.events().cloned().collect()
    }
}

#[async_trait]
impl StoreHealth for MemoryStore {
    async fn ping(&self) -> Result<(), StoreError> {
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
    use crate::store::KeyStore;

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
            expires_at: None,
            rate_limit: None,
            metadata: None,
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
