//! Key records in Redis: insert, update, rotate, and list them.

use async_trait::async_trait;
use redis::{AsyncCommands, Script, Value};
use std::sync::{Arc, LazyLock};
use tokio::sync::Notify;

use super::*;
use crate::events::Event;
use crate::keys::directory::MintedTokens;
use crate::keys::{workspace_digest, KeyHash, KeyRecord, KeyStatus, Workspace};
use crate::store::{KeyChange, KeyChanges, KeyStore, Rotation, StoreError, WorkspaceChange};

/// Inserts a key record and its indexes, then records the change.
/// KEYS: record, id index, workspace set, epoch, log. ARGV: json, hash hex, id, created_at,
/// channel, log length, mark. Returns the new epoch, or -1 if the key or id exists.
pub(super) static INSERT_KEY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/insert_key.lua")));

/// Replaces a key record if it still holds what the caller read (compare-and-set), records
/// the change and, when given one, appends an event. KEYS: record, epoch, log, events.
/// ARGV: expected json, new json, hash hex, channel, log length, mark, then (optional) the
/// event's id, type, created, workspace, environment, data. Returns the new epoch, or -1 if the record
/// changed meanwhile. A scoped token's record keeps its TTL.
pub(super) static UPDATE_KEY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/update_key.lua")));

/// Rotates a key: the old record (if unchanged) becomes the rotating one, the successor and its
/// indexes are inserted, the old key's predecessors still in grace are extended with the
/// successor (if unchanged), and every change is recorded. KEYS: old record, successor record,
/// successor id index, workspace set, epoch, log, then each predecessor's record. ARGV:
/// expected old json, rotated old json, successor json, old hash hex, successor hash hex,
/// successor id, created_at, channel, log length, mark, then per predecessor its expected json,
/// new json and hash hex. Returns the epoch, -1 if a record changed meanwhile, -2 if the
/// successor exists already.
pub(super) static ROTATE_KEY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/rotate_key.lua")));

/// Slots of the keyspace one `SCAN` for key digests walks ([`RedisStore::key_digests`]).
pub(super) const KEY_DIGESTS_SCAN: usize = 1_000;

#[async_trait]
impl KeyStore for RedisStore {
    async fn create_workspace(&self, workspace: &Workspace) -> Result<(), StoreError> {
        let created: i64 = CREATE_WORKSPACE
            .key(self.layout.workspace(&workspace.id))
            .key(self.layout.workspace_index())
            .arg(encode(workspace))
            .arg(workspace.created_at)
            .arg(&workspace.id)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        created_or_conflict(created == 1, "workspace", &workspace.id)
    }

    async fn workspaces(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Workspace>, bool), StoreError> {
        if limit == 0 {
            return Ok((Vec::new(), false));
        }
        // A listing does not wait long for another replica's fill: it is an admin's request.
        self.fill_workspace_index(Some(INDEX_FILL_LISTING_WAIT))
            .await?;
        let start = match after {
            Some(id) => self.workspace_rank_after(id).await?,
            None => 0,
        };
        let mut ids = self
            .range(
                &self.layout.workspace_index(),
                start,
                limit.saturating_add(1),
            )
            .await?;
        let more = ids.len() > limit;
        ids.truncate(limit);
        if ids.is_empty() {
            return Ok((Vec::new(), more));
        }
        let record_keys: Vec<String> = ids.iter().map(|id| self.layout.workspace(id)).collect();
        let raw: Vec<Option<String>> = self.conn().mget(&record_keys).await.map_err(unavailable)?;
        // A record that does not decode is left out of the page, not the page refused.
        let page = record_keys
            .iter()
            .zip(raw)
            .filter_map(|(key, raw)| decode(key, &raw?).ok())
            .collect();
        Ok((page, more))
    }

    async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError> {
        let mut conn = self.conn();
        let (raw, rank): (Option<String>, Option<f64>) = redis::pipe()
            .get(self.layout.workspace(id))
            .zscore(self.layout.workspace_index(), id)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        let workspace: Workspace = decode(&self.layout.workspace(id), &raw)?;
        // Created by an earlier version (during a rolling upgrade): indexed now. A read does not
        // fail for it (a Redis out of memory, read-only in a failover): the next read tries again.
        if rank.is_none() {
            let indexed = conn
                .zadd::<_, _, _, ()>(self.layout.workspace_index(), id, workspace.created_at)
                .await;
            if let Err(e) = indexed {
                tracing::warn!(error = %e, workspace = id, "cannot index a workspace");
            }
        }
        Ok(Some(workspace))
    }

