//! The event log and the webhook delivery queue in process memory: the same behaviour as the
//! Redis layout (one consumer group, leases, per-endpoint caps), for a single process.

use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

use super::{Inner, MemoryStore};
use crate::events::{Event, LoggedEvent, RETENTION_SECS};
use crate::ids::unix_now;
use crate::keys::Environment;
use crate::store::{
    AfterAttempt, ClaimRequest, ClaimedDelivery, EndpointRetry, EventFeed, QueueStats, StoreError,
};
use crate::webhooks::delivery::{Delivery, DeliverySummary, DELIVERIES_LISTED};
use crate::webhooks::endpoint::{Endpoint, EndpointStatus};
use crate::webhooks::notice::PauseNotice;

/// Events, deliveries and their schedule.
#[derive(Default)]
pub(super) struct WebhookState {
    /// `(sequence number, event)`, oldest first; positions are the sequence numbers.
    log: VecDeque<(u64, Event)>,
    next_seq: u64,
    /// The consumer group: the next sequence number to hand out, and entries handed out but
    /// not yet fanned out, with when.
    group_next: u64,
    group_pending: BTreeMap<u64, Instant>,
    /// Events fanned out, by workspace, environment and id, for replay.
    by_id: HashMap<(String, Environment, String), Event>,
    deliveries: HashMap<String, Delivery>,
    /// Queued delivery ids and when they are due (ms; a claimed one: its lease's end).
    due: HashMap<String, u64>,
    /// Delivery ids per endpoint, newest first.
    listed: HashMap<String, VecDeque<String>>,
    /// Pause notices by id, with when each is due (ms; a claimed one: its lease's end).
    notices: HashMap<String, (PauseNotice, u64)>,
    /// Endpoints held back by a failure, by id.
    holds: HashMap<String, Hold>,
    /// Deliveries per rate-limited endpoint in the current second: `(second, count)`.
    rates: HashMap<String, (u64, u32)>,
}

/// An endpoint held back by a failure (see [`AfterAttempt::Failing`]).
#[derive(Debug)]
struct Hold {
    /// The endpoint's workspace.
    workspace: String,
    /// Failed attempts in a row.
    failures: u32,
    /// Nothing of the endpoint's queue is due before this (ms).
    until: u64,
    /// The delivery that goes first when it is.
    probe: String,
}

impl WebhookState {
    /// Appends an event to the log, dropping what is past retention.
    pub(super) fn log(&mut self, event: Event) {
        let oldest = unix_now().saturating_sub(RETENTION_SECS);
        while self.log.front().is_some_and(|(_, e)| e.created < oldest) {
            self.log.pop_front();
        }
        self.by_id.retain(|_, e| e.created >= oldest);
        self.log.push_back((self.next_seq, event));
        self.next_seq += 1;
    }

    /// Every logged event, oldest first.
    pub(super) fn events(&self) -> impl Iterator<Item = &Event> {
        self.log.iter().map(|(_, e)| e)
    }

    /// Every event a worker has taken from the log (what replays read), in no order.
    pub(super) fn replayable(&self) -> impl Iterator<Item = &Event> {
        self.by_id.values()
    }

    fn after(&self, seq: u64, max: usize) -> Vec<LoggedEvent> {
        self.log
            .iter()
            .filter(|(s, _)| *s >= seq)
            .take(max)
            .map(|(s, e)| LoggedEvent {
                position: s.to_string(),
                event: e.clone(),
            })
            .collect()
    }

