//! `/admin/v1/keys…`: issue, list, show, change and revoke keys.

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use http::HeaderMap;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{from_object, page_limit, JsonBody, PathParams, QueryParams};
use super::AdminState;
use crate::error::ApiError;
use crate::ids::unix_now;
use crate::keys::manage::{self, KeyChange, Rotated};
use crate::keys::settings;
use crate::keys::{self, Environment, KeyRecord, KeyStatus, Metadata, RateLimit, Scopes};
use crate::metering::Credits;
use crate::shared::rfc3339;
use crate::store::StoreError;

/// A key as the admin API shows it: never the value, never the digest.
#[derive(Serialize, ToSchema)]
pub(super) struct KeyView {
    id: String,
    /// The full key: present only in the answer that created it.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    prefix: String,
    last4: String,
    workspace: String,
    name: String,
    environment: Environment,
    scopes: Scopes,
    monthly_budget: Option<Credits>,
    status: KeyStatus,
    created_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    grace_until: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rotated_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rotated_to: Option<String>,
    /// When the key stops working (RFC 3339), if it expires.
    #[serde(serialize_with = "rfc3339::serialize_opt")]
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<u64>,
    /// The key's own rate limit, over its workspace's and its environment's.
    rate_limit: Option<RateLimit>,
    /// Free-form key/value pairs.
    #[schema(value_type = Option<Object>)]
    metadata: Option<Metadata>,
    /// The start of the minute of the key's latest request (RFC 3339): kept to the minute,
    /// written by the usage flush a moment after the request. A scoped token's requests count
    /// as its parent key's.
    #[serde(serialize_with = "rfc3339::serialize_opt")]
    #[schema(value_type = Option<String>, format = DateTime)]
    last_used_at: Option<u64>,
}

impl From<&KeyRecord> for KeyView {
    fn from(k: &KeyRecord) -> Self {
        Self {
            id: k.id.clone(),
            key: None,
            prefix: k.prefix.clone(),
            last4: k.last4.clone(),
            workspace: k.workspace.clone(),
            name: k.name.clone(),
            environment: k.environment,
            scopes: k.scopes.clone(),
            monthly_budget: k.monthly_budget,
            status: k.status,
            created_at: k.created_at,
            grace_until: k.grace_until,
            rotated_from: k.rotated_from.clone(),
            rotated_to: k.rotated_to.clone(),
            expires_at: k.expires_at,
            rate_limit: k.rate_limit,
            metadata: k.metadata.clone(),
            last_used_at: None,
        }
    }
}

impl KeyView {
    /// The views of `keys`, with when each was last used.
    async fn of_all(state: &AdminState, keys: &[&KeyRecord]) -> Result<Vec<Self>, ApiError> {
        let ids: Vec<&str> = keys.iter().map(|k| k.id.as_str()).collect();
        let used = state.store.usage.keys_last_used(&ids).await?;
        Ok(keys
            .iter()
            .zip(used.into_iter().chain(std::iter::repeat(None)))
            .map(|(k, used)| Self {
                last_used_at: used,
                ..Self::from(*k)
            })
            .collect())
    }

