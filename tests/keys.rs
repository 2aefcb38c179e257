//! Keys on Redis: several gateway replicas sharing one store, revocation reaching all of
//! them, and what happens when Redis goes away and comes back.

mod common;

use common::*;
use reqwest::Method;
use std::time::Duration;

#[tokio::test]
async fn replicas_share_keys_and_a_revocation_reaches_every_replica() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
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
    let resp = a.admin_post(&format!("/admin/v1/keys/{id}/revoke")).await;
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
        let gw = on_redis(&ns).await;
        ws = gw.create_workspace().await;
        key = gw.create_key_in(&ws, "live", &["models:read"]).await.1;
    }
    let gw = on_redis(&ns).await;
    let resp = gw
        .request(Method::GET, "/v1/models")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(gw.list_keys(&ws).await.len(), 1);
}

#[tokio::test]
async fn the_redis_store_starts_without_a_demo_workspace() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
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
    // The gateway port stays ready (its replica still serves cached keys); the admin port's
    // readiness is the store's.
    let resp = gw.request(Method::GET, "/readyz").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({"status": "degraded", "store": "unreachable"})
    );
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
    let ready = |base: String| {
        let http = gw.http.clone();
        async move {
            let resp = http.get(format!("{base}/readyz")).send().await.unwrap();
            resp.json::<serde_json::Value>().await.unwrap()
                == serde_json::json!({"status": "ready"})
        }
    };
    eventually(Duration::from_secs(10), || async {
        ready(gw.base.clone()).await && ready(gw.admin.clone()).await
    })
    .await
    .expect("ready again once Redis is back");
    // The first commands on a fresh connection may still race the reconnect; within moments
    // both keys work again, with nothing done by hand.
    eventually(Duration::from_secs(5), || async {
        gw.chat(&uncached).await.status() == 200
    })
    .await
    .expect("the uncached key is accepted again");
    assert_eq!(gw.chat(&cached).await.status(), 200);
}

#[tokio::test]
async fn cached_keys_are_trusted_only_for_the_configured_staleness() {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), "stale")
        .config(|c| {
            c.store.cache_staleness_seconds = 1;
            c.store.sync_interval_ms = 100;
        })
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
    // And then the replica is not ready either: it can check no key.
    let resp = gw.request(Method::GET, "/readyz").send().await.unwrap();
    assert_error(resp, 503, "service_unavailable").await;
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
        a.admin_post(&format!("/admin/v1/keys/{id}/revoke"))
            .await
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

async fn rotate(
    gw: &Gateway,
    id: &str,
    body: serde_json::Value,
    idem: Option<&str>,
) -> reqwest::Response {
    let mut req = gw
        .admin_request(Method::POST, &format!("/admin/v1/keys/{id}/rotate"))
        .json(&body);
    if let Some(k) = idem {
        req = req.header("Idempotency-Key", k);
    }
    req.send().await.unwrap()
}

