//! An OTLP/HTTP trace collector on loopback: it decodes each protobuf export as a collector
//! would, and keeps the raw bytes too, to look for what must never be exported.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// One export as it came.
#[derive(Debug, Clone)]
pub struct Export {
    pub path: String,
    pub content_type: String,
    pub raw: Bytes,
    pub decoded: ExportTraceServiceRequest,
}

/// An exported span with its resource's `service.name`.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    pub service: String,
    pub span: Span,
}

impl ExportedSpan {
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    pub fn parent_span_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    /// A string or integer attribute, as text.
    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }
}

/// The value of `key` among `attributes`, as text.
pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The collector; its base URL is [`OtlpCollector::endpoint`].
pub struct OtlpCollector {
    pub addr: SocketAddr,
    exports: Arc<Mutex<Vec<Export>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl OtlpCollector {
    pub async fn start() -> Self {
        let exports: Arc<Mutex<Vec<Export>>> = Arc::default();
        let app = axum::Router::new()
            .fallback(
                |State(exports): State<Arc<Mutex<Vec<Export>>>>,
                 uri: Uri,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    let Ok(decoded) = ExportTraceServiceRequest::decode(body.clone()) else {
                        return StatusCode::BAD_REQUEST.into_response();
                    };
                    exports.lock().unwrap().push(Export {
                        path: uri.path().to_string(),
                        content_type: headers
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string(),
                        raw: body,
                        decoded,
                    });
                    // An empty ExportTraceServiceResponse: everything accepted.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                        .into_response()
                },
            )
            .with_state(exports.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            exports,
            _task: task,
        }
    }

    /// The collector's base URL, as `[tracing] otlp_endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn exports(&self) -> Vec<Export> {
        self.exports.lock().unwrap().clone()
    }

    /// Every span exported so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        let mut spans = Vec::new();
        for export in self.exports() {
            for resource in export.decoded.resource_spans {
                let service = resource
                    .resource
                    .as_ref()
                    .and_then(|r| attribute(&r.attributes, "service.name"))
                    .unwrap_or_default();
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        spans.push(ExportedSpan {
                            service: service.clone(),
                            span,
                        });
                    }
                }
            }
        }
        spans
    }

    /// The spans of trace `trace_id` (hex).
    pub fn trace(&self, trace_id: &str) -> Vec<ExportedSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id() == trace_id)
            .collect()
    }
}
