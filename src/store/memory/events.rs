//! The event log in memory.

use super::*;
use crate::events::Event;
use crate::store::{EventFeed, EventLog, StoreError};
use async_trait::async_trait;
use std::time::Duration;

#[async_trait]
impl EventLog for MemoryStore {
    async fn append_event(&self, event: &Event) -> Result<(), StoreError> {
        self.write().webhooks.log(event.clone());
        self.logged.notify_waiters();
        Ok(())
    }

    async fn tail_events(&self) -> Result<Box<dyn EventFeed>, StoreError> {
        Ok(self.tail())
    }

    async fn event_log_floor(&self) -> Result<Option<String>, StoreError> {
        Ok(self.log_floor())
    }

    async fn consume_events(
        &self,
        _consumer: &str,
        reclaim_after: Duration,
    ) -> Result<Box<dyn EventFeed>, StoreError> {
        Ok(self.consume(reclaim_after))
    }
}
