//! The key model: environments, key records and scopes.
//!
//! Pure data and pure functions; the stores persist these types ([`store`] is the storage it
//! needs) and the request path reads them through the key cache ([`cache`], with the
//! [`directory`] of every key held).

pub mod cache;
pub mod config;
pub mod directory;
pub mod format;
pub mod manage;
pub mod operators;
pub mod scopes;
pub mod settings;
pub mod store;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use crate::shared::environment::Environment;
use crate::shared::Credits;
pub use format::{KeyFormatError, KeyHash, NewKey};
pub use scopes::{Scope, Scopes};
pub use settings::{Metadata, RateLimit, SharedLimit};

/// Lifecycle state of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyStatus {
    /// Accepted.
    Active,
    /// Replaced by a newer key; accepted until `grace_until`.
    Rotating,
    /// Never accepted again.
    Revoked,
}

impl KeyStatus {
    /// The name used in JSON and messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Rotating => "rotating",
            Self::Revoked => "revoked",
        }
    }
}

/// Why a well-formed, known key is not accepted right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The key was revoked.
    Revoked,
    /// The key passed its `expires_at`.
    KeyExpired,
    /// The key was rotated and its grace period is over.
    GraceExpired,
    /// A scoped token past its expiry.
    Expired,
    /// A scoped token whose parent key is gone, revoked or past its grace period.
    ParentInvalid,
}

impl Rejection {
    /// A short, stable label for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Revoked => "revoked",
            Self::KeyExpired => "key_expired",
            Self::GraceExpired => "grace_expired",
            Self::Expired => "token_expired",
            Self::ParentInvalid => "parent_invalid",
        }
    }
}

/// A stored API key. Holds the key's digest, never its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// `key_…`
    pub id: String,
    /// The workspace the key belongs to (`ws_…`).
    pub workspace: String,
    /// Human-readable label.
    #[serde(default)]
    pub name: String,
    /// Selected by the key's prefix.
    pub environment: Environment,
    /// What the key may do.
    pub scopes: Scopes,
    /// Optional monthly spending cap.
    #[serde(default)]
    pub monthly_budget: Option<Credits>,
    /// Lifecycle state.
    pub status: KeyStatus,
    /// Unix seconds.
    pub created_at: u64,
    /// For a rotated key, the unix second its grace period ends.
    #[serde(default)]
    pub grace_until: Option<u64>,
    /// The visible head of the key: its environment prefix.
    pub prefix: String,
    /// The visible tail of the key.
    pub last4: String,
    /// SHA-256 digest of the key value.
    pub hash: KeyHash,
    /// For a rotation's new key, the key it replaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_from: Option<String>,
    /// For a rotated key, the key that replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_to: Option<String>,
    /// The keys this one replaced, oldest first (at most [`MAX_PREDECESSORS`]): its monthly
    /// budget counts their spend too, so a rotation does not open a new month's budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub predecessors: Vec<String>,
    /// For a rotated key, the keys that replaced its successor in turn (oldest first, at most
    /// [`MAX_PREDECESSORS`]) while it was still in grace: its budget counts their spend too, so
    /// the whole lineage shares one budget whichever of its keys a request uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descendants: Vec<String>,
    /// For a scoped token, what it was minted from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoped: Option<Box<ScopedGrant>>,
    /// Unix second the key stops working, if it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// The key's own rate limit, over its workspace's and its environment's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Free-form key/value pairs, in the audit records of the key and its tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// What makes a scoped token (`svc_scoped_…`): minted from a parent key, for a subset of its
/// scopes, until `expires_at`. It is accepted only while its parent is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScopedGrant {
    /// The parent key's id: the key requests are attributed and billed to.
    pub parent_id: String,
    /// The parent key's digest, to check the parent from the key cache.
    pub parent_hash: KeyHash,
    /// The parent's environment: where the token's requests go.
    pub parent_environment: Environment,
    /// Unix second the token stops working.
    pub expires_at: u64,
    /// Caller-supplied key/value pairs, in every audit record (shared, not copied: a backlog
    /// of records kept through a store outage holds one copy per token).
    #[serde(default)]
    pub metadata: Arc<serde_json::Map<String, serde_json::Value>>,
}

/// Longest grace period a rotation may have: 30 days.
pub const MAX_GRACE_SECONDS: u64 = 30 * 86_400;