    pub(super) fn enqueue(
        &mut self,
        entries: &[String],
        events: &[&Event],
        deliveries: &[Delivery],
    ) {
        for entry in entries {
            if let Ok(seq) = entry.parse() {
                self.group_pending.remove(&seq);
            }
        }
        for event in events {
            let key = (event.workspace.clone(), event.environment, event.id.clone());
            self.by_id.insert(key, Event::clone(event));
        }
        for d in deliveries {
            // An entry fanned out again (taken over from a worker that was only slow) keys its
            // deliveries as before: they are queued once.
            if self.deliveries.contains_key(&d.id) {
                continue;
            }
            self.due
                .insert(d.id.clone(), d.next_attempt_ms.unwrap_or(0));
            let listed = self.listed.entry(d.endpoint.clone()).or_default();
            listed.push_front(d.id.clone());
            if listed.len() > DELIVERIES_LISTED {
                if let Some(old) = listed.pop_back() {
                    if !self.due.contains_key(&old) {
                        self.deliveries.remove(&old);
                    }
                }
            }
            self.deliveries.insert(d.id.clone(), d.clone());
        }
    }

    pub(super) fn claim(
        &mut self,
        request: &ClaimRequest<'_>,
        endpoints: &HashMap<String, Vec<Endpoint>>,
    ) -> Vec<ClaimedDelivery> {
        let now = request.now_ms;
        let lease_end = now + request.lease.as_millis() as u64;
        let find = |workspace: &str, id: &str| {
            endpoints
                .get(workspace)
                .and_then(|list| list.iter().find(|e| e.id == id))
        };
        // Holds on endpoints that are paused or gone are dropped: their queues are skipped.
        self.holds.retain(|id, hold| {
            find(&hold.workspace, id).is_some_and(|e| e.status == EndpointStatus::Active)
        });
        let mut queued: Vec<(u64, &String)> = self
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, at)| (*at, id))
            .collect();
        queued.sort();
        let mut in_flight: HashMap<&str, usize> = request.busy.iter().copied().collect();
        let mut struggling_left = request.struggling_max;
        let mut taken = Vec::new();
        for (_, id) in queued {
            if taken.len() == request.max {
                break;
            }
            let Some(d) = self.deliveries.get(id) else {
                continue;
            };
            let hold = self.holds.get_mut(&d.endpoint);
            if let Some(hold) = &hold {
                let probe_due = self.due.get(&hold.probe).is_some_and(|at| *at <= now);
                if hold.until > now || (probe_due && hold.probe != d.id) {
                    continue;
                }
            }
            let struggling = hold.is_some() || request.struggling.contains(&d.endpoint.as_str());
            let n = in_flight.entry(d.endpoint.as_str()).or_default();
            if *n >= request.per_endpoint || (struggling && struggling_left == 0) {
                continue;
            }
            *n += 1;
            if struggling {
                struggling_left -= 1;
            }
            let failures = match hold {
                Some(hold) => {
                    (hold.until, hold.probe) = (lease_end, d.id.clone());
                    hold.failures
                }
                None => 0,
            };
            taken.push(ClaimedDelivery {
                delivery: d.clone(),
                endpoint: find(&d.workspace, &d.endpoint).cloned(),
                failures,
            });
        }
        for c in &taken {
            self.due.insert(c.delivery.id.clone(), lease_end);
        }
        taken
    }

    /// Whether `endpoint` is held with delivery `id` as its probe (a claim under a hold makes
    /// the claimed delivery the probe).
    pub(super) fn is_probe(&self, endpoint: &str, id: &str) -> bool {
        self.holds.get(endpoint).is_some_and(|h| h.probe == id)
    }

    /// Whether `d` is saved as it is.
    pub(super) fn is_saved_as(&self, d: &Delivery) -> bool {
        self.deliveries.get(&d.id) == Some(d)
    }

    /// Saves `d` after an attempt; `active`: its endpoint is (a failure holds only those).
    pub(super) fn save(&mut self, d: &Delivery, after: AfterAttempt<'_>, active: bool) {
        match (d.is_final(), d.next_attempt_ms) {
            (false, Some(ms)) => self.due.insert(d.id.clone(), ms),
            _ => self.due.remove(&d.id),
        };
        self.deliveries.insert(d.id.clone(), d.clone());
        match after {
            AfterAttempt::Answered | AfterAttempt::Pause(..) => {
                self.holds.remove(&d.endpoint);
            }
            AfterAttempt::Failing(failures) if active => {
                // A later step, or the probe itself again: an attempt that was in flight
                // alongside it changes nothing.
                let (held, probe) = self
                    .holds
                    .get(&d.endpoint)
                    .map_or((0, None), |h| (h.failures, Some(&h.probe)));
                if failures > held || (failures == held && probe == Some(&d.id)) {
                    let hold = Hold {
                        workspace: d.workspace.clone(),
                        failures,
                        until: d.next_attempt_ms.unwrap_or(0),
                        probe: d.id.clone(),
                    };
                    self.holds.insert(d.endpoint.clone(), hold);
                }
            }
            AfterAttempt::Failing(_) | AfterAttempt::Skipped => {}
        }
    }

    /// Whether `endpoint` is held back by a failure, and until when.
    pub(super) fn retry_of(&self, endpoint: &str) -> Option<EndpointRetry> {
        self.holds.get(endpoint).map(|h| EndpointRetry {
            failures: h.failures,
            next_attempt_ms: h.until,
        })
    }

    /// Deliveries to `endpoint` queued.
    pub(super) fn queued(&self, endpoint: &str) -> u64 {
        self.due
            .keys()
            .filter(|id| {
                self.deliveries
                    .get(*id)
                    .is_some_and(|d| d.endpoint == endpoint)
            })
            .count() as u64
    }

    /// Forgets an endpoint's hold (it was deleted).
    pub(super) fn release(&mut self, endpoint: &str) {
        self.holds.remove(endpoint);
    }

    /// Takes one of `limit` delivery slots of `endpoint` in `second`; whether it could.
    pub(super) fn take_rate_slot(&mut self, endpoint: &str, limit: u32, second: u64) -> bool {
        self.rates.retain(|_, (s, _)| *s >= second);
        let (at, count) = self
            .rates
            .entry(endpoint.to_string())
            .or_insert((second, 0));
        if *at != second {
            (*at, *count) = (second, 0);
        }
        *count += 1;
        *count <= limit
    }

    /// Starts an endpoint afresh (its URL changed, or it was resumed): its hold goes, and the
    /// delivery that failed, if it waits for its retry, is due at `now_ms` (one out on an
    /// attempt, due at its lease's end, is left to it).
    pub(super) fn restart(&mut self, endpoint: &str, now_ms: u64) {
        let Some(hold) = self.holds.remove(endpoint) else {
            return;
        };
        let retry_at = self
            .deliveries
            .get(&hold.probe)
            .and_then(|d| d.next_attempt_ms);
        if let Some(due) = self.due.get_mut(&hold.probe) {
            if Some(*due) == retry_at && *due > now_ms {
                *due = now_ms;
            }
        }
    }

    pub(super) fn queue_notice(&mut self, notice: &PauseNotice) {
        let due = notice.paused_ms;
        self.notices
            .insert(notice.id.clone(), (notice.clone(), due));
    }

    pub(super) fn claim_notices(
        &mut self,
        now_ms: u64,
        lease: Duration,
        max: usize,
    ) -> Vec<PauseNotice> {
        let mut due: Vec<(u64, &String)> = self
            .notices
            .iter()
            .filter(|(_, (_, at))| *at <= now_ms)
            .map(|(id, (_, at))| (*at, id))
            .collect();
        due.sort();
        let ids: Vec<String> = due
            .into_iter()
            .take(max)
            .map(|(_, id)| id.clone())
            .collect();
        let lease_end = now_ms + lease.as_millis() as u64;
        let mut claimed = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some((notice, at)) = self.notices.get_mut(&id) {
                *at = lease_end;
                claimed.push(notice.clone());
            }
        }
        claimed
    }

    pub(super) fn retry_notice(&mut self, notice: &PauseNotice, due_ms: u64) {
        if let Some(queued) = self.notices.get_mut(&notice.id) {
            *queued = (notice.clone(), due_ms);
        }
    }

    pub(super) fn remove_notice(&mut self, id: &str) {
        self.notices.remove(id);
    }

    pub(super) fn deliveries(&self, endpoint: &str, limit: usize) -> Vec<DeliverySummary> {
        self.listed
            .get(endpoint)
            .into_iter()
            .flatten()
            .filter_map(|id| self.deliveries.get(id))
            .take(limit)
            .map(DeliverySummary::from)
            .collect()
    }

    pub(super) fn event(
        &self,
        workspace: &str,
        environment: Environment,
        id: &str,
    ) -> Option<Event> {
        let key = (workspace.to_string(), environment, id.to_string());
        self.by_id.get(&key).cloned()
    }

    pub(super) fn stats(&self) -> QueueStats {
        QueueStats {
            pending: self.due.len() as u64,
            oldest_due_ms: self
                .due
                .iter()
                .map(|(id, at)| {
                    let held = self
                        .deliveries
                        .get(id)
                        .and_then(|d| self.holds.get(&d.endpoint));
                    held.map_or(*at, |h| h.until.max(*at))
                })
                .min(),
            paused_endpoints: 0,
            pause_notices: self.notices.len() as u64,
        }
    }
}

