//! Webhook endpoints and the delivery queue in memory.

use super::*;
use crate::events::Event;
use crate::keys::Environment;
use crate::store::{
    too_many_endpoints, AfterAttempt, ClaimRequest, ClaimedDelivery, DeliveryQueue, EndpointChange,
    EndpointRetry, EventPage, QueueStats, Saved, StoreError,
};
use crate::webhooks::delivery::{Delivery, DeliverySummary};
use crate::webhooks::endpoint::Endpoint;
use crate::webhooks::endpoint::EndpointStatus;
use async_trait::async_trait;

impl MemoryStore {
    /// [`DeliveryQueue::update_endpoint`]; with `restart`, the endpoint starts afresh even if
    /// neither its URL nor its status changes ([`DeliveryQueue::resume_endpoint`]).
    pub(super) fn change_endpoint(
        &self,
        workspace: &str,
        id: &str,
        change: EndpointChange<'_>,
        restart: bool,
    ) -> Result<Option<Endpoint>, StoreError> {
        let mut inner = self.write();
        let Some(current) = inner
            .endpoints
            .get_mut(workspace)
            .and_then(|list| list.iter_mut().find(|e| e.id == id))
        else {
            return Ok(None);
        };
        let mut next = current.clone();
        change(&mut next);
        next.id = current.id.clone();
        next.workspace = current.workspace.clone();
        next.environment = current.environment;
        let fresh_start = restart || next.url != current.url || next.status != current.status;
        *current = next.clone();
        if fresh_start {
            inner.webhooks.restart(id, crate::ids::unix_millis());
        }
        Ok(Some(next))
    }
}

#[async_trait]
impl DeliveryQueue for MemoryStore {
    async fn create_endpoint(&self, endpoint: &Endpoint, most: usize) -> Result<(), StoreError> {
        let mut inner = self.write();
        let list = inner
            .endpoints
            .entry(endpoint.workspace.clone())
            .or_default();
        let same_environment = list
            .iter()
            .filter(|e| e.environment == endpoint.environment);
        if same_environment.count() >= most {
            return Err(too_many_endpoints(endpoint, most));
        }
        if list.iter().any(|e| e.id == endpoint.id) {
            return Err(StoreError::Conflict(format!(
                "endpoint {} exists",
                endpoint.id
            )));
        }
        list.push(endpoint.clone());
        Ok(())
    }

    async fn endpoints(&self, workspace: &str) -> Result<Vec<Endpoint>, StoreError> {
        Ok(self
            .read()
            .endpoints
            .get(workspace)
            .cloned()
            .unwrap_or_default())
    }

    async fn update_endpoint(
        &self,
        workspace: &str,
        id: &str,
        change: EndpointChange<'_>,
    ) -> Result<Option<Endpoint>, StoreError> {
        self.change_endpoint(workspace, id, change, false)
    }

    async fn queued_deliveries(&self, endpoint: &str) -> Result<u64, StoreError> {
        Ok(self.read().webhooks.queued(endpoint))
    }

    async fn resume_endpoint(
        &self,
        workspace: &str,
        id: &str,
    ) -> Result<Option<Endpoint>, StoreError> {
        let resume =
            |e: &mut Endpoint| e.status = crate::webhooks::endpoint::EndpointStatus::Active;
        self.change_endpoint(workspace, id, &resume, true)
    }

    async fn delete_endpoint(&self, workspace: &str, id: &str) -> Result<bool, StoreError> {
        let mut inner = self.write();
        let Some(list) = inner.endpoints.get_mut(workspace) else {
            return Ok(false);
        };
        let before = list.len();
        list.retain(|e| e.id != id);
        let removed = list.len() != before;
        inner.webhooks.release(id);
        Ok(removed)
    }

    async fn enqueue_deliveries(
        &self,
        entries: &[String],
        events: &[&Event],
        deliveries: &[Delivery],
    ) -> Result<(), StoreError> {
        self.write().webhooks.enqueue(entries, events, deliveries);
        Ok(())
    }

