//! Webhook endpoints and the delivery queue in Redis.
//!
//! ## The delivery queue
//!
//! Workers read the log in the consumer group `webhooks`. For each entry a worker stores one
//! delivery per subscribed endpoint and acknowledges the entry in one script, so an entry is
//! either still pending in the group (and reclaimed from a dead worker) or fanned out; an entry
//! fanned out twice queues its deliveries once, as they are keyed by event and endpoint. Each
//! endpoint has its own queue of due deliveries (`{ns}:wh:due:<endpoint>`), and `{ns}:wh:ready`
//! lists the endpoints with work by their earliest due time; claiming takes from several
//! endpoints, never more than a cap per endpoint, so a slow endpoint never holds up another.
//! A claim moves a delivery's due time to the end of its lease: if the worker dies, the
//! delivery is due again then. Retries are the same due times, so a restart keeps the schedule.
//!
//! An event's payload is kept once, in the event's own record, which each of its deliveries
//! keeps alive (it lasts as long as the longest-kept of them); a delivery's record holds the
//! rest ([`WithoutPayload`]), and a claim reads the payloads of what it took in one more call.
//! Before schema version 4 each delivery held a copy: such records are still read, and saved
//! without it after their next attempt.

use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use std::collections::HashMap;
use std::sync::LazyLock;

use super::*;
use crate::events::{Event, RETENTION_SECS};
use crate::keys::Environment;
use crate::store::{
    too_many_endpoints, AfterAttempt, ClaimRequest, ClaimedDelivery, DeliveryQueue, EndpointChange,
    EndpointRetry, EventPage, QueueStats, Saved, StoreError,
};
use crate::webhooks::delivery::{
    Delivery, DeliverySummary, WithoutPayload, DELIVERIES_LISTED, DELIVERY_RETENTION_SECS,
};
use crate::webhooks::endpoint::Endpoint;

/// Replaces an endpoint if it still is what the caller read, and keeps the set of paused
/// endpoints (for the metric) and its retry hold in step with it, in one step. KEYS: the
/// workspace's endpoints, the paused set, the endpoint's hold, its queue, the ready set
/// ([`RedisStore::endpoint_keys`]). ARGV: workspace, id, expected JSON, new JSON, 1 if paused,
/// 1 to drop the hold (its URL changed, or it was resumed: the next attempt is a first one, and
/// the delivery that failed goes now). Returns 1, 0 if it changed meanwhile, -1 if it is gone.
pub(super) static ENDPOINT_CAS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rescore.lua"),
        include_str!("scripts/endpoint_cas.lua")
    ))
});

/// Deletes an endpoint, its retry hold and its place among the paused, and puts its queue due
/// as it is (its deliveries are skipped as they come). KEYS: as [`ENDPOINT_CAS`]'s. ARGV:
/// workspace, id. Returns 1 if it existed.
pub(super) static DELETE_ENDPOINT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rescore.lua"),
        include_str!("scripts/delete_endpoint.lua")
    ))
});

/// Stores a new endpoint unless its workspace has as many as it may in its environment. KEYS:
/// the workspace's endpoints. ARGV: id, JSON, most endpoints, environment. Returns 1, 0 if the
/// id is taken, -1 if full.
pub(super) static CREATE_ENDPOINT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/create_endpoint.lua")));

#[async_trait]
impl DeliveryQueue for RedisStore {
    async fn create_endpoint(&self, endpoint: &Endpoint, most: usize) -> Result<(), StoreError> {
        let created: i64 = CREATE_ENDPOINT
            .key(self.layout.endpoints(&endpoint.workspace))
            .arg(&endpoint.id)
            .arg(encode(endpoint))
            .arg(most)
            .arg(endpoint.environment.as_str())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if created < 0 {
            return Err(too_many_endpoints(endpoint, most));
        }
        created_or_conflict(created == 1, "endpoint", &endpoint.id)
    }

