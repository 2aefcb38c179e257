//! The webhook worker: consumes the event log, fans each event out to the endpoints that
//! subscribe to it, and delivers, retries and pauses.
//!
//! Four loops share one [`Worker`]:
//! - **intake** reads the event log in the workers' consumer group and hands each batch to
//!   [`DeliveryQueue::enqueue_deliveries`](super::store::DeliveryQueue::enqueue_deliveries), which stores one delivery per subscribed, active endpoint
//!   and acknowledges the entries in the same step;
//! - **dispatch** claims due deliveries (first attempts and retries alike) within the global and
//!   per-endpoint in-flight caps and each endpoint's share of them ([`Slots`]: endpoints that
//!   fail or answer slowly cannot take every slot), and runs each attempt as a task of its own.
//!   Retries are per endpoint: a failure holds the endpoint's whole queue until its retry is
//!   due, in the store, for every worker ([`AfterAttempt`]), so an endpoint that is down gets
//!   one attempt per step of the schedule and is paused when the schedule ends, whatever its
//!   backlog;
//! - **notices** mails the pause notices the store queues when an endpoint is paused
//!   ([`Notifier`]);
//! - **stats** publishes the queue's depth, its most overdue delivery and paused endpoints.
//!
//! Nothing lives only in this process: an entry is pending in the group until fanned out, a
//! claimed delivery is due again when its lease ends, and so is a claimed pause notice, so a
//! worker killed at any point loses nothing; another worker (or this one restarted) picks the
//! work up. Fanning an entry out twice queues its deliveries once (they are keyed by event and
//! endpoint), so an entry taken over from a worker that was only slow is not delivered twice.

use bytes::Bytes;
use futures_util::future::try_join_all;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};

use super::store::{AfterAttempt, ClaimRequest, ClaimedDelivery, Saved, WorkerStores};
use crate::events::{Event, LoggedEvent};
use crate::ids::{new_id, unix_millis};
use crate::metrics;
use crate::shared::store::StoreError;
use crate::telemetry::{DeliveryAttempt, DeliveryTrace, Tracing};
use crate::webhooks::delivery::{body, Delivery, DeliveryStatus};
use crate::webhooks::endpoint::{Endpoint, EndpointStatus};
use crate::webhooks::mail::Mailer;
use crate::webhooks::notice::{Notifier, PauseNotice};
use crate::webhooks::schedule::{next_wait, random_jitter};
use crate::webhooks::sender::Sender;
use crate::webhooks::slots::{Outcome, Slots};

/// Event data read from the log at once, at most: as many entries as fit if each is as large
/// as an event may be, so a backlog of large events is taken a few MiB at a time rather than
/// growing the process by the whole backlog.
const INTAKE_BYTES: usize = 4 << 20;
/// Most event-log entries read at once (16).
const INTAKE_BATCH: usize = INTAKE_BYTES / crate::events::MAX_EVENT_DATA_BYTES;
/// What one store call queues, at most (each event's data once, each delivery as
/// [`DELIVERY_BYTES`]): many endpoints' deliveries go in parts, not as one script call that
/// would hold Redis up. An event's deliveries go together, whatever they weigh.
const FAN_OUT_PART_BYTES: usize = 8 << 20;
/// About what a delivery's record takes without its payload.
const DELIVERY_BYTES: usize = 1 << 10;
/// Most deliveries claimed at once.
const CLAIM_BATCH: usize = 256;
/// How long intake waits for new entries per read.
const INTAKE_BLOCK: Duration = Duration::from_secs(1);
/// How often dispatch looks for due retries when nothing wakes it.
const DISPATCH_POLL: Duration = Duration::from_millis(250);

/// How the worker behaves (from `[webhooks]`).
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Waits before each retry, counted from the previous failure.
    pub retry_schedule: Vec<Duration>,
    /// An attempt succeeds on a 2xx within this time.
    pub timeout: Duration,
    /// Allow `http://` and internal addresses.
    pub allow_insecure_targets: bool,
    /// Attempts in flight at most.
    pub max_in_flight: usize,
    /// Attempts in flight to one endpoint at most.
    pub max_in_flight_per_endpoint: usize,
    /// The longest `Retry-After` honoured.
    pub max_retry_after: Duration,
    /// Traces each attempt, when `[tracing] otlp_endpoint` is set.
    pub tracing: Option<Tracing>,
}

