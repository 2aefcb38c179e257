//! GitHub's secret-scanning partner alerts, signed with a P-256 key made here standing in for
//! GitHub's, whose public half a local server publishes as GitHub does.

use base64::Engine;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{EncodePublicKey, LineEnding};
use serde_json::{json, Value};
use std::path::Path;

use super::common::*;
use super::{auto_revoked, mails};

const ALERTS: &str = "/v1/secret-scanning/github";

fn signing_key() -> SigningKey {
    SigningKey::from_slice(&rand::random::<[u8; 32]>()).unwrap()
}

/// Serves `{"public_keys": [...]}` for `keys` on loopback; its URL.
async fn publish(keys: &[(&str, &SigningKey)]) -> String {
    let list: Vec<Value> = keys
        .iter()
        .map(|(id, k)| {
            let pem = k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
            json!({"key_identifier": id, "key": pem, "is_current": true})
        })
        .collect();
    let body = json!({ "public_keys": list }).to_string();
    let app = axum::Router::new().route(
        "/meta/public_keys/secret_scanning",
        axum::routing::get(move || async move { body }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/meta/public_keys/secret_scanning")
}

fn sign(key: &SigningKey, body: &[u8]) -> String {
    let sig: Signature = key.sign(body);
    base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes())
}

async fn alert(gw: &Gateway, body: &str, signed: Option<(&str, String)>) -> reqwest::Response {
    let mut req = gw
        .request(reqwest::Method::POST, ALERTS)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some((id, sig)) = signed {
        req = req
            .header("Github-Public-Key-Identifier", id)
            .header("Github-Public-Key-Signature", sig);
    }
    req.send().await.unwrap()
}

async fn gateway(ns: &TestNamespace, keys_url: String, outbox: &Path) -> Gateway {
    let outbox = outbox.display().to_string();
    Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(move |c| {
            c.scanners.github_keys_url = keys_url;
            c.webhooks.outbox_dir = outbox;
        })
        .start()
        .await
}

#[tokio::test]
async fn an_unsigned_or_wrongly_signed_alert_is_refused_and_revokes_nothing() {
    let ns = TestNamespace::new();
    let github = signing_key();
    let outbox = tempfile::tempdir().unwrap();
    let gw = gateway(&ns, publish(&[("gh-1", &github)]).await, outbox.path()).await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let body = json!([{"token": key, "type": "svcgate_live_key", "url": "https://github.com/o/r/blob/1/a.py", "source": "content"}]).to_string();

    let impostor = signing_key();
    for signed in [
        None,
        Some(("gh-1", sign(&impostor, body.as_bytes()))),
        Some(("gh-1", sign(&github, b"another body"))),
        Some(("gh-1", "bm90IGEgc2lnbmF0dXJl".to_string())),
        Some(("not-published", sign(&github, body.as_bytes()))),
    ] {
        let label = format!("{:?}", signed.as_ref().map(|(id, _)| *id));
        let resp = alert(&gw, &body, signed).await;
        assert_eq!(resp.status(), 401, "{label}");
        let text = resp.text().await.unwrap();
        assert!(text.contains("authentication_error"), "{text}");
        assert!(
            !text.contains(&key),
            "the token is not echoed to an unsigned caller"
        );
    }
    assert_eq!(gw.chat(&key).await.status(), 200, "nothing was revoked");
    assert!(auto_revoked(&ns).await.is_empty());
    assert!(mails(outbox.path()).is_empty());
}

#[tokio::test]
async fn a_github_signed_alert_revokes_the_live_key_and_fires_key_auto_revoked() {
    let ns = TestNamespace::new();
    let github = signing_key();
    let outbox = tempfile::tempdir().unwrap();
    let gw = gateway(&ns, publish(&[("gh-1", &github)]).await, outbox.path()).await;
    let ws = gw.create_workspace().await;
    let (live_id, live) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let (_, test) = gw
        .create_key_in(&ws, "test", &["chat.completions:create"])
        .await;
    let url = "https://github.com/o/r/blob/abc/config.py";
    let body = json!([
        {"token": live, "type": "svcgate_live_api_key", "url": url, "source": "content"},
        {"token": test, "type": "svcgate_test_api_key", "url": url, "source": "content"},
        {"token": "svc_live_notakeyatall", "type": "svcgate_live_api_key", "url": url, "source": "content"},
    ])
    .to_string();

    let resp = alert(&gw, &body, Some(("gh-1", sign(&github, body.as_bytes())))).await;
    assert_eq!(resp.status(), 200);
    let answer: Vec<Value> = resp.json().await.unwrap();
    let labels: Vec<&str> = answer
        .iter()
        .map(|a| a["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["true_positive", "true_positive", "false_positive"]);
    assert_eq!(answer[0]["token_raw"], live.as_str());
    assert_eq!(answer[0]["token_type"], "svcgate_live_api_key");

    assert_error(gw.chat(&live).await, 401, "authentication_error").await;
    assert_eq!(
        gw.chat(&test).await.status(),
        200,
        "a test key is reported, not revoked"
    );

    let events = auto_revoked(&ns).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let (workspace, data) = &events[0];
    assert_eq!(workspace, &ws);
    assert_eq!(data["key_id"], live_id.as_str());
    assert_eq!(data["url"], url);
    assert_eq!(data["source"], "content");

    let audit = gw
        .admin_get(&format!(
            "/admin/v1/audit?workspace={ws}&key_id={live_id}&actions=true"
        ))
        .await;
    let actors: Vec<&str> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["actor"].as_str())
        .collect();
    assert!(actors.contains(&"scanner:github:revoked"), "{audit}");

    // Mailed before the alert is answered.
    let sent = mails(outbox.path());
    assert!(
        sent.iter()
            .any(|m| m.contains("ops@example.com") && m.contains("revoked")),
        "{sent:?}"
    );
    assert!(
        mails(outbox.path()).iter().all(|m| !m.contains(&live)),
        "the key is not in the mail"
    );
    let metrics = gw.metrics_text().await;
    assert!(
        metrics.contains(r#"svcgate_leaked_keys_total{action="revoked",scanner="github"} 1"#),
        "{metrics}"
    );
}
