//! The event log and the webhook delivery queue in Redis.
//!
//! ## The event log: `{ns}:events`
//!
//! A stream. Backends may add events to it directly:
//!
//! ```text
//! XADD {svcgate}:events * type agent.run.completed workspace ws_123 data '{"run_id":"run_1"}'
//! ```
//!
//! Fields: `type` (an event name), `workspace` and `data` (a JSON object) are required; `id`
//! (`evt_…`; default: derived from the entry id), `created` (unix seconds; default: the entry's
//! time) and `environment` (`live` or `test`; default `live`) are optional. An entry that does
//! not parse is acknowledged, logged and skipped.
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
//! Until session 23 each delivery held a copy: such records are still read, and saved without
//! it after their next attempt.

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamId;
use redis::{AsyncCommands, Script};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use super::connection::Connections;
use super::{decode, encode, unavailable, RedisStore};
use crate::events::{log_position, Event, LoggedEvent, RETENTION_SECS};
use crate::keys::Environment;
use crate::store::{
    AfterAttempt, ClaimRequest, ClaimedDelivery, EndpointRetry, EventFeed, EventPage, QueueStats,
    Saved, StoreError,
};
use crate::webhooks::delivery::{
    Delivery, DeliverySummary, WithoutPayload, DELIVERIES_LISTED, DELIVERY_RETENTION_SECS,
};
use crate::webhooks::endpoint::Endpoint;
use crate::webhooks::notice::PauseNotice;

/// The workers' consumer group on the event log.
const GROUP: &str = "webhooks";

/// Delivery records a listing reads at once: one written before session 23 holds its event's
/// payload.
const LISTED_PER_READ: usize = 10;

/// Fans event-log entries out. KEYS: the event log. ARGV: prefix, group, ttl, the oldest
/// `created` kept (unix seconds), then a count and that many entry ids, a count and that many
/// `(event record key, event json, replay index key, created, event id)`, a count and that many `(workspace,
/// endpoint, delivery id, due ms, delivery json)`. A delivery whose id is stored already (its
/// entry was fanned out before) is left as it is. Returns how many deliveries it queued. An
/// event's record is written, or written again, for the ttl from now: its deliveries read
/// their payload there.
///
/// Each event is kept for replay by workspace, environment and id
/// (`{ns}:wh:evt:<ws>:<env>:<id>`: backends choose ids, and two workspaces may choose the
/// same), and indexed by its workspace and environment (`{ns}:wh:replay:<ws>:<env>`, scored by
/// `created`), so a replay since a time reads only that workspace's events.
///
/// The cursor only moves forward, and never past an entry still pending in the group: every
/// entry up to it is fanned out, so a group recreated there misses nothing (a newer batch that
/// succeeded while an older one is pending would otherwise move it past the older one).
static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
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
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&[format!("local CLAIM_SCAN = {CLAIM_SCAN}\nlocal CLAIM_PAGE = {CLAIM_PAGE}\nlocal PROBE_TRIES = {PROBE_TRIES}\n").as_str(), include_str!("scripts/rescore.lua"), include_str!("scripts/claim.lua")].concat())
});

/// Claims of a held endpoint's failed delivery with no attempt saved (its workers died, or
/// none can read it), after which the next delivery due is tried instead.
const PROBE_TRIES: u32 = 3;

/// Due endpoints the claim script reads at a time.
const CLAIM_PAGE: usize = 1_000;
/// Due endpoints one claim looks at, at most: a bound on the script's run time (Redis runs
/// nothing else meanwhile) with tens of thousands of endpoints due.
const CLAIM_SCAN: usize = 20_000;

/// Saves a delivery after an attempt. ARGV: prefix, workspace, endpoint, delivery id, json
/// (without the payload), next due ms (-1: final), ttl, then, to pause the endpoint, a pause
/// notice's id, json and due ms (id '': no pause), then what the attempt says of the endpoint
/// (`answered`: release its hold; `failing`: hold it until the next due ms with this delivery
/// first, unless a hold with more failures is there; `pause`: drop the hold; `skipped`), its
/// failures in a row, the URL the attempt went to ('' if unknown), and the key and JSON of its
/// event's record: kept for the ttl from now, and written again if it is gone (a delivery
/// stored with its payload, before session 23, may outlive it; JSON '': not written). Returns
/// 1 if it paused the endpoint (and queued the notice), 2 if it saved nothing: the endpoint's
/// URL is no longer the one attempted, or the attempt was a retry and the hold it was claimed
/// under is gone (a resume, or an answer).
static SAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rescore.lua"),
        include_str!("scripts/save.lua")
    ))
});

