//! Metering from the outside: what requests cost, budgets that hold, rate limits shared by
//! replicas, and an audit log that loses nothing.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;
use svcgate::config::{Config, ProjectBudgetConfig, RouteConfig};
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

#[tokio::test]
async fn spend_comes_from_the_backend_or_the_route_price() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (id, key) = gw
        .create_key("live", &["chat.completions:create", "images:create"])
        .await;
    for _ in 0..3 {
        let resp = gw
            .request(Method::POST, "/v1/chat/completions")
            .bearer_auth(&key)
            .header("service-project", "team-a")
            .json(&json!({"model": "m1"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    eventually(Duration::from_secs(5), || async {
        usage(&gw, DEMO_WS).await["total"] == 1.5
    })
    .await
    .expect("3 × the backend's 0.5 credits");
    let report = usage(&gw, DEMO_WS).await;
    assert_eq!(report["keys"][&id], 1.5);
    assert_eq!(report["projects"]["team-a"], 1.5);
    assert_eq!(report["month"].as_str().unwrap().len(), 7);

    // Without a backend figure the route's price applies (simulated images: 4 credits).
    let sim = Gateway::builder().start().await;
    let (_, key) = sim.create_key("live", &["images:create"]).await;
    let resp = sim
        .request(Method::POST, "/v1/images/generations")
        .bearer_auth(&key)
        .json(&json!({"prompt": "a cat"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    eventually(Duration::from_secs(5), || async {
        usage(&sim, DEMO_WS).await["total"] == 4.0
    })
    .await
    .expect("the route price is charged");
}

#[tokio::test]
async fn test_keys_leave_no_spend_and_refused_requests_cost_nothing() {
    let gw = Gateway::builder().start().await;
    let (_, test_key) = gw.create_key("test", &["chat.completions:create"]).await;
    let (_, live_key) = gw.create_key("live", &["models:read"]).await;
    for _ in 0..3 {
        assert_eq!(gw.chat(&test_key).await.status(), 200);
        assert_eq!(gw.chat(&live_key).await.status(), 403);
    }
    // Audit records arrive for all six; spend stays at zero.
    until_audited(&gw, DEMO_WS, 6, "every authenticated request is audited").await;
    let report = usage(&gw, DEMO_WS).await;
    assert_eq!(report["total"], 0.0);
    assert_eq!(report["keys"], json!({}));
}

#[tokio::test]
async fn a_revoked_key_still_in_use_is_audited_with_who_used_it() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    gw.revoke(&id).await;
    assert_error(gw.chat(&key).await, 401, "authentication_error").await;
    // An unknown key is attributed to nobody: nothing to write.
    let unknown = svcgate::keys::format::generate(svcgate::keys::Environment::Live).value;
    assert_error(gw.chat(&unknown).await, 401, "authentication_error").await;
    let records = eventually(Duration::from_secs(5), || async {
        audit(&gw, &format!("workspace={DEMO_WS}&key_id={id}"))
            .await
            .len()
            == 1
    })
    .await;
    assert!(records.is_some(), "the refused request is audited");
    let record = &audit(&gw, &format!("workspace={DEMO_WS}&key_id={id}")).await[0];
    assert_eq!(record["status"], 401);
    assert_eq!(record["credits"], 0.0);
    assert_eq!(record["client_ip"], "127.0.0.1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(audit(&gw, &format!("workspace={DEMO_WS}")).await.len(), 1);
    assert_eq!(usage(&gw, DEMO_WS).await["total"], 0.0);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_audited_address_is_the_forwarded_client() {
    // (trusted proxies, audited client, X-Forwarded-For the backend gets)
    for (trusted, expected, forwarded) in [
        (
            vec!["127.0.0.1/32".to_string()],
            "203.0.113.7",
            "198.51.100.9, 203.0.113.7, 127.0.0.1",
        ),
        // An untrusted peer's list is its own claim: the backend gets the peer alone.
        (vec![], "127.0.0.1", "127.0.0.1"),
    ] {
        let live = RecordingUpstream::start("live").await;
        let gw = Gateway::builder()
            .live(live.addr)
            .config(|c| c.server.trusted_proxies = trusted.clone())
            .start()
            .await;
        let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
        let resp = gw
            .request(Method::POST, "/v1/chat/completions")
            .bearer_auth(&key)
            .header("X-Forwarded-For", "198.51.100.9")
            .header("X-Forwarded-For", "203.0.113.7")
            .json(&json!({"model": "m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let seen = &live.requests()[0].headers;
        let values: Vec<_> = seen.get_all("x-forwarded-for").iter().collect();
        assert_eq!(values, [forwarded], "trusted_proxies = {trusted:?}");
        let query = format!("workspace={DEMO_WS}&key_id={id}");
        eventually(Duration::from_secs(5), || async {
            audit(&gw, &query).await.len() == 1
        })
        .await
        .expect("audited");
        assert_eq!(
            audit(&gw, &query).await[0]["client_ip"],
            expected,
            "trusted_proxies = {trusted:?}"
        );
    }
}

#[tokio::test]
async fn a_spent_key_budget_gets_402_before_the_backend() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    set_key_budget(&gw, &id, 1.0).await;
    // 0.5 each: two requests spend the budget.
    assert_eq!(gw.chat(&key).await.status(), 200);
    assert_eq!(gw.chat(&key).await.status(), 200);
    let refused = gw.chat(&key).await;
    // The rate limit was checked before the budget: its headers are on the 402 too.
    assert!(refused.headers().contains_key("ratelimit-remaining"));
    let body = assert_error(refused, 402, "budget_exceeded").await;
    assert!(body["error"]["message"].as_str().unwrap().contains("key"));
    assert_eq!(
        live.requests().len(),
        2,
        "a refused request never reaches the backend"
    );
}

#[tokio::test]
async fn project_budgets_from_the_admin_api_apply() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = gw
        .admin_request(
            Method::PUT,
            &format!("/admin/v1/workspaces/{DEMO_WS}/projects/team-b/budget"),
        )
        .json(&json!({"monthly_budget": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Removing a budget takes an explicit `null`; an empty body is a mistake, not a removal.
    let resp = gw
        .admin_request(
            Method::PUT,
            &format!("/admin/v1/workspaces/{DEMO_WS}/projects/team-b/budget"),
        )
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
    let send = |project: &'static str| {
        gw.request(Method::POST, "/v1/chat/completions")
            .bearer_auth(&key)
            .header("service-project", project)
            .json(&json!({}))
            .send()
    };
    // The budget reaches the replica with its first flush after the project is seen.
    assert_eq!(send("team-b").await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(send("team-b").await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_error(send("team-b").await.unwrap(), 402, "budget_exceeded").await;
    assert_eq!(
        send("team-c").await.unwrap().status(),
        200,
        "other projects go on"
    );

    for (path, body, status) in [
        (
            "/admin/v1/workspaces/ws_demo/projects/bad%20name/budget",
            json!({"monthly_budget": 1}),
            400,
        ),
        (
            "/admin/v1/workspaces/ws_none/projects/p/budget",
            json!({"monthly_budget": 1}),
            404,
        ),
        (
            "/admin/v1/workspaces/ws_demo/projects/p/budget",
            json!({"monthly_budget": -1}),
            400,
        ),
    ] {
        let resp = gw
            .admin_request(Method::PUT, path)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{path}");
    }
}

#[tokio::test]
async fn project_budgets_are_read_back_with_where_they_come_from() {
    let gw = Gateway::builder()
        .config(|c| {
            c.metering.project_budgets = vec![ProjectBudgetConfig {
                workspace: "ws_demo".to_string(),
                project: "team-a".to_string(),
                monthly_budget: Credits::from_micros(5_000_000),
            }]
        })
        .start()
        .await;
    let budget = |project: &str| {
        let path = format!("/admin/v1/workspaces/{DEMO_WS}/projects/{project}/budget");
        let gw = &gw;
        async move { gw.admin_get(&path).await }
    };
    let all = || async {
        gw.admin_get(&format!("/admin/v1/workspaces/{DEMO_WS}/projects"))
            .await
    };
    let entry = |project: &str, budget: Value, source: Value| json!({"workspace": DEMO_WS, "project": project, "monthly_budget": budget, "source": source});
    assert_eq!(
        all().await["data"],
        json!([entry("team-a", json!(5.0), json!("config"))])
    );
    assert_eq!(
        budget("team-a").await,
        entry("team-a", json!(5.0), json!("config"))
    );
    assert_eq!(
        budget("team-z").await,
        entry("team-z", Value::Null, Value::Null)
    );

    let put = |project: &str, body: Value| {
        let path = format!("/admin/v1/workspaces/{DEMO_WS}/projects/{project}/budget");
        gw.admin_request(Method::PUT, &path).json(&body).send()
    };
    let set: Value = put("team-a", json!({"monthly_budget": 2}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        set,
        entry("team-a", json!(2.0), json!("api")),
        "the API's overrides"
    );
    put("team-b", json!({"monthly_budget": 3})).await.unwrap();
    assert_eq!(
        all().await["data"],
        json!([
            entry("team-a", json!(2.0), json!("api")),
            entry("team-b", json!(3.0), json!("api"))
        ])
    );
    // Removed through the API, the configuration's applies again.
    let removed: Value = put("team-a", json!({"monthly_budget": null}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(removed, entry("team-a", json!(5.0), json!("config")));

    for (path, status) in [
        (
            "/admin/v1/workspaces/ws_demo/projects/bad%20name/budget",
            400,
        ),
        ("/admin/v1/workspaces/ws_none/projects/p/budget", 404),
        ("/admin/v1/workspaces/ws_none/projects", 404),
    ] {
        let resp = gw.admin_request(Method::GET, path).send().await.unwrap();
        assert_eq!(resp.status(), status, "{path}");
    }

    // On Redis.
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let path = format!("/admin/v1/workspaces/{ws}/projects/team-c/budget");
    let resp = gw
        .admin_request(Method::PUT, &path)
        .json(&json!({"monthly_budget": 1.5}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let listed = gw
        .admin_get(&format!("/admin/v1/workspaces/{ws}/projects"))
        .await;
    assert_eq!(listed["data"][0]["monthly_budget"], 1.5);
    assert_eq!(listed["data"][0]["source"], "api");
}

#[tokio::test]
async fn two_replicas_keep_a_budget_exactly_when_requests_are_paced() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let (id, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    set_key_budget(&a, &id, 5.0).await;
    // Simulated chat costs 1 credit; replicas alternate; each pause spans several flushes.
    let mut ok = 0;
    for i in 0..10 {
        let gw = if i % 2 == 0 { &a } else { &b };
        match gw.chat(&key).await.status().as_u16() {
            200 => ok += 1,
            402 => {}
            other => panic!("unexpected {other}"),
        }
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    assert_eq!(ok, 5, "exactly the budget, across two replicas");
    until_charged(&a, &ws, &id, 5.0, "the spend of both replicas adds up").await;
}

#[tokio::test]
async fn a_replica_new_to_a_spent_key_refuses_its_first_request() {
    let ns = TestNamespace::new();
    let a = on_redis(&ns).await;
    let ws = a.create_workspace().await;
    let (id, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    set_key_budget(&a, &id, 2.0).await;
    for _ in 0..2 {
        assert_eq!(a.chat(&key).await.status(), 200);
    }
    until_charged(&a, &ws, &id, 2.0, "replica A's spend reaches the store").await;
    // Replica B starts after (as after a restart, or a key forgotten after two idle minutes)
    // and, with a minute between scheduled flushes, learns the key's total only by reading it
    // for the request: unknown is not zero.
    let b = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(|c| c.metering.flush_interval_ms = 60000)
        .start()
        .await;
    assert_error(b.chat(&key).await, 402, "budget_exceeded").await;
    // And a key with budget left goes through, its total read the same way.
    let (other_id, other) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    set_key_budget(&a, &other_id, 2.0).await;
    assert_eq!(b.chat(&other).await.status(), 200);
}

#[tokio::test]
async fn a_workspace_new_to_a_replica_is_held_to_its_credits_from_its_first_request() {
    let ns = TestNamespace::new();
    // Scheduled flushes 2 s apart: only the first request's own flush can stop the fourth.
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(|c| c.metering.flush_interval_ms = 2000)
        .start()
        .await;
    let ws = workspace_with(
        &gw,
        json!({"name": "Small", "admin_emails": ["ops@example.com"], "monthly_credits": 3}),
    )
    .await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    // One credit each (the simulated backend's price). The replica learns the workspace's
    // credits at its first request, not at its next scheduled flush, which admitted all ten.
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(gw.chat(&key).await.status().as_u16());
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    assert_eq!(statuses, [200, 200, 200, 402, 402, 402, 402, 402, 402, 402]);
}

#[tokio::test]
async fn raising_a_spent_workspace_s_credits_lets_its_requests_through_again() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = workspace_with(
        &a,
        json!({"name": "Spent", "admin_emails": ["ops@example.com"], "monthly_credits": 2}),
    )
    .await;
    let (_, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    for _ in 0..2 {
        assert_eq!(a.chat(&key).await.status(), 200);
    }
    // Replica a counts its own spend at once.
    assert_error(a.chat(&key).await, 402, "budget_exceeded").await;
    eventually(Duration::from_secs(5), || async {
        usage(&a, &ws).await["total"] == 2.0
    })
    .await
    .expect("spend flushed");
    let resp = a
        .admin_request(Method::PATCH, &format!("/admin/v1/workspaces/{ws}"))
        .json(&json!({"monthly_credits": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Both replicas learn the new credits from Redis on a flush.
    for gw in [&a, &b] {
        eventually(Duration::from_secs(5), || async {
            gw.chat(&key).await.status() == 200
        })
        .await
        .expect("admitted again once the credits are raised");
    }
}

#[tokio::test]
async fn credits_low_fires_once_per_crossing_however_many_replicas_see_it() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = workspace_with(&a, json!({"name": "Low", "admin_emails": ["ops@example.com"], "monthly_credits": 10, "credits_low_threshold": 7.5})).await;
    let (_, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    for i in 0..6 {
        let gw = if i % 2 == 0 { &a } else { &b };
        assert_eq!(gw.chat(&key).await.status(), 200);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    eventually(Duration::from_secs(5), || async {
        usage(&a, &ws).await["total"] == 6.0
    })
    .await
    .expect("spend flushed");
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let events: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("{{{}}}:events", ns.name))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let low: Vec<_> = events
        .ids
        .iter()
        .filter(|e| e.get::<String>("type").as_deref() == Some("billing.credits.low"))
        .collect();
    assert_eq!(low.len(), 1, "one event for the crossing");
    let data: Value = serde_json::from_str(&low[0].get::<String>("data").unwrap()).unwrap();
    assert_eq!(data["workspace"], ws.as_str());
    assert_eq!(data["threshold"], 7.5);
    assert!(data["remaining"].as_f64().unwrap() < 7.5);
    assert_eq!(data["month"].as_str().unwrap().len(), 7);
    // The workspace's credits end at 10: the eleventh credit is refused.
    for i in 0..6 {
        let gw = if i % 2 == 0 { &a } else { &b };
        gw.chat(&key).await;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert_error(a.chat(&key).await, 402, "budget_exceeded").await;
}

#[tokio::test]
async fn rate_limits_answer_429_with_headers_and_are_shared_by_replicas() {
    let ns = TestNamespace::new();
    let limits = |c: &mut Config| {
        c.limits.live_requests_per_minute = 6;
        c.limits.live_burst = 6;
    };
    let a = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(limits)
        .start()
        .await;
    let b = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(limits)
        .start()
        .await;
    let ws = a.create_workspace().await;
    let (_, key) = a
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let resp = a.chat(&key).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["ratelimit-limit"], "6");
    assert_eq!(resp.headers()["ratelimit-remaining"], "5");
    assert!(resp.headers().contains_key("ratelimit-reset"));
    for _ in 0..2 {
        assert_eq!(a.chat(&key).await.status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    // b has seen none of them itself; from its first flush after seeing the key it knows of
    // all of them (until then it can admit what one flush interval allows: the documented
    // bound).
    assert_eq!(b.chat(&key).await.status(), 200);
    tokio::time::sleep(Duration::from_millis(150)).await;
    for _ in 0..2 {
        assert_eq!(b.chat(&key).await.status(), 200);
    }
    let resp = b.chat(&key).await;
    assert!(resp.headers().contains_key("retry-after"));
    assert_eq!(resp.headers()["ratelimit-remaining"], "0");
    assert_error(resp, 429, "rate_limit_error").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_error(a.chat(&key).await, 429, "rate_limit_error").await;
}

#[tokio::test]
async fn test_keys_have_limits_of_their_own() {
    let gw = Gateway::builder()
        .config(|c| {
            c.limits.live_requests_per_minute = 2;
            c.limits.live_burst = 2;
            c.limits.test_requests_per_minute = 4;
            c.limits.test_burst = 4;
        })
        .start()
        .await;
    let (_, live) = gw.create_key("live", &["chat.completions:create"]).await;
    let (_, test) = gw.create_key("test", &["chat.completions:create"]).await;
    for _ in 0..2 {
        assert_eq!(gw.chat(&live).await.status(), 200);
    }
    assert_error(gw.chat(&live).await, 429, "rate_limit_error").await;
    let first = gw.chat(&test).await;
    assert_eq!(first.headers()["ratelimit-limit"], "4");
    for _ in 0..3 {
        assert_eq!(gw.chat(&test).await.status(), 200);
    }
    assert_error(gw.chat(&test).await, 429, "rate_limit_error").await;
}

#[tokio::test]
async fn a_head_request_is_not_charged_the_routes_price() {
    let gw = Gateway::builder()
        .config(|c| {
            c.routes = vec![RouteConfig {
                method: "GET".to_string(),
                path: "/v1/videos/{id}".to_string(),
                scope: "videos:read".to_string(),
                price: Credits::from_micros(2_000_000),
            }]
        })
        .start()
        .await;
    let (id, key) = gw.create_key("live", &["videos:read"]).await;
    for method in [Method::HEAD, Method::GET] {
        // A listing orders the records of one millisecond by request id: the requests arrive
        // in different milliseconds, so the listing's order is theirs.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let resp = gw
            .request(method, "/v1/videos/vid_1")
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let records = eventually(Duration::from_secs(5), || async {
        audit(&gw, &format!("workspace={DEMO_WS}&key_id={id}"))
            .await
            .len()
            == 2
    })
    .await;
    assert!(records.is_some(), "both requests are audited");
    let records = audit(&gw, &format!("workspace={DEMO_WS}&key_id={id}")).await;
    let charged: Vec<(&str, f64)> = records
        .iter()
        .map(|r| {
            (
                r["method"].as_str().unwrap(),
                r["credits"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(charged, [("GET", 2.0), ("HEAD", 0.0)], "newest first");
}

#[tokio::test]
async fn refused_requests_count_against_the_keys_rate_limit() {
    let gw = Gateway::builder()
        .config(|c| {
            c.limits.live_requests_per_minute = 3;
            c.limits.live_burst = 3;
        })
        .start()
        .await;
    let (_, key) = gw.create_key("live", &["models:read"]).await;
    let get = |path: &'static str| {
        let req = gw.request(Method::GET, path).bearer_auth(&key);
        async move { req.send().await.unwrap() }
    };
    // Each refusal is answered as such, with the rate headers, and spends the limit.
    let resp = get("/v1/nowhere").await;
    assert_eq!(resp.headers()["ratelimit-remaining"], "2");
    assert_error(resp, 404, "not_found").await;
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .json(&json!({"model": "m1", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 403, "permission_error").await;
    assert_eq!(get("/v1/models").await.status(), 200);
    // Spent: a refusal, and a request that would be served, are both 429 now.
    let resp = get("/v1/nowhere").await;
    assert!(resp.headers().contains_key("retry-after"));
    assert_error(resp, 429, "rate_limit_error").await;
    assert_error(get("/v1/models").await, 429, "rate_limit_error").await;
}

#[tokio::test]
async fn a_refused_budget_is_counted_by_reason() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    set_key_budget(&gw, &id, 0.5).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    assert_error(gw.chat(&key).await, 402, "budget_exceeded").await;
    let counted = eventually(Duration::from_secs(5), || async {
        gw.metrics_text()
            .await
            .contains(r#"svcgate_policy_rejections_total{reason="budget_key"} 1"#)
    })
    .await;
    assert!(counted.is_some(), "the 402 is counted as budget_key");
}

#[tokio::test]
async fn a_key_in_the_path_is_cut_to_its_last_four_in_answers_and_audit_records() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["agents:run"]).await;
    let shown = format!("svc_live_…{}", &key[key.len() - 4..]);
    // No route: the 404 names the path, without the key.
    let resp = gw
        .request(Method::GET, &format!("/v1/{key}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let body = assert_error(resp, 404, "not_found").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(message, format!("no route for GET /v1/{shown}"));
    // A route with a parameter: the backend gets the path as sent, the audit log does not.
    let path = format!("/v1/agents/runs/{key}/approve");
    let resp = gw
        .request(Method::POST, &path)
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(live.requests()[0].path, path);
    // Both requests were authenticated, so both are audited, the 404 too.
    until_audited(&gw, DEMO_WS, 2, "two audit records").await;
    let records = audit(&gw, &format!("workspace={DEMO_WS}")).await;
    let mut seen: Vec<(String, u64)> = records
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().into(),
                r["status"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (format!("/v1/agents/runs/{shown}/approve"), 200),
            (format!("/v1/{shown}"), 404)
        ]
    );
}

#[tokio::test]
async fn the_audit_log_records_who_did_what_and_never_a_secret() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (id, key) = gw
        .create_key("live", &["chat.completions:create", "tokens:create"])
        .await;
    let minted: Value = gw
        .request(Method::POST, "/v1/tokens")
        .bearer_auth(&key)
        .json(&json!({"scopes": ["chat.completions:create"], "metadata": {"user": "u_7"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = minted["value"].as_str().unwrap();
    let resp = gw
        .request(Method::POST, "/v1/chat/completions?stream=false")
        .bearer_auth(token)
        .header("service-project", "web")
        .json(&json!({"model": "gpt-sim", "messages": []}))
        .send()
        .await
        .unwrap();
    let request_id = resp.headers()["service-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(resp.status(), 200);
    assert_eq!(gw.chat("svc_live_nope").await.status(), 401);

    until_audited(
        &gw,
        DEMO_WS,
        2,
        "two authenticated requests, two records (the 401 has no key to record)",
    )
    .await;
    let records = audit(&gw, &format!("workspace={DEMO_WS}&project=web")).await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r["request_id"], request_id.as_str());
    assert_eq!(r["key_id"], id.as_str());
    assert_eq!(r["workspace"], DEMO_WS);
    assert_eq!(r["environment"], "live");
    assert_eq!(r["method"], "POST");
    assert_eq!(r["path"], "/v1/chat/completions");
    assert_eq!(r["model"], "gpt-sim");
    assert_eq!(r["status"], 200);
    assert_eq!(r["credits"], 0.5);
    assert_eq!(r["client_ip"], "127.0.0.1");
    assert_eq!(r["metadata"], json!({"user": "u_7"}));
    assert!(r["token_id"].as_str().unwrap().starts_with("tok_"));
    assert!(r["key"].as_str().unwrap().starts_with("svc_scoped_"));
    let all = serde_json::to_string(&audit(&gw, &format!("workspace={DEMO_WS}")).await).unwrap();
    assert!(
        !all.contains(&key) && !all.contains(token),
        "a secret in the audit log"
    );
    // Filters and bad queries.
    assert_eq!(
        audit(&gw, &format!("workspace={DEMO_WS}&key_id=key_other"))
            .await
            .len(),
        0
    );
    assert_eq!(
        audit(&gw, &format!("workspace={DEMO_WS}&limit=1"))
            .await
            .len(),
        1
    );
    assert_eq!(
        audit(&gw, &format!("workspace={DEMO_WS}&since=9999999999"))
            .await
            .len(),
        0
    );
    for q in [
        "",
        "workspace=ws_demo&limit=0",
        "workspace=ws_demo&limit=x",
        "workspace=ws_demo&nope=1",
        "workspace=ws_demo&since=-1",
        // Seconds that overflow as milliseconds (a panic in a debug build, wrap-around in a
        // release one).
        "workspace=ws_demo&since=18446744073709552",
    ] {
        let resp = gw
            .admin_request(Method::GET, &format!("/admin/v1/audit?{q}"))
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
    let resp = gw
        .admin_request(
            Method::GET,
            "/admin/v1/usage?workspace=ws_demo&month=2026-13",
        )
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
}

#[tokio::test]
async fn the_simulator_audits_at_most_256_characters_of_a_model() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("test", &["chat.completions:create"]).await;
    let long = "m".repeat(5_000);
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .json(&json!({"model": long}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let query = format!("workspace={DEMO_WS}&key_id={id}");
    eventually(Duration::from_secs(5), || async {
        audit(&gw, &query).await.len() == 1
    })
    .await
    .expect("audited");
    let record = &audit(&gw, &query).await[0];
    assert_eq!(record["model"].as_str().unwrap(), &long[..256]);
}

#[tokio::test]
async fn the_audit_log_is_read_page_by_page() {
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    for _ in 0..5 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    until_audited(&gw, &ws, 5, "audited").await;
    let everything = audit(&gw, &format!("workspace={ws}")).await;

    let mut pages = Vec::new();
    let mut query = format!("workspace={ws}&limit=2");
    loop {
        let page = gw.admin_get(&format!("/admin/v1/audit?{query}")).await;
        pages.push(page["data"].as_array().unwrap().len());
        if page["has_more"] == false {
            assert!(page.get("next_cursor").is_none(), "{page}");
            break;
        }
        let cursor = page["next_cursor"].as_str().unwrap().to_string();
        query = format!("workspace={ws}&limit=2&cursor={cursor}");
        let last = page["data"].as_array().unwrap().last().unwrap().clone();
        assert!(cursor.ends_with(last["request_id"].as_str().unwrap()));
    }
    assert_eq!(pages, [2, 2, 1]);
    // Page by page is the whole listing, in its order.
    let mut paged = Vec::new();
    let mut cursor = String::new();
    while paged.len() < 5 {
        let page = gw
            .admin_get(&format!("/admin/v1/audit?workspace={ws}&limit=2{cursor}"))
            .await;
        paged.extend(page["data"].as_array().unwrap().iter().cloned());
        cursor = format!(
            "&cursor={}",
            page["next_cursor"].as_str().unwrap_or_default()
        );
    }
    assert_eq!(paged, everything);

    for bad in [
        "",
        "1",
        "x_req_1",
        "1_key_1",
        "1_req_",
        "1_req_a-b",
        "99999999999999999999_req_1",
    ] {
        let resp = gw
            .admin_request(
                Method::GET,
                &format!("/admin/v1/audit?workspace={ws}&cursor={bad}"),
            )
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
}

#[tokio::test]
async fn a_body_larger_than_the_sniffing_window_reaches_the_backend_intact() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let big = "x".repeat(300_000);
    let body =
        format!(r#"{{"model":"long-context","messages":[{{"role":"user","content":"{big}"}}]}}"#);
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(live.requests()[0].body.len(), body.len());
    assert_eq!(&live.requests()[0].body[..], body.as_bytes());
    eventually(Duration::from_secs(5), || async {
        audit(&gw, &format!("workspace={DEMO_WS}"))
            .await
            .first()
            .is_some_and(|r| r["model"] == "long-context")
    })
    .await
    .expect("the model is found in the body's first bytes");
}

#[tokio::test]
async fn a_redis_outage_loses_no_audit_record_and_no_spend() {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), "outage")
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (id, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    for _ in 0..5 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    redis.stop().await;
    for _ in 0..7 {
        assert_eq!(gw.chat(&key).await.status(), 200, "a cached key works on");
    }
    redis.resume().await;
    for _ in 0..3 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    eventually(Duration::from_secs(10), || async {
        audit(&gw, &format!("workspace={ws}&limit=1000"))
            .await
            .len()
            == 15
    })
    .await
    .expect("all 15 audit records, including the 7 made while Redis was down");
    until_charged(&gw, &ws, &id, 15.0, "all 15 credits").await;
}

#[tokio::test]
async fn what_cannot_be_written_at_shutdown_is_spooled_and_written_at_the_next_start() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let builder = Gateway::builder()
        .redis(&redis.url(), "spool")
        .spool_dir(spool.path());
    let (mut gw, ws, id, _) = served_in_an_outage(builder, &mut redis).await;
    sigterm(&mut gw);
    let spooled: Vec<_> = std::fs::read_dir(spool.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        spooled.iter().any(|f| f.starts_with("audit-")),
        "{spooled:?}"
    );
    assert!(
        spooled
            .iter()
            .any(|f| f.starts_with("spend-") && f.ends_with(".json")),
        "{spooled:?}"
    );

    redis.resume().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), "spool")
        .spool_dir(spool.path())
        .start()
        .await;
    until_audited(&gw, &ws, 6, "the spooled audit records are written").await;
    until_charged(&gw, &ws, &id, 6.0, "the spooled spend is charged").await;
    let left = std::fs::read_dir(spool.path()).unwrap().count();
    assert_eq!(left, 0, "the spool is emptied");
}

#[tokio::test]
async fn a_gateway_killed_in_a_redis_outage_loses_no_spend_and_no_audit_record_it_checkpointed() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let url = redis.url();
    let builder = || spooling(&url, "killed", spool.path());
    let (mut gw, ws, id, _) = served_in_an_outage(builder(), &mut redis).await;
    // Within seconds of the outage all of it is on disk, not only in memory.
    eventually(Duration::from_secs(15), || async {
        spooled(spool.path()) == (4_000_000, 4)
    })
    .await
    .unwrap_or_else(|| panic!("spooled: {:?}", spooled(spool.path())));
    sigkill(&mut gw);

    redis.resume().await;
    let gw = builder().start().await;
    until_audited(&gw, &ws, 6, "the audit records of the outage are written").await;
    until_charged(&gw, &ws, &id, 6.0, "the spend of the outage is charged").await;
    until_spool_empty(spool.path(), "", "the spool is emptied").await;
}

#[tokio::test]
async fn spend_checkpointed_in_an_outage_is_charged_once_when_redis_comes_back() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let url = redis.url();
    let builder = || spooling(&url, "checkpoint", spool.path());
    let (mut gw, ws, id, key) = served_in_an_outage(builder(), &mut redis).await;
    eventually(Duration::from_secs(15), || async {
        !spool_files(spool.path(), "spend-").is_empty()
    })
    .await
    .expect("the spend is checkpointed");
    redis.resume().await;
    until_charged(
        &gw,
        &ws,
        &id,
        6.0,
        "the spend of the outage is charged by the gateway that kept it",
    )
    .await;
    until_spool_empty(
        spool.path(),
        "spend-",
        "the checkpoint goes once its spend is written",
    )
    .await;
    // Killed now, its successor finds nothing to charge again.
    sigkill(&mut gw);
    let gw = builder().start().await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    until_charged(&gw, &ws, &id, 7.0, "one more request, one more credit").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(usage(&gw, &ws).await["keys"][&id], 7.0);
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

#[tokio::test]
async fn a_long_outage_keeps_spooling_audit_records_past_the_memory_bound() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let builder = Gateway::builder()
        .redis(&redis.url(), "long-outage")
        .spool_dir(spool.path())
        .config(|c| c.metering.audit_backlog = 5);
    let (gw, ws, _, key) = warmed_up(builder).await;
    redis.stop().await;
    // In three bursts, each past the bound: each goes to the spool, not only the first.
    for burst in 1..=3 {
        for _ in 0..10 {
            assert_eq!(gw.chat(&key).await.status(), 200);
        }
        eventually(Duration::from_secs(5), || async {
            spool_files(spool.path(), "audit-").len() >= burst
        })
        .await
        .unwrap_or_else(|| {
            let files = spool_files(spool.path(), "audit-");
            panic!("burst {burst} is spooled: {files:?}")
        });
    }
    redis.resume().await;
    eventually(Duration::from_secs(15), || async {
        audit(&gw, &format!("workspace={ws}&limit=1000"))
            .await
            .len()
            == 32
    })
    .await
    .expect("all 32 audit records, 30 of them through the spool");
    assert!(spool_files(spool.path(), "audit-").is_empty());
}

#[tokio::test]
async fn a_spool_file_the_store_refuses_is_set_aside_and_holds_up_nothing() {
    let redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    // A record for a workspace whose audit stream Redis will not append to (the key holds a
    // string): the store refuses this file for ever, while it takes every other record.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("SET")
        .arg("refused:audit:{ws_broken}")
        .arg("not a stream")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let record = json!({
        "time_ms": 1_700_000_000_000u64, "request_id": "req_spooled", "workspace": "ws_broken",
        "key_id": "key_1", "key": "svc_live_…abcd", "environment": "live", "project": null,
        "method": "POST", "path": "/v1/chat/completions", "model": null, "status": 200,
        "credits": 1.0, "client_ip": null, "latency_ms": 1
    });
    let name = "audit-00000000000000000001-s_test.jsonl";
    std::fs::write(spool.path().join(name), format!("{record}\n")).unwrap();
    let gw = Gateway::builder()
        .redis(&redis.url(), "refused")
        .spool_dir(spool.path())
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    // Records keep coming: each flush that writes some and not the file counts against it.
    let mut made = 0;
    eventually(Duration::from_secs(10), || {
        made += 1;
        let (gw, key, spool, name) = (&gw, &key, spool.path(), name);
        async move {
            assert_eq!(gw.chat(key).await.status(), 200);
            spool_files(spool, "audit-") == [format!("{name}.refused")]
        }
    })
    .await
    .expect("the refused file is set aside, kept");
    eventually(Duration::from_secs(10), || async {
        audit(&gw, &format!("workspace={ws}&limit=1000"))
            .await
            .len()
            == made
    })
    .await
    .expect("records are written past a file the store refuses");
}

#[tokio::test]
async fn a_redis_that_refuses_writes_for_a_while_sets_no_spool_file_aside() {
    let redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let gw = Gateway::builder()
        .redis(&redis.url(), "out-of-memory")
        .spool_dir(spool.path())
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    // Out of memory: Redis answers PING and refuses every write.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let maxmemory = |bytes: &str| {
        redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory", bytes])
            .clone()
    };
    maxmemory("1").query_async::<()>(&mut conn).await.unwrap();
    let record = json!({
        "time_ms": 1_700_000_000_000u64, "request_id": "req_spooled", "workspace": ws,
        "key_id": "key_1", "key": "svc_live_…abcd", "environment": "live", "project": null,
        "method": "POST", "path": "/v1/chat/completions", "model": null, "status": 200,
        "credits": 1.0, "client_ip": null, "latency_ms": 1
    });
    std::fs::write(
        spool.path().join("audit-00000000000000000001-s_test.jsonl"),
        format!("{record}\n"),
    )
    .unwrap();
    // Long enough for the spool to be listed again (every 5 s) and refused many times over,
    // with records arriving all along.
    let until = std::time::Instant::now() + Duration::from_secs(7);
    let mut made = 1;
    while std::time::Instant::now() < until {
        assert_eq!(gw.chat(&key).await.status(), 200);
        made += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    maxmemory("0").query_async::<()>(&mut conn).await.unwrap();
    eventually(Duration::from_secs(15), || async {
        audit(&gw, &format!("workspace={ws}&limit=1000"))
            .await
            .len()
            == made + 1
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "every record written; spool: {:?}",
            spool_files(spool.path(), "")
        )
    });
    assert!(spool_files(spool.path(), "audit-").is_empty());
}

#[tokio::test]
async fn spend_behind_a_batch_in_flight_at_shutdown_is_written() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    // No flush but the ones requests ask for (totals unknown) and the last one.
    let url = redis.url();
    let builder = || {
        Gateway::builder()
            .redis(&url, "closing")
            .spool_dir(spool.path())
            .config(|c| c.metering.flush_interval_ms = 600000)
    };
    let mut gw = builder().start().await;
    let ws1 = gw.create_workspace().await;
    let ws2 = gw.create_workspace().await;
    let (id1, key1) = gw
        .create_key_in(&ws1, "live", &["chat.completions:create"])
        .await;
    let (id2, key2) = gw
        .create_key_in(&ws2, "live", &["chat.completions:create"])
        .await;
    assert_eq!(gw.chat(&key1).await.status(), 200);
    // Both keys cached (a refused request is not charged; a second use, after the key cache
    // has synced their creation, stays cached), and key2's workspace's totals not read yet.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for key in [&key1, &key2] {
        let resp = gw
            .request(Method::GET, "/v1/nope")
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
    }
    redis.stop().await;
    // Asks for a flush that fails: a batch in flight.
    assert_eq!(gw.chat(&key2).await.status(), 200);
    for _ in 0..3 {
        assert_eq!(gw.chat(&key1).await.status(), 200);
        assert_eq!(gw.chat(&key2).await.status(), 200);
    }
    redis.resume().await;
    sigterm(&mut gw);
    drop(gw);
    let gw = builder().start().await;
    eventually(Duration::from_secs(5), || async {
        usage(&gw, &ws1).await["keys"][&id1] == 4.0 && usage(&gw, &ws2).await["keys"][&id2] == 4.0
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "all spend written; spool: {:?}",
            spool_files(spool.path(), "")
        )
    });
}

#[tokio::test]
async fn spooled_spend_stays_on_disk_until_it_is_written() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let url = redis.url();
    let builder = || spooling(&url, "kept-spool", spool.path());
    let (mut gw, ws, id, _) = served_in_an_outage(builder(), &mut redis).await;
    sigterm(&mut gw);
    drop(gw);
    let spooled = spool_files(spool.path(), "spend-");
    assert_eq!(spooled.len(), 1);
    // Started again while Redis is still down, then killed: nothing written, nothing lost (the
    // file is the new process's checkpoint, rewritten in place).
    let gw = builder().start().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(spool_files(spool.path(), "spend-"), spooled);
    drop(gw);
    redis.resume().await;
    let gw = builder().start().await;
    until_charged(&gw, &ws, &id, 6.0, "the spooled spend is charged").await;
    until_spool_empty(spool.path(), "spend-", "and its file removed once written").await;
}

#[tokio::test]
async fn a_graceful_upgrade_during_an_outage_hands_over_what_the_old_process_spooled() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let builder = Gateway::builder()
        .redis(&redis.url(), "upgrade-spool")
        .spool_dir(spool.path());
    let (mut gw, ws, id, key) = warmed_up(builder).await;
    redis.stop().await;
    for _ in 0..3 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    gw.upgrade();
    assert!(!spool_files(spool.path(), "spend-").is_empty());
    redis.resume().await;
    // Taken over by the new process, without a restart.
    eventually(Duration::from_secs(15), || async {
        usage(&gw, &ws).await["keys"][&id] == 5.0
            && audit(&gw, &format!("workspace={ws}")).await.len() == 5
    })
    .await
    .expect("the old process's spend and audit records are written");
    until_spool_empty(spool.path(), "", "and the spool emptied").await;
}

/// The demo workspace's one audit record, once it is written.
async fn only_audit_record(gw: &Gateway) -> Value {
    eventually(Duration::from_secs(5), || async {
        !audit(gw, &format!("workspace={DEMO_WS}")).await.is_empty()
    })
    .await
    .expect("an audit record");
    let records = audit(gw, &format!("workspace={DEMO_WS}")).await;
    assert_eq!(records.len(), 1);
    records[0].clone()
}

#[tokio::test]
async fn two_service_credits_figures_are_no_figure() {
    let backend = RawBackend::start(
        b"HTTP/1.1 200 OK\r\nService-Credits: 5\r\nService-Credits: 7\r\n\
          Content-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    .await;
    let gw = Gateway::builder().live(backend.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    // As `5, 7` on one line: the route's price (1), not the first figure.
    assert_eq!(only_audit_record(&gw).await["credits"], 1.0);
}

#[tokio::test]
async fn an_answer_the_backend_cuts_short_is_recorded_as_502_and_not_charged() {
    // Promises 100 bytes, sends 10 and closes.
    let backend = RawBackend::start(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
          Service-Credits: 3\r\nContent-Length: 100\r\n\r\n{\"partial\"",
    )
    .await;
    let gw = Gateway::builder().live(backend.addr).start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = gw.chat(&key).await;
    assert_eq!(
        resp.status(),
        200,
        "the status went out before the body broke"
    );
    assert!(resp.bytes().await.is_err(), "the body is cut short");
    let record = only_audit_record(&gw).await;
    assert_eq!(record["status"], 502);
    assert_eq!(record["credits"], 0.0);
    let usage = gw
        .admin_get(&format!("/admin/v1/usage?workspace={DEMO_WS}"))
        .await;
    assert_eq!(usage["total"], 0.0, "{usage}");
    assert!(usage["keys"].get(&id).is_none(), "{usage}");
}

/// The shared Redis connection is reopened by whichever task finds it broken; after a Redis
/// restart that can be a request, on a gateway thread's runtime, which stops before the last
/// flush. The last flush still reaches Redis. (A race: the watchdog or the key cache's sync,
/// on the store runtime, may reopen the connection first; without the fix this failed in 2
/// runs of 3.)
#[tokio::test]
async fn spend_is_written_at_shutdown_after_a_request_reopened_the_connection() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let url = redis.url();
    let builder = || {
        Gateway::builder()
            .redis(&url, "reopened")
            .spool_dir(spool.path())
            .no_worker()
            .config(|c| c.store.sync_interval_ms = 600000)
            .config(|c| c.metering.flush_interval_ms = 600000)
    };
    let mut gw = builder().start().await;
    let ws = gw.create_workspace().await;
    let (id, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    redis.stop().await;
    redis.resume().await;
    // An uncached key: its lookup is the first store call after the restart.
    eventually(Duration::from_secs(10), || async {
        gw.chat(&key).await.status() == 200
    })
    .await
    .expect("the key is served once Redis is back");
    sigterm(&mut gw);
    assert!(
        spool_files(spool.path(), "spend").is_empty(),
        "spend spooled with Redis up: {}",
        gw.logs()
    );
    drop(gw);
    let gw = builder().start().await;
    assert_eq!(usage(&gw, &ws).await["keys"][&id], 1.0);
}
