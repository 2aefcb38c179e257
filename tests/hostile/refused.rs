//! A credential that exists and is refused (revoked, an expired token): sent again and again,
//! it meets its key's rate limit, and fills the audit log only a few records a second.

use reqwest::Method;
use serde_json::Value;
use std::time::Duration;

use super::common::*;

/// The audit records of `key_id` in the demo workspace.
async fn records_of(gw: &Gateway, key_id: &str) -> Vec<Value> {
    let page = gw
        .admin_get(&format!(
            "/admin/v1/audit?workspace={DEMO_WS}&key_id={key_id}&limit=1000"
        ))
        .await;
    page["data"].as_array().cloned().unwrap_or_default()
}

/// `GET /v1/models` with `key`.
async fn models(gw: &Gateway, key: &str) -> reqwest::Response {
    gw.request(Method::GET, "/v1/models")
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_revoked_key_sent_300_times_gets_only_401_and_429_and_few_audit_records() {
    let gw = Gateway::builder()
        .config(|c| {
            c.limits.live_requests_per_minute = 120;
            c.limits.live_burst = 40;
        })
        .start()
        .await;
    let (key_id, key) = gw.create_key("live", &["models:read"]).await;
    gw.revoke(&key_id).await;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for _ in 0..300 {
        let resp = models(&gw, &key).await;
        let status = resp.status().as_u16();
        if status == 429 {
            assert!(resp.headers().contains_key("retry-after"));
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error"]["code"], "rate_limit_error");
        }
        *statuses.entry(status).or_default() += 1;
    }
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        [401, 429],
        "{statuses:?}"
    );
    assert!(statuses[&429] >= 200, "the limit held: {statuses:?}");
    // Everything the gateway will write about them is written within a few flushes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let records = records_of(&gw, &key_id).await;
    assert!(!records.is_empty(), "the refusals are audited");
    assert!(records.len() <= 100, "{} audit records", records.len());
    // Every request is accounted for: kept, or counted in a later record or the metric.
    let counted: u64 = records
        .iter()
        .map(|r| r["suppressed"].as_u64().expect("a refused record says so"))
        .sum();
    let metrics = gw.metrics_text().await;
    let suppressed = metric(&metrics, "svcgate_audit_records_suppressed_total");
    assert_eq!(records.len() as u64 + suppressed, 300, "{records:?}");
    assert!(counted <= suppressed);
}

#[tokio::test]
async fn refusals_per_key_and_second_are_capped_by_configuration() {
    let gw = Gateway::builder()
        .config(|c| c.metering.refused_audit_per_second = 1)
        .start()
        .await;
    let (key_id, key) = gw.create_key("live", &["models:read"]).await;
    gw.revoke(&key_id).await;
    let started = std::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(models(&gw, &key).await.status(), 401);
    }
    let seconds = started.elapsed().as_secs() + 2;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let records = records_of(&gw, &key_id).await;
    assert!(
        !records.is_empty() && records.len() as u64 <= seconds,
        "{} records in {seconds} s",
        records.len()
    );
}

/// The value of an unlabelled counter in a Prometheus text page (0 if absent).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}
