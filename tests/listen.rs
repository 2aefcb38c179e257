//! `svcgate listen`, from a developer's side: run the real CLI against a gateway, trigger
//! events, and look at what a receiver on loopback got and what the CLI printed.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use svcgate::events::Event;
use svcgate::keys::Environment;

const READ: &[&str] = &["webhooks:read"];
/// A payload with characters that must survive byte for byte.
fn payload(tag: &str) -> Value {
    json!({"run_id": tag, "note": "ünïcödé ✓ \"quoted\"\nsecond line", "steps": 3})
}

/// A running `svcgate listen`, killed on drop.
struct Listener {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    /// The threads copying stdout and stderr; they end when the process closes its pipes.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Listener {
    /// Starts `svcgate listen` with `args` (the key goes in `SVCGATE_API_KEY`).
    fn spawn(gw: &Gateway, key: &str, args: &[&str]) -> Self {
        let mut child = svcgate_command()
            .args(["listen", "--gateway-url", &gw.base])
            .args(args)
            .env("SVCGATE_API_KEY", key)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("svcgate listen starts");
        let mut readers = Vec::new();
        let mut collect = |pipe: Box<dyn std::io::Read + Send>| {
            let lines: Arc<Mutex<Vec<String>>> = Arc::default();
            let sink = lines.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    sink.lock().unwrap().push(line);
                }
            }));
            lines
        };
        let stdout = collect(Box::new(child.stdout.take().unwrap()));
        let stderr = collect(Box::new(child.stderr.take().unwrap()));
        Self {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Starts it and waits for the session's secret.
    async fn start(gw: &Gateway, key: &str, forward_to: &str, extra: &[&str]) -> (Self, String) {
        let mut listener = Self::spawn(gw, key, &[&["--forward-to", forward_to], extra].concat());
        let ready = listener
            .line("Ready. Webhook signing secret for this session: ")
            .await;
        let secret = ready.rsplit(' ').next().unwrap().to_string();
        assert!(secret.starts_with("whsec_") && secret.len() > 20, "{ready}");
        listener.assert_running();
        (listener, secret)
    }

    /// The first stdout line containing `needle`, waiting up to 10 s for it.
    async fn line(&self, needle: &str) -> String {
        let find = || {
            self.stdout
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
                .cloned()
        };
        eventually(Duration::from_secs(10), || async { find().is_some() }).await;
        find().unwrap_or_else(|| {
            panic!(
                "no line with {needle:?}; stdout: {:?}; stderr: {:?}",
                self.stdout.lock().unwrap(),
                self.stderr.lock().unwrap()
            )
        })
    }

    fn output(&self) -> String {
        let out = self.stdout.lock().unwrap().join("\n");
        let err = self.stderr.lock().unwrap().join("\n");
        format!("{out}\n{err}")
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    fn assert_running(&mut self) {
        let exited = self.child.try_wait().unwrap();
        assert!(exited.is_none(), "listen exited: {}", self.output());
    }

    /// Waits up to `limit` for the process to exit and, once it has, for everything it printed
    /// to be read.
    async fn exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut status = None;
        eventually(limit, || {
            status = self.child.try_wait().unwrap();
            let exited = status.is_some();
            async move { exited }
        })
        .await;
        if status.is_some() {
            for reader in self.readers.drain(..) {
                reader.join().expect("output reader");
            }
        }
        status
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes an event through the admin API; returns its id.
async fn trigger(
    gw: &Gateway,
    ws: &str,
    event_type: &str,
    environment: &str,
    data: Value,
) -> String {
    gw.publish_event(ws, event_type, environment, data).await
}

/// Asserts that `got` is the delivery of one event, signed with `secret`; returns the body.
fn assert_delivery(got: &Recorded, secret: &str) -> Value {
    let header = |name: &str| {
        got.headers
            .get(name)
            .unwrap_or_else(|| panic!("{name} header"))
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(got.method, Method::POST);
    assert_eq!(got.path, "/hooks");
    assert_eq!(header("content-type"), "application/json");
    let timestamp = header("service-timestamp");
    let sent_at: u64 = timestamp.parse().unwrap();
    assert!(sent_at.abs_diff(svcgate::ids::unix_now()) < 60);
    assert_eq!(
        header("service-signature"),
        expected_signature(secret, &timestamp, &got.body)
    );
    let body: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(header("service-event-id"), body["id"].as_str().unwrap());
    // Exactly the bytes production sends for this event.
    let event = Event {
        id: body["id"].as_str().unwrap().to_string(),
        event_type: body["type"].as_str().unwrap().to_string(),
        created: body["created"].as_u64().unwrap(),
        workspace: body["workspace"].as_str().unwrap().to_string(),
        environment: Environment::Live,
        data: body["data"].clone(),
    };
    assert_eq!(
        String::from_utf8_lossy(&got.body),
        String::from_utf8_lossy(&svcgate::webhooks::delivery::body(&event))
    );
    body
}

/// Waits until `receiver` has `n` deliveries, then a moment more for any it should not get.
async fn deliveries(receiver: &RecordingUpstream, n: usize) -> Vec<Recorded> {
    eventually(Duration::from_secs(10), || async {
        receiver.requests().len() >= n
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = receiver.requests();
    assert_eq!(got.len(), n, "deliveries: {got:?}");
    got
}

fn ids(got: &[Recorded]) -> std::collections::BTreeSet<String> {
    got.iter()
        .map(|r| r.headers["service-event-id"].to_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn listen_forwards_signed_events_of_the_chosen_types_from_its_workspace() {
    let gw = Gateway::builder().start().await;
    let other_ws = gw.create_workspace().await;
    let (_, key) = gw.create_key("live", READ).await;
    let receiver = RecordingUpstream::start("receiver").await;
    let url = format!("http://{}/hooks", receiver.addr);
    let (listener, secret) = Listener::start(&gw, &key, &url, &["--events", "agent.run.*"]).await;

    trigger(&gw, DEMO_WS, "image.batch.completed", "live", json!({})).await;
    trigger(&gw, DEMO_WS, "agent.run.completed", "test", json!({})).await;
    trigger(&gw, &other_ws, "agent.run.completed", "live", json!({})).await;
    let completed = trigger(
        &gw,
        DEMO_WS,
        "agent.run.completed",
        "live",
        payload("run_1"),
    )
    .await;
    let failed = trigger(&gw, DEMO_WS, "agent.run.failed", "live", payload("run_2")).await;

    let got = deliveries(&receiver, 2).await;
    assert_eq!(ids(&got), [completed.clone(), failed.clone()].into());
    for delivery in &got {
        let body = assert_delivery(delivery, &secret);
        assert_eq!(body["workspace"], DEMO_WS);
        let tag = if body["id"] == completed.as_str() {
            "run_1"
        } else {
            "run_2"
        };
        assert_eq!(body["data"], payload(tag));
    }
    for (id, event_type) in [
        (&completed, "agent.run.completed"),
        (&failed, "agent.run.failed"),
    ] {
        let line = listener.line(id).await;
        assert!(
            line.contains(event_type) && line.contains("-> 200 ("),
            "{line}"
        );
    }
    assert!(
        !listener.output().contains(&key),
        "the API key is never printed"
    );
}

#[tokio::test]
async fn a_test_key_gets_only_test_mode_events() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("test", READ).await;
    let receiver = RecordingUpstream::start("receiver").await;
    let url = format!("http://{}/hooks", receiver.addr);
    let (_listener, secret) = Listener::start(&gw, &key, &url, &[]).await;

    trigger(&gw, DEMO_WS, "agent.run.completed", "live", json!({})).await;
    let revoked = trigger(&gw, DEMO_WS, "key.auto_revoked", "test", json!({})).await;
    let failed = trigger(&gw, DEMO_WS, "agent.run.failed", "test", json!({})).await;

    let got = deliveries(&receiver, 2).await;
    assert_eq!(ids(&got), [revoked, failed].into());
    for delivery in &got {
        assert_delivery(delivery, &secret);
    }
}

#[tokio::test]
async fn listen_on_redis_forwards_admin_events_and_entries_added_to_the_stream() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let other_ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", READ).await;
    let receiver = RecordingUpstream::start("receiver").await;
    let url = format!("http://{}/hooks", receiver.addr);
    let (listener, secret) = Listener::start(&gw, &key, &url, &[]).await;

    trigger(&gw, &other_ws, "agent.run.completed", "live", json!({})).await;
    // A backend may add to the event stream directly, with no id of its own.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(format!("{{{}}}:events", ns.name))
        .arg("*")
        .arg(&[
            ("type", "image.batch.completed"),
            ("workspace", ws.as_str()),
            ("data", r#"{"batch_id":"batch_1"}"#),
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let from_admin = trigger(&gw, &ws, "agent.run.completed", "live", payload("run_3")).await;

    let got = deliveries(&receiver, 2).await;
    let bodies: Vec<Value> = got.iter().map(|d| assert_delivery(d, &secret)).collect();
    let direct = bodies
        .iter()
        .find(|b| b["type"] == "image.batch.completed")
        .expect("the entry added to the stream");
    assert_eq!(direct["data"], json!({"batch_id": "batch_1"}));
    assert_eq!(direct["workspace"], ws.as_str());
    assert!(bodies
        .iter()
        .any(|b| b["id"] == from_admin.as_str() && b["data"] == payload("run_3")));
    listener.line(&from_admin).await;
    listener.line(direct["id"].as_str().unwrap()).await;
}

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
async fn refusals_answer_with_the_spec_error_body() {
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

/// A listen stream read by hand: whole Server-Sent Events, keep-alive comments skipped.
struct Sse {
    resp: reqwest::Response,
    buffer: String,
}

impl Sse {
    async fn open(gw: &Gateway, key: &str) -> Self {
        Self::try_open(gw, key).await.expect("the stream opens")
    }

    /// Opens a stream and reads its opening event; the status if it is refused.
    async fn try_open(gw: &Gateway, key: &str) -> Result<Self, u16> {
        let resp = gw
            .request(Method::GET, "/v1/webhooks/listen")
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        if resp.status() != 200 {
            return Err(resp.status().as_u16());
        }
        let mut sse = Self {
            resp,
            buffer: String::new(),
        };
        let opening = sse.next(Duration::from_secs(5)).await.unwrap();
        assert!(opening.starts_with("event: session\n"), "{opening}");
        Ok(sse)
    }

    /// The next event within `wait`; `None` if none came.
    async fn next(&mut self, wait: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                if !event.starts_with(':') {
                    return Some(event);
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .ok()?;
            let chunk = chunk.unwrap().expect("the stream goes on");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

/// A gateway on a redis-server of the test's own (to count its clients and commands, or stop
/// it), with a workspace and a live key that may listen.
async fn on_own_redis(namespace: &str) -> (RedisServer, Gateway, String, String) {
    let redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), namespace)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", READ).await;
    (redis, gw, ws, key)
}

/// Connections of `redis` whose last command was `command` (a blocked read shows its command).
async fn clients_running(redis: &RedisServer, command: &str) -> usize {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    list.lines()
        .filter(|l| l.split(' ').any(|f| f == format!("cmd={command}")))
        .count()
}

#[tokio::test]
async fn a_gateways_streams_share_one_reader_of_the_log_and_all_end_when_it_fails() {
    let (mut redis, gw, ws, key) = on_own_redis("listen-hub").await;
    let other_ws = gw.create_workspace().await;
    let (_, other_key) = gw.create_key_in(&other_ws, "live", READ).await;
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(Sse::open(&gw, &key).await);
    }
    let mut other = Sse::open(&gw, &other_key).await;
    // One blocking read of the log for the four (each used to hold one of its own).
    // (Polled: the reader's first read may still be on its way.)
    let one = eventually(Duration::from_secs(2), || async {
        clients_running(&redis, "xread").await == 1
    })
    .await;
    assert!(
        one.is_some(),
        "{} readers",
        clients_running(&redis, "xread").await
    );
    assert!(gw
        .metrics_text()
        .await
        .contains("\nsvcgate_listen_streams 4\n"));

    let id = trigger(&gw, &ws, "agent.run.completed", "live", payload("hub")).await;
    for stream in &mut mine {
        let event = stream
            .next(Duration::from_secs(5))
            .await
            .expect("the event");
        assert!(
            event.starts_with("event: delivery\n") && event.contains(&id),
            "{event}"
        );
    }
    assert_eq!(other.next(Duration::from_millis(500)).await, None);

    // The store goes away: every stream ends with the SPEC error body.
    redis.stop().await;
    for stream in mine.iter_mut().chain([&mut other]) {
        let event = stream
            .next(Duration::from_secs(10))
            .await
            .expect("an error event");
        assert!(event.starts_with("event: error\n"), "{event}");
        assert!(event.contains("service_unavailable"), "{event}");
    }
    let metrics = gw.metrics_text().await;
    assert!(
        metrics.contains("\nsvcgate_listen_streams 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("svcgate_listen_streams_cut_total{reason=\"log_unreadable\"} 4\n"),
        "{metrics}"
    );
    // A bad filter is a 400 whatever the store's state (checked before the store is asked).
    let bad = gw
        .request(Method::GET, "/v1/webhooks/listen?events=agent.run.nope")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_error(bad, 400, "invalid_request_error").await;
    // Back again, a new stream opens and gets what is logged from then on.
    redis.resume().await;
    let mut again = None;
    for _ in 0..50 {
        if let Ok(stream) = Sse::try_open(&gw, &key).await {
            again = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut again = again.expect("a stream opens once Redis is back");
    let id = trigger(&gw, &ws, "agent.run.completed", "live", payload("back")).await;
    let event = again.next(Duration::from_secs(5)).await.expect("the event");
    assert!(event.contains(&id), "{event}");
}

#[tokio::test]
async fn streams_end_when_the_store_stops_answering() {
    let (redis, gw, ws, key) = on_own_redis("listen-hang").await;
    let mut streams = vec![Sse::open(&gw, &key).await, Sse::open(&gw, &key).await];
    // A Redis that holds the connection and never answers: the read waits 2 s for events,
    // then 5 s more at most.
    redis.freeze();
    for stream in &mut streams {
        let event = stream.next(Duration::from_secs(15)).await;
        let event = event.expect("an error event, not keep-alives for ever");
        assert!(event.starts_with("event: error\n"), "{event}");
        assert!(event.contains("service_unavailable"), "{event}");
    }
    redis.thaw();
    // The next stream reads the log anew.
    let mut again = Sse::open(&gw, &key).await;
    let id = trigger(&gw, &ws, "agent.run.completed", "live", json!({})).await;
    let event = again.next(Duration::from_secs(5)).await.expect("the event");
    assert!(event.contains(&id), "{event}");
}

#[tokio::test]
async fn streams_that_open_together_open_the_log_once() {
    let (redis, gw, _, key) = on_own_redis("listen-together").await;
    let (_a, _b, _c, _d) = tokio::join!(
        Sse::open(&gw, &key),
        Sse::open(&gw, &key),
        Sse::open(&gw, &key),
        Sse::open(&gw, &key)
    );
    // Opening the log reads its newest entry once (`XREVRANGE`); only the first stream did.
    assert_eq!(redis.command_calls("xrevrange").await, 1);
}

/// The streams an event wakes each bring the key cache up to date before they send it (a
/// key may have been revoked in the step that logged it): together, in one read of the
/// store's change log, not one each (until session 17, eight streams made eight).
#[tokio::test]
async fn streams_woken_together_catch_up_with_key_changes_in_one_read() {
    let (redis, gw, ws, key) = on_own_redis("listen-catch-up").await;
    let (_, other_key) = gw.create_key_in(&ws, "live", READ).await;
    let mut streams = Vec::new();
    for key in [&key, &other_key] {
        for _ in 0..4 {
            streams.push(Sse::open(&gw, key).await);
        }
    }
    // A read of the change log runs `XRANGE` on it twice (where the cache is, where the
    // store is) and once more if it changed; the cache also reads it every second.
    let before = redis.command_calls("xrange").await;
    let id = trigger(&gw, &ws, "agent.run.completed", "live", json!({})).await;
    for stream in &mut streams {
        let event = stream
            .next(Duration::from_secs(5))
            .await
            .expect("the event");
        assert!(event.contains(&id), "{event}");
    }
    let reads = redis.command_calls("xrange").await - before;
    assert!(reads <= 8, "{reads} XRANGEs for 8 streams");
}

/// A backend's entry with a field whose name is not UTF-8 (a field the event does not read)
/// reaches the streams; until session 17 it failed the log's read, and every stream ended.
#[tokio::test]
async fn an_entry_with_a_field_name_that_is_not_utf8_does_not_stop_the_streams() {
    let (redis, gw, ws, key) = on_own_redis("listen-names").await;
    let mut stream = Sse::open(&gw, &key).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg("{listen-names}:events")
        .arg("*")
        .arg("type")
        .arg("image.batch.completed")
        .arg("workspace")
        .arg(&ws)
        .arg("data")
        .arg(r#"{"batch_id":"batch_odd"}"#)
        .arg(&b"\xff\xfe"[..])
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let after = trigger(&gw, &ws, "agent.run.completed", "live", payload("after")).await;
    let odd = stream
        .next(Duration::from_secs(5))
        .await
        .expect("the entry");
    assert!(odd.contains("batch_odd"), "{odd}");
    let next = stream
        .next(Duration::from_secs(5))
        .await
        .expect("the next event");
    assert!(next.contains(&after), "{next}");
}

/// A stream refused because the store did not answer in time may still be given its slot when
/// the store gets to the command: the slot is let go, not held for its 90 s lease.
#[tokio::test]
async fn a_slot_the_store_gives_after_the_stream_was_refused_is_let_go() {
    let (redis, gw, _, key) = on_own_redis("listen-late").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let slots_held = || {
        let mut conn = conn.clone();
        async move {
            let slots: Vec<String> = redis::cmd("KEYS")
                .arg("{listen-late}:listen:*")
                .query_async(&mut conn)
                .await
                .unwrap();
            !slots.is_empty()
        }
    };
    // A stream opened and closed: Redis has the slot's script (a script it lacks is sent
    // again after the `NOSCRIPT` answer, and a hold that timed out is not).
    drop(Sse::open(&gw, &key).await);
    let closed = eventually(Duration::from_secs(5), || async { !slots_held().await }).await;
    assert!(closed.is_some());
    let holds_before = redis.command_calls("zadd").await;
    redis.freeze();
    assert_eq!(Sse::try_open(&gw, &key).await.err(), Some(503));
    // Past the release's own timeout: it waits in the connection, behind the hold.
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.thaw();
    // The hold ran (its `ZADD`), and its slot is gone.
    let freed = eventually(Duration::from_secs(5), || async {
        redis.command_calls("zadd").await > holds_before && !slots_held().await
    })
    .await;
    assert!(freed.is_some(), "{}", gw.logs());
}