    async fn endpoints(&self, workspace: &str) -> Result<Vec<Endpoint>, StoreError> {
        let key = self.layout.endpoints(workspace);
        let all: HashMap<String, String> = self.conn().hgetall(&key).await.map_err(unavailable)?;
        // One record that does not read (a newer version's, or written by hand) must not stop
        // the workspace's fan-out, or its listing: it is left out, and logged.
        let mut list: Vec<Endpoint> = all
            .values()
            .filter_map(|raw| {
                decode::<Endpoint>(&key, raw)
                    .inspect_err(|e| tracing::error!(error = %e, "skipping an endpoint"))
                    .ok()
            })
            .collect();
        list.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(list)
    }

    async fn update_endpoint(
        &self,
        workspace: &str,
        id: &str,
        change: EndpointChange<'_>,
    ) -> Result<Option<Endpoint>, StoreError> {
        self.change_endpoint(workspace, id, change, false).await
    }

    async fn queued_deliveries(&self, endpoint: &str) -> Result<u64, StoreError> {
        self.conn()
            .zcard(format!("{}:wh:due:{endpoint}", self.prefix()))
            .await
            .map_err(unavailable)
    }

    async fn resume_endpoint(
        &self,
        workspace: &str,
        id: &str,
    ) -> Result<Option<Endpoint>, StoreError> {
        let resume =
            |e: &mut Endpoint| e.status = crate::webhooks::endpoint::EndpointStatus::Active;
        self.change_endpoint(workspace, id, &resume, true).await
    }

    async fn delete_endpoint(&self, workspace: &str, id: &str) -> Result<bool, StoreError> {
        let [endpoints, paused_set, hold, queue, ready] = self.endpoint_keys(workspace, id);
        let removed: i64 = DELETE_ENDPOINT
            .key(endpoints)
            .key(paused_set)
            .key(hold)
            .key(queue)
            .key(ready)
            .arg(workspace)
            .arg(id)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(removed > 0)
    }

    async fn enqueue_deliveries(
        &self,
        entries: &[String],
        events: &[&Event],
        deliveries: &[Delivery],
    ) -> Result<(), StoreError> {
        self.enqueue(entries, events, deliveries).await
    }

    async fn claim_deliveries(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        self.claim(request).await
    }

    async fn save_delivery(
        &self,
        delivery: &Delivery,
        after: AfterAttempt<'_>,
    ) -> Result<Saved, StoreError> {
        self.save(delivery, after).await
    }

    async fn endpoint_retry(&self, endpoint: &str) -> Result<Option<EndpointRetry>, StoreError> {
        self.retry_of(endpoint).await
    }

    async fn deliveries(
        &self,
        endpoint: &str,
        limit: usize,
    ) -> Result<Vec<DeliverySummary>, StoreError> {
        self.list_deliveries(endpoint, limit).await
    }

    async fn event(
        &self,
        workspace: &str,
        environment: Environment,
        id: &str,
    ) -> Result<Option<Event>, StoreError> {
        self.event_by_id(workspace, environment, id).await
    }

    async fn events_since(
        &self,
        workspace: &str,
        environment: Environment,
        since: u64,
        after: Option<&str>,
        max: usize,
    ) -> Result<EventPage, StoreError> {
        self.log_since(workspace, environment, since, after, max)
            .await
    }

    async fn queue_stats(&self) -> Result<QueueStats, StoreError> {
        self.stats().await
    }

    async fn take_rate_slot(
        &self,
        endpoint: &str,
        limit: u32,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let second = now_ms / 1000;
        let taken: i64 = TAKE_RATE_SLOT
            .key(format!("{}:wh:rate:{endpoint}:{second}", self.prefix()))
            .arg(limit)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(taken == 1)
    }
}

/// Takes one of an endpoint's delivery slots in one second. KEYS: the second's counter
/// (`{ns}:wh:rate:<endpoint>:<unix second>`). ARGV: the limit. Returns 1 if taken.
pub(super) static TAKE_RATE_SLOT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/take_rate_slot.lua")));

/// Delivery records a listing reads at once: one written before schema version 4 holds its
/// event's payload.
pub(super) const LISTED_PER_READ: usize = 10;

