//! Metrics that parse and move, probes counted apart, and logs without secrets.

use super::*;

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
