//! The Redis store: state shared by every gateway replica.
//!
//! Layout (every name starts with the configured namespace `ns`):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{ns}:ws:<id>` | string | workspace JSON |
//! | `{ns}:workspaces` | sorted set | workspace ids, scored by creation time (unix seconds) |
//! | `{ns}:workspaces:filled` | string | set once the index holds the workspaces of versions before it |
//! | `{ns}:workspaces:filling` | string, with a TTL | the lease of the replica filling that index (a random token) |
//! | `{ns}:listen:<key id>` | sorted set | the key's open `listen` streams (request ids), scored by when their lease ends (ms) |
//! | `{ns}:idem:<digest>` | string | an `Idempotency-Key`'s salt (24 hours), under an HMAC of the key and what it is for |
//! | `{ns}:events` | stream | the event log: fields `id`, `type`, `created`, `workspace`, `environment`, `data` (JSON) |
//! | `{ns}:keys:h:<sha256 hex>` | string | key or scoped-token record JSON, by digest (the request path's lookup); tokens expire with a TTL |
//! | `{ns}:keys:id:<key id>` | string | digest hex, by key or token id (a token's expires with it) |
//! | `{ns}:keys:ws:<workspace>` | sorted set | key ids of a workspace, scored by creation time |
//! | `{ns}:keys:epoch` | integer | bumped by every key write |
//! | `{ns}:keys:log` | stream | one entry `<epoch>-0 h=<digest>` per key write, capped |
//! | `{ns}:spend:<ws>:<YYYY-MM>` | hash | micro-credits: `total`, `key:<id>`, `project:<name>`; `low_fired` |
//! | `{ns}:budgets:<ws>` | hash | project → monthly budget (micro-credits) |
//! | `{ns}:flush:<id>` | string | a usage batch (spend, or rate counts) already added (a day), so a retry adds nothing |
//! | `{ns}:rl:<key id>:<minute>` | integer | requests in that minute window, all replicas (expires) |
//! | `{ns}:endpoints:<ws>` | hash | webhook endpoint id → endpoint JSON (with its secret) |
//! | `{ns}:wh:cursor` | string | an event-log entry id such that every entry up to it is fanned out (kept behind the oldest entry pending in the group); where a lost consumer group restarts |
//! | `{ns}:wh:ready` | sorted set | `<ws> <endpoint id>` of every endpoint with queued deliveries, scored by the earliest due time (ms) |
//! | `{ns}:wh:due:<endpoint id>` | sorted set | the endpoint's queued delivery ids, scored by due time (ms); a claimed one by its lease's end |
//! | `{ns}:wh:dlv:<delivery id>` | string | delivery JSON: its event but for the payload (in the event's record; with it before session 23), status, attempts, last attempt (30 days from its last save) |
//! | `{ns}:wh:log:<endpoint id>` | list | the endpoint's latest delivery ids, newest first (1,000) |
//! | `{ns}:wh:evt:<ws>:<env>:<event id>` | string | event JSON, for replay and its deliveries' payload (30 days, and as long as any of its delivery records; `{ns}:wh:evt:<event id>` before session 12, still read) |
//! | `{ns}:wh:replay:<ws>:<env>` | sorted set | the workspace's event ids in one environment, scored by `created` (unix seconds), for replays since a time (30 days) |
//! | `{ns}:wh:hold:<endpoint id>` | hash | an endpoint held back by a failure: `failures` in a row, `until` (ms) nothing of its queue is due, `probe` the delivery that goes first then, `tries` its claims with no attempt saved; gone once it answers, is paused, deleted, resumed or given a new URL |
//! | `{ns}:wh:pending` | integer | queued deliveries |
//! | `{ns}:wh:paused` | set | `<ws> <endpoint id>` of paused endpoints |
//! | `{ns}:wh:notices` | hash | pause notice id → notice JSON: an e-mail owed to a workspace's admins, queued with the pause, removed once sent |
//! | `{ns}:wh:notices:due` | sorted set | pause notice ids, scored by when the next try is due (ms); a claimed one by its lease's end |
//! | `ns:audit:{<ws>}` | stream | audit records, one entry per written batch (`records` = JSON array, zstd-compressed; written uncompressed before session 30) |
//! | `ns:audit:{<ws>}:once:<id>` | string | an audit spool write already appended (a day) |
//! | channel `ns:keys:changed` | pub/sub | the new epoch, published by every key write |
//! | channel `ns:tokens:minted` | pub/sub | `<digest hex> <expires_at>` of every scoped token minted (the key directory) |
//! | `{ns}:keys:tokens` | sorted set | digest hex of every scoped token minted, scored by its expiry (unix seconds): read by each replica when it subscribes to the tokens channel (pub/sub keeps no backlog); expired ones go at the next mint |
//!
//! The event log is consumed by the consumer group `webhooks`; see [`webhooks`] for the entry
//! format backends may add.
//!
//! The key registry and the event log share one hash tag, `{ns}`, so that a key write, the
//! epoch bump, the change-log entry, an event it causes and the notification happen in one Lua
//! script, atomically, on Redis Cluster too. At about 500 bytes a key, one slot holds millions
//! of keys; high-volume counters go to other slots.

mod audit_codec;
mod connection;
mod streams;
mod webhooks;

use connection::Connections;
pub use connection::{sentinel_address, Sentinels};

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::sync::Notify;

use super::{
    too_many_endpoints, AfterAttempt, AuditStore, ClaimRequest, ClaimedDelivery, DeliveryQueue,
    EndpointChange, EndpointRetry, EventFeed, EventLog, EventPage, KeyChange, KeyChanges, KeyStore,
    ListenSlots, MintedTokens, NoticeStore, QueueStats, Rotation, Saved, StoreError, StoreHealth,
    UsageReport, UsageStore, WorkspaceChange,
};
use crate::events::Event;
use crate::keys::Environment;
use crate::keys::{KeyHash, KeyRecord, KeyStatus, Workspace};
use crate::metering::audit::{AuditQuery, AuditRecord};
use crate::metering::usage::{RateTotals, UsageFlush, UsageSnapshot, WorkspaceTotals};
use crate::webhooks::delivery::{Delivery, DeliverySummary};
use crate::webhooks::endpoint::Endpoint;
use crate::webhooks::notice::PauseNotice;
use std::collections::HashMap;

/// Log entries kept for replicas catching up after a disconnect.
const CHANGE_LOG_LEN: usize = 100_000;
/// Most changes one catch-up reads; a replica further behind drops its whole cache instead.
const CATCH_UP_MAX: u64 = 10_000;
/// How long a key change waits for a replica to confirm it, behind Sentinels (under the
/// connection's 500 ms answer timeout: the wait holds up the commands behind it).
const REPLICA_WAIT_MS: u64 = 300;
/// Optimistic update attempts before giving up on a hot key.
const UPDATE_ATTEMPTS: usize = 16;

/// What a compare-and-set script's answer means for the value it was to write: written (1),
/// gone (-1), or changed meanwhile (`None`: read it again).
fn settled<T>(answer: i64, next: T) -> Option<Option<T>> {
    match answer {
        1 => Some(Some(next)),
        -1 => Some(None),
        _ => None,
    }
}

/// The error for a value that kept changing under [`UPDATE_ATTEMPTS`] compare-and-sets.
fn changing_too_often(what: &str, id: &str) -> StoreError {
    StoreError::Conflict(format!("{what} {id} is changing too often; retry"))
}

/// Names of everything this store keeps in Redis.
#[derive(Debug, Clone)]
struct Layout {
    ns: String,
    registry: String,
}

