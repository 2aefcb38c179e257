//! Webhook endpoints: the list, adding one (its secret shown once), an endpoint's deliveries
//! with their last attempt, replay of an event or of everything since a time, resume, delete,
//! and a test event. The webhooks API's own code paths ([`crate::webhooks::manage`]).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;
use maud::html;

use super::{csrf_field, when, workspace_page, Section};
use crate::dashboard::signin::{require_workspace, Signed};
use crate::dashboard::web::{html, redirect, Ctx, Form, PageError};
use crate::dashboard::{Action, Dashboard, PREFIX};
use crate::events::{sample_data, Event, EVENT_TYPES};
use crate::ids::unix_now;
use crate::keys::Environment;
use crate::webhooks::endpoint::{Endpoint, EndpointStatus};
use crate::webhooks::manage::{self, ReplayInput};

/// Events listed for replay on an endpoint's page: the latest day's, at most this many.
const EVENTS_LISTED: usize = 100;

/// The event names and resource wildcards an endpoint can subscribe to.
fn event_choices() -> Vec<String> {
    let mut choices: Vec<String> = EVENT_TYPES.iter().map(|t| t.to_string()).collect();
    for t in EVENT_TYPES {
        if let Some((resource, _)) = t.rsplit_once('.') {
            let wildcard = format!("{resource}.*");
            if !choices.contains(&wildcard) {
                choices.push(wildcard);
            }
        }
    }
    choices
}

fn environment_field(form: &Form) -> Result<Environment, PageError> {
    match form.get("environment") {
        Some("test") => Ok(Environment::Test),
        Some("live") | None => Ok(Environment::Live),
        Some(_) => Err(PageError::bad_request("The environment is live or test.")),
    }
}

fn status_text(e: &Endpoint) -> &'static str {
    match e.status {
        EndpointStatus::Active => "active",
        EndpointStatus::Paused => "paused",
        EndpointStatus::Disabled => "disabled",
    }
}

/// `GET …/webhooks`: the endpoints, and the form that adds one.
pub async fn list(
    State(d): State<Dashboard>,
    Path(ws): Path<String>,
    ctx: Ctx,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let endpoints = d.stores().deliveries.endpoints(&ws).await?;
    let body = html! {
        section aria-labelledby="endpoints-heading" {
            h2 #endpoints-heading { "Endpoints" }
            @if endpoints.is_empty() { p { "No endpoints yet." } }
            div.table { table {
                thead { tr { th { "URL" } th { "Environment" } th { "Events" } th { "Status" } } }
                tbody { @for e in &endpoints { tr {
                    td { a.url href={ (PREFIX) "/w/" (ws) "/webhooks/" (e.id) } { (e.url) } }
                    td { (e.environment.as_str()) }
                    td { @for f in &e.events { code.scope { (f) } " " } }
                    td { span class={ "status " (status_text(e)) } { (status_text(e)) } }
                } } }
            } }
        }
        section aria-labelledby="add-heading" {
            h2 #add-heading { "Add an endpoint" }
            form.stack method="post" action={ (PREFIX) "/w/" (ws) "/webhooks" } {
                (csrf_field(&signed))
                label for="url" { "URL" }
                input #url type="url" name="url" required placeholder="https://example.com/webhooks";
                label for="environment" { "Environment" }
                select #environment name="environment" {
                    option value="live" { "live" }
                    option value="test" { "test" }
                }
                fieldset {
                    legend { "Events" }
                    @for (i, name) in event_choices().iter().enumerate() {
                        div.check {
                            input type="checkbox" name="events" value=(name) id={ "event-" (i) };
                            label for={ "event-" (i) } { code { (name) } }
                        }
                    }
                }
                button type="submit" { "Add endpoint" }
            }
        }
    };
    Ok(html(workspace_page(
        "Webhooks",
        &signed,
        &workspace,
        Section::Webhooks,
        body,
    )))
}

/// `POST …/webhooks` (`url`, `environment`, `events`): adds an endpoint and shows its secret
/// once.
pub async fn create(
    State(d): State<Dashboard>,
    Path(ws): Path<String>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let form = Form::parse(&body)?;
    signed.check_csrf(&form)?;
    let environment = environment_field(&form)?;
    let url = form
        .get("url")
        .ok_or_else(|| PageError::bad_request("Enter the endpoint's URL."))?;
    let created = manage::create(
        d.stores().deliveries.as_ref(),
        &ws,
        environment,
        manage::NewEndpoint {
            url,
            events: form.all("events"),
            format: Default::default(),
            rate_limit_per_second: None,
        },
        d.0.settings.allow_insecure_targets,
    )
    .await;
    audit(
        &d,
        &signed,
        &ctx,
        &ws,
        Some(environment),
        if created.is_ok() { 201 } else { 400 },
    )
    .await;
    let endpoint = created?;
    let page_url = format!("{PREFIX}/w/{ws}/webhooks/{}", endpoint.id);
    let body = html! {
        div.once data-replace-url=(page_url) {
            p.warning role="alert" { "Copy this signing secret now. It will not be shown again." }
            label for="new-secret" { "Signing secret" }
            div.copy {
                input #new-secret type="text" readonly value=(endpoint.secret);
                button type="button" data-copy="new-secret" { "Copy" }
            }
            p { "Endpoint " code { (endpoint.id) } " receives " @for f in &endpoint.events { code.scope { (f) } " " } }
            p { a href=(page_url) { "Done: to the endpoint" } }
        }
    };
    Ok(html(workspace_page(
        "Endpoint added",
        &signed,
        &workspace,
        Section::Webhooks,
        body,
    )))
}