/// Fans event-log entries out. KEYS: the event log, the cursor, the ready set, the pending
/// count, then `(event record, replay index)` of each event and `(delivery record, endpoint
/// queue, endpoint hold, endpoint log)` of each delivery. ARGV: group, ttl, the oldest `created`
/// kept (unix seconds), then a count and that many entry ids, a count and that many `(event
/// json, created, event id)`, a count and that many `(workspace, endpoint, delivery id, due ms,
/// delivery json)`. A delivery whose id is stored already (its entry was fanned out before) is
/// left as it is. Returns how many deliveries it queued. An event's record is written, or
/// written again, for the ttl from now: its deliveries read their payload there.
///
/// Each event is kept for replay by workspace, environment and id
/// (`{ns}:wh:evt:<ws>:<env>:<id>`: backends choose ids, and two workspaces may choose the
/// same), and indexed by its workspace and environment (`{ns}:wh:replay:<ws>:<env>`, scored by
/// `created`), so a replay since a time reads only that workspace's events.
///
/// The cursor only moves forward, and never past an entry still pending in the group: every
/// entry up to it is fanned out, so a group recreated there misses nothing (a newer batch that
/// succeeded while an older one is pending would otherwise move it past the older one).
pub(super) static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            format!("local DELIVERIES_LISTED = {DELIVERIES_LISTED}\n").as_str(),
            include_str!("scripts/newer.lua"),
            include_str!("scripts/before.lua"),
            include_str!("scripts/rescore.lua"),
            include_str!("scripts/enqueue.lua"),
        ]
        .concat(),
    )
});

/// Claims due deliveries. ARGV: prefix, now ms, lease end ms, max, per endpoint, busy JSON
/// (`{endpoint: in flight}`), struggling JSON (`{endpoint: true}`), most to take from the
/// struggling ones. Returns `endpoint json or '', delivery json, failures` triples.
///
/// An active endpoint with a hold (`{ns}:wh:hold:<endpoint>`: its failures in a row, until
/// when, and the delivery that failed) gives one delivery once the hold is due, that one if it
/// is still queued, and counts as struggling; the hold then lasts to the lease's end, so no
/// other worker takes a second. A hold on an endpoint that is paused or gone is dropped.
pub(super) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&[format!("local CLAIM_SCAN = {CLAIM_SCAN}\nlocal CLAIM_PAGE = {CLAIM_PAGE}\nlocal PROBE_TRIES = {PROBE_TRIES}\n").as_str(), include_str!("scripts/rescore.lua"), include_str!("scripts/claim.lua")].concat())
});

/// Claims of a held endpoint's failed delivery with no attempt saved (its workers died, or
/// none can read it), after which the next delivery due is tried instead.
pub(super) const PROBE_TRIES: u32 = 3;

/// Due endpoints the claim script reads at a time.
pub(super) const CLAIM_PAGE: usize = 1_000;

/// Due endpoints one claim looks at, at most: a bound on the script's run time (Redis runs
/// nothing else meanwhile) with tens of thousands of endpoints due.
pub(super) const CLAIM_SCAN: usize = 20_000;

/// Saves a delivery after an attempt. KEYS: the workspace's endpoints, the endpoint's queue,
/// its hold, the delivery's record, the pending count, the ready set, the paused set, the
/// notices, the notices' due set, the event's record. ARGV: workspace, endpoint, delivery id,
/// json (without the payload), next due ms (-1: final), ttl, then, to pause the endpoint, a pause
/// notice's id, json and due ms (id '': no pause), then what the attempt says of the endpoint
/// (`answered`: release its hold; `failing`: hold it until the next due ms with this delivery
/// first, unless a hold with more failures is there; `pause`: drop the hold; `skipped`), its
/// failures in a row, the URL the attempt went to ('' if unknown), and the JSON of its event's
/// record: kept for the ttl from now, and written again if it is gone (a delivery stored with
/// its payload, before schema version 4, may outlive it; JSON '': not written), and the status
/// a pause gives the endpoint (`paused`, or `disabled` after a 410 Gone). Returns
/// 1 if it paused the endpoint (and queued the notice), 2 if it saved nothing: the endpoint's
/// URL is no longer the one attempted, or the attempt was a retry and the hold it was claimed
/// under is gone (a resume, or an answer).
pub(super) static SAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rescore.lua"),
        include_str!("scripts/save.lua")
    ))
});

