//! Leaked-key reports from a secret scanner.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

async fn report(gw: &Gateway, body: Value) -> reqwest::Response {
    gw.admin_request(Method::POST, "/admin/v1/leaks")
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn live_keys_are_revoked_and_others_reported() {
    let gw = Gateway::builder().start().await;
    let (live_id, live) = gw
        .create_key("live", &["chat.completions:create", "tokens:create"])
        .await;
    let (test_id, test) = gw.create_key("test", &["chat.completions:create"]).await;
    let (_, minter) = gw
        .create_key("live", &["chat.completions:create", "tokens:create"])
        .await;
    let scoped = gw
        .mint_token(&minter, json!({"scopes": ["chat.completions:create"]}))
        .await;
    let unknown = svcgate::keys::format::generate(svcgate::keys::Environment::Live).value;

    let resp = report(
        &gw,
        json!([
            {"token": live, "url": "https://example.com/paste/1", "source": "paste"},
            {"token": test},
            {"token": scoped},
            {"token": unknown},
            {"token": "not-a-key-at-all"},
        ]),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    for secret in [&live, &test, &scoped, &unknown] {
        assert!(
            !text.contains(secret.as_str()),
            "a reported token is echoed"
        );
    }
    let results: Vec<Value> = serde_json::from_str(&text).unwrap();
    let actions: Vec<&str> = results
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["revoked", "ignored", "revoked", "not_found", "not_found"]
    );
    assert_eq!(results[0]["key_id"], live_id.as_str());
    assert_eq!(results[0]["token_last4"], &live[live.len() - 4..]);
    assert_eq!(results[1]["key_id"], test_id.as_str());
    assert_eq!(results[3]["key_id"], Value::Null);

    assert_error(gw.chat(&live).await, 401, "authentication_error").await;
    assert_eq!(
        gw.chat(&test).await.status(),
        200,
        "test keys are not revoked"
    );
    // A live key's token goes alone: the key it was minted from keeps working.
    assert_error(gw.chat(&scoped).await, 401, "authentication_error").await;
    assert_eq!(gw.chat(&minter).await.status(), 200);
    assert!(!gw.logs().contains(&live));
}

#[tokio::test]
async fn a_revocation_logs_one_key_auto_revoked_event_without_the_secret() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let (id, key) = gw.create_key_in(&ws, "live", &["models:read"]).await;

    // GitHub's partner-alert body, as it is.
    let alert = json!([{"token": key, "type": "svcgate_live_api_key", "url": "https://github.com/o/r/blob/x/config.py", "source": "content"}]);
    for _ in 0..2 {
        let results: Vec<Value> = report(&gw, alert.clone()).await.json().await.unwrap();
        assert_eq!(results[0]["action"], "revoked");
    }

    let entries = ns.logged_events().await;
    assert_eq!(entries.len(), 1, "one event however often it is reported");
    let entry = &entries[0];
    let field = |name: &str| -> String { entry.get(name).unwrap() };
    assert_eq!(field("type"), "key.auto_revoked");
    assert_eq!(field("workspace"), ws);
    assert_eq!(field("environment"), "live");
    assert!(field("id").starts_with("evt_"));
    let data: Value = serde_json::from_str(&field("data")).unwrap();
    assert_eq!(data["key_id"], id.as_str());
    assert_eq!(data["last4"], &key[key.len() - 4..]);
    assert_eq!(data["prefix"], "svc_live_");
    assert_eq!(data["url"], "https://github.com/o/r/blob/x/config.py");
    assert!(!field("data").contains(&key));
}

#[tokio::test]
async fn a_bad_report_revokes_nothing() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    for body in [
        json!({"token": key}),
        json!([{"token": key}, {"url": "https://x.example"}]),
        json!([{"token": key}, 5]),
        json!("svc_live_x"),
    ] {
        assert_error(report(&gw, body).await, 400, "invalid_request_error").await;
    }
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/leaks")
        .header("content-type", "application/json")
        .body("[{")
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = gw
        .http
        .post(format!("{}/admin/v1/leaks", gw.admin))
        .json(&json!([{"token": key}]))
        .send()
        .await
        .unwrap();
    assert_error(resp, 401, "authentication_error").await;
    assert_eq!(gw.chat(&key).await.status(), 200, "nothing was revoked");
}

#[tokio::test]
async fn a_leaked_token_is_revoked_alone_and_still_expires_on_redis() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let (_, minter) = gw
        .create_key_in(&ws, "live", &["chat.completions:create", "tokens:create"])
        .await;
    let token = gw
        .mint_token(
            &minter,
            json!({"scopes": ["chat.completions:create"], "expires_in": 600}),
        )
        .await;
    assert_eq!(gw.chat(&token).await.status(), 200);

    let resp = report(&gw, json!([{"token": token}])).await;
    let results: Vec<Value> = resp.json().await.unwrap();
    assert_eq!(results[0]["action"], "revoked");
    let token_id = results[0]["key_id"].as_str().unwrap().to_string();
    assert!(token_id.starts_with("tok_"), "{token_id}");
    assert_error(gw.chat(&token).await, 401, "authentication_error").await;
    assert_eq!(gw.chat(&minter).await.status(), 200);

    // The admin API shows it revoked, and refuses to change it.
    let shown = gw.admin_get(&format!("/admin/v1/keys/{token_id}")).await;
    assert_eq!(shown["status"], "revoked");
    let resp = gw
        .admin_request(Method::POST, &format!("/admin/v1/keys/{token_id}/rotate"))
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;

    // Revoked, its record still expires with the token (kept an hour past it, to say "expired").
    let hash = svcgate::keys::KeyHash::of(&token).to_hex();
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ttl: i64 = redis::cmd("TTL")
        .arg(format!("{{{}}}:keys:h:{hash}", ns.name))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((3_601..=4_200).contains(&ttl), "ttl {ttl}");
}

#[tokio::test]
async fn a_secret_sent_where_it_does_not_belong_is_not_repeated_in_the_error() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw
        .create_key("live", &["tokens:create", "webhooks:write"])
        .await;
    // A parser's message quotes the value it could not take: here, the caller's own key.
    let resp = gw
        .request(Method::POST, "/v1/tokens")
        .bearer_auth(&key)
        .json(&json!({"scopes": key}))
        .send()
        .await
        .unwrap();
    let body = assert_error(resp, 400, "invalid_request_error").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(!message.contains(&key[9..]), "{message}");
    assert!(message.contains(&key[key.len() - 4..]), "{message}");
    let secret = "whsec_4fJk29dLqPz8XcVb7NmA1sD3gH5jK6lQ";
    let resp = gw
        .request(Method::POST, "/v1/webhooks")
        .bearer_auth(&key)
        .json(&json!({"url": secret, "events": secret}))
        .send()
        .await
        .unwrap();
    let body = assert_error(resp, 400, "invalid_request_error").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(!message.contains(&secret[6..]), "{message}");
}
