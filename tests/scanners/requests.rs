//! The scanners of the request path: live keys sent by web pages, keys in request bodies,
//! webhook URLs and event payloads.

use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;
use svcgate::config::FoundKeyAction;

use super::auto_revoked;
use super::common::*;

/// Whether `key` is refused (401) within a few seconds.
async fn refused_soon(gw: &Gateway, key: &str) -> bool {
    eventually(Duration::from_secs(5), || async {
        gw.chat(key).await.status() == 401
    })
    .await
    .is_some()
}

async fn from_page(gw: &Gateway, key: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = gw.request(Method::GET, "/v1/models").bearer_auth(key);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap()
}

async fn audit_actors(gw: &Gateway, key_id: &str) -> Vec<String> {
    let audit = gw
        .admin_get(&format!(
            "/admin/v1/audit?workspace={DEMO_WS}&key_id={key_id}&actions=true"
        ))
        .await;
    audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["actor"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_live_key_from_a_web_page_is_refused_and_reported_by_default() {
    let gw = Gateway::builder().start().await;
    let (id, live) = gw.create_key("live", &["models:read"]).await;
    let (_, test) = gw.create_key("test", &["models:read"]).await;
    for headers in [
        &[("Origin", "https://shop.example")][..],
        &[("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Mode", "cors")],
    ] {
        let body = assert_error(
            from_page(&gw, &live, headers).await,
            403,
            "permission_error",
        )
        .await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("scoped token"), "{message}");
    }
    assert_eq!(
        from_page(&gw, &test, &[("Origin", "https://shop.example")])
            .await
            .status(),
        200
    );
    // From a server it still works: reported, not revoked.
    assert_eq!(from_page(&gw, &live, &[]).await.status(), 200);
    let found = eventually(Duration::from_secs(5), || async {
        audit_actors(&gw, &id)
            .await
            .iter()
            .any(|a| a == "scanner:browser:reported")
    })
    .await;
    assert!(found.is_some(), "{:?}", audit_actors(&gw, &id).await);
    let metrics = gw.metrics_text().await;
    assert!(
        metrics.contains(r#"svcgate_leaked_keys_total{action="reported",scanner="browser"}"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_live_key_from_a_web_page_is_revoked_when_configured() {
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(|c| c.scanners.live_key_in_browser = FoundKeyAction::Revoke)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (id, live) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&live)
        .header("Origin", "https://shop.example")
        .json(&json!({"messages": []}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 403, "permission_error").await;
    assert!(refused_soon(&gw, &live).await, "revoked as leaked");
    let events = auto_revoked(&ns).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1["key_id"], id.as_str());
    assert_eq!(events[0].1["source"], "browser");
    assert_eq!(events[0].1["url"], "https://shop.example");
}

#[tokio::test]
async fn a_key_in_a_request_body_is_reported_or_revoked_as_configured() {
    let backend = RecordingUpstream::start("live").await;
    let gw = Gateway::builder()
        .live(backend.addr)
        .config(|c| c.scanners.key_in_body = FoundKeyAction::Revoke)
        .start()
        .await;
    let (_, caller) = gw.create_key("live", &["chat.completions:create"]).await;
    let (pasted_id, pasted) = gw.create_key("live", &["models:read"]).await;
    let (_, sandbox) = gw.create_key("test", &["chat.completions:create"]).await;
    let (other_id, other) = gw.create_key("live", &["models:read"]).await;
    let prompt = |key: &str| json!({"model": "m1", "messages": [{"role": "user", "content": format!("why does {key} fail?")}]});
    // Forwarded: the body reaches the backend as it was sent.
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&caller)
        .json(&prompt(&pasted))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(refused_soon(&gw, &pasted).await, "revoked as leaked");
    assert_eq!(
        gw.chat(&caller).await.status(),
        200,
        "the caller's own key stays"
    );
    // Answered by the simulator (a test key) just the same.
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&sandbox)
        .json(&prompt(&other))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(refused_soon(&gw, &other).await, "revoked as leaked");
    for id in [&pasted_id, &other_id] {
        let actors = audit_actors(&gw, id).await;
        assert!(
            actors.iter().any(|a| a == "scanner:request_body:revoked"),
            "{actors:?}"
        );
    }
}

#[tokio::test]
async fn keys_in_webhook_urls_and_event_payloads_are_refused() {
    let gw = Gateway::builder()
        .config(|c| c.webhooks.allow_insecure_targets = true)
        .start()
        .await;
    let (_, key) = gw.create_key("test", &["webhooks:write"]).await;
    let (_, leaked) = gw.create_key("live", &["models:read"]).await;
    let escaped = leaked.replacen('_', "%5F", 2);
    for url in [
        format!("https://hooks.example/in?token={leaked}"),
        format!("https://hooks.example/{escaped}"),
    ] {
        let resp = gw
            .request(Method::POST, "/v1/webhooks")
            .bearer_auth(&key)
            .json(&json!({"url": url, "events": ["image.batch.completed"]}))
            .send()
            .await
            .unwrap();
        let body = assert_error(resp, 400, "invalid_request_error").await;
        assert!(!body.to_string().contains(&leaked), "{body}");
    }
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/events")
        .json(&json!({"workspace": DEMO_WS, "type": "image.batch.completed", "data": {"note": leaked}}))
        .send()
        .await
        .unwrap();
    let body: Value = assert_error(resp, 400, "invalid_request_error").await;
    assert!(!body.to_string().contains(&leaked), "{body}");
}