/// A key as the request path holds it: the fields a request needs and nothing more, with the
/// workspace and scope set shared between keys. A million of these fit in a few hundred MB.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedKey {
    /// `key_…` or, for a scoped token, `tok_…` (shared with the rate limiter and audit records).
    pub id: Arc<str>,
    /// The workspace it belongs to.
    pub workspace: Arc<str>,
    /// Selected by the key's prefix.
    pub environment: Environment,
    /// What it may do.
    pub scopes: Arc<Scopes>,
    /// Lifecycle state.
    pub status: KeyStatus,
    /// For a rotated key, the unix second its grace period ends.
    pub grace_until: Option<u64>,
    /// Optional monthly spending cap.
    pub monthly_budget: Option<Credits>,
    /// Keys whose spend the budget counts besides this one's: the keys it replaced and, while
    /// it is in its grace period, its successor. Empty without a budget.
    pub budget_peers: Box<[Arc<str>]>,
    /// For a scoped token, what it was minted from.
    pub scoped: Option<Box<ScopedGrant>>,
    /// The visible tail of the key, for audit records.
    pub last4: [u8; 4],
    /// Unix second the key stops working, if it expires.
    pub expires_at: Option<u64>,
    /// The key's own rate limit.
    pub rate_limit: Option<RateLimit>,
    /// Its workspace's rate limit: one cell per workspace, shared by its cached keys.
    pub workspace_limit: Arc<SharedLimit>,
    /// The key's metadata, and the same as compact visible-ASCII JSON (a header's value).
    pub metadata: Option<(Metadata, Arc<str>)>,
}

impl CachedKey {
    /// The request path's view of `record`, with `workspace` and `scopes` as given (shared),
    /// for a workspace without a rate limit.
    pub fn new(record: &KeyRecord, workspace: Arc<str>, scopes: Arc<Scopes>) -> Self {
        Self::new_in(record, workspace, scopes, Arc::new(SharedLimit::of(None)))
    }

    /// [`Self::new`], with the workspace's rate limit as given (shared).
    pub fn new_in(
        record: &KeyRecord,
        workspace: Arc<str>,
        scopes: Arc<Scopes>,
        workspace_limit: Arc<SharedLimit>,
    ) -> Self {
        Self {
            id: record.id.as_str().into(),
            workspace,
            environment: record.environment,
            scopes,
            status: record.status,
            grace_until: record.grace_until,
            monthly_budget: record.monthly_budget,
            budget_peers: match record.monthly_budget {
                Some(_) => record
                    .predecessors
                    .iter()
                    .chain(&record.rotated_to)
                    .chain(&record.descendants)
                    .map(|id| Arc::from(id.as_str()))
                    .collect(),
                None => Box::default(),
            },
            scoped: record.scoped.clone(),
            last4: record.last4.as_bytes().try_into().unwrap_or([b'?'; 4]),
            expires_at: record.expires_at,
            rate_limit: record.rate_limit,
            workspace_limit,
            metadata: record
                .metadata
                .as_ref()
                .filter(|m| !m.is_empty())
                .map(|m| (m.clone(), settings::header_json(m).into())),
        }
    }

    /// The rate limit that overrides the environment's: the key's own, else its workspace's.
    #[inline]
    pub fn rate_limit_override(&self) -> Option<RateLimit> {
        self.rate_limit.or_else(|| self.workspace_limit.get())
    }

    /// The visible form of the key: its prefix and last four characters.
    pub fn masked(&self) -> CompactString {
        // Built directly: this runs for every audit record, and `format!` costs several times
        // more. At most 16 bytes, held inline.
        let prefix = self.environment.key_prefix();
        let last4 = std::str::from_utf8(&self.last4).unwrap_or("????");
        let mut masked = CompactString::const_new("");
        masked.push_str(prefix);
        masked.push('…');
        masked.push_str(last4);
        masked
    }

    /// The environment requests are served and billed in: a scoped token's parent's.
    pub fn effective_environment(&self) -> Environment {
        self.scoped
            .as_ref()
            .map_or(self.environment, |g| g.parent_environment)
    }

    /// The key requests are attributed to: the parent, for a scoped token.
    pub fn billed_key_id(&self) -> &str {
        self.scoped.as_ref().map_or(&self.id, |g| &g.parent_id)
    }

