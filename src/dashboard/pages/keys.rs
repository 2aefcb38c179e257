//! API keys: the list, creation (the full key shown once), a key's page with its recent audit
//! records, rotation, revocation and the monthly budget. Every change is the admin API's own
//! ([`crate::keys::manage`]).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;
use maud::{html, Markup};
use std::sync::Arc;

use super::{credits, csrf_field, when, workspace_page, Section};
use crate::dashboard::signin::{require_workspace, Signed};
use crate::dashboard::web::{html, redirect, Ctx, Form, PageError};
use crate::dashboard::{Action, Dashboard, PREFIX};
use crate::ids::unix_now;
use crate::keys::format::generate;
use crate::keys::manage::{self, KeyChange, Rotated};
use crate::keys::{Environment, KeyRecord, KeyStatus};
use crate::metering::audit::AuditQuery;
use crate::shared::month::month_of;
use crate::shared::Credits;

/// The grace periods offered at rotation, besides the configured default.
const GRACE_CHOICES: [(u64, &str); 4] = [
    (0, "None: the old key stops now"),
    (3600, "1 hour"),
    (86_400, "24 hours"),
    (604_800, "7 days"),
];

/// Key `id` of workspace `ws` (not a scoped token); else 404.
async fn key_of(d: &Dashboard, ws: &str, id: &str) -> Result<Arc<KeyRecord>, PageError> {
    match d.stores().keys.key_by_id(id).await? {
        Some(k) if k.workspace == ws && k.scoped.is_none() => Ok(k),
        _ => Err(PageError::not_found(
            "There is no such key in this workspace.",
        )),
    }
}

/// A monthly budget as a form gives it: blank is none.
fn budget_field(form: &Form) -> Result<Option<Credits>, PageError> {
    form.get("monthly_budget")
        .map(|b| {
            Credits::parse_decimal(b)
                .filter(|c| c.micros() >= 0)
                .ok_or_else(|| {
                    PageError::bad_request(
                        "The monthly budget must be a number of credits, like 25 or 12.5.",
                    )
                })
        })
        .transpose()
}

fn key_label(k: &KeyRecord) -> String {
    format!("{}…{}", k.prefix, k.last4)
}

/// `GET …/keys`: the workspace's keys and the form that creates one.
pub async fn list(
    State(d): State<Dashboard>,
    Path(ws): Path<String>,
    ctx: Ctx,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let keys = d.stores().keys.keys_in_workspace(&ws, None, 1000).await?;
    let usage = d
        .stores()
        .usage
        .usage_report(&ws, &month_of(unix_now()))
        .await?;
    let spent = |id: &str| Credits::from_micros(usage.keys.get(id).copied().unwrap_or(0));
    let body = html! {
        section aria-labelledby="keys-heading" {
            h2 #keys-heading { "Keys" }
            @if keys.is_empty() { p { "No keys yet." } }
            div.table {
                table {
                    thead { tr {
                        th { "Name" } th { "Key" } th { "Environment" } th { "Scopes" }
                        th { "Created" } th { "Status" } th { "Spent this month" }
                    } }
                    tbody {
                        @for k in &keys {
                            tr {
                                td { a href={ (PREFIX) "/w/" (ws) "/keys/" (k.id) } {
                                    @if k.name.is_empty() { (k.id) } @else { (k.name) }
                                } }
                                td { code { (key_label(k)) } }
                                td { (k.environment.as_str()) }
                                td { @for s in k.scopes.iter() { code.scope { (s) } " " } }
                                td { (when(k.created_at)) }
                                td { span class={ "status " (k.status.as_str()) } { (k.status.as_str()) } }
                                td {
                                    (credits(spent(&k.id)))
                                    @if let Some(b) = k.monthly_budget { " of " (credits(b)) }
                                }
                            }
                        }
                    }
                }
            }
        }
        (create_form(&d, &signed, &ws))
    };
    Ok(html(workspace_page(
        "API keys",
        &signed,
        &workspace,
        Section::Keys,
        body,
    )))
}

