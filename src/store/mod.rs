//! The shared state of a deployment: workspaces and keys (and, later, counters, endpoints and
//! the event log), behind one async trait.
//!
//! Implementations: [`MemoryStore`] for the zero-config demo and unit tests; Redis for
//! production. Every method is one round trip to the backing store, so the request path never
//! chains several of them.

mod cache;
pub mod config;
mod directory;
mod memory;
mod redis;

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

use crate::events::{Event, LoggedEvent};
use crate::keys::Environment;
use crate::keys::{KeyHash, KeyRecord, KeyStatus, Workspace};
use crate::metering::audit::{AuditQuery, AuditRecord};
use crate::metering::usage::{UsageFlush, UsageSnapshot};
use crate::webhooks::delivery::{Delivery, DeliverySummary};
use crate::webhooks::endpoint::Endpoint;
use crate::webhooks::notice::PauseNotice;

pub use cache::{CacheConfig, CacheOutcome, KeyCache};
pub use config::{StoreConfig, StoreKind};
pub use directory::MintedTokens;
pub use memory::MemoryStore;
pub use redis::{sentinel_address, IndexFillTiming, RedisStore, Sentinels};

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached; the caller may retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write conflicts with existing data (for example a duplicate id).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The store replaced its connections while an event feed read through one of its own: the
    /// master moved (the Sentinels name another), or the connections were reopened after
    /// Redis stopped answering. Nothing was lost: the feed is to be opened again.
    #[error("the store's connections were replaced")]
    Reconnected,
}

/// The error for a workspace that has `most` webhook endpoints in `endpoint`'s environment
/// and is given another.
pub fn too_many_endpoints(endpoint: &Endpoint, most: usize) -> StoreError {
    StoreError::Conflict(format!(
        "workspace {} has {most} {} webhook endpoints, the most it may have; delete one first",
        endpoint.workspace,
        endpoint.environment.as_str()
    ))
}

/// A change applied to an endpoint; like [`KeyChange`], it may run more than once.
pub type EndpointChange<'a> = &'a (dyn Fn(&mut Endpoint) + Send + Sync);

/// A change applied to a key record. It may run more than once (optimistic retries), so it
/// must only depend on the record it is given.
pub type KeyChange<'a> = &'a (dyn Fn(&mut KeyRecord) + Send + Sync);

/// A change to a workspace, applied to what the store holds (and again if it changed meanwhile).
pub type WorkspaceChange<'a> = &'a (dyn Fn(&mut Workspace) + Send + Sync);

/// Which keys changed after a given epoch of the key registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyChanges {
    /// The registry's current epoch; pass it to the next call.
    pub epoch: u64,
    /// The mark of the change at `epoch`; pass it to the next call. It tells one history from
    /// another: after a Redis failover that lost the last writes, the same epoch may name a
    /// different change.
    pub mark: String,
    /// Digests of the keys that changed, or `None` when the history no longer reaches back
    /// that far (or the store was reset): every cached key must then be dropped.
    pub changed: Option<Vec<KeyHash>>,
}

/// What [`Store::rotate_key`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Rotation {
    /// The old key is now rotating until its grace period ends; the successor is stored.
    Rotated {
        /// The old key's new record.
        old: Arc<KeyRecord>,
        /// The successor as stored: what it inherits is taken from the old key as it was
        /// in the rotating step (see [`crate::keys::inherit`]).
        successor: Arc<KeyRecord>,
    },
    /// The successor already exists: this is a retry of a rotation that went through.
    AlreadyRotated,
    /// There is no such key.
    NotFound,
    /// The key is not active (already rotating, or revoked).
    NotRotatable(KeyStatus),
}

/// A workspace's spend in one month, in micro-credits.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UsageReport {
    /// The workspace total.
    pub total: i64,
    /// Per key id.
    pub keys: std::collections::HashMap<String, i64>,
    /// Per project.
    pub projects: std::collections::HashMap<String, i64>,
}

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

/// A page of a workspace's events ([`Store::events_since`]).
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

/// What [`Store::save_delivery`] did.
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

/// What a saved attempt tells the store about its endpoint ([`Store::save_delivery`]).
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

/// What [`Store::claim_deliveries`] may take.
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
    /// Endpoints paused after failing every retry.
    pub paused_endpoints: u64,
    /// Pause notices not yet mailed to the admins.
    pub pause_notices: u64,
}

