//! Simulated jobs in memory.

use super::*;
use crate::sandbox::store::{SandboxStore, JOB_TTL_MS};
use crate::sandbox::Scheduled;
use crate::store::StoreError;
use async_trait::async_trait;

#[async_trait]
impl SandboxStore for MemoryStore {
    async fn save_job(
        &self,
        id: &str,
        record: &str,
        previous: Option<&str>,
        events: &[Scheduled],
    ) -> Result<bool, StoreError> {
        let now_ms = crate::ids::unix_millis();
        let mut inner = self.write();
        inner.sandbox_jobs.retain(|_, (_, until)| *until > now_ms);
        if let Some(previous) = previous {
            if inner.sandbox_jobs.get(id).map(|(r, _)| r.as_str()) != Some(previous) {
                return Ok(false);
            }
        }
        inner
            .sandbox_jobs
            .insert(id.to_string(), (record.to_string(), now_ms + JOB_TTL_MS));
        for s in events {
            inner
                .sandbox_due
                .insert((s.due_ms, s.event.id.clone()), s.event.clone());
        }
        Ok(true)
    }

    async fn job(&self, id: &str) -> Result<Option<String>, StoreError> {
        let now_ms = crate::ids::unix_millis();
        Ok(self
            .read()
            .sandbox_jobs
            .get(id)
            .filter(|(_, until)| *until > now_ms)
            .map(|(r, _)| r.clone()))
    }

    async fn release_due_events(&self, now_ms: u64, max: usize) -> Result<Vec<String>, StoreError> {
        let mut types = Vec::new();
        {
            let mut inner = self.write();
            while types.len() < max {
                let Some(entry) = inner.sandbox_due.first_entry() else {
                    break;
                };
                if entry.key().0 > now_ms {
                    break;
                }
                let mut event = entry.remove();
                event.created = now_ms / 1000;
                types.push(event.event_type.clone());
                inner.webhooks.log(event);
            }
        }
        if !types.is_empty() {
            self.logged.notify_waiters();
        }
        Ok(types)
    }
}