/// A page of a replay index: the ids of events created at or after ARGV[1] (unix seconds), in
/// (created, id) order, past ARGV[2] among those created at ARGV[1] itself (a continuation; ''
/// for none), at most ARGV[3], each with its `created`. KEYS: the index.
pub(super) static REPLAY_PAGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/replay_page.lua")));

impl RedisStore {
    /// The keys a change to endpoint `id` of `workspace` touches: the workspace's endpoints,
    /// the paused set, the endpoint's hold, its queue, the ready set.
    fn endpoint_keys(&self, workspace: &str, id: &str) -> [String; 5] {
        let p = self.prefix();
        [
            self.layout.endpoints(workspace),
            format!("{p}:wh:paused"),
            format!("{p}:wh:hold:{id}"),
            format!("{p}:wh:due:{id}"),
            format!("{p}:wh:ready"),
        ]
    }

    /// [`DeliveryQueue::update_endpoint`]; with `restart`, the endpoint starts afresh even if
    /// neither its URL nor its status changes ([`DeliveryQueue::resume_endpoint`]).
    pub(super) async fn change_endpoint(
        &self,
        workspace: &str,
        id: &str,
        change: EndpointChange<'_>,
        restart: bool,
    ) -> Result<Option<Endpoint>, StoreError> {
        let key = self.layout.endpoints(workspace);
        for _ in 0..UPDATE_ATTEMPTS {
            let raw: Option<String> = self.conn().hget(&key, id).await.map_err(unavailable)?;
            let Some(raw) = raw else { return Ok(None) };
            let current: Endpoint = decode(&key, &raw)?;
            let mut next = current.clone();
            change(&mut next);
            next.id = current.id;
            next.workspace = current.workspace;
            next.environment = current.environment;
            let paused = !next.is_active();
            let fresh_start = restart || next.url != current.url || next.status != current.status;
            let [endpoints, paused_set, hold, queue, ready] = self.endpoint_keys(workspace, id);
            let swapped: i64 = ENDPOINT_CAS
                .key(endpoints)
                .key(paused_set)
                .key(hold)
                .key(queue)
                .key(ready)
                .arg(workspace)
                .arg(id)
                .arg(&raw)
                .arg(encode(&next))
                .arg(u8::from(paused))
                .arg(u8::from(fresh_start))
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            if let Some(done) = settled(swapped, next) {
                return Ok(done);
            }
        }
        Err(changing_too_often("endpoint", id))
    }

    pub(super) async fn enqueue(
        &self,
        entries: &[String],
        events: &[&Event],
        deliveries: &[Delivery],
    ) -> Result<(), StoreError> {
        let p = self.prefix();
        let mut invocation = ENQUEUE.prepare_invoke();
        invocation
            .key(self.layout.events())
            .key(format!("{p}:wh:cursor"))
            .key(format!("{p}:wh:ready"))
            .key(format!("{p}:wh:pending"))
            .arg(GROUP)
            .arg(DELIVERY_RETENTION_SECS)
            .arg(crate::ids::unix_now().saturating_sub(RETENTION_SECS))
            .arg(entries.len())
            .arg(entries)
            .arg(events.len());
        for event in events {
            invocation
                .key(self.event_record(&event.workspace, event.environment, &event.id))
                .key(self.replay_index(&event.workspace, event.environment))
                .arg(encode(event))
                .arg(event.created)
                .arg(&event.id);
        }
        // A delivery whose event is recorded here leaves its payload to that record.
        let recorded: std::collections::HashSet<(&str, Environment, &str)> = events
            .iter()
            .map(|e| (e.workspace.as_str(), e.environment, e.id.as_str()))
            .collect();
        invocation.arg(deliveries.len());
        for d in deliveries {
            let e = &d.event;
            let json = match recorded.contains(&(&e.workspace, e.environment, &e.id)) {
                true => encode(&WithoutPayload(d)),
                false => encode(d),
            };
            invocation
                .key(format!("{p}:wh:dlv:{}", d.id))
                .key(format!("{p}:wh:due:{}", d.endpoint))
                .key(format!("{p}:wh:hold:{}", d.endpoint))
                .key(format!("{p}:wh:log:{}", d.endpoint))
                .arg(&d.workspace)
                .arg(&d.endpoint)
                .arg(&d.id)
                .arg(d.next_attempt_ms.unwrap_or(0))
                .arg(json);
        }
        invocation
            .invoke_async::<i64>(&mut self.conn())
            .await
            .map(drop)
            .map_err(unavailable)
    }

