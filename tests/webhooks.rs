//! The webhook endpoints API, from a customer's side.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const WRITE: &[&str] = &["webhooks:read", "webhooks:write"];

async fn create(gw: &Gateway, key: &str, body: Value) -> reqwest::Response {
    gw.request(Method::POST, "/v1/webhooks")
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_endpoint_is_created_listed_changed_and_deleted() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", WRITE).await;

    let resp = create(
        &gw,
        &key,
        json!({"url": "https://93.184.216.34/hooks/svc", "events": ["agent.run.*", "billing.credits.low"]}),
    )
    .await;
    assert_eq!(resp.status(), 201);
    assert!(resp.headers().contains_key("service-request-id"));
    let created: Value = resp.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("we_"));
    let secret = created["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"));
    assert_eq!(created["status"], "active");
    assert_eq!(created["environment"], "live");
    assert_eq!(
        created["events"],
        json!(["agent.run.*", "billing.credits.low"])
    );

    let listed = call(&gw, &key, Method::GET, "/v1/webhooks", None)
        .await
        .text()
        .await
        .unwrap();
    assert!(listed.contains(&id));
    assert!(
        !listed.contains(&secret),
        "the secret is shown at creation only"
    );
    let got = call(&gw, &key, Method::GET, &format!("/v1/webhooks/{id}"), None).await;
    assert_eq!(got.status(), 200);
    assert!(!got.text().await.unwrap().contains(&secret));

    let patched: Value = call(
        &gw,
        &key,
        Method::PATCH,
        &format!("/v1/webhooks/{id}"),
        Some(json!({"events": ["key.auto_revoked"]})),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(patched["events"], json!(["key.auto_revoked"]));
    assert_eq!(patched["url"], "https://93.184.216.34/hooks/svc");

    // Resuming an active endpoint changes nothing and is no error. (Only the worker pauses an
    // endpoint, when its retries run out: pause and resume are tested with a real one in
    // tests/worker/delivery.rs.)
    let resumed = call(
        &gw,
        &key,
        Method::POST,
        &format!("/v1/webhooks/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(resumed.status(), 200);
    let resumed: Value = resumed.json().await.unwrap();
    assert_eq!(
        (&resumed["status"], &resumed["events"]),
        (&json!("active"), &json!(["key.auto_revoked"]))
    );

    let deleted = call(
        &gw,
        &key,
        Method::DELETE,
        &format!("/v1/webhooks/{id}"),
        None,
    )
    .await;
    assert_eq!(deleted.status(), 200);
    let again = call(&gw, &key, Method::GET, &format!("/v1/webhooks/{id}"), None).await;
    assert_error(again, 404, "not_found").await;
}

#[tokio::test]
async fn endpoints_are_kept_apart_by_workspace_and_environment() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let other_ws = gw.create_workspace().await;
    let (_, live) = gw.create_key_in(&ws, "live", WRITE).await;
    let (_, test) = gw.create_key_in(&ws, "test", WRITE).await;
    let (_, other) = gw.create_key_in(&other_ws, "live", WRITE).await;
    let created: Value = create(
        &gw,
        &test,
        json!({"url": "https://93.184.216.34/t", "events": ["image.batch.*"]}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(created["environment"], "test", "{created}");
    let id = created["id"].as_str().unwrap();
    for key in [&live, &other] {
        let list: Value = call(&gw, key, Method::GET, "/v1/webhooks", None)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(list["data"], json!([]));
        let resp = call(&gw, key, Method::GET, &format!("/v1/webhooks/{id}"), None).await;
        assert_error(resp, 404, "not_found").await;
        let resp = call(
            &gw,
            key,
            Method::DELETE,
            &format!("/v1/webhooks/{id}"),
            None,
        )
        .await;
        assert_error(resp, 404, "not_found").await;
    }
    let list: Value = call(&gw, &test, Method::GET, "/v1/webhooks", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn scopes_urls_and_event_names_are_enforced() {
    let gw = Gateway::builder().start().await;
    let (_, reader) = gw.create_key("live", &["webhooks:read"]).await;
    let (_, writer) = gw.create_key("live", WRITE).await;
    let good = json!({"url": "https://93.184.216.34/h", "events": ["agent.run.completed"]});
    assert_error(
        create(&gw, &reader, good.clone()).await,
        403,
        "permission_error",
    )
    .await;
    let resp = call(&gw, &reader, Method::GET, "/v1/webhooks", None).await;
    assert_eq!(resp.status(), 200);

    for (url, events) in [
        ("http://93.184.216.34/h", json!(["agent.run.completed"])),
        ("https://127.0.0.1/h", json!(["agent.run.completed"])),
        ("https://10.0.0.8/h", json!(["agent.run.completed"])),
        (
            "https://169.254.169.254/latest/meta-data",
            json!(["agent.run.completed"]),
        ),
        ("https://localhost/h", json!(["agent.run.completed"])),
        ("not a url", json!(["agent.run.completed"])),
        ("https://93.184.216.34/h", json!(["agent.run.exploded"])),
        ("https://93.184.216.34/h", json!(["*"])),
        ("https://93.184.216.34/h", json!([])),
        ("https://93.184.216.34/h", json!("agent.run.*")),
    ] {
        let resp = create(&gw, &writer, json!({"url": url, "events": events})).await;
        assert_error(resp, 400, "invalid_request_error").await;
    }
    for body in [
        json!({"events": ["agent.run.*"]}),
        json!({"url": "https://93.184.216.34/h"}),
        json!([1]),
        json!({"url": "https://93.184.216.34/h", "events": ["agent.run.*"], "x": 1}),
    ] {
        assert_error(
            create(&gw, &writer, body).await,
            400,
            "invalid_request_error",
        )
        .await;
    }
    let list: Value = call(&gw, &writer, Method::GET, "/v1/webhooks", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        list["data"],
        json!([]),
        "nothing was created by a refused request"
    );
}

#[tokio::test]
async fn insecure_targets_can_be_allowed_for_development() {
    let gw = Gateway::builder()
        .config(|c| c.webhooks.allow_insecure_targets = true)
        .start()
        .await;
    let (_, key) = gw.create_key("test", WRITE).await;
    let resp = create(
        &gw,
        &key,
        json!({"url": "http://127.0.0.1:4000/hook", "events": ["agent.run.*"]}),
    )
    .await;
    assert_eq!(resp.status(), 201);
}

/// A URL whose host name the name server does not answer for is refused with a 400 once
/// [`svcgate::webhooks::endpoint::RESOLVE_TIMEOUT`] (5 s) has passed, not after the resolver's
/// own 30 s, and the gateway answers other requests meanwhile: the name is resolved off the
/// threads that serve requests.
#[tokio::test]
async fn a_url_whose_name_does_not_resolve_in_time_is_refused_and_holds_up_nobody() {
    // A name server that takes every query and never answers, on a loopback address of its own.
    let silent = (1..=250u8)
        .find_map(|n| {
            std::net::UdpSocket::bind(("127.53.0.".to_string() + &n.to_string(), 53)).ok()
        })
        .expect("a free loopback address for a name server (tests run as root)");
    // One thread serves every request: a lookup on it would hold up all of them.
    let gw = Gateway::builder()
        .name_server(silent.local_addr().unwrap().ip())
        .config(|c| c.server.threads = 1)
        .start()
        .await;
    let (_, key) = gw.create_key("live", WRITE).await;
    let started = Instant::now();
    let create = gw
        .request(Method::POST, "/v1/webhooks")
        .bearer_auth(&key)
        .json(&json!({"url": "https://hooks.stalled.example/in", "events": ["agent.run.*"]}))
        .send();
    let others = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut slowest = Duration::ZERO;
        for _ in 0..5 {
            let asked = Instant::now();
            let resp = gw
                .request(Method::GET, "/v1/webhooks")
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            slowest = slowest.max(asked.elapsed());
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        slowest
    };
    let (resp, slowest) = tokio::join!(create, others);
    let took = started.elapsed();
    let resp = resp.unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("did not resolve in time"), "{message}");
    assert!(
        (Duration::from_secs(5)..Duration::from_secs(15)).contains(&took),
        "refused after {took:?}"
    );
    let mut query = [0u8; 512];
    silent.set_nonblocking(true).unwrap();
    assert!(silent.recv(&mut query).is_ok(), "the name was asked for");
    assert!(
        slowest < Duration::from_secs(2),
        "another request waited {slowest:?} meanwhile"
    );

    // A lookup given up on ends there: it holds no thread while the name server (asked to be
    // waited for 30 s) keeps it waiting. The system resolver held one blocking thread each.
    let threads = || {
        std::fs::read_dir(format!("/proc/{}/task", gw.pid()))
            .unwrap()
            .count()
    };
    let before = threads();
    let creates = (0..8).map(|i| {
        gw.request(Method::POST, "/v1/webhooks")
            .bearer_auth(&key)
            .json(&json!({"url": format!("https://hooks-{i}.stalled.example/in"), "events": ["agent.run.*"]}))
            .send()
    });
    for resp in futures_util::future::join_all(creates).await {
        assert_eq!(resp.unwrap().status(), 400);
    }
    let after = threads();
    assert!(
        after < before + 4,
        "{before} threads before eight lookups that were given up, {after} after"
    );
}

#[tokio::test]
async fn a_url_on_port_zero_is_refused_on_create_and_update() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", WRITE).await;
    let zero = "https://8.8.8.8:0/x";

    let resp = create(&gw, &key, json!({"url": zero, "events": ["agent.run.*"]})).await;
    let body = assert_error(resp, 400, "invalid_request_error").await;
    assert!(
        body["error"]["message"].as_str().unwrap().contains("port"),
        "the message names the problem: {body}"
    );

    let created: Value = create(
        &gw,
        &key,
        json!({"url": "https://8.8.8.8/x", "events": ["agent.run.*"]}),
    )
    .await
    .json()
    .await
    .unwrap();
    let path = format!("/v1/webhooks/{}", created["id"].as_str().unwrap());
    let resp = call(&gw, &key, Method::PATCH, &path, Some(json!({"url": zero}))).await;
    assert_error(resp, 400, "invalid_request_error").await;
    let got: Value = call(&gw, &key, Method::GET, &path, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        got["url"], "https://8.8.8.8/x",
        "a refused update changes nothing"
    );
}

#[tokio::test]
async fn a_workspace_has_at_most_a_hundred_endpoints_per_environment() {
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(|c| {
            c.webhooks.allow_insecure_targets = true;
            c.limits.live_burst = 300;
        })
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, live) = gw.create_key_in(&ws, "live", WRITE).await;
    let (_, test) = gw.create_key_in(&ws, "test", WRITE).await;
    let body = json!({"url": "http://127.0.0.1:4000/hook", "events": ["agent.run.*"]});
    let mut last = None;
    for i in 0..100 {
        let resp = create(&gw, &live, body.clone()).await;
        assert_eq!(resp.status(), 201, "endpoint {i}");
        last = Some(
            resp.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let resp = create(&gw, &live, body.clone()).await;
    let error = assert_error(resp, 400, "invalid_request_error").await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("100 live webhook endpoints"),
        "{error}"
    );
    // Test mode has its own hundred: a test key cannot crowd out live endpoints, nor the
    // reverse. Another workspace is not affected; deleting one makes room.
    assert_eq!(create(&gw, &test, body.clone()).await.status(), 201);
    let elsewhere = gw.create_workspace().await;
    let (_, other) = gw.create_key_in(&elsewhere, "live", WRITE).await;
    assert_eq!(create(&gw, &other, body.clone()).await.status(), 201);
    let path = format!("/v1/webhooks/{}", last.unwrap());
    let resp = gw
        .request(Method::DELETE, &path)
        .bearer_auth(&live)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    assert_eq!(create(&gw, &live, body).await.status(), 201);
}
