//! The admin API against a hostile caller: short tokens, guessing, unlisted paths, a web page
//! using the demo token through DNS rebinding, oversized and half-failed leak reports.

use reqwest::Method;
use serde_json::{json, Value};

use super::common::*;

#[tokio::test]
async fn a_short_admin_token_on_a_shared_store_is_refused_at_start() {
    let namespace = TestNamespace::new();
    let dir = tempfile::tempdir().unwrap();
    let stderr_path = dir.path().join("stderr");
    let mut child = svcgate_command()
        .arg("serve")
        .env("SVCGATE_STORE_KIND", "redis")
        .env("SVCGATE_STORE_URL", redis_url())
        .env("SVCGATE_STORE_NAMESPACE", &namespace.name)
        .env("SVCGATE_SERVER_ADMIN_TOKEN", "abc")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    // A gateway that accepts the token runs on: it is stopped rather than waited for.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(stderr.contains("server.admin_token"), "{stderr}");
    assert!(stderr.contains("shorter than 16 characters"), "{stderr}");
}

#[tokio::test]
async fn failed_admin_authentications_are_throttled_per_address() {
    let gw = Gateway::builder().start().await;
    let wrong = |token: &'static str| {
        gw.http
            .get(format!("{}/admin/v1/keys?workspace={DEMO_WS}", gw.admin))
            .bearer_auth(token)
            .send()
    };
    for _ in 0..20 {
        assert_error(wrong("guess").await.unwrap(), 401, "authentication_error").await;
    }
    for _ in 0..40 {
        let resp = wrong("guess").await.unwrap();
        let retry: u64 = resp.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        assert_error(resp, 429, "rate_limit_error").await;
    }
    // The right token too, from this address, until the minute is over: a 429 tells nothing
    // of whether a guess was right.
    let resp = gw
        .admin_request(Method::GET, &format!("/admin/v1/keys?workspace={DEMO_WS}"))
        .send()
        .await
        .unwrap();
    assert_error(resp, 429, "rate_limit_error").await;
    // The probes need no token and are not throttled.
    let resp = gw.http.get(format!("{}/healthz", gw.admin)).send().await;
    assert_eq!(resp.unwrap().status(), 200);
}

#[tokio::test]
async fn unmatched_admin_paths_need_the_token() {
    let gw = Gateway::builder().start().await;
    for path in [
        "/admin/v1/nope",
        "/admin/v1/keys/key_1/nope",
        "/admin/v2",
        "/nope",
    ] {
        let resp = gw
            .http
            .get(format!("{}{path}", gw.admin))
            .send()
            .await
            .unwrap();
        assert_error(resp, 401, "authentication_error").await;
        let resp = gw.admin_request(Method::GET, path).send().await.unwrap();
        assert_error(resp, 404, "not_found").await;
    }
    let resp = gw.http.get(format!("{}/readyz", gw.admin)).send().await;
    assert_eq!(resp.unwrap().status(), 200);
}

#[tokio::test]
async fn the_demo_token_needs_a_loopback_host() {
    let gw = Gateway::builder()
        .config(|c| c.server.admin_token = "change-me".to_string())
        .start()
        .await;
    let port = gw.admin.rsplit(':').next().unwrap().to_string();
    let call = |host: String| {
        gw.http
            .get(format!("{}/admin/v1/keys?workspace={DEMO_WS}", gw.admin))
            .bearer_auth("change-me")
            .header("host", host)
            .send()
    };
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_string(),
    ] {
        let resp = call(host.clone()).await.unwrap();
        assert_eq!(resp.status(), 200, "{host}");
    }
    for host in [
        format!("evil.example:{port}"),
        "rebind.evil.example".to_string(),
        format!("localhost.evil.example:{port}"),
    ] {
        let resp = call(host.clone()).await.unwrap();
        let body = assert_error(resp, 403, "permission_error").await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("loopback Host"), "{host}: {message}");
    }
}

async fn report(gw: &Gateway, body: Value) -> reqwest::Response {
    gw.admin_request(Method::POST, "/admin/v1/leaks")
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn leak_report_fields_are_capped() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("live", &["models:read"]).await;
    let long = |n: usize| "x".repeat(n);
    for (item, field) in [
        (json!({"token": long(513)}), "'token'"),
        (json!({"token": key, "url": long(2_049)}), "'url'"),
        (json!({"token": key, "source": long(257)}), "'source'"),
        (json!({"token": key, "type": long(257)}), "'type'"),
    ] {
        let resp = report(&gw, json!([{"token": "svc_live_nothing"}, item])).await;
        let body = assert_error(resp, 400, "invalid_request_error").await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
        assert!(message.starts_with("token 1:"), "{message}");
    }
    let many: Vec<Value> = (0..1_001).map(|_| json!({"token": "x"})).collect();
    assert_error(report(&gw, json!(many)).await, 400, "invalid_request_error").await;
    // Nothing was done for a refused report.
    let shown = gw.admin_get(&format!("/admin/v1/keys/{id}")).await;
    assert_eq!(shown["status"], "active", "{shown}");
    // At the caps, accepted.
    let resp = report(
        &gw,
        json!([{"token": key, "url": long(2_048), "source": long(256), "type": long(256)}]),
    )
    .await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_store_failure_mid_report_names_the_keys_revoked_before_it() {
    let namespace = TestNamespace::new();
    let gw = on_redis(&namespace).await;
    let ws = gw.create_workspace().await;
    let (first_id, first) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    let (_, second) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    let (third_id, third) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    // The second key's record made unreadable: looking it up fails as a store failure does.
    let digest = svcgate::keys::format::KeyHash::of(&second).to_hex();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{}*:h:{digest}", namespace.name))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(names.len(), 1, "{names:?}");
    redis::cmd("SET")
        .arg(&names[0])
        .arg("not json")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();

    let resp = report(
        &gw,
        json!([{"token": first}, {"token": second}, {"token": third}]),
    )
    .await;
    let body = assert_error(resp, 503, "service_unavailable").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("the first 1 of 3 tokens"), "{message}");
    assert!(
        message.contains(&format!("keys revoked: {first_id}")),
        "{message}"
    );
    assert!(!message.contains(&third_id), "{message}");
    let shown = gw.admin_get(&format!("/admin/v1/keys/{first_id}")).await;
    assert_eq!(shown["status"], "revoked", "{shown}");
    let shown = gw.admin_get(&format!("/admin/v1/keys/{third_id}")).await;
    assert_eq!(shown["status"], "active", "{shown}");
}