/// `GET …/webhooks/{id}`: an endpoint, its deliveries and the latest day's events to replay.
pub async fn show(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let store = d.stores().deliveries.as_ref();
    let endpoint = manage::find(store, &ws, None, &id).await?;
    let deliveries = store
        .deliveries(&endpoint.id, manage::LISTED_DEFAULT)
        .await?;
    let now = unix_now();
    let events = store
        .events_since(
            &ws,
            endpoint.environment,
            now.saturating_sub(86_400),
            None,
            EVENTS_LISTED,
        )
        .await?
        .events;
    let wanted: Vec<&Event> = events
        .iter()
        .rev()
        .filter(|e| endpoint.wants(&e.event_type))
        .collect();
    let base = format!("{PREFIX}/w/{ws}/webhooks/{id}");
    let body = html! {
        dl.facts {
            dt { "URL" } dd.url { (endpoint.url) }
            dt { "Environment" } dd { (endpoint.environment.as_str()) }
            dt { "Events" } dd { @for f in &endpoint.events { code.scope { (f) } " " } }
            dt { "Status" } dd { span class={ "status " (status_text(&endpoint)) } { (status_text(&endpoint)) } }
            dt { "Created" } dd { (when(endpoint.created_at)) }
        }
        div.actions {
            @if !endpoint.is_active() {
                form method="post" action={ (base) "/resume" } {
                    (csrf_field(&signed))
                    button type="submit" { "Resume" }
                }
            }
            form.inline method="post" action={ (base) "/test" } {
                (csrf_field(&signed))
                label for="type" { "Test event" }
                select #type name="type" {
                    @for t in EVENT_TYPES { @if endpoint.wants(t) { option value=(t) { (t) } } }
                }
                button type="submit" { "Send test event" }
            }
        }
        section aria-labelledby="deliveries-heading" {
            h2 #deliveries-heading { "Deliveries" }
            @if deliveries.is_empty() { p { "None yet." } }
            div.table { table {
                thead { tr {
                    th { "Event" } th { "Status" } th { "Attempts" } th { "Last attempt" }
                    th { "Code" } th { "Duration" } th { "Error" } th { span.visually-hidden { "Action" } }
                } }
                tbody { @for dl in &deliveries { tr.delivery data-event=(dl.event.id) data-status=(dl.status.as_str()) {
                    td { code { (dl.event.event_type) } br; small { (dl.event.id) } @if dl.replay { " (replay)" } }
                    td { span class={ "status " (dl.status.as_str()) } { (dl.status.as_str()) } }
                    td { (dl.attempts) }
                    @match &dl.last_attempt {
                        Some(a) => {
                            td { (when(a.at_ms / 1000)) }
                            td { @if let Some(c) = a.status_code { (c) } }
                            td { (a.duration_ms) " ms" }
                            td { @if let Some(e) = &a.error { (e) } }
                        }
                        None => { td {} td {} td {} td {} }
                    }
                    td { (replay_button(&signed, &base, &dl.event.id)) }
                } } }
            } }
        }
        section aria-labelledby="events-heading" {
            h2 #events-heading { "Events of the last 24 hours" }
            @if wanted.is_empty() { p { "None." } }
            ul.events { @for e in &wanted {
                li { code { (e.event_type) } " " small { (e.id) " · " (when(e.created)) } " " (replay_button(&signed, &base, &e.id)) }
            } }
            form.stack method="post" action={ (base) "/replay" } {
                (csrf_field(&signed))
                label for="since" { "Replay every event since (hours ago, up to 720)" }
                input #since type="number" name="since_hours" min="1" max="720" value="24";
                button type="submit" { "Replay since" }
            }
        }
        section aria-labelledby="delete-heading" {
            h2 #delete-heading { "Delete" }
            form method="post" action={ (base) "/delete" } {
                (csrf_field(&signed))
                button.danger type="submit" { "Delete endpoint" }
            }
        }
    };
    Ok(html(workspace_page(
        "Webhook endpoint",
        &signed,
        &workspace,
        Section::Webhooks,
        body,
    )))
}

