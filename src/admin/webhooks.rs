//! `/admin/v1/workspaces/{ws}/webhooks…`: the operators' view of a workspace's webhook
//! endpoints, in both environments: list and show them (never their secrets), list an
//! endpoint's deliveries, resume a paused endpoint, replay events. Creating, changing and
//! deleting endpoints stays with the customer (`/v1/webhooks`), who holds their secrets.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use utoipa::IntoParams;

use super::extract::{JsonBody, PathParams, QueryParams};
use super::AdminState;
use crate::error::ApiError;
use crate::webhooks::manage::{self, EndpointView, ReplayInput};

/// `GET /admin/v1/workspaces/{ws}/webhooks`
#[utoipa::path(
    get, path = "/admin/v1/workspaces/{id}/webhooks", tag = "webhooks",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)")),
    responses(
        (status = 200, description = "The workspace's endpoints, both environments, without secrets", body = crate::openapi::EndpointList),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn list(
    State(state): State<AdminState>,
    PathParams(workspace): PathParams<String>,
) -> Result<Json<Value>, ApiError> {
    state.require_workspace(&workspace).await?;
    let all = state.store.deliveries.endpoints(&workspace).await?;
    Ok(Json(manage::list_body(all.iter())))
}

/// `GET /admin/v1/workspaces/{ws}/webhooks/{id}`
#[utoipa::path(
    get, path = "/admin/v1/workspaces/{id}/webhooks/{endpoint}", tag = "webhooks",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)"), ("endpoint" = String, Path, description = "Webhook endpoint id (`we_…`)")),
    responses(
        (status = 200, description = "The endpoint, without its secret", body = crate::webhooks::manage::EndpointView),
        (status = 404, description = "No such endpoint", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn show(
    State(state): State<AdminState>,
    PathParams((workspace, id)): PathParams<(String, String)>,
) -> Result<Response, ApiError> {
    let endpoint = manage::find(&*state.store.deliveries, &workspace, None, &id).await?;
    Ok(Json(manage::show(&*state.store.deliveries, &endpoint).await?).into_response())
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct DeliveriesParams {
    limit: Option<String>,
}

/// `GET /admin/v1/workspaces/{ws}/webhooks/{id}/deliveries?limit=N`
#[utoipa::path(
    get, path = "/admin/v1/workspaces/{id}/webhooks/{endpoint}/deliveries", tag = "webhooks",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)"), ("endpoint" = String, Path, description = "Webhook endpoint id (`we_…`)"), DeliveriesParams),
    responses(
        (status = 200, description = "The endpoint's deliveries, newest first", body = crate::openapi::DeliveryList),
        (status = 404, description = "No such endpoint", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn deliveries(
    State(state): State<AdminState>,
    PathParams((workspace, id)): PathParams<(String, String)>,
    QueryParams(params): QueryParams<DeliveriesParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = manage::deliveries_limit(params.limit.as_deref())?;
    let endpoint = manage::find(&*state.store.deliveries, &workspace, None, &id).await?;
    Ok(Json(
        manage::deliveries(&*state.store.deliveries, &endpoint, limit).await?,
    ))
}

/// `POST /admin/v1/workspaces/{ws}/webhooks/{id}/resume`
#[utoipa::path(
    post, path = "/admin/v1/workspaces/{id}/webhooks/{endpoint}/resume", tag = "webhooks",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)"), ("endpoint" = String, Path, description = "Webhook endpoint id (`we_…`)")),
    responses(
        (status = 200, description = "The endpoint, active again", body = crate::webhooks::manage::EndpointView),
        (status = 404, description = "No such endpoint", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn resume(
    State(state): State<AdminState>,
    PathParams((workspace, id)): PathParams<(String, String)>,
) -> Result<Response, ApiError> {
    let endpoint = manage::find(&*state.store.deliveries, &workspace, None, &id).await?;
    let resumed = manage::resume(&*state.store.deliveries, &endpoint).await?;
    tracing::info!(workspace, endpoint = %resumed.id, "webhook endpoint resumed by an operator");
    Ok(Json(EndpointView::of(&resumed)).into_response())
}

/// `POST /admin/v1/workspaces/{ws}/webhooks/{id}/replay` with `{"event_id"}` or `{"since"}`
#[utoipa::path(
    post, path = "/admin/v1/workspaces/{id}/webhooks/{endpoint}/replay", tag = "webhooks",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)"), ("endpoint" = String, Path, description = "Webhook endpoint id (`we_…`)")),
    request_body = crate::webhooks::manage::ReplayInput,
    responses(
        (status = 202, description = "What was queued", body = crate::openapi::ReplayQueued),
        (status = 404, description = "No such endpoint or event", body = crate::openapi::ErrorBody),
        (status = 429, description = "Too many deliveries queued already", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn replay(
    State(state): State<AdminState>,
    PathParams((workspace, id)): PathParams<(String, String)>,
    JsonBody(input): JsonBody<ReplayInput>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let endpoint = manage::find(&*state.store.deliveries, &workspace, None, &id).await?;
    let queued = manage::replay(&*state.store.deliveries, &endpoint, input).await?;
    Ok((StatusCode::ACCEPTED, Json(queued)))
}