/// A page of a replay index: the ids of events created at or after ARGV[1] (unix seconds), in
/// (created, id) order, past ARGV[2] among those created at ARGV[1] itself (a continuation; ''
/// for none), at most ARGV[3], each with its `created`. KEYS: the index.
static REPLAY_PAGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/replay_page.lua")));

/// Claims due pause notices. ARGV: prefix, now ms, lease end ms, max. Returns their JSON.
static CLAIM_NOTICES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/claim_notices.lua")));

/// Puts a claimed pause notice back, if it is still queued. ARGV: prefix, id, json, due ms.
static RETRY_NOTICE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/retry_notice.lua")));

impl RedisStore {
    pub(super) fn prefix(&self) -> String {
        format!("{{{}}}", self.layout.ns)
    }

    /// A connection of its own, without a response timeout: for blocking reads.
    async fn blocking_connection(&self) -> Result<MultiplexedConnection, StoreError> {
        blocking_connection(&self.connections).await
    }

    /// The log's clock (Redis `TIME`), in unix milliseconds: Redis gives the entries logged from
    /// then on ids at or past it, and never lower than the last.
    async fn log_clock_ms(&self) -> Result<u64, StoreError> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(secs.saturating_mul(1000) + micros / 1000)
    }

    pub(super) async fn tail(&self) -> Result<Box<dyn EventFeed>, StoreError> {
        let key = self.layout.events();
        // The log's clock, read before its newest entry.
        let opened_ms = self.log_clock_ms().await?;
        let newest = self.stream_range("XREVRANGE", &key, "+", "-", 1).await?;
        let after = newest
            .first()
            .map_or_else(|| "0-0".to_string(), |e| e.id.clone());
        // News of a move is subscribed to before the connection is made: a move while it is
        // made is then seen, and the read goes to the new master.
        let moved = self.connections.moved();
        Ok(Box::new(Tail {
            conn: self.blocking_connection().await?,
            key,
            resume: Resume::new(&after, opened_ms),
            after,
            connections: std::sync::Arc::downgrade(&self.connections),
            moved,
        }))
    }

    /// [`crate::store::EventLog::event_log_floor`]: from the log's clock, as a tail's own floor
    /// ([`Resume`]), not from its newest entry (which the master a gateway still reads may not
    /// have, after a move).
    pub(super) async fn log_floor(&self) -> Result<Option<String>, StoreError> {
        let (ms, seq) = clock_floor(self.log_clock_ms().await?);
        Ok(Some(format!("{ms}-{seq}")))
    }

    pub(super) async fn consume(
        &self,
        consumer: &str,
        reclaim_after: Duration,
    ) -> Result<Box<dyn EventFeed>, StoreError> {
        // As for a tail: subscribed to before the connection is made.
        let moved = self.connections.moved();
        let mut group = Group {
            conn: self.blocking_connection().await?,
            key: self.layout.events(),
            cursor: format!("{}:wh:cursor", self.prefix()),
            consumer: consumer.to_string(),
            reclaim_after,
            next_reclaim: Instant::now(),
            next_trim: Instant::now(),
            moved,
        };
        group.create().await?;
        Ok(Box::new(group))
    }

    pub(super) async fn enqueue(
        &self,
        entries: &[String],
        events: &[&Event],
        deliveries: &[Delivery],
    ) -> Result<(), StoreError> {
        let mut invocation = ENQUEUE.prepare_invoke();
        invocation
            .key(self.layout.events())
            .arg(self.prefix())
            .arg(GROUP)
            .arg(DELIVERY_RETENTION_SECS)
            .arg(crate::ids::unix_now().saturating_sub(RETENTION_SECS))
            .arg(entries.len())
            .arg(entries)
            .arg(events.len());
        for event in events {
            invocation
                .arg(self.event_record(&event.workspace, event.environment, &event.id))
                .arg(encode(event))
                .arg(self.replay_index(&event.workspace, event.environment))
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
    async fn fill_in_payloads(
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
    async fn skip_without_payload(&self, mut d: Delivery) {
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
    async fn save_as(
        &self,
        d: &Delivery,
        after: AfterAttempt<'_>,
        event_json: &str,
    ) -> Result<Saved, StoreError> {
        let next: i64 = match (d.is_final(), d.next_attempt_ms) {
            (false, Some(ms)) => ms as i64,
            _ => -1,
        };
        let mut invocation = SAVE.prepare_invoke();
        invocation
            .arg(self.prefix())
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
        let e = &d.event;
        invocation
            .arg(d.attempted_url().unwrap_or_default())
            .arg(self.event_record(&e.workspace, e.environment, &e.id))
            .arg(event_json);
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

    pub(super) async fn claim_notices(
        &self,
        now_ms: u64,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<PauseNotice>, StoreError> {
        let raws: Vec<String> = CLAIM_NOTICES
            .prepare_invoke()
            .arg(self.prefix())
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
        RETRY_NOTICE
            .prepare_invoke()
            .arg(self.prefix())
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
    fn event_record(&self, workspace: &str, environment: Environment, id: &str) -> String {
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
        // Kept by id alone before session 12: still there for up to 30 days after an upgrade.
        let legacy: Option<Event> = self
            .get_json(&format!("{}:wh:evt:{id}", self.prefix()))
            .await?;
        Ok(legacy.filter(|e| e.workspace == workspace && e.environment == environment))
    }

    /// The key of a workspace's replay index in one environment.
    fn replay_index(&self, workspace: &str, environment: Environment) -> String {
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

/// Reads an event from a log entry. A field the event reads that is there but not UTF-8 makes
/// the entry malformed: taken for absent, a `data` of raw bytes would go out as `{}`.
fn parse(entry: &StreamId) -> Result<Event, String> {
    let not_utf8 = std::cell::OnceCell::new();
    let event = Event::from_log_entry(&entry.id, |name| match entry.map.get(name) {
        Some(redis::Value::BulkString(bytes)) => {
            let text = std::str::from_utf8(bytes).ok();
            if text.is_none() {
                not_utf8.get_or_init(|| name.to_string());
            }
            text
        }
        Some(redis::Value::SimpleString(s)) => Some(s.as_str()),
        _ => None,
    });
    match not_utf8.into_inner() {
        Some(name) => Err(format!("the '{name}' field is not UTF-8")),
        None => event,
    }
}

/// A connection of its own to where the store's connections go now, without a response
/// timeout: for blocking reads.
async fn blocking_connection(
    connections: &Connections,
) -> Result<MultiplexedConnection, StoreError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(None);
    connections
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(unavailable)
}

/// Follows the log from a position, without a group.
struct Tail {
    conn: MultiplexedConnection,
    key: String,
    after: String,
    /// Where the store's connections go, and news of the master moving (Sentinel): the read
    /// goes on from the new master ([`Resume`]). (A failover ends a blocked read on
    /// the old master, but an old master cut off from the Sentinels and still reachable
    /// would otherwise keep it waiting for events that are logged elsewhere.)
    connections: std::sync::Weak<Connections>,
    moved: tokio::sync::watch::Receiver<u64>,
    resume: Resume,
}

/// What a tail needs to read on from a new master without skipping or repeating events.
struct Resume {
    /// Where the tail started: it never reads back past it (its streams see only what is
    /// logged after they opened). The later of the newest entry then and the log's clock
    /// then, less [`RESUME_CLOCK_ALLOWANCE_MS`]: in a quiet log the newest entry may be long
    /// before.
    start: String,
    /// The entries read in the last [`RESUME_MARGIN_MS`] of the log (id, its ms), at most
    /// [`RESUME_REMEMBERED`].
    recent: std::collections::VecDeque<(String, u64)>,
    /// The newest entry let go of for room (in a busy log) rather than age: a read again
    /// after a move starts past it, so nothing is handed out twice.
    forgotten: Option<String>,
    /// After a move, the entries read before it: not handed out again (until the read is
    /// past the furthest it had been).
    again: std::collections::HashSet<String>,
    again_until: (u64, u64),
}

impl Resume {
    /// For a tail that opened after entry `newest`, when the log's clock read `opened_ms`.
    fn new(newest: &str, opened_ms: u64) -> Self {
        let before = clock_floor(opened_ms);
        let start = if opened_ms > RESUME_CLOCK_ALLOWANCE_MS && entry_position(newest) < before {
            format!("{}-{}", before.0, before.1)
        } else {
            newest.to_string()
        };
        Self {
            start,
            recent: std::collections::VecDeque::new(),
            forgotten: None,
            again: std::collections::HashSet::new(),
            again_until: (0, 0),
        }
    }

    /// Keeps `id`, just read, among the entries read in the last [`RESUME_MARGIN_MS`].
    fn read(&mut self, id: &str) {
        let (ms, _) = entry_position(id);
        self.recent.push_back((id.to_string(), ms));
        while self
            .recent
            .front()
            .is_some_and(|(_, old)| old.saturating_add(RESUME_MARGIN_MS) < ms)
        {
            self.recent.pop_front();
        }
        while self.recent.len() > RESUME_REMEMBERED {
            self.forgotten = self.recent.pop_front().map(|(id, _)| id);
        }
    }

    /// On a new master, where a read that was at `after` goes on from: [`RESUME_MARGIN_MS`]
    /// back from the furthest it had been (a second move may come before the read is back
    /// there), but not past where the tail started or the entries it no longer remembers.
    fn restart(&mut self, after: &str) -> String {
        self.again_until = self.again_until.max(entry_position(after));
        self.again = self.recent.iter().map(|(id, _)| id.clone()).collect();
        let from = (self.again_until.0.saturating_sub(RESUME_MARGIN_MS), 0);
        let floor = match &self.forgotten {
            Some(forgotten) if entry_position(forgotten) > entry_position(&self.start) => forgotten,
            _ => &self.start,
        };
        if from <= entry_position(floor) {
            return floor.clone();
        }
        format!("{}-0", from.0)
    }

    /// Whether entry `id` was read before a move, and is read again after it.
    fn read_before(&mut self, id: &str) -> bool {
        if self.again.is_empty() {
            return false;
        }
        if entry_position(id) > self.again_until {
            self.again.clear();
            return false;
        }
        self.again.remove(id)
    }
}

/// Most entries a tail remembers for reading again after a move: in a log busier than this in
/// [`RESUME_MARGIN_MS`], the read again covers less of the margin.
const RESUME_REMEMBERED: usize = 10_000;

/// How far back a tail reads again on a new master. Replicas notice a move each on its own
/// poll of the Sentinels (every second), so in the meantime some log on the new master while
/// this one's position moves on with what is logged on the old: events the new master took
/// in that window would be skipped.
const RESUME_MARGIN_MS: u64 = 5_000;

/// How far a new master's clock may run behind the old one's without a tail skipping what was
/// logged there after it opened: it reads again no further back than this before its opening.
const RESUME_CLOCK_ALLOWANCE_MS: u64 = 500;

/// A stream entry id (`<ms>-<seq>`) as numbers, in the log's order (Redis gives no other).
fn entry_position(id: &str) -> (u64, u64) {
    log_position(id).unwrap_or((0, 0))
}

/// The last position [`RESUME_CLOCK_ALLOWANCE_MS`] before the log's clock read `now_ms`:
/// what is logged from then on comes after it, on this master or a new one whose clock runs
/// up to that much behind.
fn clock_floor(now_ms: u64) -> (u64, u64) {
    let floor_ms = now_ms.saturating_sub(RESUME_CLOCK_ALLOWANCE_MS);
    (floor_ms.saturating_sub(1), u64::MAX)
}

impl Tail {
    /// Reads on from where the store's connections go now, [`RESUME_MARGIN_MS`] back.
    async fn reconnect(&mut self) -> Result<(), StoreError> {
        let connections = self
            .connections
            .upgrade()
            .ok_or_else(|| StoreError::Unavailable("the store is closed".into()))?;
        self.moved.borrow_and_update();
        match blocking_connection(&connections).await {
            Ok(conn) => self.conn = conn,
            Err(e) => {
                // Still to do, if the read goes on.
                self.moved.mark_changed();
                return Err(e);
            }
        }
        self.after = self.resume.restart(&self.after);
        Ok(())
    }
}

#[async_trait]
impl EventFeed for Tail {
    async fn next(&mut self, max: usize, block: Duration) -> Result<Vec<LoggedEvent>, StoreError> {
        if self.moved.has_changed().unwrap_or(false) {
            self.reconnect().await?;
        }
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(&self.after);
        let reply: redis::Value = tokio::select! {
            reply = read.query_async(&mut self.conn) => reply.map_err(unavailable)?,
            Ok(()) = self.moved.changed() => {
                self.reconnect().await?;
                return Ok(Vec::new());
            }
        };
        let mut out = Vec::new();
        for entry in super::streams::read(reply)? {
            self.after.clone_from(&entry.id);
            if self.resume.read_before(&entry.id) {
                continue;
            }
            self.resume.read(&entry.id);
            if let Ok(event) = parse(&entry) {
                out.push(LoggedEvent {
                    position: entry.id,
                    event,
                });
            }
        }
        Ok(out)
    }
}

/// A member of the workers' consumer group.
struct Group {
    conn: MultiplexedConnection,
    key: String,
    cursor: String,
    consumer: String,
    reclaim_after: Duration,
    next_reclaim: Instant,
    next_trim: Instant,
    /// News of the store's connections being replaced (the master moved, or they were
    /// reopened): the group is read through a feed the worker opens again ([`reconnected`]),
    /// from the next call on.
    moved: tokio::sync::watch::Receiver<u64>,
}

/// The error that ends a feed whose connection the store replaced: one to a master the
/// Sentinels no longer name (a failover ends a blocked read on the old master, but one cut off
/// from the Sentinels and still reachable would otherwise be read for events that are logged
/// elsewhere), or one reopened after Redis stopped answering.
fn reconnected() -> StoreError {
    StoreError::Reconnected
}

/// How often a consumer trims the log to its retention. Every writer that goes through the
/// store trims too; this covers entries written by scripts and by backends.
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Removes consumers of the group that have nothing pending and have been idle longer than
/// ARGV[2] ms (workers that are gone: each worker names itself anew when it starts), except
/// ARGV[1]. Atomic, so a consumer that takes an entry meanwhile keeps it. KEYS: the event log.
static DROP_IDLE_CONSUMERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            format!("local GROUP = '{GROUP}'\n").as_str(),
            include_str!("scripts/drop_idle_consumers.lua"),
        ]
        .concat(),
    )
});

impl Group {
    /// Drops consumers of workers that are gone (see [`DROP_IDLE_CONSUMERS`]): idle for more
    /// than four leases, which a live worker, reading every second, never is.
    async fn drop_idle_consumers(&mut self) -> Result<(), StoreError> {
        let idle = self.reclaim_after * 4;
        let dropped: i64 = DROP_IDLE_CONSUMERS
            .key(&self.key)
            .arg(&self.consumer)
            .arg(idle.as_millis() as u64)
            .invoke_async(&mut self.conn)
            .await
            .map_err(unavailable)?;
        if dropped > 0 {
            tracing::info!(
                dropped,
                "removed idle webhook consumers of workers that are gone"
            );
        }
        Ok(())
    }

    /// Drops log entries past the retention window.
    async fn trim(&mut self) -> Result<(), StoreError> {
        let min_id = crate::ids::unix_now().saturating_sub(RETENTION_SECS) * 1000;
        // Exact, not `~`: an approximate trim keeps whole nodes, so a small log would keep
        // expired entries indefinitely. Once a minute, the cost is the entries removed.
        redis::cmd("XTRIM")
            .arg(&self.key)
            .arg("MINID")
            .arg(min_id)
            .query_async::<i64>(&mut self.conn)
            .await
            .map(drop)
            .map_err(unavailable)
    }

    /// Creates the group if it is missing: at the cursor (every entry up to it is fanned out),
    /// if Redis still knows it, else at the start of the log, so nothing logged before any
    /// worker ran is lost. Entries past the cursor that were fanned out already are read again
    /// and queue nothing new.
    async fn create(&mut self) -> Result<(), StoreError> {
        let cursor: Option<String> = self.conn.get(&self.cursor).await.map_err(unavailable)?;
        let start = cursor.unwrap_or_else(|| "0".to_string());
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.key)
            .arg(GROUP)
            .arg(&start)
            .arg("MKSTREAM")
            .query_async(&mut self.conn)
            .await;
        match created {
            Err(e) if e.code() != Some("BUSYGROUP") => Err(unavailable(e)),
            _ => Ok(()),
        }
    }

    /// Takes over entries that another consumer took and did not finish in time.
    async fn reclaim(&mut self, max: usize) -> Result<Vec<StreamId>, StoreError> {
        let mut start = "0-0".to_string();
        let mut out = Vec::new();
        loop {
            let reply: redis::Value = redis::cmd("XAUTOCLAIM")
                .arg(&self.key)
                .arg(GROUP)
                .arg(&self.consumer)
                .arg(self.reclaim_after.as_millis() as u64)
                .arg(&start)
                .arg("COUNT")
                .arg(max)
                .query_async(&mut self.conn)
                .await
                .map_err(unavailable)?;
            let (next, claimed) = super::streams::autoclaim(reply)?;
            out.extend(claimed);
            if out.len() >= max || next == "0-0" {
                return Ok(out);
            }
            start = next;
        }
    }

    /// New entries for this consumer, as Redis sent them; the group created again if Redis
    /// lost it.
    async fn read_or_recreate(
        &mut self,
        max: usize,
        block: Duration,
    ) -> Result<redis::Value, StoreError> {
        match self.read(max, block).await {
            Err(e) if e.code() == Some("NOGROUP") => {
                tracing::warn!("the webhook consumer group was lost; recreating it");
                self.create().await?;
                self.read(max, block).await.map_err(unavailable)
            }
            other => other.map_err(unavailable),
        }
    }

    /// New entries for this consumer, as Redis sent them (read with [`super::streams::read`]).
    async fn read(&mut self, max: usize, block: Duration) -> redis::RedisResult<redis::Value> {
        redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(">")
            .query_async(&mut self.conn)
            .await
    }
}

#[async_trait]
impl EventFeed for Group {
    async fn next(&mut self, max: usize, block: Duration) -> Result<Vec<LoggedEvent>, StoreError> {
        if self.moved.has_changed().unwrap_or(false) {
            return Err(reconnected());
        }
        if Instant::now() >= self.next_trim {
            self.next_trim = Instant::now() + TRIM_EVERY;
            self.trim().await?;
            // Housekeeping: a group Redis lost is recreated by the read below.
            if let Err(e) = self.drop_idle_consumers().await {
                tracing::debug!(error = %e, "could not look for idle webhook consumers");
            }
        }
        let mut entries = Vec::new();
        if Instant::now() >= self.next_reclaim {
            self.next_reclaim =
                Instant::now() + (self.reclaim_after / 4).max(Duration::from_secs(1));
            entries = self.reclaim(max).await?;
            if !entries.is_empty() {
                tracing::warn!(
                    entries = entries.len(),
                    "took over events another worker did not finish"
                );
            }
        }
        if entries.is_empty() {
            // Not cut short by a move (the entries of a read answered meanwhile would wait out
            // a lease, pending under this consumer): the next call sees it, within a `block`.
            let reply = self.read_or_recreate(max, block).await?;
            entries = super::streams::read(reply)?;
        }
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            match parse(&entry) {
                Ok(event) => out.push(LoggedEvent {
                    position: entry.id,
                    event,
                }),
                Err(why) => {
                    tracing::warn!(entry = %entry.id, %why, "skipping a malformed event-log entry");
                    redis::cmd("XACK")
                        .arg(&self.key)
                        .arg(GROUP)
                        .arg(&entry.id)
                        .query_async::<i64>(&mut self.conn)
                        .await
                        .map_err(unavailable)?;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_on_a_new_master_reads_the_margin_again_and_hands_out_only_what_it_missed() {
        let mut resume = Resume::new("500-0", 0);
        for id in ["1000-0", "7000-0", "9000-0", "9000-1"] {
            assert!(!resume.read_before(id));
            resume.read(id);
        }
        // Older than the margin before the newest: forgotten.
        assert_eq!(resume.recent.len(), 3);
        assert_eq!(resume.restart("9000-1"), "4000-0");
        // The new master holds what the old one had, and what other replicas logged on it
        // before this one moved (8000-0), which is handed out.
        let handed: Vec<&str> = ["7000-0", "8000-0", "9000-0", "9000-1", "9500-0"]
            .into_iter()
            .filter(|id| !resume.read_before(id))
            .collect();
        assert_eq!(handed, ["8000-0", "9500-0"]);
        assert!(resume.again.is_empty());
        // Never back past where the tail started: its streams see only what came after.
        assert_eq!(Resume::new("2000-3", 0).restart("3000-5"), "2000-3");
    }

    #[test]
    fn a_tail_that_opened_on_a_quiet_log_reads_again_no_further_back_than_its_opening() {
        // The newest entry was long before the tail opened, at 8000 by the log's clock.
        let mut resume = Resume::new("500-0", 8_000);
        resume.read("9000-0");
        let after = resume.restart("9000-0");
        assert_eq!(after, format!("7499-{}", u64::MAX));
        // What a new master's clock, up to the allowance behind, gives an entry logged after
        // the tail opened is still read.
        assert!(entry_position("7500-0") > entry_position(&after));
        // A newest entry later than that is the start itself.
        assert_eq!(Resume::new("7800-2", 8_000).restart("9000-0"), "7800-2");
    }

    #[test]
    fn a_second_move_before_the_tail_caught_up_hands_out_nothing_twice() {
        let read = |resume: &mut Resume, ids: &[&'static str]| -> Vec<&'static str> {
            let handed: Vec<&str> = ids
                .iter()
                .copied()
                .filter(|id| !resume.read_before(id))
                .collect();
            for id in &handed {
                resume.read(id);
            }
            handed
        };
        for partial in [&[][..], &["7000-0"][..]] {
            let mut resume = Resume::new("500-0", 0);
            read(&mut resume, &["1000-0", "7000-0", "9000-0", "9000-1"]);
            let after = resume.restart("9000-1");
            assert_eq!(after, "4000-0");
            let mut handed = read(&mut resume, partial);
            let at = partial.last().copied().unwrap_or(&after);
            assert_eq!(
                resume.restart(at),
                "4000-0",
                "from the furthest it had been"
            );
            handed.extend(read(
                &mut resume,
                &["7000-0", "8000-0", "9000-0", "9000-1", "9500-0"],
            ));
            assert_eq!(handed, ["8000-0", "9500-0"]);
        }
    }

    #[test]
    fn in_a_busy_log_a_tail_reads_again_only_what_it_remembers() {
        let mut resume = Resume::new("0-0", 0);
        let ids: Vec<String> = (0..RESUME_REMEMBERED + 5)
            .map(|seq| format!("9000-{seq}"))
            .collect();
        for id in &ids {
            resume.read(id);
        }
        let last = ids.last().unwrap();
        // From past the newest entry let go of, all of the rest remembered and not handed out.
        assert_eq!(resume.restart(last), "9000-4");
        assert!(ids[5..].iter().all(|id| resume.read_before(id)));
    }

    fn entry(fields: &[(&str, &[u8])]) -> StreamId {
        StreamId {
            id: "1764115200123-0".into(),
            map: fields
                .iter()
                .map(|(k, v)| (k.to_string(), redis::Value::BulkString(v.to_vec())))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_field_that_is_not_utf8_makes_the_entry_malformed() {
        let good = entry(&[
            ("type", b"image.batch.completed"),
            ("workspace", b"ws_1"),
            ("data", br#"{"batch_id":"b"}"#),
        ]);
        assert_eq!(parse(&good).unwrap().data["batch_id"], "b");
        for (name, bad) in [
            ("data", &b"{\"x\":\"\xff\"}"[..]),
            ("workspace", b"ws_\xfe"),
        ] {
            let mut fields = vec![
                ("type", &b"image.batch.completed"[..]),
                ("workspace", b"ws_1"),
                ("data", b"{}"),
            ];
            fields.retain(|(k, _)| *k != name);
            fields.push((name, bad));
            let why = parse(&entry(&fields)).unwrap_err();
            assert_eq!(why, format!("the '{name}' field is not UTF-8"));
        }
    }
}
