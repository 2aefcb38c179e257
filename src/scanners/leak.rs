//! One found token, handled the same way whoever found it (an operator's report, GitHub's
//! alert, a scanner inside the gateway): a live key (or a live key's scoped token) is revoked
//! and `key.auto_revoked` fires for its workspace in the same atomic store write; a test key is
//! only reported, since it cannot bill or reach the live backend.

use serde_json::json;
use std::sync::Arc;

use crate::events::Event;
use crate::ids::unix_now;
use crate::keys::format::{self, KeyHash};
use crate::keys::store::KeyStore;
use crate::keys::{Environment, KeyRecord, KeyStatus};
use crate::shared::store::StoreError;

/// Where a token was found, as `key.auto_revoked` and the audit record name it.
#[derive(Debug, Clone, Copy)]
pub struct FoundToken<'a> {
    /// The token as found.
    pub token: &'a str,
    /// Where it was seen (a commit's URL, say).
    pub url: Option<&'a str>,
    /// What saw it (`content`, `commit`, `browser`, `request_body`, …).
    pub source: Option<&'a str>,
}

/// What was done with a found token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeakAction {
    /// A live key, now revoked (or revoked already).
    Revoked,
    /// A key that was left working: a test key or token, or a live one the configuration
    /// only reports.
    Reported,
    /// No key of this store.
    NotFound,
}

impl LeakAction {
    /// The name used in metrics and audit records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Revoked => "revoked",
            Self::Reported => "reported",
            Self::NotFound => "not_found",
        }
    }
}

/// What became of one found token.
#[derive(Debug, Clone)]
pub struct Handled {
    /// What was done.
    pub action: LeakAction,
    /// The key, when it is one of ours (as it was before any revocation).
    pub key: Option<Arc<KeyRecord>>,
    /// Whether this call revoked it (not a report of a key revoked already).
    pub newly_revoked: bool,
}

impl Handled {
    fn not_found() -> Self {
        Self {
            action: LeakAction::NotFound,
            key: None,
            newly_revoked: false,
        }
    }
}

/// Whether `key` bills and reaches the live backend: a live key, or a token minted from one.
pub fn is_live(key: &KeyRecord) -> bool {
    match &key.scoped {
        Some(grant) => grant.parent_environment == Environment::Live,
        None => key.environment == Environment::Live,
    }
}

/// Looks `found` up and, when `revoke` and it is a live key or a live key's token, revokes it
/// with `key.auto_revoked` (source and url in its data) in one atomic write.
pub async fn handle(
    keys: &dyn KeyStore,
    found: FoundToken<'_>,
    revoke: bool,
) -> Result<Handled, StoreError> {
    let token = found.token.trim();
    if format::parse(token).is_err() {
        return Ok(Handled::not_found());
    }
    let Some(key) = keys.key_by_hash(&KeyHash::of(token)).await? else {
        return Ok(Handled::not_found());
    };
    if !revoke || !is_live(&key) {
        tracing::info!(key_id = %key.id, source = found.source.unwrap_or(""), "leaked key reported, not revoked");
        return Ok(Handled {
            action: LeakAction::Reported,
            key: Some(key),
            newly_revoked: false,
        });
    }
    if key.status == KeyStatus::Revoked {
        return Ok(Handled {
            action: LeakAction::Revoked,
            key: Some(key),
            newly_revoked: false,
        });
    }
    let event = Event::new(
        "key.auto_revoked",
        &key.workspace,
        Environment::Live,
        json!({
            "key_id": key.id,
            "prefix": key.prefix,
            "last4": key.last4,
            "url": found.url,
            "source": found.source,
            "revoked_at": unix_now(),
        }),
    );
    match keys
        .update_key_emitting(&key.id, &revoke_key, &event)
        .await?
    {
        Some(_) => {
            tracing::warn!(key_id = %key.id, workspace = %key.workspace, event_id = %event.id, "leaked key revoked");
            Ok(Handled {
                action: LeakAction::Revoked,
                key: Some(key),
                newly_revoked: true,
            })
        }
        // Gone between the lookup and the write (a token that just expired).
        None => Ok(Handled::not_found()),
    }
}

fn revoke_key(k: &mut KeyRecord) {
    k.status = KeyStatus::Revoked;
    k.grace_until = None;
}
