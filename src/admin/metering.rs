//! `GET /admin/v1/audit`, `GET /admin/v1/usage` and project budgets.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

use super::extract::{JsonBody, PathParams, QueryParams};
use super::AdminState;
use crate::error::ApiError;
use crate::ids::unix_now;
use crate::metering::audit::{AuditCursor, AuditQuery, AuditRecord, ListingCursor};
use crate::metering::month::{is_month, month_of};
use crate::metering::Credits;

/// Most records one audit query returns.
const MAX_LIMIT: usize = 1_000;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct AuditParams {
    workspace: Option<String>,
    key_id: Option<String>,
    project: Option<String>,
    since: Option<u64>,
    cursor: Option<String>,
    limit: Option<usize>,
    /// `true`: the records of admin API actions (with their `actor`) instead of requests;
    /// the default for the workspace `_admin`, which holds only those.
    actions: Option<bool>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct AuditPage {
    data: Vec<AuditRecord>,
    /// Whether more records may match: ask again with `cursor` = `next_cursor`. A page that
    /// ran out of its scan budget (a filter that matches little of a large log) says so with
    /// fewer records than `limit`, even none.
    has_more: bool,
    /// Where the next page starts: after this page's last record, or where its scan stopped
    /// (`s…`); the pages after a scan cursor list records batch by batch as the log holds
    /// them, each page newest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// `GET /admin/v1/audit?workspace=…`: a workspace's audit records, newest first, a page at a
/// time. A page reads a bounded number of records (50,000): one whose filter matches little or
/// nothing of a large log answers what it found with `has_more` and a `next_cursor` to go on.
#[utoipa::path(
    get, path = "/admin/v1/audit", tag = "metering",
    params(AuditParams),
    responses(
        (status = 200, description = "A page of audit records", body = AuditPage),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn audit(
    State(state): State<AdminState>,
    QueryParams(params): QueryParams<AuditParams>,
) -> Result<Json<AuditPage>, ApiError> {
    let workspace = params
        .workspace
        .ok_or_else(|| ApiError::invalid("the query parameter 'workspace' is required"))?;
    let limit = params.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::invalid(format!("limit must be 1-{MAX_LIMIT}")));
    }
    // Unix seconds: a figure the stores cannot turn into milliseconds is no time at all.
    if params.since.is_some_and(|s| s.checked_mul(1000).is_none()) {
        return Err(ApiError::invalid("since must be a unix time in seconds"));
    }
    let cursor = match params.cursor {
        Some(text) => Some(text.parse::<ListingCursor>().map_err(|()| {
            ApiError::invalid("cursor must be the next_cursor of an earlier page")
        })?),
        None => None,
    };
    let (cursor, resume) = match cursor {
        None => (None, None),
        Some(ListingCursor::After(point)) => (Some(point), None),
        Some(ListingCursor::Scan(resume, point)) => (point, Some(resume)),
    };
    // Actions that concern no one workspace are audited under a name of their own.
    if workspace != super::access::ADMIN_AUDIT_WORKSPACE {
        state.require_workspace(&workspace).await?;
    }
    let actions = Some(
        params
            .actions
            .unwrap_or(workspace == super::access::ADMIN_AUDIT_WORKSPACE),
    );
    // One more than asked for tells whether there are more (a scan says so itself).
    let scanning = resume.is_some();
    let query = AuditQuery {
        workspace,
        key_id: params.key_id,
        project: params.project,
        since: params.since,
        cursor,
        resume,
        limit: if scanning { limit } else { limit + 1 },
        actions,
    };
    let read = state.store.audit.audit_page(&query).await?;
    let mut data = read.records;
    if let Some(resume) = read.resume {
        return Ok(Json(AuditPage {
            data,
            has_more: true,
            next_cursor: Some(ListingCursor::Scan(resume, query.cursor).to_string()),
        }));
    }
    let has_more = !scanning && data.len() > limit;
    data.truncate(limit);
    let next_cursor = match (has_more, data.last()) {
        (true, Some(last)) => Some(AuditCursor::after(last).to_string()),
        _ => None,
    };
    Ok(Json(AuditPage {
        data,
        has_more,
        next_cursor,
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageParams {
    workspace: Option<String>,
    month: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct UsageView {
    workspace: String,
    month: String,
    total: Credits,
    keys: BTreeMap<String, Credits>,
    projects: BTreeMap<String, Credits>,
}

/// `GET /admin/v1/usage?workspace=…&month=YYYY-MM`: a workspace's spend in a month, by key
/// and by project.
#[utoipa::path(
    get, path = "/admin/v1/usage", tag = "metering",
    params(UsageParams),
    responses(
        (status = 200, description = "The month's spend", body = UsageView),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn usage(
    State(state): State<AdminState>,
    QueryParams(params): QueryParams<UsageParams>,
) -> Result<Json<UsageView>, ApiError> {
    let workspace = params
        .workspace
        .ok_or_else(|| ApiError::invalid("the query parameter 'workspace' is required"))?;
    let month = params.month.unwrap_or_else(|| month_of(unix_now()));
    if !is_month(&month) {
        return Err(ApiError::invalid("month must be YYYY-MM"));
    }
    state.require_workspace(&workspace).await?;
    let report = state.store.usage.usage_report(&workspace, &month).await?;
    let credits = |m: std::collections::HashMap<String, i64>| {
        m.into_iter()
            .map(|(k, v)| (k, Credits::from_micros(v)))
            .collect()
    };
    Ok(Json(UsageView {
        workspace,
        month,
        total: Credits::from_micros(report.total),
        keys: credits(report.keys),
        projects: credits(report.projects),
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SetBudget {
    /// `null` removes the budget; the member itself is required (`{}` is not a removal).
    #[serde(deserialize_with = "Option::deserialize")]
    #[schema(required = true)]
    monthly_budget: Option<Credits>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ProjectBudget {
    workspace: String,
    project: String,
    monthly_budget: Option<Credits>,
    /// Where the budget comes from: `"api"` (set here, which overrides the configuration),
    /// `"config"` (`[[metering.project_budgets]]`), or `null` without one.
    source: Option<&'static str>,
}

/// A workspace's project budgets as they apply: those set through the API, and the
/// configuration's for the other projects, by project.
async fn budgets_in_force(
    state: &AdminState,
    workspace: &str,
) -> Result<BTreeMap<String, (Credits, &'static str)>, ApiError> {
    let mut budgets: BTreeMap<String, (Credits, &'static str)> = state
        .configured_budgets
        .iter()
        .filter(|((ws, _), _)| ws == workspace)
        .map(|((_, project), micros)| (project.clone(), (Credits::from_micros(*micros), "config")))
        .collect();
    for (project, micros) in state.store.usage.project_budgets(workspace).await? {
        budgets.insert(project, (Credits::from_micros(micros), "api"));
    }
    Ok(budgets)
}

/// `GET /admin/v1/workspaces/{id}/projects/{project}/budget`: the project's monthly budget, and
/// where it comes from.
#[utoipa::path(
    get, path = "/admin/v1/workspaces/{id}/projects/{project}/budget", tag = "metering",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)"), ("project" = String, Path, description = "Project: 1-64 characters of A-Z, a-z, 0-9, `.`, `_` or `-`")),
    responses(
        (status = 200, description = "The project's budget", body = ProjectBudget),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn project_budget(
    State(state): State<AdminState>,
    PathParams((workspace, project)): PathParams<(String, String)>,
) -> Result<Json<ProjectBudget>, ApiError> {
    if !crate::shared::project::is_valid_project(&project) {
        return Err(invalid_project());
    }
    state.require_workspace(&workspace).await?;
    let found = budgets_in_force(&state, &workspace).await?.remove(&project);
    Ok(Json(ProjectBudget {
        workspace,
        project,
        monthly_budget: found.map(|(budget, _)| budget),
        source: found.map(|(_, source)| source),
    }))
}

#[derive(Serialize, ToSchema)]
pub(super) struct ProjectBudgets {
    data: Vec<ProjectBudget>,
}

/// `GET /admin/v1/workspaces/{id}/projects`: every project of the workspace with a budget, by
/// name.
#[utoipa::path(
    get, path = "/admin/v1/workspaces/{id}/projects", tag = "metering",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)")),
    responses(
        (status = 200, description = "The projects with a budget", body = ProjectBudgets),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn project_budgets(
    State(state): State<AdminState>,
    PathParams(workspace): PathParams<String>,
) -> Result<Json<ProjectBudgets>, ApiError> {
    state.require_workspace(&workspace).await?;
    let data = budgets_in_force(&state, &workspace)
        .await?
        .into_iter()
        .map(|(project, (budget, source))| ProjectBudget {
            workspace: workspace.clone(),
            project,
            monthly_budget: Some(budget),
            source: Some(source),
        })
        .collect();
    Ok(Json(ProjectBudgets { data }))
}

fn invalid_project() -> ApiError {
    ApiError::invalid("a project is 1-64 characters of A-Z, a-z, 0-9, '.', '_' or '-'")
}

/// `PUT /admin/v1/workspaces/{id}/projects/{project}/budget`: sets (or, with `null`, removes)
/// a project's monthly budget; it overrides the configuration's.
#[utoipa::path(
    put, path = "/admin/v1/workspaces/{id}/projects/{project}/budget", tag = "metering",
    params(("id" = String, Path, description = "Workspace id (`ws_…`)"), ("project" = String, Path, description = "Project: 1-64 characters of A-Z, a-z, 0-9, `.`, `_` or `-`")),
    request_body = SetBudget,
    responses(
        (status = 200, description = "The project's budget as it applies", body = ProjectBudget),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn set_project_budget(
    State(state): State<AdminState>,
    PathParams((workspace, project)): PathParams<(String, String)>,
    JsonBody(body): JsonBody<SetBudget>,
) -> Result<Json<ProjectBudget>, ApiError> {
    if !crate::shared::project::is_valid_project(&project) {
        return Err(invalid_project());
    }
    state.require_workspace(&workspace).await?;
    state
        .store
        .usage
        .set_project_budget(
            &workspace,
            &project,
            body.monthly_budget.map(Credits::micros),
        )
        .await?;
    // Removed here, the configuration's budget (if any) applies again.
    let found = match body.monthly_budget {
        Some(budget) => Some((budget, "api")),
        None => budgets_in_force(&state, &workspace).await?.remove(&project),
    };
    Ok(Json(ProjectBudget {
        workspace,
        project,
        monthly_budget: found.map(|(budget, _)| budget),
        source: found.map(|(_, source)| source),
    }))
}
