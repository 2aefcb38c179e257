//! Clients making up keys: held back without store reads, while real keys go on.

use super::*;

#[tokio::test]
async fn a_client_making_up_keys_is_held_back_without_store_reads_and_cached_keys_go_on() {
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(|c| c.limits.unknown_keys_per_minute = 3)
        .config(|c| c.server.trusted_proxies = vec!["127.0.0.1".to_string()])
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, valid) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    // The client, as the ingress in front (trusted) tells it.
    let from = |client: &'static str, key: String| {
        let req = gw
            .request(Method::GET, "/v1/models")
            .header("x-forwarded-for", client)
            .bearer_auth(key);
        async move { req.send().await.unwrap() }
    };
    let get = |key: String| from("203.0.113.7", key);
    clear_of_a_minutes_end().await;
    assert_eq!(get(valid.clone()).await.status(), 200);
    let first = made_up_key();
    assert_error(get(first.clone()).await, 401, "authentication_error").await;
    for _ in 0..2 {
        assert_error(get(made_up_key()).await, 401, "authentication_error").await;
    }
    let before = key_cache_misses(&gw).await;
    for _ in 0..5 {
        let message = assert_held_back(get(made_up_key()).await).await;
        assert!(message.contains("this address"), "{message}");
    }
    assert_eq!(key_cache_misses(&gw).await, before, "no store read");
    // A cached key from the same address goes on; a made-up key it saw already is still a
    // plain 401 (remembered, no read); another client is not held up.
    assert_eq!(get(valid).await.status(), 200);
    assert_error(get(first).await, 401, "authentication_error").await;
    assert_error(
        from("198.51.100.9", made_up_key()).await,
        401,
        "authentication_error",
    )
    .await;
    assert!(
        refusals_counted(&gw, "unknown_key_limit", 5.0).await,
        "the refusals are counted"
    );
}

/// A well-formed live key that does not exist.
fn made_up_key() -> String {
    svcgate::keys::format::generate(svcgate::keys::Environment::Live).value
}

/// Waits, if need be, into the next minute: the unknown-key counts are per minute.
async fn clear_of_a_minutes_end() {
    let second = svcgate::ids::unix_now() % 60;
    if second > 50 {
        tokio::time::sleep(Duration::from_secs(61 - second)).await;
    }
}

/// Keys the gateway's key cache did not have.
async fn key_cache_misses(gw: &Gateway) -> Option<f64> {
    sample(
        &scrape(gw).await,
        "svcgate_key_cache_lookups_total",
        &[("outcome", "miss")],
    )
}

/// A key refused a store read by the unknown-key limit: 429 with the rest of the minute to wait.
/// Returns the error's message.
async fn assert_held_back(resp: reqwest::Response) -> String {
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    let body = assert_error(resp, 429, "rate_limit_error").await;
    body["error"]["message"].as_str().unwrap().to_string()
}

/// Whether the gateway counts `n` authentication failures for `reason` within 5 s.
async fn refusals_counted(gw: &Gateway, reason: &str, n: f64) -> bool {
    let counted = eventually(Duration::from_secs(5), || async {
        sample(
            &scrape(gw).await,
            "svcgate_auth_failures_total",
            &[("reason", reason)],
        ) == Some(n)
    })
    .await;
    counted.is_some()
}

#[tokio::test]
async fn an_ingress_speaking_for_many_clients_is_not_held_up_by_unknown_keys() {
    // No trusted proxies, and the peer is internal (loopback here, an ingress's pod address in
    // a cluster): it is not one client's address, so it is not counted.
    let gw = Gateway::builder()
        .config(|c| c.limits.unknown_keys_per_minute = 1)
        .start()
        .await;
    for _ in 0..4 {
        let key = svcgate::keys::format::generate(svcgate::keys::Environment::Live).value;
        let resp = gw
            .request(Method::GET, "/v1/models")
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_error(resp, 401, "authentication_error").await;
    }
}