    /// [`Self::billed_key_id`], shared: a key's own id is not copied (a token's parent id is).
    pub fn billed_key_id_shared(&self) -> Arc<str> {
        match &self.scoped {
            Some(g) => Arc::from(g.parent_id.as_str()),
            None => self.id.clone(),
        }
    }

    /// Whether the key is accepted at unix second `now` (a scoped token's parent is checked
    /// separately).
    pub fn check_usable(&self, now: u64) -> Result<(), Rejection> {
        if let Some(grant) = &self.scoped {
            if now >= grant.expires_at {
                return Err(Rejection::Expired);
            }
        }
        if self.status != KeyStatus::Revoked && self.expires_at.is_some_and(|at| now >= at) {
            return Err(Rejection::KeyExpired);
        }
        match self.status {
            KeyStatus::Active => Ok(()),
            KeyStatus::Revoked => Err(Rejection::Revoked),
            KeyStatus::Rotating => match self.grace_until {
                Some(until) if now < until => Ok(()),
                _ => Err(Rejection::GraceExpired),
            },
        }
    }

    /// Whether the token has expired by unix second `now` (never, for a key).
    pub fn expired(&self, now: u64) -> bool {
        self.scoped.as_ref().is_some_and(|g| g.expires_at <= now)
    }
}

/// What a new key is issued with.
#[derive(Debug, Clone)]
pub struct KeyParams {
    /// Owning workspace.
    pub workspace: String,
    /// `Live` or `Test` (scoped tokens are minted, not issued).
    pub environment: Environment,
    /// Granted scopes.
    pub scopes: Scopes,
    /// Label.
    pub name: String,
    /// Optional monthly cap.
    pub monthly_budget: Option<Credits>,
    /// Unix second the key stops working, if it expires.
    pub expires_at: Option<u64>,
    /// The key's own rate limit.
    pub rate_limit: Option<RateLimit>,
    /// Free-form key/value pairs.
    pub metadata: Option<Metadata>,
}

/// Generates a key and its record. The value is returned once and never stored.
pub fn issue(params: KeyParams, now: u64) -> (NewKey, KeyRecord) {
    let key = format::generate(params.environment);
    let record = record_of(params, &key, now);
    (key, record)
}

/// The record of a new key whose value is `key` (see [`format::derive`]).
pub fn record_of(params: KeyParams, key: &NewKey, now: u64) -> KeyRecord {
    KeyRecord {
        id: crate::ids::new_id("key"),
        workspace: params.workspace,
        name: params.name,
        environment: params.environment,
        scopes: params.scopes,
        monthly_budget: params.monthly_budget,
        status: KeyStatus::Active,
        created_at: now,
        grace_until: None,
        prefix: params.environment.key_prefix().to_string(),
        last4: format::last4(&key.value).to_string(),
        hash: key.hash,
        rotated_from: None,
        rotated_to: None,
        descendants: Vec::new(),
        predecessors: Vec::new(),
        scoped: None,
        expires_at: params.expires_at,
        rate_limit: params.rate_limit,
        metadata: params.metadata,
    }
}

/// A scoped token minted from `parent` (whose digest is `parent_hash`): its value (shown
/// once) and its record.
pub fn mint(
    parent: &CachedKey,
    parent_hash: KeyHash,
    scopes: Scopes,
    expires_in: u64,
    metadata: serde_json::Map<String, serde_json::Value>,
    now: u64,
) -> (NewKey, KeyRecord) {
    let key = format::generate(Environment::Scoped);
    let record = KeyRecord {
        id: crate::ids::new_id("tok"),
        workspace: parent.workspace.to_string(),
        name: String::new(),
        environment: Environment::Scoped,
        scopes,
        monthly_budget: None,
        status: KeyStatus::Active,
        created_at: now,
        grace_until: None,
        prefix: Environment::Scoped.key_prefix().to_string(),
        last4: format::last4(&key.value).to_string(),
        hash: key.hash,
        rotated_from: None,
        rotated_to: None,
        descendants: Vec::new(),
        predecessors: Vec::new(),
        scoped: Some(Box::new(ScopedGrant {
            parent_id: parent.id.to_string(),
            parent_hash,
            parent_environment: parent.effective_environment(),
            expires_at: now.saturating_add(expires_in),
            metadata: Arc::new(metadata),
        })),
        expires_at: None,
        rate_limit: None,
        // The parent's metadata as it is now: in the token's audit records, and forwarded.
        metadata: parent.metadata.as_ref().map(|(m, _)| m.clone()),
    };
    (key, record)
}

