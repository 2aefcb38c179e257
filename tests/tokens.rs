//! Scoped tokens: a backend mints one with its key, a browser uses it.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

async fn mint(gw: &Gateway, key: &str, body: Value) -> reqwest::Response {
    gw.request(Method::POST, "/v1/tokens")
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn mint_ok(gw: &Gateway, key: &str, body: Value) -> Value {
    let resp = mint(gw, key, body).await;
    assert_eq!(resp.status(), 201);
    assert!(resp.headers().contains_key("service-request-id"));
    resp.json().await.unwrap()
}

#[tokio::test]
async fn a_minted_token_calls_the_backend_as_its_parent() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (parent_id, key) = gw
        .create_key(
            "live",
            &["tokens:create", "chat.completions:create", "models:read"],
        )
        .await;
    let before = svcgate::ids::unix_now();
    let minted = mint_ok(
        &gw,
        &key,
        json!({"scopes": ["chat.completions:create"], "expires_in": 60, "metadata": {"user": "u_42"}}),
    )
    .await;
    let token = minted["value"].as_str().unwrap();
    assert!(token.starts_with("svc_scoped_"));
    assert_eq!(minted["scopes"], json!(["chat.completions:create"]));
    assert_eq!(minted["metadata"], json!({"user": "u_42"}));
    let expires_at = minted["expires_at"].as_u64().unwrap();
    assert!(
        (before + 60..=before + 62).contains(&expires_at),
        "{expires_at}"
    );

    assert_eq!(gw.chat(token).await.status(), 200);
    let seen = &live.requests()[0];
    assert!(seen.headers.get("authorization").is_none());
    assert_eq!(seen.headers["service-key-id"], parent_id.as_str());
    assert!(seen.headers["service-token-id"]
        .to_str()
        .unwrap()
        .starts_with("tok_"));
    assert_eq!(seen.headers["service-environment"], "live");

    // Only the granted scopes, and no minting.
    let resp = gw
        .request(Method::GET, "/v1/models")
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_error(resp, 403, "permission_error").await;
    let resp = mint(&gw, token, json!({"scopes": ["chat.completions:create"]})).await;
    assert_error(resp, 403, "permission_error").await;

    // Keys never carry a token id upstream, even when a client sends one.
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("service-token-id", "tok_forged")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(live.requests()[1].headers.get("service-token-id").is_none());
}

