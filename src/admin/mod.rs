//! The admin API on the admin port: the back end of the operators' dashboard.
//!
//! JSON in, JSON out, `Authorization: Bearer <admin token>` on everything under `/admin/v1`,
//! errors as [`ApiError`] with the gateway's error body. `/healthz` and `/readyz` need no token.

mod access;
pub mod config;
mod events;
mod extract;
mod guard;
mod keys;
mod leaks;
mod metering;
mod openapi;
mod operators;
mod webhooks;
mod workspaces;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use hmac::{Hmac, Mac};
use http::{HeaderValue, StatusCode};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::ids::request_id;
use crate::keys::cache::KeyCache;
use crate::keys::format::{self, redact, NewKey};
use crate::keys::Environment;
use crate::proxy::respond::REQUEST_ID;
use crate::shutdown::Draining;
use crate::store::{StoreHealth, Stores};
pub use openapi::document as openapi_document;

/// A secret for one purpose, drawn from `secret` (HMAC-SHA256 keyed by it).
fn derived_secret(secret: &str, purpose: &[u8]) -> [u8; 32] {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(purpose);
    mac.finalize().into_bytes().into()
}

/// How long a retry with the same `Idempotency-Key` gets the key a creation or rotation made:
/// after it the salt is forgotten, and the header makes another key (or, for a rotation, is
/// refused: the old key is rotated already).
const IDEMPOTENCY_WINDOW_SECONDS: u64 = 86_400;

/// An `Idempotency-Key` and the salt its keys are derived with.
struct Idempotency {
    key: String,
    salt: String,
}

/// What every admin handler can reach.
#[derive(Clone)]
pub struct AdminState {
    /// Shared state.
    pub store: Stores,
    /// This replica's key cache, brought up to date after every key change made here.
    keys: Arc<KeyCache>,
    /// Grace period of a rotation that names none (seconds).
    rotation_grace_seconds: u64,
    /// SHA-256 of the admin token, compared in constant time.
    token_digest: [u8; 32],
    /// What keys created or rotated with an `Idempotency-Key` are derived from: drawn from
    /// the admin token, so it is never in the store (whose data alone must not yield a key)
    /// and is the same on every replica.
    idempotency_secret: [u8; 32],
    /// Set on SIGTERM: `/readyz` answers 503.
    draining: Draining,
    /// Monthly budgets of projects from the configuration (micro-credits), by workspace and
    /// project: those the admin API sets override them.
    configured_budgets: Arc<HashMap<(String, String), i64>>,
    /// Whether the admin token is the demo's, accepted only with a loopback `Host`.
    demo_token: bool,
    /// Failed authentications by client address, throttled.
    failed_auths: Arc<guard::FailedAuths>,
}

impl AdminState {
    /// State for a router guarded by `admin_token`.
    pub fn new(
        store: Stores,
        keys: Arc<KeyCache>,
        admin_token: &str,
        rotation_grace_seconds: u64,
    ) -> Self {
        Self {
            store,
            keys,
            rotation_grace_seconds,
            token_digest: Sha256::digest(admin_token.as_bytes()).into(),
            idempotency_secret: derived_secret(admin_token, b"svcgate idempotent keys"),
            draining: Draining::default(),
            configured_budgets: Arc::default(),
            demo_token: admin_token == config::DEMO_ADMIN_TOKEN,
            failed_auths: Arc::default(),
        }
    }

    /// The project budgets of the configuration, shown beside those set through the API.
    pub fn with_configured_budgets(mut self, budgets: HashMap<(String, String), i64>) -> Self {
        self.configured_budgets = Arc::new(budgets);
        self
    }

    /// A request's `Idempotency-Key` for `context` (what the key is for), with its salt: drawn
    /// at random by the first request, kept by the store for [`IDEMPOTENCY_WINDOW_SECONDS`],
    /// and the same for every retry meanwhile, on any replica. The store keeps it under a
    /// digest keyed by the idempotency secret, which tells nothing of the key or its context.
    async fn idempotency(
        &self,
        key: Option<String>,
        context: [&[u8]; 2],
    ) -> Result<Option<Idempotency>, ApiError> {
        let Some(key) = key else {
            return Ok(None);
        };
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.idempotency_secret)
            .expect("HMAC takes any key length");
        for part in [&b"salt"[..], context[0], context[1], key.as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        let scope = hex::encode(mac.finalize().into_bytes());
        let salt = self
            .store
            .keys
            .idempotency_salt(
                &scope,
                &crate::ids::new_id("salt"),
                IDEMPOTENCY_WINDOW_SECONDS,
            )
            .await?;
        Ok(Some(Idempotency { key, salt }))
    }

