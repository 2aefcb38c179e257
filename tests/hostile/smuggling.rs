//! Requests whose framing, trailers, paths or headers could make the backend read something
//! other than what the gateway checked. Sent as exact bytes; what counts is what the backend
//! saw.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::common::*;
use super::{body, raw, status};

/// A backend that keeps every byte each connection brought (read until it goes quiet), and
/// answers `{}` once per connection, closing it.
struct SpyBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl SpyBackend {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let mut all = Vec::new();
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await
                    {
                        if n == 0 {
                            break;
                        }
                        all.extend_from_slice(&buf[..n]);
                    }
                    kept.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&all).into_owned());
                    let _ = conn
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                              Content-Length: 2\r\nConnection: close\r\n\r\n{}",
                        )
                        .await;
                });
            }
        });
        Self { addr, seen }
    }

    /// Everything the backend received, each connection's bytes in one string.
    fn received(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// A gateway in front of a [`SpyBackend`], and a live key for chat and models.
async fn setup() -> (SpyBackend, Gateway, String) {
    let backend = SpyBackend::start().await;
    let gw = Gateway::builder().live(backend.addr).start().await;
    let (_, key) = gw
        .create_key(
            "live",
            &["chat.completions:create", "models:read", "agents:run"],
        )
        .await;
    (backend, gw, key)
}

/// A request the backend must never see as one: it has no `Authorization` of its own, so only
/// a backend that read it out of another request's body could get it.
const SMUGGLED: &str = "GET /v1/models?smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

/// A chat request with `key` and the given framing headers and body bytes.
fn chat(version: &str, key: Option<&str>, framing: &str, body: &str) -> String {
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    format!("POST /v1/chat/completions {version}\r\nHost: x\r\n{auth}{framing}\r\n{body}")
}

/// The header section of what the backend received (lower case).
fn head(received: &str) -> String {
    received
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

#[tokio::test]
async fn content_length_with_transfer_encoding_reaches_the_backend_framed_one_way() {
    for framing in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 60\r\n",
    ] {
        let (backend, gw, key) = setup().await;
        let answer = raw(
            &gw.base,
            chat(
                "HTTP/1.1",
                Some(&key),
                framing,
                &format!("0\r\n\r\n{SMUGGLED}"),
            ),
        )
        .await;
        assert_eq!(status(&answer), 200, "{framing:?}: {answer}");
        assert_eq!(
            answer.matches("HTTP/1.1 ").count(),
            1,
            "one answer: {answer}"
        );
        // Read by its chunks; the connection closed after the answer, so the rest was no
        // request either.
        assert!(answer.to_ascii_lowercase().contains("connection: close"));
        tokio::time::sleep(Duration::from_millis(400)).await;
        let seen = backend.received();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let head = head(&seen[0]);
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        assert!(!head.contains("content-length"), "both framings: {head}");
        assert!(!seen[0].contains("smuggled"), "{seen:?}");
    }
}

#[tokio::test]
async fn content_lengths_that_disagree_and_chunks_in_http10_are_refused() {
    let (backend, gw, key) = setup().await;
    let body = format!("{{}}{SMUGGLED}");
    for request in [
        chat(
            "HTTP/1.1",
            Some(&key),
            "Content-Length: 2\r\nContent-Length: 49\r\n",
            &body,
        ),
        chat("HTTP/1.1", Some(&key), "Content-Length: 2, 49\r\n", &body),
        chat("HTTP/1.1", Some(&key), "Content-Length: +2\r\n", &body),
        chat(
            "HTTP/1.0",
            Some(&key),
            "Transfer-Encoding: chunked\r\n",
            &format!("2\r\n{{}}\r\n0\r\n\r\n{SMUGGLED}"),
        ),
    ] {
        let answer = raw(&gw.base, request.clone()).await;
        assert_eq!(status(&answer), 400, "{request:?}: {answer}");
        assert_eq!(answer.matches("HTTP/1.").count(), 1, "{answer}");
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(backend.received().is_empty(), "{:?}", backend.received());
}

#[tokio::test]
async fn chunked_trailers_never_reach_the_backend_as_headers_nor_authenticate() {
    let (backend, gw, key) = setup().await;
    let trailers = "0\r\nService-Credits: 0\r\nService-Workspace: ws_evil\r\n\
                    Service-Scopes: admin\r\nAuthorization: Bearer svc_live_evil\r\n\r\n";
    let framing = "Transfer-Encoding: chunked\r\nConnection: close\r\n";
    let answer = raw(
        &gw.base,
        chat(
            "HTTP/1.1",
            Some(&key),
            framing,
            &format!("2\r\n{{}}\r\n{trailers}"),
        ),
    )
    .await;
    assert_eq!(status(&answer), 200, "{answer}");
    // Without a header of its own, a key in the trailers does not authenticate.
    let answer = raw(
        &gw.base,
        chat(
            "HTTP/1.1",
            None,
            framing,
            &format!("2\r\n{{}}\r\n0\r\nAuthorization: Bearer {key}\r\n\r\n"),
        ),
    )
    .await;
    assert_eq!(status(&answer), 401, "{answer}");
    assert_eq!(body(&answer)["error"]["code"], "authentication_error");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let seen = backend.received();
    assert_eq!(seen.len(), 1, "only the authenticated request: {seen:?}");
    let all = seen[0].to_ascii_lowercase();
    for name in [
        "service-credits",
        "ws_evil",
        "service-scopes",
        "svc_live_evil",
        "authorization",
    ] {
        assert!(!all.contains(name), "{name} reached the backend: {all}");
    }
    assert!(head(&seen[0]).contains(&format!("service-workspace: {DEMO_WS}")));
}

#[tokio::test]
async fn odd_paths_are_404_and_never_forwarded() {
    let (backend, gw, key) = setup().await;
    for path in [
        "/v1/%2e%2e/admin/v1/keys",
        "/v1/models/%2e%2e",
        "/v1/models%2e%2e",
        "/v1/models;x=1",
        "/v1/models;/../tokens",
        "/v1//models",
        "//v1/models",
        "/v1/./models",
        "/v1/models%00",
        "/v1/models%00.json",
        "/v1/models/%c0%ae%c0%ae/",
        "/v1/%c0%af%c0%aemodels",
        "/v1/agents/runs/%c0%ae%c0%ae/approve",
        "/v1/agents/runs/%C0%AE/approve",
        "/v1/agents/runs/x%00/approve",
        "/v1/agents/runs/x%0a/approve",
        "/v1/agents/runs/a;b/approve",
        "/v1/agents/runs/a%3bb/approve",
        "/v1/agents/runs/%252e%252e/approve",
        "/v1/agents/runs/./approve",
        "/v1/agents/runs//approve",
    ] {
        // The approve route is a POST; its `{id}` is what these try to bend.
        let method = if path.ends_with("/approve") {
            "POST"
        } else {
            "GET"
        };
        let answer = raw(
            &gw.base,
            format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        )
        .await;
        assert_eq!(status(&answer), 404, "{path}: {answer}");
        assert_eq!(body(&answer)["error"]["code"], "not_found", "{path}");
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(backend.received().is_empty(), "{:?}", backend.received());
    // A plain id goes through, as it came.
    let answer = raw(
        &gw.base,
        format!(
            "POST /v1/agents/runs/run_42-a/approve HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {key}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status(&answer), 200, "{answer}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let seen = backend.received();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].starts_with("POST /v1/agents/runs/run_42-a/approve HTTP/1.1\r\n"));
}

#[tokio::test]
async fn header_floods_get_a_4xx_and_the_gateway_goes_on_serving() {
    let (backend, gw, key) = setup().await;
    let get = |extra: &str| {
        format!(
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n{extra}\
             Connection: close\r\n\r\n"
        )
    };
    // More header lines than Pingora parses: its bare 400.
    let many: String = (0..5_000).map(|i| format!("X-Flood-{i}: v\r\n")).collect();
    assert_eq!(status(&raw(&gw.base, get(&many)).await), 400);
    // One huge header, and many lines that add up: 431 with the error body.
    for extra in [
        format!("X-Flood: {}\r\n", "a".repeat(200_000)),
        format!("Cookie: {}\r\n", "a".repeat(40_000)),
        (0..150)
            .map(|i| format!("X-Flood-{i}: {}\r\n", "b".repeat(300)))
            .collect(),
    ] {
        let answer = raw(&gw.base, get(&extra)).await;
        assert_eq!(status(&answer), 431, "{}", &answer[..answer.len().min(300)]);
        assert_eq!(body(&answer)["error"]["code"], "invalid_request_error");
    }
    // A hundred small headers are fine; and the gateway is still there.
    let fine: String = (0..100).map(|i| format!("X-Fine-{i}: v\r\n")).collect();
    assert_eq!(status(&raw(&gw.base, get(&fine)).await), 200);
    assert_eq!(status(&raw(&gw.base, get("")).await), 200);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let seen = backend.received();
    assert_eq!(seen.len(), 2, "only the two that fit");
    assert!(seen
        .iter()
        .all(|r| !r.to_ascii_lowercase().contains("x-flood")));
}
