//! Budgets that hold across replicas: requests reserve their price against leases the store
//! grants, so concurrent requests over several gateway processes never overspend a budget by
//! more than the excess of in-flight requests' actual cost over what they reserved (nothing
//! here: the simulated backend charges the route's price, one credit, which is what each
//! request reserves).

use super::*;

/// `n` one-credit requests sent at once, spread over `gateways` in turn, with `project` as
/// `Service-Project` if given; the statuses of the answers.
async fn burst(gateways: &[Gateway], key: &str, project: Option<&str>, n: usize) -> Vec<u16> {
    let sends = (0..n).map(|i| {
        let gw = &gateways[i % gateways.len()];
        let mut request = gw
            .request(Method::POST, "/v1/chat/completions")
            .bearer_auth(key)
            .json(&json!({"model": "m1", "messages": []}));
        if let Some(project) = project {
            request = request.header("service-project", project);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    });
    futures_util::future::join_all(sends).await
}

/// `count` gateway processes on one Redis namespace.
async fn gateways(ns: &TestNamespace, count: usize) -> Vec<Gateway> {
    let mut all = Vec::new();
    for _ in 0..count {
        all.push(on_redis(ns).await);
    }
    all
}

/// Admitted (200) answers in `statuses`, every other one a 402.
fn admitted(statuses: &[u16]) -> usize {
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 402),
        "only 200 and 402: {statuses:?}"
    );
    statuses.iter().filter(|s| **s == 200).count()
}

