//! Running svcgate as an operator would: metrics that parse and move, logs without secrets,
//! and a shutdown that finishes what it started.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn sample(metrics: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics
        .samples
        .iter()
        .find(|s| {
            s.metric == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(k).is_some_and(|l| l == *v))
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref h) => h.last().map_or(0.0, |b| b.count),
            _ => 0.0,
        })
}

async fn scrape(gw: &Gateway) -> prometheus_parse::Scrape {
    let text = gw.metrics_text().await;
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("/metrics is Prometheus text")
}

#[tokio::test]
async fn metrics_parse_and_move_with_a_scripted_set_of_requests() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder()
        .live(live.addr)
        .config(|c| {
            c.limits.live_requests_per_minute = 3;
            c.limits.live_burst = 3;
        })
        .start()
        .await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    for _ in 0..3 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    assert_eq!(gw.chat(&key).await.status(), 429);
    assert_eq!(gw.chat("svc_live_short").await.status(), 401);
    let unknown = svcgate::keys::format::generate(svcgate::keys::Environment::Live).value;
    assert_eq!(gw.chat(&unknown).await.status(), 401);

    let chat = "/v1/chat/completions";
    // Requests are counted in their logging phase, just after their answers went out.
    eventually(Duration::from_secs(5), || async {
        let m = scrape(&gw).await;
        sample(
            &m,
            "svcgate_auth_failures_total",
            &[("reason", "unknown_key")],
        ) == Some(1.0)
            && sample(
                &m,
                "svcgate_requests_total",
                &[("route", chat), ("status", "429")],
            ) == Some(1.0)
    })
    .await
    .expect("every request is counted");
    let m = scrape(&gw).await;
    assert_eq!(
        sample(
            &m,
            "svcgate_requests_total",
            &[("route", chat), ("status", "200"), ("environment", "live")]
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &m,
            "svcgate_requests_total",
            &[("route", chat), ("status", "429")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "svcgate_auth_failures_total",
            &[("reason", "bad_length")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "svcgate_auth_failures_total",
            &[("reason", "unknown_key")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "svcgate_policy_rejections_total",
            &[("reason", "rate_limit")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "svcgate_upstream_duration_seconds_count",
            &[("route", chat)]
        ),
        Some(3.0)
    );
    assert!(sample(&m, "svcgate_key_cache_lookups_total", &[("outcome", "hit")]).unwrap() >= 3.0);
    assert!(
        sample(
            &m,
            "svcgate_request_duration_seconds_count",
            &[("route", chat)]
        )
        .unwrap()
            >= 4.0
    );
    assert!(sample(&m, "svcgate_key_cache_entries", &[]).is_some());
    // The gateway's own time: the three forwarded requests, not those it answered itself.
    assert_eq!(
        sample(&m, "svcgate_gateway_overhead_seconds_count", &[]),
        Some(3.0)
    );
    let overhead = sample(&m, "svcgate_gateway_overhead_seconds_sum", &[]).unwrap();
    assert!(overhead > 0.0 && overhead < 3.0, "{overhead}");
    // Label sets stay bounded: no key ids, no workspace ids, no raw paths.
    for s in &m.samples {
        for (_, v) in s.labels.iter() {
            assert!(
                !v.starts_with("key_") && !v.starts_with("ws_") && !v.starts_with("svc_"),
                "{v}"
            );
        }
    }
}

/// Sends `request` on a new connection to the gateway at `base` and returns what comes back
/// before the connection closes or goes quiet.
fn raw_exchange(base: &str, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    conn.write_all(request).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn health_probes_are_counted_apart_from_the_api() {
    let gw = Gateway::builder().start().await;
    for path in ["/healthz", "/readyz", "/readyz", "/nope"] {
        gw.request(Method::GET, path).send().await.unwrap();
    }
    let text = gw.metrics_text().await;
    let count = |route: &str, status: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("svcgate_requests_total{")
                    && l.contains(&format!("route=\"{route}\""))
                    && l.contains(&format!("status=\"{status}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    // A probe is not an API request: a 503 while draining must not read as the API's 5xx.
    // (The harness probed `/readyz` too, while waiting for the gateway.)
    let probes: u64 = count("probe", "200")
        .unwrap_or_default()
        .parse()
        .unwrap_or(0);
    assert!(probes >= 3, "{text}");
    assert_eq!(count("unmatched", "404").as_deref(), Some("1"), "{text}");
    assert_eq!(count("unmatched", "200"), None, "{text}");
}

#[tokio::test]
async fn no_secret_reaches_the_log_even_at_debug_level() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder()
        .live(live.addr)
        .log_filter("debug")
        .config(|c| c.webhooks.allow_insecure_targets = true)
        .start()
        .await;
    let (id, key) = gw
        .create_key(
            "live",
            &["chat.completions:create", "tokens:create", "webhooks:write"],
        )
        .await;
    // A webhook endpoint that will get the key.auto_revoked event of the leak report below.
    let receiver = Receiver::start().await;
    let endpoint: serde_json::Value = gw
        .request(Method::POST, "/v1/webhooks")
        .bearer_auth(&key)
        .json(&json!({"url": receiver.url("/hook"), "events": ["key.*"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let webhook_secret = endpoint["secret"].as_str().unwrap().to_string();
    assert_eq!(gw.chat(&key).await.status(), 200);
    // Requests Pingora cannot parse (a control byte in a header, a path that is not UTF-8):
    // below `info` it logs their raw bytes.
    let junk_header = format!(
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nX-Junk: a\x01b\r\n\r\n"
    );
    let mut bad_path = b"GET /v1/\xff/models HTTP/1.1\r\nHost: x\r\n".to_vec();
    bad_path.extend_from_slice(format!("Authorization: Bearer {key}\r\n\r\n").as_bytes());
    for malformed in [junk_header.into_bytes(), bad_path] {
        let head = raw_exchange(&gw.base, &malformed);
        assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    }
    let token: serde_json::Value = gw
        .request(Method::POST, "/v1/tokens")
        .bearer_auth(&key)
        .json(&json!({"scopes": ["chat.completions:create"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["value"].as_str().unwrap().to_string();
    assert_eq!(gw.chat(&token).await.status(), 200);
    let rotated: serde_json::Value = gw
        .admin_post(&format!("/admin/v1/keys/{id}/rotate"))
        .await
        .json()
        .await
        .unwrap();
    let successor = rotated["key"].as_str().unwrap().to_string();
    let mut flipped = key.clone().into_bytes();
    flipped[20] = if flipped[20] == b'a' { b'b' } else { b'a' };
    let flipped = String::from_utf8(flipped).unwrap();
    assert_eq!(gw.chat(&flipped).await.status(), 401);
    gw.admin_request(Method::POST, "/admin/v1/leaks")
        .json(&json!([{"token": successor}]))
        .send()
        .await
        .unwrap();
    let delivered = eventually(Duration::from_secs(10), || async {
        !receiver.received("/hook").is_empty()
    })
    .await;
    assert!(delivered.is_some(), "the webhook was delivered");
    tokio::time::sleep(Duration::from_millis(200)).await;

    let log = gw.logs();
    assert!(log.contains("svcgate::webhooks"), "the worker logs too");
    assert!(
        !log.contains(&webhook_secret[6..]),
        "a webhook secret reached the log"
    );
    assert!(log.contains("key created"), "the log is being written");
    for secret in [&key, &token, &successor, &flipped] {
        // Not even the random part of a secret may appear.
        assert!(
            !log.contains(&secret[secret.len() - 24..]),
            "a secret reached the log"
        );
    }
    assert!(
        !log.contains(ADMIN_TOKEN),
        "the admin token reached the log"
    );
}

#[tokio::test]
async fn sigterm_drains_then_closes_the_listeners_and_lets_requests_in_flight_finish() {
    let live = RecordingUpstream::start("live").await;
    let mut gw = Gateway::builder()
        .live(live.addr)
        .config(|c| {
            c.server.shutdown_grace_seconds = 2;
            c.server.shutdown_timeout_seconds = 3;
        })
        .start()
        .await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    // Each request on a connection of its own, as a client arriving after SIGTERM.
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let chat = |delay_ms: u64| {
        fresh()
            .post(format!("{}/v1/chat/completions", gw.base))
            .bearer_auth(&key)
            .header("x-test-delay-ms", delay_ms.to_string())
            .json(&json!({"model": "m"}))
    };
    let ready = |base: &str| fresh().get(format!("{base}/readyz")).send();
    assert_eq!(ready(&gw.base).await.unwrap().status(), 200);
    let in_flight_at_sigterm = tokio::spawn(chat(1500).send());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let signalled = Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &gw.pid().to_string()])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Draining: not ready on either port, but still accepting and serving, and each
    // response closes its connection.
    assert_error(ready(&gw.base).await.unwrap(), 503, "service_unavailable").await;
    assert_error(ready(&gw.admin).await.unwrap(), 503, "service_unavailable").await;
    let resp = chat(0).send().await.expect("accepted while draining");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["connection"], "close");
    // Started during the drain, finishing after the listeners have closed.
    let in_flight_at_close = tokio::spawn(chat(2500).send());

    tokio::time::sleep(Duration::from_millis(2600).saturating_sub(signalled.elapsed())).await;
    let refused = chat(0).send().await;
    assert!(
        refused.as_ref().is_err_and(|e| e.is_connect()),
        "the listener is closed after the drain: {refused:?}"
    );
    for request in [in_flight_at_sigterm, in_flight_at_close] {
        let resp = request
            .await
            .unwrap()
            .expect("the request in flight is answered");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.json::<Value>().await.unwrap()["upstream"], "live");
    }
    let (status, _) = tokio::task::spawn_blocking(move || gw.wait_exit(Duration::from_secs(15)))
        .await
        .unwrap()
        .expect("the gateway exits");
    assert!(status.success(), "{status:?}");
    // Drain, then the in-flight window, then the last flush: not the 15 s limit.
    assert!(signalled.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_graceful_upgrade_hands_over_without_refusing_requests() {
    let ns = TestNamespace::new();
    let mut gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(|c| {
            c.server.shutdown_grace_seconds = 1;
            c.server.shutdown_timeout_seconds = 1;
        })
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let base = gw.base.clone();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let load = tokio::spawn(async move {
        let mut statuses = Vec::new();
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(8) {
            let status = client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(&key)
                .json(&json!({}))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .map_err(|e| format!("{e:?}"));
            statuses.push(status);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        statuses
    });
    let gw = tokio::task::spawn_blocking(move || {
        gw.upgrade();
        gw
    })
    .await
    .unwrap();
    let statuses = load.await.unwrap();
    assert!(statuses.len() > 50);
    assert!(
        statuses.iter().all(|s| *s == Ok(200)),
        "refused or failed during the upgrade: {:?}",
        statuses
            .iter()
            .filter(|s| **s != Ok(200))
            .collect::<Vec<_>>()
    );
    // The new process serves the admin API and the gateway.
    let (id, _) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    assert!(id.starts_with("key_"));
    assert!(gw.logs().contains("svcgate serving"));
}

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
/// and so is a scoped token minted on another replica (heard of on the tokens channel). Until
/// session 27 all three were refused with the made-up keys until the minute's end.
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

/// Queue gauges stuck at 0 on every gateway would hide workers that are all down: only a
/// process that runs a worker exports the webhook metrics.
#[tokio::test]
async fn only_a_process_running_a_webhook_worker_exports_its_metrics() {
    let ns = TestNamespace::new();
    let without = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .no_worker()
        .start()
        .await;
    let text = without.metrics_text().await;
    assert!(text.contains("svcgate_key_cache_entries"), "{text}");
    assert!(!text.contains("svcgate_webhook_"), "{text}");
    let with = on_redis(&ns).await;
    eventually(Duration::from_secs(5), || async {
        with.metrics_text()
            .await
            .contains("svcgate_webhook_oldest_pending_seconds")
    })
    .await
    .expect("a worker's gateway exports them");
}

/// `/readyz` on the gateway port is public: a flood of probes must not become a flood of
/// Redis commands.
#[tokio::test]
async fn a_flood_of_readiness_probes_asks_redis_about_once_a_second() {
    let redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), "probes")
        .no_worker()
        .start()
        .await;
    let before = redis.command_calls("ping").await;
    let started = Instant::now();
    for _ in 0..300 {
        let resp = gw.request(Method::GET, "/readyz").send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    let seconds = started.elapsed().as_secs() as usize;
    let asked = redis.command_calls("ping").await - before;
    // One a second from the probes, one from the connection watchdog, one every 5 s on the
    // key-change subscription, and a little slack.
    assert!(
        asked <= 2 * (seconds + 2) + 1,
        "{asked} PINGs for 300 probes in {seconds} s"
    );
}

/// SIGQUIT hands the listeners to a new process only once one waits for them (before, the
/// gateway gave up after 5 s and closed them, leaving nothing to serve); SIGHUP is ignored
/// (by default it ended the process on the spot, requests in flight and unflushed spend with
/// it).
#[tokio::test]
async fn a_sigquit_with_no_new_process_and_a_sighup_leave_the_gateway_serving() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    for signal in ["-QUIT", "-HUP"] {
        std::process::Command::new("kill")
            .args([signal, &gw.pid().to_string()])
            .status()
            .unwrap();
    }
    // Longer than the hand-over's retries (5 × 1 s).
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(gw.chat(&key).await.status(), 200, "{}", gw.logs());
    let logs = gw.logs();
    assert!(logs.contains("SIGQUIT refused"), "{logs}");
    assert!(logs.contains("SIGHUP ignored"), "{logs}");
}

/// The threads of a process: id, name and nice value, from `/proc/<pid>/task`.
fn threads_of(pid: u32) -> Vec<(u32, String, i32)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc")
        .filter_map(|task| {
            let task = task.ok()?;
            let tid = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            // `tid (name) state …`: the name may hold spaces and parentheses; the nice value is
            // the 19th field, the 17th after the name.
            let (head, rest) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_string();
            let nice = rest.split_whitespace().nth(16)?.parse().ok()?;
            Some((tid, name, nice))
        })
        .collect()
}

/// mimalloc's 2 MiB regions, backed by huge pages, kept resident memory with 100,000 cached keys
/// above 100 MB: the gateway turns them off for itself.
#[tokio::test]
#[cfg(target_os = "linux")]
async fn the_gateway_runs_without_transparent_huge_pages() {
    let thp_enabled = |pid: &str| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(|v| v.trim().to_string())
    };
    if thp_enabled("self").as_deref() != Some("1") {
        eprintln!("this kernel has no transparent huge pages to turn off; nothing to check");
        return;
    }
    let gw = Gateway::builder().start().await;
    assert_eq!(thp_enabled(&gw.pid().to_string()).as_deref(), Some("0"));
}

#[tokio::test]
async fn the_stores_threads_run_behind_the_request_workers() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_eq!(gw.chat(&key).await.status(), 200, "{}", gw.logs());
    let threads = threads_of(gw.pid());
    let nice_of = |name: &str| -> Vec<i32> {
        threads
            .iter()
            .filter(|(_, n, _)| n == name)
            .map(|(_, _, nice)| *nice)
            .collect()
    };
    let main = threads
        .iter()
        .find(|(tid, _, _)| *tid == gw.pid())
        .map(|(_, _, nice)| *nice)
        .expect("the main thread");
    let (store, workers) = (nice_of("svcgate-store"), nice_of("svcgate gateway"));
    assert!(!store.is_empty() && !workers.is_empty(), "{threads:?}");
    assert!(workers.iter().all(|&n| n == main), "{threads:?}");
    assert!(
        store.iter().all(|&n| n == (main + 10).min(19)),
        "{threads:?}"
    );
}
