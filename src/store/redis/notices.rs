//! Pause notices in Redis.

use async_trait::async_trait;
use redis::Script;
use std::sync::LazyLock;
use std::time::Duration;

use super::*;
use crate::store::{NoticeStore, StoreError};
use crate::webhooks::notice::PauseNotice;

#[async_trait]
impl NoticeStore for RedisStore {
    async fn claim_pause_notices(
        &self,
        now_ms: u64,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<PauseNotice>, StoreError> {
        self.claim_notices(now_ms, lease, max).await
    }

    async fn retry_pause_notice(
        &self,
        notice: &PauseNotice,
        due_ms: u64,
    ) -> Result<(), StoreError> {
        self.retry_notice(notice, due_ms).await
    }

    async fn remove_pause_notice(&self, id: &str) -> Result<(), StoreError> {
        self.remove_notice(id).await
    }
}

/// Claims due pause notices. KEYS: the due set, the notices. ARGV: now ms, lease end ms, max.
/// Returns their JSON.
pub(super) static CLAIM_NOTICES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/claim_notices.lua")));

/// Puts a claimed pause notice back, if it is still queued. KEYS: the notices, the due set.
/// ARGV: id, json, due ms.
pub(super) static RETRY_NOTICE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/retry_notice.lua")));

impl RedisStore {
    pub(super) async fn claim_notices(
        &self,
        now_ms: u64,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<PauseNotice>, StoreError> {
        let p = self.prefix();
        let raws: Vec<String> = CLAIM_NOTICES
            .key(format!("{p}:wh:notices:due"))
            .key(format!("{p}:wh:notices"))
            .arg(now_ms)
            .arg(now_ms + lease.as_millis() as u64)
            .arg(max)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        // One unreadable record must not hold up the others: it is left to its lease.
        let notices = raws.iter().filter_map(|raw| {
            decode::<PauseNotice>("a pause notice", raw)
                .inspect_err(|e| tracing::error!(error = %e, "skipping a pause notice"))
                .ok()
        });
        Ok(notices.collect())
    }

    pub(super) async fn retry_notice(
        &self,
        notice: &PauseNotice,
        due_ms: u64,
    ) -> Result<(), StoreError> {
        let p = self.prefix();
        RETRY_NOTICE
            .key(format!("{p}:wh:notices"))
            .key(format!("{p}:wh:notices:due"))
            .arg(&notice.id)
            .arg(encode(notice))
            .arg(due_ms)
            .invoke_async::<i64>(&mut self.conn())
            .await
            .map(drop)
            .map_err(unavailable)
    }

    pub(super) async fn remove_notice(&self, id: &str) -> Result<(), StoreError> {
        let p = self.prefix();
        redis::pipe()
            .atomic()
            .hdel(format!("{p}:wh:notices"), id)
            .ignore()
            .zrem(format!("{p}:wh:notices:due"), id)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(unavailable)
    }
}