/// Shared, persistent state.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Opens new connections, driven from the calling runtime. A connection is reopened by
    /// whichever task finds it broken, and runs on that task's runtime: at shutdown, once
    /// the gateway's runtimes have stopped, the store runtime calls this before its last
    /// writes. Nothing to do for a store without connections.
    fn reopen_connections(&self) {}

    /// Brings up to date what an earlier version wrote and this one reads differently (the
    /// Redis store indexes the workspaces created before its index existed). Run by `serve` at
    /// start, in the background, until it succeeds; every read that needs it also works
    /// without it, only slower. Idempotent. Nothing to do for a store with no such data.
    async fn prepare(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Creates a workspace; fails with [`StoreError::Conflict`] if the id exists.
    async fn create_workspace(&self, workspace: &Workspace) -> Result<(), StoreError>;

    /// A workspace by id.
    async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError>;

    /// Workspaces, oldest first: at most `limit`, those after workspace `after` or from the
    /// first; and whether more follow.
    async fn workspaces(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Workspace>, bool), StoreError>;

    /// Applies `change` to workspace `id` (its id and creation time stay) and returns the
    /// result; `None` if there is no such workspace.
    async fn update_workspace(
        &self,
        id: &str,
        change: WorkspaceChange<'_>,
    ) -> Result<Option<Workspace>, StoreError>;

    /// Stores a new key, indexed by id, by hash and under its workspace.
    async fn insert_key(&self, key: &KeyRecord) -> Result<(), StoreError>;

    /// The key whose value hashes to `hash`: the request path's lookup.
    async fn key_by_hash(&self, hash: &KeyHash) -> Result<Option<Arc<KeyRecord>>, StoreError>;

    /// A key by id.
    async fn key_by_id(&self, id: &str) -> Result<Option<Arc<KeyRecord>>, StoreError>;

    /// Scoped tokens minted lately, on any replica, that this one has heard of (best effort),
    /// for the key directory; the store keeps it filled.
    fn minted_tokens(&self) -> Arc<MintedTokens>;

    /// A page of the digests of every key the store holds (scoped tokens may be among them),
    /// from `cursor` (0 for the first page), and the cursor of the next page: 0 after the
    /// last. A key held from the first page to the last is listed at least once; a page may
    /// be empty, and a digest may be listed twice.
    async fn key_digests(&self, cursor: u64) -> Result<(Vec<KeyHash>, u64), StoreError>;

    /// A workspace's keys, oldest first: at most `limit`, those after key `after` (which must
    /// be one of them) or from the first.
    async fn keys_in_workspace(
        &self,
        workspace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Arc<KeyRecord>>, StoreError>;

    /// Applies `change` to the key atomically and returns the new record, or `None` if there is
    /// no such key. The id, workspace and hash of a key never change.
    async fn update_key(
        &self,
        id: &str,
        change: KeyChange<'_>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError>;

    /// [`Store::update_key`], and in the same atomic step appends `event` to the event log:
    /// either both happen or neither. A change that changes nothing (the key was revoked
    /// meanwhile, say, by a concurrent leak report) writes nothing and emits nothing.
    async fn update_key_emitting(
        &self,
        id: &str,
        change: KeyChange<'_>,
        event: &Event,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError>;

    /// Key changes after `epoch`, read before with `mark`. Every write to a key (insert,
    /// update) advances the epoch, so a cache that remembers the epoch it has seen can catch
    /// up on anything it missed; if the change at `epoch` is no longer the one it read (the
    /// store lost writes), every cached key must go (`changed: None`).
    async fn key_changes_since(&self, epoch: u64, mark: &str) -> Result<KeyChanges, StoreError>;

    /// Woken (best effort) whenever a key changes, on this replica or any other.
    fn key_change_signal(&self) -> Arc<Notify>;

    /// Rotates key `old_id` to `successor` atomically: the old key becomes `rotating` until
    /// `grace_until`, pointing at the successor, and the successor is inserted, inheriting
    /// from the old key as it is at that step.
    async fn rotate_key(
        &self,
        old_id: &str,
        successor: &KeyRecord,
        grace_until: u64,
    ) -> Result<Rotation, StoreError>;

    /// The salt of idempotency scope `scope` (an opaque digest): `fresh` if the scope has none,
    /// else the one it has. Kept for `ttl_secs` from the first call, then forgotten. Every
    /// caller of a scope gets the same salt meanwhile, whichever replica it is on.
    async fn idempotency_salt(
        &self,
        scope: &str,
        fresh: &str,
        ttl_secs: u64,
    ) -> Result<String, StoreError>;

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

    /// Stores a scoped token (found by [`Store::key_by_hash`]) for `ttl_secs`, after which the
    /// store forgets it.
    async fn insert_token(&self, token: &KeyRecord, ttl_secs: u64) -> Result<(), StoreError>;

    /// Adds a replica's batched spend and rate counts, fires `billing.credits.low` for a
    /// workspace whose remaining credits this batch takes below its threshold (once per
    /// crossing), and answers the month's totals of everything the batch watches. Atomic.
    async fn flush_usage(&self, flush: &UsageFlush) -> Result<UsageSnapshot, StoreError>;

    /// The monthly budgets set for a workspace's projects, in micro-credits, by project.
    async fn project_budgets(
        &self,
        workspace: &str,
    ) -> Result<std::collections::HashMap<String, i64>, StoreError>;

    /// Sets (or, with `None`, removes) a project's monthly budget in micro-credits.
    async fn set_project_budget(
        &self,
        workspace: &str,
        project: &str,
        budget: Option<i64>,
    ) -> Result<(), StoreError>;

    /// A workspace's spend in `month` (`YYYY-MM`).
    async fn usage_report(&self, workspace: &str, month: &str) -> Result<UsageReport, StoreError>;

    /// Appends audit records (any workspaces, any order of arrival). With `once`, a batch id,
    /// a batch of that id is appended at most once (within a day): a spool file replayed again
    /// after the process replaying it died adds nothing.
    async fn append_audit(
        &self,
        records: &[AuditRecord],
        once: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Reads audit records back, newest first.
    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError>;

    /// Appends an event to the event log (kept 30 days).
    async fn append_event(&self, event: &Event) -> Result<(), StoreError>;

    /// Stores a new webhook endpoint, unless its workspace has `most` already in its
    /// environment (a [`StoreError::Conflict`] saying so).
    async fn create_endpoint(&self, endpoint: &Endpoint, most: usize) -> Result<(), StoreError>;

    /// The endpoints of a workspace, oldest first.
    async fn endpoints(&self, workspace: &str) -> Result<Vec<Endpoint>, StoreError>;

    /// Applies `change` to an endpoint atomically; `None` if there is no such endpoint. The id,
    /// workspace, environment and secret never change.
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
    /// to [`Store::enqueue_deliveries`] within `reclaim_after` (it died).
    async fn consume_events(
        &self,
        consumer: &str,
        reclaim_after: Duration,
    ) -> Result<Box<dyn EventFeed>, StoreError>;

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
}