fn create_form(d: &Dashboard, signed: &Signed, ws: &str) -> Markup {
    html! {
        section aria-labelledby="create-heading" {
            h2 #create-heading { "Create a key" }
            form.stack method="post" action={ (PREFIX) "/w/" (ws) "/keys" } {
                (csrf_field(signed))
                label for="name" { "Name" }
                input #name type="text" name="name" maxlength="200" placeholder="production backend";
                label for="environment" { "Environment" }
                select #environment name="environment" {
                    option value="live" { "live" }
                    option value="test" { "test (never billed, sandbox backends)" }
                }
                fieldset {
                    legend { "Scopes" }
                    @for (i, scope) in d.0.settings.scopes.iter().enumerate() {
                        div.check {
                            input type="checkbox" name="scopes" value=(scope) id={ "scope-" (i) };
                            label for={ "scope-" (i) } { code { (scope) } }
                        }
                    }
                }
                label for="monthly_budget" { "Monthly budget in credits (optional)" }
                input #monthly_budget type="text" inputmode="decimal" name="monthly_budget";
                button type="submit" { "Create key" }
            }
        }
    }
}

/// The page that shows a new key's full value, this once.
fn shown_once(title: &str, value: &str, list_url: &str, extra: Markup) -> Markup {
    html! {
        div.once data-replace-url=(list_url) {
            p.warning role="alert" {
                "Copy this key now. It will not be shown again."
            }
            label for="new-key" { "Your new key" }
            div.copy {
                input #new-key type="text" readonly value=(value) aria-label=(title);
                button type="button" data-copy="new-key" { "Copy" }
            }
            (extra)
            p { a href=(list_url) { "Done: back to the keys" } }
        }
    }
}

/// `POST …/keys`: creates a key and shows it once.
pub async fn create(
    State(d): State<Dashboard>,
    Path(ws): Path<String>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let form = Form::parse(&body)?;
    signed.check_csrf(&form)?;
    let environment = match form.get("environment") {
        Some("test") => Environment::Test,
        Some("live") | None => Environment::Live,
        Some(_) => return Err(PageError::bad_request("The environment is live or test.")),
    };
    let made = async {
        let params = manage::new_key_params(
            ws.clone(),
            environment,
            &form.all("scopes"),
            form.get("name").unwrap_or_default().to_string(),
            budget_field(&form)?,
        )?;
        let key = generate(environment);
        let record = manage::create(d.stores().keys.as_ref(), params, &key, unix_now()).await?;
        Ok::<_, PageError>((record, key))
    }
    .await;
    let key_id = made.as_ref().ok().map(|(record, _)| record.id.as_str());
    d.audit(Action {
        signed: &signed,
        path: &ctx.path,
        workspace: &ws,
        key_id,
        environment: Some(environment),
        status: if key_id.is_some() { 201 } else { 400 },
        ip: ctx.client.ip,
    })
    .await;
    let (record, key) = made?;
    d.refresh_keys().await;
    let list_url = format!("{PREFIX}/w/{ws}/keys");
    let body = shown_once(
        "New key",
        &key.value,
        &list_url,
        html! {
            p { "Key " code { (record.id) } " · " (record.environment.as_str()) " · "
                @for s in record.scopes.iter() { code.scope { (s) } " " } }
        },
    );
    Ok(html(workspace_page(
        "Key created",
        &signed,
        &workspace,
        Section::Keys,
        body,
    )))
}

