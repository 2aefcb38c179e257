//! The webhook worker end to end: real gateway and worker processes, real Redis, real
//! receivers on loopback.

mod catalog;
#[path = "../common/mod.rs"]
mod common;
mod delivery;
mod formats;
mod mail;
mod operators;
mod rate;
mod retries;
mod sandbox;
mod stream;
mod tracing;
mod volume;
mod workers;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use svcgate::config::{Config, SmtpTls};

const SCOPES: &[&str] = &["webhooks:read", "webhooks:write"];

/// `[webhooks]` for tests: loopback receivers, a retry schedule in seconds.
fn webhooks(outbox: &std::path::Path, schedule: &[u64], timeout: u64) -> impl FnOnce(&mut Config) {
    let outbox = outbox.display().to_string();
    let schedule = schedule.to_vec();
    move |c| {
        c.webhooks.allow_insecure_targets = true;
        c.webhooks.retry_schedule_seconds = schedule;
        c.webhooks.timeout_seconds = timeout;
        c.webhooks.outbox_dir = outbox;
        c.webhooks.max_in_flight_per_endpoint = 2;
    }
}

/// `[smtp]` for a plain relay on loopback at `port`.
fn smtp_relay(port: u16) -> impl FnOnce(&mut Config) {
    move |c| {
        c.smtp.host = Some("127.0.0.1".to_string());
        c.smtp.port = port;
        c.smtp.from = "webhooks@svcgate.test".to_string();
    }
}

struct Setup {
    gw: Gateway,
    ws: String,
    key: String,
    outbox: tempfile::TempDir,
    _ns: TestNamespace,
}

async fn setup(schedule: &[u64], timeout: u64, no_worker: bool) -> Setup {
    let ns = TestNamespace::new();
    let outbox = tempfile::tempdir().unwrap();
    let mut builder = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(webhooks(outbox.path(), schedule, timeout));
    if no_worker {
        builder = builder.no_worker();
    }
    let gw = builder.start().await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", SCOPES).await;
    Setup {
        gw,
        ws,
        key,
        outbox,
        _ns: ns,
    }
}

/// Creates an endpoint; returns (id, secret).
async fn endpoint(gw: &Gateway, key: &str, url: &str, events: &[&str]) -> (String, String) {
    let resp = gw
        .request(Method::POST, "/v1/webhooks")
        .bearer_auth(key)
        .json(&json!({"url": url, "events": events}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let body: Value = resp.json().await.unwrap();
    (
        body["id"].as_str().unwrap().to_string(),
        body["secret"].as_str().unwrap().to_string(),
    )
}

/// Publishes an event through the admin API; returns its id.
async fn publish(gw: &Gateway, ws: &str, event_type: &str, environment: &str) -> String {
    let data = json!({"run_id": "run_42", "note": "ünïcode ✓"});
    gw.publish_event(ws, event_type, environment, data).await
}

/// `POST /v1/webhooks/{id}/replay` with the setup's key.
async fn replay(s: &Setup, id: &str, body: Value) -> reqwest::Response {
    let path = format!("/v1/webhooks/{id}/replay");
    call(&s.gw, &s.key, Method::POST, &path, Some(body)).await
}

async fn deliveries(gw: &Gateway, key: &str, endpoint: &str) -> Vec<Value> {
    let resp = call(
        gw,
        key,
        Method::GET,
        &format!("/v1/webhooks/{endpoint}/deliveries"),
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    body["data"].as_array().unwrap().clone()
}

async fn endpoint_status(gw: &Gateway, key: &str, endpoint: &str) -> String {
    let resp = call(
        gw,
        key,
        Method::GET,
        &format!("/v1/webhooks/{endpoint}"),
        None,
    )
    .await;
    let body: Value = resp.json().await.unwrap();
    body["status"].as_str().unwrap_or_default().to_string()
}

/// Waits until `path` of `receiver` got `n` requests.
async fn received(receiver: &Receiver, path: &str, n: usize, limit: Duration) -> Vec<Received> {
    let got = eventually(limit, || async { receiver.received(path).len() >= n }).await;
    let seen = receiver.received(path);
    assert!(
        got.is_some(),
        "{path}: expected {n} requests, got {}",
        seen.len()
    );
    seen
}

/// The event ids `receiver` got at `path`, sorted, repeats kept.
fn event_ids(receiver: &Receiver, path: &str) -> Vec<String> {
    let mut ids: Vec<String> = receiver
        .received(path)
        .iter()
        .map(|r| header(r, "service-event-id").to_string())
        .collect();
    ids.sort();
    ids
}

fn header<'a>(r: &'a Received, name: &str) -> &'a str {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// An admin API call with a JSON body, or none.
async fn admin(gw: &Gateway, method: Method, path: &str, body: Option<Value>) -> reqwest::Response {
    let req = gw.admin_request(method, path);
    match body {
        Some(body) => req.json(&body),
        None => req,
    }
    .send()
    .await
    .unwrap()
}

/// A connection to the event log of `s`'s namespace, and the log's key.
async fn event_log(s: &Setup) -> (redis::aio::MultiplexedConnection, String) {
    let client = redis::Client::open(redis_url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    (conn, format!("{{{}}}:events", s._ns.name))
}
