//! Traces: a request is exported over OTLP/HTTP in its caller's trace, and its backend is
//! called as a child of it.

use super::*;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn a_request_continues_its_callers_trace_and_the_backend_gets_a_child_context() {
    let collector = OtlpCollector::start().await;
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder()
        .live(live.addr)
        .config(|c| {
            c.tracing.otlp_endpoint = Some(collector.endpoint());
            c.tracing.service_name = "svcgate-under-test".into();
        })
        .start()
        .await;
    let (key_id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .header("tracestate", "vendor=opaque")
        .json(&json!({"model": "m1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Refused by the key check: traced too, under a trace of its own.
    let refused = gw.chat("svc_live_notakey").await;
    assert_eq!(refused.status(), 401);

    let exported = eventually(Duration::from_secs(15), || {
        let n = collector.trace(TRACE_ID).len();
        async move { n >= 2 }
    })
    .await;
    assert!(
        exported.is_some(),
        "spans exported: {:?}",
        collector.spans()
    );
    let spans = collector.trace(TRACE_ID);
    let server = spans
        .iter()
        .find(|s| s.parent_span_id() == CALLER_SPAN)
        .expect("the request's span is a child of the caller's");
    assert_eq!(server.service, "svcgate-under-test");
    assert_eq!(server.span.name, "POST /v1/chat/completions");
    assert_eq!(
        server.attribute("svcgate.key_id").as_deref(),
        Some(&*key_id)
    );
    assert_eq!(
        server.attribute("svcgate.workspace").as_deref(),
        Some(DEMO_WS)
    );
    assert_eq!(
        server.attribute("svcgate.environment").as_deref(),
        Some("live")
    );
    assert_eq!(
        server.attribute("http.route").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(
        server.attribute("http.response.status_code").as_deref(),
        Some("200")
    );
    let events: Vec<_> = server.span.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(events, ["auth", "policy"]);
    let upstream = spans
        .iter()
        .find(|s| s.parent_span_id() == server.span_id())
        .expect("the call to the backend is a child span");
    assert_eq!(upstream.span.name, "upstream");
    assert_eq!(
        upstream.attribute("http.response.status_code").as_deref(),
        Some("200")
    );

    // The backend saw the upstream span as its parent, in the same trace, and the caller's
    // trace state.
    let seen = live.requests();
    let headers = &seen.last().expect("the backend was called").headers;
    let traceparent = headers["traceparent"].to_str().unwrap();
    assert_eq!(
        traceparent,
        format!("00-{TRACE_ID}-{}-01", upstream.span_id())
    );
    assert_eq!(headers["tracestate"], "vendor=opaque");

    // The refused request's span says why, and names no key.
    let refused_span = eventually(Duration::from_secs(15), || {
        let found = collector
            .spans()
            .iter()
            .any(|s| s.attribute("http.response.status_code").as_deref() == Some("401"));
        async move { found }
    })
    .await;
    assert!(refused_span.is_some(), "{:?}", collector.spans());

    // Every export was OTLP/HTTP protobuf to /v1/traces, and nothing secret went out.
    for export in collector.exports() {
        assert_eq!(export.path, "/v1/traces");
        assert_eq!(export.content_type, "application/x-protobuf");
        let raw = String::from_utf8_lossy(&export.raw);
        for secret in [&*key, "svc_live_notakey", ADMIN_TOKEN] {
            assert!(!raw.contains(secret), "a secret was exported");
        }
    }
}

#[tokio::test]
async fn without_a_collector_the_callers_trace_context_passes_through_untouched() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("traceparent", &traceparent)
        .json(&json!({"model": "m1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = live.requests();
    assert_eq!(seen[0].headers["traceparent"], traceparent.as_str());
}
