//! Who calls the admin API, what their role lets them do, and the audit record of every
//! state-changing action.
//!
//! The configured admin token is the root; operator tokens ([`crate::keys::operators`]) are
//! read from the store on every request that presents one, so a deleted token is refused at
//! once on every replica. Failed attempts of either kind count against the caller's address
//! ([`super::guard`]). Roles are checked here, in the HTTP layer, from the path, the query
//! and (for a key's creation) the body; handlers know nothing of them.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method};
use subtle::ConstantTimeEq;

use super::{guard, AdminState};
use crate::error::ApiError;
use crate::keys::format::redact;
use crate::keys::operators::{self, OperatorToken, Reach};
use crate::keys::Environment;
use crate::metering::audit::AuditRecord;

/// The workspace id under which actions that concern no one workspace are audited (creating
/// workspaces or operator tokens, leak reports, events): read with
/// `GET /admin/v1/audit?workspace=_admin`.
pub const ADMIN_AUDIT_WORKSPACE: &str = "_admin";

/// Who makes an admin request.
#[derive(Debug, Clone)]
pub enum Caller {
    /// The configured admin token.
    Root,
    /// An operator token.
    Operator(OperatorToken),
}

impl Caller {
    /// The audit records' `actor`: `root` or `operator:<name>`.
    pub fn actor(&self) -> String {
        match self {
            Self::Root => "root".into(),
            Self::Operator(token) => token.actor(),
        }
    }
}

/// The request id [`super::with_request_id`] gave the request, for its audit record.
#[derive(Debug, Clone)]
pub(super) struct AdminRequestId(pub(super) String);

/// Who presents `req`'s bearer token: the root, an operator, or nobody allowed (401, or 429
/// past [`guard::MAX_FAILURES`] failures from the address within a minute; the demo token
/// only with a loopback `Host`).
/// Takes the headers alone: a request (its body) is not `Sync`, and is not held across the
/// store read.
pub(super) async fn caller(
    state: &AdminState,
    headers: &http::HeaderMap,
    address: Option<std::net::IpAddr>,
) -> Result<Caller, ApiError> {
    let now = std::time::Instant::now();
    if let Some(retry_after_secs) = state.failed_auths.throttled(address, now) {
        return Err(ApiError::RateLimited {
            message: format!(
                "more than {} failed admin authentications from this address within a minute",
                guard::MAX_FAILURES
            )
            .into(),
            retry_after_secs,
        });
    }
    // Parsed as the gateway parses API keys: one header, `Bearer` in any case.
    let presented = crate::shared::bearer::authorization(headers)
        .ok()
        .flatten()
        .and_then(|v| crate::shared::bearer::bearer_credential(Some(v)).ok());
    let Some(token) = presented else {
        state.failed_auths.fail(address, now);
        return Err(refused());
    };
    if state.token_matches(token) {
        let host = headers.get(http::header::HOST).map(HeaderValue::as_bytes);
        if state.demo_token && !host.is_some_and(guard::is_loopback_host) {
            return Err(ApiError::Permission(
                "the demo admin token is accepted only with a loopback Host (localhost, \
                 127.0.0.1, [::1]); set SVCGATE_SERVER_ADMIN_TOKEN to use another"
                    .into(),
            ));
        }
        return Ok(Caller::Root);
    }
    if token.starts_with(operators::TOKEN_PREFIX.as_bytes()) {
        let digest = operators::digest_of(token);
        let hex = hex::encode(digest);
        if let Some(found) = state.store.operators.operator_by_digest(&hex).await? {
            // Found by digest; compared again in constant time all the same.
            if found.digest.as_bytes().ct_eq(hex.as_bytes()).into() {
                return Ok(Caller::Operator(found));
            }
        }
    }
    state.failed_auths.fail(address, now);
    Err(refused())
}

fn refused() -> ApiError {
    ApiError::Authentication("a valid admin or operator token is required".into())
}

pub(super) fn client_address(req: &Request) -> Option<std::net::IpAddr> {
    req.extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}

/// What an admin request is about: the workspace its role check reaches, the workspace its
/// audit record goes under, and the key it acts on, if any.
struct Subject {
    reach: Option<String>,
    workspace: Option<String>,
    key_id: Option<String>,
    environment: Option<Environment>,
    /// A key's creation: the record names the id in the answer.
    creates_key: bool,
}

