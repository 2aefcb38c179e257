//! A webhook delivery attempt's span: a child of the request that caused the event when the
//! event carries its `traceparent`, else the root of a trace of its own. The endpoint receives
//! the attempt's context in `traceparent`.

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::Span;

use super::{trace_headers, TraceHeaders, Tracing};
use opentelemetry::propagation::TextMapPropagator;

/// The span of one delivery attempt.
pub struct DeliveryTrace {
    span: Span,
}

impl std::fmt::Debug for DeliveryTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryTrace")
            .field("span", self.span.span_context())
            .finish()
    }
}

/// What a delivery attempt's span is about.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryAttempt<'a> {
    /// The event (`evt_…`).
    pub event_id: &'a str,
    /// Its type.
    pub event_type: &'a str,
    /// The endpoint (`we_…`).
    pub endpoint_id: &'a str,
    /// The workspace.
    pub workspace: &'a str,
    /// Which attempt this is, from 1.
    pub attempt: u32,
    /// The `traceparent` of the request that caused the event, if it was kept.
    pub traceparent: Option<&'a str>,
}

impl Tracing {
    /// Starts the span of a delivery attempt.
    pub fn delivery(&self, attempt: DeliveryAttempt<'_>) -> DeliveryTrace {
        let parent = match attempt.traceparent {
            Some(traceparent) => context_of(traceparent),
            None => Context::new(),
        };
        let span = self
            .tracer
            .span_builder(format!("deliver {}", attempt.event_type))
            .with_kind(SpanKind::Producer)
            .with_attributes([
                KeyValue::new("svcgate.event_id", attempt.event_id.to_owned()),
                KeyValue::new("svcgate.event_type", attempt.event_type.to_owned()),
                KeyValue::new("svcgate.endpoint_id", attempt.endpoint_id.to_owned()),
                KeyValue::new("svcgate.workspace", attempt.workspace.to_owned()),
                KeyValue::new("svcgate.attempt", i64::from(attempt.attempt)),
            ])
            .start_with_context(&self.tracer, &parent);
        DeliveryTrace { span }
    }
}

impl DeliveryTrace {
    /// The trace context the endpoint receives, naming this attempt's span.
    pub fn headers(&self) -> TraceHeaders {
        trace_headers(&Context::new().with_remote_span_context(self.span.span_context().clone()))
    }

    /// Ends the span: the endpoint answered `status` (none: it did not answer), and the
    /// attempt failed or not.
    pub fn end(mut self, status: Option<u16>, failed: bool) {
        if let Some(status) = status {
            self.span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if failed {
            self.span.set_status(Status::error(""));
        }
        self.span.end();
    }
}

/// The context a stored `traceparent` names (an invalid one names none).
fn context_of(traceparent: &str) -> Context {
    let mut carrier = std::collections::HashMap::with_capacity(1);
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    TraceContextPropagator::new().extract(&carrier)
}

/// Whether `value` is a valid W3C `traceparent`, one worth keeping with an event.
pub fn is_traceparent(value: &str) -> bool {
    value.len() <= 64 && context_of(value).span().span_context().is_valid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_valid_traceparent_is_kept() {
        assert!(is_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        ));
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "svc_live_something",
        ] {
            assert!(!is_traceparent(bad), "{bad}");
        }
    }
}
