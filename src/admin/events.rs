//! `POST /admin/v1/events`: a backend announces an event for a workspace (an image batch
//! finished, an agent run needs approval, …). It enters the event log, from which the webhook
//! worker delivers it. A `traceparent` on the call is kept with the event, so its deliveries
//! continue the backend's trace.

use axum::extract::State;
use axum::Json;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::JsonBody;
use super::AdminState;
use crate::error::ApiError;
use crate::events::{data_too_large, is_event_id, is_event_type, Event, EVENT_TYPES};
use crate::keys::format::find_keys;
use crate::keys::Environment;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewEvent {
    workspace: String,
    #[serde(rename = "type")]
    event_type: String,
    #[serde(default)]
    data: Option<serde_json::Value>,
    /// `live` (default) or `test`: test-mode events go to test-mode endpoints only.
    #[serde(default)]
    environment: Option<Environment>,
    /// The backend's own id for the event (`evt_…`), so that a retried call is the same event:
    /// fanned out once, delivered under one `Service-Event-Id`. Drawn when absent.
    #[serde(default)]
    id: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Accepted {
    id: String,
}

/// `POST /admin/v1/events`: an event enters the log, for the webhook worker to deliver.
#[utoipa::path(
    post, path = "/admin/v1/events", tag = "events",
    request_body = NewEvent,
    responses(
        (status = 202, description = "The event accepted, by id", body = Accepted),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn create(
    State(state): State<AdminState>,
    headers: http::HeaderMap,
    JsonBody(body): JsonBody<NewEvent>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    if !is_event_type(&body.event_type) {
        return Err(ApiError::invalid(format!(
            "unknown event type; one of: {}",
            EVENT_TYPES.join(", ")
        )));
    }
    let data = body.data.unwrap_or_else(|| serde_json::json!({}));
    if !data.is_object() {
        return Err(ApiError::invalid("data must be a JSON object"));
    }
    let encoded = serde_json::to_vec(&data).unwrap_or_default();
    if let Some(why) = data_too_large(encoded.len()) {
        return Err(ApiError::invalid(why));
    }
    if find_keys(&encoded).next().is_some() {
        crate::metrics::record_leak("event", "refused");
        return Err(ApiError::invalid(
            "data holds an API key or token (svc_…); events go to customers' endpoints and \
             must never carry one",
        ));
    }
    let environment = body.environment.unwrap_or(Environment::Live);
    if environment == Environment::Scoped {
        return Err(ApiError::invalid(
            "environment must be \"live\" or \"test\"",
        ));
    }
    if body.id.as_deref().is_some_and(|id| !is_event_id(id)) {
        return Err(ApiError::invalid(
            "id must be evt_ and 1 to 60 letters, digits, '_' or '-'",
        ));
    }
    state.require_workspace(&body.workspace).await?;
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok());
    let mut event =
        Event::new(&body.event_type, &body.workspace, environment, data).caused_by(traceparent);
    if let Some(id) = body.id {
        event.id = id;
    }
    state.store.events.append_event(&event).await?;
    tracing::info!(event_id = %event.id, event_type = %event.event_type, workspace = %event.workspace, "event accepted");
    Ok((StatusCode::ACCEPTED, Json(Accepted { id: event.id })))
}
