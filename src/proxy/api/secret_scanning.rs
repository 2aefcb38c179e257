//! `POST /v1/secret-scanning/github`: GitHub's secret-scanning partner alerts, on the gateway
//! listener and without a key; GitHub's signature is the credential
//! ([`crate::scanners::github`]).

use pingora::proxy::Session;

use crate::error::ApiError;
use crate::keys::format::redact;
use crate::proxy::{body, peer_ip, respond, RequestCtx};
use crate::scanners::{Scanners, Sighting, MAX_ALERT_BYTES};

/// Where GitHub sends alerts.
pub const PATH: &str = "/v1/secret-scanning/github";

/// Reads an alert, has the scanners check and handle it, and answers in GitHub's format.
pub(crate) async fn answer(
    session: &mut Session,
    scanners: &Scanners,
    client_ip: Option<std::net::IpAddr>,
    ctx: &RequestCtx,
) -> Result<(), ApiError> {
    if session.req_header().method != http::Method::POST {
        return Err(ApiError::MethodNotAllowed(
            format!("{PATH} takes POST").into(),
        ));
    }
    let header = |name: &str| {
        session
            .req_header()
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let identifier = header("github-public-key-identifier");
    let signature = header("github-public-key-signature");
    let alert = body::read_bounded(session, MAX_ALERT_BYTES)
        .await
        .map_err(|_| ApiError::invalid("could not read the request body"))?
        .ok_or_else(|| ApiError::invalid(format!("an alert is at most {MAX_ALERT_BYTES} bytes")))?;
    let seen = Sighting {
        scanner: "github",
        request_id: ctx.request_id.to_string(),
        method: "POST".into(),
        path: redact(PATH).into_owned(),
        client_ip: client_ip.or_else(|| peer_ip(session)),
    };
    let answer = scanners
        .github_alert(identifier.as_deref(), signature.as_deref(), &alert, &seen)
        .await?;
    respond::json(session, 200, answer, &ctx.request_id, &ctx.answer_headers())
        .await
        .map_err(|_| ApiError::Upstream("could not write the response".into()))
}