impl MemoryStore {
    pub(super) fn tail(&self) -> Box<dyn EventFeed> {
        let after = self.read().webhooks.next_seq;
        Box::new(Feed {
            inner: self.inner.clone(),
            logged: self.logged.clone(),
            mode: Mode::Tail { next: after },
        })
    }

    /// The newest event's position, if any: what is logged from now on comes after it.
    pub(super) fn log_floor(&self) -> Option<String> {
        let next = self.read().webhooks.next_seq;
        next.checked_sub(1).map(|last| last.to_string())
    }

    pub(super) fn consume(&self, reclaim_after: Duration) -> Box<dyn EventFeed> {
        Box::new(Feed {
            inner: self.inner.clone(),
            logged: self.logged.clone(),
            mode: Mode::Group { reclaim_after },
        })
    }
}

enum Mode {
    Tail { next: u64 },
    Group { reclaim_after: Duration },
}

struct Feed {
    inner: Arc<RwLock<Inner>>,
    logged: Arc<Notify>,
    mode: Mode,
}

impl Feed {
    fn take(&mut self, max: usize) -> Vec<LoggedEvent> {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let state = &mut inner.webhooks;
        match &mut self.mode {
            Mode::Tail { next } => {
                let events = state.after(*next, max);
                if let Some(last) = events.last() {
                    *next = last.position.parse::<u64>().unwrap_or(*next) + 1;
                }
                events
            }
            Mode::Group { reclaim_after } => {
                let now = Instant::now();
                let stale: Vec<u64> = state
                    .group_pending
                    .iter()
                    .filter(|(_, at)| now.duration_since(**at) >= *reclaim_after)
                    .map(|(seq, _)| *seq)
                    .take(max)
                    .collect();
                let mut events: Vec<LoggedEvent> = stale
                    .iter()
                    .filter_map(|seq| state.after(*seq, 1).into_iter().next())
                    .filter(|e| stale.contains(&e.position.parse().unwrap_or(u64::MAX)))
                    .collect();
                if events.is_empty() {
                    events = state.after(state.group_next, max);
                    if let Some(last) = events.last() {
                        state.group_next = last.position.parse::<u64>().unwrap_or(0) + 1;
                    }
                }
                for e in &events {
                    if let Ok(seq) = e.position.parse() {
                        state.group_pending.insert(seq, now);
                    }
                }
                events
            }
        }
    }
}

#[async_trait]
impl EventFeed for Feed {
    async fn next(&mut self, max: usize, block: Duration) -> Result<Vec<LoggedEvent>, StoreError> {
        let deadline = tokio::time::Instant::now() + block;
        loop {
            let logged = self.logged.clone();
            let notified = logged.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let events = self.take(max);
            if !events.is_empty() {
                return Ok(events);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }
}
