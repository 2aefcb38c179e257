//! Keys on Redis: several gateway replicas sharing one store, revocation reaching all of
//! them, and what happens when Redis goes away and comes back.

mod common;

use common::*;
use reqwest::Method;
use std::time::Duration;

#[tokio::test]
async fn replicas_share_keys_and_a_revocation_reaches_every_replica() {
    let ns = TestNamespace::new();
    let a = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .start()
        .await;
    let b = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .start()
        .await;
    let ws = a.create_workspace().await;
    let (id, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;

    // Both replicas accept it, and both now hold it in their caches.
    for gw in [&a, &b] {
        for _ in 0..3 {
            assert_eq!(gw.chat(&key).await.status(), 200);
        }
    }
    let resp = a
        .admin_request(Method::POST, &format!("/admin/v1/keys/{id}/revoke"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The replica that revoked it refuses it at once …
    assert_eq!(a.chat(&key).await.status(), 401);
    // … and the other one as soon as the change reaches it.
    let took = eventually(Duration::from_secs(5), || async {
        b.chat(&key).await.status() == 401
    })
    .await
    .expect("replica b refuses the revoked key");
    eprintln!("revocation reached the other replica after {took:?}");
}

#[tokio::test]
async fn keys_outlive_gateway_restarts() {
    let ns = TestNamespace::new();
    let ws;
    let key;
    {
        let gw = Gateway::builder()
            .redis(&redis_url(), &ns.name)
            .start()
            .await;
        ws = gw.create_workspace().await;
        key = gw.create_key_in(&ws, "live", &["models:read"]).await.1;
    }
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .start()
        .await;
    let resp = gw
        .request(Method::GET, "/v1/models")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let listed: serde_json::Value = gw
        .admin_request(Method::GET, &format!("/admin/v1/keys?workspace={ws}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn the_redis_store_starts_without_a_demo_workspace() {
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .start()
        .await;
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .json(&serde_json::json!({"workspace": DEMO_WS, "environment": "live", "scopes": ["a:b"]}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 404, "not_found").await;
}

#[tokio::test]
async fn when_redis_is_down_cached_keys_work_and_unknown_ones_get_503() {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), "outage")
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, cached) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let (_, uncached) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    assert_eq!(gw.chat(&cached).await.status(), 200);

    redis.stop().await;
    assert_eq!(
        gw.chat(&cached).await.status(),
        200,
        "cached key keeps working"
    );
    // A key that may well be valid is never refused with 401 while the store is away.
    assert_error(gw.chat(&uncached).await, 503, "service_unavailable").await;
    let resp = gw.request(Method::GET, "/readyz").send().await.unwrap();
    assert_error(resp, 503, "service_unavailable").await;
    let resp = gw
        .http
        .get(format!("{}/readyz", gw.admin))
        .send()
        .await
        .unwrap();
    assert_error(resp, 503, "service_unavailable").await;
    // Admin writes fail cleanly.
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .json(&serde_json::json!({"workspace": ws, "environment": "live", "scopes": ["a:b"]}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 503, "service_unavailable").await;

    redis.resume().await;
    eventually(Duration::from_secs(10), || async {
        gw.request(Method::GET, "/readyz")
            .send()
            .await
            .unwrap()
            .status()
            == 200
    })
    .await
    .expect("ready again once Redis is back");
    assert_eq!(gw.chat(&uncached).await.status(), 200);
    assert_eq!(gw.chat(&cached).await.status(), 200);
}

#[tokio::test]
async fn cached_keys_are_trusted_only_for_the_configured_staleness() {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), "stale")
        .store_settings("cache_staleness_seconds = 1\nsync_interval_ms = 100")
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    redis.stop().await;
    eventually(Duration::from_secs(10), || async {
        gw.chat(&key).await.status() == 503
    })
    .await
    .expect("a cached key is refused with 503 once the staleness bound has passed");
}

#[tokio::test]
async fn a_revocation_made_while_a_replica_was_cut_off_is_caught_up() {
    // Restarting Redis drops every subscription; a revocation made as soon as Redis is back
    // may be published before replica b has resubscribed. b must still learn of it, from the
    // epoch and change log it checks on every (re)subscription and poll.
    let mut redis = RedisServer::start().await;
    let a = Gateway::builder()
        .redis(&redis.url(), "catchup")
        .start()
        .await;
    let b = Gateway::builder()
        .redis(&redis.url(), "catchup")
        .start()
        .await;
    let ws = a.create_workspace().await;
    let (id, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    assert_eq!(b.chat(&key).await.status(), 200);

    redis.stop().await;
    redis.resume().await;
    let revoked = eventually(Duration::from_secs(10), || async {
        a.admin_request(Method::POST, &format!("/admin/v1/keys/{id}/revoke"))
            .send()
            .await
            .unwrap()
            .status()
            == 200
    })
    .await;
    assert!(
        revoked.is_some(),
        "revocation goes through once Redis is back"
    );
    eventually(Duration::from_secs(10), || async {
        b.chat(&key).await.status() == 401
    })
    .await
    .expect("replica b catches up on the revocation it may have missed");
}
