//! The audit log of a workspace: requests and dashboard actions, filtered by key, project,
//! status and time range, a page at a time, or as CSV.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use maud::html;
use serde::Deserialize;

use super::{when, workspace_page, Section};
use crate::dashboard::signin::require_workspace;
use crate::dashboard::web::{html, Ctx, PageError};
use crate::dashboard::{Dashboard, PREFIX};
use crate::metering::audit::{AuditCursor, AuditQuery, AuditRecord};

/// Records on a page.
const PAGE: usize = 50;
/// Most records in one CSV export.
const CSV_MOST: usize = 10_000;
/// Records read from the store at a time while filtering.
const READ_STEP: usize = 500;
/// Most reads for one page or export: a filter that matches little stops there.
const MOST_READS: usize = 40;

/// The filter of the audit page, as its form sends it (blank fields are no filter).
#[derive(Deserialize, Default)]
pub struct AuditFilter {
    #[serde(default)]
    key_id: String,
    #[serde(default)]
    project: String,
    /// A status (`402`) or a class (`4xx`).
    #[serde(default)]
    status: String,
    /// A day (`YYYY-MM-DD`, UTC): records from its start.
    #[serde(default)]
    from: String,
    /// A day (`YYYY-MM-DD`, UTC): records to its end.
    #[serde(default)]
    to: String,
    /// Where the page starts: the previous page's `next`.
    #[serde(default)]
    cursor: String,
    /// `csv` for the export.
    #[serde(default)]
    format: String,
}

/// Unix seconds at the start of `day` (`YYYY-MM-DD`).
fn day_start(day: &str) -> Result<Option<u64>, PageError> {
    if day.trim().is_empty() {
        return Ok(None);
    }
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(day.trim(), format)
        .ok()
        .and_then(|d| u64::try_from(d.midnight().assume_utc().unix_timestamp()).ok())
        .map(Some)
        .ok_or_else(|| PageError::bad_request("Dates are written 2026-12-31."))
}

/// Whether `status` passes the filter `wanted` (`402`, `4xx`, or blank).
fn status_matches(wanted: &str, status: u16) -> bool {
    let wanted = wanted.trim();
    match wanted.as_bytes() {
        [] => true,
        [class, b'x', b'x'] | [class, b'X', b'X'] => status / 100 == u16::from(class - b'0'),
        _ => wanted.parse::<u16>().is_ok_and(|s| s == status),
    }
}

/// The records passing `filter`, newest first, at most `most`; and the cursor after the last
/// one when more may follow.
async fn matching(
    d: &Dashboard,
    ws: &str,
    filter: &AuditFilter,
    most: usize,
) -> Result<(Vec<AuditRecord>, Option<String>), PageError> {
    let since = day_start(&filter.from)?;
    let until_ms = day_start(&filter.to)?.map(|t| (t + 86_400) * 1000);
    let mut cursor = match filter.cursor.trim() {
        "" => None,
        text => Some(
            text.parse::<AuditCursor>()
                .map_err(|()| PageError::bad_request("That page is not there any more."))?,
        ),
    };
    let blank = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
    let mut found = Vec::new();
    for _ in 0..MOST_READS {
        let read = d
            .stores()
            .audit
            .audit(&AuditQuery {
                workspace: ws.to_string(),
                key_id: blank(&filter.key_id),
                project: blank(&filter.project),
                since,
                cursor: cursor.take(),
                limit: READ_STEP,
                resume: None,
                actions: None,
            })
            .await?;
        let exhausted = read.len() < READ_STEP;
        let last = read.last().map(AuditCursor::after);
        for record in read {
            if until_ms.is_some_and(|u| record.time_ms >= u)
                || !status_matches(&filter.status, record.status)
            {
                continue;
            }
            found.push(record);
            if found.len() == most {
                let next = found.last().map(|r| AuditCursor::after(r).to_string());
                return Ok((found, next));
            }
        }
        if exhausted {
            return Ok((found, None));
        }
        cursor = last;
    }
    let next = found.last().map(|r| AuditCursor::after(r).to_string());
    Ok((found, next))
}

