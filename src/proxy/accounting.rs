//! Accounting, after the response: the request's cost and its audit record.

use compact_str::CompactString;
use pingora::proxy::Session;
use std::time::Duration;

use super::{peer_ip, Gateway, RequestCtx};
use crate::keys::format::redact;
use crate::keys::Environment;
use crate::metering::audit::PendingAudit;
use crate::metering::Credits;

/// The most of a request's path an audit record keeps, in bytes: paths are chosen by the
/// client, refused ones included, and a record must not carry a 60 KB one into the store.
pub const AUDITED_PATH_MAX: usize = 2048;

/// The path as audited: whole, or cut at [`AUDITED_PATH_MAX`] bytes (on a character boundary)
/// and marked with a trailing `…`.
fn audited_path(path: &str) -> CompactString {
    if path.len() <= AUDITED_PATH_MAX {
        return path.into();
    }
    let mut end = AUDITED_PATH_MAX - '…'.len_utf8();
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = CompactString::from(&path[..end]);
    cut.push('…');
    cut
}

impl Gateway {
    /// Charges an authenticated request and writes its audit record; a refused key that
    /// exists is audited too (a leaked key still in use shows who used it, from where).
    pub(super) fn account(
        &self,
        session: &Session,
        ctx: &mut RequestCtx,
        status: u16,
        elapsed: Duration,
    ) {
        // The last phase: the caller's key moves into the audit record instead of being
        // cloned, one count change fewer on a key every core shares.
        let (key, refused) = match (ctx.caller.take(), ctx.refused_key.take()) {
            (Some(caller), _) => (caller.key, false),
            (None, Some(refused)) => (refused, true),
            (None, None) => return,
        };
        // The backend's figure if it gave one; else the route's price for a success or for a
        // request the client abandoned at the backend; nothing for what the gateway refused.
        let cost = match (ctx.billable, ctx.reported_credits, self.route(ctx)) {
            (false, _, _) => Credits::ZERO,
            (true, Some(reported), _) => reported,
            // A tunnel (`101`) is one request: the route's price, once, however long it lasts.
            (true, None, Some(route))
                if (200..300).contains(&status)
                    || status == super::CLIENT_CLOSED
                    || status == 101 =>
            {
                route.price_for(&session.req_header().method)
            }
            _ => Credits::ZERO,
        };
        let cost = match key.effective_environment() {
            Environment::Test => Credits::ZERO,
            _ => cost,
        };
        let req = session.req_header();
        // Only what the request already holds: the writer renders the stored record.
        let record = PendingAudit {
            time_ms: ctx.arrived_ms,
            request_id: std::mem::take(&mut ctx.request_id),
            key,
            project: ctx.project.take(),
            method: req.method.clone(),
            path: audited_path(&redact(req.uri.path())),
            model: ctx.model.take(),
            status,
            credits: cost,
            client_ip: self.trusted_proxies.client(peer_ip(session), &req.headers),
            latency_ms: elapsed.as_millis() as u64,
            suppressed: None,
            tunnel: ctx.tunnel.take().map(|t| t.finish()),
        };
        let reservation = ctx.reservation.take();
        match refused {
            true => self.meter.finish_refused(record),
            false => self.meter.finish(record, reservation),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_path_is_cut_and_marked() {
        assert_eq!(audited_path("/v1/models"), "/v1/models");
        let exact = "a".repeat(AUDITED_PATH_MAX);
        assert_eq!(audited_path(&exact), exact.as_str());
        let long = format!("/v1/{}", "é".repeat(30_000));
        let cut = audited_path(&long);
        assert!(cut.len() <= AUDITED_PATH_MAX, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(long.starts_with(cut.trim_end_matches('…')));
    }
}
