//! A workspace's overview: this month's credits against its allowance, spend by project, keys
//! near their budget, paused endpoints.

use axum::extract::{Path, State};
use axum::response::Response;
use maud::html;

use super::{credits, keys::near_budget, workspace_page, Section};
use crate::dashboard::signin::require_workspace;
use crate::dashboard::web::{html, Ctx, PageError};
use crate::dashboard::{Dashboard, PREFIX};
use crate::ids::unix_now;
use crate::shared::month::month_of;
use crate::shared::Credits;

/// `GET /dashboard/w/{ws}`
pub async fn show(
    State(d): State<Dashboard>,
    Path(ws): Path<String>,
    ctx: Ctx,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    let month = month_of(unix_now());
    let usage = d.stores().usage.usage_report(&ws, &month).await?;
    let keys = d.stores().keys.keys_in_workspace(&ws, None, 1000).await?;
    let endpoints = d.stores().deliveries.endpoints(&ws).await?;
    let paused: Vec<_> = endpoints.iter().filter(|e| !e.is_active()).collect();
    let near: Vec<_> = near_budget(&keys, |id| usage.keys.get(id).copied().unwrap_or(0)).collect();
    let mut projects: Vec<(&String, &i64)> = usage.projects.iter().collect();
    projects.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let spent = Credits::from_micros(usage.total);
    let body = html! {
        section.cards aria-labelledby="credits-heading" {
            h2 #credits-heading { "Credits in " (month) }
            p.big {
                (credits(spent))
                @if let Some(allowance) = workspace.monthly_credits { " of " (credits(allowance)) }
                " credits spent"
            }
            @if let Some(allowance) = workspace.monthly_credits {
                @let percent = (spent.micros().max(0) as f64 * 100.0
                    / allowance.micros().max(1) as f64).min(100.0) as u32;
                progress value=(percent) max="100" aria-label="Share of the monthly credits spent" { (percent) "%" }
            }
        }
        section aria-labelledby="projects-heading" {
            h2 #projects-heading { "Spend by project this month" }
            @if projects.is_empty() { p { "No project has spent anything this month." } }
            div.table { table {
                thead { tr { th { "Project" } th { "Credits" } } }
                tbody { @for (name, micros) in &projects { tr {
                    td { code { (name) } } td { (credits(Credits::from_micros(**micros))) }
                } } }
            } }
        }
        section aria-labelledby="near-heading" {
            h2 #near-heading { "Keys near their budget" }
            @if near.is_empty() { p { "No key has spent 80% of its budget." } }
            ul { @for (k, spent, budget) in &near {
                li { a href={ (PREFIX) "/w/" (ws) "/keys/" (k.id) } { (k.prefix) "…" (k.last4) }
                     " " (credits(*spent)) " of " (credits(*budget)) }
            } }
        }
        section aria-labelledby="paused-heading" {
            h2 #paused-heading { "Paused endpoints" }
            @if paused.is_empty() { p { "None." } }
            ul { @for e in &paused {
                li { a.url href={ (PREFIX) "/w/" (ws) "/webhooks/" (e.id) } { (e.url) } }
            } }
        }
    };
    Ok(html(workspace_page(
        "Overview",
        &signed,
        &workspace,
        Section::Overview,
        body,
    )))
}