/// `GET …/keys/{id}`: one key, its rotation, budget and revocation, and its recent audit
/// records.
pub async fn show(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let key = key_of(&d, &ws, &id).await?;
    let records = d
        .stores()
        .audit
        .audit(&AuditQuery {
            workspace: ws.clone(),
            key_id: Some(id.clone()),
            project: None,
            since: None,
            cursor: None,
            limit: 20,
            resume: None,
            actions: None,
        })
        .await?;
    let base = format!("{PREFIX}/w/{ws}/keys/{id}");
    let default_grace = d.0.settings.rotation_grace_seconds;
    let body = html! {
        dl.facts {
            dt { "Key" } dd { code { (key_label(&key)) } }
            dt { "Id" } dd { code { (key.id) } }
            dt { "Environment" } dd { (key.environment.as_str()) }
            dt { "Scopes" } dd { @for s in key.scopes.iter() { code.scope { (s) } " " } }
            dt { "Status" } dd { span class={ "status " (key.status.as_str()) } { (key.status.as_str()) }
                @if let Some(g) = key.grace_until { " until " (when(g)) } }
            dt { "Created" } dd { (when(key.created_at)) }
            dt { "Monthly budget" } dd { @match key.monthly_budget { Some(b) => (credits(b)), None => "none" } }
            @if let Some(to) = &key.rotated_to {
                dt { "Replaced by" } dd { a href={ (PREFIX) "/w/" (ws) "/keys/" (to) } { code { (to) } } }
            }
        }
        @if key.status == KeyStatus::Active {
            section aria-labelledby="rotate-heading" {
                h2 #rotate-heading { "Rotate" }
                form.stack method="post" action={ (base) "/rotate" } {
                    (csrf_field(&signed))
                    label for="grace_period_seconds" { "How long the old key keeps working" }
                    select #grace_period_seconds name="grace_period_seconds" {
                        option value="" selected { "The default (" (grace_text(default_grace)) ")" }
                        @for (secs, label) in GRACE_CHOICES {
                            option value=(secs) { (label) }
                        }
                    }
                    button type="submit" { "Rotate" }
                }
            }
        }
        @if key.status != KeyStatus::Revoked {
            section aria-labelledby="budget-heading" {
                h2 #budget-heading { "Monthly budget" }
                form.stack method="post" action={ (base) "/budget" } {
                    (csrf_field(&signed))
                    label for="monthly_budget" { "Credits per month (blank: no budget)" }
                    input #monthly_budget type="text" inputmode="decimal" name="monthly_budget"
                        value=[key.monthly_budget.map(credits)];
                    button type="submit" { "Set budget" }
                }
            }
            section aria-labelledby="revoke-heading" {
                h2 #revoke-heading { "Revoke" }
                p { "A revoked key stops working at once, on every gateway." }
                a.button.danger href={ (base) "/revoke" } { "Revoke…" }
            }
        }
        section aria-labelledby="audit-heading" {
            h2 #audit-heading { "Recent requests and changes" }
            @if records.is_empty() { p { "None yet." } }
            div.table { table {
                thead { tr { th { "Time" } th { "Who" } th { "Request" } th { "Status" } th { "Credits" } } }
                tbody { @for r in &records { tr {
                    td { (when(r.time_ms / 1000)) }
                    td { (r.actor.as_deref().unwrap_or("key")) }
                    td { code { (r.method) " " (r.path) } }
                    td { (r.status) }
                    td { (r.credits) }
                } } }
            } }
        }
    };
    let title = if key.name.is_empty() {
        key.id.clone()
    } else {
        key.name.clone()
    };
    Ok(html(workspace_page(
        &title,
        &signed,
        &workspace,
        Section::Keys,
        body,
    )))
}

fn grace_text(secs: u64) -> String {
    match secs {
        0 => "none".into(),
        s if s % 86_400 == 0 => format!("{} days", s / 86_400),
        s if s % 3600 == 0 => format!("{} hours", s / 3600),
        s => format!("{s} seconds"),
    }
}

/// `POST …/keys/{id}/rotate` (`grace_period_seconds`): the successor, shown once, and how long
/// the old key still works.
pub async fn rotate(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let form = Form::parse(&body)?;
    signed.check_csrf(&form)?;
    let old = key_of(&d, &ws, &id).await?;
    let asked = form
        .get("grace_period_seconds")
        .map(|g| g.parse::<u64>())
        .transpose()
        .map_err(|_| PageError::bad_request("The grace period is a number of seconds."))?;
    let grace = manage::grace_seconds(asked, d.0.settings.rotation_grace_seconds)?;
    let key = generate(old.environment);
    let now = unix_now();
    let rotated = manage::rotate(d.stores().keys.as_ref(), &old, &key, grace, now).await;
    let status = match &rotated {
        Ok(Rotated::Successor(_)) => 201,
        Ok(_) => 404,
        Err(_) => 400,
    };
    d.audit(Action {
        signed: &signed,
        path: &ctx.path,
        workspace: &ws,
        key_id: Some(&old.id),
        environment: Some(old.environment),
        status,
        ip: ctx.client.ip,
    })
    .await;
    let successor = match rotated? {
        Rotated::Successor(s) => s,
        Rotated::Before | Rotated::NotFound => {
            return Err(PageError::not_found("This key can no longer be rotated."))
        }
    };
    d.refresh_keys().await;
    let list_url = format!("{PREFIX}/w/{ws}/keys");
    let body = shown_once(
        "Rotated key",
        &key.value,
        &list_url,
        html! {
            p role="status" {
                "The old key " code { (key_label(&old)) } " "
                @if grace == 0 { "no longer works." }
                @else { "keeps working until " (when(now + grace)) " (" (grace_text(grace)) ")." }
            }
            p { "New key " a href={ (PREFIX) "/w/" (ws) "/keys/" (successor.id) } { code { (successor.id) } } }
        },
    );
    Ok(html(workspace_page(
        "Key rotated",
        &signed,
        &workspace,
        Section::Keys,
        body,
    )))
}

