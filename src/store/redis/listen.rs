//! The slots of `svcgate listen` streams in Redis.

use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use std::sync::LazyLock;

use super::*;
use crate::store::{ListenSlots, StoreError};

/// Holds or renews a listen-stream slot. KEYS: the key's slots (stream → lease end, ms).
/// ARGV: stream, max, lease (ms). Returns 1, or 0 if every slot is held by another. Leases
/// are timed by Redis's clock, not the replicas' (one running ahead would end the others').
pub(super) static HOLD_LISTEN_SLOT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/hold_listen_slot.lua")));

#[async_trait]
impl ListenSlots for RedisStore {
    async fn hold_listen_slot(
        &self,
        key_id: &str,
        stream: &str,
        max: usize,
        lease_ms: u64,
    ) -> Result<bool, StoreError> {
        let held: i64 = HOLD_LISTEN_SLOT
            .key(self.layout.listen_slots(key_id))
            .arg(stream)
            .arg(max)
            .arg(lease_ms.max(1))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(held == 1)
    }

    async fn release_listen_slot(&self, key_id: &str, stream: &str) -> Result<(), StoreError> {
        self.conn()
            .zrem::<_, _, ()>(self.layout.listen_slots(key_id), stream)
            .await
            .map_err(unavailable)
    }
}