/// A live key (id, value) of a new workspace, for chat, with a monthly budget of `credits`.
async fn key_with_budget(gw: &Gateway, credits: u32) -> (String, String) {
    let ws = gw.create_workspace().await;
    let (id, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let resp = gw
        .admin_request(Method::PATCH, &format!("/admin/v1/keys/{id}"))
        .json(&serde_json::json!({"monthly_budget": credits}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    (id, key)
}

#[tokio::test]
async fn a_rotation_does_not_open_a_new_months_budget() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let (old_id, old_key) = key_with_budget(&gw, 2).await;
    // Two requests at the simulated backend's price of 1 spend the budget.
    for _ in 0..2 {
        assert_eq!(gw.chat(&old_key).await.status(), 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_error(gw.chat(&old_key).await, 402, "budget_exceeded").await;

    let resp = rotate(&gw, &old_id, serde_json::json!({}), None).await;
    assert_eq!(resp.status(), 201);
    let new: serde_json::Value = resp.json().await.unwrap();
    let new_key = new["key"].as_str().unwrap();
    // The successor inherits the budget and what the month spent of it; the old key, in its
    // grace period, stays refused.
    assert_error(gw.chat(new_key).await, 402, "budget_exceeded").await;
    assert_error(gw.chat(&old_key).await, 402, "budget_exceeded").await;
}

#[tokio::test]
async fn a_key_rotated_twice_shares_one_budget_across_its_lineage() {
    let ns = TestNamespace::new();
    lineage_shares_one_budget(&on_redis(&ns).await).await;
    lineage_shares_one_budget(&Gateway::builder().start().await).await;
}

/// A is rotated to B, then B to C, while A is still in grace: whichever of the three a request
/// uses, the three keys' spend counts against the one budget.
async fn lineage_shares_one_budget(gw: &Gateway) {
    let (a_id, a_key) = key_with_budget(gw, 2).await;
    let rotated = |id: String| async move {
        let resp = rotate(gw, &id, serde_json::json!({}), None).await;
        assert_eq!(resp.status(), 201);
        let new: serde_json::Value = resp.json().await.unwrap();
        let id = new["id"].as_str().unwrap().to_string();
        (id, new["key"].as_str().unwrap().to_string())
    };
    let (b_id, b_key) = rotated(a_id.clone()).await;
    let (_, c_key) = rotated(b_id).await;
    for _ in 0..2 {
        assert_eq!(gw.chat(&c_key).await.status(), 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for key in [&c_key, &b_key, &a_key] {
        assert_error(gw.chat(key).await, 402, "budget_exceeded").await;
    }
}

#[tokio::test]
async fn a_rotated_key_works_until_its_grace_period_ends() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let (old_id, old_key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    assert_eq!(b.chat(&old_key).await.status(), 200);

    let resp = rotate(
        &a,
        &old_id,
        serde_json::json!({"grace_period_seconds": 2}),
        None,
    )
    .await;
    assert_eq!(resp.status(), 201);
    let new: serde_json::Value = resp.json().await.unwrap();
    let new_key = new["key"].as_str().unwrap().to_string();
    assert_ne!(new_key, old_key);
    assert_eq!(new["rotated_from"], old_id.as_str());
    assert_eq!(
        new["scopes"],
        serde_json::json!(["chat.completions:create"])
    );

    let old = a.admin_get(&format!("/admin/v1/keys/{old_id}")).await;
    assert_eq!(old["status"], "rotating");
    assert!(old["grace_until"].as_u64().is_some());
    assert_eq!(old["rotated_to"], new["id"]);

    for gw in [&a, &b] {
        assert_eq!(gw.chat(&old_key).await.status(), 200, "old key in grace");
        assert_eq!(gw.chat(&new_key).await.status(), 200, "new key");
    }
    for gw in [&a, &b] {
        eventually(Duration::from_secs(6), || async {
            gw.chat(&old_key).await.status() == 401
        })
        .await
        .expect("the old key stops working after its grace period");
        assert_eq!(gw.chat(&new_key).await.status(), 200);
    }
    let body = assert_error(a.chat(&old_key).await, 401, "authentication_error").await;
    assert!(body["error"]["message"].as_str().unwrap().contains("grace"));
}

#[tokio::test]
async fn a_rotation_without_a_grace_period_gets_the_configured_one() {
    let gw = Gateway::builder()
        .config(|c| c.keys.rotation_grace_seconds = 120)
        .start()
        .await;
    let (id, _) = gw.create_key("live", &["models:read"]).await;
    let before = svcgate::ids::unix_now();
    let resp = rotate(&gw, &id, serde_json::json!({}), None).await;
    assert_eq!(resp.status(), 201);
    let old = gw.admin_get(&format!("/admin/v1/keys/{id}")).await;
    let grace_until = old["grace_until"].as_u64().unwrap();
    assert!(
        (before + 120..=svcgate::ids::unix_now() + 120).contains(&grace_until),
        "{old}"
    );
}

#[tokio::test]
async fn a_retried_rotation_with_an_idempotency_key_returns_the_same_key() {
    let ns = TestNamespace::new();
    let (gw, other) = replicas(&ns).await;
    let ws = gw.create_workspace().await;
    let (id, _) = gw.create_key_in(&ws, "test", &["models:read"]).await;

    let first: serde_json::Value = rotate(&gw, &id, serde_json::json!({}), Some("retry-1"))
        .await
        .json()
        .await
        .unwrap();
    // The retry may land on another replica.
    let resp = rotate(&other, &id, serde_json::json!({}), Some("retry-1")).await;
    assert_eq!(resp.status(), 201);
    let second: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(first["id"], second["id"]);
    assert_eq!(first["key"], second["key"]);
    assert!(first["key"].as_str().unwrap().starts_with("svc_test_"));

    // Without the same idempotency key, the old key is no longer active: nothing is minted.
    let resp = rotate(&gw, &id, serde_json::json!({}), Some("retry-2")).await;
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = rotate(&gw, &id, serde_json::json!({}), None).await;
    assert_error(resp, 400, "invalid_request_error").await;
    assert_eq!(gw.list_keys(&ws).await.len(), 2);

    // Once the new key is revoked, a retry no longer hands its value out.
    gw.revoke(first["id"].as_str().unwrap()).await;
    let resp = rotate(&gw, &id, serde_json::json!({}), Some("retry-1")).await;
    let body = assert_error(resp, 400, "invalid_request_error").await;
    assert!(!body.to_string().contains(first["key"].as_str().unwrap()));
}

#[tokio::test]
async fn a_retried_creation_with_an_idempotency_key_returns_the_same_key() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let create = |gw: &Gateway, scopes: &[&str], idem: Option<&str>| {
        let mut req = gw
            .admin_request(Method::POST, "/admin/v1/keys")
            .json(&serde_json::json!({"workspace": ws, "environment": "live", "scopes": scopes}));
        if let Some(k) = idem {
            req = req.header("Idempotency-Key", k);
        }
        req.send()
    };
    let first = create(&a, &["models:read"], Some("c1")).await.unwrap();
    assert_eq!(first.status(), 201);
    let first: serde_json::Value = first.json().await.unwrap();
    // The retry may land on another replica.
    let again = create(&b, &["models:read"], Some("c1")).await.unwrap();
    assert_eq!(again.status(), 201);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(first["id"], again["id"]);
    assert_eq!(first["key"], again["key"]);
    assert_eq!(a.list_keys(&ws).await.len(), 1, "one key, not two");
    let resp = a
        .request(Method::GET, "/v1/models")
        .bearer_auth(first["key"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // The same idempotency key for another key is refused; without one, each call is new.
    let other = create(&a, &["chat.completions:create"], Some("c1"))
        .await
        .unwrap();
    assert_error(other, 400, "invalid_request_error").await;
    for _ in 0..2 {
        assert_eq!(
            create(&a, &["models:read"], None).await.unwrap().status(),
            201
        );
    }
    assert_eq!(a.list_keys(&ws).await.len(), 3);

    // Once revoked, a retry does not hand the value out again.
    a.revoke(first["id"].as_str().unwrap()).await;
    let body = assert_error(
        create(&a, &["models:read"], Some("c1")).await.unwrap(),
        400,
        "invalid_request_error",
    )
    .await;
    assert!(!body.to_string().contains(first["key"].as_str().unwrap()));
}

#[tokio::test]
async fn the_redis_data_alone_does_not_yield_an_idempotently_rotated_key() {
    // Everything the store holds, with the old key's id and a guessable idempotency key (both
    // seen by whoever watched the rotation), must not reproduce the successor.
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let (id, _) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    let rotated: serde_json::Value = rotate(&gw, &id, serde_json::json!({}), Some("k1"))
        .await
        .json()
        .await
        .unwrap();
    let successor = rotated["key"].as_str().unwrap();

    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stored: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{}*", ns.name))
        .query_async(&mut conn)
        .await
        .unwrap();
    // The salt the derivation takes from the store is forgotten after the idempotency window:
    // then not even the admin token reproduces the key.
    let salts: Vec<&String> = stored.iter().filter(|k| k.contains(":idem:")).collect();
    assert_eq!(salts.len(), 1, "{stored:?}");
    let ttl: i64 = redis::cmd("TTL")
        .arg(salts[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((86_000..=86_400).contains(&ttl), "{ttl}");
    let salt: Vec<u8> = redis::cmd("GET")
        .arg(salts[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    let derive = |secret: &[u8], salt: &[u8]| {
        svcgate::keys::format::derive(
            svcgate::keys::Environment::Live,
            secret,
            &[b"rotate", id.as_bytes(), b"live", b"k1", salt],
        )
        .value
    };
    // The derivation below is the gateway's: with the admin token's secret and the salt, it
    // gives the successor.
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(ADMIN_TOKEN.as_bytes()).unwrap();
    mac.update(b"svcgate idempotent keys");
    let admin_secret = mac.finalize().into_bytes();
    assert_eq!(derive(&admin_secret, &salt), successor);
    let mut candidates: Vec<Vec<u8>> = Vec::new();
    for name in stored {
        let value: redis::RedisResult<Vec<u8>> =
            redis::cmd("GET").arg(&name).query_async(&mut conn).await;
        if let Ok(value) = value {
            if let Ok(raw) = hex::decode(&value) {
                candidates.push(raw);
            }
            candidates.push(value);
        }
    }
    assert!(!candidates.is_empty(), "the namespace holds string values");
    // Any stored value as the secret, any as the salt.
    for secret in &candidates {
        for salt in &candidates {
            assert_ne!(
                derive(secret, salt),
                successor,
                "derived from the store's data"
            );
        }
    }
}

#[tokio::test]
async fn an_operator_can_end_a_grace_period_early() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let (id, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let resp = rotate(&a, &id, serde_json::json!({}), None).await;
    let new: serde_json::Value = resp.json().await.unwrap();
    let old = a.admin_get(&format!("/admin/v1/keys/{id}")).await;
    let default_grace = old["grace_until"].as_u64().unwrap() - new["created_at"].as_u64().unwrap();
    assert!(
        (86_399..=86_401).contains(&default_grace),
        "{default_grace}"
    );
    assert_eq!(b.chat(&key).await.status(), 200);

    let resp = a
        .admin_post(&format!("/admin/v1/keys/{id}/end-grace"))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(a.chat(&key).await.status(), 401);
    eventually(Duration::from_secs(5), || async {
        b.chat(&key).await.status() == 401
    })
    .await
    .expect("the other replica follows");
    assert_eq!(b.chat(new["key"].as_str().unwrap()).await.status(), 200);
}

#[tokio::test]
async fn bad_rotations_change_nothing() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let (id, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let (revoked_id, _) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    gw.revoke(&revoked_id).await;

    let resp = rotate(&gw, "key_missing", serde_json::json!({}), None).await;
    assert_error(resp, 404, "not_found").await;
    for body in [
        serde_json::json!({"grace_period_seconds": -1}),
        serde_json::json!({"grace_period_seconds": 99_999_999}),
        serde_json::json!({"grace_period_seconds": "soon"}),
        serde_json::json!({"grace": 5}),
        serde_json::json!([1]),
    ] {
        let resp = rotate(&gw, &id, body, None).await;
        assert_error(resp, 400, "invalid_request_error").await;
    }
    let resp = gw
        .admin_request(Method::POST, &format!("/admin/v1/keys/{id}/rotate"))
        .header(
            "Idempotency-Key",
            reqwest::header::HeaderValue::from_bytes("ключ".as_bytes()).unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = rotate(&gw, &revoked_id, serde_json::json!({}), None).await;
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = gw
        .admin_post(&format!("/admin/v1/keys/{id}/end-grace"))
        .await;
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = gw.admin_post("/admin/v1/keys/key_missing/end-grace").await;
    assert_error(resp, 404, "not_found").await;

    // Nothing was half-written: the same two keys, the first still active and working.
    let data = gw.list_keys(&ws).await;
    assert_eq!(data.len(), 2);
    let first = data.iter().find(|k| k["id"] == id.as_str()).unwrap();
    assert_eq!(first["status"], "active");
    assert!(first.get("rotated_to").is_none());
    assert_eq!(gw.chat(&key).await.status(), 200);
}

/// A Redis failover that loses the last writes takes the change log back an epoch or more;
/// the next write reuses the epoch. A replica that had read up to it must not take the new
/// change for the one it read, and miss it: a revocation would never reach its cache.
#[tokio::test]
async fn a_revocation_after_a_failover_that_lost_writes_reaches_every_replica() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let (x_id, x) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    assert_eq!(b.chat(&x).await.status(), 200, "cached on b");
    // A write b reads, and that the new master never got.
    a.create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let prefix = format!("{{{}}}:keys:", ns.name);
    redis::Script::new(
        r"
local epoch = tonumber(redis.call('GET', KEYS[2])) - 1
local kept = redis.call('XRANGE', KEYS[1], '-', epoch .. '-0')
redis.call('DEL', KEYS[1])
for _, e in ipairs(kept) do redis.call('XADD', KEYS[1], e[1], unpack(e[2])) end
redis.call('SET', KEYS[2], epoch)
",
    )
    .key(format!("{prefix}log"))
    .key(format!("{prefix}epoch"))
    .invoke_async::<()>(&mut conn)
    .await
    .unwrap();
    a.revoke(&x_id).await;
    eventually(Duration::from_secs(5), || async {
        b.chat(&x).await.status() == 401
    })
    .await
    .expect("b drops the revoked key");
}

/// A test key is easier to leak (browser origins, `ignored` leak reports): the live key made
/// with the same Idempotency-Key must not be computable from it, and the second request is
/// another request, refused.
#[tokio::test]
async fn one_idempotency_key_for_a_test_and_a_live_key_gives_nothing_away() {
    let gw = Gateway::builder().start().await;
    let create = |environment: &str, idem: &str| {
        gw.admin_request(Method::POST, "/admin/v1/keys")
            .header("Idempotency-Key", idem)
            .json(&serde_json::json!({
                "workspace": DEMO_WS, "environment": environment, "scopes": ["models:read"]
            }))
            .send()
    };
    let test = create("test", "k1").await.unwrap();
    assert_eq!(test.status(), 201);
    let test: serde_json::Value = test.json().await.unwrap();
    assert_error(
        create("live", "k1").await.unwrap(),
        400,
        "invalid_request_error",
    )
    .await;
    // In the other order, with another key: the same.
    let live = create("live", "k2").await.unwrap();
    assert_eq!(live.status(), 201);
    let live: serde_json::Value = live.json().await.unwrap();
    assert_error(
        create("test", "k2").await.unwrap(),
        400,
        "invalid_request_error",
    )
    .await;
    assert_ne!(test["key"], live["key"]);
}
