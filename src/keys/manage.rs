//! What the admin API and the dashboard do to a workspace's keys: check a new key's settings,
//! store it, rotate it, revoke it, change its scopes, name or budget. Both call these, so a key
//! made in the dashboard is the key the admin API makes.

use std::sync::Arc;

use super::format::NewKey;
use super::scopes::is_valid_scope;
use super::store::{KeyStore, Rotation};
use super::MAX_GRACE_SECONDS;
use super::{record_of, successor, Environment, KeyParams, KeyRecord, KeyStatus, Scopes};
use crate::shared::store::StoreError;
use crate::shared::Credits;

/// Longest key name, in characters.
pub const MAX_NAME_CHARS: usize = 200;

/// Why a key operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The input is not acceptable; the message says why.
    #[error("{0}")]
    Invalid(String),
    /// The store did not answer, or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The scopes named by `names`: at least one, each `resource:action`.
pub fn parse_scopes(names: &[String]) -> Result<Scopes, KeyError> {
    if names.is_empty() {
        return Err(KeyError::Invalid(
            "scopes must name at least one scope".into(),
        ));
    }
    if let Some(bad) = names.iter().find(|s| !is_valid_scope(s)) {
        return Err(KeyError::Invalid(format!(
            "'{bad}' is not a scope like resource:action"
        )));
    }
    Ok(Scopes::new(names))
}

/// Checks a key's name: at most [`MAX_NAME_CHARS`] characters.
pub fn check_name(name: &str) -> Result<(), KeyError> {
    match name.chars().count() > MAX_NAME_CHARS {
        true => Err(KeyError::Invalid(format!(
            "name must be at most {MAX_NAME_CHARS} characters"
        ))),
        false => Ok(()),
    }
}

/// The settings of a key to issue, checked: live or test, valid scopes, a name not too long.
pub fn new_key_params(
    workspace: String,
    environment: Environment,
    scopes: &[String],
    name: String,
    monthly_budget: Option<Credits>,
) -> Result<KeyParams, KeyError> {
    if environment == Environment::Scoped {
        return Err(KeyError::Invalid(
            "environment must be \"live\" or \"test\"; scoped tokens are minted with POST /v1/tokens"
                .into(),
        ));
    }
    let scopes = parse_scopes(scopes)?;
    check_name(&name)?;
    Ok(KeyParams {
        workspace,
        environment,
        scopes,
        name,
        monthly_budget,
        expires_at: None,
        rate_limit: None,
        metadata: None,
    })
}

/// Stores the key `params` describe, whose value is `key`; its record.
pub async fn create(
    store: &dyn KeyStore,
    params: KeyParams,
    key: &NewKey,
    now: u64,
) -> Result<KeyRecord, StoreError> {
    let record = record_of(params, key, now);
    store.insert_key(&record).await?;
    tracing::info!(key_id = %record.id, workspace = %record.workspace, "key created");
    Ok(record)
}

/// The grace period of a rotation: the one asked for, or `default`; at most
/// [`MAX_GRACE_SECONDS`].
pub fn grace_seconds(asked: Option<u64>, default: u64) -> Result<u64, KeyError> {
    let grace = asked.unwrap_or(default);
    match grace > MAX_GRACE_SECONDS {
        true => Err(KeyError::Invalid(format!(
            "grace_period_seconds must be at most {MAX_GRACE_SECONDS}"
        ))),
        false => Ok(grace),
    }
}

/// What a rotation did.
pub enum Rotated {
    /// The successor, stored; the old key works until the grace period ends.
    Successor(Arc<KeyRecord>),
    /// The successor of this value exists already: a retry of a rotation that went through.
    Before,
    /// No such key.
    NotFound,
}

/// Rotates `old` to a successor whose value is `key`; the old key keeps working for `grace`
/// seconds. Only an active key is rotated.
pub async fn rotate(
    store: &dyn KeyStore,
    old: &KeyRecord,
    key: &NewKey,
    grace: u64,
    now: u64,
) -> Result<Rotated, KeyError> {
    let successor = successor(old, key, now);
    match store
        .rotate_key(&old.id, &successor, now.saturating_add(grace))
        .await?
    {
        Rotation::Rotated { successor, .. } => {
            tracing::info!(key_id = %old.id, successor = %successor.id, grace, "key rotated");
            Ok(Rotated::Successor(successor))
        }
        Rotation::AlreadyRotated => Ok(Rotated::Before),
        Rotation::NotFound => Ok(Rotated::NotFound),
        Rotation::NotRotatable(status) => Err(KeyError::Invalid(format!(
            "only an active key can be rotated; this one is {}",
            status.as_str()
        ))),
    }
}

/// Revokes key or token `id` at once; its record, or `None` if there is none.
pub async fn revoke(store: &dyn KeyStore, id: &str) -> Result<Option<Arc<KeyRecord>>, KeyError> {
    let revoked = store
        .update_key(id, &|k: &mut KeyRecord| {
            k.status = KeyStatus::Revoked;
            k.grace_until = None;
        })
        .await?;
    if let Some(k) = &revoked {
        tracing::info!(key_id = %k.id, workspace = %k.workspace, "key revoked");
    }
    Ok(revoked)
}

/// A change to a key: each part present is applied.
#[derive(Default)]
pub struct KeyChange {
    /// New scopes.
    pub scopes: Option<Scopes>,
    /// `Some(None)`: no budget; `Some(Some(b))`: budget `b`.
    pub monthly_budget: Option<Option<Credits>>,
    /// New name.
    pub name: Option<String>,
    /// `Some(None)`: never expires; `Some(Some(t))`: expires at unix second `t`.
    pub expires_at: Option<Option<u64>>,
    /// `Some(None)`: the environment's (or workspace's) limit; `Some(Some(l))`: limit `l`.
    pub rate_limit: Option<Option<super::RateLimit>>,
    /// `Some(None)`: no metadata; `Some(Some(m))`: metadata `m`.
    pub metadata: Option<Option<super::Metadata>>,
}

/// Applies `change` to key `id`; its record, or `None` if there is none.
pub async fn change(
    store: &dyn KeyStore,
    id: &str,
    change: KeyChange,
) -> Result<Option<Arc<KeyRecord>>, KeyError> {
    if let Some(name) = &change.name {
        check_name(name)?;
    }
    let updated = store
        .update_key(id, &|k: &mut KeyRecord| {
            if let Some(scopes) = &change.scopes {
                k.scopes = scopes.clone();
            }
            if let Some(budget) = change.monthly_budget {
                k.monthly_budget = budget;
            }
            if let Some(name) = &change.name {
                k.name = name.clone();
            }
            if let Some(expires_at) = change.expires_at {
                k.expires_at = expires_at;
            }
            if let Some(limit) = change.rate_limit {
                k.rate_limit = limit;
            }
            if let Some(metadata) = &change.metadata {
                k.metadata = metadata.clone();
            }
        })
        .await?;
    Ok(updated)
}
