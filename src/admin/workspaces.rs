//! `POST` and `GET /admin/v1/workspaces`, `GET` and `PATCH /admin/v1/workspaces/{id}`

use axum::extract::State;
use axum::Json;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{page_limit, JsonBody, PathParams, QueryParams};
use super::AdminState;
use crate::error::ApiError;
use crate::ids::{new_id, unix_now};
use crate::keys::{RateLimit, Workspace};
use crate::metering::Credits;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateWorkspace {
    name: String,
    admin_emails: Vec<String>,
    #[serde(default)]
    monthly_credits: Option<Credits>,
    #[serde(default)]
    credits_low_threshold: Option<Credits>,
    /// The rate limit of each of its keys that sets none.
    #[serde(default)]
    rate_limit: Option<RateLimit>,
}

/// `POST /admin/v1/workspaces`: a new workspace.
#[utoipa::path(
    post, path = "/admin/v1/workspaces", tag = "workspaces",
    request_body = CreateWorkspace,
    responses((status = 201, description = "The workspace created", body = Workspace)),
)]
pub(super) async fn create(
    State(state): State<AdminState>,
    JsonBody(body): JsonBody<CreateWorkspace>,
) -> Result<(StatusCode, Json<Workspace>), ApiError> {
    let workspace = Workspace {
        id: new_id("ws"),
        name: valid_name(&body.name)?,
        admin_emails: valid_emails(body.admin_emails)?,
        monthly_credits: body.monthly_credits,
        credits_low_threshold: body.credits_low_threshold,
        rate_limit: body
            .rate_limit
            .map(RateLimit::check)
            .transpose()
            .map_err(ApiError::invalid)?,
        created_at: unix_now(),
    };
    state.store.keys.create_workspace(&workspace).await?;
    Ok((StatusCode::CREATED, Json(workspace)))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    /// Workspaces per page ([`page_limit`]).
    limit: Option<usize>,
    /// The last id of the previous page.
    starting_after: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct WorkspaceList {
    data: Vec<Workspace>,
    /// Whether workspaces follow this page: ask again with `starting_after` the last one's id.
    has_more: bool,
}

/// `GET /admin/v1/workspaces`: every workspace, oldest first, a page at a time.
#[utoipa::path(
    get, path = "/admin/v1/workspaces", tag = "workspaces",
    params(ListQuery),
    responses((status = 200, description = "A page of workspaces", body = WorkspaceList)),
)]
pub(super) async fn list(
    State(state): State<AdminState>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<WorkspaceList>, ApiError> {
    let limit = page_limit(query.limit)?;
    if let Some(after) = &query.starting_after {
        if state.store.keys.workspace(after).await?.is_none() {
            return Err(ApiError::invalid(
                "starting_after must be the id of a workspace",
            ));
        }
    }
    let (data, has_more) = state
        .store
        .keys
        .workspaces(query.starting_after.as_deref(), limit)
        .await?;
    Ok(Json(WorkspaceList { data, has_more }))
}

/// `GET /admin/v1/workspaces/{id}`: one workspace.
#[utoipa::path(
    get, path = "/admin/v1/workspaces/{id}", tag = "workspaces",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)")),
    responses(
        (status = 200, description = "The workspace", body = Workspace),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn show(
    State(state): State<AdminState>,
    PathParams(id): PathParams<String>,
) -> Result<Json<Workspace>, ApiError> {
    let workspace = state.store.keys.workspace(&id).await?;
    workspace
        .map(Json)
        .ok_or_else(|| super::unknown("workspace", &id))
}

/// What `PATCH` may change; absent fields stay, `null` removes a cap or a threshold.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PatchWorkspace {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    admin_emails: Option<Vec<String>>,
    #[serde(default, deserialize_with = "super::extract::present")]
    monthly_credits: Option<Option<Credits>>,
    #[serde(default, deserialize_with = "super::extract::present")]
    credits_low_threshold: Option<Option<Credits>>,
    /// Absent: unchanged; `null`: the environment's default; an object: the workspace's
    /// keys' limit (a key's own limit still wins).
    #[serde(default, deserialize_with = "super::extract::present")]
    rate_limit: Option<Option<RateLimit>>,
}

/// Changes a workspace. Every replica reads the credits and the threshold on its next usage
/// flush, so a raised `monthly_credits` lets a spent workspace's requests through again, and
/// a remainder back above the threshold re-arms `billing.credits.low`.
#[utoipa::path(
    patch, path = "/admin/v1/workspaces/{id}", tag = "workspaces",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)")),
    request_body = PatchWorkspace,
    responses(
        (status = 200, description = "The workspace changed", body = Workspace),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn patch(
    State(state): State<AdminState>,
    PathParams(id): PathParams<String>,
    JsonBody(body): JsonBody<PatchWorkspace>,
) -> Result<Json<Workspace>, ApiError> {
    let name = body.name.as_deref().map(valid_name).transpose()?;
    let admin_emails = body.admin_emails.map(valid_emails).transpose()?;
    if let Some(Some(limit)) = body.rate_limit {
        limit.check().map_err(ApiError::invalid)?;
    }
    let updated = state
        .store
        .keys
        .update_workspace(&id, &|w: &mut Workspace| {
            if let Some(name) = &name {
                w.name = name.clone();
            }
            if let Some(emails) = &admin_emails {
                w.admin_emails = emails.clone();
            }
            if let Some(credits) = body.monthly_credits {
                w.monthly_credits = credits;
            }
            if let Some(threshold) = body.credits_low_threshold {
                w.credits_low_threshold = threshold;
            }
            if let Some(limit) = body.rate_limit {
                w.rate_limit = limit;
            }
        })
        .await?
        .ok_or_else(|| super::unknown("workspace", &id))?;
    state.refresh_keys().await;
    tracing::info!(workspace = %updated.id, "workspace changed");
    Ok(Json(updated))
}

/// A display name: 1-200 characters once trimmed.
fn valid_name(name: &str) -> Result<String, ApiError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(ApiError::invalid("name must be 1-200 characters"));
    }
    Ok(name.to_string())
}

/// Where a paused webhook endpoint is reported: someone must be told.
fn valid_emails(emails: Vec<String>) -> Result<Vec<String>, ApiError> {
    if emails.is_empty() {
        return Err(ApiError::invalid("admin_emails needs at least one address"));
    }
    if let Some(bad) = emails.iter().find(|e| !looks_like_email(e)) {
        return Err(ApiError::invalid(format!(
            "'{bad}' is not an e-mail address"
        )));
    }
    Ok(emails)
}

/// An address the pause e-mails can go to (delivery is the real test of it).
fn looks_like_email(s: &str) -> bool {
    s.len() <= 254 && crate::webhooks::mail::can_mail(s)
}

#[cfg(test)]
mod tests {
    use super::looks_like_email;

    #[test]
    fn email_plausibility() {
        assert!(looks_like_email("ops@example.com"));
        for bad in [
            "",
            "ops",
            "@example.com",
            "ops@example",
            "ops@.com",
            "a b@c.d",
            "a@b@c.d",
            "ops@example.com.",
            "\"unterminated@example.com",
            "ops@exa_mple .com",
        ] {
            assert!(!looks_like_email(bad), "{bad}");
        }
    }
}