impl Layout {
    fn new(ns: &str) -> Self {
        Self {
            ns: ns.to_string(),
            registry: format!("{{{ns}}}:keys"),
        }
    }
    fn workspace(&self, id: &str) -> String {
        format!("{{{}}}:ws:{id}", self.ns)
    }
    /// Every workspace's id, scored by its creation time.
    fn workspace_index(&self) -> String {
        format!("{{{}}}:workspaces", self.ns)
    }
    /// Set once the index holds the workspaces created before it existed.
    fn workspace_index_filled(&self) -> String {
        format!("{{{}}}:workspaces:filled", self.ns)
    }
    /// Held by the one replica filling the index (its token), for a lease renewed as it goes.
    fn workspace_index_filling(&self) -> String {
        format!("{{{}}}:workspaces:filling", self.ns)
    }
    fn key_by_hash(&self, hash: &KeyHash) -> String {
        format!("{}:h:{}", self.registry, hash.to_hex())
    }
    /// What every [`Layout::key_by_hash`] starts with; the namespace has no `SCAN` pattern
    /// characters (`[A-Za-z0-9._-]`).
    fn key_by_hash_prefix(&self) -> String {
        format!("{}:h:", self.registry)
    }
    fn live_tokens(&self) -> String {
        format!("{}:tokens", self.registry)
    }
    fn key_by_id(&self, id: &str) -> String {
        format!("{}:id:{id}", self.registry)
    }
    fn workspace_keys(&self, workspace: &str) -> String {
        format!("{}:ws:{workspace}", self.registry)
    }
    fn epoch(&self) -> String {
        format!("{}:epoch", self.registry)
    }
    fn log(&self) -> String {
        format!("{}:log", self.registry)
    }
    fn events(&self) -> String {
        format!("{{{}}}:events", self.ns)
    }
    fn spend(&self, workspace: &str, month: &str) -> String {
        format!("{{{}}}:spend:{workspace}:{month}", self.ns)
    }
    fn budgets(&self, workspace: &str) -> String {
        format!("{{{}}}:budgets:{workspace}", self.ns)
    }
    fn endpoints(&self, workspace: &str) -> String {
        format!("{{{}}}:endpoints:{workspace}", self.ns)
    }
    fn audit(&self, workspace: &str) -> String {
        format!("{}:audit:{{{workspace}}}", self.ns)
    }
    /// Set once a batch of audit records with id `once` is in the workspace's stream.
    fn audit_once(&self, workspace: &str, once: &str) -> String {
        format!("{}:once:{once}", self.audit(workspace))
    }
    fn listen_slots(&self, key_id: &str) -> String {
        format!("{{{}}}:listen:{key_id}", self.ns)
    }
    fn idempotency_salt(&self, scope: &str) -> String {
        format!("{{{}}}:idem:{scope}", self.ns)
    }
    fn channel(&self) -> String {
        format!("{}:keys:changed", self.ns)
    }
    fn tokens_channel(&self) -> String {
        format!("{}:tokens:minted", self.ns)
    }
}

/// Inserts a key record and its indexes, then records the change.
/// KEYS: record, id index, workspace set, epoch, log. ARGV: json, hash hex, id, created_at,
/// channel, log length, mark. Returns the new epoch, or -1 if the key or id exists.
static INSERT_KEY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/insert_key.lua")));

/// Stores a scoped token by digest, and by id (so a token can be shown and revoked like a key),
/// for `ttl` seconds, unless its digest is taken (0), and tells every replica of it: on the
/// tokens channel (best effort: a Redis user not allowed the channel still mints), and in the
/// set of live tokens, which a replica reads when it subscribes (pub/sub keeps no backlog; the
/// set drops the expired, and lives as long as its longest-lived token). KEYS: by digest, by
/// id, the live tokens. ARGV: record JSON, digest hex, ttl, the tokens channel, its expiry, the
/// time (unix seconds).
static INSERT_TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/insert_token.lua")));

/// Appends a batch of audit records to a workspace's stream, unless a batch of its id was
/// appended (when given one), or moves a batch appended under too early an id. KEYS: stream[,
/// marker]. ARGV: the oldest id kept, the records (as the entry holds them: [`audit_codec`]),
/// the arrival time (Unix ms) of the newest record in the batch, how far ahead of Redis's
/// clock an id may be dated (ms)[, the id of the entry the batch was appended under, deleted
/// once it is appended again]. Returns 1, or 0 for a batch seen.
///
/// An entry's id is not earlier than the newest record it holds: records carry their
/// gateway's clock, the entry id Redis's, and a query `since` a time stops at the first entry
/// written before it. A batch from a gateway whose clock runs ahead of Redis's gets that
/// record's time as its id (or, where the stream already holds a later id, the next one after
/// it), so its records are found. Otherwise the id is Redis's time. Ids are dated at most
/// [`AUDIT_AHEAD_MAX_MS`] ahead: every later entry's id follows the stream's last, and the
/// stream is trimmed by id, so one gateway a year ahead would keep the log from being trimmed
/// for a year.
///
/// The entry is added under Redis's time (or the next id after the stream's last), and only
/// when that is earlier than its newest record is Redis's clock read and the entry added again
/// under the later id, then the first deleted: a script is not rolled back when a command
/// fails, and nothing is deleted before its records are held by another entry. The marker is
/// set after the append, for the same reason: a batch the stream refused must not count as
/// appended. Sent with `EVAL` (Redis keeps it compiled): one round trip per pipeline, and no
/// script cache to find empty after a restart.
///
/// A batch without an id is not sent through this script first but appended with a bare
/// `XADD` ([`RedisStore::append_audit`]): Redis spends less than half the time on that (20 µs
/// against 50 µs for 64 records), on a core a sidecar shares with its model service. Only a
/// batch whose entry came out earlier than its newest record (a gateway's clock ahead of
/// Redis's) is then moved by the script, with the first entry's id as ARGV[5].
const APPEND_AUDIT: &str = include_str!("scripts/append_audit.lua");

/// Creates a workspace and indexes it. KEYS: record, index. ARGV: json, created_at, id.
/// Returns 1, or 0 if the id exists.
static CREATE_WORKSPACE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/create_workspace.lua")));

/// Holds or renews a listen-stream slot. KEYS: the key's slots (stream → lease end, ms).
/// ARGV: stream, max, lease (ms). Returns 1, or 0 if every slot is held by another. Leases
/// are timed by Redis's clock, not the replicas' (one running ahead would end the others').
static HOLD_LISTEN_SLOT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/hold_listen_slot.lua")));

/// Takes the lease on filling the workspace index, unless it is filled. KEYS: the index's
/// filled mark, the lease. ARGV: token, lease (ms). Returns `filled`, `taken` (now the
/// caller's) or `busy` (another replica's).
static TAKE_FILL_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/take_fill_lease.lua")));

/// Renews a lease for ARGV[2] ms if KEYS[1] still holds ARGV[1] (the holder's token).
static RENEW_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew_lease.lua")));

/// Lets go of a lease: deletes KEYS[1] if it still holds ARGV[1] (the holder's token), not a
/// lease another replica took after this one's ran out.
static RELEASE_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release_lease.lua")));

/// A value set once: KEYS[1] if it exists, else ARGV[1], stored for ARGV[2] seconds.
static GET_OR_SET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/get_or_set.lua")));

/// Replaces a value if it still is what the caller read (compare-and-set). KEYS: the value.
/// ARGV: expected, new. Returns 1, 0 if it changed meanwhile, -1 if it is gone.
static SET_IF_UNCHANGED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/set_if_unchanged.lua")));

/// Replaces a key record if it still holds what the caller read (compare-and-set), records
/// the change and, when given one, appends an event. KEYS: record, epoch, log, events.
/// ARGV: expected json, new json, hash hex, channel, log length, mark, then (optional) the
/// event's id, type, created, workspace, environment, data. Returns the new epoch, or -1 if the record
/// changed meanwhile. A scoped token's record keeps its TTL.
static UPDATE_KEY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/update_key.lua")));

/// Rotates a key: the old record (if unchanged) becomes the rotating one, the successor and its
/// indexes are inserted, the old key's predecessors still in grace are extended with the
/// successor (if unchanged), and every change is recorded. KEYS: old record, successor record,
/// successor id index, workspace set, epoch, log, then each predecessor's record. ARGV:
/// expected old json, rotated old json, successor json, old hash hex, successor hash hex,
/// successor id, created_at, channel, log length, mark, then per predecessor its expected json,
/// new json and hash hex. Returns the epoch, -1 if a record changed meanwhile, -2 if the
/// successor exists already.
static ROTATE_KEY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/rotate_key.lua")));

/// Applies one usage flush (see [`UsageStore::flush_usage`]). Every key it touches starts with the
/// `{ns}` hash tag (ARGV[1]), so it runs on one Cluster slot. ARGV[2] is the flush as JSON.
/// Answers JSON with totals as decimal strings (Lua numbers would lose digits).
static FLUSH_USAGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/flush_usage.lua")));

/// [`UsageSnapshot`] as the flush script writes it: numbers as strings.
#[derive(serde::Deserialize, Default)]
struct RawSnapshot {
    #[serde(default)]
    workspaces: HashMap<String, RawTotals>,
    #[serde(default)]
    rate: HashMap<String, RawRate>,
}

#[derive(serde::Deserialize, Default)]
struct RawTotals {
    total: String,
    #[serde(default)]
    monthly_credits: Option<String>,
    #[serde(default)]
    keys: RawMap,
    #[serde(default)]
    projects: RawMap,
    #[serde(default)]
    project_budgets: RawMap,
}

