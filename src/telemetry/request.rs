//! A request's spans: a server span for the request, continuing the caller's trace, with the
//! outcome of authentication and of policy as its events; and a client span for the call to
//! the backend, whose context the backend receives in `traceparent`.
//!
//! Attributes name the key by its id and the workspace by its id; nothing here ever holds a
//! key, a token or a header value other than the trace context.

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Span;

use super::{extract, trace_headers, TraceHeaders, Tracing};

/// The spans of one request, from its arrival to its accounting.
pub struct RequestTrace {
    /// The context of the request's server span (which it holds).
    cx: Context,
    /// The call to the backend, once made.
    upstream: Option<Span>,
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTrace")
            .field("span", self.cx.span().span_context())
            .finish()
    }
}

impl Tracing {
    /// Starts the span of a request with `method` and `headers`, a child of the caller's span
    /// when the headers carry a valid `traceparent`.
    pub fn request(&self, method: &http::Method, headers: &http::HeaderMap) -> Box<RequestTrace> {
        let parent = extract(headers);
        let span = self
            .tracer
            .span_builder(method.as_str().to_owned())
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("http.request.method", method.to_string())])
            .start_with_context(&self.tracer, &parent);
        Box::new(RequestTrace {
            cx: parent.with_span(span),
            upstream: None,
        })
    }
}

impl RequestTrace {
    /// The caller was authenticated as key `key_id` of `workspace`.
    pub fn authenticated(&self, key_id: &str, workspace: &str, environment: &str) {
        let span = self.cx.span();
        span.set_attributes([
            KeyValue::new("svcgate.key_id", key_id.to_owned()),
            KeyValue::new("svcgate.workspace", workspace.to_owned()),
            KeyValue::new("svcgate.environment", environment.to_owned()),
        ]);
        span.add_event("auth", vec![KeyValue::new("outcome", "ok")]);
    }

    /// The caller was not authenticated, for `reason` (`missing`, `revoked`, …).
    pub fn auth_refused(&self, reason: &'static str) {
        self.cx.span().add_event(
            "auth",
            vec![
                KeyValue::new("outcome", "refused"),
                KeyValue::new("reason", reason),
            ],
        );
    }

    /// Policy (scope, project, rate limit, budget) let the request through, or refused it with
    /// `status` and error `code`.
    pub fn policy(&self, refused: Option<(u16, &'static str)>) {
        let attributes = match refused {
            None => vec![KeyValue::new("outcome", "ok")],
            Some((status, code)) => vec![
                KeyValue::new("outcome", "refused"),
                KeyValue::new("http.response.status_code", i64::from(status)),
                KeyValue::new("error.type", code),
            ],
        };
        self.cx.span().add_event("policy", attributes);
    }

    /// Starts the span of the call to the backend at `backend` (`host:port`); returns the
    /// trace context headers the backend gets, naming that span.
    pub fn start_upstream(&mut self, tracing: &Tracing, backend: &str) -> TraceHeaders {
        let span = tracing
            .tracer
            .span_builder("upstream")
            .with_kind(SpanKind::Client)
            .with_attributes([KeyValue::new("server.address", backend.to_owned())])
            .start_with_context(&tracing.tracer, &self.cx);
        let headers =
            trace_headers(&Context::new().with_remote_span_context(span.span_context().clone()));
        // A request sent again (a pooled connection that failed) ends the earlier attempt.
        if let Some(mut earlier) = self.upstream.replace(span) {
            earlier.end();
        }
        headers
    }

    /// The backend answered with `status`.
    pub fn upstream_answered(&mut self, status: u16) {
        if let Some(mut span) = self.upstream.take() {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            if status >= 500 {
                span.set_status(Status::error(""));
            }
            span.end();
        }
    }

    /// Ends the request's spans: `route` is the matched route's template, `status` the answer's
    /// (0 when none was sent).
    pub fn end(mut self, method: &http::Method, route: Option<&str>, status: u16) {
        if let Some(mut upstream) = self.upstream.take() {
            upstream.end();
        }
        let span = self.cx.span();
        if let Some(route) = route {
            span.set_attribute(KeyValue::new("http.route", route.to_owned()));
            span.update_name(format!("{method} {route}"));
        }
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 || status == 0 {
            span.set_status(Status::error(""));
        }
        span.end();
    }
}
