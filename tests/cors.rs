//! Browser apps: CORS preflights and headers for `[cors] allowed_origins`, and live keys kept
//! out of browsers.

mod common;

use common::*;
use reqwest::Method;
use serde_json::json;

const APP: &str = "https://app.example.com";

fn preflight(gw: &Gateway, origin: &str, method: &str, path: &str) -> reqwest::RequestBuilder {
    gw.request(Method::OPTIONS, path)
        .header("Origin", origin)
        .header("Access-Control-Request-Method", method)
        .header(
            "Access-Control-Request-Headers",
            "authorization, content-type",
        )
}

/// A gateway that lets `APP` in, in front of a recording backend.
async fn app_gateway() -> (Gateway, RecordingUpstream) {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder()
        .live(live.addr)
        .config(|c| c.cors.allowed_origins = vec![APP.to_string()])
        .start()
        .await;
    (gw, live)
}

#[tokio::test]
async fn an_allowed_origin_gets_preflights_and_reads_answers_with_a_scoped_token() {
    let (gw, live) = app_gateway().await;

    // The preflight needs no credentials (browsers send none) and names what may be sent.
    let resp = preflight(&gw, APP, "POST", "/v1/chat/completions")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let h = resp.headers();
    assert_eq!(h["access-control-allow-origin"], APP);
    assert_eq!(h["access-control-allow-methods"], "POST");
    let allowed = h["access-control-allow-headers"].to_str().unwrap();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"));
    assert_eq!(h["access-control-max-age"], "600");
    assert_eq!(h["vary"], "Origin");
    assert!(h.contains_key("service-request-id"));

    // The page calls with a scoped token its backend minted: proxied, and readable.
    let (_, minter) = gw
        .create_key("live", &["chat.completions:create", "tokens:create"])
        .await;
    let token = gw
        .mint_token(&minter, json!({"scopes": ["chat.completions:create"]}))
        .await;
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .header("Origin", APP)
        .bearer_auth(&token)
        .json(&json!({"model": "m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["access-control-allow-origin"], APP);
    let exposed = resp.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap();
    for name in ["service-request-id", "ratelimit-remaining", "retry-after"] {
        assert!(exposed.contains(name), "{name} not exposed: {exposed}");
    }
    assert_eq!(live.requests().len(), 1);

    // An error is readable too (a browser shows nothing of an answer without the header).
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .header("Origin", APP)
        .bearer_auth("svc_scoped_nonsense")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["access-control-allow-origin"], APP);
    assert_error(resp, 401, "authentication_error").await;
}

#[tokio::test]
async fn live_keys_are_refused_from_a_browser_and_other_origins_get_no_preflight() {
    let (gw, live) = app_gateway().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let from_browser = gw
        .request(Method::POST, "/v1/chat/completions")
        .header("Origin", APP)
        .bearer_auth(&key)
        .json(&json!({"model": "m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(from_browser.headers()["access-control-allow-origin"], APP);
    let body = assert_error(from_browser, 403, "permission_error").await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("scoped token"));
    assert!(live.requests().is_empty(), "the backend saw nothing");
    // The same key from a backend (no Origin) works.
    assert_eq!(gw.chat(&key).await.status(), 200);

    let resp = preflight(
        &gw,
        "https://evil.example.com",
        "POST",
        "/v1/chat/completions",
    )
    .send()
    .await
    .unwrap();
    assert!(!resp.headers().contains_key("access-control-allow-origin"));
    assert_error(resp, 403, "permission_error").await;
    let resp = preflight(&gw, APP, "DELETE", "/v1/chat/completions")
        .send()
        .await
        .unwrap();
    assert_error(resp, 404, "not_found").await;
}

#[tokio::test]
async fn without_allowed_origins_browsers_get_no_cors_at_all() {
    let gw = Gateway::builder().start().await;
    let resp = preflight(&gw, APP, "POST", "/v1/chat/completions")
        .send()
        .await
        .unwrap();
    assert!(!resp.headers().contains_key("access-control-allow-origin"));
    assert_error(resp, 401, "authentication_error").await;
}

#[test]
fn an_origin_with_a_path_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svcgate.toml");
    std::fs::write(
        &path,
        "[cors]\nallowed_origins = [\"https://app.example.com/\"]\n",
    )
    .unwrap();
    let out = svcgate_command()
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cors.allowed_origins"));
}
