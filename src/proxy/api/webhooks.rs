//! The webhook endpoints API on the gateway (`/v1/webhooks…`), per workspace and environment:
//! a test key sees and creates only test-mode endpoints, which get only test-mode events.

use pingora::proxy::Session;
use serde::Deserialize;

use crate::error::ApiError;
use crate::ids::unix_now;
use crate::proxy::auth::Authenticated;
use crate::proxy::body::read_bounded;
use crate::proxy::respond;
use crate::store::DeliveryQueue;
use crate::webhooks::endpoint::{check_url, Endpoint, WebhookFormat};
use crate::webhooks::manage::{self, EndpointView, ReplayInput, RotateInput, TestInput};

/// Largest accepted request body.
const BODY_LIMIT: usize = 16 * 1024;
/// Highest per-endpoint delivery rate limit.
const MAX_RATE_LIMIT: u32 = 10_000;

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
    /// `POST /v1/webhooks/{id}/rotate-secret`
    RotateSecret,
    /// `POST /v1/webhooks/{id}/deliveries/{delivery_id}/retry`
    RetryDelivery,
    /// `POST /v1/webhooks/{id}/test`
    Test,
    /// `GET /v1/webhooks/event-types`
    EventTypes,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointInput {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    events: Option<Vec<String>>,
    #[serde(default)]
    format: Option<WebhookFormat>,
    /// A number, or `null` to remove the limit (PATCH).
    #[serde(default, deserialize_with = "present")]
    rate_limit_per_second: Option<Option<u32>>,
}

/// A field that may be sent as `null`: `Some(None)`, told apart from one left out (`None`).
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

fn check_rate_limit(limit: Option<Option<u32>>) -> Result<(), ApiError> {
    match limit {
        Some(Some(n)) if n == 0 || n > MAX_RATE_LIMIT => Err(ApiError::invalid(format!(
            "rate_limit_per_second must be 1-{MAX_RATE_LIMIT}, or null for none"
        ))),
        _ => Ok(()),
    }
}

/// Answers one endpoints-API request.
pub async fn handle(
    session: &mut Session,
    op: WebhookOp,
    caller: &Authenticated,
    store: &dyn DeliveryQueue,
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
    let delivery_id = session
        .req_header()
        .uri
        .path()
        .split('/')
        .nth(5)
        .unwrap_or_default()
        .to_string();
    let mine = |e: &&Endpoint| e.environment == environment;
    let find = || manage::find(store, workspace, Some(environment), &id);
    let (status, body) = match op {
        WebhookOp::List => {
            let all = store.endpoints(workspace).await?;
            (
                200,
                serde_json::to_vec(&manage::list_body(all.iter().filter(mine))),
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
            check_rate_limit(input.rate_limit_per_second)?;
            let endpoint = manage::create(
                store,
                workspace,
                environment,
                manage::NewEndpoint {
                    url: &url,
                    events,
                    format: input.format.unwrap_or_default(),
                    rate_limit_per_second: input.rate_limit_per_second.flatten(),
                },
                allow_insecure,
            )
            .await?;
            (
                201,
                serde_json::to_vec(&EndpointView::with_secret(&endpoint)),
            )
        }
        WebhookOp::Get => {
            let e = find().await?;
            (200, serde_json::to_vec(&manage::show(store, &e).await?))
        }
        WebhookOp::Update => {
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
                manage::check_events(events)?;
            }
            check_rate_limit(input.rate_limit_per_second)?;
            find().await?;
            let updated = store
                .update_endpoint(workspace, &id, &|e: &mut Endpoint| {
                    if let Some(url) = &url {
                        e.url = url.clone();
                    }
                    if let Some(events) = &input.events {
                        e.events = events.clone();
                    }
                    if let Some(format) = input.format {
                        e.format = format;
                    }
                    if let Some(limit) = input.rate_limit_per_second {
                        e.rate_limit_per_second = limit;
                    }
                    e.drop_expired_secret(unix_now());
                })
                .await?
                .ok_or_else(|| manage::not_found(&id))?;
            (200, serde_json::to_vec(&EndpointView::of(&updated)))
        }
        WebhookOp::Resume => {
            let resumed = manage::resume(store, &find().await?).await?;
            (200, serde_json::to_vec(&EndpointView::of(&resumed)))
        }
        WebhookOp::Deliveries => {
            let endpoint = find().await?;
            let limit = manage::deliveries_limit(query_param(session, "limit").as_deref())?;
            (
                200,
                serde_json::to_vec(&manage::deliveries(store, &endpoint, limit).await?),
            )
        }
        WebhookOp::Replay => {
            let input: ReplayInput = read_json(session).await?;
            let endpoint = find().await?;
            (
                202,
                serde_json::to_vec(&manage::replay(store, &endpoint, input).await?),
            )
        }
        WebhookOp::RotateSecret => {
            let input: RotateInput = read_json_or_empty(session).await?;
            let endpoint = find().await?;
            (
                201,
                serde_json::to_vec(&manage::rotate_secret(store, &endpoint, input).await?),
            )
        }
        WebhookOp::RetryDelivery => {
            let endpoint = find().await?;
            (
                202,
                serde_json::to_vec(&manage::retry_delivery(store, &endpoint, &delivery_id).await?),
            )
        }
        WebhookOp::Test => {
            let input: TestInput = read_json_or_empty(session).await?;
            let endpoint = find().await?;
            (
                202,
                serde_json::to_vec(&manage::send_test(store, &endpoint, input).await?),
            )
        }
        WebhookOp::EventTypes => (
            200,
            serde_json::to_vec(&crate::webhooks::catalog::catalog_body()),
        ),
        WebhookOp::Delete => {
            find().await?;
            if !store.delete_endpoint(workspace, &id).await? {
                return Err(manage::not_found(&id));
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

/// The first value of the query parameter `name`.
fn query_param(session: &Session, name: &str) -> Option<String> {
    let query = session.req_header().uri.query()?;
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

async fn read_input(session: &mut Session) -> Result<EndpointInput, ApiError> {
    read_json(session).await
}

async fn read_json<T: serde::de::DeserializeOwned>(session: &mut Session) -> Result<T, ApiError> {
    let body = read_bounded(session, BODY_LIMIT)
        .await
        .map_err(|_| ApiError::invalid("could not read the request body"))?
        .ok_or_else(|| ApiError::invalid(format!("the body must be at most {BODY_LIMIT} bytes")))?;
    parse_object(&body)
}

/// A JSON object body, or the type's default when the body is empty.
async fn read_json_or_empty<T: serde::de::DeserializeOwned + Default>(
    session: &mut Session,
) -> Result<T, ApiError> {
    let body = read_bounded(session, BODY_LIMIT)
        .await
        .map_err(|_| ApiError::invalid("could not read the request body"))?
        .ok_or_else(|| ApiError::invalid(format!("the body must be at most {BODY_LIMIT} bytes")))?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_object(&body)
}

fn parse_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object"));
    }
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("invalid body: {e}")))
}
