//! Workspaces, keys, scoped tokens and the key change log in memory.

use super::*;
use crate::events::Event;
use crate::ids::unix_now;
use crate::keys::directory::MintedTokens;
use crate::keys::KeyStatus;
use crate::keys::{workspace_digest, KeyHash, KeyRecord, Workspace};
use crate::store::{KeyChange, KeyChanges, KeyStore, Rotation, StoreError, WorkspaceChange};
use async_trait::async_trait;
use std::sync::Arc;
use tokio::sync::Notify;

impl MemoryStore {
    pub(super) fn update(
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
        if next == *workspace {
            return Ok(Some(next));
        }
        *workspace = next.clone();
        inner.record_change(workspace_digest(id));
        drop(inner);
        self.changed.notify_one();
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