/// How many replaced keys a key's budget remembers: a dozen rotations in one month.
pub const MAX_PREDECESSORS: usize = 12;

/// `old`'s predecessors and `old` itself: what its successor's budget counts.
fn successor_lineage(old: &KeyRecord) -> Vec<String> {
    let mut lineage = old.predecessors.clone();
    lineage.push(old.id.clone());
    let excess = lineage.len().saturating_sub(MAX_PREDECESSORS);
    lineage.drain(..excess);
    lineage
}

/// Makes `successor` carry what it inherits from `old` as `old` is now: name, scopes, budget
/// and lineage. A store calls it in the step that rotates, with the record it checked, so a
/// change made to the old key after the successor was built (a narrowed scope) is not lost.
pub fn inherit(successor: &mut KeyRecord, old: &KeyRecord) {
    successor.name = old.name.clone();
    successor.scopes = old.scopes.clone();
    successor.monthly_budget = old.monthly_budget;
    successor.predecessors = successor_lineage(old);
    successor.expires_at = old.expires_at;
    successor.rate_limit = old.rate_limit;
    successor.metadata = old.metadata.clone();
}

/// `predecessor` as it is once `successor` (a key whose lineage it is in) replaced a key after
/// it, if that changes it: a key still in grace counts the new key's spend against its budget.
/// `None` for a key that no longer works (its grace is over, or it is revoked) or already
/// counts it.
pub fn with_descendant(predecessor: &KeyRecord, successor: &str, now: u64) -> Option<KeyRecord> {
    let in_grace = predecessor.status == KeyStatus::Rotating
        && predecessor.grace_until.is_some_and(|until| until > now);
    let counted = predecessor.rotated_to.as_deref() == Some(successor)
        || predecessor.descendants.iter().any(|d| d == successor);
    if !in_grace || counted {
        return None;
    }
    let mut changed = predecessor.clone();
    changed.descendants.push(successor.to_string());
    let excess = changed.descendants.len().saturating_sub(MAX_PREDECESSORS);
    changed.descendants.drain(..excess);
    Some(changed)
}

/// The record of the key that replaces `old` in a rotation: same workspace, environment,
/// scopes, name and budget, and the budget's spend so far (`predecessors`).
pub fn successor(old: &KeyRecord, key: &NewKey, now: u64) -> KeyRecord {
    KeyRecord {
        id: crate::ids::new_id("key"),
        workspace: old.workspace.clone(),
        name: old.name.clone(),
        environment: old.environment,
        scopes: old.scopes.clone(),
        monthly_budget: old.monthly_budget,
        status: KeyStatus::Active,
        created_at: now,
        grace_until: None,
        prefix: old.environment.key_prefix().to_string(),
        last4: format::last4(&key.value).to_string(),
        hash: key.hash,
        rotated_from: Some(old.id.clone()),
        rotated_to: None,
        descendants: Vec::new(),
        predecessors: successor_lineage(old),
        scoped: None,
        expires_at: old.expires_at,
        rate_limit: old.rate_limit,
        metadata: old.metadata.clone(),
    }
}

/// The digest under which a change to workspace `id` is logged in the key change log, so
/// that key caches read its rate limit again. No key hashes to it: keys are hashed from their
/// values, which never contain a space.
pub fn workspace_digest(id: &str) -> KeyHash {
    KeyHash::of(&format!("workspace {id}"))
}

