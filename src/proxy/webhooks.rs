//! The webhook endpoints API on the gateway (`/v1/webhooks…`), per workspace and environment:
//! a test key sees and creates only test-mode endpoints, which get only test-mode events.

use pingora::proxy::Session;
use serde::{Deserialize, Serialize};

use super::auth::Authenticated;
use super::body::read_bounded;
use super::respond;
use crate::error::ApiError;
use crate::ids::{new_id, unix_now};
use crate::keys::Environment;
use crate::store::Store;
use crate::webhooks::endpoint::{check_filter, check_url, new_secret, Endpoint, EndpointStatus};

/// Largest accepted request body.
const BODY_LIMIT: usize = 16 * 1024;
/// Most event filters on one endpoint.
const MAX_FILTERS: usize = 50;

/// The operations of the endpoints API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookOp {
    /// `GET /v1/webhooks`
    List,
    /// `POST /v1/webhooks`
    Create,
    /// `GET /v1/webhooks/{id}`
    Get,
    /// `PATCH /v1/webhooks/{id}`
    Update,
    /// `DELETE /v1/webhooks/{id}`
    Delete,
    /// `POST /v1/webhooks/{id}/resume`
    Resume,
}

/// An endpoint as the API shows it; the secret only in the answer that created it.
#[derive(Serialize)]
struct EndpointView<'a> {
    id: &'a str,
    url: &'a str,
    events: &'a [String],
    status: EndpointStatus,
    environment: Environment,
    created_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<&'a str>,
}

impl<'a> EndpointView<'a> {
    fn of(e: &'a Endpoint) -> Self {
        Self {
            id: &e.id,
            url: &e.url,
            events: &e.events,
            status: e.status,
            environment: e.environment,
            created_at: e.created_at,
            secret: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointInput {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    events: Option<Vec<String>>,
}

/// Answers one endpoints-API request.
pub async fn handle(
    session: &mut Session,
    op: WebhookOp,
    caller: &Authenticated,
    store: &dyn Store,
    allow_insecure: bool,
    request_id: &str,
) -> Result<(), ApiError> {
    let workspace = &*caller.key.workspace;
    let environment = caller.key.effective_environment();
    let id = session
        .req_header()
        .uri
        .path()
        .split('/')
        .nth(3)
        .unwrap_or_default()
        .to_string();
    let mine = |e: &Endpoint| e.environment == environment;
    let not_found = || ApiError::not_found(format!("no webhook endpoint '{}'", truncate(&id)));
    let (status, body) = match op {
        WebhookOp::List => {
            let all = store.endpoints(workspace).await?;
            let views: Vec<EndpointView> = all
                .iter()
                .filter(|e| mine(e))
                .map(EndpointView::of)
                .collect();
            (
                200,
                serde_json::to_vec(&serde_json::json!({ "data": views })),
            )
        }
        WebhookOp::Create => {
            let input = read_input(session).await?;
            let url = input
                .url
                .ok_or_else(|| ApiError::invalid("url is required"))?;
            let events = input
                .events
                .ok_or_else(|| ApiError::invalid("events is required"))?;
            let url = check_url(&url, allow_insecure).map_err(ApiError::invalid)?;
            check_events(&events)?;
            let endpoint = Endpoint {
                id: new_id("we"),
                workspace: workspace.to_string(),
                environment,
                url: url.to_string(),
                events,
                secret: new_secret(),
                status: EndpointStatus::Active,
                created_at: unix_now(),
            };
            store.create_endpoint(&endpoint).await?;
            let mut view = EndpointView::of(&endpoint);
            view.secret = Some(&endpoint.secret);
            (201, serde_json::to_vec(&view))
        }
        WebhookOp::Get => {
            let all = store.endpoints(workspace).await?;
            let e = all
                .iter()
                .find(|e| e.id == id && mine(e))
                .ok_or_else(not_found)?;
            (200, serde_json::to_vec(&EndpointView::of(e)))
        }
        WebhookOp::Update | WebhookOp::Resume => {
            let input = if op == WebhookOp::Update {
                let input = read_input(session).await?;
                let url = input
                    .url
                    .map(|u| check_url(&u, allow_insecure).map(|u| u.to_string()))
                    .transpose()
                    .map_err(ApiError::invalid)?;
                if let Some(events) = &input.events {
                    check_events(events)?;
                }
                Some((url, input.events))
            } else {
                None
            };
            let exists = store
                .endpoints(workspace)
                .await?
                .iter()
                .any(|e| e.id == id && mine(e));
            if !exists {
                return Err(not_found());
            }
            let updated = store
                .update_endpoint(workspace, &id, &|e: &mut Endpoint| match &input {
                    Some((url, events)) => {
                        if let Some(url) = url {
                            e.url = url.clone();
                        }
                        if let Some(events) = events {
                            e.events = events.clone();
                        }
                    }
                    None => e.status = EndpointStatus::Active,
                })
                .await?
                .ok_or_else(not_found)?;
            (200, serde_json::to_vec(&EndpointView::of(&updated)))
        }
        WebhookOp::Delete => {
            let exists = store
                .endpoints(workspace)
                .await?
                .iter()
                .any(|e| e.id == id && mine(e));
            if !exists || !store.delete_endpoint(workspace, &id).await? {
                return Err(not_found());
            }
            (
                200,
                serde_json::to_vec(&serde_json::json!({"id": id, "deleted": true})),
            )
        }
    };
    respond::json(session, status, body.unwrap_or_default(), request_id, &[])
        .await
        .map_err(|_| ApiError::Upstream("could not write the response".into()))
}

async fn read_input(session: &mut Session) -> Result<EndpointInput, ApiError> {
    let body = read_bounded(session, BODY_LIMIT)
        .await
        .map_err(|_| ApiError::invalid("could not read the request body"))?
        .ok_or_else(|| ApiError::invalid(format!("the body must be at most {BODY_LIMIT} bytes")))?;
    let value: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object"));
    }
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("invalid endpoint: {e}")))
}

fn check_events(events: &[String]) -> Result<(), ApiError> {
    if events.is_empty() || events.len() > MAX_FILTERS {
        return Err(ApiError::invalid(format!(
            "events must name 1-{MAX_FILTERS} event names or wildcards"
        )));
    }
    events
        .iter()
        .try_for_each(|f| check_filter(f))
        .map_err(ApiError::invalid)
}

fn truncate(id: &str) -> String {
    id.chars().take(64).collect()
}