    async fn update_workspace(
        &self,
        id: &str,
        change: WorkspaceChange<'_>,
    ) -> Result<Option<Workspace>, StoreError> {
        let key = self.layout.workspace(id);
        for _ in 0..UPDATE_ATTEMPTS {
            let raw: Option<String> = self.conn().get(&key).await.map_err(unavailable)?;
            let Some(raw) = raw else { return Ok(None) };
            let current: Workspace = decode(&key, &raw)?;
            let mut next = current.clone();
            change(&mut next);
            next.id = current.id.clone();
            next.created_at = current.created_at;
            if next == current {
                return Ok(Some(current));
            }
            // Logged as a change under the workspace's digest, so every replica's key cache
            // reads the workspace's rate limit again.
            let epoch: i64 = UPDATE_KEY
                .key(&key)
                .key(self.layout.epoch())
                .key(self.layout.log())
                .key(self.layout.events())
                .arg(&raw)
                .arg(encode(&next))
                .arg(workspace_digest(id).to_hex())
                .arg(self.layout.channel())
                .arg(CHANGE_LOG_LEN)
                .arg(new_mark())
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            if epoch >= 0 {
                return Ok(Some(next));
            }
        }
        Err(changing_too_often("workspace", id))
    }

    async fn insert_key(&self, key: &KeyRecord) -> Result<(), StoreError> {
        let l = &self.layout;
        let epoch: i64 = INSERT_KEY
            .key(l.key_by_hash(&key.hash))
            .key(l.key_by_id(&key.id))
            .key(l.workspace_keys(&key.workspace))
            .key(l.epoch())
            .key(l.log())
            .arg(encode(key))
            .arg(key.hash.to_hex())
            .arg(&key.id)
            .arg(key.created_at)
            .arg(l.channel())
            .arg(CHANGE_LOG_LEN)
            .arg(new_mark())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if epoch < 0 {
            return Err(StoreError::Conflict(format!("key {} exists", key.id)));
        }
        Ok(())
    }

