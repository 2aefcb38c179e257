//! What a request costs, and who is recorded as having spent it.

use super::*;

#[tokio::test]
async fn spend_comes_from_the_backend_or_the_route_price() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (id, key) = gw
        .create_key("live", &["chat.completions:create", "images:create"])
        .await;
    for _ in 0..3 {
        let resp = gw
            .request(Method::POST, "/v1/chat/completions")
            .bearer_auth(&key)
            .header("service-project", "team-a")
            .json(&json!({"model": "m1"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    eventually(Duration::from_secs(5), || async {
        usage(&gw, DEMO_WS).await["total"] == 1.5
    })
    .await
    .expect("3 × the backend's 0.5 credits");
    let report = usage(&gw, DEMO_WS).await;
    assert_eq!(report["keys"][&id], 1.5);
    assert_eq!(report["projects"]["team-a"], 1.5);
    assert_eq!(report["month"].as_str().unwrap().len(), 7);

    // Without a backend figure the route's price applies (simulated images: 4 credits).
    let sim = Gateway::builder().start().await;
    let (_, key) = sim.create_key("live", &["images:create"]).await;
    let resp = sim
        .request(Method::POST, "/v1/images/generations")
        .bearer_auth(&key)
        .json(&json!({"prompt": "a cat"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    eventually(Duration::from_secs(5), || async {
        usage(&sim, DEMO_WS).await["total"] == 4.0
    })
    .await
    .expect("the route price is charged");
}

#[tokio::test]
async fn test_keys_leave_no_spend_and_refused_requests_cost_nothing() {
    let gw = Gateway::builder().start().await;
    let (_, test_key) = gw.create_key("test", &["chat.completions:create"]).await;
    let (_, live_key) = gw.create_key("live", &["models:read"]).await;
    for _ in 0..3 {
        assert_eq!(gw.chat(&test_key).await.status(), 200);
        assert_eq!(gw.chat(&live_key).await.status(), 403);
    }
    // Audit records arrive for all six; spend stays at zero.
    until_audited(&gw, DEMO_WS, 6, "every authenticated request is audited").await;
    let report = usage(&gw, DEMO_WS).await;
    assert_eq!(report["total"], 0.0);
    assert_eq!(report["keys"], json!({}));
}

#[tokio::test]
async fn a_revoked_key_still_in_use_is_audited_with_who_used_it() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    gw.revoke(&id).await;
    assert_error(gw.chat(&key).await, 401, "authentication_error").await;
    // An unknown key is attributed to nobody: nothing to write.
    let unknown = svcgate::keys::format::generate(svcgate::keys::Environment::Live).value;
    assert_error(gw.chat(&unknown).await, 401, "authentication_error").await;
    let records = eventually(Duration::from_secs(5), || async {
        audit(&gw, &format!("workspace={DEMO_WS}&key_id={id}"))
            .await
            .len()
            == 1
    })
    .await;
    assert!(records.is_some(), "the refused request is audited");
    let record = &audit(&gw, &format!("workspace={DEMO_WS}&key_id={id}")).await[0];
    assert_eq!(record["status"], 401);
    assert_eq!(record["credits"], 0.0);
    assert_eq!(record["client_ip"], "127.0.0.1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(audit(&gw, &format!("workspace={DEMO_WS}")).await.len(), 1);
    assert_eq!(usage(&gw, DEMO_WS).await["total"], 0.0);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_audited_address_is_the_forwarded_client() {
    // (trusted proxies, audited client, X-Forwarded-For the backend gets)
    for (trusted, expected, forwarded) in [
        (
            vec!["127.0.0.1/32".to_string()],
            "203.0.113.7",
            "198.51.100.9, 203.0.113.7, 127.0.0.1",
        ),
        // An untrusted peer's list is its own claim: the backend gets the peer alone.
        (vec![], "127.0.0.1", "127.0.0.1"),
    ] {
        let live = RecordingUpstream::start("live").await;
        let gw = Gateway::builder()
            .live(live.addr)
            .config(|c| c.server.trusted_proxies = trusted.clone())
            .start()
            .await;
        let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
        let resp = gw
            .request(Method::POST, "/v1/chat/completions")
            .bearer_auth(&key)
            .header("X-Forwarded-For", "198.51.100.9")
            .header("X-Forwarded-For", "203.0.113.7")
            .json(&json!({"model": "m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let seen = &live.requests()[0].headers;
        let values: Vec<_> = seen.get_all("x-forwarded-for").iter().collect();
        assert_eq!(values, [forwarded], "trusted_proxies = {trusted:?}");
        let query = format!("workspace={DEMO_WS}&key_id={id}");
        eventually(Duration::from_secs(5), || async {
            audit(&gw, &query).await.len() == 1
        })
        .await
        .expect("audited");
        assert_eq!(
            audit(&gw, &query).await[0]["client_ip"],
            expected,
            "trusted_proxies = {trusted:?}"
        );
    }
}

/// The demo workspace's one audit record, once it is written.
async fn only_audit_record(gw: &Gateway) -> Value {
    eventually(Duration::from_secs(5), || async {
        !audit(gw, &format!("workspace={DEMO_WS}")).await.is_empty()
    })
    .await
    .expect("an audit record");
    let records = audit(gw, &format!("workspace={DEMO_WS}")).await;
    assert_eq!(records.len(), 1);
    records[0].clone()
}

#[tokio::test]
async fn two_service_credits_figures_are_no_figure() {
    let backend = RawBackend::start(
        b"HTTP/1.1 200 OK\r\nService-Credits: 5\r\nService-Credits: 7\r\n\
          Content-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    .await;
    let gw = Gateway::builder().live(backend.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    // As `5, 7` on one line: the route's price (1), not the first figure.
    assert_eq!(only_audit_record(&gw).await["credits"], 1.0);
}

/// A client that hangs up after its request reached the backend, before the answer, is
/// charged: the backend did the work. The record says 499 (client closed request).
#[tokio::test]
async fn a_client_that_hangs_up_after_forwarding_is_charged() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A backend that takes its time: it tells the test when it has the request, then answers
    // after two seconds.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let (got, mut received) = tokio::sync::mpsc::channel::<()>(1);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let got = got.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = conn.read(&mut buf).await;
                let _ = got.send(()).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    .await;
            });
        }
    });
    let gw = Gateway::builder().live(backend).start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let addr = gw.base.trim_start_matches("http://").to_string();
    let mut client = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = r#"{"model":"svc-chat-1"}"#;
    client
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), received.recv())
        .await
        .expect("the backend has the request");
    drop(client);
    let record = only_audit_record(&gw).await;
    assert_eq!(record["status"], 499, "{record}");
    assert_eq!(record["credits"], 1.0, "the route's price: {record}");
    eventually(Duration::from_secs(5), || async {
        let usage = gw
            .admin_get(&format!("/admin/v1/usage?workspace={DEMO_WS}"))
            .await;
        usage["keys"][&id] == 1.0
    })
    .await
    .expect("the route's price charged to the key");
}

/// A backend that reports an absurd cost (a bug, or a compromised backend) cannot drain a
/// budget: over `metering.max_credits_per_request` the figure is counted and the route's price
/// charged.
#[tokio::test]
async fn a_figure_over_the_cap_is_not_charged_as_sent() {
    let backend = RawBackend::start(
        b"HTTP/1.1 200 OK\r\nService-Credits: 5000\r\n\
          Content-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    .await;
    let gw = Gateway::builder()
        .live(backend.addr)
        .config(|c| c.metering.max_credits_per_request = Credits::from_micros(4_000_000_000))
        .start()
        .await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    // The route's price (1), not 5,000.
    assert_eq!(only_audit_record(&gw).await["credits"], 1.0);
    eventually(Duration::from_secs(5), || async {
        let usage = gw
            .admin_get(&format!("/admin/v1/usage?workspace={DEMO_WS}"))
            .await;
        usage["keys"][&id] == 1.0
    })
    .await
    .expect("the route's price charged to the key");
    let metrics = gw.metrics_text().await;
    assert!(
        metrics.contains("svcgate_reported_credits_refused_total 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_answer_the_backend_cuts_short_is_recorded_as_502_and_not_charged() {
    // Promises 100 bytes, sends 10 and closes.
    let backend = RawBackend::start(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
          Service-Credits: 3\r\nContent-Length: 100\r\n\r\n{\"partial\"",
    )
    .await;
    let gw = Gateway::builder().live(backend.addr).start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = gw.chat(&key).await;
    assert_eq!(
        resp.status(),
        200,
        "the status went out before the body broke"
    );
    assert!(resp.bytes().await.is_err(), "the body is cut short");
    let record = only_audit_record(&gw).await;
    assert_eq!(record["status"], 502);
    assert_eq!(record["credits"], 0.0);
    let usage = gw
        .admin_get(&format!("/admin/v1/usage?workspace={DEMO_WS}"))
        .await;
    assert_eq!(usage["total"], 0.0, "{usage}");
    assert!(usage["keys"].get(&id).is_none(), "{usage}");
}