impl WorkerSettings {
    /// From the configuration.
    pub fn from_config(config: &super::config::WebhooksConfig) -> Self {
        Self {
            retry_schedule: config
                .retry_schedule_seconds
                .iter()
                .map(|s| Duration::from_secs(*s))
                .collect(),
            timeout: Duration::from_secs(config.timeout_seconds),
            allow_insecure_targets: config.allow_insecure_targets,
            max_in_flight: config.max_in_flight,
            max_in_flight_per_endpoint: config.max_in_flight_per_endpoint,
            max_retry_after: Duration::from_secs(config.max_retry_after_seconds),
            tracing: None,
        }
    }

    /// How long a claim or a taken log entry is held before another worker may take it over:
    /// longer than any attempt can last.
    fn lease(&self) -> Duration {
        self.timeout * 2 + Duration::from_secs(1)
    }
}

/// One webhook worker.
pub struct Worker {
    store: WorkerStores,
    sender: Sender,
    /// Mails the admins of workspaces whose endpoints were paused.
    notifier: Arc<Notifier>,
    settings: WorkerSettings,
    /// This worker's name in the consumer group.
    consumer: String,
    /// Attempts in flight, and each endpoint's share of them.
    slots: Mutex<Slots>,
    /// Wakes dispatch: new deliveries were queued, or an attempt ended.
    wake: Notify,
}

