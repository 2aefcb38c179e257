//! The request path's hooks into [`crate::telemetry`]: each does nothing, and costs a branch,
//! when tracing is off.

use pingora::prelude::*;
use pingora::proxy::Session;

use super::{Gateway, RequestCtx};
use crate::error::ApiError;

impl Gateway {
    /// Starts the request's span (for API requests only: probes are not traced).
    pub(super) fn trace_start(&self, session: &Session, ctx: &mut RequestCtx) {
        let Some(tracing) = &self.tracing else { return };
        let req = session.req_header();
        if req.uri.path().starts_with("/v1/") {
            ctx.trace = Some(tracing.request(&req.method, &req.headers));
        }
    }

    /// Records who the caller turned out to be, and what policy made of the request.
    pub(super) fn trace_admission<T>(&self, ctx: &RequestCtx, admitted: &Result<T, ApiError>) {
        let Some(trace) = &ctx.trace else { return };
        if let Some(reason) = ctx.auth_failure {
            trace.auth_refused(reason);
        } else if let Some(caller) = &ctx.caller {
            let key = &caller.key;
            trace.authenticated(
                key.billed_key_id(),
                &key.workspace,
                key.effective_environment().as_str(),
            );
            trace.policy(admitted.as_ref().err().map(|e| (e.status(), e.code())));
        }
    }

    /// Starts the span of the call to the backend and gives the backend its trace context in
    /// place of any the client sent.
    pub(super) fn trace_upstream(
        &self,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let (Some(tracing), Some(trace)) = (&self.tracing, ctx.trace.as_mut()) else {
            return Ok(());
        };
        let backend = self
            .upstreams
            .host(ctx.target)
            .map_or("", |h| h.to_str().unwrap_or(""));
        let headers = trace.start_upstream(tracing, backend);
        upstream_request.remove_header("traceparent");
        upstream_request.remove_header("tracestate");
        for (name, value) in [
            ("traceparent", headers.traceparent),
            ("tracestate", headers.tracestate),
        ] {
            if let Some(value) = value {
                upstream_request.insert_header(name, value)?;
            }
        }
        Ok(())
    }

    /// Ends the request's spans with its route and status.
    pub(super) fn trace_end(&self, session: &Session, ctx: &mut RequestCtx, status: u16) {
        if let Some(trace) = ctx.trace.take() {
            let route = self.route(ctx).map(|r| &*r.template);
            trace.end(&session.req_header().method, route, status);
        }
    }
}