/// `id` if it can be one of ours (`ws_…`, `key_…`): anything else a caller sent is not made
/// the name of an audit stream.
fn plausible_id(id: &str) -> Option<String> {
    let ok =
        (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    ok.then(|| id.to_string())
}

/// Longest admin path kept in an audit record, in characters.
const MAX_AUDITED_PATH: usize = 2048;

/// Largest body read here to find a new key's workspace.
const MAX_INSPECTED_BODY: usize = 1 << 20;

/// The subject of `req` (under `/admin/v1`), and the request back (its body read, for a key's
/// creation).
async fn subject(state: &AdminState, req: Request) -> Result<(Subject, Request), ApiError> {
    let path = req.uri().path().trim_start_matches("/admin/v1");
    let segments: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let query_workspace = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "workspace")
            .map(|(_, v)| v.into_owned())
    });
    let mut subject = Subject {
        reach: None,
        workspace: None,
        key_id: None,
        environment: None,
        creates_key: false,
    };
    let mut req = req;
    match (req.method().clone(), segments.as_slice()) {
        (Method::POST, ["keys"]) => {
            let (parts, body) = req.into_parts();
            let bytes = axum::body::to_bytes(body, MAX_INSPECTED_BODY)
                .await
                .map_err(|e| ApiError::invalid(format!("cannot read the body: {e}")))?;
            subject.reach = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("workspace")?.as_str().map(str::to_owned));
            req = Request::from_parts(parts, Body::from(bytes));
            subject.creates_key = true;
        }
        (_, ["keys"] | ["audit"] | ["usage"]) => subject.reach = query_workspace,
        (_, ["keys", id, ..]) => {
            if let Some(key) = state.store.keys.key_by_id(id).await? {
                subject.reach = Some(key.workspace.clone());
                subject.environment = Some(key.environment);
            }
            subject.key_id = Some((*id).to_string());
        }
        (Method::GET, ["workspaces", id]) => subject.reach = Some(id.to_string()),
        (_, ["workspaces", id, "projects" | "webhooks", ..]) => {
            subject.reach = Some(id.to_string())
        }
        // A workspace's own settings (its credits, its rate limit) are the platform's to
        // set: audited under it, but no workspace token reaches them.
        (_, ["workspaces", id, ..]) => subject.workspace = Some(id.to_string()),
        _ => {}
    }
    if subject.workspace.is_none() {
        subject.workspace = subject.reach.clone();
    }
    subject.workspace = subject.workspace.as_deref().and_then(plausible_id);
    subject.key_id = subject.key_id.as_deref().and_then(plausible_id);
    Ok((subject, req))
}

/// Whether `method` changes state.
fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The admin API's guard: authenticates the caller, checks their role, runs the handler, and
/// audits a state-changing action (whatever its outcome).
pub(super) async fn guard(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let caller = match caller(&state, req.headers(), client_address(&req)).await {
        Ok(caller) => caller,
        Err(refused) => return refused.into_response(),
    };
    let started = std::time::Instant::now();
    let (subject, req) = match subject(&state, req).await {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let method = req.method().clone();
    // The guard runs inside the `/admin/v1` nest, which hands it the rest of the path.
    let path = format!("/admin/v1{}", req.uri().path());
    let request_id = req
        .extensions()
        .get::<AdminRequestId>()
        .map(|id| id.0.clone())
        .unwrap_or_else(|| crate::ids::request_id().to_string());
    let client_ip = client_address(&req);
    let refusal = match &caller {
        Caller::Operator(token) => {
            let reach = match &subject.reach {
                Some(ws) => Reach::Workspace(ws),
                None => Reach::Global,
            };
            let allowed = token
                .role
                .allows(token.workspace.as_deref(), &method, reach);
            (!allowed).then(|| {
                ApiError::Permission(
                    format!(
                        "this operator token's role ({}) does not allow {method} {}",
                        token.role.as_str(),
                        redact(&path)
                    )
                    .into(),
                )
            })
        }
        Caller::Root => None,
    };
    // A refused attempt to change something is audited as well.
    let mut response = match refusal {
        Some(refused) => refused.into_response(),
        None => next.run(req).await,
    };
    if changes_state(&method) {
        let mut key_id = subject.key_id;
        if subject.creates_key && response.status().is_success() {
            let (id, kept) = created_id(response).await;
            (key_id, response) = (id, kept);
        }
        let record = AuditRecord {
            time_ms: crate::ids::unix_millis(),
            request_id: request_id.into(),
            workspace: subject
                .workspace
                .as_deref()
                .unwrap_or(ADMIN_AUDIT_WORKSPACE)
                .into(),
            key_id: key_id.as_deref().unwrap_or("").into(),
            key: "".into(),
            environment: subject.environment.unwrap_or(Environment::Live),
            project: None,
            method: method.as_str().to_string().into(),
            path: redact(&path).chars().take(MAX_AUDITED_PATH).collect(),
            model: None,
            status: response.status().as_u16(),
            credits: 0.0,
            client_ip,
            latency_ms: started.elapsed().as_millis() as u64,
            token_id: None,
            metadata: None,
            key_metadata: None,
            actor: Some(caller.actor()),
            suppressed: None,
            tunnel: None,
        };
        if let Err(e) = state.store.audit.append_audit(&[record], None).await {
            tracing::warn!(error = %e, %method, %path, "admin action not audited");
        }
    }
    response
}

/// The `id` of a created object's JSON answer, and the answer, rebuilt. Bodies are small.
async fn created_id(response: Response) -> (Option<String>, Response) {
    let (parts, body) = response.into_parts();
    match axum::body::to_bytes(body, MAX_INSPECTED_BODY).await {
        Ok(bytes) => {
            let id = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("id")?.as_str().map(str::to_owned));
            (id, Response::from_parts(parts, Body::from(bytes)))
        }
        Err(_) => (None, Response::from_parts(parts, Body::empty())),
    }
}