/// A workspace with a key: its id, and the key's id and value.
async fn workspace_and_key(gw: &Gateway) -> (String, String, String) {
    let ws = gw.create_workspace().await;
    let (id, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    (ws, id, key)
}

/// Waits until `field` of workspace `ws`'s usage report stays at `credits`.
async fn until_spent(gw: &Gateway, ws: &str, pick: impl Fn(&Value) -> Value, credits: f64) {
    eventually(Duration::from_secs(10), || async {
        pick(&usage(gw, ws).await).as_f64().unwrap_or(0.0) == credits
    })
    .await
    .expect("the credits admitted are charged");
}

/// A key budget of 10 and `requests` concurrent one-credit requests over `replicas` gateway
/// processes: at most 10 admitted, and what is admitted is what is charged.
async fn key_budget_holds(replicas: usize, requests: usize) {
    let ns = TestNamespace::new();
    let all = gateways(&ns, replicas).await;
    let (ws, id, key) = workspace_and_key(&all[0]).await;
    set_key_budget(&all[0], &id, 10.0).await;
    let statuses = burst(&all, &key, None, requests).await;
    let ok = admitted(&statuses);
    assert!(ok <= 10, "{ok} admitted on a budget of 10");
    assert!(ok >= 1, "the budget is usable");
    until_spent(&all[0], &ws, |u| u["keys"][&id].clone(), ok as f64).await;
    // And it stays spent.
    assert_eq!(admitted(&burst(&all, &key, None, 20).await), 10 - ok);
}

#[tokio::test]
async fn a_key_budget_of_10_holds_for_60_concurrent_requests_over_two_replicas() {
    key_budget_holds(2, 60).await;
}

#[tokio::test]
async fn a_key_budget_of_10_holds_for_200_concurrent_requests_over_two_replicas() {
    key_budget_holds(2, 200).await;
}

#[tokio::test]
async fn a_key_budget_of_10_holds_for_200_concurrent_requests_over_four_replicas() {
    key_budget_holds(4, 200).await;
}

#[tokio::test]
async fn a_project_budget_holds_for_concurrent_requests_over_two_replicas() {
    let ns = TestNamespace::new();
    let all = gateways(&ns, 2).await;
    let (ws, _, key) = workspace_and_key(&all[0]).await;
    let resp = all[0]
        .admin_request(
            Method::PUT,
            &format!("/admin/v1/workspaces/{ws}/projects/team-a/budget"),
        )
        .json(&json!({"monthly_budget": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let ok = admitted(&burst(&all, &key, Some("team-a"), 100).await);
    assert!((1..=10).contains(&ok), "{ok} admitted on a budget of 10");
    until_spent(&all[0], &ws, |u| u["projects"]["team-a"].clone(), ok as f64).await;
    // Another project of the workspace is not held by this one's budget.
    assert_eq!(admitted(&burst(&all, &key, Some("team-b"), 20).await), 20);
}

#[tokio::test]
async fn a_workspace_budget_holds_for_concurrent_requests_over_two_replicas() {
    let ns = TestNamespace::new();
    let all = gateways(&ns, 2).await;
    let ws = workspace_with(
        &all[0],
        json!({"name": "Ten", "admin_emails": ["ops@example.com"], "monthly_credits": 10}),
    )
    .await;
    // Two keys of the workspace share its credits.
    let mut keys = Vec::new();
    for _ in 0..2 {
        let (_, key) = all[0]
            .create_key_in(&ws, "live", &["chat.completions:create"])
            .await;
        keys.push(key);
    }
    let (first, second) = tokio::join!(
        burst(&all, &keys[0], None, 50),
        burst(&all, &keys[1], None, 50)
    );
    let ok = admitted(&first) + admitted(&second);
    assert!((1..=10).contains(&ok), "{ok} admitted on credits of 10");
    until_spent(&all[0], &ws, |u| u["total"].clone(), ok as f64).await;
}

#[tokio::test]
async fn a_lease_returned_at_shutdown_is_usable_by_another_replica() {
    let ns = TestNamespace::new();
    let (mut a, b) = replicas(&ns).await;
    let (ws, id, key) = workspace_and_key(&a).await;
    set_key_budget(&a, &id, 100.0).await;
    // With much left, replica a takes a slice of it larger than its one request.
    assert_eq!(a.chat(&key).await.status(), 200);
    // Replica b cannot spend what a holds...
    let held = admitted(&burst(std::slice::from_ref(&b), &key, None, 99).await);
    assert!(held < 99, "a's lease is a's alone: b got {held}");
    // ...until a stops, and returns it.
    sigterm(&mut a);
    eventually(Duration::from_secs(5), || async {
        b.chat(&key).await.status() == 200
    })
    .await
    .expect("the returned lease is spent by b");
    let rest = admitted(&burst(std::slice::from_ref(&b), &key, None, 99).await);
    assert_eq!(1 + held + 1 + rest, 100, "the whole budget, and no more");
    until_spent(&b, &ws, |u| u["keys"][&id].clone(), 100.0).await;
}

/// A key with a budget of 3 on a gateway whose Redis then stops, with its lease spent by two
/// requests: the third needs the store.
async fn lease_spent_when_redis_stops(
    builder: GatewayBuilder,
    redis: &mut RedisServer,
) -> (Gateway, String) {
    let gw = builder.start().await;
    let (ws, id, key) = workspace_and_key(&gw).await;
    set_key_budget(&gw, &id, 3.0).await;
    for _ in 0..2 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    until_spent(&gw, &ws, |u| u["keys"][&id].clone(), 2.0).await;
    redis.stop().await;
    (gw, key)
}

#[tokio::test]
async fn with_the_store_down_a_request_needing_a_lease_is_admitted_by_default() {
    let mut redis = RedisServer::start().await;
    let builder = Gateway::builder().redis(&redis.url(), "lease-admit");
    let (gw, key) = lease_spent_when_redis_stops(builder, &mut redis).await;
    assert_eq!(gw.chat(&key).await.status(), 200, "admitted unreserved");
    // What the replica has spent itself still counts.
    assert_error(gw.chat(&key).await, 402, "budget_exceeded").await;
}

#[tokio::test]
async fn with_the_store_down_a_request_needing_a_lease_can_be_refused() {
    let mut redis = RedisServer::start().await;
    let builder = Gateway::builder()
        .redis(&redis.url(), "lease-refuse")
        .config(|c| c.metering.budget_when_store_down = StoreDown::Refuse);
    let (gw, key) = lease_spent_when_redis_stops(builder, &mut redis).await;
    let body = assert_error(gw.chat(&key).await, 503, "service_unavailable").await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budgets cannot be checked"),
        "{body}"
    );
    redis.resume().await;
    eventually(Duration::from_secs(10), || async {
        gw.chat(&key).await.status() == 200
    })
    .await
    .expect("admitted again once the store is back");
    assert_error(gw.chat(&key).await, 402, "budget_exceeded").await;
}
