//! The storage the key model needs: workspaces, keys and scoped tokens, and the change log a
//! key cache follows.

use async_trait::async_trait;
use std::sync::Arc;
use tokio::sync::Notify;

use super::directory::MintedTokens;
use super::{KeyHash, KeyRecord, KeyStatus, Workspace};
use crate::events::Event;
use crate::shared::store::StoreError;

/// A change applied to a key record. It may run more than once (optimistic retries), so it
/// must only depend on the record it is given.
pub type KeyChange<'a> = &'a (dyn Fn(&mut KeyRecord) + Send + Sync);

/// A change to a workspace, applied to what the store holds (and again if it changed meanwhile).
pub type WorkspaceChange<'a> = &'a (dyn Fn(&mut Workspace) + Send + Sync);

/// Which keys changed after a given epoch of the key registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyChanges {
    /// The registry's current epoch; pass it to the next call.
    pub epoch: u64,
    /// The mark of the change at `epoch`; pass it to the next call. It tells one history from
    /// another: after a Redis failover that lost the last writes, the same epoch may name a
    /// different change.
    pub mark: String,
    /// Digests of the keys that changed, or `None` when the history no longer reaches back
    /// that far (or the store was reset): every cached key must then be dropped.
    pub changed: Option<Vec<KeyHash>>,
}

/// What [`KeyStore::rotate_key`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Rotation {
    /// The old key is now rotating until its grace period ends; the successor is stored.
    Rotated {
        /// The old key's new record.
        old: Arc<KeyRecord>,
        /// The successor as stored: what it inherits is taken from the old key as it was
        /// in the rotating step (see [`crate::keys::inherit`]).
        successor: Arc<KeyRecord>,
    },
    /// The successor already exists: this is a retry of a rotation that went through.
    AlreadyRotated,
    /// There is no such key.
    NotFound,
    /// The key is not active (already rotating, or revoked).
    NotRotatable(KeyStatus),
}

/// Workspaces, keys and scoped tokens, shared by every replica.
#[async_trait]
pub trait KeyStore: Send + Sync + 'static {
    /// Creates a workspace; fails with [`StoreError::Conflict`] if the id exists.
    async fn create_workspace(&self, workspace: &Workspace) -> Result<(), StoreError>;

    /// A workspace by id.
    async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError>;

    /// Workspaces, oldest first: at most `limit`, those after workspace `after` or from the
    /// first; and whether more follow.
    async fn workspaces(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Workspace>, bool), StoreError>;

    /// Applies `change` to workspace `id` (its id and creation time stay) and returns the
    /// result; `None` if there is no such workspace.
    async fn update_workspace(
        &self,
        id: &str,
        change: WorkspaceChange<'_>,
    ) -> Result<Option<Workspace>, StoreError>;

    /// Stores a new key, indexed by id, by hash and under its workspace.
    async fn insert_key(&self, key: &KeyRecord) -> Result<(), StoreError>;

    /// The key whose value hashes to `hash`: the request path's lookup.
    async fn key_by_hash(&self, hash: &KeyHash) -> Result<Option<Arc<KeyRecord>>, StoreError>;

    /// A key by id.
    async fn key_by_id(&self, id: &str) -> Result<Option<Arc<KeyRecord>>, StoreError>;

    /// Scoped tokens minted lately, on any replica, that this one has heard of (best effort),
    /// for the key directory; the store keeps it filled.
    fn minted_tokens(&self) -> Arc<MintedTokens>;

    /// A page of the digests of every key the store holds (scoped tokens may be among them),
    /// from `cursor` (0 for the first page), and the cursor of the next page: 0 after the
    /// last. A key held from the first page to the last is listed at least once; a page may
    /// be empty, and a digest may be listed twice.
    async fn key_digests(&self, cursor: u64) -> Result<(Vec<KeyHash>, u64), StoreError>;

    /// A workspace's keys, oldest first: at most `limit`, those after key `after` (which must
    /// be one of them) or from the first.
    async fn keys_in_workspace(
        &self,
        workspace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Arc<KeyRecord>>, StoreError>;

    /// Applies `change` to the key atomically and returns the new record, or `None` if there is
    /// no such key. The id, workspace and hash of a key never change.
    async fn update_key(
        &self,
        id: &str,
        change: KeyChange<'_>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError>;

    /// [`KeyStore::update_key`], and in the same atomic step appends `event` to the event log:
    /// either both happen or neither. A change that changes nothing (the key was revoked
    /// meanwhile, say, by a concurrent leak report) writes nothing and emits nothing.
    async fn update_key_emitting(
        &self,
        id: &str,
        change: KeyChange<'_>,
        event: &Event,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError>;

    /// Key changes after `epoch`, read before with `mark`. Every write to a key (insert,
    /// update) advances the epoch, so a cache that remembers the epoch it has seen can catch
    /// up on anything it missed; if the change at `epoch` is no longer the one it read (the
    /// store lost writes), every cached key must go (`changed: None`).
    async fn key_changes_since(&self, epoch: u64, mark: &str) -> Result<KeyChanges, StoreError>;

    /// Woken (best effort) whenever a key changes, on this replica or any other.
    fn key_change_signal(&self) -> Arc<Notify>;

    /// Rotates key `old_id` to `successor` atomically: the old key becomes `rotating` until
    /// `grace_until`, pointing at the successor, and the successor is inserted, inheriting
    /// from the old key as it is at that step.
    async fn rotate_key(
        &self,
        old_id: &str,
        successor: &KeyRecord,
        grace_until: u64,
    ) -> Result<Rotation, StoreError>;

    /// The salt of idempotency scope `scope` (an opaque digest): `fresh` if the scope has none,
    /// else the one it has. Kept for `ttl_secs` from the first call, then forgotten. Every
    /// caller of a scope gets the same salt meanwhile, whichever replica it is on.
    async fn idempotency_salt(
        &self,
        scope: &str,
        fresh: &str,
        ttl_secs: u64,
    ) -> Result<String, StoreError>;

    /// Stores a scoped token (found by [`KeyStore::key_by_hash`]) for `ttl_secs`, after which the
    /// store forgets it.
    async fn insert_token(&self, token: &KeyRecord, ttl_secs: u64) -> Result<(), StoreError>;
}
