//! The request path, as Pingora phases:
//!
//! `request_filter`: framing → auth → route → policy (scope, project) → rate limit → budget →
//! (answer here, or forward) · `request_body_filter`: the body streams through untouched; its
//! first bytes are kept to find the `model` · `upstream_peer` → `upstream_request_filter`
//! (identity and framing headers) → `response_filter` (request id, rate-limit headers; the
//! backend's `Service-Credits` and `Service-Model`) → `logging` (spend, audit record, metrics).
//!
//! Data flows one way: each phase reads what the previous ones left in [`RequestCtx`].
//!
//! This file holds the context and the phases; admission (`admission.rs`), the answers the
//! gateway gives itself (`local.rs`) and the accounting after the response (`accounting.rs`)
//! are beside it, the hooks into tracing (`traced.rs`), and the gateway's own endpoints under
//! [`api`].

mod accounting;
mod admission;
pub mod api;
pub mod auth;
pub mod body;
pub mod client_ip;
pub mod config;
pub mod cors;
pub mod framing;
pub mod headers;
pub mod hygiene;
pub mod jobs;
mod leaks;
mod local;
pub mod policy;
pub mod readiness;
pub mod respond;
pub mod routes;
pub mod simulate;
mod traced;
pub mod tunnel;
pub mod unknown_keys;
pub mod upstream;

pub use api::{event_hub, listen, tokens, webhooks};

use async_trait::async_trait;
use bytes::Bytes;
use compact_str::CompactString;
use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::ErrorSource;
use std::sync::Arc;
use std::time::Instant;

use crate::error::ApiError;
use crate::ids::{request_id, unix_millis, RequestId};
use crate::keys::cache::KeyCache;
use crate::keys::format::redact;
use crate::keys::{CachedKey, Environment};
use crate::metering::ratelimit::Decision;
use crate::metering::usage::Reservation;
use crate::metering::{Credits, Meter};
use crate::metrics;
use crate::scanners::Scanners;
use crate::shutdown::Draining;
use crate::store::Stores;
use crate::telemetry::{RequestTrace, Tracing};
use auth::{Authenticated, Authenticator};
use client_ip::TrustedProxies;
use cors::Cors;
use http::header::{
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_REQUEST_METHOD,
    ORIGIN, VARY,
};
use routes::{Route, RouteId, RouteTable};
use upstream::{Identity, Target, Upstreams};

// Header names read on every request, parsed once rather than on each lookup.
static SERVICE_PROJECT: http::HeaderName = http::HeaderName::from_static("service-project");
/// Seconds a simulated job takes unless [`Gateway::with_job_seconds`] says otherwise.
const DEFAULT_JOB_SECONDS: u64 = 3;
/// The audited status of a request whose client hung up after it was forwarded.
pub const CLIENT_CLOSED: u16 = 499;

static SERVICE_CREDITS: http::HeaderName = http::HeaderName::from_static("service-credits");
static SERVICE_MODEL: http::HeaderName = http::HeaderName::from_static("service-model");
// Header names written on every proxied answer.
static RATELIMIT_LIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: http::HeaderName = http::HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: http::HeaderName = http::HeaderName::from_static("ratelimit-reset");

/// Per-request state, filled in phase by phase.
pub struct RequestCtx {
    /// `req_…`, on every response and forwarded request.
    pub request_id: RequestId,
    /// A health probe (`/healthz`, `/readyz`): counted under the route `probe`, so a 503
    /// while draining is not a 5xx of the API.
    pub probe: bool,
    /// When the request arrived.
    pub started: Instant,
    /// The authenticated caller, once known.
    pub caller: Option<Authenticated>,
    /// The matched route, once known.
    pub route: Option<RouteId>,
    /// Where the request is answered.
    pub target: Target,
    /// Why authentication failed, for metrics.
    pub auth_failure: Option<&'static str>,
    /// Unix milliseconds at arrival, for the audit record.
    pub arrived_ms: u64,
    /// The rate-limit decision, for the `RateLimit-*` headers.
    pub rate: Option<Decision>,
    /// The validated `Service-Project`.
    pub project: Option<String>,
    /// Whether the request reached a backend (real or simulated): only those are charged.
    pub billable: bool,
    /// Whether the whole request body went on to the backend (a client that hangs up after
    /// it is charged; one whose body stopped short is answered 400).
    pub body_sent: bool,
    /// The cost the backend reported in `Service-Credits`.
    pub reported_credits: Option<Credits>,
    /// The request's `model`, from the body or the backend's `Service-Model`.
    pub model: Option<CompactString>,
    /// The first bytes of a forwarded body, to find its `model`.
    body_prefix: Vec<u8>,
    /// When the request went to the backend.
    upstream_sent: Option<Instant>,
    /// `Access-Control-Allow-Origin` for a request from an allowed browser origin.
    cors_origin: Option<HeaderValue>,
    /// A key that exists but was refused (revoked, past grace, expired): audited, not served.
    refused_key: Option<Arc<CachedKey>>,
    /// Header values for a forwarded request's answer, made with its identity's.
    answer_values: Option<AnswerValues>,
    /// Whether the client sent headers of the gateway's namespace, dropped before forwarding.
    gateway_names: bool,
    /// The tunnel an upgrade opened, once the backend answered `101`.
    tunnel: Option<tunnel::TunnelMeter>,
    /// The request's spans, when tracing is on.
    trace: Option<Box<RequestTrace>>,
    /// What the request reserved against its budgets' leases, settled when it finishes.
    reservation: Option<Reservation>,
    /// Bytes of the request body scanned for keys so far.
    body_scanned: usize,
}