/// Made-up keys sent through an ingress (no address of one client's) or from many addresses
/// cost the store at most the replica's share of reads a minute: past it, keys that are not
/// cached are refused without a read, and cached keys go on.
#[tokio::test]
async fn made_up_keys_from_everywhere_are_held_back_by_the_replicas_share() {
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(|c| {
            c.limits.unknown_keys_per_minute = 2;
            c.limits.unknown_keys_per_minute_total = 3;
        })
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, valid) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    // Through the ingress in front (the peer is loopback, not one client's address).
    let get = |key: String| {
        let req = gw.request(Method::GET, "/v1/models").bearer_auth(key);
        async move { req.send().await.unwrap() }
    };
    clear_of_a_minutes_end().await;
    // The valid key's read is given back: it takes nothing of the share.
    assert_eq!(get(valid.clone()).await.status(), 200);
    for _ in 0..3 {
        assert_error(get(made_up_key()).await, 401, "authentication_error").await;
    }
    let before = key_cache_misses(&gw).await;
    for _ in 0..3 {
        let message = assert_held_back(get(made_up_key()).await).await;
        assert!(message.contains("this gateway"), "{message}");
    }
    assert_eq!(key_cache_misses(&gw).await, before, "no store read");
    assert_eq!(get(valid).await.status(), 200, "a cached key goes on");
    assert!(
        refusals_counted(&gw, "unknown_key_limit_all_clients", 3.0).await,
        "the refusals are counted"
    );
}

/// A figure of the gateway's key directory, from its metrics.
async fn directory(gw: &Gateway, name: &str) -> Option<f64> {
    sample(&scrape(gw).await, name, &[])
}

