//! `POST /admin/v1/leaks`: a secret scanner reports tokens it found in public. Every live key
//! among them is revoked at once and `key.auto_revoked` fires for its workspace, in the same
//! atomic store write ([`crate::scanners::leak`]). Accepts the body of GitHub's secret-scanning partner alerts
//! (`[{"token", "type", "url", "source"}]`) as it is.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::JsonArray;
use super::AdminState;
use crate::error::ApiError;
use crate::keys::format::last4;
use crate::metrics;
use crate::scanners::leak::{self, LeakAction};

/// Most tokens one report may carry.
const MAX_REPORTED: usize = 1_000;
/// Most characters of a reported token: a key is 50; a scanner's match may carry more.
const MAX_TOKEN_CHARS: usize = 512;
/// Most characters of `url`.
const MAX_URL_CHARS: usize = 2_048;
/// Most characters of `source` and `type`.
const MAX_LABEL_CHARS: usize = 256;

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
    for (i, item) in found.iter().enumerate() {
        check_fields(i, item)?;
    }
    let mut results = Vec::with_capacity(found.len());
    for item in &found {
        let (key_id, action) = match handle(&state, item).await {
            Ok(done) => done,
            Err(err) => return Err(stopped(&state, err, &results, found.len()).await),
        };
        results.push(LeakResult {
            token_last4: last4(item.token.trim()).to_string(),
            key_id,
            action,
        });
    }
    if results.iter().any(|r| r.action == "revoked") {
        state.refresh_keys().await;
    }
    Ok(Json(results))
}

/// Refuses a reported token whose fields are longer than any real report's (400, naming the
/// token's place in the list).
fn check_fields(index: usize, item: &FoundToken) -> Result<(), ApiError> {
    let fields = [
        ("token", Some(&item.token), MAX_TOKEN_CHARS),
        ("url", item.url.as_ref(), MAX_URL_CHARS),
        ("source", item.source.as_ref(), MAX_LABEL_CHARS),
        ("type", item._token_type.as_ref(), MAX_LABEL_CHARS),
    ];
    for (name, value, max) in fields {
        if value.is_some_and(|v| v.chars().count() > max) {
            return Err(ApiError::invalid(format!(
                "token {index}: '{name}' is longer than {max} characters"
            )));
        }
    }
    Ok(())
}

/// The error for a report the store failed in the middle of: the keys revoked before it are
/// revoked (and their events sent), so the answer names them, and the tokens not handled.
async fn stopped(
    state: &AdminState,
    err: ApiError,
    results: &[LeakResult],
    total: usize,
) -> ApiError {
    let revoked: Vec<&str> = results
        .iter()
        .filter(|r| r.action == "revoked")
        .filter_map(|r| r.key_id.as_deref())
        .collect();
    if !revoked.is_empty() {
        state.refresh_keys().await;
    }
    let revoked = match revoked.as_slice() {
        [] => "none".to_string(),
        ids => ids.join(", "),
    };
    let message = format!(
        "{err}; the first {done} of {total} tokens were handled, keys revoked: {revoked}; \
         report the other tokens again",
        done = results.len(),
    );
    match err {
        ApiError::InvalidRequest(_) => ApiError::invalid(message),
        _ => ApiError::ServiceUnavailable(message.into()),
    }
}

/// What to do with one reported token: `revoked` (a live key, or a scoped token of one),
/// `ignored` (a test key or a test key's token: they cannot bill or reach the live backend) or
/// `not_found`.
async fn handle(
    state: &AdminState,
    item: &FoundToken,
) -> Result<(Option<String>, &'static str), ApiError> {
    let found = leak::FoundToken {
        token: &item.token,
        url: item.url.as_deref(),
        source: item.source.as_deref(),
    };
    let handled = leak::handle(state.store.keys.as_ref(), found, true).await?;
    metrics::record_leak("admin", handled.action.as_str());
    let key_id = handled.key.map(|k| k.id.clone());
    Ok(match handled.action {
        LeakAction::Revoked => (key_id, "revoked"),
        LeakAction::Reported => (key_id, "ignored"),
        LeakAction::NotFound => (key_id, "not_found"),
    })
}