/// A workspace: the owner of keys, endpoints and budgets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Workspace {
    /// `ws_…`
    pub id: String,
    /// Display name.
    pub name: String,
    /// Who is e-mailed when an endpoint is paused.
    #[serde(default)]
    pub admin_emails: Vec<String>,
    /// Monthly credit allowance, if capped.
    #[serde(default)]
    pub monthly_credits: Option<Credits>,
    /// `billing.credits.low` fires when the remainder drops below this.
    #[serde(default)]
    pub credits_low_threshold: Option<Credits>,
    /// The rate limit of each of its keys that sets none, over the environment's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Unix seconds.
    pub created_at: u64,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A live key `key_1` of workspace `ws_1`, for tests here and in other modules.
    pub(crate) fn record(status: KeyStatus, grace_until: Option<u64>) -> KeyRecord {
        let key = format::generate(Environment::Live);
        KeyRecord {
            id: "key_1".into(),
            workspace: "ws_1".into(),
            name: String::new(),
            environment: Environment::Live,
            scopes: Scopes::default(),
            monthly_budget: None,
            status,
            created_at: 0,
            grace_until,
            prefix: Environment::Live.key_prefix().into(),
            last4: format::last4(&key.value).into(),
            hash: key.hash,
            rotated_from: None,
            rotated_to: None,
            descendants: Vec::new(),
            predecessors: Vec::new(),
            scoped: None,
            expires_at: None,
            rate_limit: None,
            metadata: None,
        }
    }

    #[test]
    fn scoped_tokens_expire_and_inherit_the_parent_environment() {
        let mut parent = record(KeyStatus::Active, None);
        parent.environment = Environment::Test;
        let parent = cached(&parent);
        let parent_hash = KeyHash::of("parent");
        let (value, token) = mint(
            &parent,
            parent_hash,
            Scopes::new(["a:b"]),
            60,
            Default::default(),
            100,
        );
        assert!(value.value.starts_with("svc_scoped_"));
        assert_eq!(token.scoped.as_ref().unwrap().parent_hash, parent_hash);
        let token = cached(&token);
        assert_eq!(token.effective_environment(), Environment::Test);
        assert_eq!(token.billed_key_id(), &*parent.id);
        assert_eq!(token.check_usable(159), Ok(()));
        assert_eq!(token.check_usable(160), Err(Rejection::Expired));
        assert!(token.expired(160) && !token.expired(159));
        assert_eq!(parent.billed_key_id(), &*parent.id);
    }

    #[test]
    fn a_successor_remembers_a_dozen_predecessors_for_its_budget() {
        let mut key = record(KeyStatus::Active, None);
        key.monthly_budget = Some(Credits::from_micros(1));
        let mut ids = vec![key.id.clone()];
        for _ in 0..15 {
            key = successor(&key, &format::generate(Environment::Live), 0);
            ids.push(key.id.clone());
        }
        let last = ids.pop().unwrap();
        assert_eq!(key.id, last);
        assert_eq!(key.predecessors, ids[ids.len() - MAX_PREDECESSORS..]);
        assert_eq!(cached(&key).budget_peers.len(), MAX_PREDECESSORS);
        // Rotated in turn, its successor's spend counts too; without a budget, nothing does.
        key.rotated_to = Some("key_next".into());
        assert_eq!(
            cached(&key).budget_peers.last().map(|p| &**p),
            Some("key_next")
        );
        key.monthly_budget = None;
        assert!(cached(&key).budget_peers.is_empty());
    }

    fn cached(r: &KeyRecord) -> CachedKey {
        CachedKey::new(r, r.workspace.as_str().into(), Arc::new(r.scopes.clone()))
    }

    #[test]
    fn the_masked_form_is_the_prefix_and_the_last_four() {
        let mut r = record(KeyStatus::Active, None);
        r.last4 = "Ab9z".into();
        let masked = cached(&r).masked();
        assert_eq!(masked, "svc_live_…Ab9z");
        // Rendered for every audit record: held inline, no allocation.
        assert!(!masked.is_heap_allocated());
        r.environment = Environment::Test;
        r.last4 = "x".into();
        assert_eq!(cached(&r).masked(), "svc_test_…????");
    }

    #[test]
    fn usability_follows_status_and_grace() {
        assert_eq!(
            cached(&record(KeyStatus::Active, None)).check_usable(10),
            Ok(())
        );
        assert_eq!(
            cached(&record(KeyStatus::Revoked, None)).check_usable(10),
            Err(Rejection::Revoked)
        );
        let rotating = cached(&record(KeyStatus::Rotating, Some(100)));
        assert_eq!(rotating.check_usable(99), Ok(()));
        assert_eq!(rotating.check_usable(100), Err(Rejection::GraceExpired));
        assert_eq!(
            cached(&record(KeyStatus::Rotating, None)).check_usable(0),
            Err(Rejection::GraceExpired)
        );
    }

    #[test]
    fn a_key_stops_at_its_expiry_and_a_revocation_still_says_revoked() {
        let mut r = record(KeyStatus::Active, None);
        r.expires_at = Some(100);
        let key = cached(&r);
        assert_eq!(key.check_usable(99), Ok(()));
        assert_eq!(key.check_usable(100), Err(Rejection::KeyExpired));
        r.status = KeyStatus::Revoked;
        assert_eq!(cached(&r).check_usable(200), Err(Rejection::Revoked));
        // In grace, it ends at whichever comes first.
        r.status = KeyStatus::Rotating;
        r.grace_until = Some(150);
        assert_eq!(cached(&r).check_usable(120), Err(Rejection::KeyExpired));
        r.expires_at = Some(300);
        assert_eq!(cached(&r).check_usable(160), Err(Rejection::GraceExpired));
        // Without the new fields (as records written before them are): read as absent.
        let plain = serde_json::to_string(&record(KeyStatus::Active, None)).unwrap();
        assert!(!plain.contains("expires_at") && !plain.contains("rate_limit"));
        let back: KeyRecord = serde_json::from_str(&plain).unwrap();
        assert_eq!(
            (back.expires_at, back.rate_limit, back.metadata),
            (None, None, None)
        );
    }

    #[test]
    fn a_token_carries_its_key_metadata_and_the_key_limit_wins_over_the_workspace() {
        let mut r = record(KeyStatus::Active, None);
        let serde_json::Value::Object(m) = serde_json::json!({"customer": "cus_1"}) else {
            unreachable!()
        };
        r.metadata = Some(Arc::new(m));
        let workspace = Arc::new(SharedLimit::of(Some(RateLimit {
            requests_per_minute: 10,
            burst: None,
        })));
        let parent = CachedKey::new_in(&r, "ws_1".into(), Arc::default(), workspace.clone());
        assert_eq!(
            parent.rate_limit_override().map(|l| l.requests_per_minute),
            Some(10)
        );
        let (_, token) = mint(
            &parent,
            r.hash,
            Scopes::default(),
            60,
            Default::default(),
            0,
        );
        assert_eq!(token.metadata, r.metadata);
        assert_eq!(
            cached(&token).metadata.unwrap().1.as_ref(),
            r#"{"customer":"cus_1"}"#
        );
        r.rate_limit = Some(RateLimit {
            requests_per_minute: 3,
            burst: Some(1),
        });
        let own = CachedKey::new_in(&r, "ws_1".into(), Arc::default(), workspace);
        assert_eq!(own.rate_limit_override().map(|l| l.burst()), Some(1));
    }

    #[test]
    fn record_json_never_contains_the_key_value() {
        let r = record(KeyStatus::Active, None);
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(&r.hash.to_hex()));
        let back: KeyRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn only_a_key_still_in_grace_counts_a_later_successor() {
        let mut rotating = record(KeyStatus::Rotating, None);
        rotating.grace_until = Some(2_000);
        rotating.rotated_to = Some("key_b".into());
        assert!(
            with_descendant(&rotating, "key_b", 1_000).is_none(),
            "its own successor"
        );
        let extended = with_descendant(&rotating, "key_c", 1_000).expect("in grace");
        assert_eq!(extended.descendants, ["key_c"]);
        assert!(
            with_descendant(&extended, "key_c", 1_000).is_none(),
            "counted already"
        );
        assert!(
            with_descendant(&rotating, "key_c", 2_000).is_none(),
            "grace over"
        );
        let revoked = record(KeyStatus::Revoked, None);
        assert!(with_descendant(&revoked, "key_c", 1_000).is_none());
        // Its budget counts it; at most a dozen are kept, the latest.
        let mut key = extended;
        key.monthly_budget = Some(Credits::from_micros(5));
        for n in 0..MAX_PREDECESSORS {
            key = with_descendant(&key, &format!("key_{n}"), 1_000).unwrap();
        }
        assert_eq!(key.descendants.len(), MAX_PREDECESSORS);
        let peers = cached(&key).budget_peers;
        assert!(peers.iter().any(|p| &**p == "key_b"));
        assert!(peers.iter().any(|p| &**p == "key_11"));
        assert!(!peers.iter().any(|p| &**p == "key_c"), "the oldest dropped");
    }
}
