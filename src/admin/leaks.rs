//! `POST /admin/v1/leaks`: a secret scanner reports tokens it found in public. Every live key
//! among them is revoked at once and `key.auto_revoked` fires for its workspace, in the same
//! atomic store write. Accepts the body of GitHub's secret-scanning partner alerts
//! (`[{"token", "type", "url", "source"}]`) as it is.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::extract::JsonArray;
use super::AdminState;
use crate::error::ApiError;
use crate::events::Event;
use crate::ids::unix_now;
use crate::keys::format::{self, last4};
use crate::keys::{Environment, KeyHash, KeyRecord, KeyStatus};

/// Most tokens one report may carry.
const MAX_REPORTED: usize = 1_000;

#[derive(Deserialize, ToSchema)]
pub(super) struct FoundToken {
    token: String,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    source: Option<String>,
    /// GitHub names the token type; accepted and not needed.
    #[serde(default, rename = "type")]
    _token_type: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct LeakResult {
    token_last4: String,
    key_id: Option<String>,
    action: &'static str,
}

/// `POST /admin/v1/leaks`: revokes every live key (or a live key's scoped token) among the
/// tokens reported; test keys are `ignored`, anything else `not_found`.
#[utoipa::path(
    post, path = "/admin/v1/leaks", tag = "leaks",
    request_body = Vec<FoundToken>,
    responses((status = 200, description = "What was done with each token, in order", body = Vec<LeakResult>)),
)]
pub(super) async fn report(
    State(state): State<AdminState>,
    JsonArray(found): JsonArray<FoundToken>,
) -> Result<Json<Vec<LeakResult>>, ApiError> {
    if found.len() > MAX_REPORTED {
        return Err(ApiError::invalid(format!(
            "at most {MAX_REPORTED} tokens per report"
        )));
    }
    let mut results = Vec::with_capacity(found.len());
    let mut revoked_any = false;
    for item in &found {
        let (key_id, action) = handle(&state, item).await?;
        revoked_any |= action == "revoked";
        results.push(LeakResult {
            token_last4: last4(item.token.trim()).to_string(),
            key_id,
            action,
        });
    }
    if revoked_any {
        state.refresh_keys().await;
    }
    Ok(Json(results))
}

/// What to do with one reported token: `revoked` (a live key, or a scoped token of one),
/// `ignored` (a test key or a test key's token: they cannot bill or reach the live backend) or
/// `not_found`.
async fn handle(
    state: &AdminState,
    item: &FoundToken,
) -> Result<(Option<String>, &'static str), ApiError> {
    let token = item.token.trim();
    let Ok(environment) = format::parse(token) else {
        return Ok((None, "not_found"));
    };
    let Some(key) = state.store.keys.key_by_hash(&KeyHash::of(token)).await? else {
        return Ok((None, "not_found"));
    };
    let key_id = Some(key.id.clone());
    // A token of a live key bills it and reaches the live backend: it goes like a live key.
    let live = match &key.scoped {
        Some(grant) => grant.parent_environment == Environment::Live,
        None => environment == Environment::Live,
    };
    if !live {
        tracing::info!(key_id = %key.id, environment = environment.as_str(), "leaked key reported, not revoked");
        return Ok((key_id, "ignored"));
    }
    if key.status == KeyStatus::Revoked {
        return Ok((key_id, "revoked"));
    }
    let event = Event::new(
        "key.auto_revoked",
        &key.workspace,
        Environment::Live,
        json!({
            "key_id": key.id,
            "prefix": key.prefix,
            "last4": key.last4,
            "url": item.url,
            "source": item.source,
            "revoked_at": unix_now(),
        }),
    );
    let revoked = state
        .store
        .keys
        .update_key_emitting(&key.id, &revoke, &event)
        .await?;
    match revoked {
        Some(_) => {
            tracing::warn!(key_id = %key.id, workspace = %key.workspace, event_id = %event.id, "leaked key revoked");
            Ok((key_id, "revoked"))
        }
        // Gone between the lookup and the write (a token that just expired).
        None => Ok((key_id, "not_found")),
    }
}

fn revoke(k: &mut KeyRecord) {
    k.status = KeyStatus::Revoked;
    k.grace_until = None;
}
