//! The webhook endpoints API on the gateway (`/v1/webhooks…`), per workspace and environment:
//! a test key sees and creates only test-mode endpoints, which get only test-mode events.

use pingora::proxy::Session;
use serde::{Deserialize, Serialize};

use super::auth::Authenticated;
use super::body::read_bounded;
use super::respond;
use crate::error::ApiError;
use crate::events::RETENTION_SECS;
use crate::ids::{new_id, unix_millis, unix_now};
use crate::keys::Environment;
use crate::store::Store;
use crate::webhooks::delivery::{Delivery, DELIVERIES_LISTED};
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
    /// `GET /v1/webhooks/{id}/deliveries`
    Deliveries,
    /// `POST /v1/webhooks/{id}/replay`
    Replay,
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

/// A delivery as the API shows it: the event's id and type, not its payload.
#[derive(Serialize)]
struct DeliveryView<'a> {
    id: &'a str,
    event_id: &'a str,
    event_type: &'a str,
    status: &'static str,
    attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_attempt_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_attempt: Option<AttemptView<'a>>,
    replay: bool,
    created_at: u64,
}

#[derive(Serialize)]
struct AttemptView<'a> {
    at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    duration_ms: u64,
}

impl<'a> DeliveryView<'a> {
    fn of(d: &'a Delivery) -> Self {
        Self {
            id: &d.id,
            event_id: &d.event.id,
            event_type: &d.event.event_type,
            status: d.status.as_str(),
            attempts: d.attempts,
            next_attempt_at: d.next_attempt_ms.map(|ms| ms / 1000),
            last_attempt: d.last_attempt.as_ref().map(|a| AttemptView {
                at: a.at_ms / 1000,
                status_code: a.status_code,
                error: a.error.as_deref(),
                duration_ms: a.duration_ms,
            }),
            replay: d.replay,
            created_at: d.created_ms / 1000,
        }
    }
}

/// `POST /v1/webhooks/{id}/replay`: one event, or every event since a time.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayInput {
    #[serde(default)]
    event_id: Option<String>,
    #[serde(default)]
    since: Option<u64>,
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
    answer_headers: &[(&'static str, String)],
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
    let not_found = || endpoint_not_found(&id);
    let find = || caller_endpoint(store, workspace, environment, &id);
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
            let url = check_url(&url, allow_insecure)
                .await
                .map_err(ApiError::invalid)?;
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
            let e = find().await?;
            (200, serde_json::to_vec(&EndpointView::of(&e)))
        }
        WebhookOp::Update | WebhookOp::Resume => {
            let input = if op == WebhookOp::Update {
                let input = read_input(session).await?;
                let url = match &input.url {
                    Some(u) => Some(
                        check_url(u, allow_insecure)
                            .await
                            .map_err(ApiError::invalid)?
                            .to_string(),
                    ),
                    None => None,
                };
                if let Some(events) = &input.events {
                    check_events(events)?;
                }
                Some((url, input.events))
            } else {
                None
            };
            find().await?;
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
        WebhookOp::Deliveries => {
            let endpoint = find().await?;
            let limit = deliveries_limit(session.req_header().uri.query())?;
            let deliveries = store.deliveries(&endpoint.id, limit).await?;
            let views: Vec<DeliveryView> = deliveries.iter().map(DeliveryView::of).collect();
            (
                200,
                serde_json::to_vec(&serde_json::json!({ "data": views })),
            )
        }
        WebhookOp::Replay => {
            let input: ReplayInput = read_json(session).await?;
            let endpoint = find().await?;
            if endpoint.status == EndpointStatus::Paused {
                return Err(ApiError::invalid(
                    "the endpoint is paused; resume it before replaying",
                ));
            }
            let (replayed, truncated) = replay(store, &endpoint, input).await?;
            let ids: Vec<&str> = replayed.iter().map(|d| d.id.as_str()).collect();
            (
                202,
                serde_json::to_vec(&serde_json::json!({
                    "endpoint": endpoint.id,
                    "replayed": replayed.len(),
                    "delivery_ids": ids,
                    "truncated": truncated,
                })),
            )
        }
        WebhookOp::Delete => {
            find().await?;
            if !store.delete_endpoint(workspace, &id).await? {
                return Err(not_found());
            }
            (
                200,
                serde_json::to_vec(&serde_json::json!({"id": id, "deleted": true})),
            )
        }
    };
    respond::json(
        session,
        status,
        body.unwrap_or_default(),
        request_id,
        answer_headers,
    )
    .await
    .map_err(|_| ApiError::Upstream("could not write the response".into()))
}