/// A forwarded request's answer's header values, made with the request's identity header
/// values in one allocation ([`headers::joint_values`]): its id, and `RateLimit-Limit` and
/// `RateLimit-Remaining` (empty, and not sent, while the rate limit has not decided).
struct AnswerValues {
    request_id: HeaderValue,
    limit: HeaderValue,
    remaining: HeaderValue,
}

impl RequestCtx {
    /// Headers on every answer the gateway makes itself: `RateLimit-*` for the caller's key
    /// once decided, and CORS for an allowed browser origin.
    fn answer_headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        if let Some(d) = &self.rate {
            headers.extend([
                ("RateLimit-Limit", d.limit.to_string()),
                ("RateLimit-Remaining", d.remaining.to_string()),
                ("RateLimit-Reset", d.reset_secs.to_string()),
            ]);
        }
        if let Some(origin) = self.cors_origin.as_ref().and_then(|o| o.to_str().ok()) {
            headers.extend([
                ("Access-Control-Allow-Origin", origin.to_string()),
                (
                    "Access-Control-Expose-Headers",
                    cors::EXPOSE_HEADERS.to_string(),
                ),
                ("Vary", "Origin".to_string()),
            ]);
        }
        headers
    }
}

/// The gateway: everything the request path needs, built once at start-up.
pub struct Gateway {
    auth: Authenticator,
    routes: RouteTable,
    upstreams: Upstreams,
    meter: Arc<Meter>,
    store: Stores,
    /// Whether webhook endpoints may be `http://` or internal (development and tests).
    allow_insecure_targets: bool,
    /// Whether the key's metadata goes to the backend (`Service-Key-Metadata`).
    forward_key_metadata: bool,
    /// How long an idle client connection stays open between requests.
    keepalive_secs: u64,
    /// Set on SIGTERM: not ready, and every connection closes after its response.
    draining: Draining,
    /// Browser origins let in.
    cors: Cors,
    /// Proxies whose `X-Forwarded-For` names the client.
    trusted_proxies: TrustedProxies,
    /// The `svcgate listen` streams open here.
    listen_streams: listen::OpenStreams,
    /// Their reader of the event log.
    listen_hub: Arc<event_hub::EventHub>,
    /// The store's last answer to `/readyz`.
    store_check: readiness::StoreCheck,
    /// `GET /v1/openapi.json`, serialized at start from the route table.
    openapi: bytes::Bytes,
    /// The tracer, when `[tracing] otlp_endpoint` is set.
    tracing: Option<Tracing>,
    /// What finds keys where they must not be, and GitHub's alerts.
    scanners: Option<Arc<Scanners>>,
    /// The simulator's async jobs.
    jobs: jobs::SimulatedJobs,
    /// The workspace dashboard, which answers everything under `/dashboard/`.
    dashboard: Option<axum::Router>,
}

/// What `request_filter` decided.
enum Admission {
    /// Send to the backend.
    Forward,
    /// Answered by the gateway itself (probe or simulated backend).
    Answer,
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora keeps the context in the request's future, which it moves whole several
    /// times a request; a pointer moves instead of the context's ~300 bytes. 1,300 instructions
    /// a request fewer, for one allocation (`benches/instructions.sh`).
    type CTX = Box<RequestCtx>;