#[derive(serde::Deserialize)]
struct RawRate {
    window: String,
    previous: String,
    current: String,
}

/// cjson writes an empty table as `{}` and never as `[]`, so maps decode either way.
#[derive(Default)]
struct RawMap(HashMap<String, String>);

impl<'de> serde::Deserialize<'de> for RawMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Object(m) => Ok(RawMap(
                m.into_iter()
                    .map(|(k, v)| {
                        (
                            k,
                            v.as_str()
                                .map(str::to_owned)
                                .unwrap_or_else(|| v.to_string()),
                        )
                    })
                    .collect(),
            )),
            _ => Ok(RawMap::default()),
        }
    }
}

fn parse_int(s: &str) -> i64 {
    s.parse().unwrap_or(0)
}

impl RawMap {
    fn parsed(self) -> HashMap<String, i64> {
        self.0
            .into_iter()
            .map(|(k, v)| (k, parse_int(&v)))
            .collect()
    }
}

/// Replaces an endpoint if it still is what the caller read, and keeps the set of paused
/// endpoints (for the metric) and its retry hold in step with it, in one step. ARGV: prefix,
/// workspace, id, expected JSON, new JSON, 1 if paused, 1 to drop the hold (its URL changed,
/// or it was resumed: the next attempt is a first one, and the delivery that failed goes now). Returns 1, 0 if it changed meanwhile,
/// -1 if it is gone.
static ENDPOINT_CAS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rescore.lua"),
        include_str!("scripts/endpoint_cas.lua")
    ))
});

/// Deletes an endpoint, its retry hold and its place among the paused, and puts its queue due
/// as it is (its deliveries are skipped as they come). ARGV: prefix, workspace, id. Returns 1
/// if it existed.
static DELETE_ENDPOINT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rescore.lua"),
        include_str!("scripts/delete_endpoint.lua")
    ))
});

/// Stores a new endpoint unless its workspace has as many as it may in its environment. KEYS:
/// the workspace's endpoints. ARGV: id, JSON, most endpoints, environment. Returns 1, 0 if the
/// id is taken, -1 if full.
static CREATE_ENDPOINT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/create_endpoint.lua")));

/// Reads the changes after an epoch. KEYS: epoch, log. ARGV: since, max, the mark the caller
/// read with `since`. Returns `{epoch, mark}` (nothing new), `{epoch, mark, 'reset'}` (history
/// gone, or not the one the caller read), or `{epoch, mark, hash, hash, …}`.
///
/// Each entry carries a random mark, and a reader keeps the mark of the entry at its epoch:
/// after a failover that lost the last writes, or a restore from an older copy, the same
/// epoch names another change, and only the mark tells. (Entries written before marks read
/// as `0`; an entry that is gone as `-`.)
static CHANGES_SINCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/changes_since.lua")));

/// One workspace's records of an audit append, rendered for its stream.
struct AuditBatch<'a> {
    workspace: &'a str,
    stream: String,
    /// The arrival time (Unix ms) of its newest record.
    newest: u64,
    /// The records, as the entry holds them ([`audit_codec`]).
    records: Vec<u8>,
}

/// The time (Unix ms) in a stream entry's id (`<ms>-<seq>`).
fn stream_id_ms(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

/// How far ahead of Redis's clock an audit batch's stream entry is dated at most, for a gateway
/// whose clock runs ahead ([`APPEND_AUDIT`]): the records of one further ahead than this (and
/// than [`AUDIT_CLOCK_SKEW_MS`]) can be left out of a `since` query.
const AUDIT_AHEAD_MAX_MS: u64 = 10 * 60 * 1000;

/// How far ahead of Redis's clock a gateway's may run without its audit records being left
/// out of a `since` query or a page: the stream entries read go back this much further. Needed
/// for entries written before session 26, which took Redis's time as their id whatever their
/// records' times; an entry written since has an id no earlier than its newest record
/// ([`APPEND_AUDIT`]).
const AUDIT_CLOCK_SKEW_MS: u64 = 2_000;

/// Slots of the keyspace one `SCAN` for key digests walks ([`RedisStore::key_digests`]).
const KEY_DIGESTS_SCAN: usize = 1_000;

/// How long a workspace listing waits for another replica's fill.
const INDEX_FILL_LISTING_WAIT: Duration = Duration::from_secs(5);

/// The pace of the workspace index fill ([`RedisStore::fill_workspace_index`]) and of its lease.
/// The defaults serve; a test sets a lease short enough for a scan to outlast it (a scan of
/// 30 s takes millions of keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexFillTiming {
    /// The lease of the replica filling the index, renewed as it scans: another replica takes
    /// over this long after one that died mid-scan (30 s).
    pub lease: Duration,
    /// How often the replica filling the index renews its lease (5 s).
    pub renewal: Duration,
    /// How often a replica waiting for another's fill looks whether it is done or its lease
    /// over (250 ms).
    pub poll: Duration,
    /// The keys each `SCAN` call looks at (1,000; at least 1).
    pub scan_count: usize,
}

impl Default for IndexFillTiming {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            renewal: Duration::from_secs(5),
            poll: Duration::from_millis(250),
            scan_count: 1_000,
        }
    }
}

impl IndexFillTiming {
    /// The lease in milliseconds, as Redis takes it (at least 1).
    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// The lease on the workspace index fill, let go when dropped: when the fill ends, well or
/// not, or when the start-up fill running it is dropped part way; the next try, here or on
/// another replica, need not wait for it to run out. (A release that fails leaves it to run
/// out.)
struct FillLease {
    conn: ConnectionManager,
    key: String,
    /// This replica's, in the lease while it holds it.
    token: String,
    /// Whether the lease may be this replica's.
    held: bool,
}

impl Drop for FillLease {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut conn, key, token) = (
            self.conn.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        runtime.spawn(async move {
            let _: Result<i64, _> = RELEASE_LEASE
                .key(&key)
                .arg(&token)
                .invoke_async(&mut conn)
                .await;
        });
    }
}

