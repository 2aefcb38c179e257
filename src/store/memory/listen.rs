//! The slots of `svcgate listen` streams in memory.

use super::*;
use crate::store::{ListenSlots, StoreError};
use async_trait::async_trait;

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
