//! The storage webhooks need: the event log, the delivery queue with its endpoints, the pause
//! notices owed to admins, and the slots of `svcgate listen` streams.

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

use super::delivery::{Delivery, DeliverySummary};
use super::endpoint::Endpoint;
use super::notice::PauseNotice;
use crate::events::{Event, LoggedEvent};
use crate::keys::store::KeyStore;
use crate::keys::Environment;
use crate::shared::store::StoreError;

/// The error for a workspace that has `most` webhook endpoints in `endpoint`'s environment
/// and is given another.
pub fn too_many_endpoints(endpoint: &Endpoint, most: usize) -> StoreError {
    StoreError::Conflict(format!(
        "workspace {} has {most} {} webhook endpoints, the most it may have; delete one first",
        endpoint.workspace,
        endpoint.environment.as_str()
    ))
}

/// A change applied to an endpoint; like [`KeyChange`](crate::keys::store::KeyChange), it may run more than once.
pub type EndpointChange<'a> = &'a (dyn Fn(&mut Endpoint) + Send + Sync);

/// A reader of the event log with a connection of its own (its reads may block).
#[async_trait]
pub trait EventFeed: Send {
    /// The next events, oldest first, at most `max`; waits up to `block` while there are none.
    async fn next(&mut self, max: usize, block: Duration) -> Result<Vec<LoggedEvent>, StoreError>;
}

/// A delivery claimed by a worker, with its endpoint as it is now (`None`: deleted).
#[derive(Debug, Clone)]
pub struct ClaimedDelivery {
    /// The delivery.
    pub delivery: Delivery,
    /// Its endpoint.
    pub endpoint: Option<Endpoint>,
    /// The endpoint's failed attempts in a row before this claim (0: its last attempt
    /// answered, or it has had none). The retry schedule is the endpoint's: the next failure
    /// waits `retry_schedule[failures]`, and one past the schedule pauses it.
    pub failures: u32,
}

/// A page of a workspace's events ([`DeliveryQueue::events_since`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventPage {
    /// The events, in (created, id) order. An event whose record expired is left out.
    pub events: Vec<Event>,
    /// Where the next page starts, `(since, after)`, when this one was cut at `max`.
    pub next: Option<(u64, String)>,
}

/// An endpoint held back by a failure ([`AfterAttempt::Failing`]), as its APIs show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointRetry {
    /// Failed attempts in a row.
    pub failures: u32,
    /// Nothing of its queue goes before this (unix milliseconds); a retry in flight holds it
    /// to the end of its lease.
    pub next_attempt_ms: u64,
}

/// What [`DeliveryQueue::save_delivery`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// The delivery is saved.
    Done,
    /// Saved, and this call paused the endpoint (and queued the notice).
    Paused,
    /// Nothing saved: the failure went to a URL the endpoint no longer has, so it says nothing
    /// of the endpoint; the caller saves the delivery again as due now.
    Superseded,
}

/// What a saved attempt tells the store about its endpoint ([`DeliveryQueue::save_delivery`]).
///
/// Retries are per endpoint: a failed attempt holds the endpoint's whole queue back until the
/// retry is due, and then that delivery goes first and alone (the probe); an answer releases
/// the queue. So an endpoint that is down gets one attempt per step of the schedule, whatever
/// its backlog, and is paused when the schedule ends, on time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AfterAttempt<'a> {
    /// Nothing was sent (the endpoint is paused or gone): it is left as it is.
    Skipped,
    /// The endpoint answered: its queue is released.
    Answered,
    /// The endpoint has failed this many attempts in a row: nothing of its queue is claimed
    /// before the delivery's `next_attempt_ms`, and then the delivery first, alone.
    Failing(u32),
    /// Every retry failed (this many in a row): the endpoint is paused and, if this paused it,
    /// `notice` is queued for its admins.
    Pause(&'a PauseNotice, u32),
}

/// What [`DeliveryQueue::claim_deliveries`] may take.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// Now, in unix milliseconds: deliveries due by then are taken.
    pub now_ms: u64,
    /// How long a claim holds: after it, the delivery is due again (its worker died).
    pub lease: Duration,
    /// Most deliveries to take.
    pub max: usize,
    /// Most deliveries in flight per endpoint, counting `busy`.
    pub per_endpoint: usize,
    /// Deliveries this worker has in flight per endpoint id.
    pub busy: &'a [(&'a str, usize)],
    /// Endpoints whose deliveries count against `struggling_max`.
    pub struggling: &'a [&'a str],
    /// Most deliveries to take, in all, to the `struggling` endpoints.
    pub struggling_max: usize,
}