    /// A new key's value: random, or with an `Idempotency-Key` derived from it, its salt and
    /// `context`, so a retry gets the same value on any replica for as long as the salt is kept.
    /// Neither the admin token (whose secret it is derived with) nor the store's data (the
    /// salt) alone reproduces it, and after the window nothing does.
    fn new_key(
        &self,
        environment: Environment,
        idempotency: Option<&Idempotency>,
        context: [&[u8]; 2],
    ) -> NewKey {
        match idempotency {
            // The environment is part of what is derived from: with the same Idempotency-Key, a
            // test key and a live key share no secret characters (a test key, easier to leak,
            // would otherwise give the live key away, its checksum being public).
            Some(idem) => format::derive(
                environment,
                &self.idempotency_secret,
                &[
                    context[0],
                    context[1],
                    environment.as_str().as_bytes(),
                    idem.key.as_bytes(),
                    idem.salt.as_bytes(),
                ],
            ),
            None => format::generate(environment),
        }
    }

    /// Shares the process's drain state, so `/readyz` fails once SIGTERM has arrived.
    pub fn with_draining(mut self, draining: Draining) -> Self {
        self.draining = draining;
        self
    }

    /// Brings this replica's cache up to date, so a change made here applies to the very next
    /// request (other replicas follow through the store's change signal).
    async fn refresh_keys(&self) {
        if let Err(e) = self.keys.sync().await {
            tracing::warn!(error = %e, "key cache not refreshed after a change");
        }
    }

    /// Answers 404 for a workspace the store does not know, so reading one is refused the same
    /// way as writing to it, instead of looking like an empty workspace.
    async fn require_workspace(&self, id: &str) -> Result<(), ApiError> {
        match self.store.keys.workspace(id).await? {
            Some(_) => Ok(()),
            None => Err(unknown("workspace", id)),
        }
    }

    fn token_matches(&self, presented: &[u8]) -> bool {
        // Comparing digests keeps the comparison constant-time whatever the lengths.
        let digest: [u8; 32] = Sha256::digest(presented).into();
        digest.ct_eq(&self.token_digest).into()
    }
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    let api = Router::new()
        .route(
            "/workspaces",
            post(workspaces::create).get(workspaces::list),
        )
        .route(
            "/workspaces/{id}",
            get(workspaces::show).patch(workspaces::patch),
        )
        .route("/keys", post(keys::create).get(keys::list))
        .route("/keys/{id}", get(keys::show).patch(keys::patch))
        .route("/keys/{id}/revoke", post(keys::revoke))
        .route("/keys/{id}/rotate", post(keys::rotate))
        .route("/keys/{id}/end-grace", post(keys::end_grace))
        .route("/tokens", post(operators::create).get(operators::list))
        .route("/tokens/{id}", delete(operators::delete))
        .route("/leaks", post(leaks::report))
        .route("/events", post(events::create))
        .route("/audit", get(metering::audit))
        .route("/usage", get(metering::usage))
        .route("/workspaces/{id}/projects", get(metering::project_budgets))
        .route(
            "/workspaces/{id}/projects/{project}/budget",
            put(metering::set_project_budget).get(metering::project_budget),
        )
        .route("/workspaces/{id}/webhooks", get(webhooks::list))
        .route("/workspaces/{id}/webhooks/{endpoint}", get(webhooks::show))
        .route(
            "/workspaces/{id}/webhooks/{endpoint}/deliveries",
            get(webhooks::deliveries),
        )
        .route(
            "/workspaces/{id}/webhooks/{endpoint}/resume",
            post(webhooks::resume),
        )
        .route(
            "/workspaces/{id}/webhooks/{endpoint}/replay",
            post(webhooks::replay),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), access::guard));
    Router::new()
        .nest("/admin/v1", api)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(openapi::PATH, get(openapi::serve))
        .fallback(unmatched)
        .method_not_allowed_fallback(|| async {
            ApiError::MethodNotAllowed("method not allowed on this path".into())
        })
        .layer(middleware::from_fn(with_request_id))
        .with_state(state)
}

/// Probes and `/metrics` for a process without an admin API (`svcgate worker`).
pub fn probes_router(store: Arc<dyn StoreHealth>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/readyz",
            get(|State(store): State<Arc<dyn StoreHealth>>| async move {
                store.ping().await?;
                Ok::<_, ApiError>(Json(serde_json::json!({"status": "ready"})))
            }),
        )
        .route("/metrics", get(prometheus_text))
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(middleware::from_fn(with_request_id))
        .with_state(store)
}

