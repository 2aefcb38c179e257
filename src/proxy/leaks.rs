//! The request path's scanners: a live key sent by a web page, and a key in the part of a
//! request body the gateway reads anyway. Both only hand what they found to the scanners
//! ([`crate::scanners`]) on a task of its own: the request waits for no store write.

use pingora::proxy::Session;
use std::sync::Arc;

use super::auth::{authorization, bearer_token};
use super::{body, peer_ip, Gateway, RequestCtx};
use crate::keys::format::{find_keys, redact};
use crate::metrics;
use crate::scanners::leak::FoundToken;
use crate::scanners::{FoundKeyAction, Scanners, Sighting};

impl Gateway {
    /// A live key came from a web page: the request is refused (the caller's 403), and the
    /// key is revoked or reported as `[scanners] live_key_in_browser` says.
    pub(super) fn live_key_in_browser(&self, session: &Session, request_id: &str) {
        let Some(scanners) = &self.scanners else {
            return;
        };
        let action = scanners.config().live_key_in_browser;
        if action == FoundKeyAction::Refuse {
            metrics::record_leak("browser", "refused");
            return;
        }
        let req = session.req_header();
        let Ok(token) = bearer_token(authorization(&req.headers).ok().flatten()) else {
            return;
        };
        let origin = req
            .headers
            .get(http::header::ORIGIN)
            .and_then(|o| o.to_str().ok())
            .map(str::to_owned);
        let seen = self.sighting("browser", session, request_id);
        spawn_found(
            scanners.clone(),
            seen,
            token.to_string(),
            origin,
            action == FoundKeyAction::Revoke,
        );
    }

    /// Scans `chunk`, the next part of a request body, as far as the first
    /// [`body::SNIFF_LIMIT`] bytes of the body go: the part the gateway reads for its `model`.
    /// A key split across two chunks is not seen.
    pub(super) fn scan_body(&self, session: &Session, ctx: &mut RequestCtx, chunk: &[u8]) {
        let Some(scanners) = &self.scanners else {
            return;
        };
        let room = body::SNIFF_LIMIT.saturating_sub(ctx.body_scanned);
        if room == 0 {
            return;
        }
        let part = &chunk[..chunk.len().min(room)];
        ctx.body_scanned += part.len();
        let revoke = scanners.config().key_in_body == FoundKeyAction::Revoke;
        for (token, _) in find_keys(part) {
            let seen = self.sighting("request_body", session, &ctx.request_id);
            spawn_found(scanners.clone(), seen, token.to_string(), None, revoke);
        }
    }

    fn sighting(&self, scanner: &'static str, session: &Session, request_id: &str) -> Sighting {
        let req = session.req_header();
        Sighting {
            scanner,
            request_id: request_id.to_string(),
            method: req.method.to_string(),
            path: redact(req.uri.path()).into_owned(),
            client_ip: self.trusted_proxies.client(peer_ip(session), &req.headers),
        }
    }
}

fn spawn_found(
    scanners: Arc<Scanners>,
    seen: Sighting,
    token: String,
    url: Option<String>,
    revoke: bool,
) {
    tokio::spawn(async move {
        let found = FoundToken {
            token: &token,
            url: url.as_deref(),
            source: Some(seen.scanner),
        };
        if let Err(e) = scanners.found(&seen, found, revoke).await {
            tracing::warn!(error = %e, scanner = seen.scanner, "a found key was not handled");
        }
    });
}
