//! A workspace admin's day in a real browser: sign in by the mailed link; create a key, see it
//! once, call the gateway with it; rotate it and keep the old one in its grace; revoke; set a
//! budget and meet the 402; add a webhook endpoint, watch a delivery and replay it; all of it
//! without sideways scrolling on a 390 px phone.

use serde_json::{json, Value};
use std::time::Duration;

use super::browser::Browser;
use super::*;

async fn chat(gw: &Gateway, key: &str) -> u16 {
    gw.chat(key).await.status().as_u16()
}

#[tokio::test]
async fn a_workspace_admin_manages_keys_and_webhooks_in_the_browser() {
    let ns = TestNamespace::new();
    let sink = SmtpSink::start();
    let receiver = Receiver::start().await;
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(mail_and_hooks(sink.port))
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let browser = Browser::start(1200).await;
    let b = &browser;
    let dash = format!("{}/dashboard", gw.base);

    // Sign in by the mailed link.
    b.goto(&format!("{dash}/sign-in")).await;
    b.screenshot("sign-in").await;
    b.fill("email", ADMIN_EMAIL).await;
    b.press("Sign in").await;
    assert!(b.source().await.contains("Check your e-mail"));
    let link = mailed_link(&sink, ADMIN_EMAIL).await;
    assert!(
        link.starts_with(&format!("{dash}/sign-in/link?token=")),
        "{link}"
    );
    b.goto(&link).await;
    b.press("Sign in").await;
    b.wait_for_path(&format!("/dashboard/w/{ws}")).await;

    // Create a key: the full value once, gone after a reload.
    b.follow("API keys").await;
    b.fill("name", "backend").await;
    b.check("scopes", "chat.completions:create").await;
    b.check("scopes", "models:read").await;
    b.press("Create key").await;
    let key = b.value("new-key").await;
    assert!(key.starts_with("svc_live_"), "{key}");
    assert!(b.source().await.contains("It will not be shown again"));
    b.screenshot("key-created").await;
    b.client.refresh().await.unwrap();
    assert_eq!(b.path().await, format!("/dashboard/w/{ws}/keys"));
    let listed = b.source().await;
    assert!(!listed.contains(&key), "the key is shown once only");
    assert!(
        listed.contains(&key[key.len() - 4..]),
        "its last four are listed"
    );
    assert_eq!(chat(&gw, &key).await, 200, "the key works at the gateway");
    b.screenshot("keys").await;

    // Rotate with a grace of an hour: a new key, and the old one still works.
    b.follow("backend").await;
    b.choose("grace_period_seconds", "3600").await;
    b.press("Rotate").await;
    let rotated = b.value("new-key").await;
    assert!(rotated.starts_with("svc_live_") && rotated != key);
    assert!(b.source().await.contains("keeps working until"));
    assert_eq!(chat(&gw, &rotated).await, 200);
    assert_eq!(chat(&gw, &key).await, 200, "the old key works in its grace");

    // Revoke the new key, after confirming.
    b.goto(&format!("{dash}/w/{ws}/keys")).await;
    let keys = gw.list_keys(&ws).await;
    let new_id = keys
        .iter()
        .find(|k| k["status"] == "active")
        .and_then(|k| k["id"].as_str())
        .unwrap()
        .to_string();
    b.goto(&format!("{dash}/w/{ws}/keys/{new_id}")).await;
    b.screenshot("key").await;
    b.follow("Revoke…").await;
    b.press("Revoke").await;
    assert!(b.source().await.contains("revoked"));
    assert_eq!(chat(&gw, &rotated).await, 401, "revoked at once");

    // A key with a small budget meets the 402.
    b.goto(&format!("{dash}/w/{ws}/keys")).await;
    b.fill("name", "capped").await;
    b.check("scopes", "chat.completions:create").await;
    b.press("Create key").await;
    let capped = b.value("new-key").await;
    let capped_id = gw
        .list_keys(&ws)
        .await
        .iter()
        .find(|k| k["name"] == "capped")
        .and_then(|k| k["id"].as_str())
        .unwrap()
        .to_string();
    b.goto(&format!("{dash}/w/{ws}/keys/{capped_id}")).await;
    b.fill("monthly_budget", "0.000001").await;
    b.press("Set budget").await;
    assert!(b.source().await.contains("0.000001"));
    let mut last = 0;
    for _ in 0..50 {
        last = chat(&gw, &capped).await;
        if last == 402 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, 402, "the budget set in the dashboard is enforced");

    // Add an endpoint, trigger an event, see its delivery, replay it.
    b.goto(&format!("{dash}/w/{ws}/webhooks")).await;
    b.fill("url", &receiver.url("/hook")).await;
    b.check("events", "agent.run.*").await;
    b.press("Add endpoint").await;
    let secret = b.value("new-secret").await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    let event_id = gw
        .publish_event(&ws, "agent.run.completed", "live", json!({"run": "r1"}))
        .await;
    let delivered = eventually(Duration::from_secs(15), || {
        std::future::ready(!receiver.received("/hook").is_empty())
    })
    .await;
    assert!(
        delivered.is_some(),
        "the endpoint added in the browser gets the event"
    );
    let mut succeeded = false;
    for _ in 0..50 {
        b.client.refresh().await.unwrap();
        if b.source().await.contains("data-status=\"succeeded\"") {
            succeeded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(succeeded, "the delivery is listed as succeeded");
    assert!(b.source().await.contains(&event_id));
    b.screenshot("webhook").await;
    b.press("Replay").await;
    let replayed = eventually(Duration::from_secs(15), || {
        std::future::ready(receiver.received("/hook").len() >= 2)
    })
    .await;
    assert!(replayed.is_some(), "Replay delivers the event again");
    let received = receiver.received("/hook");
    let ids: Vec<_> = received
        .iter()
        .map(|r| r.headers["service-event-id"].to_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, [event_id.clone(), event_id.clone()]);

    // Every action is in the audit log, with who made it.
    let audit: Value = gw
        .admin_get(&format!(
            "/admin/v1/audit?workspace={ws}&limit=100&actions=true"
        ))
        .await;
    let actions: Vec<&str> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["actor"] == format!("dashboard:{ADMIN_EMAIL}"))
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    for action in [
        "/keys",
        "/rotate",
        "/revoke",
        "/budget",
        "/webhooks",
        "/replay",
    ] {
        assert!(
            actions.iter().any(|p| p.ends_with(action)),
            "{action} audited: {actions:?}"
        );
    }

    // On a 390 px phone, no page scrolls sideways.
    b.goto(&format!("{dash}/w/{ws}")).await;
    b.screenshot("overview").await;
    b.client.set_window_size(390, 844).await.unwrap();
    for page in [
        format!("{dash}/w/{ws}"),
        format!("{dash}/w/{ws}/keys"),
        format!("{dash}/w/{ws}/keys/{capped_id}"),
        format!("{dash}/w/{ws}/webhooks"),
        format!("{dash}/w/{ws}/audit"),
    ] {
        b.goto(&page).await;
        let (width, viewport) = (b.scroll_width().await, b.inner_width().await);
        assert!(viewport <= 390, "the window is a phone's: {viewport}");
        assert!(width <= 390, "{page} is {width} px wide at 390 px");
    }
    b.goto(&format!("{dash}/w/{ws}/keys")).await;
    b.screenshot("keys-phone").await;

    // Signing out ends the session.
    b.press("Sign out").await;
    b.goto(&format!("{dash}/w/{ws}/keys")).await;
    assert_eq!(b.path().await, "/dashboard/sign-in");
}
