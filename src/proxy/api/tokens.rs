//! `POST /v1/tokens`: a backend mints a short-lived scoped token for a browser or mobile app.
//!
//! Tokens are records in the store under their digest, like keys, with a store-side TTL of
//! their lifetime, so every replica accepts them and they disappear by themselves. A token
//! carries a subset of its parent's scopes, inherits its environment and is billed to it, and
//! dies with it (see [`crate::proxy::auth`]).

use pingora::proxy::Session;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::ids::unix_now;
use crate::keys::{self, Environment, Scopes};
use crate::proxy::auth::Authenticated;
use crate::proxy::body::read_bounded;
use crate::proxy::respond;
use crate::store::KeyStore;

/// Longest lifetime of a scoped token, in seconds (15 minutes, as the API promises).
pub const MAX_EXPIRES_IN: u64 = 900;
/// The scope that allows minting; never granted to a token.
pub const MINT_SCOPE: &str = "tokens:create";
/// Largest accepted request body.
const BODY_LIMIT: usize = 16 * 1024;
/// How long the store keeps a token after it expires: a replica that reads it then says
/// "expired" (and audits the refusal), instead of taking it for a made-up key, which would
/// also count against the client's address.
const KEPT_AFTER_EXPIRY_SECS: u64 = 3_600;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MintRequest {
    scopes: Vec<String>,
    #[serde(default)]
    expires_in: Option<i64>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

#[derive(Serialize)]
struct MintResponse<'a> {
    value: &'a str,
    scopes: &'a Scopes,
    expires_at: u64,
    metadata: &'a Map<String, Value>,
}

/// Mints a token for `caller` from the request body and answers `201`.
pub async fn mint(
    session: &mut Session,
    caller: &Authenticated,
    store: &dyn KeyStore,
    metadata_limit: usize,
    request_id: &str,
    answer_headers: &[(&'static str, String)],
) -> Result<(), ApiError> {
    let parent = &caller.key;
    if parent.environment == Environment::Scoped {
        return Err(ApiError::Permission(
            "a scoped token cannot mint tokens".into(),
        ));
    }
    let body = read_bounded(session, BODY_LIMIT)
        .await
        .map_err(|_| ApiError::invalid("could not read the request body"))?
        .ok_or_else(|| ApiError::invalid(format!("the body must be at most {BODY_LIMIT} bytes")))?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object"));
    }
    // Absent means the default; `null` is not a number of seconds.
    if value.get("expires_in").is_some_and(Value::is_null) {
        return Err(ApiError::invalid(format!(
            "expires_in must be between 1 and {MAX_EXPIRES_IN} seconds"
        )));
    }
    let req: MintRequest = serde_json::from_value(value)
        .map_err(|e| ApiError::invalid(format!("invalid token request: {e}")))?;

    let expires_in = match req.expires_in {
        None => MAX_EXPIRES_IN,
        Some(n) if (1..=MAX_EXPIRES_IN as i64).contains(&n) => n as u64,
        Some(_) => {
            return Err(ApiError::invalid(format!(
                "expires_in must be between 1 and {MAX_EXPIRES_IN} seconds"
            )))
        }
    };
    if req.scopes.is_empty() {
        return Err(ApiError::invalid("scopes must name at least one scope"));
    }
    if req.scopes.iter().any(|s| s == MINT_SCOPE) {
        return Err(ApiError::invalid(
            "tokens:create cannot be granted to a scoped token",
        ));
    }
    let scopes = Scopes::new(&req.scopes);
    if !parent.scopes.contains_all(&scopes) {
        return Err(ApiError::Permission(
            "a token's scopes must be a subset of the key's scopes".into(),
        ));
    }
    let metadata = req.metadata.unwrap_or_default();
    if serde_json::to_vec(&metadata).map_or(usize::MAX, |v| v.len()) > metadata_limit {
        return Err(ApiError::invalid(format!(
            "metadata must be at most {metadata_limit} bytes of JSON"
        )));
    }

    let (token, record) = keys::mint(
        parent,
        caller.hash,
        scopes,
        expires_in,
        metadata,
        unix_now(),
    );
    store
        .insert_token(&record, expires_in + KEPT_AFTER_EXPIRY_SECS)
        .await?;
    let grant = record.scoped.as_ref().expect("minted tokens carry a grant");
    let body = serde_json::to_vec(&MintResponse {
        value: &token.value,
        scopes: &record.scopes,
        expires_at: grant.expires_at,
        metadata: &grant.metadata,
    })
    .unwrap_or_default();
    respond::json(session, 201, body, request_id, answer_headers)
        .await
        .map_err(|_| ApiError::Upstream("could not write the response".into()))
}
