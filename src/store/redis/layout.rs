//! The names of everything the Redis store keeps; each starts with the configured namespace
//! `ns`:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{ns}:schema` | integer | the schema version of the data ([`super::schema`]) |
//! | `{ns}:ws:<id>` | string | workspace JSON |
//! | `{ns}:workspaces` | sorted set | workspace ids, scored by creation time (unix seconds) |
//! | `{ns}:workspaces:filled` | string | set once the index holds the workspaces of versions before it |
//! | `{ns}:workspaces:filling` | string, with a TTL | the lease of the replica filling that index (a random token) |
//! | `{ns}:listen:<key id>` | sorted set | the key's open `listen` streams (request ids), scored by when their lease ends (ms) |
//! | `{ns}:idem:<digest>` | string | an `Idempotency-Key`'s salt (24 hours), under an HMAC of the key and what it is for |
//! | `{ns}:dash:session:<sha256 hex>` | string | a dashboard session, under the digest of its cookie (idle TTL) |
//! | `{ns}:dash:link:<sha256 hex>` | string | a sign-in link, under the digest of its token (15 minutes, taken once) |
//! | `{ns}:dash:tries:<bucket>:<window end>` | integer | sign-in attempts of an address or e-mail in an hour's window (expires) |
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
//! | `{ns}:rl:mint:<key id>:<minute>` | integer | scoped tokens the key minted in that window (expires) |
//! | `{ns}:last_used` | hash | key id → the unix second of the minute of its last request (set by the usage flush) |
//! | `{ns}:operators` | hash | operator token digest hex → operator token JSON (name, role, workspace; never the token) |
//! | `{ns}:endpoints:<ws>` | hash | webhook endpoint id → endpoint JSON (with its secret) |
//! | `{ns}:wh:cursor` | string | an event-log entry id such that every entry up to it is fanned out (kept behind the oldest entry pending in the group); where a lost consumer group restarts |
//! | `{ns}:wh:ready` | sorted set | `<ws> <endpoint id>` of every endpoint with queued deliveries, scored by the earliest due time (ms) |
//! | `{ns}:wh:due:<endpoint id>` | sorted set | the endpoint's queued delivery ids, scored by due time (ms); a claimed one by its lease's end |
//! | `{ns}:wh:dlv:<delivery id>` | string | delivery JSON: its event but for the payload (in the event's record; with it before schema version 4), status, attempts, last attempt (30 days from its last save) |
//! | `{ns}:wh:log:<endpoint id>` | list | the endpoint's latest delivery ids, newest first (1,000) |
//! | `{ns}:wh:evt:<ws>:<env>:<event id>` | string | event JSON, for replay and its deliveries' payload (30 days, and as long as any of its delivery records; `{ns}:wh:evt:<event id>` before schema version 2, still read) |
//! | `{ns}:wh:replay:<ws>:<env>` | sorted set | the workspace's event ids in one environment, scored by `created` (unix seconds), for replays since a time (30 days) |
//! | `{ns}:wh:hold:<endpoint id>` | hash | an endpoint held back by a failure: `failures` in a row, `until` (ms) nothing of its queue is due, `probe` the delivery that goes first then, `tries` its claims with no attempt saved; gone once it answers, is paused, deleted, resumed or given a new URL |
//! | `{ns}:wh:pending` | integer | queued deliveries |
//! | `{ns}:wh:paused` | set | `<ws> <endpoint id>` of paused endpoints |
//! | `{ns}:wh:notices` | hash | pause notice id → notice JSON: an e-mail owed to a workspace's admins, queued with the pause, removed once sent |
//! | `{ns}:wh:notices:due` | sorted set | pause notice ids, scored by when the next try is due (ms); a claimed one by its lease's end |
//! | `{ns}:sandbox:job:<id>` | string | a simulated job's record JSON: its workspace, environment and timeline (a day) |
//! | `{ns}:sandbox:due` | sorted set | simulated jobs' events not yet in the event log, each `[id, type, workspace, environment, data JSON]`, scored by when it is due (ms) |
//! | `ns:audit:{<ws>}` | stream | audit records, one entry per written batch (`records` = JSON array, zstd-compressed; written uncompressed before schema version 6) |
//! | `ns:audit:{<ws>}:once:<id>` | string | an audit spool write already appended (a day) |
//! | channel `ns:keys:changed` | pub/sub | the new epoch, published by every key write |
//! | channel `ns:tokens:minted` | pub/sub | `<digest hex> <expires_at>` of every scoped token minted (the key directory) |
//! | `{ns}:keys:tokens` | sorted set | digest hex of every scoped token minted, scored by its expiry (unix seconds): read by each replica when it subscribes to the tokens channel (pub/sub keeps no backlog); expired ones go at the next mint |

