//! `/admin/v1/tokens…`: operator tokens, narrower credentials for the admin API than the
//! admin token, each revocable alone.

use axum::extract::State;
use axum::Json;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{JsonBody, PathParams};
use super::AdminState;
use crate::error::ApiError;
use crate::ids::unix_now;
use crate::keys::operators::{self, OperatorToken, Role};

/// An operator token as the admin API shows it: never its value but once, never its digest.
#[derive(Serialize, ToSchema)]
pub(super) struct TokenView {
    /// `op_…`
    id: String,
    /// The token itself (`svcop_…`): present only in the answer that created it.
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    /// Who holds it: audit records name it `operator:<name>`.
    name: String,
    role: Role,
    /// For a `workspace` token, its workspace.
    #[serde(skip_serializing_if = "Option::is_none")]
    workspace: Option<String>,
    /// Unix seconds.
    created_at: u64,
}

impl From<&OperatorToken> for TokenView {
    fn from(t: &OperatorToken) -> Self {
        Self {
            id: t.id.clone(),
            token: None,
            name: t.name.clone(),
            role: t.role,
            workspace: t.workspace.clone(),
            created_at: t.created_at,
        }
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateToken {
    /// 1-100 characters of letters, digits, `.`, `_`, `-` and `@`.
    name: String,
    role: Role,
    /// Required for the `workspace` role, refused for the others.
    #[serde(default)]
    workspace: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct TokenList {
    data: Vec<TokenView>,
}

/// Whether `name` may name a token: it appears in audit records as `operator:<name>`.
fn valid_name(name: &str) -> bool {
    (1..=100).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
}

/// `POST /admin/v1/tokens`: a new operator token, shown this once.
#[utoipa::path(
    post, path = "/admin/v1/tokens", tag = "tokens",
    request_body = CreateToken,
    responses(
        (status = 201, description = "The token, with its value (shown this once)", body = TokenView),
        (status = 404, description = "No such workspace", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn create(
    State(state): State<AdminState>,
    JsonBody(body): JsonBody<CreateToken>,
) -> Result<(StatusCode, Json<TokenView>), ApiError> {
    if !valid_name(&body.name) {
        return Err(ApiError::invalid(
            "name must be 1-100 characters of letters, digits, '.', '_', '-' and '@'",
        ));
    }
    match (body.role, &body.workspace) {
        (Role::Workspace, None) => {
            return Err(ApiError::invalid(
                "a workspace token must name its workspace",
            ))
        }
        (Role::Workspace, Some(ws)) => state.require_workspace(ws).await?,
        (_, Some(_)) => {
            return Err(ApiError::invalid(
                "only a token of the workspace role names a workspace",
            ))
        }
        (_, None) => {}
    }
    let (value, record) = operators::issue(body.name, body.role, body.workspace, unix_now());
    state.store.operators.insert_operator(&record).await?;
    tracing::info!(token_id = %record.id, name = %record.name, role = record.role.as_str(), "operator token created");
    let mut view = TokenView::from(&record);
    view.token = Some(value);
    Ok((StatusCode::CREATED, Json(view)))
}

/// `GET /admin/v1/tokens`: every operator token, oldest first (without their values).
#[utoipa::path(
    get, path = "/admin/v1/tokens", tag = "tokens",
    responses((status = 200, description = "The operator tokens", body = TokenList)),
)]
pub(super) async fn list(State(state): State<AdminState>) -> Result<Json<TokenList>, ApiError> {
    let tokens = state.store.operators.operators().await?;
    Ok(Json(TokenList {
        data: tokens.iter().map(TokenView::from).collect(),
    }))
}

/// `DELETE /admin/v1/tokens/{id}`: the token is refused from its next request on, on every
/// replica.
#[utoipa::path(
    delete, path = "/admin/v1/tokens/{id}", tag = "tokens",
    params(("id" = String, Path, description = "Operator token id (`op_…`)")),
    responses(
        (status = 200, description = "The token deleted", body = TokenView),
        (status = 404, description = "No such token", body = crate::openapi::ErrorBody),
    ),
)]
pub(super) async fn delete(
    State(state): State<AdminState>,
    PathParams(id): PathParams<String>,
) -> Result<Json<TokenView>, ApiError> {
    let deleted = state
        .store
        .operators
        .delete_operator(&id)
        .await?
        .ok_or_else(|| super::unknown("operator token", &id))?;
    tracing::info!(token_id = %deleted.id, name = %deleted.name, "operator token deleted");
    Ok(Json(TokenView::from(&deleted)))
}