/// `GET /dashboard/w/{ws}/audit`: the filter form and a page of records; with
/// `format=csv`, every matching record (up to [`CSV_MOST`]) as CSV.
pub async fn show(
    State(d): State<Dashboard>,
    Path(ws): Path<String>,
    Query(filter): Query<AuditFilter>,
    ctx: Ctx,
) -> Result<Response, PageError> {
    let (signed, workspace) = require_workspace(&d, &ctx, &ws).await?;
    if filter.format == "csv" {
        let (records, _) = matching(&d, &ws, &filter, CSV_MOST).await?;
        return Ok((
            [
                (CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
                (
                    CONTENT_DISPOSITION,
                    format!("attachment; filename=\"audit-{ws}.csv\""),
                ),
            ],
            csv(&records),
        )
            .into_response());
    }
    let (records, next) = matching(&d, &ws, &filter, PAGE).await?;
    let base = format!("{PREFIX}/w/{ws}/audit");
    let query = |cursor: &str, format: &str| {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("key_id", &filter.key_id),
            ("project", &filter.project),
            ("status", &filter.status),
            ("from", &filter.from),
            ("to", &filter.to),
        ] {
            if !v.trim().is_empty() {
                q.append_pair(k, v.trim());
            }
        }
        if !cursor.is_empty() {
            q.append_pair("cursor", cursor);
        }
        if !format.is_empty() {
            q.append_pair("format", format);
        }
        format!("{base}?{}", q.finish())
    };
    let body = html! {
        form.filters method="get" action=(base) {
            div { label for="key_id" { "Key id" } input #key_id type="text" name="key_id" value=(filter.key_id); }
            div { label for="project" { "Project" } input #project type="text" name="project" value=(filter.project); }
            div { label for="status" { "Status (402 or 4xx)" } input #status type="text" name="status" value=(filter.status); }
            div { label for="from" { "From (day)" } input #from type="date" name="from" value=(filter.from); }
            div { label for="to" { "To (day)" } input #to type="date" name="to" value=(filter.to); }
            div { button type="submit" { "Filter" } }
        }
        p { a href=(query("", "csv")) { "Export as CSV" } }
        @if records.is_empty() { p { "No records." } }
        div.table { table {
            thead { tr {
                th { "Time" } th { "Who" } th { "Key" } th { "Project" } th { "Request" }
                th { "Status" } th { "Credits" } th { "Client" }
            } }
            tbody { @for r in &records { tr {
                td { (when(r.time_ms / 1000)) }
                td { (r.actor.as_deref().unwrap_or("key")) }
                td { code { (r.key_id) } }
                td { (r.project.as_deref().unwrap_or("")) }
                td { code { (r.method) " " (r.path) } }
                td { (r.status) }
                td { (r.credits) }
                td { @if let Some(ip) = r.client_ip { (ip) } }
            } } }
        } }
        @if let Some(next) = &next {
            p { a href=(query(next, "")) { "Older records" } }
        }
    };
    Ok(html(workspace_page(
        "Audit log",
        &signed,
        &workspace,
        Section::Audit,
        body,
    )))
}

/// `records` as CSV, a header line first.
fn csv(records: &[AuditRecord]) -> String {
    let mut out = String::from(
        "time_ms,request_id,actor,key_id,key,environment,project,method,path,model,status,credits,client_ip,latency_ms\n",
    );
    for r in records {
        let fields = [
            r.time_ms.to_string(),
            r.request_id.to_string(),
            r.actor.clone().unwrap_or_default(),
            r.key_id.to_string(),
            r.key.to_string(),
            r.environment.as_str().to_string(),
            r.project.clone().unwrap_or_default(),
            r.method.to_string(),
            r.path.to_string(),
            r.model.as_deref().unwrap_or_default().to_string(),
            r.status.to_string(),
            r.credits.to_string(),
            r.client_ip.map(|ip| ip.to_string()).unwrap_or_default(),
            r.latency_ms.to_string(),
        ];
        let line: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}

/// One CSV field: quoted when it holds a comma, quote or line break; a leading `=`, `+`, `-`
/// or `@` is prefixed with `'` so a spreadsheet does not run it as a formula.
fn csv_field(value: &str) -> String {
    let value = match value.starts_with(['=', '+', '-', '@']) {
        true => format!("'{value}"),
        false => value.to_string(),
    };
    match value.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", value.replace('"', "\"\"")),
        false => value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_match_by_code_or_class() {
        assert!(status_matches("", 200));
        assert!(status_matches("4xx", 402));
        assert!(!status_matches("4xx", 502));
        assert!(status_matches("402", 402));
        assert!(!status_matches("402", 403));
        assert!(!status_matches("nonsense", 200));
    }

    #[test]
    fn csv_fields_are_quoted_and_defused() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=cmd()"), "'=cmd()");
    }

    #[test]
    fn days_are_utc_midnights() {
        assert_eq!(day_start("1970-01-02").unwrap(), Some(86_400));
        assert_eq!(day_start("").unwrap(), None);
        assert!(day_start("02/01/1970").is_err());
    }
}
