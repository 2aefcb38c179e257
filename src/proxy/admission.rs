//! Admission: who is calling, on which route, and whether policy, the rate limit and the
//! budget let the request through; then which handler takes it.

use pingora::prelude::*;
use pingora::proxy::Session;

use super::auth::{self, Authenticated};
use super::routes::{Handler, Route, RouteId};
use super::upstream::Target;
use super::{
    api, framing, hygiene, listen, peer_ip, policy, tokens, webhooks, Admission, Gateway,
    RequestCtx,
};
use super::{ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, SERVICE_PROJECT};
use crate::error::ApiError;
use crate::keys::format::redact;
use crate::keys::Environment;
use crate::scanners::browser;

impl Gateway {
    pub(super) async fn admit(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Admission, ApiError> {
        // Every request's future is allocated and moved whole by `async_trait`, so the
        // handlers the gateway answers itself, whose futures are large, are boxed where they
        // are taken: a forwarded request does not carry their state.
        if session.req_header().method == http::Method::CONNECT {
            // Pingora hands CONNECT over only so that it gets the gateway's 405; it is never
            // forwarded, and the connection closes after (its framing is not HTTP's).
            session.set_keepalive(None);
            return Err(ApiError::MethodNotAllowed(
                "CONNECT is not served here".into(),
            ));
        }
        if let Err(refused) = framing::check(session.req_header()) {
            // Where this request's body ends is in doubt, and so where the next one starts.
            session.set_keepalive(None);
            return Err(refused);
        }
        if let Some(dashboard) = &self.dashboard {
            if crate::dashboard::is_dashboard_path(session.req_header().uri.path()) {
                return Box::pin(self.answer_dashboard(session, ctx, dashboard)).await;
            }
        }
        if !session.req_header().uri.path().starts_with("/v1/") {
            return Box::pin(self.answer_unversioned(session, ctx)).await;
        }
        if self.cors.is_enabled() {
            let req = session.req_header();
            ctx.cors_origin = req.headers.get(ORIGIN).and_then(|o| self.cors.allow(o));
            if req.method == http::Method::OPTIONS
                && req.headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD)
            {
                return Box::pin(self.answer_preflight(session, ctx)).await;
            }
        }
        if api::openapi::is_document(session.req_header().uri.path()) {
            Box::pin(api::openapi::answer(session, &self.openapi, ctx)).await?;
            return Ok(Admission::Answer);
        }
        if session.req_header().uri.path() == api::secret_scanning::PATH {
            if let Some(scanners) = &self.scanners {
                let client = self
                    .trusted_proxies
                    .client(peer_ip(session), &session.req_header().headers);
                Box::pin(api::secret_scanning::answer(session, scanners, client, ctx)).await?;
                return Ok(Admission::Answer);
            }
        }
        let route = self.authorize(session, ctx).await?;
        match route.handler {
            Handler::MintToken => {
                let caller = ctx.caller.as_ref().expect("authorized");
                // Every token the key mints is held in the store until an hour after it
                // expires: the mint rate bounds what one key can make the store hold.
                self.meter.admit_mint(&caller.key, ctx.arrived_ms)?;
                let store = self.store.keys.as_ref();
                let headers = ctx.answer_headers();
                Box::pin(tokens::mint(
                    session,
                    caller,
                    store,
                    self.meter.token_metadata_bytes(),
                    &ctx.request_id,
                    &headers,
                ))
                .await?;
                Ok(Admission::Answer)
            }
            Handler::Webhooks(op) => {
                let caller = ctx.caller.as_ref().expect("authorized");
                let (store, insecure) =
                    (self.store.deliveries.as_ref(), self.allow_insecure_targets);
                let headers = ctx.answer_headers();
                Box::pin(webhooks::handle(
                    session,
                    op,
                    caller,
                    store,
                    insecure,
                    &ctx.request_id,
                    &headers,
                ))
                .await?;
                Ok(Admission::Answer)
            }
            Handler::Listen => {
                let caller = ctx.caller.as_ref().expect("authorized");
                let key_id = caller.key.billed_key_id();
                let _slot = self.listen_streams.open(key_id)?;
                let listening = listen::Listening::open(
                    self.store.listen.clone(),
                    &self.listen_hub,
                    caller,
                    &ctx.request_id,
                    session.req_header().uri.query(),
                )
                .await?;
                let headers = ctx.answer_headers();
                Box::pin(listen::stream(
                    session,
                    &self.auth,
                    route,
                    listening,
                    &ctx.request_id,
                    &headers,
                ))
                .await?;
                Ok(Admission::Answer)
            }
            Handler::Forward if ctx.target == Target::Simulated => {
                Box::pin(self.answer_simulated(session, ctx, route)).await?;
                Ok(Admission::Answer)
            }
            Handler::Forward => Ok(Admission::Forward),
        }
    }