    pub(super) async fn claim(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let busy: serde_json::Map<String, serde_json::Value> = request
            .busy
            .iter()
            .map(|(id, n)| (id.to_string(), (*n).into()))
            .collect();
        let struggling: serde_json::Map<String, serde_json::Value> = request
            .struggling
            .iter()
            .map(|id| (id.to_string(), true.into()))
            .collect();
        let struggling = serde_json::Value::Object(struggling);
        let lease_end = request.now_ms + request.lease.as_millis() as u64;
        let flat: Vec<String> = CLAIM
            .prepare_invoke()
            .arg(self.prefix())
            .arg(request.now_ms)
            .arg(lease_end)
            .arg(request.max)
            .arg(request.per_endpoint)
            .arg(serde_json::Value::Object(busy).to_string())
            .arg(struggling.to_string())
            .arg(request.struggling_max)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        // A record that does not read (written by a newer version, or by hand) must not hold
        // up the others: it is left to its lease, and a worker that reads it takes it then.
        let mut claimed = Vec::with_capacity(flat.len() / 3);
        for triple in flat.chunks_exact(3) {
            let endpoint = match triple[0].as_str() {
                "" => Ok(None),
                raw => decode::<Endpoint>("an endpoint", raw).map(Some),
            };
            let delivery = decode::<Delivery>("a delivery", &triple[1]);
            match (delivery, endpoint) {
                (Ok(delivery), Ok(endpoint)) => claimed.push(ClaimedDelivery {
                    delivery,
                    endpoint,
                    failures: triple[2].parse().unwrap_or(0),
                }),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::error!(error = %e, "skipping a delivery until its lease ends")
                }
            }
        }
        self.fill_in_payloads(claimed).await
    }

    /// Fills in the payload of each claimed delivery kept without it, from its event's record
    /// (one read for all): the deliveries of one event share the event as its record keeps it.
    /// One whose event's record is gone (Redis evicted it, or it was deleted by hand) cannot be
    /// delivered: it is saved as skipped, which its listing shows.
    pub(super) async fn fill_in_payloads(
        &self,
        claimed: Vec<ClaimedDelivery>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let record = |c: &ClaimedDelivery| {
            let e = &c.delivery.event;
            self.event_record(&e.workspace, e.environment, &e.id)
        };
        let mut keys: Vec<String> = claimed
            .iter()
            .filter(|c| c.delivery.event.data.is_null())
            .map(record)
            .collect();
        if keys.is_empty() {
            return Ok(claimed);
        }
        keys.sort_unstable();
        keys.dedup();
        let raws: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut recorded = std::collections::HashMap::with_capacity(keys.len());
        for (key, raw) in keys.iter().zip(raws) {
            let event = raw.map(|raw| decode::<Event>(key, &raw));
            match event {
                Some(Ok(event)) if !event.data.is_null() => {
                    recorded.insert(key.as_str(), std::sync::Arc::new(event));
                }
                Some(Err(e)) => tracing::error!(error = %e, "an event's record does not read"),
                _ => {}
            }
        }
        let mut ready = Vec::with_capacity(claimed.len());
        for mut c in claimed {
            if c.delivery.event.data.is_null() {
                let Some(event) = recorded.get(record(&c).as_str()) else {
                    self.skip_without_payload(c.delivery).await;
                    continue;
                };
                c.delivery.event = std::sync::Arc::clone(event);
            }
            ready.push(c);
        }
        Ok(ready)
    }

    /// Saves a delivery whose event's record is gone as skipped; if that fails, it is claimed
    /// again when its lease ends.
    pub(super) async fn skip_without_payload(&self, mut d: Delivery) {
        tracing::error!(
            delivery = %d.id,
            event = %d.event.id,
            "a delivery's event is no longer stored; skipping it"
        );
        d.skip("its event is no longer stored", crate::ids::unix_millis());
        if let Err(e) = self.save_as(&d, AfterAttempt::Skipped, "").await {
            tracing::warn!(error = %e, delivery = %d.id, "could not save a skipped delivery");
        }
    }

    pub(super) async fn save(
        &self,
        d: &Delivery,
        after: AfterAttempt<'_>,
    ) -> Result<Saved, StoreError> {
        self.save_as(d, after, &encode(&d.event)).await
    }

    /// Saves `d`, its event's record written as `event_json` if it is gone ('': not written).
    pub(super) async fn save_as(
        &self,
        d: &Delivery,
        after: AfterAttempt<'_>,
        event_json: &str,
    ) -> Result<Saved, StoreError> {
        let next: i64 = match (d.is_final(), d.next_attempt_ms) {
            (false, Some(ms)) => ms as i64,
            _ => -1,
        };
        let p = self.prefix();
        let e = &d.event;
        let mut invocation = SAVE.prepare_invoke();
        invocation
            .key(self.layout.endpoints(&d.workspace))
            .key(format!("{p}:wh:due:{}", d.endpoint))
            .key(format!("{p}:wh:hold:{}", d.endpoint))
            .key(format!("{p}:wh:dlv:{}", d.id))
            .key(format!("{p}:wh:pending"))
            .key(format!("{p}:wh:ready"))
            .key(format!("{p}:wh:paused"))
            .key(format!("{p}:wh:notices"))
            .key(format!("{p}:wh:notices:due"))
            .key(self.event_record(&e.workspace, e.environment, &e.id))
            .arg(&d.workspace)
            .arg(&d.endpoint)
            .arg(&d.id)
            .arg(encode(&WithoutPayload(d)))
            .arg(next)
            .arg(DELIVERY_RETENTION_SECS);
        match after {
            AfterAttempt::Pause(notice, failures) => invocation
                .arg(&notice.id)
                .arg(encode(notice))
                .arg(notice.paused_ms)
                .arg("pause")
                .arg(failures),
            AfterAttempt::Answered => invocation.arg("").arg("").arg(0).arg("answered").arg(0),
            AfterAttempt::Failing(failures) => invocation
                .arg("")
                .arg("")
                .arg(0)
                .arg("failing")
                .arg(failures),
            AfterAttempt::Skipped => invocation.arg("").arg("").arg(0).arg("skipped").arg(0),
        };
        let paused_as = match after {
            AfterAttempt::Pause(notice, _) if notice.disabled => "disabled",
            _ => "paused",
        };
        invocation
            .arg(d.attempted_url().unwrap_or_default())
            .arg(event_json)
            .arg(paused_as);
        let saved: i64 = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(match saved {
            1 => Saved::Paused,
            2 => Saved::Superseded,
            _ => Saved::Done,
        })
    }

    pub(super) async fn retry_of(
        &self,
        endpoint: &str,
    ) -> Result<Option<EndpointRetry>, StoreError> {
        let (failures, until): (Option<u32>, Option<u64>) = redis::cmd("HMGET")
            .arg(format!("{}:wh:hold:{endpoint}", self.prefix()))
            .arg("failures")
            .arg("until")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(failures
            .zip(until)
            .map(|(failures, next_attempt_ms)| EndpointRetry {
                failures,
                next_attempt_ms,
            }))
    }

    pub(super) async fn list_deliveries(
        &self,
        endpoint: &str,
        limit: usize,
    ) -> Result<Vec<DeliverySummary>, StoreError> {
        let p = self.prefix();
        let ids: Vec<String> = self
            .conn()
            .lrange(format!("{p}:wh:log:{endpoint}"), 0, limit as isize - 1)
            .await
            .map_err(unavailable)?;
        let mut listed = Vec::with_capacity(ids.len());
        // A record holds its event's payload (up to 256 KiB): read a few at a time, and keep
        // only the summary of each.
        for chunk in ids.chunks(LISTED_PER_READ) {
            let keys: Vec<String> = chunk.iter().map(|id| format!("{p}:wh:dlv:{id}")).collect();
            let raws: Vec<Option<String>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            for raw in raws.iter().flatten() {
                listed.push(decode("delivery", raw)?);
            }
        }
        Ok(listed)
    }

    /// The key of an event's record.
    pub(super) fn event_record(
        &self,
        workspace: &str,
        environment: Environment,
        id: &str,
    ) -> String {
        format!(
            "{}:wh:evt:{workspace}:{}:{id}",
            self.prefix(),
            environment.as_str()
        )
    }

    pub(super) async fn event_by_id(
        &self,
        workspace: &str,
        environment: Environment,
        id: &str,
    ) -> Result<Option<Event>, StoreError> {
        let record = self.event_record(workspace, environment, id);
        if let Some(event) = self.get_json::<Event>(&record).await? {
            return Ok(Some(event));
        }
        // Kept by id alone before schema version 2: still there for up to 30 days after an upgrade.
        let legacy: Option<Event> = self
            .get_json(&format!("{}:wh:evt:{id}", self.prefix()))
            .await?;
        Ok(legacy.filter(|e| e.workspace == workspace && e.environment == environment))
    }

    /// The key of a workspace's replay index in one environment.
    pub(super) fn replay_index(&self, workspace: &str, environment: Environment) -> String {
        format!(
            "{}:wh:replay:{workspace}:{}",
            self.prefix(),
            environment.as_str()
        )
    }

    pub(super) async fn log_since(
        &self,
        workspace: &str,
        environment: Environment,
        since: u64,
        after: Option<&str>,
        max: usize,
    ) -> Result<EventPage, StoreError> {
        // Past the window, the page starts at its edge: `after` belonged to a second before.
        let floor = crate::ids::unix_now().saturating_sub(RETENTION_SECS);
        let (since, after) = match since < floor {
            true => (floor, None),
            false => (since, after),
        };
        let page: Vec<(String, f64)> = REPLAY_PAGE
            .key(self.replay_index(workspace, environment))
            .arg(since)
            .arg(after.unwrap_or_default())
            .arg(max)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let next = match page.last() {
            Some((id, created)) if page.len() == max => Some((*created as u64, id.clone())),
            _ => None,
        };
        let ids: Vec<&str> = page.iter().map(|(id, _)| id.as_str()).collect();
        let mut events = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(1_000) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|id| self.event_record(workspace, environment, id))
                .collect();
            let raws: Vec<Option<String>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            // An event whose record expired first, or does not read, is not replayed.
            events.extend(
                raws.iter()
                    .flatten()
                    .filter_map(|raw| {
                        decode::<Event>("an event", raw)
                            .inspect_err(
                                |e| tracing::warn!(error = %e, "skipping an event in a replay"),
                            )
                            .ok()
                    })
                    .filter(|e| e.workspace == workspace && e.environment == environment),
            );
        }
        Ok(EventPage { events, next })
    }

    pub(super) async fn stats(&self) -> Result<QueueStats, StoreError> {
        let p = self.prefix();
        let (pending, first, paused, notices): (Option<i64>, Vec<(String, f64)>, u64, u64) =
            redis::pipe()
                .get(format!("{p}:wh:pending"))
                .zrange_withscores(format!("{p}:wh:ready"), 0, 0)
                .scard(format!("{p}:wh:paused"))
                .hlen(format!("{p}:wh:notices"))
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
        Ok(QueueStats {
            pending: pending.unwrap_or(0).max(0) as u64,
            oldest_due_ms: first.first().map(|(_, score)| *score as u64),
            paused_endpoints: paused,
            pause_notices: notices,
        })
    }
}
