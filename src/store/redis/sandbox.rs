//! Simulated jobs in Redis: each job's record with a TTL, and one sorted set of the events
//! they will send, which [`SandboxStore::release_due_events`] moves to the event log.

use async_trait::async_trait;
use redis::Script;
use std::sync::LazyLock;

use super::*;
use crate::sandbox::store::{SandboxStore, JOB_TTL_MS};
use crate::sandbox::Scheduled;

/// Saves a job and schedules its events ([`SandboxStore::save_job`]).
static SAVE_JOB: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/save_sandbox_job.lua")));

/// Moves due events to the event log ([`SandboxStore::release_due_events`]).
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release_sandbox_events.lua")));

/// A scheduled event as the due set holds it: its fields in the order the log takes them.
fn member(s: &Scheduled) -> String {
    let e = &s.event;
    serde_json::json!([
        e.id,
        e.event_type,
        e.workspace,
        e.environment.as_str(),
        e.data.to_string()
    ])
    .to_string()
}

#[async_trait]
impl SandboxStore for RedisStore {
    async fn save_job(
        &self,
        id: &str,
        record: &str,
        previous: Option<&str>,
        events: &[Scheduled],
    ) -> Result<bool, StoreError> {
        let p = self.prefix();
        let mut call = SAVE_JOB.key(format!("{p}:sandbox:job:{id}"));
        call.key(format!("{p}:sandbox:due"))
            .arg(record)
            .arg(previous.unwrap_or(""))
            .arg(JOB_TTL_MS);
        for s in events {
            call.arg(s.due_ms).arg(member(s));
        }
        let saved: i64 = call
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(saved == 1)
    }

    async fn job(&self, id: &str) -> Result<Option<String>, StoreError> {
        let p = self.prefix();
        self.conn()
            .get(format!("{p}:sandbox:job:{id}"))
            .await
            .map_err(unavailable)
    }

    async fn release_due_events(&self, now_ms: u64, max: usize) -> Result<Vec<String>, StoreError> {
        let p = self.prefix();
        let min_id = (now_ms / 1000).saturating_sub(crate::events::RETENTION_SECS) * 1000;
        RELEASE
            .key(format!("{p}:sandbox:due"))
            .key(self.layout.events())
            .arg(now_ms)
            .arg(max)
            .arg(min_id)
            .arg(now_ms / 1000)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)
    }
}
