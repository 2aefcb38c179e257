//! The server-sent event stream the CLI reads: format, refusals, ends, and stream limits.

use super::*;

/// The events of a listen stream as they arrive.
struct SseStream {
    resp: reqwest::Response,
    buffer: String,
}

impl SseStream {
    fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            buffer: String::new(),
        }
    }

    /// The next whole event (it ends with a blank line), comments skipped; at most 5 s for each.
    async fn next_event(&mut self) -> String {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                if !event.starts_with(':') {
                    return event;
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(5), self.resp.chunk())
                .await
                .expect("an event within 5 s")
                .unwrap()
                .expect("the stream goes on");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

/// A listen stream of `agent.run.completed` events, opened with `key`.
async fn open_completed_runs(gw: &Gateway, key: &str) -> reqwest::Response {
    let resp = gw
        .request(
            Method::GET,
            "/v1/webhooks/listen?events=agent.run.completed",
        )
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

/// The JSON `data` of a stream event named `name`.
fn data(event: &str, name: &str) -> Value {
    let data = event
        .strip_prefix(&format!("event: {name}\ndata: "))
        .unwrap_or_else(|| panic!("a {name} event: {event:?}"));
    serde_json::from_str(data.trim_end()).unwrap()
}

#[tokio::test]
async fn the_stream_is_server_sent_events_written_as_they_happen() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", READ).await;
    let resp = open_completed_runs(&gw, &key).await;
    let header = |name: &str| resp.headers()[name].to_str().unwrap().to_string();
    assert_eq!(header("content-type"), "text/event-stream");
    assert_eq!(header("cache-control"), "no-cache");
    assert!(header("service-request-id").starts_with("req_"));

    let mut stream = SseStream::new(resp);
    let mut next_event = async || stream.next_event().await;

    let session = data(&next_event().await, "session");
    let secret = session["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"));
    trigger(&gw, DEMO_WS, "agent.run.failed", "live", json!({})).await;
    let id = trigger(
        &gw,
        DEMO_WS,
        "agent.run.completed",
        "live",
        payload("run_4"),
    )
    .await;
    let delivery = data(&next_event().await, "delivery");
    assert_eq!(delivery["event_id"], id.as_str());
    assert_eq!(delivery["event_type"], "agent.run.completed");
    let body = delivery["body"].as_str().unwrap();
    let timestamp = delivery["timestamp"].as_u64().unwrap().to_string();
    assert_eq!(
        delivery["signature"],
        expected_signature(&secret, &timestamp, body.as_bytes())
    );
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        (&body["id"], &body["data"]),
        (&json!(id), &payload("run_4"))
    );
}