/// The scan of [`RedisStore::fill_workspace_index`], under its lease: every workspace record
/// found goes into the index, then the index is marked filled. The lease is renewed as the scan
/// goes, while it is this replica's (one that ran out and was taken over is not renewed for
/// the replica that took it: the scan goes on, and is only done twice); it is let go when the
/// scan ends, or is dropped part way.
async fn scan_into_workspace_index(
    layout: Layout,
    lease: FillLease,
    timing: IndexFillTiming,
) -> Result<(), StoreError> {
    // One connection throughout: a `SCAN` cursor belongs to the server that gave it.
    let mut conn = lease.conn.clone();
    let pattern = format!("{}*", glob_escape(&layout.workspace("")));
    let mut cursor: u64 = 0;
    let mut renewed = tokio::time::Instant::now();
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(timing.scan_count.max(1))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        if renewed.elapsed() >= timing.renewal {
            let _: i64 = RENEW_LEASE
                .key(&lease.key)
                .arg(&lease.token)
                .arg(timing.lease_ms())
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            renewed = tokio::time::Instant::now();
        }
        let mut batch = redis::pipe();
        if !found.is_empty() {
            let raw: Vec<Option<String>> = conn.mget(&found).await.map_err(unavailable)?;
            for (key, raw) in found.iter().zip(raw) {
                let Some(w) = raw.and_then(|r| decode::<Workspace>(key, &r).ok()) else {
                    continue;
                };
                batch
                    .zadd(layout.workspace_index(), &w.id, w.created_at)
                    .ignore();
            }
        }
        if !batch.is_empty() {
            batch
                .query_async::<()>(&mut conn)
                .await
                .map_err(unavailable)?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    conn.set::<_, _, ()>(layout.workspace_index_filled(), 1)
        .await
        .map_err(unavailable)
}

/// Workspaces and keys in Redis.
pub struct RedisStore {
    connections: Arc<Connections>,
    layout: Layout,
    changed: Arc<Notify>,
    /// Tokens minted on any replica, heard of on the tokens channel.
    minted: Arc<MintedTokens>,
    audit_retention_secs: u64,
    /// Compresses audit batches for their stream entries.
    audit_codec: audit_codec::AuditCodec,
    /// Behind Sentinels: a master with replicas, any of which a failover may promote.
    replicated: bool,
    /// Held while this replica fills the workspace index or waits for a fill, so a listing
    /// during `serve`'s start-up fill waits for it instead of scanning too
    /// ([`RedisStore::fill_workspace_index`]). A scan a listing started goes on without it,
    /// under its lease, which keeps the others waiting.
    filling: tokio::sync::Mutex<()>,
    /// The runtime that drives the store's connections: a scan a listing starts runs there,
    /// not on the listing's (the admin service's, stopped first at shutdown).
    runtime: tokio::runtime::Handle,
    /// The pace of the workspace index fill and of its lease.
    index_fill: IndexFillTiming,
}

impl RedisStore {
    /// A page of the ids in the sorted set `index` (ordered by creation time, then id, so an
    /// id's rank is a stable cursor): at most `limit` (at least 1), those after `after` or
    /// from the first.
    async fn page(
        &self,
        index: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let start = match after {
            Some(id) => {
                let rank: Option<isize> =
                    self.conn().zrank(index, id).await.map_err(unavailable)?;
                rank.map_or(0, |r| r + 1)
            }
            None => 0,
        };
        self.range(index, start, limit).await
    }

    /// `limit` (at least 1) ids of the sorted set `index` from rank `start`.
    async fn range(
        &self,
        index: &str,
        start: isize,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let limit = isize::try_from(limit).unwrap_or(isize::MAX);
        self.conn()
            .zrange(index, start, start.saturating_add(limit - 1))
            .await
            .map_err(unavailable)
    }

    /// Indexes the workspaces created before the index existed (by an earlier version), once
    /// per namespace: a scan of the namespace's workspace records (a scan cut short starts
    /// again: a `SCAN` cursor means nothing to another Redis process, after a failover or a
    /// restart). `serve` runs it at start ([`StoreHealth::prepare`]); a listing before it is done
    /// waits for it (or, if it failed, starts it), for a while. Workspaces created since are
    /// indexed as they are created, and any read of a workspace indexes it if it is not.
    ///
    /// One replica scans at a time: it holds a lease in Redis (`{ns}:workspaces:filling`),
    /// renewed as it scans, and the others wait until the index is marked filled, or
    /// until the lease runs out (its holder died) and one of them takes it over; or, given a
    /// `wait`, for that long, and then give up (503).
    async fn fill_workspace_index(&self, wait: Option<Duration>) -> Result<(), StoreError> {
        let deadline = wait.map(|w| tokio::time::Instant::now() + w);
        let indexing = || {
            StoreError::Unavailable(
                "the workspaces an earlier version wrote are being indexed; try again shortly"
                    .into(),
            )
        };
        let _filling = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.filling.lock())
                .await
                .map_err(|_| indexing())?,
            None => self.filling.lock().await,
        };
        let mut lease = FillLease {
            conn: self.conn(),
            key: self.layout.workspace_index_filling(),
            token: crate::ids::new_id("fill"),
            held: false,
        };
        loop {
            // Held from the moment it is asked for: an answer that times out or is never
            // read (what runs this was dropped) may still have given it.
            lease.conn = self.conn();
            lease.held = true;
            let state: String = TAKE_FILL_LEASE
                .key(self.layout.workspace_index_filled())
                .key(&lease.key)
                .arg(&lease.token)
                .arg(self.index_fill.lease_ms())
                .invoke_async(&mut lease.conn)
                .await
                .map_err(unavailable)?;
            if state == "taken" {
                break;
            }
            lease.held = false;
            if state == "filled" {
                return Ok(());
            }
            let poll = self.index_fill.poll;
            if deadline.is_some_and(|d| tokio::time::Instant::now() + poll > d) {
                return Err(indexing());
            }
            tokio::time::sleep(poll).await;
        }
        let scan = scan_into_workspace_index(self.layout.clone(), lease, self.index_fill);
        let Some(deadline) = deadline else {
            return scan.await;
        };
        // A listing that found no fill under way (the start-up fill failed and waits to try
        // again) starts it, but waits no longer for it than for another's: the scan goes on
        // without it, under its lease, and the listings after it wait for that.
        let scan = self.runtime.spawn(async move {
            let scanned = scan.await;
            if let Err(e) = &scanned {
                tracing::warn!(error = %e, "indexing the workspaces an earlier version wrote failed; the next listing or start-up retry tries again");
            }
            scanned
        });
        match tokio::time::timeout_at(deadline, scan).await {
            Ok(Ok(scanned)) => scanned,
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the index fill stopped part way".into(),
            )),
            Err(_) => Err(indexing()),
        }
    }

    /// Where a page of the workspace index after workspace `id` starts: past its rank, or, for
    /// a workspace not in the index (created by an earlier version during a rolling upgrade,
    /// say), past where it would be, and it is indexed for the next listing.
    async fn workspace_rank_after(&self, id: &str) -> Result<isize, StoreError> {
        let mut conn = self.conn();
        let index = self.layout.workspace_index();
        let rank: Option<isize> = conn.zrank(&index, id).await.map_err(unavailable)?;
        if let Some(rank) = rank {
            return Ok(rank + 1);
        }
        let Some(workspace) = self.workspace(id).await? else {
            return Ok(0);
        };
        let created = workspace.created_at;
        let (older, same): (isize, Vec<String>) = redis::pipe()
            .zcount(&index, "-inf", format!("({created}"))
            .zrangebyscore(&index, created, created)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let before = same.iter().filter(|other| other.as_str() <= id).count();
        Ok(older + isize::try_from(before).unwrap_or(isize::MAX))
    }

    /// The digest of the key (or token) with id `id`, from the id index.
    async fn hash_of(&self, id: &str) -> Result<Option<KeyHash>, StoreError> {
        let hash: Option<String> = self
            .conn()
            .get(self.layout.key_by_id(id))
            .await
            .map_err(unavailable)?;
        Ok(hash.as_deref().and_then(KeyHash::from_hex))
    }

    /// The predecessors of `old` still in grace, each as read (for the rotation's
    /// compare-and-set) and as it is once it counts `successor` against its budget.
    async fn extended_predecessors(
        &self,
        old: &KeyRecord,
        successor: &str,
    ) -> Result<Vec<(String, KeyRecord)>, StoreError> {
        let now = crate::ids::unix_now();
        let mut extended = Vec::new();
        for id in &old.predecessors {
            let Some(hash) = self.hash_of(id).await? else {
                continue;
            };
            let key = self.layout.key_by_hash(&hash);
            let raw: Option<String> = self.conn().get(&key).await.map_err(unavailable)?;
            let Some(raw) = raw else {
                continue;
            };
            // An unreadable record (it serves no request either) does not block the rotation.
            let Ok(record) = decode::<KeyRecord>(&key, &raw) else {
                continue;
            };
            if let Some(changed) = crate::keys::with_descendant(&record, successor, now) {
                extended.push((raw, changed));
            }
        }
        Ok(extended)
    }

    /// Connects lazily (the gateway starts, and reports not-ready, while Redis is down) and
    /// starts the change listener. Must run inside the Tokio runtime that will drive the
    /// connection for the life of the process.
    pub fn connect(url: &str, namespace: &str) -> Result<Self, StoreError> {
        Self::connect_with_tls(url, namespace, None)
    }

    /// [`connect`](Self::connect) to a `rediss://` URL with a CA of its own to trust or a
    /// client certificate (`None`: the system's roots, no client certificate).
    pub fn connect_with_tls(
        url: &str,
        namespace: &str,
        tls: Option<redis::TlsCertificates>,
    ) -> Result<Self, StoreError> {
        Self::connect_with(url, namespace, tls, None)
    }

    /// [`connect_with_tls`](Self::connect_with_tls), and with `sentinels`, to the master they
    /// name, followed through failovers (`url` then gives the credentials, database and TLS,
    /// and the node to start with).
    pub fn connect_with(
        url: &str,
        namespace: &str,
        tls: Option<redis::TlsCertificates>,
        sentinels: Option<&Sentinels>,
    ) -> Result<Self, StoreError> {
        let client = connection::client_for(url, tls.clone())?;
        let connections = match sentinels {
            Some(sentinels) => Connections::via_sentinels(client, sentinels, tls)?,
            None => Connections::direct(client)?,
        };
        let layout = Layout::new(namespace);
        let changed = Arc::new(Notify::new());
        let minted = Arc::new(MintedTokens::default());
        tokio::spawn(listen_for_changes(
            Arc::downgrade(&connections),
            Channels {
                changed: layout.channel(),
                minted: layout.tokens_channel(),
                live_tokens: layout.live_tokens(),
            },
            changed.clone(),
            minted.clone(),
        ));
        Ok(Self {
            connections,
            layout,
            changed,
            minted,
            audit_retention_secs: 30 * 86_400,
            audit_codec: audit_codec::AuditCodec::new(),
            replicated: sentinels.is_some(),
            filling: tokio::sync::Mutex::new(()),
            runtime: tokio::runtime::Handle::current(),
            index_fill: IndexFillTiming::default(),
        })
    }

    /// Where the store's connections go now (`host:port`): the master, with Sentinels.
    pub fn address(&self) -> String {
        self.connections.address()
    }

    /// Keeps audit records for `days` (default 30).
    pub fn with_audit_retention_days(mut self, days: u64) -> Self {
        self.audit_retention_secs = days.saturating_mul(86_400);
        self
    }

    /// Paces the workspace index fill and its lease by `timing` instead of the defaults.
    pub fn with_index_fill_timing(mut self, timing: IndexFillTiming) -> Self {
        self.index_fill = timing;
        self
    }

    fn conn(&self) -> ConnectionManager {
        self.connections.manager()
    }

    /// [`DeliveryQueue::update_endpoint`]; with `restart`, the endpoint starts afresh even if
    /// neither its URL nor its status changes ([`DeliveryQueue::resume_endpoint`]).
    async fn change_endpoint(
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
            next.secret = current.secret;
            let paused = next.status == crate::webhooks::endpoint::EndpointStatus::Paused;
            let fresh_start = restart || next.url != current.url || next.status != current.status;
            let swapped: i64 = ENDPOINT_CAS
                .arg(self.prefix())
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

    async fn update(
        &self,
        id: &str,
        change: KeyChange<'_>,
        event: Option<&Event>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        let Some(hash) = self.hash_of(id).await? else {
            return Ok(None);
        };
        let record_key = self.layout.key_by_hash(&hash);
        for _ in 0..UPDATE_ATTEMPTS {
            let raw: Option<String> = self.conn().get(&record_key).await.map_err(unavailable)?;
            let Some(raw) = raw else { return Ok(None) };
            let current: KeyRecord = decode(&record_key, &raw)?;
            let mut next = current.clone();
            change(&mut next);
            next.id = current.id.clone();
            next.workspace = current.workspace.clone();
            next.hash = current.hash;
            if next == current {
                // Nothing to write, and no event: whoever made it so emitted it (perhaps a
                // call answered 503 below, retried: it is confirmed now).
                self.on_a_replica().await?;
                return Ok(Some(Arc::new(current)));
            }
            let mut invocation = UPDATE_KEY.prepare_invoke();
            invocation
                .key(&record_key)
                .key(self.layout.epoch())
                .key(self.layout.log())
                .key(self.layout.events())
                .arg(&raw)
                .arg(encode(&next))
                .arg(hash.to_hex())
                .arg(self.layout.channel())
                .arg(CHANGE_LOG_LEN)
                .arg(new_mark());
            if let Some(event) = event {
                invocation
                    .arg(&event.id)
                    .arg(&event.event_type)
                    .arg(event.created)
                    .arg(&event.workspace)
                    .arg(event.environment.as_str())
                    .arg(event.data.to_string());
            }
            let epoch: i64 = invocation
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            if epoch >= 0 {
                self.on_a_replica().await?;
                return Ok(Some(Arc::new(next)));
            }
        }
        Err(changing_too_often("key", id))
    }

    /// One page of a stream: `XRANGE` (oldest first, `from` ≤ `to`) or `XREVRANGE` (newest
    /// first, `from` ≥ `to`), at most `count` entries.
    async fn stream_range(
        &self,
        command: &str,
        key: &str,
        from: &str,
        to: &str,
        count: usize,
    ) -> Result<Vec<redis::streams::StreamId>, StoreError> {
        let reply: Value = redis::cmd(command)
            .arg(key)
            .arg(from)
            .arg(to)
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        streams::range(reply)
    }

    /// Behind Sentinels, waits until a replica has this connection's writes. A key change
    /// (a revocation, an end of grace, fewer scopes) is confirmed only then: replication is
    /// asynchronous, and a failover right after a change no replica had would undo it, and
    /// the revoked key would work again everywhere. Unconfirmed, the change is an error (503):
    /// the caller retries, and the retry, which changes nothing more, is confirmed once a
    /// replica has caught up.
    async fn on_a_replica(&self) -> Result<(), StoreError> {
        if !self.replicated {
            return Ok(());
        }
        let confirmed: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(REPLICA_WAIT_MS)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if confirmed >= 1 {
            Ok(())
        } else {
            tracing::warn!("a change is on the Redis master, and no replica has confirmed it");
            Err(StoreError::Unavailable(
                "no replica confirmed the change".into(),
            ))
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let raw: Option<String> = self.conn().get(key).await.map_err(unavailable)?;
        raw.map(|s| decode(key, &s)).transpose()
    }
}

/// Notes a token minted, from a tokens-channel message (`<digest hex> <expires_at>`); anything
/// else is ignored.
fn heard_of_token(minted: &MintedTokens, payload: &[u8]) {
    let text = std::str::from_utf8(payload).unwrap_or_default();
    let mut parts = text.split(' ');
    let hash = parts.next().and_then(KeyHash::from_hex);
    let expires_at = parts.next().and_then(|e| e.parse().ok());
    if let (Some(hash), Some(expires_at)) = (hash, expires_at) {
        minted.add(&hash, expires_at);
    }
}

/// How often the key-change subscription is asked whether it still answers.
const SUBSCRIPTION_CHECK: Duration = Duration::from_secs(5);
/// How long that answer may take before the subscription is opened anew.
const SUBSCRIPTION_PING_TIMEOUT: Duration = Duration::from_secs(3);

/// The channels [`listen_for_changes`] subscribes to.
struct Channels {
    /// Key changes: the new epoch.
    changed: String,
    /// Tokens minted: `<digest hex> <expires_at>`.
    minted: String,
    /// Not a channel: the set of live tokens, read after subscribing to `minted`.
    live_tokens: String,
}

/// Live tokens read by one `ZSCAN` ([`read_live_tokens`]).
const LIVE_TOKENS_SCAN: usize = 1_000;

/// Adds to `minted` the scoped tokens in the set of live tokens `key` that have not expired:
/// read after subscribing to the tokens channel, it finds every token minted before (while this
/// replica was not subscribed: pub/sub keeps no backlog), and the channel every token after.
async fn read_live_tokens(
    conn: &mut ConnectionManager,
    key: &str,
    minted: &MintedTokens,
) -> Result<(), redis::RedisError> {
    let now = crate::ids::unix_now();
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<(String, f64)>) = redis::cmd("ZSCAN")
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(LIVE_TOKENS_SCAN)
            .query_async(conn)
            .await?;
        for (hex, expires_at) in page {
            let expires_at = expires_at as u64;
            match KeyHash::from_hex(&hex) {
                Some(hash) if expires_at > now => minted.add(&hash, expires_at),
                _ => {}
            }
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The tokens channel's part of [`listen_for_changes`].
struct TokensFeed<'a> {
    channels: &'a Channels,
    minted: &'a MintedTokens,
    /// Whether the current subscription includes the channel.
    hearing: bool,
    /// Whether the channel was refused last time: a run of refusals is logged once.
    refused: bool,
}

impl TokensFeed<'_> {
    /// Subscribes `sink` (a subscription already up) to the tokens channel, then reads the
    /// live tokens over `conn` (a token minted meanwhile is in one or both).
    async fn subscribe(&mut self, sink: &mut redis::aio::PubSubSink, conn: &mut ConnectionManager) {
        self.hearing = match sink.subscribe(&self.channels.minted).await {
            Ok(()) => true,
            Err(e) => {
                if !std::mem::replace(&mut self.refused, true) {
                    let again_in_secs = SUBSCRIPTION_CHECK.as_secs();
                    tracing::warn!(error = %e, again_in_secs, "cannot subscribe to scoped tokens minted; meanwhile the key directory lists those its listings find");
                }
                false
            }
        };
        if !self.hearing {
            return;
        }
        if std::mem::take(&mut self.refused) {
            tracing::info!("subscribed to scoped tokens minted");
        }
        if let Err(e) = read_live_tokens(conn, &self.channels.live_tokens, self.minted).await {
            tracing::warn!(error = %e, "cannot read the scoped tokens minted before subscribing; the key directory lists those its listings find");
        }
    }
}

