//! What operators see and do through the admin API: deliveries, resume, replay.

use super::*;

#[tokio::test]
async fn operators_see_deliveries_resume_and_replay_through_the_admin_api() {
    let s = setup(&[1], 2, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/hook", &[Reply::Status(500)]);
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    // The operators see both environments' endpoints, and no secret.
    let (_, test_key) = s.gw.create_key_in(&s.ws, "test", SCOPES).await;
    let (test_id, _) = endpoint(&s.gw, &test_key, &receiver.url("/test"), &["agent.*"]).await;
    let base = format!("/admin/v1/workspaces/{}/webhooks", s.ws);
    let resp = admin(&s.gw, Method::GET, &base, None).await;
    assert_eq!(resp.status(), 200);
    let listed: Value = resp.json().await.unwrap();
    let mut ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    ids.sort();
    let mut want = [id.as_str(), test_id.as_str()];
    want.sort();
    assert_eq!(ids, want);
    assert!(!listed.to_string().contains("whsec_"), "{listed}");

    // Both attempts fail: the endpoint pauses, as the operators see it.
    let first = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/hook", 2, Duration::from_secs(10)).await;
    let one = format!("{base}/{id}");
    eventually(Duration::from_secs(5), || async {
        let resp = admin(&s.gw, Method::GET, &one, None).await;
        resp.json::<Value>().await.unwrap()["status"] == "paused"
    })
    .await
    .expect("paused");
    let resp = admin(
        &s.gw,
        Method::GET,
        &format!("{one}/deliveries?limit=1"),
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let listed: Value = resp.json().await.unwrap();
    assert_eq!(listed["data"][0]["event_id"], first.as_str());
    assert_eq!(listed["data"][0]["status"], "failed");
    assert_eq!(listed["data"][0]["attempts"], 2);

    // A paused endpoint is resumed before a replay, as on the customers' API.
    let replay_one = json!({"event_id": first});
    let resp = admin(
        &s.gw,
        Method::POST,
        &format!("{one}/replay"),
        Some(replay_one.clone()),
    )
    .await;
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = admin(&s.gw, Method::POST, &format!("{one}/resume"), None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "active");
    assert_eq!(endpoint_status(&s.gw, &s.key, &id).await, "active");

    receiver.reply("/hook", &[Reply::Status(204)]);
    let resp = admin(
        &s.gw,
        Method::POST,
        &format!("{one}/replay"),
        Some(replay_one),
    )
    .await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["replayed"], 1, "{body}");
    let got = received(&receiver, "/hook", 3, Duration::from_secs(10)).await;
    assert_eq!(header(&got[2], "service-event-id"), first);
    eventually(Duration::from_secs(5), || async {
        deliveries(&s.gw, &s.key, &id).await[0]["status"] == "succeeded"
    })
    .await
    .expect("the replay is saved as succeeded");
}

#[tokio::test]
async fn the_admin_webhook_routes_refuse_what_they_cannot_serve() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    let other = s.gw.create_workspace().await;
    let base = format!("/admin/v1/workspaces/{}/webhooks", s.ws);
    let cases = [
        // A workspace that does not exist, and an endpoint of another workspace.
        (
            Method::GET,
            "/admin/v1/workspaces/ws_nope/webhooks".to_string(),
            None,
            404,
        ),
        (
            Method::GET,
            format!("/admin/v1/workspaces/{other}/webhooks/{id}"),
            None,
            404,
        ),
        (
            Method::POST,
            format!("/admin/v1/workspaces/{other}/webhooks/{id}/resume"),
            None,
            404,
        ),
        (Method::GET, format!("{base}/we_nope/deliveries"), None, 404),
        // Bad limits and replay bodies.
        (
            Method::GET,
            format!("{base}/{id}/deliveries?limit=0"),
            None,
            400,
        ),
        (
            Method::GET,
            format!("{base}/{id}/deliveries?limit=x"),
            None,
            400,
        ),
        (
            Method::GET,
            format!("{base}/{id}/deliveries?cursor=1"),
            None,
            400,
        ),
        (
            Method::POST,
            format!("{base}/{id}/replay"),
            Some(json!({})),
            400,
        ),
        (
            Method::POST,
            format!("{base}/{id}/replay"),
            Some(json!({"since": 1})),
            400,
        ),
        (
            Method::POST,
            format!("{base}/{id}/replay"),
            Some(json!({"event_id": "evt_nope"})),
            404,
        ),
        (
            Method::POST,
            format!("{base}/{id}/replay"),
            Some(json!([1])),
            400,
        ),
        // Creating and deleting endpoints stay with the customer, who holds the secrets.
        (
            Method::POST,
            base.clone(),
            Some(json!({"url": "https://example.com", "events": ["*"]})),
            405,
        ),
        (Method::DELETE, format!("{base}/{id}"), None, 405),
    ];
    for (method, path, body, status) in cases {
        let resp = admin(&s.gw, method.clone(), &path, body).await;
        assert_eq!(resp.status().as_u16(), status, "{method} {path}");
        let body: Value = resp.json().await.unwrap();
        assert!(
            body["error"]["message"].is_string(),
            "{method} {path}: {body}"
        );
    }
    // The admin token is required.
    let resp =
        s.gw.http
            .get(format!("{}{base}", s.gw.admin))
            .send()
            .await
            .unwrap();
    assert_error(resp, 401, "authentication_error").await;
    // The endpoint is unchanged by all of that.
    assert_eq!(endpoint_status(&s.gw, &s.key, &id).await, "active");
}