/// The delivery queue at a glance, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Deliveries waiting for an attempt (first or retry), or in flight.
    pub pending: u64,
    /// When the earliest pending delivery was due (unix milliseconds).
    pub oldest_due_ms: Option<u64>,
    /// Endpoints paused after failing every retry, or disabled after a 410 Gone.
    pub paused_endpoints: u64,
    /// Pause notices not yet mailed to the admins.
    pub pause_notices: u64,
}

/// The event log: every event, kept 30 days, read by the webhook workers and `svcgate listen`.
#[async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Appends an event to the event log (kept 30 days).
    async fn append_event(&self, event: &Event) -> Result<(), StoreError>;

    /// Follows the event log from now on (`svcgate listen`).
    async fn tail_events(&self) -> Result<Box<dyn EventFeed>, StoreError>;

    /// A position in the event log that everything logged from now on comes after
    /// ([`crate::events::log_position`] compares them), or `None` if nothing was ever logged:
    /// what a `svcgate listen` stream gets starts after it. With Redis it is read from the
    /// log's clock, less half a second for two masters' clocks differing, so it also holds for
    /// a new master the gateway has not noticed yet.
    async fn event_log_floor(&self) -> Result<Option<String>, StoreError>;

    /// Consumes the event log as `consumer` of the webhook workers' group, which it creates if
    /// it is missing: entries no worker has taken, and entries a worker took but did not hand
    /// to [`DeliveryQueue::enqueue_deliveries`] within `reclaim_after` (it died).
    async fn consume_events(
        &self,
        consumer: &str,
        reclaim_after: Duration,
    ) -> Result<Box<dyn EventFeed>, StoreError>;
}

/// Webhook endpoints, their queued deliveries and the events those deliveries carry.
#[async_trait]
pub trait DeliveryQueue: Send + Sync + 'static {
    /// Stores a new webhook endpoint, unless its workspace has `most` already in its
    /// environment (a [`StoreError::Conflict`] saying so).
    async fn create_endpoint(&self, endpoint: &Endpoint, most: usize) -> Result<(), StoreError>;

    /// The endpoints of a workspace, oldest first.
    async fn endpoints(&self, workspace: &str) -> Result<Vec<Endpoint>, StoreError>;

    /// Applies `change` to an endpoint atomically; `None` if there is no such endpoint. The id,
    /// workspace and environment never change.
    async fn update_endpoint(
        &self,
        workspace: &str,
        id: &str,
        change: EndpointChange<'_>,
    ) -> Result<Option<Endpoint>, StoreError>;

    /// How many deliveries to `endpoint` are queued (due, waiting for a retry or out on an
    /// attempt).
    async fn queued_deliveries(&self, endpoint: &str) -> Result<u64, StoreError>;

    /// Makes an endpoint active and starts it afresh, whatever it was: a retry that a failure
    /// held it back for goes now, and so does its queue. `None` if there is no such endpoint.
    async fn resume_endpoint(
        &self,
        workspace: &str,
        id: &str,
    ) -> Result<Option<Endpoint>, StoreError>;

    /// Deletes an endpoint; whether it existed.
    async fn delete_endpoint(&self, workspace: &str, id: &str) -> Result<bool, StoreError>;

    /// Stores new deliveries, due at their `next_attempt_ms`, keeps `events` (for replay, and
    /// for the payload of their deliveries, which may be kept once per event rather than once
    /// per delivery: every delivery's event should be among them), and marks the event-log
    /// `entries` they came from as consumed; atomically. A delivery whose id is stored already
    /// (its entry was fanned out before) is left as it is.
    async fn enqueue_deliveries(
        &self,
        entries: &[String],
        events: &[&Event],
        deliveries: &[Delivery],
    ) -> Result<(), StoreError>;

    /// Claims due deliveries for one lease, oldest first per endpoint, never more than
    /// `per_endpoint` in flight for one endpoint. An endpoint held back by a failure
    /// ([`AfterAttempt::Failing`]) gives nothing before its retry is due, then only the
    /// delivery that failed (or, if that one is gone, its oldest due), counted against
    /// `struggling_max`; an endpoint that is not active (paused, deleted) is not held.
    async fn claim_deliveries(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError>;

    /// Saves a delivery after an attempt, and what it says of its endpoint (`after`), in one
    /// step: a pending delivery is due again at its `next_attempt_ms`, a final one leaves the
    /// queue. With [`AfterAttempt::Pause`] the endpoint is paused and, if this call paused it
    /// (it was active), the notice is queued for the admins ([`Saved::Paused`]). A
    /// [`AfterAttempt::Failing`] with fewer failures than the endpoint's hold already counts (an
    /// attempt that was in flight when another failed) leaves the hold as it is. A failure or
    /// pause that says nothing of the endpoint as it is now saves nothing
    /// ([`Saved::Superseded`]): its attempt went to a URL the endpoint no longer has, or it
    /// was a retry (two failures or more) and the hold it was claimed under is gone (the
    /// endpoint was resumed, or answered, meanwhile).
    async fn save_delivery(
        &self,
        delivery: &Delivery,
        after: AfterAttempt<'_>,
    ) -> Result<Saved, StoreError>;

    /// Whether `endpoint` is held back by a failure, and until when.
    async fn endpoint_retry(&self, endpoint: &str) -> Result<Option<EndpointRetry>, StoreError>;

    /// The latest deliveries to an endpoint, newest first, without their events' payloads.
    async fn deliveries(
        &self,
        endpoint: &str,
        limit: usize,
    ) -> Result<Vec<DeliverySummary>, StoreError>;

    /// An event of a workspace and environment that workers have taken from the log, by id,
    /// within the retention window (another workspace's event of the same id is not it).
    async fn event(
        &self,
        workspace: &str,
        environment: Environment,
        id: &str,
    ) -> Result<Option<Event>, StoreError>;

    /// The events of a workspace and environment created at or after `since` (unix seconds),
    /// in (created, id) order, at most `max`; with `after`, only those past it among the
    /// events created at `since` (a continuation: the last event of the page before).
    async fn events_since(
        &self,
        workspace: &str,
        environment: Environment,
        since: u64,
        after: Option<&str>,
        max: usize,
    ) -> Result<EventPage, StoreError>;

    /// The delivery queue at a glance.
    async fn queue_stats(&self) -> Result<QueueStats, StoreError>;

    /// Takes one of the `limit` deliveries `endpoint` may get in the second of `now_ms`
    /// (unix milliseconds), counted across every worker; `false` if all are taken.
    async fn take_rate_slot(
        &self,
        endpoint: &str,
        limit: u32,
        now_ms: u64,
    ) -> Result<bool, StoreError>;
}

