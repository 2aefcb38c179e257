//! Answers the gateway gives itself: health probes, CORS preflights and the simulated
//! backend.

use compact_str::CompactString;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use tower::ServiceExt;

use super::routes::Route;
use super::ACCESS_CONTROL_REQUEST_METHOD;
use super::{body, cors, respond, simulate, Admission, Gateway, RequestCtx};
use crate::error::ApiError;
use crate::keys::format::redact;
use crate::keys::Environment;
use crate::metering::Credits;

/// Largest request body the dashboard is handed (its forms are small).
const DASHBOARD_BODY_LIMIT: usize = 64 * 1024;
/// Largest answer of the dashboard written back (its pages are small).
const DASHBOARD_ANSWER_LIMIT: usize = 8 * 1024 * 1024;

impl Gateway {
    /// A CORS preflight from an allowed origin for a route that exists: `204` with what the
    /// browser may send. Answered before authentication: browsers send no credentials here.
    pub(super) async fn answer_preflight(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Admission, ApiError> {
        if ctx.cors_origin.is_none() {
            return Err(ApiError::Permission("this origin is not allowed".into()));
        }
        let req = session.req_header();
        let method = req
            .headers
            .get(ACCESS_CONTROL_REQUEST_METHOD)
            .and_then(|m| http::Method::from_bytes(m.as_bytes()).ok())
            .ok_or_else(|| ApiError::invalid("Access-Control-Request-Method is not a method"))?;
        let path = req.uri.path();
        if self.routes.find_id(&method, path).is_none() {
            return Err(ApiError::not_found(format!(
                "no route for {method} {}",
                redact(path)
            )));
        }
        let mut headers = ctx.answer_headers();
        headers.extend([
            ("Access-Control-Allow-Methods", method.to_string()),
            (
                "Access-Control-Allow-Headers",
                cors::ALLOW_HEADERS.to_string(),
            ),
            ("Access-Control-Max-Age", cors::MAX_AGE.to_string()),
        ]);
        respond::no_content(session, &ctx.request_id, &headers)
            .await
            .map_err(|_| ApiError::Upstream("could not write the response".into()))?;
        Ok(Admission::Answer)
    }

    /// The built-in simulated backend's answer, charged at the route's price (test keys are
    /// free).
    pub(super) async fn answer_simulated(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        route: &Route,
    ) -> Result<(), ApiError> {
        let Some(caller) = ctx.caller.as_ref() else {
            return Err(ApiError::Authentication("no key".into()));
        };
        let environment = caller.key.effective_environment();
        let workspace = caller.key.workspace.clone();
        let (summary, raw) = simulate::read_request(session)
            .await
            .map_err(|_| ApiError::invalid("could not read the request body"))?;
        if let Some(raw) = &raw {
            self.scan_body(session, ctx, raw);
        }
        let path = session.req_header().uri.path();
        let job = self
            .jobs
            .answer(route, &workspace, environment, raw.as_deref(), path)
            .await?;
        let body = match job {
            Some(view) => simulate::labelled(view, environment),
            None => simulate::response_body(route, environment, &summary, path),
        };
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let price = match environment {
            Environment::Test => Credits::ZERO,
            _ => route.price_for(&session.req_header().method),
        };
        ctx.billable = true;
        ctx.reported_credits = Some(price);
        // Test keys are free and reach the simulator: the audit keeps what it keeps of any model.
        ctx.model = summary
            .model
            .map(|m| body::truncate_chars(CompactString::from(m), body::MODEL_CHARS));
        let mut extra = ctx.answer_headers();
        extra.push(("Service-Credits", price.to_string()));
        respond::json(session, 200, body, &ctx.request_id, &extra)
            .await
            .map_err(|_| ApiError::Upstream("could not write the response".into()))
    }

    /// A request under `/dashboard/`: handed whole (its body read, bounded) to the dashboard's
    /// router, with the client's address and whether it came over TLS, and its answer written
    /// back.
    pub(super) async fn answer_dashboard(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        router: &axum::Router,
    ) -> Result<Admission, ApiError> {
        let body = body::read_bounded(session, DASHBOARD_BODY_LIMIT)
            .await
            .map_err(|_| ApiError::invalid("could not read the request body"))?
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "the body must be at most {DASHBOARD_BODY_LIMIT} bytes"
                ))
            })?;
        let header = session.req_header();
        let mut request = http::Request::new(axum::body::Body::from(body));
        *request.method_mut() = header.method.clone();
        *request.uri_mut() = header.uri.clone();
        *request.headers_mut() = header.headers.clone();
        let peer = super::peer_ip(session).unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
        let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        let client = self
            .trusted_proxies
            .client_address(peer, &header.headers, tls);
        request.extensions_mut().insert(client);
        let answer = match router.clone().oneshot(request).await {
            Ok(answer) => answer,
            Err(never) => match never {},
        };
        let (parts, body) = answer.into_parts();
        let body = axum::body::to_bytes(body, DASHBOARD_ANSWER_LIMIT)
            .await
            .map_err(|_| ApiError::Upstream("the dashboard's answer is too large".into()))?;
        let write = async {
            let mut resp = ResponseHeader::build_no_case(
                parts.status.as_u16(),
                Some(parts.headers.len() + 2),
            )?;
            for (name, value) in &parts.headers {
                resp.append_header(name.clone(), value.clone())?;
            }
            resp.insert_header(http::header::CONTENT_LENGTH, body.len())?;
            resp.insert_header(&respond::REQUEST_ID, ctx.request_id.as_str())?;
            session.write_response_header(Box::new(resp), false).await?;
            session.write_response_body(Some(body), true).await
        };
        write
            .await
            .map_err(|_| ApiError::Upstream("could not write the response".into()))?;
        Ok(Admission::Answer)
    }

    /// Paths outside `/v1`: health probes, else 404.
    pub(super) async fn answer_unversioned(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Admission, ApiError> {
        let path = session.req_header().uri.path();
        ctx.probe = matches!(path, "/healthz" | "/readyz");
        let (status, body) = match path {
            "/healthz" => (200, br#"{"status":"ok"}"#.to_vec()),
            // Ready while it can check keys: the store answers, or it is away but the key
            // cache is still within `cache_staleness_seconds` (cached keys are served; taking
            // every replica out of its Service over a short Redis outage would refuse them
            // all). The admin port's `/readyz` stays the strict check: the store answers.
            "/readyz" if self.draining.is_draining() => {
                return Err(ApiError::ServiceUnavailable("shutting down".into()))
            }
            "/readyz" => match self
                .store_check
                .store_answers(&*self.store.health, ctx.arrived_ms)
                .await
            {
                true => (200, br#"{"status":"ready"}"#.to_vec()),
                false if self.auth.keys_are_fresh() => (
                    200,
                    br#"{"status":"degraded","store":"unreachable"}"#.to_vec(),
                ),
                false => return Err(ApiError::ServiceUnavailable("store unreachable".into())),
            },
            _ => return Err(ApiError::not_found("only /v1 paths are served here")),
        };
        respond::json(session, status, body, &ctx.request_id, &[])
            .await
            .map_err(|_| ApiError::Upstream("could not write the response".into()))?;
        Ok(Admission::Answer)
    }
}
