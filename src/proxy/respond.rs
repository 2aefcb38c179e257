//! Answers the gateway writes itself: errors, probes and simulated responses.
//!
//! Unlike Pingora's `respond_error`, these keep the client connection alive when the unread
//! request body is small enough to drain.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::HeaderName;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use std::time::Duration;

use crate::error::ApiError;

/// Name of the request-id header on every response.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("service-request-id");

/// Largest unread request body drained so the connection can be reused after an early answer.
const DRAIN_LIMIT: usize = 64 * 1024;
/// Longest wait for that body; a client slower than this loses the connection instead.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes a complete JSON response.
pub async fn json(
    session: &mut Session,
    status: u16,
    body: Vec<u8>,
    request_id: &str,
    extra: &[(&'static str, String)],
) -> pingora::Result<()> {
    if session.response_written().is_some() {
        // Headers already went out (e.g. a failure mid-body): nothing valid can follow.
        return Ok(());
    }
    // Names written as on proxied responses: standard ones capitalized, others lower case.
    let mut resp = ResponseHeader::build_no_case(status, Some(4 + extra.len()))?;
    resp.insert_header(CONTENT_TYPE, "application/json")?;
    resp.insert_header(CONTENT_LENGTH, body.len())?;
    resp.insert_header(&REQUEST_ID, request_id)?;
    for (name, value) in extra {
        resp.insert_header(*name, value.as_str())?;
    }
    keep_alive_if_cheap(session);
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await
}

/// Writes a `204` with no body (a CORS preflight's answer).
pub async fn no_content(
    session: &mut Session,
    request_id: &str,
    extra: &[(&'static str, String)],
) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build_no_case(204, Some(1 + extra.len()))?;
    resp.insert_header(&REQUEST_ID, request_id)?;
    for (name, value) in extra {
        resp.insert_header(*name, value.as_str())?;
    }
    keep_alive_if_cheap(session);
    session.write_response_header(Box::new(resp), true).await
}

/// Writes `err` with the gateway's error body.
pub async fn error(
    session: &mut Session,
    err: &ApiError,
    request_id: &str,
    extra: &[(&'static str, String)],
) -> pingora::Result<()> {
    let mut headers = extra.to_vec();
    if let Some(secs) = err.retry_after() {
        headers.push(("Retry-After", secs.to_string()));
    }
    if let Some(challenge) = err.challenge() {
        headers.push(("WWW-Authenticate", challenge.to_string()));
    }
    json(
        session,
        err.status(),
        err.body(request_id),
        request_id,
        &headers,
    )
    .await
}

/// Pingora drains the unread request body before reusing a connection. Allow that only for a
/// small, declared body; a large or chunked one closes the connection instead.
fn keep_alive_if_cheap(session: &mut Session) {
    // Already closing (HTTP/1.0, `Connection: close`, or a failed proxy attempt): stay closed.
    if session.get_keepalive().is_none() || session.is_body_done() {
        return;
    }
    let declared = session
        .req_header()
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let remaining = declared.map(|len| len.saturating_sub(session.body_bytes_read()));
    if matches!(remaining, Some(n) if n <= DRAIN_LIMIT) {
        session.set_close_on_response_before_downstream_finish(false);
        session.set_total_drain_timeout(Some(DRAIN_TIMEOUT));
    } else {
        session.set_keepalive(None);
    }
}
