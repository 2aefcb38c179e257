//! Traces: OpenTelemetry spans exported over OTLP/HTTP (protobuf) when `[tracing]
//! otlp_endpoint` is set, and the W3C trace context (`traceparent`, `tracestate`) read from
//! callers and passed on to backends.
//!
//! Webhook deliveries are traced too: each attempt is a span, a child of the request that
//! caused the event when the event kept its `traceparent`.
//!
//! Off by default, and then free: the gateway holds no [`Tracing`], and a request makes no
//! span, reads no header and allocates nothing for it. On, spans are batched and exported from
//! a thread of the exporter's own, never on a request's path.

pub mod config;
mod delivery;
mod request;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Context;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use std::time::Duration;

pub use config::TracingConfig;
pub use delivery::{is_traceparent, DeliveryAttempt, DeliveryTrace};
pub use request::RequestTrace;

/// How long spans wait to be sent in a batch: a sidecar's traces should reach the collector
/// about as soon as the backends' do.
const EXPORT_DELAY: Duration = Duration::from_secs(1);
/// Longest an export may take; a collector that does not answer costs dropped spans, not a
/// stalled process.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The process's tracer, made from `[tracing]` when it names a collector.
#[derive(Clone)]
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracing")
    }
}

impl Tracing {
    /// The tracer for `config`, or `None` when it names no collector. Call it outside an async
    /// runtime: the exporter's HTTP client is a blocking one, on a thread of its own.
    pub fn start(config: &TracingConfig) -> Result<Option<Tracing>, String> {
        let Some(endpoint) = &config.otlp_endpoint else {
            return Ok(None);
        };
        let url =
            config::traces_url(endpoint).map_err(|why| format!("tracing.otlp_endpoint: {why}"))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("tracing.otlp_endpoint: cannot make the exporter: {e}"))?;
        let batches = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(EXPORT_DELAY)
                    .build(),
            )
            .build();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batches)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sampling_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("svcgate");
        Ok(Some(Tracing { provider, tracer }))
    }

    /// Sends the spans not yet exported and stops the exporter (at shutdown, outside an async
    /// runtime).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "traces not all exported at shutdown");
        }
    }
}

/// The trace context a request came with: its `traceparent` and `tracestate`, if valid.
fn extract(headers: &http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderReader(headers))
}

/// `traceparent` and (when not empty) `tracestate` naming `cx`'s span, for the next hop.
pub fn trace_headers(cx: &Context) -> TraceHeaders {
    let mut headers = TraceHeaders::default();
    TraceContextPropagator::new().inject_context(cx, &mut headers);
    headers
}

/// The W3C trace context headers for a request to the next hop.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TraceHeaders {
    /// `traceparent`: version, trace id, the calling span's id, flags.
    pub traceparent: Option<String>,
    /// `tracestate`: vendors' entries, passed on as they came.
    pub tracestate: Option<String>,
}

impl Injector for TraceHeaders {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = Some(value),
            "tracestate" if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

struct HeaderReader<'a>(&'a http::HeaderMap);

impl Extractor for HeaderReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        // Sent twice, a `traceparent` is no trace context (W3C: the header is single).
        let mut values = self.0.get_all(key).iter();
        match (values.next(), values.next()) {
            (Some(v), None) => v.to_str().ok(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn a_valid_traceparent_is_continued_and_a_bad_one_ignored() {
        let cx = extract(&headers(&[("traceparent", PARENT), ("tracestate", "a=1")]));
        let span = cx.span();
        let sc = span.span_context();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        let passed_on = trace_headers(&cx);
        assert_eq!(passed_on.traceparent.as_deref(), Some(PARENT));
        assert_eq!(passed_on.tracestate.as_deref(), Some("a=1"));
        for bad in [
            vec![(
                "traceparent",
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            )],
            vec![("traceparent", "garbage")],
            vec![("traceparent", PARENT), ("traceparent", PARENT)],
        ] {
            let cx = extract(&headers(&bad));
            assert!(!cx.span().span_context().is_valid(), "{bad:?}");
        }
    }
}