/// The caller's endpoint `id`: it must belong to the caller's workspace and environment.
async fn caller_endpoint(
    store: &dyn Store,
    workspace: &str,
    environment: Environment,
    id: &str,
) -> Result<Endpoint, ApiError> {
    store
        .endpoints(workspace)
        .await?
        .into_iter()
        .find(|e| e.id == id && e.environment == environment)
        .ok_or_else(|| endpoint_not_found(id))
}

fn endpoint_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no webhook endpoint '{}'", truncate(id)))
}

/// Most events one replay queues.
const REPLAY_MAX: usize = 10_000;
/// Deliveries listed by default, and at most.
const LISTED_DEFAULT: usize = 50;

/// Queues the replay asked for; answers the new deliveries, and whether `REPLAY_MAX` cut the
/// list short.
async fn replay(
    store: &dyn Store,
    endpoint: &Endpoint,
    input: ReplayInput,
) -> Result<(Vec<Delivery>, bool), ApiError> {
    let now = unix_now();
    let oldest = now.saturating_sub(RETENTION_SECS);
    let (events, truncated) = match (input.event_id, input.since) {
        (Some(event_id), None) => {
            let event = store
                .event(&event_id)
                .await?
                .filter(|e| {
                    e.workspace == endpoint.workspace
                        && e.environment == endpoint.environment
                        && e.created >= oldest
                })
                .ok_or_else(|| {
                    ApiError::not_found(format!(
                        "no event '{}' in the last 30 days",
                        truncate(&event_id)
                    ))
                })?;
            if !endpoint.wants(&event.event_type) {
                return Err(ApiError::invalid(format!(
                    "the endpoint does not subscribe to {}",
                    event.event_type
                )));
            }
            (vec![event], false)
        }
        (None, Some(since)) => {
            if since < oldest || since > now {
                return Err(ApiError::invalid(
                    "since must be a unix time within the last 30 days",
                ));
            }
            let events = store
                .events_since(&endpoint.workspace, endpoint.environment, since, REPLAY_MAX)
                .await?;
            let truncated = events.len() == REPLAY_MAX;
            let wanted = events
                .into_iter()
                .filter(|e| endpoint.wants(&e.event_type))
                .collect();
            (wanted, truncated)
        }
        _ => {
            return Err(ApiError::invalid(
                "give either event_id or since (a unix time)",
            ))
        }
    };
    let now_ms = unix_millis();
    let deliveries: Vec<Delivery> = events
        .iter()
        .map(|e| Delivery::new(e, &endpoint.workspace, &endpoint.id, now_ms, true))
        .collect();
    store.enqueue_deliveries(&[], &[], &deliveries).await?;
    Ok((deliveries, truncated))
}

/// `?limit=N` of the deliveries listing: 1 to the number kept.
fn deliveries_limit(query: Option<&str>) -> Result<usize, ApiError> {
    let Some((_, value)) = url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "limit")
    else {
        return Ok(LISTED_DEFAULT);
    };
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=DELIVERIES_LISTED).contains(n))
        .ok_or_else(|| ApiError::invalid(format!("limit must be 1-{DELIVERIES_LISTED}")))
}

async fn read_input(session: &mut Session) -> Result<EndpointInput, ApiError> {
    read_json(session).await
}

async fn read_json<T: serde::de::DeserializeOwned>(session: &mut Session) -> Result<T, ApiError> {
    let body = read_bounded(session, BODY_LIMIT)
        .await
        .map_err(|_| ApiError::invalid("could not read the request body"))?
        .ok_or_else(|| ApiError::invalid(format!("the body must be at most {BODY_LIMIT} bytes")))?;
    let value: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object"));
    }
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("invalid body: {e}")))
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