/// `GET …/keys/{id}/revoke`: asks to confirm.
pub async fn confirm_revoke(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let key = key_of(&d, &ws, &id).await?;
    let body = html! {
        p.warning role="alert" {
            "Revoke " code { (key_label(&key)) } "? Every request with it is refused from now on, "
            "on every gateway. This cannot be undone."
        }
        form method="post" action={ (PREFIX) "/w/" (ws) "/keys/" (id) "/revoke" } {
            (csrf_field(&signed))
            button.danger type="submit" { "Revoke" }
            " "
            a href={ (PREFIX) "/w/" (ws) "/keys/" (id) } { "Cancel" }
        }
    };
    Ok(html(workspace_page(
        "Revoke key",
        &signed,
        &workspace,
        Section::Keys,
        body,
    )))
}

/// `POST …/keys/{id}/revoke`: the key stops working at once.
pub async fn revoke(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, _) = require_workspace(&d, &ctx, &ws).await?;
    let form = Form::parse(&body)?;
    signed.check_csrf(&form)?;
    let key = key_of(&d, &ws, &id).await?;
    let revoked = manage::revoke(d.stores().keys.as_ref(), &key.id).await;
    d.refresh_keys().await;
    audit_key_change(&d, &signed, &ctx, &ws, &key, revoked.is_ok()).await;
    revoked?;
    Ok(redirect(&format!("{PREFIX}/w/{ws}/keys/{id}")))
}

/// `POST …/keys/{id}/budget` (`monthly_budget`, blank for none).
pub async fn set_budget(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, _) = require_workspace(&d, &ctx, &ws).await?;
    let form = Form::parse(&body)?;
    signed.check_csrf(&form)?;
    let key = key_of(&d, &ws, &id).await?;
    let budget = budget_field(&form)?;
    let change = KeyChange {
        monthly_budget: Some(budget),
        ..KeyChange::default()
    };
    let changed = manage::change(d.stores().keys.as_ref(), &key.id, change).await;
    d.refresh_keys().await;
    audit_key_change(&d, &signed, &ctx, &ws, &key, changed.is_ok()).await;
    changed?;
    Ok(redirect(&format!("{PREFIX}/w/{ws}/keys/{id}")))
}

async fn audit_key_change(
    d: &Dashboard,
    signed: &Signed,
    ctx: &Ctx,
    ws: &str,
    key: &KeyRecord,
    ok: bool,
) {
    d.audit(Action {
        signed,
        path: &ctx.path,
        workspace: ws,
        key_id: Some(&key.id),
        environment: Some(key.environment),
        status: if ok { 200 } else { 503 },
        ip: ctx.client.ip,
    })
    .await;
}

/// Keys whose spend this month is at 80% of their budget or more, for the overview.
pub fn near_budget<'a>(
    keys: &'a [Arc<KeyRecord>],
    spent: impl Fn(&str) -> i64 + 'a,
) -> impl Iterator<Item = (&'a KeyRecord, Credits, Credits)> + 'a {
    keys.iter().filter_map(move |k| {
        let budget = k.monthly_budget?;
        let spent = spent(&k.id);
        (k.status != KeyStatus::Revoked && budget.micros() > 0 && spent * 5 >= budget.micros() * 4)
            .then(|| (&**k, Credits::from_micros(spent), budget))
    })
}
