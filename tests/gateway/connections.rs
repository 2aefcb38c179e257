//! The HTTP connection: bodies cut short, keep-alive, framing read as raw bytes, CONNECT.

use super::*;

/// Sends a chat request that announces 100 bytes of body and sends 2, then half-closes the
/// connection or just waits; the raw answer.
async fn send_a_short_body(gw: &Gateway, key: &str, half_close: bool) -> String {
    let addr = gw.base.trim_start_matches("http://").to_string();
    let key = key.to_string();
    tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        conn.write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{}}"
            )
            .as_bytes(),
        )
        .unwrap();
        if half_close {
            conn.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut answer = Vec::new();
        let _ = conn.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_body_cut_short_is_answered_400_not_dropped() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    // The client's side closed: it still reads.
    let answer = send_a_short_body(&gw, &key, true).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("invalid_request_error"), "{answer}");
    assert!(answer.contains("ended before it was complete"), "{answer}");
    // The client stalls: the backend, still waiting for the body, times out first. The fault
    // is the client's, not the backend's.
    let answer = send_a_short_body(&gw, &key, false).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("did not arrive in time"), "{answer}");
}

#[tokio::test]
async fn an_idle_client_connection_is_closed_after_the_keepalive_timeout() {
    let gw = Gateway::builder()
        .config(|c| c.server.keepalive_timeout_seconds = 1)
        .start()
        .await;
    let addr = gw.base.trim_start_matches("http://").to_string();
    let closed = tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        // Idle from here on: the gateway closes its side within the timeout.
        conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let started = std::time::Instant::now();
        let eof = matches!(conn.read(&mut buf), Ok(0));
        (eof, started.elapsed())
    })
    .await
    .unwrap();
    assert!(
        closed.0,
        "the idle connection is still open after {:?}",
        closed.1
    );
}

#[tokio::test]
async fn early_answers_keep_the_connection_alive() {
    let gw = Gateway::builder().start().await;
    let addr = gw.base.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    // Two unauthenticated requests with bodies on one connection: both answered.
    for _ in 0..2 {
        conn.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 2\r\n\r\n{}",
        )
        .unwrap();
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).unwrap();
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 401"), "{text}");
        assert!(
            text.to_ascii_lowercase().contains("connection: keep-alive"),
            "{text}"
        );
    }
}

/// Sends `request` as it is on a new connection and reads the answer until the gateway closes
/// it (requests here say `Connection: close` or are refused with a close).
async fn raw(gw: &Gateway, request: String) -> String {
    let addr = gw.base.trim_start_matches("http://").to_string();
    tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = conn.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .unwrap()
}

/// The JSON body of a raw answer.
fn raw_body(answer: &str) -> Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

#[tokio::test]
async fn a_route_parameter_that_is_a_dot_segment_or_hides_a_slash_is_404_and_never_forwarded() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["agents:run"]).await;
    // A backend that normalizes these serves /v1/agents/approve (or further), not the route
    // whose scope was checked. (Sent raw: an HTTP client would normalize them first.)
    for path in [
        "/v1/agents/runs/../approve",
        "/v1/agents/runs/%2e%2e/approve",
        "/v1/agents/runs/..%2F..%2Fmodels/approve",
    ] {
        let answer = raw(
            &gw,
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
        assert_eq!(raw_body(&answer)["error"]["code"], "not_found", "{path}");
    }
    assert!(live.requests().is_empty());
}

