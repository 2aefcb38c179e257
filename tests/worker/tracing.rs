//! Traced deliveries: each attempt is a span in the trace of the call that published the
//! event, and the endpoint receives the attempt's trace context.

use super::*;

const TRACE_ID: &str = "5af7651916cd43dd8448eb211c80319c";
const BACKEND_SPAN: &str = "c7ad6b7169203331";

#[tokio::test]
async fn a_delivery_continues_the_trace_of_the_call_that_published_its_event() {
    let collector = OtlpCollector::start().await;
    let ns = TestNamespace::new();
    let outbox = tempfile::tempdir().unwrap();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(webhooks(outbox.path(), &[60], 10))
        .config(|c| c.tracing.otlp_endpoint = Some(collector.endpoint()))
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", SCOPES).await;
    let s = Setup {
        gw,
        ws,
        key,
        outbox,
        _ns: ns,
    };
    let receiver = Receiver::start().await;
    let (endpoint_id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;

    // Published through the admin API by a backend that is itself traced.
    let resp = s
        .gw
        .admin_request(Method::POST, "/admin/v1/events")
        .header("traceparent", format!("00-{TRACE_ID}-{BACKEND_SPAN}-01"))
        .json(&json!({"workspace": s.ws, "type": "agent.run.completed", "data": {"run_id": "r1"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let event_id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Written to the event log by a backend directly, with its trace context as a field.
    let other_trace = "6bf92f3577b34da6a3ce929d0e0e4736";
    let (mut conn, stream) = event_log(&s).await;
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("type")
        .arg("agent.run.failed")
        .arg("workspace")
        .arg(&s.ws)
        .arg("data")
        .arg("{}")
        .arg("traceparent")
        .arg(format!("00-{other_trace}-{BACKEND_SPAN}-01"))
        .query_async(&mut conn)
        .await
        .unwrap();

    let got = received(&receiver, "/hook", 2, Duration::from_secs(15)).await;
    let parent_of = |event_type: &str| {
        let r = got
            .iter()
            .find(|r| String::from_utf8_lossy(&r.body).contains(event_type))
            .expect("delivered");
        r.headers["traceparent"].to_str().unwrap().to_string()
    };
    let completed = parent_of("agent.run.completed");
    assert!(
        completed.starts_with(&format!("00-{TRACE_ID}-")),
        "{completed}"
    );
    let failed = parent_of("agent.run.failed");
    assert!(
        failed.starts_with(&format!("00-{other_trace}-")),
        "{failed}"
    );
    // The body is the event as always: the trace context is not part of it.
    assert!(got
        .iter()
        .all(|r| !String::from_utf8_lossy(&r.body).contains("traceparent")));

    // The attempt's span: a child of the backend's, the one the endpoint was told of.
    let exported = eventually(Duration::from_secs(15), || {
        let n = collector.trace(TRACE_ID).len();
        async move { n >= 1 }
    })
    .await;
    assert!(exported.is_some(), "{:?}", collector.spans());
    let spans = collector.trace(TRACE_ID);
    let attempt = &spans[0];
    assert_eq!(attempt.parent_span_id(), BACKEND_SPAN);
    assert_eq!(attempt.span.name, "deliver agent.run.completed");
    assert!(completed.contains(&attempt.span_id()), "{completed}");
    assert_eq!(attempt.attribute("svcgate.event_id"), Some(event_id));
    assert_eq!(attempt.attribute("svcgate.endpoint_id"), Some(endpoint_id));
    assert_eq!(attempt.attribute("svcgate.attempt").as_deref(), Some("1"));
    assert_eq!(
        attempt.attribute("http.response.status_code").as_deref(),
        Some("200")
    );
}