    /// No downstream modules. Pingora adds its response compression by default, disabled; the
    /// gateway never compresses (a backend's body goes out as it came), and the disabled module
    /// still cost about 1,400 instructions a request (its context, two header filters, a body
    /// filter).
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    fn new_ctx(&self) -> Box<RequestCtx> {
        Box::new(RequestCtx {
            request_id: request_id(),
            probe: false,
            started: Instant::now(),
            caller: None,
            route: None,
            target: Target::Simulated,
            auth_failure: None,
            arrived_ms: unix_millis(),
            rate: None,
            project: None,
            billable: false,
            body_sent: false,
            reported_credits: None,
            model: None,
            body_prefix: Vec::new(),
            upstream_sent: None,
            cors_origin: None,
            refused_key: None,
            answer_values: None,
            gateway_names: false,
            tunnel: None,
            trace: None,
            reservation: None,
            body_scanned: 0,
        })
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<bool> {
        // Pingora keeps an idle client connection open for good (`Some(0)`), each holding a
        // socket; it gets the configured idle timeout instead.
        if self.draining.is_draining() {
            // Clients reconnect, to a replica that is not going away.
            session.set_keepalive(None);
        } else if session.get_keepalive() == Some(0) {
            session.set_keepalive(Some(self.keepalive_secs));
        }
        self.trace_start(session, ctx);
        let admitted = self.admit(session, ctx).await;
        self.trace_admission(ctx, &admitted);
        match admitted {
            Ok(Admission::Forward) => {
                ctx.billable = true;
                Ok(false)
            }
            Ok(Admission::Answer) => Ok(true),
            Err(err) => {
                let headers = ctx.answer_headers();
                Box::pin(respond::error(session, &err, &ctx.request_id, &headers)).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<Box<HttpPeer>> {
        self.upstreams
            .peer(ctx.target)
            .map(|peer| Box::new(peer.clone()))
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no upstream for target"))
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<()> {
        if let Some(tunnel) = &mut ctx.tunnel {
            tunnel.from_client(body.as_ref().map_or(0, Bytes::len));
            return Ok(());
        }
        ctx.body_sent |= end_of_stream;
        if let Some(chunk) = body.as_ref() {
            self.scan_body(session, ctx, chunk);
        }
        // The body goes to the backend as it is; its first bytes find the model. A body that
        // comes whole in one chunk (the common case) is read where it is, without a copy.
        if ctx.model.is_none() && ctx.body_prefix.len() < body::SNIFF_LIMIT {
            if let Some(chunk) = body.as_ref() {
                if end_of_stream && ctx.body_prefix.is_empty() && chunk.len() <= body::SNIFF_LIMIT {
                    ctx.model = body::sniff_model(chunk, true);
                    return Ok(());
                }
                let room = body::SNIFF_LIMIT - ctx.body_prefix.len();
                ctx.body_prefix
                    .extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            let full = ctx.body_prefix.len() >= body::SNIFF_LIMIT;
            if end_of_stream || full {
                ctx.model = body::sniff_model(&ctx.body_prefix, end_of_stream && !full);
                ctx.body_prefix = Vec::new();
            }
        }
        Ok(())
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<()> {
        let caller = ctx
            .caller
            .as_ref()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "forwarding without a key"))?;
        let forwarded_for = self
            .trusted_proxies
            .forwarded_for(peer_ip(session), &upstream_request.headers);
        let (mut limit, mut remaining) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (limit, remaining) = match &ctx.rate {
            Some(d) => (
                limit.format(d.limit).as_bytes(),
                remaining.format(d.remaining).as_bytes(),
            ),
            None => (&b""[..], &b""[..]),
        };
        let [workspace, key_id, request_id, token_id] =
            Identity::parts(&caller.key, &ctx.request_id);
        let [workspace, key_id, request_id, token_id, limit, remaining] =
            headers::joint_values([workspace, key_id, request_id, token_id, limit, remaining])?;
        let identity =
            Identity::from_values(&caller.key, [workspace, key_id, request_id, token_id]);
        ctx.answer_values = Some(AnswerValues {
            request_id: identity.request_id.clone(),
            limit,
            remaining,
        });
        if ctx.gateway_names {
            hygiene::drop_gateway_names(upstream_request);
        }
        if upstream_request.raw_path().first() != Some(&b'/') {
            // An absolute-form target (`GET http://host/v1/models`) names a host of the
            // client's choosing; the backend gets the origin form and its own address as `Host`.
            framing::to_origin_form(upstream_request, self.upstreams.host(ctx.target))?;
        }
        upstream::set_identity_headers(upstream_request, identity, forwarded_for)?;
        if self.forward_key_metadata {
            // Set after the client's `Service-*` headers went (hygiene), so it is the gateway's.
            if let Some((_, json)) = &caller.key.metadata {
                upstream::set_key_metadata(upstream_request, json)?;
            }
        }
        if let Some(backend) = self.upstreams.host(ctx.target) {
            framing::for_backend(upstream_request, session.req_header().version, backend)?;
        }
        // Pingora drops the headers a client names in `Connection` before this filter: the
        // project the gateway charged must still reach the backend.
        if let Some(project) = &ctx.project {
            if !upstream_request.headers.contains_key(&SERVICE_PROJECT) {
                let value = HeaderValue::from_str(project).map_err(|_| {
                    Error::explain(ErrorType::InternalError, "project is no header value")
                })?;
                upstream_request.insert_header(&SERVICE_PROJECT, value)?;
            }
        }
        self.trace_upstream(upstream_request, ctx)?;
        ctx.upstream_sent = Some(Instant::now());
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<()> {
        if upstream_response.status == http::StatusCode::SWITCHING_PROTOCOLS {
            // Admitted as an upgrade on a route that takes one (or it would not be here).
            ctx.tunnel = Some(tunnel::TunnelMeter::open());
        }
        if session.req_header().version == http::Version::HTTP_10
            && framing::for_http10_client(upstream_response)
        {
            // The body ends where the connection does.
            session.set_keepalive(None);
        }
        if let (Some(sent), Some(route)) = (ctx.upstream_sent, self.route(ctx)) {
            route.metrics.record_upstream(sent.elapsed());
        }
        if let Some(trace) = ctx.trace.as_mut() {
            trace.upstream_answered(upstream_response.status.as_u16());
        }
        let mut reported = upstream_response.headers.get_all(&SERVICE_CREDITS).iter();
        if let (Some(v), None) = (reported.next(), reported.next()) {
            // An unreadable figure is no figure: the route's price applies. So do two figures,
            // on two lines as on one (`5, 7`).
            ctx.reported_credits = v.to_str().ok().and_then(Credits::parse_decimal);
            if let Some(reported) = ctx.reported_credits {
                let route = self.route(ctx).map_or("", |r| &r.template);
                ctx.reported_credits = self.meter.reported_cost(reported, route);
            }
        }
        if ctx.model.is_none() {
            ctx.model = upstream_response
                .headers
                .get(&SERVICE_MODEL)
                .and_then(|v| v.to_str().ok())
                .map(|m| m.chars().take(body::MODEL_CHARS).collect::<CompactString>());
        }
        let cors = ctx.cors_origin.clone().map(|origin| {
            // The backend's own CORS headers would contradict or repeat the gateway's.
            let theirs: Vec<http::HeaderName> = upstream_response
                .headers
                .keys()
                .filter(|n| n.as_str().starts_with("access-control-"))
                .cloned()
                .collect();
            for name in theirs {
                upstream_response.remove_header(&name);
            }
            [
                (&ACCESS_CONTROL_ALLOW_ORIGIN, origin),
                (
                    &ACCESS_CONTROL_EXPOSE_HEADERS,
                    HeaderValue::from_static(cors::EXPOSE_HEADERS),
                ),
                (&VARY, HeaderValue::from_static("Origin")),
            ]
        });
        let cors = cors.into_iter().flatten();
        // Made with the request's identity values; taken, so an answer after an informational
        // one makes its own.
        let (id, made_rate) = match ctx.answer_values.take() {
            Some(made) => (made.request_id, Some((made.limit, made.remaining))),
            None => (headers::id_value(&ctx.request_id)?, None),
        };
        let id = (&respond::REQUEST_ID, id);
        match &ctx.rate {
            Some(d) => {
                let (limit, remaining) = made_rate.unwrap_or_else(|| {
                    (HeaderValue::from(d.limit), HeaderValue::from(d.remaining))
                });
                headers::insert_response_headers(
                    upstream_response,
                    &mut [
                        id,
                        (&RATELIMIT_LIMIT, limit),
                        (&RATELIMIT_REMAINING, remaining),
                        (&RATELIMIT_RESET, headers::seconds_value(d.reset_secs)),
                    ]
                    .into_iter()
                    .chain(cors),
                )
            }
            None => headers::insert_response_headers(
                upstream_response,
                &mut [id].into_iter().chain(cors),
            ),
        }
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<Option<std::time::Duration>> {
        if let Some(tunnel) = &mut ctx.tunnel {
            tunnel.to_client(body.as_ref().map_or(0, Bytes::len));
        }
        Ok(None)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        _ctx: &mut Box<RequestCtx>,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // A refused or timed-out connect to a local backend will not succeed a moment later;
        // retrying only adds latency before the 503.
        e.set_retry(false);
        e
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<RequestCtx>,
    ) -> FailToProxy {
        let gone = FailToProxy {
            error_code: 0,
            can_reuse_downstream: false,
        };
        let err = match (e.esource(), e.etype()) {
            // The client cannot read: nobody to answer.
            (ErrorSource::Downstream, ErrorType::WriteError) => return gone,
            (ErrorSource::Downstream, _) if session.response_written().is_some() => return gone,
            // The whole request went to the backend and the client hung up while it worked:
            // nobody to answer (`logging` charges and audits it as 499).
            (ErrorSource::Downstream, ErrorType::ReadError | ErrorType::ConnectionClosed)
                if ctx.body_sent && ctx.upstream_sent.is_some() =>
            {
                return gone
            }
            // The body stopped short of its length. A client that only half-closed its side
            // still reads the answer; one that is gone makes the write below fail.
            (ErrorSource::Downstream, ErrorType::ReadError | ErrorType::ConnectionClosed) => {
                ApiError::invalid("the request body ended before it was complete")
            }
            (ErrorSource::Downstream, ErrorType::ReadTimedout) => {
                ApiError::invalid("the request body did not arrive in time")
            }
            (ErrorSource::Downstream, _) => ApiError::invalid("malformed request"),
            // Pingora could not make the client's `Host` or target into the backend's (a `Host`
            // with `@`, say): the client's input, not the backend's failure.
            (ErrorSource::Internal, ErrorType::InvalidHTTPHeader) => {
                ApiError::invalid("the request's Host or target cannot be forwarded")
            }
            // The backend gave up waiting for a body the client stopped sending.
            (ErrorSource::Upstream, ErrorType::ReadTimedout) if !session.is_body_done() => {
                ApiError::invalid("the request body did not arrive in time")
            }
            (
                _,
                ErrorType::ConnectTimedout
                | ErrorType::ConnectRefused
                | ErrorType::ConnectNoRoute
                | ErrorType::ConnectError
                | ErrorType::SocketError
                | ErrorType::BindError,
            ) => ApiError::UpstreamUnavailable("the backend is unreachable".into()),
            _ => ApiError::Upstream("the backend failed to answer".into()),
        };
        // Pingora does not reuse a client connection after a failed proxy attempt, so the
        // answer must say `Connection: close` rather than invite a reuse that would be reset.
        session.set_keepalive(None);
        // Closing a socket with unread request bytes makes the kernel reset it, and the client
        // may lose the answer: read what is left of a small body first, briefly.
        if !session.is_body_done() {
            session.set_total_drain_timeout(Some(std::time::Duration::from_secs(1)));
            let _ = session.drain_request_body().await;
        }
        if let Err(write_err) =
            respond::error(session, &err, &ctx.request_id, &ctx.answer_headers()).await
        {
            tracing::debug!(request_id = %ctx.request_id, error = %write_err, "could not send error response");
            return gone;
        }
        FailToProxy {
            error_code: err.status(),
            can_reuse_downstream: false,
        }
    }

    /// How Pingora names a request in its own log lines: method and path, any key in the path
    /// cut to its last four.
    fn request_summary(&self, session: &Session, _ctx: &Box<RequestCtx>) -> String {
        let req = session.req_header();
        format!("{} {}", req.method, redact(req.uri.path()))
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Box<RequestCtx>) {
        let mut status = session
            .response_written()
            .map_or(0, |resp| resp.status.as_u16());
        // The backend failed after its answer began (cut short, or stalled past the read
        // timeout): the client got a broken body. It counts as the 502 it is, and is not charged.
        if e.is_some_and(|e| e.esource() == &ErrorSource::Upstream) && (200..400).contains(&status)
        {
            status = 502;
            ctx.billable = false;
        }
        // The client hung up after the request reached the backend and before the answer: the
        // backend did the work, so it is charged (the route's price), and audited as 499, the
        // conventional "client closed request".
        if status == 0
            && ctx.upstream_sent.is_some()
            && e.is_some_and(|e| e.esource() == &ErrorSource::Downstream)
        {
            status = CLIENT_CLOSED;
        }
        let environment = ctx.caller.as_ref().map(|c| c.key.effective_environment());
        let elapsed = ctx.started.elapsed();
        // Once per forwarded request, to its last attempt (an attempt on a pooled connection
        // that failed is sent again).
        if let Some(sent) = ctx.upstream_sent {
            metrics::record_overhead(sent.saturating_duration_since(ctx.started));
        }
        let route = match self.route(ctx) {
            Some(r) => {
                r.metrics.record_request(status, environment, elapsed);
                &*r.template
            }
            None if ctx.probe => {
                metrics::record_request("probe", status, "none", elapsed);
                "probe"
            }
            None => {
                let env = environment.map_or("none", Environment::as_str);
                metrics::record_request("unmatched", status, env, elapsed);
                "unmatched"
            }
        };
        if let Some(reason) = ctx.auth_failure {
            metrics::record_auth_failure(reason);
        }
        if let Some(e) = e {
            tracing::warn!(request_id = %ctx.request_id, status, route, error = %e, "request failed");
        }
        self.trace_end(session, ctx, status);
        self.account(session, ctx, status, elapsed);
    }
}

impl Gateway {
    /// Assembles the gateway.
    #[allow(clippy::too_many_arguments)] // the parts built at start, each of its own kind
    pub fn new(
        store: Stores,
        keys: Arc<KeyCache>,
        routes: RouteTable,
        upstreams: Upstreams,
        meter: Arc<Meter>,
        allow_insecure_targets: bool,
        keepalive_secs: u64,
        draining: Draining,
    ) -> Self {
        Self {
            openapi: api::openapi::serialized(&routes),
            routes,
            upstreams,
            meter,
            allow_insecure_targets,
            forward_key_metadata: false,
            keepalive_secs,
            draining,
            cors: Cors::default(),
            trusted_proxies: TrustedProxies::default(),
            listen_streams: listen::OpenStreams::default(),
            listen_hub: event_hub::EventHub::new(store.events.clone()),
            auth: Authenticator::new(keys),
            store_check: readiness::StoreCheck::default(),
            jobs: jobs::SimulatedJobs::new(store.sandbox.clone(), DEFAULT_JOB_SECONDS),
            store,
            tracing: None,
            scanners: None,
            dashboard: None,
        }
    }

    /// Traces requests with `tracing` ([`crate::telemetry`]).
    pub fn with_tracing(mut self, tracing: Option<Tracing>) -> Self {
        self.tracing = tracing;
        self
    }

    /// Sends each key's metadata to the backend, as `Service-Key-Metadata`.
    pub fn with_key_metadata_forwarding(mut self, forward: bool) -> Self {
        self.forward_key_metadata = forward;
        self
    }

    /// Simulated async jobs finish `job_seconds` after they start.
    pub fn with_job_seconds(mut self, job_seconds: u64) -> Self {
        self.jobs = jobs::SimulatedJobs::new(self.store.sandbox.clone(), job_seconds);
        self
    }

    /// Runs `scanners`: GitHub's alerts, and the scanners of the request path.
    pub fn with_scanners(mut self, scanners: Arc<Scanners>) -> Self {
        self.scanners = Some(scanners);
        self
    }

    /// Hands requests under `/dashboard/` to `router` (the workspace dashboard).
    pub fn with_dashboard(mut self, router: axum::Router) -> Self {
        self.dashboard = Some(router);
        self
    }

    /// Believes `X-Forwarded-For` from `proxies` for the client's address.
    pub fn with_trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.trusted_proxies = proxies;
        self
    }

    /// Lets a client present at most `per_minute` keys that do not exist, and all clients
    /// together `total_per_minute` ([`unknown_keys::UnknownKeyLimit`]).
    pub fn with_unknown_key_limit(mut self, per_minute: u32, total_per_minute: u32) -> Self {
        self.auth = self
            .auth
            .with_unknown_key_limit(per_minute, total_per_minute);
        self
    }

    /// Lets browser pages from `cors`'s origins call the API.
    pub fn with_cors(mut self, cors: Cors) -> Self {
        self.cors = cors;
        self
    }

    /// The request's route, once matched.
    fn route(&self, ctx: &RequestCtx) -> Option<&Route> {
        ctx.route.map(|id| self.routes.get(id))
    }
}

/// The IP address of the connection's peer; `None` over a Unix socket.
fn peer_ip(session: &Session) -> Option<std::net::IpAddr> {
    session.client_addr()?.as_inet().map(|a| a.ip())
}