async fn prometheus_text() -> Response {
    use prometheus::Encoder;
    let mut buffer = Vec::new();
    let encoder = prometheus::TextEncoder::new();
    match encoder.encode(&prometheus::gather(), &mut buffer) {
        Ok(()) => (
            [(
                http::header::CONTENT_TYPE,
                encoder.format_type().to_string(),
            )],
            buffer,
        )
            .into_response(),
        Err(e) => ApiError::ServiceUnavailable(format!("cannot encode metrics: {e}").into())
            .into_response(),
    }
}

/// `GET /healthz`: the process is up.
#[utoipa::path(
    get, path = "/healthz", tag = "probes", security(()),
    responses((status = 200, description = "`{\"status\": \"ok\"}`", body = Object)),
)]
async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// `GET /readyz`: the store answers and the process is not shutting down.
#[utoipa::path(
    get, path = "/readyz", tag = "probes", security(()),
    responses(
        (status = 200, description = "`{\"status\": \"ready\"}`", body = Object),
        (status = 503, description = "Shutting down, or the store is unreachable", body = crate::openapi::ErrorBody),
    ),
)]
async fn readyz(State(state): State<AdminState>) -> Result<Json<serde_json::Value>, ApiError> {
    if state.draining.is_draining() {
        return Err(ApiError::ServiceUnavailable("shutting down".into()));
    }
    state.store.health.ping().await?;
    Ok(Json(serde_json::json!({"status": "ready"})))
}

/// A path no route has: 404, to a caller with a token only, so that the answer tells
/// nothing of which paths exist.
async fn unmatched(State(state): State<AdminState>, req: Request) -> ApiError {
    let address = access::client_address(&req);
    let (parts, _) = req.into_parts();
    match access::caller(&state, &parts.headers, address).await {
        Ok(_) => ApiError::not_found("no such admin route"),
        Err(refused) => refused,
    }
}

/// Gives every answer a request id, and renders errors with it.
async fn with_request_id(mut req: Request, next: Next) -> Response {
    let id = request_id();
    req.extensions_mut()
        .insert(access::AdminRequestId(id.to_string()));
    let mut resp = next.run(req).await;
    if let Some(err) = resp.extensions_mut().remove::<ApiError>() {
        resp = render(&err, &id);
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(&REQUEST_ID, value);
    }
    resp
}

fn render(err: &ApiError, request_id: &str) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        err.body(request_id),
    )
        .into_response();
    if let Some(secs) = err.retry_after() {
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Some(challenge) = err.challenge() {
        resp.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    resp
}

impl IntoResponse for ApiError {
    /// The body is rendered by [`with_request_id`], which knows the request id.
    fn into_response(self) -> Response {
        let mut resp = render(&self, "");
        resp.extensions_mut().insert(self);
        resp
    }
}

/// The 404 for an id the caller sent: ids are ours and short, so anything else is cut to keep
/// the message small, and a key pasted where its id belongs is not repeated in full.
pub(super) fn unknown(what: &str, id: &str) -> ApiError {
    let shown: String = redact(id).chars().take(64).collect();
    ApiError::not_found(format!("no {what} '{shown}'"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::cache::CacheConfig;
    use crate::store::MemoryStore;

    fn state() -> AdminState {
        let store = Arc::new(MemoryStore::new());
        let keys = Arc::new(KeyCache::new(store.clone(), CacheConfig::default()));
        AdminState::new(Stores::of(store), keys, "an-admin-token-long-enough", 3600)
    }

    #[tokio::test]
    async fn keys_of_one_idempotency_key_share_nothing_between_environments() {
        let state = state();
        let context = [&b"create"[..], b"ws_1"];
        let idem = state.idempotency(Some("k1".into()), context).await;
        let idem = idem.unwrap().unwrap();
        let make = |environment| state.new_key(environment, Some(&idem), context).value;
        let (live, test) = (make(Environment::Live), make(Environment::Test));
        // Each the same on a retry; the random part (after `svc_live_` / `svc_test_`, before
        // the checksum) not shared.
        assert_eq!(live, make(Environment::Live));
        assert_ne!(live[9..42], test[9..42]);
    }

    #[tokio::test]
    async fn the_admin_token_alone_does_not_reproduce_an_idempotent_key() {
        // Two stores, one admin token: the salt is the store's, so the keys differ.
        let (a, b) = (state(), state());
        let context = [&b"create"[..], b"ws_1"];
        let key = |state: &AdminState| {
            let state = state.clone();
            async move {
                let idem = state.idempotency(Some("k1".into()), context).await;
                let idem = idem.unwrap().unwrap();
                state.new_key(Environment::Live, Some(&idem), context).value
            }
        };
        assert_eq!(key(&a).await, key(&a).await, "a retry gets the same key");
        assert_ne!(key(&a).await, key(&b).await);
    }
}