#[tokio::test]
async fn a_token_spends_its_parents_budget() {
    let gw = Gateway::builder().start().await;
    let (parent_id, key) = gw
        .create_key("live", &["tokens:create", "chat.completions:create"])
        .await;
    let resp = gw
        .admin_request(Method::PATCH, &format!("/admin/v1/keys/{parent_id}"))
        .json(&json!({"monthly_budget": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let minted = mint_ok(&gw, &key, json!({"scopes": ["chat.completions:create"]})).await;
    let token = minted["value"].as_str().unwrap();
    // Two requests at 1 credit each (the simulated backend's price) spend the parent's budget:
    // a token has no budget of its own to hide behind.
    for _ in 0..2 {
        assert_eq!(gw.chat(token).await.status(), 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_error(gw.chat(token).await, 402, "budget_exceeded").await;
    assert_error(gw.chat(&key).await, 402, "budget_exceeded").await;
    let other = mint_ok(&gw, &key, json!({"scopes": ["chat.completions:create"]})).await;
    let other = other["value"].as_str().unwrap();
    assert_error(gw.chat(other).await, 402, "budget_exceeded").await;
}

#[tokio::test]
async fn expires_in_defaults_to_the_maximum() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw
        .create_key("live", &["tokens:create", "models:read"])
        .await;
    let now = svcgate::ids::unix_now();
    let minted = mint_ok(&gw, &key, json!({"scopes": ["models:read"]})).await;
    let expires_at = minted["expires_at"].as_u64().unwrap();
    assert!((now + 900..=now + 902).contains(&expires_at));
    assert_eq!(minted["metadata"], json!({}));
}

#[tokio::test]
async fn bad_token_requests_get_clear_errors() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw
        .create_key("live", &["tokens:create", "chat.completions:create"])
        .await;
    let (_, no_mint) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = mint(
        &gw,
        &no_mint,
        json!({"scopes": ["chat.completions:create"]}),
    )
    .await;
    assert_error(resp, 403, "permission_error").await;

    for body in [
        json!({"scopes": ["chat.completions:create"], "expires_in": 0}),
        json!({"scopes": ["chat.completions:create"], "expires_in": 901}),
        json!({"scopes": ["chat.completions:create"], "expires_in": -5}),
        json!({"scopes": ["chat.completions:create"], "expires_in": "soon"}),
        json!({"scopes": ["chat.completions:create"], "expires_in": null}),
        json!({"scopes": []}),
        json!({"scopes": ["tokens:create"]}),
        json!({"expires_in": 60}),
        json!({"scopes": ["chat.completions:create"], "extra": true}),
        json!({"scopes": ["chat.completions:create"], "metadata": "user"}),
        json!({"scopes": ["chat.completions:create"], "metadata": {"blob": "x".repeat(5000)}}),
        json!([1, 2]),
    ] {
        let resp = mint(&gw, &key, body.clone()).await;
        let status = resp.status();
        assert_eq!(status, 400, "for {body}");
        assert_error(resp, 400, "invalid_request_error").await;
    }
    let resp = gw
        .request(Method::POST, "/v1/tokens")
        .bearer_auth(&key)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = gw
        .request(Method::POST, "/v1/tokens")
        .bearer_auth(&key)
        .body(vec![b'x'; 100_000])
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = mint(&gw, &key, json!({"scopes": ["images:create"]})).await;
    assert_error(resp, 403, "permission_error").await;
}

#[tokio::test]
async fn a_token_dies_with_its_parent_and_follows_its_scopes() {
    let gw = Gateway::builder().start().await;
    let (parent_id, key) = gw
        .create_key("live", &["tokens:create", "chat.completions:create"])
        .await;
    let token = mint_ok(&gw, &key, json!({"scopes": ["chat.completions:create"]})).await["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(gw.chat(&token).await.status(), 200);

    // The parent loses the scope: so does the token.
    gw.admin_request(Method::PATCH, &format!("/admin/v1/keys/{parent_id}"))
        .json(&json!({"scopes": ["tokens:create"]}))
        .send()
        .await
        .unwrap();
    assert_error(gw.chat(&token).await, 403, "permission_error").await;

    gw.revoke(&parent_id).await;
    let body = assert_error(gw.chat(&token).await, 401, "authentication_error").await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("minted from"));
}

#[tokio::test]
async fn a_token_expires() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw
        .create_key("live", &["tokens:create", "chat.completions:create"])
        .await;
    let token = expired_token(&gw, &key).await;
    assert_told_expired(gw.chat(&token).await).await;
}

#[tokio::test]
async fn an_expired_token_is_told_expired_by_a_replica_that_never_saw_it() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let (_, key) = a
        .create_key_in(&ws, "live", &["tokens:create", "chat.completions:create"])
        .await;
    let token = expired_token(&a, &key).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Replica b reads it from Redis for the first time, after it expired: expired, not unknown.
    assert_told_expired(b.chat(&token).await).await;
}

/// A token of `key` minted on `gw` for one second, once `gw` refuses it.
async fn expired_token(gw: &Gateway, key: &str) -> String {
    let token = mint_ok(
        gw,
        key,
        json!({"scopes": ["chat.completions:create"], "expires_in": 1}),
    )
    .await["value"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(Duration::from_secs(5), || async {
        gw.chat(&token).await.status() == 401
    })
    .await
    .expect("the token stops working when it expires");
    token
}

/// A 401 that says the token expired (not that the key is unknown).
async fn assert_told_expired(resp: reqwest::Response) {
    let body = assert_error(resp, 401, "authentication_error").await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{body}"
    );
}

#[tokio::test]
async fn tokens_of_test_keys_never_reach_the_live_backend() {
    let live = RecordingUpstream::start("live").await;
    let sandbox = RecordingUpstream::start("sandbox").await;
    let gw = Gateway::builder()
        .live(live.addr)
        .sandbox(sandbox.addr)
        .start()
        .await;
    let (_, key) = gw
        .create_key("test", &["tokens:create", "chat.completions:create"])
        .await;
    let token = mint_ok(&gw, &key, json!({"scopes": ["chat.completions:create"]})).await["value"]
        .as_str()
        .unwrap()
        .to_string();
    let answer: Value = gw.chat(&token).await.json().await.unwrap();
    assert_eq!(answer["upstream"], "sandbox");
    assert!(live.requests().is_empty());
    assert_eq!(sandbox.requests()[0].headers["service-environment"], "test");
}

#[tokio::test]
async fn a_token_minted_on_one_replica_works_on_another() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let (parent_id, key) = a
        .create_key_in(&ws, "live", &["tokens:create", "chat.completions:create"])
        .await;
    let token = mint_ok(&a, &key, json!({"scopes": ["chat.completions:create"]})).await["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(b.chat(&token).await.status(), 200);
    // Tokens are not keys: they do not show up in the workspace's key list.
    assert_eq!(a.list_keys(&ws).await.len(), 1);
    a.revoke(&parent_id).await;
    eventually(Duration::from_secs(5), || async {
        b.chat(&token).await.status() == 401
    })
    .await
    .expect("the token dies with its parent on every replica");
}