    async fn claim_deliveries(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let mut guard = self.write();
        let inner = &mut *guard;
        Ok(inner.webhooks.claim(request, &inner.endpoints))
    }

    async fn save_delivery(
        &self,
        delivery: &Delivery,
        after: AfterAttempt<'_>,
    ) -> Result<Saved, StoreError> {
        let mut guard = self.write();
        let inner = &mut *guard;
        let endpoint = inner
            .endpoints
            .get_mut(&delivery.workspace)
            .and_then(|list| list.iter_mut().find(|e| e.id == delivery.endpoint));
        let failures = match after {
            AfterAttempt::Failing(n) | AfterAttempt::Pause(_, n) => Some(n),
            _ => None,
        };
        if let (Some(_), Some(e), Some(url)) = (failures, &endpoint, delivery.attempted_url()) {
            if e.url != url {
                return Ok(Saved::Superseded);
            }
        }
        // A retry's failure whose hold is gone (a resume, or an answer, since its claim;
        // another delivery's failure may have made a new one), unless this is that very save
        // again (its reply was lost).
        if failures.is_some_and(|n| n >= 2)
            && !inner.webhooks.is_probe(&delivery.endpoint, &delivery.id)
            && !inner.webhooks.is_saved_as(delivery)
        {
            return Ok(Saved::Superseded);
        }
        let active = endpoint
            .as_ref()
            .is_some_and(|e| e.status == EndpointStatus::Active);
        inner.webhooks.save(delivery, after, active);
        let pause = match after {
            AfterAttempt::Pause(notice, _) => Some(notice),
            _ => None,
        };
        match (endpoint, pause) {
            (Some(e), Some(notice)) if e.status == EndpointStatus::Active => {
                e.status = match notice.disabled {
                    true => EndpointStatus::Disabled,
                    false => EndpointStatus::Paused,
                };
                inner.webhooks.queue_notice(notice);
                Ok(Saved::Paused)
            }
            _ => Ok(Saved::Done),
        }
    }

    async fn endpoint_retry(&self, endpoint: &str) -> Result<Option<EndpointRetry>, StoreError> {
        Ok(self.read().webhooks.retry_of(endpoint))
    }

    async fn deliveries(
        &self,
        endpoint: &str,
        limit: usize,
    ) -> Result<Vec<DeliverySummary>, StoreError> {
        Ok(self.read().webhooks.deliveries(endpoint, limit))
    }

    async fn event(
        &self,
        workspace: &str,
        environment: Environment,
        id: &str,
    ) -> Result<Option<Event>, StoreError> {
        Ok(self.read().webhooks.event(workspace, environment, id))
    }

    async fn events_since(
        &self,
        workspace: &str,
        environment: Environment,
        since: u64,
        after: Option<&str>,
        max: usize,
    ) -> Result<EventPage, StoreError> {
        let inner = self.read();
        let mut events: Vec<&Event> = inner
            .webhooks
            .replayable()
            .filter(|e| e.workspace == workspace && e.environment == environment)
            .filter(|e| match after {
                Some(after) => (e.created, e.id.as_str()) > (since, after),
                None => e.created >= since,
            })
            .collect();
        events.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        let events: Vec<Event> = events.into_iter().take(max).cloned().collect();
        let next = match events.last() {
            Some(last) if events.len() == max => Some((last.created, last.id.clone())),
            _ => None,
        };
        Ok(EventPage { events, next })
    }

    async fn take_rate_slot(
        &self,
        endpoint: &str,
        limit: u32,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        Ok(self
            .write()
            .webhooks
            .take_rate_slot(endpoint, limit, now_ms / 1000))
    }

    async fn queue_stats(&self) -> Result<QueueStats, StoreError> {
        let inner = self.read();
        let paused = inner
            .endpoints
            .values()
            .flatten()
            .filter(|e| !e.is_active())
            .count();
        Ok(QueueStats {
            paused_endpoints: paused as u64,
            ..inner.webhooks.stats()
        })
    }
}