/// Subscribes to the change channel and wakes the key cache for every message, and once after
/// every (re)subscription so anything missed while disconnected is caught up; and to the tokens
/// channel, whose messages go to `minted`, as do the live tokens, read after each subscription
/// to it (a channel refused is asked for again at every PING below). Resubscribes on the new
/// master when Sentinel moves it, and when the subscription stops answering a PING; ends with
/// the store.
async fn listen_for_changes(
    connections: std::sync::Weak<Connections>,
    channels: Channels,
    changed: Arc<Notify>,
    minted: Arc<MintedTokens>,
) {
    use futures_util::StreamExt;
    let mut backoff = Duration::from_millis(100);
    let mut tokens = TokensFeed {
        channels: &channels,
        minted: &minted,
        hearing: false,
        refused: false,
    };
    loop {
        let Some((client, mut conn, mut moved)) = connections
            .upgrade()
            .map(|c| (c.client(), c.manager(), c.moved()))
        else {
            return;
        };
        moved.mark_unchanged();
        match client.get_async_pubsub().await {
            Ok(pubsub) => {
                let (mut sink, mut messages) = pubsub.split();
                match sink.subscribe(&channels.changed).await {
                    Ok(()) => {
                        backoff = Duration::from_millis(100);
                        // Apart: a Redis user may be allowed one channel and not the other.
                        tokens.subscribe(&mut sink, &mut conn).await;
                        changed.notify_one();
                        // A subscriber only reads: a connection that stays open and carries
                        // nothing (a NAT or proxy that dropped the flow) would go unnoticed.
                        let mut check = tokio::time::interval_at(
                            tokio::time::Instant::now() + SUBSCRIPTION_CHECK,
                            SUBSCRIPTION_CHECK,
                        );
                        loop {
                            tokio::select! {
                                message = messages.next() => match message {
                                    Some(m) if m.get_channel_name() == channels.minted => {
                                        heard_of_token(&minted, m.get_payload_bytes());
                                    }
                                    Some(_) => changed.notify_one(),
                                    None => {
                                        tracing::warn!("key change subscription lost; reconnecting");
                                        break;
                                    }
                                },
                                _ = check.tick() => {
                                    let pong = tokio::time::timeout(
                                        SUBSCRIPTION_PING_TIMEOUT,
                                        sink.ping::<redis::Value>(),
                                    );
                                    if !matches!(pong.await, Ok(Ok(_))) {
                                        tracing::warn!(
                                            "key change subscription stopped answering; reconnecting"
                                        );
                                        break;
                                    }
                                    // A channel refused may have been allowed since.
                                    if !tokens.hearing {
                                        tokens.subscribe(&mut sink, &mut conn).await;
                                    }
                                }
                                // The master moved, or the store is gone.
                                _ = moved.changed() => break,
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot subscribe to key changes"),
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot connect for key changes"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// A random mark for a change-log entry ([`CHANGES_SINCE`]).
fn new_mark() -> String {
    crate::ids::new_id("m")
}

/// `Ok` for a write that created its record; a conflict naming it otherwise.
fn created_or_conflict(created: bool, what: &str, id: &str) -> Result<(), StoreError> {
    if created {
        Ok(())
    } else {
        Err(StoreError::Conflict(format!("{what} {id} exists")))
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// `text` matched literally in a `SCAN … MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, raw: &str) -> Result<T, StoreError> {
    serde_json::from_str(raw)
        .map_err(|e| StoreError::Unavailable(format!("unreadable record at {key}: {e}")))
}

fn encode<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("records serialize")
}

#[async_trait]
impl StoreHealth for RedisStore {
    fn reopen_connections(&self) {
        if let Err(e) = self.connections.reconnect() {
            tracing::warn!(error = %e, "cannot reopen the Redis connections");
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn prepare(&self) -> Result<(), StoreError> {
        self.fill_workspace_index(None).await
    }
}

#[async_trait]
impl KeyStore for RedisStore {
    async fn create_workspace(&self, workspace: &Workspace) -> Result<(), StoreError> {
        let created: i64 = CREATE_WORKSPACE
            .key(self.layout.workspace(&workspace.id))
            .key(self.layout.workspace_index())
            .arg(encode(workspace))
            .arg(workspace.created_at)
            .arg(&workspace.id)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        created_or_conflict(created == 1, "workspace", &workspace.id)
    }

    async fn workspaces(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Workspace>, bool), StoreError> {
        if limit == 0 {
            return Ok((Vec::new(), false));
        }
        // A listing does not wait long for another replica's fill: it is an admin's request.
        self.fill_workspace_index(Some(INDEX_FILL_LISTING_WAIT))
            .await?;
        let start = match after {
            Some(id) => self.workspace_rank_after(id).await?,
            None => 0,
        };
        let mut ids = self
            .range(
                &self.layout.workspace_index(),
                start,
                limit.saturating_add(1),
            )
            .await?;
        let more = ids.len() > limit;
        ids.truncate(limit);
        if ids.is_empty() {
            return Ok((Vec::new(), more));
        }
        let record_keys: Vec<String> = ids.iter().map(|id| self.layout.workspace(id)).collect();
        let raw: Vec<Option<String>> = self.conn().mget(&record_keys).await.map_err(unavailable)?;
        // A record that does not decode is left out of the page, not the page refused.
        let page = record_keys
            .iter()
            .zip(raw)
            .filter_map(|(key, raw)| decode(key, &raw?).ok())
            .collect();
        Ok((page, more))
    }

    async fn workspace(&self, id: &str) -> Result<Option<Workspace>, StoreError> {
        let mut conn = self.conn();
        let (raw, rank): (Option<String>, Option<f64>) = redis::pipe()
            .get(self.layout.workspace(id))
            .zscore(self.layout.workspace_index(), id)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        let workspace: Workspace = decode(&self.layout.workspace(id), &raw)?;
        // Created by an earlier version (during a rolling upgrade): indexed now. A read does not
        // fail for it (a Redis out of memory, read-only in a failover): the next read tries again.
        if rank.is_none() {
            let indexed = conn
                .zadd::<_, _, _, ()>(self.layout.workspace_index(), id, workspace.created_at)
                .await;
            if let Err(e) = indexed {
                tracing::warn!(error = %e, workspace = id, "cannot index a workspace");
            }
        }
        Ok(Some(workspace))
    }

    async fn update_workspace(
        &self,
        id: &str,
        change: WorkspaceChange<'_>,
    ) -> Result<Option<Workspace>, StoreError> {
        let key = self.layout.workspace(id);
        for _ in 0..UPDATE_ATTEMPTS {
            let raw: Option<String> = self.conn().get(&key).await.map_err(unavailable)?;
            let Some(raw) = raw else { return Ok(None) };
            let current: Workspace = decode(&key, &raw)?;
            let mut next = current.clone();
            change(&mut next);
            next.id = current.id.clone();
            next.created_at = current.created_at;
            if next == current {
                return Ok(Some(current));
            }
            let swapped: i64 = SET_IF_UNCHANGED
                .key(&key)
                .arg(&raw)
                .arg(encode(&next))
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            if let Some(done) = settled(swapped, next) {
                return Ok(done);
            }
        }
        Err(changing_too_often("workspace", id))
    }

    async fn insert_key(&self, key: &KeyRecord) -> Result<(), StoreError> {
        let l = &self.layout;
        let epoch: i64 = INSERT_KEY
            .key(l.key_by_hash(&key.hash))
            .key(l.key_by_id(&key.id))
            .key(l.workspace_keys(&key.workspace))
            .key(l.epoch())
            .key(l.log())
            .arg(encode(key))
            .arg(key.hash.to_hex())
            .arg(&key.id)
            .arg(key.created_at)
            .arg(l.channel())
            .arg(CHANGE_LOG_LEN)
            .arg(new_mark())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if epoch < 0 {
            return Err(StoreError::Conflict(format!("key {} exists", key.id)));
        }
        Ok(())
    }

    async fn key_by_hash(&self, hash: &KeyHash) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        Ok(self
            .get_json::<KeyRecord>(&self.layout.key_by_hash(hash))
            .await?
            .map(Arc::new))
    }

    async fn key_by_id(&self, id: &str) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        match self.hash_of(id).await? {
            Some(hash) => self.key_by_hash(&hash).await,
            None => Ok(None),
        }
    }

    /// `SCAN` for the records by digest, [`KEY_DIGESTS_SCAN`] slots of the keyspace a page.
    async fn key_digests(&self, cursor: u64) -> Result<(Vec<KeyHash>, u64), StoreError> {
        let prefix = self.layout.key_by_hash_prefix();
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(KEY_DIGESTS_SCAN)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let digests = names
            .iter()
            .filter_map(|name| KeyHash::from_hex(name.strip_prefix(&prefix)?))
            .collect();
        Ok((digests, next))
    }

    async fn keys_in_workspace(
        &self,
        workspace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Arc<KeyRecord>>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let ids = self
            .page(&self.layout.workspace_keys(workspace), after, limit)
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn();
        let id_keys: Vec<String> = ids.iter().map(|id| self.layout.key_by_id(id)).collect();
        let hashes: Vec<Option<String>> = conn.mget(&id_keys).await.map_err(unavailable)?;
        let record_keys: Vec<String> = hashes
            .iter()
            .flatten()
            .filter_map(|h| KeyHash::from_hex(h))
            .map(|h| self.layout.key_by_hash(&h))
            .collect();
        if record_keys.is_empty() {
            return Ok(Vec::new());
        }
        let records: Vec<Option<String>> = conn.mget(&record_keys).await.map_err(unavailable)?;
        records
            .into_iter()
            .zip(&record_keys)
            .filter_map(|(raw, key)| raw.map(|raw| decode::<KeyRecord>(key, &raw).map(Arc::new)))
            .collect()
    }

    async fn update_key(
        &self,
        id: &str,
        change: KeyChange<'_>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        self.update(id, change, None).await
    }

    async fn update_key_emitting(
        &self,
        id: &str,
        change: KeyChange<'_>,
        event: &Event,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        self.update(id, change, Some(event)).await
    }

    async fn key_changes_since(&self, epoch: u64, mark: &str) -> Result<KeyChanges, StoreError> {
        let reply: Vec<Value> = CHANGES_SINCE
            .key(self.layout.epoch())
            .key(self.layout.log())
            .arg(epoch)
            .arg(CATCH_UP_MAX)
            .arg(mark)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut items = reply.into_iter();
        let current = match items.next() {
            Some(Value::Int(e)) if e >= 0 => e as u64,
            other => {
                return Err(StoreError::Unavailable(format!(
                    "unexpected change-log reply: {other:?}"
                )))
            }
        };
        let text = |item: &Value| -> String {
            match item {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => String::new(),
            }
        };
        let mark = items.next().map(|m| text(&m)).unwrap_or_default();
        let mut changed = Vec::new();
        for item in items {
            let text = text(&item);
            if text == "reset" {
                return Ok(KeyChanges {
                    epoch: current,
                    mark,
                    changed: None,
                });
            }
            if let Some(hash) = KeyHash::from_hex(&text) {
                changed.push(hash);
            }
        }
        Ok(KeyChanges {
            epoch: current,
            mark,
            changed: Some(changed),
        })
    }

    fn key_change_signal(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    async fn rotate_key(
        &self,
        old_id: &str,
        successor: &KeyRecord,
        grace_until: u64,
    ) -> Result<Rotation, StoreError> {
        let l = &self.layout;
        let Some(old_hash) = self.hash_of(old_id).await? else {
            return Ok(Rotation::NotFound);
        };
        let old_key = l.key_by_hash(&old_hash);
        let successor_key = l.key_by_hash(&successor.hash);
        for _ in 0..UPDATE_ATTEMPTS {
            let raw: Option<String> = self.conn().get(&old_key).await.map_err(unavailable)?;
            let Some(raw) = raw else {
                return Ok(Rotation::NotFound);
            };
            let old: KeyRecord = decode(&old_key, &raw)?;
            if old.status != KeyStatus::Active {
                let exists: bool = self
                    .conn()
                    .exists(&successor_key)
                    .await
                    .map_err(unavailable)?;
                return Ok(if exists {
                    Rotation::AlreadyRotated
                } else {
                    Rotation::NotRotatable(old.status)
                });
            }
            let mut successor = successor.clone();
            crate::keys::inherit(&mut successor, &old);
            let mut rotated = old.clone();
            rotated.status = KeyStatus::Rotating;
            rotated.grace_until = Some(grace_until);
            rotated.rotated_to = Some(successor.id.clone());
            let extended = self.extended_predecessors(&old, &successor.id).await?;
            let mut script = ROTATE_KEY.prepare_invoke();
            script
                .key(&old_key)
                .key(&successor_key)
                .key(l.key_by_id(&successor.id))
                .key(l.workspace_keys(&successor.workspace))
                .key(l.epoch())
                .key(l.log())
                .arg(&raw)
                .arg(encode(&rotated))
                .arg(encode(&successor))
                .arg(old_hash.to_hex())
                .arg(successor.hash.to_hex())
                .arg(&successor.id)
                .arg(successor.created_at)
                .arg(l.channel())
                .arg(CHANGE_LOG_LEN)
                .arg(new_mark());
            for (raw, changed) in &extended {
                script
                    .key(l.key_by_hash(&changed.hash))
                    .arg(raw)
                    .arg(encode(changed))
                    .arg(changed.hash.to_hex());
            }
            let epoch: i64 = script
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            match epoch {
                -2 => return Ok(Rotation::AlreadyRotated),
                -1 => continue,
                _ => {
                    return Ok(Rotation::Rotated {
                        old: Arc::new(rotated),
                        successor: Arc::new(successor),
                    })
                }
            }
        }
        Err(StoreError::Conflict(format!(
            "key {old_id} is changing too often; retry"
        )))
    }

    async fn idempotency_salt(
        &self,
        scope: &str,
        fresh: &str,
        ttl_secs: u64,
    ) -> Result<String, StoreError> {
        let salt: String = GET_OR_SET
            .key(self.layout.idempotency_salt(scope))
            .arg(fresh)
            .arg(ttl_secs.max(1))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        // Lost in a failover, a new salt would make a retry another key: it is on a replica
        // before any key is derived from it. (One found was confirmed so, or its request got a
        // 503; a replica with the key derived from it then has it too, written before it.)
        if salt == fresh {
            self.on_a_replica().await?;
        }
        Ok(salt)
    }

    async fn insert_token(&self, token: &KeyRecord, ttl_secs: u64) -> Result<(), StoreError> {
        let expires_at = token.scoped.as_ref().map_or(0, |grant| grant.expires_at);
        let created: i64 = INSERT_TOKEN
            .key(self.layout.key_by_hash(&token.hash))
            .key(self.layout.key_by_id(&token.id))
            .key(self.layout.live_tokens())
            .arg(encode(token))
            .arg(token.hash.to_hex())
            .arg(ttl_secs.max(1))
            .arg(self.layout.tokens_channel())
            .arg(expires_at)
            .arg(crate::ids::unix_now())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        created_or_conflict(created == 1, "token", &token.id)
    }

    fn minted_tokens(&self) -> Arc<MintedTokens> {
        self.minted.clone()
    }
}

#[async_trait]
impl ListenSlots for RedisStore {
    async fn hold_listen_slot(
        &self,
        key_id: &str,
        stream: &str,
        max: usize,
        lease_ms: u64,
    ) -> Result<bool, StoreError> {
        let held: i64 = HOLD_LISTEN_SLOT
            .key(self.layout.listen_slots(key_id))
            .arg(stream)
            .arg(max)
            .arg(lease_ms.max(1))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(held == 1)
    }

    async fn release_listen_slot(&self, key_id: &str, stream: &str) -> Result<(), StoreError> {
        self.conn()
            .zrem::<_, _, ()>(self.layout.listen_slots(key_id), stream)
            .await
            .map_err(unavailable)
    }
}

#[async_trait]
impl UsageStore for RedisStore {
    async fn flush_usage(&self, flush: &UsageFlush) -> Result<UsageSnapshot, StoreError> {
        let batch = serde_json::to_string(flush).expect("flushes serialize");
        let raw: String = FLUSH_USAGE
            .key(self.layout.events())
            .arg(self.prefix())
            .arg(batch)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let raw: RawSnapshot = serde_json::from_str(&raw)
            .map_err(|e| StoreError::Unavailable(format!("unreadable flush reply: {e}")))?;
        Ok(UsageSnapshot {
            workspaces: raw
                .workspaces
                .into_iter()
                .map(|(ws, t)| {
                    (
                        ws,
                        WorkspaceTotals {
                            total: parse_int(&t.total),
                            monthly_credits: t.monthly_credits.as_deref().map(parse_int),
                            keys: t.keys.parsed(),
                            projects: t.projects.parsed(),
                            project_budgets: t.project_budgets.parsed(),
                        },
                    )
                })
                .collect(),
            rate: raw
                .rate
                .into_iter()
                .map(|(key, r)| {
                    (
                        key,
                        RateTotals {
                            window: parse_int(&r.window) as u64,
                            previous: parse_int(&r.previous) as u64,
                            current: parse_int(&r.current) as u64,
                        },
                    )
                })
                .collect(),
        })
    }

    async fn project_budgets(&self, workspace: &str) -> Result<HashMap<String, i64>, StoreError> {
        let raw: HashMap<String, String> = self
            .conn()
            .hgetall(self.layout.budgets(workspace))
            .await
            .map_err(unavailable)?;
        Ok(raw
            .into_iter()
            .filter_map(|(project, budget)| Some((project, budget.parse().ok()?)))
            .collect())
    }

    async fn set_project_budget(
        &self,
        workspace: &str,
        project: &str,
        budget: Option<i64>,
    ) -> Result<(), StoreError> {
        let key = self.layout.budgets(workspace);
        let mut conn = self.conn();
        match budget {
            Some(b) => conn.hset::<_, _, _, ()>(key, project, b).await,
            None => conn.hdel::<_, _, ()>(key, project).await,
        }
        .map_err(unavailable)
    }

    async fn usage_report(&self, workspace: &str, month: &str) -> Result<UsageReport, StoreError> {
        let fields: HashMap<String, String> = self
            .conn()
            .hgetall(self.layout.spend(workspace, month))
            .await
            .map_err(unavailable)?;
        let mut report = UsageReport::default();
        for (field, value) in fields {
            let v = parse_int(&value);
            if field == "total" {
                report.total = v;
            } else if let Some(id) = field.strip_prefix("key:") {
                report.keys.insert(id.to_string(), v);
            } else if let Some(p) = field.strip_prefix("project:") {
                report.projects.insert(p.to_string(), v);
            }
        }
        Ok(report)
    }
}

#[async_trait]
impl AuditStore for RedisStore {
    async fn append_audit(
        &self,
        records: &[AuditRecord],
        once: Option<&str>,
    ) -> Result<(), StoreError> {
        // One entry per record: a fast hash, not SipHash (workspace ids are not secrets).
        let mut by_workspace: HashMap<&str, Vec<&AuditRecord>, foldhash::fast::RandomState> =
            HashMap::default();
        for r in records {
            by_workspace.entry(&r.workspace).or_default().push(r);
        }
        let min_id = (crate::ids::unix_now().saturating_sub(self.audit_retention_secs)) * 1000;
        let batches: Vec<AuditBatch> = by_workspace
            .into_iter()
            .map(|(ws, batch)| {
                // Sized for a typical record, so the buffer is not grown record by record.
                let mut json = Vec::with_capacity(batch.len() * 400);
                AuditRecord::write_json_array(&batch, &mut json);
                AuditBatch {
                    workspace: ws,
                    stream: self.layout.audit(ws),
                    newest: batch.iter().map(|r| r.time_ms).max().unwrap_or(0),
                    records: self.audit_codec.encode(json),
                }
            })
            .collect();
        let mut conn = self.conn();
        if let Some(once) = once {
            let mut pipe = redis::pipe();
            for b in &batches {
                pipe.cmd("EVAL")
                    .arg(APPEND_AUDIT)
                    .arg(2)
                    .arg(&b.stream)
                    .arg(self.layout.audit_once(b.workspace, once))
                    .arg(min_id)
                    .arg(&b.records)
                    .arg(b.newest)
                    .arg(AUDIT_AHEAD_MAX_MS)
                    .ignore();
            }
            return pipe.query_async(&mut conn).await.map_err(unavailable);
        }
        let mut pipe = redis::pipe();
        for b in &batches {
            pipe.cmd("XADD")
                .arg(&b.stream)
                .arg("MINID")
                .arg("~")
                .arg(min_id)
                .arg("*")
                .arg("records")
                .arg(&b.records);
        }
        let ids: Vec<String> = pipe.query_async(&mut conn).await.map_err(unavailable)?;
        // Entries dated earlier than their newest record: moved, and if that fails the batch
        // is sent again (and shown once), so that a query `since` a time finds its records.
        let mut moves = redis::pipe();
        for (b, id) in batches.iter().zip(&ids) {
            if b.newest > stream_id_ms(id).unwrap_or(u64::MAX) {
                moves
                    .cmd("EVAL")
                    .arg(APPEND_AUDIT)
                    .arg(1)
                    .arg(&b.stream)
                    .arg(min_id)
                    .arg(&b.records)
                    .arg(b.newest)
                    .arg(AUDIT_AHEAD_MAX_MS)
                    .arg(id)
                    .ignore();
            }
        }
        if !moves.is_empty() {
            moves
                .query_async::<()>(&mut conn)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        let key = self.layout.audit(&query.workspace);
        let mut out = Vec::new();
        let mut end = "+".to_string();
        let since_ms = query.since.map(|s| s.saturating_mul(1000));
        let mut seen = std::collections::HashSet::new();
        // Entries come newest-written first, but replicas write their batches at different
        // times: an entry written earlier can hold newer records. A batch is written after
        // every record in it arrived, so once `limit` records are held, an entry written before
        // the oldest of them holds none that belongs in the answer. A page after a cursor reads
        // from the newest entry too: a batch written later may hold older records (spooled
        // through an outage, or sent by a replica whose writer was behind).
        let mut cutoff_ms: Option<u64> = None;
        'pages: loop {
            let page = self.stream_range("XREVRANGE", &key, &end, "-", 100).await?;
            if page.is_empty() {
                break;
            }
            for entry in &page {
                let written_ms = stream_id_ms(&entry.id).unwrap_or(u64::MAX);
                // A batch is written after every record in it arrived: by Redis's clock, while
                // records carry their gateway's, which may run a little ahead.
                let written_ms = written_ms.saturating_add(AUDIT_CLOCK_SKEW_MS);
                if since_ms.is_some_and(|s| written_ms < s)
                    || cutoff_ms.is_some_and(|c| written_ms < c)
                {
                    break 'pages;
                }
                let raw: Vec<u8> = entry.get("records").unwrap_or_default();
                let batch: Vec<AuditRecord> = audit_codec::decode(&raw)
                    .and_then(|json| serde_json::from_slice(&json).ok())
                    .unwrap_or_default();
                // A batch whose acknowledgement was lost is written again: show it once.
                out.extend(
                    batch
                        .into_iter()
                        .filter(|r| query.matches(r) && seen.insert(r.request_id.clone())),
                );
                if out.len() >= query.limit {
                    AuditRecord::sort_listing(&mut out);
                    out.truncate(query.limit);
                    cutoff_ms = out.last().map(|r| r.time_ms);
                }
                end = format!("({}", entry.id);
            }
        }
        AuditRecord::sort_listing(&mut out);
        out.truncate(query.limit);
        Ok(out)
    }
}

#[async_trait]
impl EventLog for RedisStore {
    async fn append_event(&self, event: &Event) -> Result<(), StoreError> {
        let min_id = crate::ids::unix_now().saturating_sub(crate::events::RETENTION_SECS) * 1000;
        redis::cmd("XADD")
            .arg(self.layout.events())
            .arg("MINID")
            .arg("~")
            .arg(min_id)
            .arg("*")
            .arg("id")
            .arg(&event.id)
            .arg("type")
            .arg(&event.event_type)
            .arg("created")
            .arg(event.created)
            .arg("workspace")
            .arg(&event.workspace)
            .arg("environment")
            .arg(event.environment.as_str())
            .arg("data")
            .arg(event.data.to_string())
            .query_async::<String>(&mut self.conn())
            .await
            .map(|_| ())
            .map_err(unavailable)
    }

    async fn tail_events(&self) -> Result<Box<dyn EventFeed>, StoreError> {
        self.tail().await
    }

    async fn event_log_floor(&self) -> Result<Option<String>, StoreError> {
        self.log_floor().await
    }

    async fn consume_events(
        &self,
        consumer: &str,
        reclaim_after: Duration,
    ) -> Result<Box<dyn EventFeed>, StoreError> {
        self.consume(consumer, reclaim_after).await
    }
}

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
        let removed: i64 = DELETE_ENDPOINT
            .arg(self.prefix())
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
}

#[async_trait]
impl NoticeStore for RedisStore {
    async fn claim_pause_notices(
        &self,
        now_ms: u64,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<PauseNotice>, StoreError> {
        self.claim_notices(now_ms, lease, max).await
    }

    async fn retry_pause_notice(
        &self,
        notice: &PauseNotice,
        due_ms: u64,
    ) -> Result<(), StoreError> {
        self.retry_notice(notice, due_ms).await
    }

    async fn remove_pause_notice(&self, id: &str) -> Result<(), StoreError> {
        self.remove_notice(id).await
    }
}
