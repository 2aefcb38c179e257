//! Answers the gateway gives itself: health probes, CORS preflights and the simulated
//! backend.

use compact_str::CompactString;
use pingora::proxy::Session;

use super::routes::Route;
use super::ACCESS_CONTROL_REQUEST_METHOD;
use super::{body, cors, respond, simulate, Admission, Gateway, RequestCtx};
use crate::error::ApiError;
use crate::keys::format::redact;
use crate::keys::Environment;
use crate::metering::Credits;

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
