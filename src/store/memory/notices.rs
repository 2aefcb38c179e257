//! Pause notices in memory.

use super::*;
use crate::store::{NoticeStore, StoreError};
use crate::webhooks::notice::PauseNotice;
use async_trait::async_trait;
use std::time::Duration;

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