fn replay_button(signed: &Signed, base: &str, event_id: &str) -> maud::Markup {
    html! {
        form.inline method="post" action={ (base) "/replay" } {
            (csrf_field(signed))
            input type="hidden" name="event_id" value=(event_id);
            button type="submit" { "Replay" }
        }
    }
}

async fn audit(
    d: &Dashboard,
    signed: &Signed,
    ctx: &Ctx,
    ws: &str,
    environment: Option<Environment>,
    status: u16,
) {
    d.audit(Action {
        signed,
        path: &ctx.path,
        workspace: ws,
        key_id: None,
        environment,
        status,
        ip: ctx.client.ip,
    })
    .await;
}

/// Reads the endpoint of a POST to it, after the session and its CSRF token.
async fn endpoint_post(
    d: &Dashboard,
    ctx: &Ctx,
    ws: &str,
    id: &str,
    body: &[u8],
) -> Result<(Signed, Endpoint, Form), PageError> {
    let (signed, _) = require_workspace(d, ctx, ws).await?;
    let form = Form::parse(body)?;
    signed.check_csrf(&form)?;
    let endpoint = manage::find(d.stores().deliveries.as_ref(), ws, None, id).await?;
    Ok((signed, endpoint, form))
}

/// `POST …/webhooks/{id}/replay` (`event_id`, or `since_hours`): queues the replay.
pub async fn replay(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, endpoint, form) = endpoint_post(&d, &ctx, &ws, &id, &body).await?;
    let input = match (form.get("event_id"), form.get("since_hours")) {
        (Some(event_id), _) => serde_json::json!({ "event_id": event_id }),
        (None, Some(hours)) => {
            let hours: u64 = hours
                .parse()
                .ok()
                .filter(|h| (1..=720).contains(h))
                .ok_or_else(|| PageError::bad_request("Hours must be 1 to 720."))?;
            serde_json::json!({ "since": unix_now().saturating_sub(hours * 3600) })
        }
        (None, None) => return Err(PageError::bad_request("Choose an event to replay.")),
    };
    let input: ReplayInput = serde_json::from_value(input)
        .map_err(|_| PageError::bad_request("That replay cannot be made."))?;
    let replayed = manage::replay(d.stores().deliveries.as_ref(), &endpoint, input).await;
    let status = if replayed.is_ok() { 202 } else { 400 };
    audit(&d, &signed, &ctx, &ws, Some(endpoint.environment), status).await;
    replayed?;
    Ok(redirect(&format!("{PREFIX}/w/{ws}/webhooks/{id}")))
}

/// `POST …/webhooks/{id}/resume`: a paused endpoint gets deliveries again.
pub async fn resume(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, endpoint, _) = endpoint_post(&d, &ctx, &ws, &id, &body).await?;
    let resumed = manage::resume(d.stores().deliveries.as_ref(), &endpoint).await;
    let status = if resumed.is_ok() { 200 } else { 400 };
    audit(&d, &signed, &ctx, &ws, Some(endpoint.environment), status).await;
    resumed?;
    Ok(redirect(&format!("{PREFIX}/w/{ws}/webhooks/{id}")))
}

/// `POST …/webhooks/{id}/delete`: the endpoint is gone.
pub async fn delete(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, endpoint, _) = endpoint_post(&d, &ctx, &ws, &id, &body).await?;
    let deleted = d
        .stores()
        .deliveries
        .delete_endpoint(&ws, &endpoint.id)
        .await;
    let status = if matches!(deleted, Ok(true)) {
        200
    } else {
        404
    };
    audit(&d, &signed, &ctx, &ws, Some(endpoint.environment), status).await;
    deleted?;
    Ok(redirect(&format!("{PREFIX}/w/{ws}/webhooks")))
}

/// `POST …/webhooks/{id}/test` (`type`): an event of that type, with a sample payload, enters
/// the workspace's log in the endpoint's environment (every endpoint subscribed gets it).
pub async fn send_test(
    State(d): State<Dashboard>,
    Path((ws, id)): Path<(String, String)>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let (signed, endpoint, form) = endpoint_post(&d, &ctx, &ws, &id, &body).await?;
    let event_type = form
        .get("type")
        .filter(|t| endpoint.wants(t))
        .ok_or_else(|| PageError::bad_request("Choose an event type the endpoint receives."))?;
    let data = sample_data(event_type, &ws).unwrap_or_else(|| serde_json::json!({}));
    let event = Event::new(event_type, &ws, endpoint.environment, data);
    let appended = d.stores().events.append_event(&event).await;
    let status = if appended.is_ok() { 202 } else { 503 };
    audit(&d, &signed, &ctx, &ws, Some(endpoint.environment), status).await;
    appended?;
    Ok(redirect(&format!("{PREFIX}/w/{ws}/webhooks/{id}")))
}
