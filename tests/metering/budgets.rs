//! Key, project and workspace budgets, kept by every replica.

use super::*;

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
    let events = ns.logged_events().await;
    let low: Vec<_> = events
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