    /// Who is calling, on which route, and whether policy lets them: auth (401) → route
    /// (404) → scope (403) → project (400) → rate limit (429) → budget (402). A refused request
    /// of an authenticated key counts against its rate limit too (it is audited, and costs
    /// that): past the limit, it is a 429 whatever the refusal.
    async fn authorize(&self, session: &Session, ctx: &mut RequestCtx) -> Result<&Route, ApiError> {
        let req = session.req_header();
        let path = req.uri.path();
        // Matched first so a refused request is counted under its route; still answered 401
        // before 404, so an unauthenticated caller learns nothing of the route table.
        ctx.route = self.routes.find_id(&req.method, path);
        let header = auth::authorization(&req.headers)
            .inspect_err(|f| ctx.auth_failure = Some(f.reason()))?;
        let client = || {
            self.trusted_proxies
                .client_to_limit(peer_ip(session), &req.headers)
        };
        let caller = match self
            .auth
            .authenticate_or_name(header, ctx.arrived_ms / 1000, client)
            .await
        {
            Ok(caller) => caller,
            Err((failure, key)) => {
                ctx.auth_failure = Some(failure.reason());
                // A refused credential that exists counts against its key's rate limit, like
                // any request of the key: past it, the answer is a 429. (Its audit records are
                // bounded apart, per key and second: `Meter::finish_refused`.)
                if let Some(key) = &key {
                    let (decision, verdict) = self
                        .meter
                        .admit(
                            key,
                            key.rate_limit_override(),
                            None,
                            None,
                            false,
                            crate::metering::Credits::ZERO,
                            ctx.arrived_ms,
                        )
                        .await;
                    if !decision.allowed {
                        ctx.refused_key = Some(key.clone());
                        verdict?;
                    }
                }
                ctx.refused_key = key;
                return Err(failure.into());
            }
        };
        // Known before the route: an authenticated request is audited whatever its answer.
        let caller = ctx.caller.insert(caller);
        let found = hygiene::scan(&req.headers);
        ctx.gateway_names = found.gateway_names;
        // A scoped token is what a page should send; a live key never.
        let live_in_page = caller.key.environment == Environment::Live
            && (ctx.cors_origin.is_some() || browser::from_web_page(&req.headers));
        let checked = self.check_request(req, caller, ctx.route, found, live_in_page);
        if live_in_page {
            self.live_key_in_browser(session, &ctx.request_id);
        }
        let (project, billable, reserve) = match &checked {
            Ok((route, project)) => (
                *project,
                route.handler == Handler::Forward,
                route.reserve_for(&req.method),
            ),
            Err(_) => (None, false, crate::metering::Credits::ZERO),
        };
        ctx.project = project.map(str::to_owned);
        let (decision, verdict) = self
            .meter
            .admit(
                &caller.key,
                caller.billed().rate_limit_override(),
                caller.monthly_budget(),
                project,
                billable,
                reserve,
                ctx.arrived_ms,
            )
            .await;
        ctx.rate = Some(decision);
        let route = match (checked, verdict) {
            (_, Err(limited)) if !decision.allowed => return Err(limited),
            (Err(refused), _) => return Err(refused),
            (Ok((route, _)), verdict) => {
                ctx.reservation = verdict?;
                route
            }
        };
        ctx.target = self.upstreams.target(caller.key.effective_environment());
        Ok(route)
    }

    /// What an authenticated caller asks for, if the gateway serves it and lets them: the route
    /// (404), its headers (a method override, or an upgrade the route does not take: 400), its
    /// scope (403), the project (400); a live key from a web page is refused (403).
    fn check_request<'a>(
        &self,
        req: &'a RequestHeader,
        caller: &Authenticated,
        route: Option<RouteId>,
        found: hygiene::Findings,
        from_browser: bool,
    ) -> Result<(&Route, Option<&'a str>), ApiError> {
        if from_browser && caller.key.environment == Environment::Live {
            return Err(ApiError::Permission(
                "a live key must not be used from a browser or web page; keep it on your \
                 server, and have your backend mint a scoped token (POST /v1/tokens) for the page"
                    .into(),
            ));
        }
        let id = route.ok_or_else(|| {
            ApiError::not_found(format!(
                "no route for {} {}",
                req.method,
                redact(req.uri.path())
            ))
        })?;
        let route = self.routes.get(id);
        if found.method_override {
            return Err(ApiError::invalid(
                "method-override headers (X-HTTP-Method-Override, X-HTTP-Method, \
                 X-Method-Override) are not allowed; send the method itself",
            ));
        }
        if found.upgrade && !route.upgrade {
            return Err(ApiError::invalid("upgrades are not allowed on this route"));
        }
        policy::check_scope(caller, route)?;
        let project = policy::check_project(req.headers.get_all(&SERVICE_PROJECT))?;
        Ok((route, project))
    }
}
