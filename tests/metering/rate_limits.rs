//! Rate limits per key and environment, shared by replicas, and what they count.

use super::*;

#[tokio::test]
async fn rate_limits_answer_429_with_headers_and_are_shared_by_replicas() {
    let ns = TestNamespace::new();
    let limits = |c: &mut Config| {
        c.limits.live_requests_per_minute = 6;
        c.limits.live_burst = 6;
    };
    let a = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(limits)
        .start()
        .await;
    let b = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(limits)
        .start()
        .await;
    let ws = a.create_workspace().await;
    let (_, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let resp = a.chat(&key).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["ratelimit-limit"], "6");
    assert_eq!(resp.headers()["ratelimit-remaining"], "5");
    assert!(resp.headers().contains_key("ratelimit-reset"));
    for _ in 0..2 {
        assert_eq!(a.chat(&key).await.status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    // b has seen none of them itself; from its first flush after seeing the key it knows of
    // all of them (until then it can admit what one flush interval allows: the documented
    // bound).
    assert_eq!(b.chat(&key).await.status(), 200);
    tokio::time::sleep(Duration::from_millis(150)).await;
    for _ in 0..2 {
        assert_eq!(b.chat(&key).await.status(), 200);
    }
    let resp = b.chat(&key).await;
    assert!(resp.headers().contains_key("retry-after"));
    assert_eq!(resp.headers()["ratelimit-remaining"], "0");
    assert_error(resp, 429, "rate_limit_error").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_error(a.chat(&key).await, 429, "rate_limit_error").await;
}

#[tokio::test]
async fn by_default_a_test_key_s_limit_is_at_least_a_live_key_s() {
    let gw = Gateway::builder().start().await;
    let (_, live) = gw.create_key("live", &["chat.completions:create"]).await;
    let (_, test) = gw.create_key("test", &["chat.completions:create"]).await;
    let limit = |resp: reqwest::Response| -> u64 {
        assert_eq!(resp.status(), 200);
        resp.headers()["ratelimit-limit"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (live, test) = (limit(gw.chat(&live).await), limit(gw.chat(&test).await));
    assert!(test >= live, "test {test} < live {live}");
}

#[tokio::test]
async fn test_keys_have_limits_of_their_own() {
    let gw = Gateway::builder()
        .config(|c| {
            c.limits.live_requests_per_minute = 2;
            c.limits.live_burst = 2;
            c.limits.test_requests_per_minute = 4;
            c.limits.test_burst = 4;
        })
        .start()
        .await;
    let (_, live) = gw.create_key("live", &["chat.completions:create"]).await;
    let (_, test) = gw.create_key("test", &["chat.completions:create"]).await;
    for _ in 0..2 {
        assert_eq!(gw.chat(&live).await.status(), 200);
    }
    assert_error(gw.chat(&live).await, 429, "rate_limit_error").await;
    let first = gw.chat(&test).await;
    assert_eq!(first.headers()["ratelimit-limit"], "4");
    for _ in 0..3 {
        assert_eq!(gw.chat(&test).await.status(), 200);
    }
    assert_error(gw.chat(&test).await, 429, "rate_limit_error").await;
}

#[tokio::test]
async fn a_head_request_is_not_charged_the_routes_price() {
    let gw = Gateway::builder()
        .config(|c| {
            c.routes = vec![RouteConfig {
                method: "GET".to_string(),
                path: "/v1/files/{id}".to_string(),
                scope: "files:read".to_string(),
                price: Credits::from_micros(2_000_000),
                upgrade: false,
                reserve: None,
            }]
        })
        .start()
        .await;
    let (id, key) = gw.create_key("live", &["files:read"]).await;
    for method in [Method::HEAD, Method::GET] {
        // A listing orders the records of one millisecond by request id: the requests arrive
        // in different milliseconds, so the listing's order is theirs.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let resp = gw
            .request(method, "/v1/files/file_1")
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let records = eventually(Duration::from_secs(5), || async {
        audit(&gw, &format!("workspace={DEMO_WS}&key_id={id}"))
            .await
            .len()
            == 2
    })
    .await;
    assert!(records.is_some(), "both requests are audited");
    let records = audit(&gw, &format!("workspace={DEMO_WS}&key_id={id}")).await;
    let charged: Vec<(&str, f64)> = records
        .iter()
        .map(|r| {
            (
                r["method"].as_str().unwrap(),
                r["credits"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(charged, [("GET", 2.0), ("HEAD", 0.0)], "newest first");
}

#[tokio::test]
async fn refused_requests_count_against_the_keys_rate_limit() {
    let gw = Gateway::builder()
        .config(|c| {
            c.limits.live_requests_per_minute = 3;
            c.limits.live_burst = 3;
        })
        .start()
        .await;
    let (_, key) = gw.create_key("live", &["models:read"]).await;
    let get = |path: &'static str| {
        let req = gw.request(Method::GET, path).bearer_auth(&key);
        async move { req.send().await.unwrap() }
    };
    // Each refusal is answered as such, with the rate headers, and spends the limit.
    let resp = get("/v1/nowhere").await;
    assert_eq!(resp.headers()["ratelimit-remaining"], "2");
    assert_error(resp, 404, "not_found").await;
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .json(&json!({"model": "m1", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 403, "permission_error").await;
    assert_eq!(get("/v1/models").await.status(), 200);
    // Spent: a refusal, and a request that would be served, are both 429 now.
    let resp = get("/v1/nowhere").await;
    assert!(resp.headers().contains_key("retry-after"));
    assert_error(resp, 429, "rate_limit_error").await;
    assert_error(get("/v1/models").await, 429, "rate_limit_error").await;
}

#[tokio::test]
async fn a_refused_budget_is_counted_by_reason() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    set_key_budget(&gw, &id, 0.5).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    assert_error(gw.chat(&key).await, 402, "budget_exceeded").await;
    let counted = eventually(Duration::from_secs(5), || async {
        gw.metrics_text()
            .await
            .contains(r#"svcgate_policy_rejections_total{reason="budget_key"} 1"#)
    })
    .await;
    assert!(counted.is_some(), "the 402 is counted as budget_key");
}