    /// The view of `key`, with when it was last used.
    async fn of(state: &AdminState, key: &KeyRecord) -> Result<Self, ApiError> {
        let mut views = Self::of_all(state, &[key]).await?;
        views
            .pop()
            .ok_or_else(|| ApiError::not_found("no such key"))
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateKey {
    workspace: String,
    environment: Environment,
    scopes: Vec<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    monthly_budget: Option<Credits>,
    /// RFC 3339, in the future.
    #[serde(default)]
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimit>,
    /// A JSON object of at most 4 KiB.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// An RFC 3339 `expires_at`, as a unix second.
fn parse_expiry(text: &str) -> Result<u64, ApiError> {
    rfc3339::parse(text).ok_or_else(|| {
        ApiError::invalid("expires_at must be an RFC 3339 time, like 2030-01-31T12:00:00Z")
    })
}

fn parse_metadata(
    metadata: serde_json::Map<String, serde_json::Value>,
) -> Result<Metadata, ApiError> {
    settings::check_metadata(metadata).map_err(ApiError::invalid)
}

/// `POST /admin/v1/keys`: issues a key, shown this once. With an `Idempotency-Key` header a
/// retried creation (a dashboard that timed out) gets the same key rather than a second live
/// one: its value is derived from the idempotency secret, the workspace and the idempotency
/// key, as for rotations.
#[utoipa::path(
    post, path = "/admin/v1/keys", tag = "keys",
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters: a retry within a day gets the same key")),
    request_body = CreateKey,
    responses(
        (status = 201, description = "The key, with its value (shown this once)", body = KeyView),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn create(
    State(state): State<AdminState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateKey>,
) -> Result<(StatusCode, Json<KeyView>), ApiError> {
    let mut params = manage::new_key_params(
        body.workspace,
        body.environment,
        &body.scopes,
        body.name.unwrap_or_default(),
        body.monthly_budget,
    )?;
    let now = unix_now();
    params.expires_at = body.expires_at.as_deref().map(parse_expiry).transpose()?;
    if params.expires_at.is_some_and(|at| at <= now) {
        return Err(ApiError::invalid("expires_at must be in the future"));
    }
    params.rate_limit = body
        .rate_limit
        .map(RateLimit::check)
        .transpose()
        .map_err(ApiError::invalid)?;
    params.metadata = body.metadata.map(parse_metadata).transpose()?;
    state.require_workspace(&params.workspace).await?;
    let context = [&b"create"[..], params.workspace.as_bytes()];
    let idempotency = state
        .idempotency(idempotency_key(&headers)?, context)
        .await?;
    let new_key = state.new_key(params.environment, idempotency.as_ref(), context);
    // The same Idempotency-Key for the other environment: another request, refused as any
    // other body is (below).
    if let Some(idem) = idempotency.as_ref() {
        let other = match params.environment {
            Environment::Live => Environment::Test,
            _ => Environment::Live,
        };
        let twin = state.new_key(other, Some(idem), context);
        if state.store.keys.key_by_hash(&twin.hash).await?.is_some() {
            return Err(ApiError::invalid(
                "this Idempotency-Key was used for a different key",
            ));
        }
    }
    let asked = keys::record_of(params.clone(), &new_key, now);
    let record = match manage::create(state.store.keys.as_ref(), params, &new_key, now).await {
        Ok(record) => record,
        // Only a derived value can already be stored: this is a retry.
        Err(StoreError::Conflict(_)) if idempotency.is_some() => {
            let existing = state
                .store
                .keys
                .key_by_hash(&new_key.hash)
                .await?
                .ok_or_else(|| ApiError::not_found("the key created no longer exists"))?;
            let same = existing.environment == asked.environment
                && existing.scopes == asked.scopes
                && existing.name == asked.name
                && existing.monthly_budget == asked.monthly_budget
                && existing.expires_at == asked.expires_at
                && existing.rate_limit == asked.rate_limit
                && existing.metadata == asked.metadata;
            if !same {
                return Err(ApiError::invalid(
                    "this Idempotency-Key was used for a different key",
                ));
            }
            // Within the window (past it, the salt is gone and this is a new key): shown again
            // while it is active.
            if existing.status != KeyStatus::Active {
                return Err(ApiError::invalid(
                    "this Idempotency-Key's key is no longer active; its key is not shown again",
                ));
            }
            KeyRecord::clone(&existing)
        }
        Err(e) => return Err(e.into()),
    };
    state.refresh_keys().await;
    let mut view = KeyView::from(&record);
    view.key = Some(new_key.value);
    Ok((StatusCode::CREATED, Json(view)))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    workspace: Option<String>,
    /// Keys per page ([`page_limit`]).
    limit: Option<usize>,
    /// The id of the last key of the previous page.
    starting_after: Option<String>,
    /// Only keys that are not revoked and expire within this many seconds from now (those
    /// expired already included).
    expiring_within_seconds: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct KeyList {
    data: Vec<KeyView>,
    /// Whether keys follow this page: ask again with `starting_after` the last one's id.
    has_more: bool,
}

/// `GET /admin/v1/keys?workspace=…`: a workspace's keys (not its scoped tokens), a page at a
/// time.
#[utoipa::path(
    get, path = "/admin/v1/keys", tag = "keys",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of keys", body = KeyList),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn list(
    State(state): State<AdminState>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<KeyList>, ApiError> {
    let workspace = query
        .workspace
        .ok_or_else(|| ApiError::invalid("the query parameter 'workspace' is required"))?;
    state.require_workspace(&workspace).await?;
    let limit = page_limit(query.limit)?;
    if let Some(after) = &query.starting_after {
        // A cursor must be one of this workspace's keys (not a token, not another's key).
        let known = state.store.keys.key_by_id(after).await?;
        if !known.is_some_and(|k| k.workspace == workspace && k.scoped.is_none()) {
            return Err(ApiError::invalid(
                "starting_after must be the id of a key of this workspace",
            ));
        }
    }
    let mut keys = match query.expiring_within_seconds {
        None => {
            state
                .store
                .keys
                .keys_in_workspace(&workspace, query.starting_after.as_deref(), limit + 1)
                .await?
        }
        Some(within) => {
            let until = unix_now().saturating_add(within);
            let expiring = |k: &KeyRecord| {
                k.status != KeyStatus::Revoked && k.expires_at.is_some_and(|at| at <= until)
            };
            matching_keys(
                &state,
                &workspace,
                query.starting_after,
                limit + 1,
                expiring,
            )
            .await?
        }
    };
    let has_more = keys.len() > limit;
    keys.truncate(limit);
    let records: Vec<&KeyRecord> = keys.iter().map(|k| &**k).collect();
    Ok(Json(KeyList {
        data: KeyView::of_all(&state, &records).await?,
        has_more,
    }))
}

/// Up to `want` of a workspace's keys after `after` that pass `filter`, read from the store a
/// page at a time.
async fn matching_keys(
    state: &AdminState,
    workspace: &str,
    mut after: Option<String>,
    want: usize,
    filter: impl Fn(&KeyRecord) -> bool,
) -> Result<Vec<std::sync::Arc<KeyRecord>>, ApiError> {
    const PAGE: usize = 500;
    let mut found = Vec::new();
    loop {
        let page = state
            .store
            .keys
            .keys_in_workspace(workspace, after.as_deref(), PAGE)
            .await?;
        let last = page.last().map(|k| k.id.clone());
        found.extend(page.iter().filter(|k| filter(k)).cloned());
        if found.len() >= want || page.len() < PAGE {
            found.truncate(want);
            return Ok(found);
        }
        after = last;
    }
}

/// `GET /admin/v1/keys/{id}`: one key or scoped token.
#[utoipa::path(
    get, path = "/admin/v1/keys/{id}", tag = "keys",
    params(("id" = String, Path, description = "Key id (`key_…`), or a scoped token's (`tok_…`)")),
    responses(
        (status = 200, description = "The key", body = KeyView),
        (status = 404, description = "No such key", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn show(
    State(state): State<AdminState>,
    PathParams(id): PathParams<String>,
) -> Result<Json<KeyView>, ApiError> {
    let key = state
        .store
        .keys
        .key_by_id(&id)
        .await?
        .ok_or_else(|| no_such_key(&id))?;
    Ok(Json(KeyView::of(&state, &key).await?))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PatchKey {
    #[serde(default)]
    scopes: Option<Vec<String>>,
    /// Absent: unchanged; `null`: no budget; a number: the new budget.
    #[serde(default, deserialize_with = "super::extract::present")]
    monthly_budget: Option<Option<Credits>>,
    #[serde(default)]
    name: Option<String>,
    /// Absent: unchanged; `null`: never expires; RFC 3339: expires then (a time past makes
    /// it stop working now).
    #[serde(default, deserialize_with = "super::extract::present")]
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<Option<String>>,
    /// Absent: unchanged; `null`: the workspace's or environment's limit; an object: the
    /// key's own.
    #[serde(default, deserialize_with = "super::extract::present")]
    rate_limit: Option<Option<RateLimit>>,
    /// Absent: unchanged; `null`: none; an object (at most 4 KiB of JSON): replaces it.
    #[serde(default, deserialize_with = "super::extract::present")]
    #[schema(value_type = Option<Object>)]
    metadata: Option<Option<serde_json::Map<String, serde_json::Value>>>,
}

/// `PATCH /admin/v1/keys/{id}`: a key's scopes, budget, name, expiry, rate limit or metadata.
/// Every replica applies the change to its next request, as it does a revocation.
#[utoipa::path(
    patch, path = "/admin/v1/keys/{id}", tag = "keys",
    params(("id" = String, Path, description = "Key id (`key_…`), or a scoped token's (`tok_…`)")),
    request_body = PatchKey,
    responses(
        (status = 200, description = "The key changed", body = KeyView),
        (status = 404, description = "No such key", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn patch(
    State(state): State<AdminState>,
    PathParams(id): PathParams<String>,
    JsonBody(body): JsonBody<PatchKey>,
) -> Result<Json<KeyView>, ApiError> {
    refuse_token(&id)?;
    let expires_at = match &body.expires_at {
        Some(Some(text)) => Some(Some(parse_expiry(text)?)),
        Some(None) => Some(None),
        None => None,
    };
    if let Some(Some(limit)) = body.rate_limit {
        limit.check().map_err(ApiError::invalid)?;
    }
    let metadata = match body.metadata {
        Some(Some(m)) => Some(Some(parse_metadata(m)?)),
        Some(None) => Some(None),
        None => None,
    };
    let change = KeyChange {
        scopes: body
            .scopes
            .as_deref()
            .map(manage::parse_scopes)
            .transpose()?,
        monthly_budget: body.monthly_budget,
        name: body.name,
        expires_at,
        rate_limit: body.rate_limit,
        metadata,
    };
    let updated = manage::change(state.store.keys.as_ref(), &id, change)
        .await?
        .ok_or_else(|| no_such_key(&id))?;
    state.refresh_keys().await;
    Ok(Json(KeyView::of(&state, &updated).await?))
}

/// `POST /admin/v1/keys/{id}/revoke`: the key or token stops working at once.
#[utoipa::path(
    post, path = "/admin/v1/keys/{id}/revoke", tag = "keys",
    params(("id" = String, Path, description = "Key id (`key_…`), or a scoped token's (`tok_…`)")),
    responses(
        (status = 200, description = "The key revoked", body = KeyView),
        (status = 404, description = "No such key", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn revoke(
    State(state): State<AdminState>,
    PathParams(id): PathParams<String>,
) -> Result<Json<KeyView>, ApiError> {
    let revoked = manage::revoke(state.store.keys.as_ref(), &id)
        .await?
        .ok_or_else(|| no_such_key(&id))?;
    state.refresh_keys().await;
    Ok(Json(KeyView::from(&*revoked)))
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RotateKey {
    #[serde(default)]
    grace_period_seconds: Option<u64>,
}

/// `POST /admin/v1/keys/{id}/rotate`: issues the successor key (shown this once) and keeps the
/// old key working for the grace period. With an `Idempotency-Key` header, a retry returns the
/// same successor: its value is derived from a secret drawn from the admin token (never in the
/// store), the old key's id and the idempotency key, so it is reproduced rather than stored.
#[utoipa::path(
    post, path = "/admin/v1/keys/{id}/rotate", tag = "keys",
    params(("id" = String, Path, description = "Key id (`key_…`), or a scoped token's (`tok_…`)"), ("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters: a retry within a day gets the same key")),
    request_body(content = Option<RotateKey>, description = "Optional: without a body, the configured grace period"),
    responses(
        (status = 201, description = "The successor key, with its value (shown this once)", body = KeyView),
        (status = 404, description = "No such key", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn rotate(
    State(state): State<AdminState>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<KeyView>), ApiError> {
    refuse_token(&id)?;
    // Too large, or cut off: the gateway's error body, not axum's plain text.
    let body =
        body.map_err(|e| ApiError::invalid(format!("cannot read the body: {}", e.body_text())))?;
    let params: RotateKey = if body.iter().all(u8::is_ascii_whitespace) {
        RotateKey::default()
    } else {
        let value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(format!("invalid JSON: {e}")))?;
        from_object(value)?
    };
    let grace = manage::grace_seconds(params.grace_period_seconds, state.rotation_grace_seconds)?;
    let idempotency_key = idempotency_key(&headers)?;
    let old = state
        .store
        .keys
        .key_by_id(&id)
        .await?
        .ok_or_else(|| no_such_key(&id))?;
    let context = [&b"rotate"[..], old.id.as_bytes()];
    let idempotency = state.idempotency(idempotency_key, context).await?;
    let new_key = state.new_key(old.environment, idempotency.as_ref(), context);
    let now = unix_now();
    let record = match manage::rotate(state.store.keys.as_ref(), &old, &new_key, grace, now).await?
    {
        Rotated::Successor(successor) => KeyRecord::clone(&successor),
        Rotated::Before => {
            let existing = state
                .store
                .keys
                .key_by_hash(&new_key.hash)
                .await?
                .ok_or_else(|| ApiError::not_found("the rotated key no longer exists"))?;
            // A retry within the window (past it, the salt is gone, and so is the derived key)
            // is shown the new key once more; once that key is revoked or rotated in turn, the
            // value is not handed out again.
            if existing.status != KeyStatus::Active {
                return Err(ApiError::invalid(
                    "this Idempotency-Key's rotation is over (its key is no longer active); its \
                     key is not shown again",
                ));
            }
            KeyRecord::clone(&existing)
        }
        Rotated::NotFound => return Err(no_such_key(&id)),
    };
    state.refresh_keys().await;
    let mut view = KeyView::from(&record);
    view.key = Some(new_key.value);
    Ok((StatusCode::CREATED, Json(view)))
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(v) if !v.is_empty() && v.len() <= 255 => Ok(Some(v.to_string())),
        _ => Err(ApiError::invalid(
            "Idempotency-Key must be 1-255 visible ASCII characters",
        )),
    }
}

/// `POST /admin/v1/keys/{id}/end-grace`: a rotated key stops working now.
#[utoipa::path(
    post, path = "/admin/v1/keys/{id}/end-grace", tag = "keys",
    params(("id" = String, Path, description = "Key id (`key_…`), or a scoped token's (`tok_…`)")),
    responses(
        (status = 200, description = "The rotated key, its grace period over", body = KeyView),
        (status = 404, description = "No such key", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn end_grace(
    State(state): State<AdminState>,
    PathParams(id): PathParams<String>,
) -> Result<Json<KeyView>, ApiError> {
    refuse_token(&id)?;
    let current = state
        .store
        .keys
        .key_by_id(&id)
        .await?
        .ok_or_else(|| no_such_key(&id))?;
    if current.status != KeyStatus::Rotating {
        return Err(ApiError::invalid("only a rotating key has a grace period"));
    }
    let now = unix_now();
    let updated = state
        .store
        .keys
        .update_key(&id, &|k: &mut KeyRecord| {
            if k.status == KeyStatus::Rotating {
                k.grace_until = Some(k.grace_until.map_or(now, |g| g.min(now)));
            }
        })
        .await?
        .ok_or_else(|| no_such_key(&id))?;
    state.refresh_keys().await;
    tracing::info!(key_id = %updated.id, "rotation grace period ended");
    Ok(Json(KeyView::from(&*updated)))
}

/// A scoped token (`tok_…`) is shown and revoked like a key, never changed: its scopes and
/// lifetime were fixed when it was minted, and it spends its parent's budget.
fn refuse_token(id: &str) -> Result<(), ApiError> {
    match id.starts_with("tok_") {
        true => Err(ApiError::invalid(
            "a scoped token cannot be changed or rotated; revoke it or let it expire",
        )),
        false => Ok(()),
    }
}

fn no_such_key(id: &str) -> ApiError {
    super::unknown("key", id)
}