/// Framing the backend could read differently from the gateway does not reach it as sent: a
/// transfer coding besides `chunked` is refused (the gateway would pass the coded body on
/// without its coding), two equal `Content-Length` values go on as one, and an HTTP/1.0 request
/// without `Host`, which goes on as HTTP/1.1, gets the backend's address as its `Host`.
#[tokio::test]
async fn request_framing_reaches_the_backend_with_one_reading() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let chunked = |codings: &str, connection: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\n{codings}{connection}\r\n2\r\n{{}}\r\n0\r\n\r\n"
        )
    };
    // Refused, and the connection closed: where the body ends is in doubt, and so where a
    // next request would start. (A coding that does not end in `chunked` Pingora refuses
    // itself, with its bare 400.)
    for codings in [
        "Transfer-Encoding: gzip, chunked\r\n",
        "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked, chunked\r\n",
    ] {
        let answer = raw(&gw, chunked(codings, "")).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{codings}: {answer}");
        assert_eq!(raw_body(&answer)["error"]["code"], "invalid_request_error");
        assert!(
            answer.to_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    assert!(live.requests().is_empty(), "{:?}", live.requests());
    let answer = raw(
        &gw,
        chunked("Transfer-Encoding: Chunked\r\n", "Connection: close\r\n"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(&live.requests()[0].body[..], b"{}");
    // What follows an HTTP library would tidy up on reading: a raw backend shows it as sent.
    let backend =
        RawBackend::start(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            .await;
    let gw = Gateway::builder().live(backend.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let post = |version: &str, head: &str| {
        format!(
            "POST /v1/chat/completions {version}\r\nAuthorization: Bearer {key}\r\n\
             Connection: close\r\n{head}\r\n{{}}"
        )
    };
    let answer = raw(
        &gw,
        post(
            "HTTP/1.1",
            "Host: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n",
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let head = backend.requests()[0].to_lowercase();
    assert_eq!(head.matches("content-length: 2\r\n").count(), 1, "{head}");
    let answer = raw(&gw, post("HTTP/1.0", "Content-Length: 2\r\n")).await;
    assert!(answer.contains(" 200 "), "{answer}");
    let head = backend.requests()[1].to_lowercase();
    assert!(
        head.starts_with("post /v1/chat/completions http/1.1\r\n"),
        "{head}"
    );
    let host = format!("\r\nhost: {}\r\n", backend.addr);
    assert!(head.contains(&host), "{head}");
}

/// A streamed (chunked) answer goes to an HTTP/1.0 client, which does not know chunks, as the
/// body until the connection closes; an HTTP/1.1 client gets the chunks.
#[tokio::test]
async fn an_http10_client_gets_a_streamed_answer_without_chunks() {
    let backend = RawBackend::start(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\n\r\n7\r\n{\"a\":1}\r\n0\r\n\r\n",
    )
    .await;
    let gw = Gateway::builder().live(backend.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let post = |version: &str, connection: &str| {
        format!(
            "POST /v1/chat/completions {version}\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Connection: {connection}\r\nContent-Length: 2\r\n\r\n{{}}"
        )
    };
    // Even for a client that asks to keep the connection: the close ends the body, and the
    // answer says so.
    let answer = raw(&gw, post("HTTP/1.0", "keep-alive")).await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let head = head.to_lowercase();
    assert!(head.contains(" 200 "), "{answer}");
    assert!(!head.contains("transfer-encoding"), "{answer}");
    assert!(head.contains("\r\nconnection: close"), "{answer}");
    assert_eq!(body, r#"{"a":1}"#, "the body as it is, ended by the close");
    let answer = raw(&gw, post("HTTP/1.1", "close")).await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_lowercase().contains("transfer-encoding: chunked"),
        "{answer}"
    );
    assert_eq!(body, "7\r\n{\"a\":1}\r\n0\r\n\r\n");
}

#[tokio::test]
async fn a_project_named_in_connection_still_reaches_the_backend() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw
        .create_key("live", &["chat.completions:create", "models:read"])
        .await;
    // A client that names `Service-Project` in `Connection` (hop-by-hop, so dropped by the
    // proxy) is charged to the project; the backend must still be told which.
    let answer = raw(
        &gw,
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Service-Project: team-a\r\nConnection: close, Service-Project\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = live.requests();
    assert_eq!(seen[0].headers["service-project"], "team-a");
    assert_eq!(seen[0].headers.get_all("service-project").iter().count(), 1);
    assert_eq!(live.requests().len(), 1);
}

#[tokio::test]
async fn a_401_carries_a_bearer_challenge_and_two_authorization_headers_are_refused() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, valid) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = gw.request(Method::GET, "/v1/models").send().await.unwrap();
    let challenge = resp.headers().get("www-authenticate").cloned();
    // The status and body first: a failure shows what came instead.
    assert_error(resp, 401, "authentication_error").await;
    assert_eq!(
        challenge.as_ref().and_then(|c| c.to_str().ok()),
        Some(r#"Bearer realm="svcgate""#)
    );
    // Whichever comes first: a proxy in front that reads the other would authorize another key.
    let other = format!("Bearer svc_live_{}", "x".repeat(40));
    for pair in [
        [format!("Bearer {valid}"), other.clone()],
        [other.clone(), format!("Bearer {valid}")],
    ] {
        let resp = gw
            .request(Method::POST, "/v1/chat/completions")
            .header("authorization", &pair[0])
            .header("authorization", &pair[1])
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let body = assert_error(resp, 401, "authentication_error").await;
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("one Authorization header"));
    }
    assert!(live.requests().is_empty());
    // The admin API challenges the same way.
    let resp = reqwest::Client::new()
        .get(format!("{}/admin/v1/keys?workspace=ws_demo", gw.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));
    // An admin token of any length, sent with the scheme in any case.
    let token = "t".repeat(96);
    let gw = Gateway::builder()
        .config(|c| c.server.admin_token = token.to_string())
        .start()
        .await;
    let resp = reqwest::Client::new()
        .get(format!("{}/admin/v1/keys?workspace=ws_demo", gw.admin))
        .header("authorization", format!("bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn connect_gets_the_documented_error_and_a_closed_connection() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let authority = gw.base.trim_start_matches("http://").to_string();
    let answer = raw(
        &gw,
        format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {key}\r\n\r\n"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    let body = raw_body(&answer);
    assert_eq!(body["error"]["code"], "invalid_request_error");
    let id = body["error"]["request_id"].as_str().unwrap();
    let header = answer
        .lines()
        .find_map(|l| l.strip_prefix("service-request-id: "))
        .unwrap_or_else(|| panic!("no request id header: {answer}"));
    assert_eq!(header, id);
    assert!(answer.contains("Connection: close"), "{answer}");
    assert!(live.requests().is_empty());
    // And the gateway goes on serving.
    assert_eq!(gw.chat(&key).await.status(), 200);
}
