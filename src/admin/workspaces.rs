//! `POST /admin/v1/workspaces`

use axum::extract::State;
use axum::Json;
use http::StatusCode;
use serde::Deserialize;

use super::extract::JsonBody;
use super::AdminState;
use crate::error::ApiError;
use crate::ids::{new_id, unix_now};
use crate::keys::Workspace;
use crate::metering::Credits;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateWorkspace {
    name: String,
    admin_emails: Vec<String>,
    #[serde(default)]
    monthly_credits: Option<Credits>,
    #[serde(default)]
    credits_low_threshold: Option<Credits>,
}

pub(super) async fn create(
    State(state): State<AdminState>,
    JsonBody(body): JsonBody<CreateWorkspace>,
) -> Result<(StatusCode, Json<Workspace>), ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(ApiError::invalid("name must be 1-200 characters"));
    }
    // Where a paused webhook endpoint is reported (SPEC §7): someone must be told.
    if body.admin_emails.is_empty() {
        return Err(ApiError::invalid("admin_emails needs at least one address"));
    }
    if let Some(bad) = body.admin_emails.iter().find(|e| !looks_like_email(e)) {
        return Err(ApiError::invalid(format!(
            "'{bad}' is not an e-mail address"
        )));
    }
    let workspace = Workspace {
        id: new_id("ws"),
        name: name.to_string(),
        admin_emails: body.admin_emails,
        monthly_credits: body.monthly_credits,
        credits_low_threshold: body.credits_low_threshold,
        created_at: unix_now(),
    };
    state.store.create_workspace(&workspace).await?;
    Ok((StatusCode::CREATED, Json(workspace)))
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