/// `GET /v1/models` with `key`.
async fn models(gw: &Gateway, key: String) -> reqwest::Response {
    gw.request(Method::GET, "/v1/models")
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

/// Spends a gateway's `unknown_keys_per_minute_total` of 3 on made-up keys, in a minute with
/// time left: the next key not cached is held back unless the key directory lists it.
async fn spend_the_unknown_key_total(gw: &Gateway) {
    clear_of_a_minutes_end().await;
    for _ in 0..3 {
        assert_error(models(gw, made_up_key()).await, 401, "authentication_error").await;
    }
    assert_held_back(models(gw, made_up_key()).await).await;
}

/// Only keys the store does not hold are held back: a real key new to a replica is read
/// through a flood of made-up ones, whether it was written before the replica started (found by
/// the replica's listing of the store) or since, on another replica (named by the change log),
/// and so is a scoped token minted on another replica (heard of on the tokens channel). None
/// of the three may be refused with the made-up keys until the minute's end.
#[tokio::test]
async fn a_real_key_new_to_the_replica_is_read_through_a_flood_of_made_up_keys() {
    let ns = TestNamespace::new();
    let other = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .no_worker()
        .start()
        .await;
    let ws = other.create_workspace().await;
    let (_, before) = other.create_key_in(&ws, "live", &["models:read"]).await;
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .no_worker()
        .config(|c| c.limits.unknown_keys_per_minute_total = 3)
        .start()
        .await;
    let (_, since) = other
        .create_key_in(&ws, "live", &["models:read", "tokens:create"])
        .await;
    let token = other
        .mint_token(&since, json!({"scopes": ["models:read"]}))
        .await;
    eventually(Duration::from_secs(10), || async {
        directory(&gw, "svcgate_key_directory_complete").await == Some(1.0)
            && directory(&gw, "svcgate_key_directory_keys").await == Some(2.0)
            && directory(&gw, "svcgate_key_directory_tokens").await == Some(1.0)
    })
    .await
    .expect("the replica lists both keys and the token");

    let get = |key: String| models(&gw, key);
    spend_the_unknown_key_total(&gw).await;
    let misses = key_cache_misses(&gw).await.unwrap_or(0.0);
    assert_eq!(get(before).await.status(), 200, "written before the start");
    assert_eq!(get(since).await.status(), 200, "written since, elsewhere");
    assert_eq!(get(token).await.status(), 200, "minted elsewhere");
    assert_eq!(
        key_cache_misses(&gw).await,
        Some(misses + 3.0),
        "each read once"
    );
    assert_held_back(get(made_up_key()).await).await;
}

/// Pub/sub keeps no backlog: a scoped token minted while a replica was not subscribed to the
/// tokens channel (here its Redis user was not allowed it) was never announced to it. It asks
/// for the channel again, and once subscribed reads the tokens still live, so the token is read
/// through a flood of made-up keys.
#[tokio::test]
async fn a_token_minted_while_a_replica_was_not_subscribed_is_heard_of_when_it_subscribes() {
    let redis = RedisServer::start().await;
    let url = redis
        .set_user(
            "gateway",
            &["~*", "resetchannels", "&unheard:keys:changed", "+@all"],
        )
        .await;
    let other = Gateway::builder()
        .redis(&redis.url(), "unheard")
        .no_worker()
        .start()
        .await;
    let ws = other.create_workspace().await;
    let gw = Gateway::builder()
        .redis(&url, "unheard")
        .no_worker()
        .config(|c| c.limits.unknown_keys_per_minute_total = 3)
        .start()
        .await;
    eventually(Duration::from_secs(10), || async {
        gw.logs()
            .contains("cannot subscribe to scoped tokens minted")
            && directory(&gw, "svcgate_key_directory_complete").await == Some(1.0)
    })
    .await
    .expect("subscribed to key changes only, and listed");
    let (_, parent) = other
        .create_key_in(&ws, "live", &["models:read", "tokens:create"])
        .await;
    let token = other
        .mint_token(&parent, json!({"scopes": ["models:read"]}))
        .await;
    eventually(Duration::from_secs(10), || async {
        directory(&gw, "svcgate_key_directory_keys").await == Some(1.0)
    })
    .await
    .expect("the parent key, from the change log");
    assert_eq!(
        directory(&gw, "svcgate_key_directory_tokens").await,
        Some(0.0)
    );

    // Allowed the channel: asked for again (every 5 s), and subscribed.
    redis.set_user("gateway", &["allchannels"]).await;
    eventually(Duration::from_secs(15), || async {
        directory(&gw, "svcgate_key_directory_tokens").await == Some(1.0)
    })
    .await
    .expect("the token, read on subscribing");
    assert!(gw.logs().contains("subscribed to scoped tokens minted"));

    let get = |key: String| models(&gw, key);
    spend_the_unknown_key_total(&gw).await;
    assert_eq!(get(token).await.status(), 200, "minted unheard of");
    assert_held_back(get(made_up_key()).await).await;
}

/// A listing of the key directory that fails (here a Redis user not allowed `SCAN`) is logged
/// and tried again until it succeeds; meanwhile the directory shows itself incomplete.
#[tokio::test]
async fn a_key_directory_that_cannot_be_listed_says_so_and_is_listed_once_it_can() {
    let redis = RedisServer::start().await;
    let url = redis
        .set_user("gateway", &["~*", "&*", "+@all", "-scan"])
        .await;
    let other = Gateway::builder()
        .redis(&redis.url(), "acl")
        .no_worker()
        .start()
        .await;
    let ws = other.create_workspace().await;
    other.create_key_in(&ws, "live", &["models:read"]).await;
    let gw = Gateway::builder()
        .redis(&url, "acl")
        .no_worker()
        .start()
        .await;
    eventually(Duration::from_secs(10), || async {
        gw.logs()
            .contains("cannot list the keys for the key directory")
    })
    .await
    .expect("the failure is logged");
    assert_eq!(
        directory(&gw, "svcgate_key_directory_complete").await,
        Some(0.0)
    );
    redis.set_user("gateway", &["+scan"]).await;
    eventually(Duration::from_secs(10), || async {
        directory(&gw, "svcgate_key_directory_complete").await == Some(1.0)
            && directory(&gw, "svcgate_key_directory_keys").await == Some(1.0)
    })
    .await
    .expect("listed once it may");
    assert!(gw.logs().contains("key directory listed"), "{}", gw.logs());
}