/// Pause notices: e-mails owed to the admins of a workspace, kept until sent.
#[async_trait]
pub trait NoticeStore: Send + Sync + 'static {
    /// Claims pause notices due by `now_ms`, earliest first, at most `max`, for `lease`: no
    /// other claim takes them until it ends (then they are due again: their worker died).
    async fn claim_pause_notices(
        &self,
        now_ms: u64,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<PauseNotice>, StoreError>;

    /// Puts a claimed notice back as given (its `failures` counted), due at `due_ms`; nothing
    /// if it was removed meanwhile.
    async fn retry_pause_notice(&self, notice: &PauseNotice, due_ms: u64)
        -> Result<(), StoreError>;

    /// Removes a pause notice (mailed, or nobody left to tell); nothing if it is gone.
    async fn remove_pause_notice(&self, id: &str) -> Result<(), StoreError>;
}

/// The slots of the `svcgate listen` streams of a key, leased across replicas.
#[async_trait]
pub trait ListenSlots: Send + Sync + 'static {
    /// Holds one of key `key_id`'s `max` listen-stream slots for stream `stream` for `lease_ms`
    /// from now, across replicas, or renews the one it holds; slots whose lease ran out are
    /// free. `false` if all are held by other streams. Leases are timed by the store's clock,
    /// which all replicas share.
    async fn hold_listen_slot(
        &self,
        key_id: &str,
        stream: &str,
        max: usize,
        lease_ms: u64,
    ) -> Result<bool, StoreError>;

    /// Frees stream `stream`'s slot of key `key_id`.
    async fn release_listen_slot(&self, key_id: &str, stream: &str) -> Result<(), StoreError>;
}

/// The storage a webhook worker reads and writes.
#[derive(Clone)]
pub struct WorkerStores {
    /// Where the events to deliver come from.
    pub events: Arc<dyn EventLog>,
    /// Endpoints and their queued deliveries.
    pub deliveries: Arc<dyn DeliveryQueue>,
    /// Pause notices owed to admins.
    pub notices: Arc<dyn NoticeStore>,
    /// Workspaces, for the admins a pause notice goes to.
    pub workspaces: Arc<dyn KeyStore>,
}