    async fn key_by_hash(&self, hash: &KeyHash) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        Ok(self
            .get_json::<KeyRecord>(&self.layout.key_by_hash(hash))
            .await?
            .map(Arc::new))
    }

    async fn key_by_id(&self, id: &str) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        match self.hash_of(id).await? {
            Some(hash) => self.key_by_hash(&hash).await,
            None => Ok(None),
        }
    }

    /// `SCAN` for the records by digest, [`KEY_DIGESTS_SCAN`] slots of the keyspace a page.
    async fn key_digests(&self, cursor: u64) -> Result<(Vec<KeyHash>, u64), StoreError> {
        let prefix = self.layout.key_by_hash_prefix();
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(KEY_DIGESTS_SCAN)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let digests = names
            .iter()
            .filter_map(|name| KeyHash::from_hex(name.strip_prefix(&prefix)?))
            .collect();
        Ok((digests, next))
    }

    async fn keys_in_workspace(
        &self,
        workspace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Arc<KeyRecord>>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let ids = self
            .page(&self.layout.workspace_keys(workspace), after, limit)
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn();
        let id_keys: Vec<String> = ids.iter().map(|id| self.layout.key_by_id(id)).collect();
        let hashes: Vec<Option<String>> = conn.mget(&id_keys).await.map_err(unavailable)?;
        let record_keys: Vec<String> = hashes
            .iter()
            .flatten()
            .filter_map(|h| KeyHash::from_hex(h))
            .map(|h| self.layout.key_by_hash(&h))
            .collect();
        if record_keys.is_empty() {
            return Ok(Vec::new());
        }
        let records: Vec<Option<String>> = conn.mget(&record_keys).await.map_err(unavailable)?;
        records
            .into_iter()
            .zip(&record_keys)
            .filter_map(|(raw, key)| raw.map(|raw| decode::<KeyRecord>(key, &raw).map(Arc::new)))
            .collect()
    }

    async fn update_key(
        &self,
        id: &str,
        change: KeyChange<'_>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        self.update(id, change, None).await
    }

    async fn update_key_emitting(
        &self,
        id: &str,
        change: KeyChange<'_>,
        event: &Event,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        self.update(id, change, Some(event)).await
    }

    async fn key_changes_since(&self, epoch: u64, mark: &str) -> Result<KeyChanges, StoreError> {
        let reply: Vec<Value> = CHANGES_SINCE
            .key(self.layout.epoch())
            .key(self.layout.log())
            .arg(epoch)
            .arg(CATCH_UP_MAX)
            .arg(mark)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut items = reply.into_iter();
        let current = match items.next() {
            Some(Value::Int(e)) if e >= 0 => e as u64,
            other => {
                return Err(StoreError::Unavailable(format!(
                    "unexpected change-log reply: {other:?}"
                )))
            }
        };
        let text = |item: &Value| -> String {
            match item {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => String::new(),
            }
        };
        let mark = items.next().map(|m| text(&m)).unwrap_or_default();
        let mut changed = Vec::new();
        for item in items {
            let text = text(&item);
            if text == "reset" {
                return Ok(KeyChanges {
                    epoch: current,
                    mark,
                    changed: None,
                });
            }
            if let Some(hash) = KeyHash::from_hex(&text) {
                changed.push(hash);
            }
        }
        Ok(KeyChanges {
            epoch: current,
            mark,
            changed: Some(changed),
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
        let l = &self.layout;
        let Some(old_hash) = self.hash_of(old_id).await? else {
            return Ok(Rotation::NotFound);
        };
        let old_key = l.key_by_hash(&old_hash);
        let successor_key = l.key_by_hash(&successor.hash);
        for _ in 0..UPDATE_ATTEMPTS {
            let raw: Option<String> = self.conn().get(&old_key).await.map_err(unavailable)?;
            let Some(raw) = raw else {
                return Ok(Rotation::NotFound);
            };
            let old: KeyRecord = decode(&old_key, &raw)?;
            if old.status != KeyStatus::Active {
                let exists: bool = self
                    .conn()
                    .exists(&successor_key)
                    .await
                    .map_err(unavailable)?;
                return Ok(if exists {
                    Rotation::AlreadyRotated
                } else {
                    Rotation::NotRotatable(old.status)
                });
            }
            let mut successor = successor.clone();
            crate::keys::inherit(&mut successor, &old);
            let mut rotated = old.clone();
            rotated.status = KeyStatus::Rotating;
            rotated.grace_until = Some(grace_until);
            rotated.rotated_to = Some(successor.id.clone());
            let extended = self.extended_predecessors(&old, &successor.id).await?;
            let mut script = ROTATE_KEY.prepare_invoke();
            script
                .key(&old_key)
                .key(&successor_key)
                .key(l.key_by_id(&successor.id))
                .key(l.workspace_keys(&successor.workspace))
                .key(l.epoch())
                .key(l.log())
                .arg(&raw)
                .arg(encode(&rotated))
                .arg(encode(&successor))
                .arg(old_hash.to_hex())
                .arg(successor.hash.to_hex())
                .arg(&successor.id)
                .arg(successor.created_at)
                .arg(l.channel())
                .arg(CHANGE_LOG_LEN)
                .arg(new_mark());
            for (raw, changed) in &extended {
                script
                    .key(l.key_by_hash(&changed.hash))
                    .arg(raw)
                    .arg(encode(changed))
                    .arg(changed.hash.to_hex());
            }
            let epoch: i64 = script
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            match epoch {
                -2 => return Ok(Rotation::AlreadyRotated),
                -1 => continue,
                _ => {
                    return Ok(Rotation::Rotated {
                        old: Arc::new(rotated),
                        successor: Arc::new(successor),
                    })
                }
            }
        }
        Err(StoreError::Conflict(format!(
            "key {old_id} is changing too often; retry"
        )))
    }

    async fn idempotency_salt(
        &self,
        scope: &str,
        fresh: &str,
        ttl_secs: u64,
    ) -> Result<String, StoreError> {
        let salt: String = GET_OR_SET
            .key(self.layout.idempotency_salt(scope))
            .arg(fresh)
            .arg(ttl_secs.max(1))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        // Lost in a failover, a new salt would make a retry another key: it is on a replica
        // before any key is derived from it. (One found was confirmed so, or its request got a
        // 503; a replica with the key derived from it then has it too, written before it.)
        if salt == fresh {
            self.on_a_replica().await?;
        }
        Ok(salt)
    }

    async fn insert_token(&self, token: &KeyRecord, ttl_secs: u64) -> Result<(), StoreError> {
        let expires_at = token.scoped.as_ref().map_or(0, |grant| grant.expires_at);
        let created: i64 = INSERT_TOKEN
            .key(self.layout.key_by_hash(&token.hash))
            .key(self.layout.key_by_id(&token.id))
            .key(self.layout.live_tokens())
            .arg(encode(token))
            .arg(token.hash.to_hex())
            .arg(ttl_secs.max(1))
            .arg(self.layout.tokens_channel())
            .arg(expires_at)
            .arg(crate::ids::unix_now())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        created_or_conflict(created == 1, "token", &token.id)
    }

    fn minted_tokens(&self) -> Arc<MintedTokens> {
        self.minted.clone()
    }
}

impl RedisStore {
    /// The digest of the key (or token) with id `id`, from the id index.
    pub(super) async fn hash_of(&self, id: &str) -> Result<Option<KeyHash>, StoreError> {
        let hash: Option<String> = self
            .conn()
            .get(self.layout.key_by_id(id))
            .await
            .map_err(unavailable)?;
        Ok(hash.as_deref().and_then(KeyHash::from_hex))
    }

    /// The predecessors of `old` still in grace, each as read (for the rotation's
    /// compare-and-set) and as it is once it counts `successor` against its budget.
    pub(super) async fn extended_predecessors(
        &self,
        old: &KeyRecord,
        successor: &str,
    ) -> Result<Vec<(String, KeyRecord)>, StoreError> {
        let now = crate::ids::unix_now();
        let mut extended = Vec::new();
        for id in &old.predecessors {
            let Some(hash) = self.hash_of(id).await? else {
                continue;
            };
            let key = self.layout.key_by_hash(&hash);
            let raw: Option<String> = self.conn().get(&key).await.map_err(unavailable)?;
            let Some(raw) = raw else {
                continue;
            };
            // An unreadable record (it serves no request either) does not block the rotation.
            let Ok(record) = decode::<KeyRecord>(&key, &raw) else {
                continue;
            };
            if let Some(changed) = crate::keys::with_descendant(&record, successor, now) {
                extended.push((raw, changed));
            }
        }
        Ok(extended)
    }

    pub(super) async fn update(
        &self,
        id: &str,
        change: KeyChange<'_>,
        event: Option<&Event>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        let Some(hash) = self.hash_of(id).await? else {
            return Ok(None);
        };
        let record_key = self.layout.key_by_hash(&hash);
        for _ in 0..UPDATE_ATTEMPTS {
            let raw: Option<String> = self.conn().get(&record_key).await.map_err(unavailable)?;
            let Some(raw) = raw else { return Ok(None) };
            let current: KeyRecord = decode(&record_key, &raw)?;
            let mut next = current.clone();
            change(&mut next);
            next.id = current.id.clone();
            next.workspace = current.workspace.clone();
            next.hash = current.hash;
            if next == current {
                // Nothing to write, and no event: whoever made it so emitted it (perhaps a
                // call answered 503 below, retried: it is confirmed now).
                self.on_a_replica().await?;
                return Ok(Some(Arc::new(current)));
            }
            let mut invocation = UPDATE_KEY.prepare_invoke();
            invocation
                .key(&record_key)
                .key(self.layout.epoch())
                .key(self.layout.log())
                .key(self.layout.events())
                .arg(&raw)
                .arg(encode(&next))
                .arg(hash.to_hex())
                .arg(self.layout.channel())
                .arg(CHANGE_LOG_LEN)
                .arg(new_mark());
            if let Some(event) = event {
                invocation
                    .arg(&event.id)
                    .arg(&event.event_type)
                    .arg(event.created)
                    .arg(&event.workspace)
                    .arg(event.environment.as_str())
                    .arg(event.data.to_string());
            }
            let epoch: i64 = invocation
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            if epoch >= 0 {
                self.on_a_replica().await?;
                return Ok(Some(Arc::new(next)));
            }
        }
        Err(changing_too_often("key", id))
    }
}
