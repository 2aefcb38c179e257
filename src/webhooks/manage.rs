//! What the two webhook APIs do with an endpoint once they know whose it is: show it, list its
//! deliveries, resume it, replay its events. The customers' API on the gateway
//! (`/v1/webhooks…`, scoped to the caller's workspace and environment) and the operators' admin
//! API (`/admin/v1/workspaces/{ws}/webhooks…`, any environment) share these, so a replay from
//! the dashboard is the replay a customer gets.

use serde::{Deserialize, Serialize};

use super::delivery::{Delivery, DELIVERIES_LISTED};
use super::endpoint::{Endpoint, EndpointStatus};
use crate::error::ApiError;
use crate::events::RETENTION_SECS;
use crate::ids::{unix_millis, unix_now};
use crate::keys::Environment;
use crate::store::Store;

/// Most events one replay queues.
pub const REPLAY_MAX: usize = 10_000;
/// Deliveries listed by default.
pub const LISTED_DEFAULT: usize = 50;

/// An endpoint as the APIs show it; the secret only in the answer that created it.
#[derive(Serialize)]
pub struct EndpointView<'a> {
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
    /// The endpoint without its secret.
    pub fn of(e: &'a Endpoint) -> Self {
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

    /// The endpoint with its secret: only in the answer that created it.
    pub fn with_secret(e: &'a Endpoint) -> Self {
        Self {
            secret: Some(&e.secret),
            ..Self::of(e)
        }
    }
}

/// A delivery as the APIs show it: the event's id and type, not its payload.
#[derive(Serialize)]
pub struct DeliveryView<'a> {
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

/// The body of a replay: one event, or every event since a time.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayInput {
    #[serde(default)]
    event_id: Option<String>,
    #[serde(default)]
    since: Option<u64>,
}

/// The endpoint `id` of `workspace`, if it is in `environment` (any, when `None`).
pub async fn find(
    store: &dyn Store,
    workspace: &str,
    environment: Option<Environment>,
    id: &str,
) -> Result<Endpoint, ApiError> {
    store
        .endpoints(workspace)
        .await?
        .into_iter()
        .find(|e| e.id == id && environment.is_none_or(|env| e.environment == env))
        .ok_or_else(|| not_found(id))
}

/// The 404 for an endpoint id the caller sent (cut short: ids are ours and short).
pub fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no webhook endpoint '{}'", truncate(id)))
}

/// `{"data": [endpoints]}`, without secrets.
pub fn list_body<'a>(endpoints: impl Iterator<Item = &'a Endpoint>) -> serde_json::Value {
    let views: Vec<EndpointView> = endpoints.map(EndpointView::of).collect();
    serde_json::json!({ "data": views })
}

/// Makes a paused endpoint active again; its backlog is not resent (that is a replay).
pub async fn resume(store: &dyn Store, endpoint: &Endpoint) -> Result<Endpoint, ApiError> {
    store
        .update_endpoint(&endpoint.workspace, &endpoint.id, &|e: &mut Endpoint| {
            e.status = EndpointStatus::Active
        })
        .await?
        .ok_or_else(|| not_found(&endpoint.id))
}

/// `{"data": [deliveries]}`, newest first, at most `limit` (see [`deliveries_limit`]).
pub async fn deliveries(
    store: &dyn Store,
    endpoint: &Endpoint,
    limit: usize,
) -> Result<serde_json::Value, ApiError> {
    let deliveries = store.deliveries(&endpoint.id, limit).await?;
    let views: Vec<DeliveryView> = deliveries.iter().map(DeliveryView::of).collect();
    Ok(serde_json::json!({ "data": views }))
}

/// `limit` of a deliveries listing: 1 to the number kept, [`LISTED_DEFAULT`] if not given.
pub fn deliveries_limit(limit: Option<&str>) -> Result<usize, ApiError> {
    let Some(value) = limit else {
        return Ok(LISTED_DEFAULT);
    };
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=DELIVERIES_LISTED).contains(n))
        .ok_or_else(|| ApiError::invalid(format!("limit must be 1-{DELIVERIES_LISTED}")))
}

/// Queues the replay asked for, and answers what was queued: the new deliveries' ids, and
/// whether [`REPLAY_MAX`] cut the list short. A paused endpoint must be resumed first.
pub async fn replay(
    store: &dyn Store,
    endpoint: &Endpoint,
    input: ReplayInput,
) -> Result<serde_json::Value, ApiError> {
    if endpoint.status == EndpointStatus::Paused {
        return Err(ApiError::invalid(
            "the endpoint is paused; resume it before replaying",
        ));
    }
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
    let ids: Vec<&str> = deliveries.iter().map(|d| d.id.as_str()).collect();
    Ok(serde_json::json!({
        "endpoint": endpoint.id,
        "replayed": deliveries.len(),
        "delivery_ids": ids,
        "truncated": truncated,
    }))
}

fn truncate(id: &str) -> String {
    id.chars().take(64).collect()
}