impl Worker {
    /// A worker on `store`.
    pub fn new(
        store: WorkerStores,
        settings: WorkerSettings,
        mailer: Mailer,
    ) -> Result<Arc<Self>, String> {
        let sender = Sender::new(settings.timeout, settings.allow_insecure_targets)?;
        let slots = Slots::new(settings.max_in_flight, settings.max_in_flight_per_endpoint);
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_string());
        Ok(Arc::new(Self {
            notifier: Notifier::new(store.clone(), mailer),
            store,
            sender,
            settings,
            slots: Mutex::new(slots),
            consumer: format!("{host}-{}", new_id("w")),
            wake: Notify::new(),
        }))
    }

    /// Runs until `stop` turns true, then lets attempts in flight finish (up to the timeout).
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        metrics::init_webhooks();
        tracing::info!(consumer = %self.consumer, "webhook worker running");
        let intake = tokio::spawn(self.clone().intake());
        let dispatch = tokio::spawn(self.clone().dispatch());
        let notices = tokio::spawn(self.notifier.clone().run());
        let stats = tokio::spawn(self.clone().stats());
        let _ = stop.wait_for(|s| *s).await;
        intake.abort();
        dispatch.abort();
        notices.abort();
        stats.abort();
        let deadline = tokio::time::Instant::now() + self.settings.timeout + Duration::from_secs(1);
        while self.total_in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::info!(
            unfinished = self.total_in_flight(),
            "webhook worker stopped"
        );
    }

    fn total_in_flight(&self) -> usize {
        self.slots().in_flight()
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn intake(self: Arc<Self>) {
        let mut backoff = Backoff::default();
        loop {
            let mut feed = match self
                .store
                .events
                .consume_events(&self.consumer, self.settings.lease())
                .await
            {
                Ok(feed) => feed,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the event log; retrying");
                    backoff.wait().await;
                    continue;
                }
            };
            backoff.reset();
            loop {
                let batch = match feed.next(INTAKE_BATCH, INTAKE_BLOCK).await {
                    Ok(batch) => batch,
                    // Not a failure of the read: the group is read again at once, through the new
                    // connections (a store that does not answer there is backed off from when
                    // the feed opens).
                    Err(StoreError::Reconnected) => {
                        tracing::info!(
                            "the store's connections were replaced; reading the event log again"
                        );
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the event log failed; reconnecting");
                        backoff.wait().await;
                        break;
                    }
                };
                if batch.is_empty() {
                    continue;
                }
                // On failure the entries stay pending in the group and are taken over after the
                // lease, by this worker or another.
                match self.fan_out(&batch).await {
                    Ok(0) => {}
                    Ok(_) => self.wake.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, entries = batch.len(), "could not queue deliveries; they will be retried");
                        backoff.wait().await;
                    }
                }
            }
        }
    }

    /// Queues one delivery per active endpoint that subscribes to each event; answers how many.
    /// Entries are acknowledged with their deliveries, part by part ([`FAN_OUT_PART_BYTES`]):
    /// after a failure, what is not queued stays pending and is taken over after the lease.
    async fn fan_out(&self, batch: &[LoggedEvent]) -> Result<usize, StoreError> {
        // Each workspace's endpoints, read side by side (with Redis, in one round trip).
        let mut workspaces: Vec<&str> = batch.iter().map(|l| l.event.workspace.as_str()).collect();
        workspaces.sort_unstable();
        workspaces.dedup();
        let lists = try_join_all(
            workspaces
                .iter()
                .map(|ws| self.store.deliveries.endpoints(ws)),
        )
        .await?;
        let endpoints: HashMap<&str, Vec<Endpoint>> = workspaces.into_iter().zip(lists).collect();
        // Per event, the endpoints it goes to.
        let subscribers: Vec<Vec<&Endpoint>> = batch
            .iter()
            .map(|LoggedEvent { event, .. }| {
                endpoints[event.workspace.as_str()]
                    .iter()
                    .filter(|e| {
                        e.status == EndpointStatus::Active
                            && e.environment == event.environment
                            && e.wants(&event.event_type)
                    })
                    .collect()
            })
            .collect();
        let weights: Vec<usize> = batch
            .iter()
            .zip(&subscribers)
            .map(|(l, to)| {
                let data = serde_json::to_vec(&l.event.data).map_or(0, |v| v.len());
                data.saturating_add(to.len().saturating_mul(DELIVERY_BYTES))
            })
            .collect();
        let now_ms = unix_millis();
        let mut queued = 0;
        for part in parts_by_weight(&weights, FAN_OUT_PART_BYTES) {
            let entries = &batch[part.clone()];
            let deliveries: Vec<Delivery> = entries
                .iter()
                .zip(&subscribers[part])
                .filter(|(_, to)| !to.is_empty())
                .flat_map(|(LoggedEvent { event, .. }, to)| {
                    let shared = Arc::new(event.clone());
                    to.iter()
                        .map(move |e| Delivery::fanned_out(&shared, &e.workspace, &e.id, now_ms))
                })
                .collect();
            let positions: Vec<String> = entries.iter().map(|l| l.position.clone()).collect();
            let events: Vec<_> = entries.iter().map(|l| &l.event).collect();
            self.store
                .deliveries
                .enqueue_deliveries(&positions, &events, &deliveries)
                .await?;
            queued += deliveries.len();
        }
        Ok(queued)
    }

    async fn dispatch(self: Arc<Self>) {
        let mut backoff = Backoff::default();
        loop {
            let claimed = match self.claim().await {
                Ok(claimed) => {
                    backoff.reset();
                    claimed
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim deliveries; retrying");
                    backoff.wait().await;
                    continue;
                }
            };
            let full = claimed.len() == CLAIM_BATCH;
            self.start_attempts(claimed);
            if !full {
                let _ = tokio::time::timeout(DISPATCH_POLL, self.wake.notified()).await;
            }
        }
    }

    /// Claims what fits under the caps and each endpoint's share, and counts it in flight.
    async fn claim(&self) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let limits = self.slots().claim_limits();
        if limits.room == 0 {
            return Ok(Vec::new());
        }
        let busy: Vec<(&str, usize)> = limits.busy.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let struggling: Vec<&str> = limits.struggling.iter().map(String::as_str).collect();
        let claimed = self
            .store
            .deliveries
            .claim_deliveries(&ClaimRequest {
                now_ms: unix_millis(),
                lease: self.settings.lease(),
                max: limits.room.min(CLAIM_BATCH),
                per_endpoint: self.settings.max_in_flight_per_endpoint,
                busy: &busy,
                struggling: &struggling,
                struggling_max: limits.struggling_room,
            })
            .await?;
        let mut slots = self.slots();
        for c in &claimed {
            slots.take_marked(&c.delivery.endpoint, c.failures > 0);
        }
        Ok(claimed)
    }

    /// Starts an attempt of each claimed delivery, each a task of its own. The attempts of one
    /// event share its body, serialized once (the map holds each event, so no two of them have
    /// the same address meanwhile).
    fn start_attempts(self: &Arc<Self>, claimed: Vec<ClaimedDelivery>) {
        let mut bodies: HashMap<*const Event, (Arc<Event>, Bytes)> = HashMap::new();
        for c in claimed {
            let event = &c.delivery.event;
            let (_, payload) = bodies
                .entry(Arc::as_ptr(event))
                .or_insert_with(|| (Arc::clone(event), Bytes::from(body(event))));
            let payload = payload.clone();
            tokio::spawn(self.clone().attempt(c, payload));
        }
    }

    /// One attempt (or a skip) with `payload`, the body of the delivery's event; saved; then
    /// the slot is freed.
    async fn attempt(self: Arc<Self>, claimed: ClaimedDelivery, payload: Bytes) {
        let ClaimedDelivery {
            mut delivery,
            endpoint,
            failures,
        } = claimed;
        let endpoint_id = delivery.endpoint.clone();
        let now_ms = unix_millis();
        // A failure, as it was before it was counted: if the endpoint's URL changed while the
        // attempt was on its way, or it was resumed, the store refuses to count it, and it is
        // saved as due now.
        let mut superseded = None;
        let mut gone = false;
        let (mut outcome, took, mut share) = match &endpoint {
            None => {
                delivery.skip("the endpoint was deleted", now_ms);
                ("skipped", None, Outcome::Gone)
            }
            Some(e) if !e.is_active() => {
                let why = format!("the endpoint is {}", e.status.as_str());
                delivery.skip(&why, now_ms);
                ("skipped", None, Outcome::Gone)
            }
            Some(e) if !self.within_rate(e, now_ms).await => {
                // Over the endpoint's rate limit: the next second, unattempted.
                delivery.defer((now_ms / 1000 + 1) * 1000);
                ("rate_limited", None, Outcome::Answered)
            }
            Some(e) => {
                let trace = self.settings.tracing.as_ref().map(|t| {
                    t.delivery(DeliveryAttempt {
                        event_id: &delivery.event.id,
                        event_type: &delivery.event.event_type,
                        endpoint_id: &endpoint_id,
                        workspace: &delivery.workspace,
                        attempt: delivery.attempts + 1,
                        traceparent: delivery.event.traceparent.as_deref(),
                    })
                });
                let headers = trace
                    .as_ref()
                    .map(DeliveryTrace::headers)
                    .unwrap_or_default();
                let attempt = self
                    .sender
                    .send(e, &delivery.event.id, payload, &headers)
                    .await;
                if let Some(trace) = trace {
                    trace.end(attempt.status_code, attempt.error.is_some());
                }
                let took = Duration::from_millis(attempt.duration_ms);
                if attempt.error.is_none() {
                    delivery.succeed(attempt);
                    let lag = unix_millis().saturating_sub(delivery.created_ms);
                    metrics::record_delivery_lag(Duration::from_millis(lag));
                    let share = match took > self.settings.timeout / 2 {
                        true => Outcome::Slow,
                        false => Outcome::Answered,
                    };
                    ("succeeded", Some(took), share)
                } else {
                    let mut retry_now = delivery.clone();
                    retry_now.fail_to_a_changed_endpoint(attempt.clone());
                    superseded = Some(retry_now);
                    // 410 Gone: the receiver says it is gone for good; no retry.
                    gone = attempt.status_code == Some(410);
                    let wait = match gone {
                        true => None,
                        false => next_wait(
                            &self.settings.retry_schedule,
                            failures,
                            attempt.retry_after,
                            self.settings.max_retry_after,
                            random_jitter(),
                        ),
                    };
                    match delivery.fail_after(attempt, wait) {
                        true => ("failed_final", Some(took), Outcome::Failed),
                        false => ("failed_retrying", Some(took), Outcome::Failed),
                    }
                }
            }
        };
        // Queued with the pause, in the same step, so the admins are told whatever happens to
        // this process or to the mail relay afterwards.
        let notice = (delivery.status == DeliveryStatus::Failed).then(|| {
            let mut notice = PauseNotice::new(&delivery, unix_millis());
            notice.disabled = gone;
            notice
        });
        let after = match (&notice, delivery.status) {
            _ if outcome == "rate_limited" => AfterAttempt::Skipped,
            (Some(notice), _) => AfterAttempt::Pause(notice, failures + 1),
            (None, DeliveryStatus::Succeeded) => AfterAttempt::Answered,
            (None, DeliveryStatus::Pending) => AfterAttempt::Failing(failures + 1),
            (None, _) => AfterAttempt::Skipped,
        };
        let mut saved = self.save(&delivery, after).await;
        if let (Ok(Saved::Superseded), Some(retry_now)) = (&saved, superseded) {
            // Fixed (a new URL) or resumed while the attempt was on its way: the endpoint as it
            // is now has not failed.
            (outcome, share) = ("superseded", Outcome::Superseded);
            saved = self.save(&retry_now, AfterAttempt::Skipped).await;
        }
        metrics::record_delivery(outcome, took);
        match saved {
            Ok(Saved::Paused) => {
                share = Outcome::Gone;
                match gone {
                    true => tracing::warn!(
                        endpoint = %delivery.endpoint,
                        workspace = %delivery.workspace,
                        "the receiver answered 410 Gone; endpoint disabled; its admins will be e-mailed"
                    ),
                    false => tracing::warn!(
                        endpoint = %delivery.endpoint,
                        workspace = %delivery.workspace,
                        "every retry failed; endpoint paused; its admins will be e-mailed"
                    ),
                }
                self.notifier.wake();
            }
            Ok(Saved::Done | Saved::Superseded) => {}
            Err(e) => tracing::error!(
                error = %e,
                delivery = %delivery.id,
                "could not save a delivery; it will be attempted again when its lease ends"
            ),
        }
        self.slots().free(&endpoint_id, share);
        self.wake.notify_one();
    }

    /// Whether `endpoint` may get a delivery now under its rate limit, across workers. A store
    /// that cannot count lets it go: the limit protects the receiver, not svcgate.
    async fn within_rate(&self, endpoint: &Endpoint, now_ms: u64) -> bool {
        let Some(limit) = endpoint.rate_limit_per_second else {
            return true;
        };
        self.store
            .deliveries
            .take_rate_slot(&endpoint.id, limit, now_ms)
            .await
            .unwrap_or(true)
    }

    /// Saves a delivery, retrying while the store is briefly away (within the lease).
    async fn save(
        &self,
        delivery: &Delivery,
        after: AfterAttempt<'_>,
    ) -> Result<Saved, StoreError> {
        let mut backoff = Backoff::default();
        let deadline = tokio::time::Instant::now() + self.settings.lease() / 2;
        loop {
            match self.store.deliveries.save_delivery(delivery, after).await {
                Ok(paused) => return Ok(paused),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => backoff.wait().await,
            }
        }
    }

    async fn stats(self: Arc<Self>) {
        loop {
            if let Ok(stats) = self.store.deliveries.queue_stats().await {
                let overdue = stats
                    .oldest_due_ms
                    .map(|due| unix_millis().saturating_sub(due))
                    .unwrap_or(0);
                metrics::record_webhook_queue(
                    stats.pending,
                    Duration::from_millis(overdue),
                    stats.paused_endpoints,
                    self.total_in_flight(),
                );
                metrics::record_pause_notices(stats.pause_notices);
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}

/// Exponential backoff between tries at the store, 100 ms to 5 s.
#[derive(Default)]
pub(crate) struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    /// Sleeps, each time twice as long as before.
    pub(crate) async fn wait(&mut self) {
        let wait = self.next.unwrap_or(Duration::from_millis(100));
        self.next = Some((wait * 2).min(Duration::from_secs(5)));
        tokio::time::sleep(wait).await;
    }

    /// Starts again from the shortest wait.
    pub(crate) fn reset(&mut self) {
        self.next = None;
    }
}

/// Consecutive ranges of `weights`, each weighing at most `max` unless one item alone does.
fn parts_by_weight(weights: &[usize], max: usize) -> Vec<std::ops::Range<usize>> {
    let mut parts = Vec::new();
    let (mut start, mut sum) = (0, 0usize);
    for (i, &w) in weights.iter().enumerate() {
        if i > start && sum.saturating_add(w) > max {
            parts.push(start..i);
            (start, sum) = (i, 0);
        }
        sum = sum.saturating_add(w);
    }
    if start < weights.len() {
        parts.push(start..weights.len());
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fan_out_goes_in_parts_of_bounded_weight() {
        assert_eq!(
            parts_by_weight(&[], 10),
            Vec::<std::ops::Range<usize>>::new()
        );
        assert_eq!(parts_by_weight(&[3, 3, 3, 3], 10), [0..3, 3..4]);
        // One item over the bound goes alone; nothing is left out.
        assert_eq!(parts_by_weight(&[2, 25, 1, 9, 0], 10), [0..1, 1..2, 2..5]);
        assert_eq!(
            parts_by_weight(&[0, 0], 0),
            vec![std::ops::Range { start: 0, end: 2 }]
        );
    }
}