#[tokio::test]
async fn replay_since_redelivers_every_subscribed_event_of_the_window() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    let since = svcgate::ids::unix_now();
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    let a = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    publish(&s.gw, &s.ws, "billing.credits.low", "live").await;
    publish(&s.gw, &s.ws, "agent.run.failed", "test").await;
    let b = publish(&s.gw, &s.ws, "agent.run.failed", "live").await;
    received(&receiver, "/hook", 2, Duration::from_secs(10)).await;

    let resp = replay(&s, &id, json!({"since": since})).await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["replayed"], 2, "{body}");
    let got = received(&receiver, "/hook", 4, Duration::from_secs(10)).await;
    let mut ids: Vec<&str> = got[2..]
        .iter()
        .map(|r| header(r, "service-event-id"))
        .collect();
    ids.sort();
    let mut want = vec![a.as_str(), b.as_str()];
    want.sort();
    assert_eq!(ids, want);
}

#[tokio::test]
async fn replay_and_deliveries_refuse_bad_input() {
    let s = setup(&[60], 10, false).await;
    let (id, _) = endpoint(&s.gw, &s.key, "http://127.0.0.1:9/hook", &["agent.run.*"]).await;
    let replay = format!("/v1/webhooks/{id}/replay");
    let now = svcgate::ids::unix_now();
    for body in [
        json!({}),
        json!({"event_id": "evt_x", "since": now}),
        json!({"since": now - 31 * 86_400}),
        json!({"since": now + 3600}),
        json!({"since": "yesterday"}),
        json!({"event_id": "evt_x", "extra": 1}),
        json!([1, 2]),
    ] {
        let resp = call(&s.gw, &s.key, Method::POST, &replay, Some(body.clone())).await;
        assert_error(resp, 400, "invalid_request_error").await;
    }
    // A continuation (`after`) from before the 30 days is refused, saying why.
    let stale = json!({"since": now - 31 * 86_400, "after": "evt_x"});
    let resp = call(&s.gw, &s.key, Method::POST, &replay, Some(stale)).await;
    let error = assert_error(resp, 400, "invalid_request_error").await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("older than 30 days"),
        "{error}"
    );
    let resp = call(
        &s.gw,
        &s.key,
        Method::POST,
        &replay,
        Some(json!({"event_id": "evt_nope"})),
    )
    .await;
    assert_error(resp, 404, "not_found").await;
    // An event of another workspace is not found either, once it is surely known: its own
    // workspace can replay it.
    let other = s.gw.create_workspace().await;
    let (_, other_key) = s.gw.create_key_in(&other, "live", SCOPES).await;
    let (other_id, _) = endpoint(
        &s.gw,
        &other_key,
        "http://127.0.0.1:9/hook",
        &["agent.run.*"],
    )
    .await;
    let foreign = publish(&s.gw, &other, "agent.run.completed", "live").await;
    let own_replay = format!("/v1/webhooks/{other_id}/replay");
    eventually(Duration::from_secs(10), || async {
        let body = json!({"event_id": foreign});
        call(&s.gw, &other_key, Method::POST, &own_replay, Some(body))
            .await
            .status()
            == 202
    })
    .await
    .expect("the event is known to its own workspace");
    let resp = call(
        &s.gw,
        &s.key,
        Method::POST,
        &replay,
        Some(json!({"event_id": foreign})),
    )
    .await;
    assert_error(resp, 404, "not_found").await;
    for query in ["limit=0", "limit=1001", "limit=x"] {
        let resp = call(
            &s.gw,
            &s.key,
            Method::GET,
            &format!("/v1/webhooks/{id}/deliveries?{query}"),
            None,
        )
        .await;
        assert_error(resp, 400, "invalid_request_error").await;
    }
    let resp = call(
        &s.gw,
        &s.key,
        Method::GET,
        "/v1/webhooks/we_nope/deliveries",
        None,
    )
    .await;
    assert_error(resp, 404, "not_found").await;
    // Reading needs webhooks:read, replaying webhooks:write.
    let (_, reader) = s.gw.create_key_in(&s.ws, "live", &["webhooks:read"]).await;
    let resp = call(
        &s.gw,
        &reader,
        Method::POST,
        &replay,
        Some(json!({"since": now})),
    )
    .await;
    assert_error(resp, 403, "permission_error").await;
    let resp = call(
        &s.gw,
        &reader,
        Method::GET,
        &format!("/v1/webhooks/{id}/deliveries"),
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
}