use crate::keys::KeyHash;

/// Names of everything this store keeps in Redis.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) ns: String,
    pub(super) registry: String,
}

impl Layout {
    pub(super) fn new(ns: &str) -> Self {
        Self {
            ns: ns.to_string(),
            registry: format!("{{{ns}}}:keys"),
        }
    }
    pub(super) fn workspace(&self, id: &str) -> String {
        format!("{{{}}}:ws:{id}", self.ns)
    }
    /// Every workspace's id, scored by its creation time.
    pub(super) fn workspace_index(&self) -> String {
        format!("{{{}}}:workspaces", self.ns)
    }
    /// The schema version of the data ([`super::schema`]).
    pub(super) fn schema(&self) -> String {
        format!("{{{}}}:schema", self.ns)
    }
    /// Set once the index holds the workspaces created before it existed.
    pub(super) fn workspace_index_filled(&self) -> String {
        format!("{{{}}}:workspaces:filled", self.ns)
    }
    /// Held by the one replica filling the index (its token), for a lease renewed as it goes.
    pub(super) fn workspace_index_filling(&self) -> String {
        format!("{{{}}}:workspaces:filling", self.ns)
    }
    pub(super) fn key_by_hash(&self, hash: &KeyHash) -> String {
        format!("{}:h:{}", self.registry, hash.to_hex())
    }
    /// What every [`Layout::key_by_hash`] starts with; the namespace has no `SCAN` pattern
    /// characters (`[A-Za-z0-9._-]`).
    pub(super) fn key_by_hash_prefix(&self) -> String {
        format!("{}:h:", self.registry)
    }
    pub(super) fn live_tokens(&self) -> String {
        format!("{}:tokens", self.registry)
    }
    pub(super) fn key_by_id(&self, id: &str) -> String {
        format!("{}:id:{id}", self.registry)
    }
    pub(super) fn workspace_keys(&self, workspace: &str) -> String {
        format!("{}:ws:{workspace}", self.registry)
    }
    pub(super) fn epoch(&self) -> String {
        format!("{}:epoch", self.registry)
    }
    pub(super) fn log(&self) -> String {
        format!("{}:log", self.registry)
    }
    pub(super) fn events(&self) -> String {
        format!("{{{}}}:events", self.ns)
    }
    pub(super) fn spend(&self, workspace: &str, month: &str) -> String {
        format!("{{{}}}:spend:{workspace}:{month}", self.ns)
    }
    /// A budget's leases in a month; `scope` is `key:<id>`, `project:<name>` or `workspace`.
    pub(super) fn lease(&self, workspace: &str, month: &str, scope: &str) -> String {
        format!("{{{}}}:lease:{workspace}:{month}:{scope}", self.ns)
    }
    pub(super) fn budgets(&self, workspace: &str) -> String {
        format!("{{{}}}:budgets:{workspace}", self.ns)
    }
    pub(super) fn endpoints(&self, workspace: &str) -> String {
        format!("{{{}}}:endpoints:{workspace}", self.ns)
    }
    pub(super) fn audit(&self, workspace: &str) -> String {
        format!("{}:audit:{{{workspace}}}", self.ns)
    }
    /// Set once a batch of audit records with id `once` is in the workspace's stream.
    pub(super) fn audit_once(&self, workspace: &str, once: &str) -> String {
        format!("{}:once:{once}", self.audit(workspace))
    }
    pub(super) fn last_used(&self) -> String {
        format!("{{{}}}:last_used", self.ns)
    }
    pub(super) fn operators(&self) -> String {
        format!("{{{}}}:operators", self.ns)
    }
    pub(super) fn listen_slots(&self, key_id: &str) -> String {
        format!("{{{}}}:listen:{key_id}", self.ns)
    }
    pub(super) fn idempotency_salt(&self, scope: &str) -> String {
        format!("{{{}}}:idem:{scope}", self.ns)
    }
    pub(super) fn channel(&self) -> String {
        format!("{}:keys:changed", self.ns)
    }
    pub(super) fn tokens_channel(&self) -> String {
        format!("{}:tokens:minted", self.ns)
    }
}