/// Large events that pile up while a client is not reading all reach it, whole and in order,
/// once it reads: the stream writes a batch of them in pieces of at most 1 MiB, each write to a
/// slow client under its own timeout.
#[tokio::test]
async fn large_events_that_pile_up_arrive_whole_and_in_order() {
    const EVENTS: usize = 40;
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", READ).await;
    let mut stream = SseStream::new(open_completed_runs(&gw, &key).await);
    data(&stream.next_event().await, "session");
    // 8 MB the client does not read yet: more than the sockets between them hold, so the
    // stream's writes wait, and the events logged meanwhile go out together.
    let big = |i: usize| json!({ "run_id": i, "log": "x".repeat(200_000) });
    let mut published = Vec::new();
    for i in 0..EVENTS {
        published.push(trigger(&gw, DEMO_WS, "agent.run.completed", "live", big(i)).await);
    }
    for (i, id) in published.iter().enumerate() {
        let delivery = data(&stream.next_event().await, "delivery");
        assert_eq!(delivery["event_id"], id.as_str(), "event {i}");
        let body: Value = serde_json::from_str(delivery["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["data"], big(i));
    }
}

#[tokio::test]
async fn refusals_answer_with_the_documented_error_body() {
    let gw = Gateway::builder().start().await;
    let (_, reader) = gw.create_key("live", READ).await;
    let (_, other) = gw
        .create_key("live", &["models:read", "webhooks:write"])
        .await;
    let listen = |key: &str, query: &str| {
        gw.request(Method::GET, &format!("/v1/webhooks/listen{query}"))
            .bearer_auth(key)
            .send()
    };
    assert_error(listen(&other, "").await.unwrap(), 403, "permission_error").await;
    for query in ["?events=agent.run.exploded", "?events=", "?events=*"] {
        assert_error(
            listen(&reader, query).await.unwrap(),
            400,
            "invalid_request_error",
        )
        .await;
    }
    let anonymous = gw.request(Method::GET, "/v1/webhooks/listen").send().await;
    assert_error(anonymous.unwrap(), 401, "authentication_error").await;

    // The CLI says why and exits 1, without printing the key.
    for (key, extra, expected) in [
        (&other, &[][..], "permission_error (403)"),
        (
            &reader,
            &["--events", "agent.run.nope"][..],
            "invalid_request_error (400)",
        ),
    ] {
        let mut cli = Listener::spawn(
            &gw,
            key,
            &[&["--forward-to", "http://127.0.0.1:9/"], extra].concat(),
        );
        let status = cli
            .exit(Duration::from_secs(10))
            .await
            .expect("listen exits");
        assert_eq!(status.code(), Some(1));
        let stderr = cli.stderr();
        assert!(stderr.contains(expected), "{stderr}");
        assert!(!cli.output().contains(key.as_str()));
    }
}

#[tokio::test]
async fn revoking_the_key_ends_the_stream() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("live", READ).await;
    let (mut listener, _) = Listener::start(&gw, &key, "http://127.0.0.1:9/", &[]).await;
    gw.revoke(&id).await;
    let status = listener
        .exit(Duration::from_secs(10))
        .await
        .expect("listen exits");
    assert_eq!(status.code(), Some(1));
    let stderr = listener.stderr();
    assert!(
        stderr.contains("authentication_error") && stderr.contains("revoked"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_key_revoked_on_another_replica_gets_not_even_the_event_that_revoked_it() {
    // A leak report on replica a revokes the key and logs `key.auto_revoked` in one step; the
    // stream on replica b may read the event before b's key cache hears of the revocation.
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let receiver = RecordingUpstream::start("receiver").await;
    for _ in 0..3 {
        let (_, key) = a.create_key_in(&ws, "live", READ).await;
        let forward_to = format!("http://{}/hooks", receiver.addr);
        let (mut listener, _) = Listener::start(&b, &key, &forward_to, &[]).await;
        let resp = a
            .admin_request(Method::POST, "/admin/v1/leaks")
            .json(&json!([{"token": key, "source": "test"}]))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        listener
            .exit(Duration::from_secs(10))
            .await
            .expect("listen exits");
    }
    assert_eq!(
        receiver.requests().len(),
        0,
        "a revoked key's stream forwarded events"
    );
}

#[tokio::test]
async fn a_receiver_that_is_down_gets_a_failed_line() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", READ).await;
    let closed = format!("http://127.0.0.1:{}/hooks", free_port());
    let (mut listener, _) = Listener::start(&gw, &key, &closed, &[]).await;
    let id = trigger(&gw, DEMO_WS, "billing.credits.low", "live", json!({})).await;
    let line = listener.line(&id).await;
    assert!(line.contains("-> failed: connection refused ("), "{line}");
    listener.assert_running();
}

#[tokio::test]
async fn a_client_that_hangs_up_ends_its_stream_at_once() {
    let gw = Gateway::builder()
        .log_filter("info,svcgate::proxy::api::listen=debug")
        .start()
        .await;
    let (_, key) = gw.create_key("live", READ).await;
    let mut resp = gw
        .request(Method::GET, "/v1/webhooks/listen")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.chunk().await.unwrap().expect("the session event");
    assert!(!gw.logs().contains("the client went away"));
    drop(resp);
    // Long before the first keep-alive (15 s) would have found out by writing.
    let ended = eventually(Duration::from_secs(5), || async {
        gw.logs().contains("the client went away")
    })
    .await;
    assert!(ended.is_some(), "{}", gw.logs());
}

#[tokio::test]
async fn a_key_holds_at_most_five_streams_across_replicas() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let (_, key) = a.create_key_in(&ws, "live", READ).await;
    let open = |gw: &Gateway| {
        let request = gw
            .request(Method::GET, "/v1/webhooks/listen")
            .bearer_auth(&key);
        async move { request.send().await.unwrap() }
    };
    let mut streams = Vec::new();
    for gw in [&a, &a, &a, &b, &b] {
        let mut resp = open(gw).await;
        assert_eq!(resp.status(), 200);
        resp.chunk().await.unwrap().expect("the session event");
        streams.push(resp);
    }
    // Three on one replica and two on the other: a sixth is refused on either.
    for gw in [&b, &a] {
        let body = assert_error(open(gw).await, 429, "rate_limit_error").await;
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("across the gateways"),
            "{body}"
        );
    }
    // A stream that ends on one frees its place on the other.
    streams.remove(0);
    let reopened = eventually(Duration::from_secs(5), || async {
        open(&b).await.status() == 200
    })
    .await;
    assert!(reopened.is_some(), "{}", b.logs());
}

#[tokio::test]
async fn a_key_holds_at_most_five_streams_open_at_once() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw
        .create_key("live", &["webhooks:read", "tokens:create"])
        .await;
    let open = |key: String| {
        let request = gw
            .request(Method::GET, "/v1/webhooks/listen")
            .bearer_auth(key);
        async move { request.send().await.unwrap() }
    };
    let mut streams = Vec::new();
    for _ in 0..5 {
        let mut resp = open(key.clone()).await;
        assert_eq!(resp.status(), 200);
        resp.chunk().await.unwrap().expect("the session event");
        streams.push(resp);
    }
    let refused = open(key.clone()).await;
    assert_eq!(refused.headers()["retry-after"], "5");
    let body = assert_error(refused, 429, "rate_limit_error").await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("5 listen streams"));
    // A scoped token counts as its parent key.
    let token = gw
        .mint_token(&key, json!({"scopes": ["webhooks:read"]}))
        .await;
    assert_error(open(token).await, 429, "rate_limit_error").await;
    // Another key is not held back.
    let (_, other) = gw.create_key("live", READ).await;
    assert_eq!(open(other).await.status(), 200);
    // A stream that ends frees its place.
    streams.pop();
    let reopened = eventually(Duration::from_secs(5), || async {
        open(key.clone()).await.status() == 200
    })
    .await;
    assert!(reopened.is_some(), "{}", gw.logs());
}
