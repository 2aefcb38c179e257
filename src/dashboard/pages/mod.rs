//! The dashboard's pages: the frame they share, the sign-in pages, the workspace picker, and
//! the assets (CSS and one small script) embedded in the binary.

pub mod audit;
pub mod keys;
pub mod overview;
pub mod webhooks;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::StatusCode;
use maud::{html, Markup, DOCTYPE};

use super::signin::{self, Signed};
use super::web::{redirect, Ctx, PageError};
use super::{Dashboard, PREFIX};
use crate::keys::Workspace;
use crate::shared::Credits;

const CSS: &str = include_str!("../assets/app.css");
const JS: &str = include_str!("../assets/app.js");

/// The document around every page.
fn document(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · svcgate" }
                link rel="stylesheet" href={ (PREFIX) "/assets/app.css" };
                script src={ (PREFIX) "/assets/app.js" } defer {}
            }
            body { (body) }
        }
    }
}

/// The sections of a workspace's pages.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Credits, spend and what needs attention.
    Overview,
    /// Keys.
    Keys,
    /// Webhook endpoints.
    Webhooks,
    /// The audit log.
    Audit,
}

/// A page of workspace `ws`: its navigation, who is signed in, the sign-out button.
pub fn workspace_page(
    title: &str,
    signed: &Signed,
    ws: &Workspace,
    section: Section,
    body: Markup,
) -> Markup {
    let base = format!("{PREFIX}/w/{}", ws.id);
    let link = |s: Section, href: String, label: &str| {
        html! {
            @if s == section {
                a href=(href) aria-current="page" { (label) }
            } @else {
                a href=(href) { (label) }
            }
        }
    };
    document(
        title,
        html! {
            header {
                a.brand href={ (PREFIX) "/workspaces" } { "svcgate" }
                span.workspace { (ws.name) " " small { (ws.id) } }
                nav aria-label="Workspace" {
                    (link(Section::Overview, base.clone(), "Overview"))
                    (link(Section::Keys, format!("{base}/keys"), "API keys"))
                    (link(Section::Webhooks, format!("{base}/webhooks"), "Webhooks"))
                    (link(Section::Audit, format!("{base}/audit"), "Audit log"))
                }
                form.signout method="post" action={ (PREFIX) "/sign-out" } {
                    (csrf_field(signed))
                    span.who { (signed.who()) }
                    button type="submit" { "Sign out" }
                }
            }
            main { h1 { (title) } (body) }
        },
    )
}

/// The hidden CSRF field of every form of a session.
pub fn csrf_field(signed: &Signed) -> Markup {
    html! { input type="hidden" name="_csrf" value=(signed.csrf()); }
}

/// A page outside any workspace (sign-in, errors).
fn plain_page(title: &str, body: Markup) -> Markup {
    document(
        title,
        html! {
            header { a.brand href={ (PREFIX) "/" } { "svcgate" } }
            main.narrow { h1 { (title) } (body) }
        },
    )
}

/// The page of an error: what went wrong, and a way on.
pub fn error_page(status: StatusCode, message: &str) -> Markup {
    plain_page(
        status.canonical_reason().unwrap_or("Error"),
        html! {
            p.error role="alert" { (message) }
            p { a href={ (PREFIX) "/" } { "Back to the dashboard" } }
        },
    )
}

/// The sign-in page: e-mail for workspace admins, the admin token for operators.
pub fn sign_in(problem: Option<&str>) -> Markup {
    plain_page(
        "Sign in",
        html! {
            @if let Some(problem) = problem { p.error role="alert" { (problem) } }
            form method="post" action={ (PREFIX) "/sign-in" } {
                label for="email" { "E-mail address" }
                input #email type="email" name="email" autocomplete="email" required;
                p.hint { "Workspace admins get a sign-in link by e-mail." }
                button type="submit" { "Sign in" }
            }
            details {
                summary { "Operators: sign in with the admin token" }
                form method="post" action={ (PREFIX) "/sign-in/token" } {
                    label for="token" { "Admin token" }
                    input #token type="password" name="token" autocomplete="current-password" required;
                    button type="submit" { "Sign in with the admin token" }
                }
            }
        },
    )
}

/// The answer to a link request, the same whether or not the address is known.
pub fn check_mail() -> Markup {
    plain_page(
        "Check your e-mail",
        html! {
            p role="status" {
                "If that address belongs to a workspace admin, a sign-in link is on its way. "
                "It works once, within 15 minutes."
            }
            p { a href={ (PREFIX) "/sign-in" } { "Back to sign-in" } }
        },
    )
}

/// The page a mailed link opens: one button that uses it.
pub fn use_link(token: &str) -> Markup {
    plain_page(
        "Sign in",
        html! {
            form method="post" action={ (PREFIX) "/sign-in/link" } {
                input type="hidden" name="token" value=(token);
                p { "Sign in to the svcgate dashboard with the link you were mailed." }
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// `GET /dashboard/`: the workspaces of whoever is signed in, or the sign-in page.
pub async fn home(State(d): State<Dashboard>, ctx: Ctx) -> Result<Response, PageError> {
    match signin::current(&d, &ctx).await? {
        Some(_) => Ok(redirect(&format!("{PREFIX}/workspaces"))),
        None => Ok(redirect(&format!("{PREFIX}/sign-in"))),
    }
}

/// `GET /dashboard/workspaces`: the workspaces the session may open; with one, that one.
pub async fn workspaces(State(d): State<Dashboard>, ctx: Ctx) -> Result<Response, PageError> {
    let signed = signin::require(&d, &ctx).await?;
    let found = signin::workspaces_of(&d, &signed).await?;
    if let [only] = found.as_slice() {
        return Ok(redirect(&format!("{PREFIX}/w/{}", only.id)));
    }
    let body = html! {
        header {
            a.brand href={ (PREFIX) "/workspaces" } { "svcgate" }
            form.signout method="post" action={ (PREFIX) "/sign-out" } {
                (csrf_field(&signed))
                span.who { (signed.who()) }
                button type="submit" { "Sign out" }
            }
        }
        main.narrow {
            h1 { "Workspaces" }
            @if found.is_empty() {
                p { "You are not an admin of any workspace." }
            }
            ul.cards {
                @for ws in &found {
                    li { a href={ (PREFIX) "/w/" (ws.id) } { (ws.name) } " " small { (ws.id) } }
                }
            }
        }
    };
    Ok(super::web::html(document("Workspaces", body)))
}

/// `GET /dashboard/assets/app.css`
pub async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

/// `GET /dashboard/assets/app.js`
pub async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            (CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

/// Credits as pages show them: up to six decimals, no trailing zeros.
pub fn credits(amount: Credits) -> String {
    amount.to_string()
}

/// A unix time as pages show it: `2026-12-02 13:05 UTC`.
pub fn when(unix: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .ok()
        .and_then(|t| {
            t.format(time::macros::format_description!(
                "[year]-[month]-[day] [hour]:[minute] UTC"
            ))
            .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}
