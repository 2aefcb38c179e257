//! Metering from the outside: what requests cost, budgets that hold, rate limits shared by
//! replicas, and an audit log that loses nothing.

mod audit;
mod budgets;
#[path = "../common/mod.rs"]
mod common;
mod leases;
mod outage;
mod rate_limits;
mod shutdown;
mod spend;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;
use svcgate::config::{Config, ProjectBudgetConfig, RouteConfig};
use svcgate::metering::config::StoreDown;
use svcgate::metering::Credits;

async fn usage(gw: &Gateway, ws: &str) -> Value {
    gw.admin_request(Method::GET, &format!("/admin/v1/usage?workspace={ws}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Creates a workspace from `body` (budgets, thresholds) through the admin API; returns its id.
async fn workspace_with(gw: &Gateway, body: Value) -> String {
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/workspaces")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn audit(gw: &Gateway, query: &str) -> Vec<Value> {
    let page = gw.admin_get(&format!("/admin/v1/audit?{query}")).await;
    page["data"].as_array().cloned().unwrap_or_default()
}

async fn set_key_budget(gw: &Gateway, id: &str, budget: f64) {
    let resp = gw
        .admin_request(Method::PATCH, &format!("/admin/v1/keys/{id}"))
        .json(&json!({"monthly_budget": budget}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// What the spool files in `dir` hold: spend (micro-credits, every `total` of every spend
/// file, its batch's and its pending spend's) and audit records.
fn spooled(dir: &std::path::Path) -> (i64, usize) {
    fn totals(value: &Value) -> i64 {
        match value {
            Value::Object(fields) => fields
                .iter()
                .map(|(name, v)| match (name.as_str(), v) {
                    ("total", Value::Number(n)) => n.as_i64().unwrap_or(0),
                    _ => totals(v),
                })
                .sum(),
            Value::Array(items) => items.iter().map(totals).sum(),
            _ => 0,
        }
    }
    let read = |name: &String| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let spend = spool_files(dir, "spend-")
        .iter()
        .filter(|f| f.ends_with(".json"))
        .map(|f| totals(&serde_json::from_str(&read(f)).unwrap_or(Value::Null)))
        .sum();
    let audit = spool_files(dir, "audit-")
        .iter()
        .filter(|f| f.ends_with(".jsonl"))
        .map(|f| read(f).lines().count())
        .sum();
    (spend, audit)
}

/// A gateway on the Redis at `url`, in namespace `ns`, spooling to `spool`.
fn spooling(url: &str, ns: &str, spool: &std::path::Path) -> GatewayBuilder {
    Gateway::builder().redis(url, ns).spool_dir(spool)
}

/// Waits up to 10 s for workspace `ws` to have `records` audit records (the first page).
async fn until_audited(gw: &Gateway, ws: &str, records: usize, what: &str) {
    eventually(Duration::from_secs(10), || async {
        audit(gw, &format!("workspace={ws}")).await.len() == records
    })
    .await
    .expect(what);
}

/// Waits up to 10 s for key `id` of workspace `ws` to have been charged `credits` this month.
async fn until_charged(gw: &Gateway, ws: &str, id: &str, credits: f64, what: &str) {
    eventually(Duration::from_secs(10), || async {
        usage(gw, ws).await["keys"][id] == credits
    })
    .await
    .expect(what);
}

/// Waits up to 10 s for no file in `dir` to start with `prefix`.
async fn until_spool_empty(dir: &std::path::Path, prefix: &str, what: &str) {
    eventually(Duration::from_secs(10), || async {
        spool_files(dir, prefix).is_empty()
    })
    .await
    .expect(what);
}

/// The names of the files in `dir` that start with `prefix`.
fn spool_files(dir: &std::path::Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|files| {
            files
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|f| f.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A gateway from `builder`, a workspace, and a key of it (id, value) used twice, the second
/// time once the first is flushed (2 credits spent), so the key is cached before Redis goes
/// away: a first use may race the key cache's sync of the key's own creation, which takes back
/// what it fetched (and with Redis gone an uncached key gets 503).
async fn warmed_up(builder: GatewayBuilder) -> (Gateway, String, String, String) {
    let gw = builder.start().await;
    let ws = gw.create_workspace().await;
    let (id, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    for n in [1.0, 2.0] {
        assert_eq!(gw.chat(&key).await.status(), 200);
        eventually(Duration::from_secs(5), || async {
            usage(&gw, &ws).await["keys"][&id] == n
        })
        .await
        .expect("the spend is flushed");
    }
    // The audit records go out beside the spend, not with it: an outage begun after the spend
    // landed would find the last record still in memory, and spool it with the outage's.
    until_audited(&gw, &ws, 2, "the warm-up's audit records are written").await;
    (gw, ws, id, key)
}

/// A gateway from `builder`, warmed up, whose Redis then stops, and that serves four requests
/// (one credit each) in the outage: 6 credits spent in all.
async fn served_in_an_outage(
    builder: GatewayBuilder,
    redis: &mut RedisServer,
) -> (Gateway, String, String, String) {
    let (gw, ws, id, key) = warmed_up(builder).await;
    redis.stop().await;
    for _ in 0..4 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    (gw, ws, id, key)
}

fn sigkill(gw: &mut Gateway) {
    std::process::Command::new("kill")
        .args(["-KILL", &gw.pid().to_string()])
        .status()
        .unwrap();
    gw.wait_exit(Duration::from_secs(5))
        .expect("the gateway is killed");
}

fn sigterm(gw: &mut Gateway) {
    std::process::Command::new("kill")
        .args(["-TERM", &gw.pid().to_string()])
        .status()
        .unwrap();
    gw.wait_exit(Duration::from_secs(15))
        .expect("the gateway stops after SIGTERM");
}
