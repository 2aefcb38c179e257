//! Deliveries: signing, fan-out, retries on schedule, held queues, pausing.

use super::*;

#[tokio::test]
async fn events_are_delivered_signed_to_subscribed_endpoints_of_their_environment() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    let (agent, secret) = endpoint(&s.gw, &s.key, &receiver.url("/agent"), &["agent.run.*"]).await;
    endpoint(
        &s.gw,
        &s.key,
        &receiver.url("/billing"),
        &["billing.credits.low"],
    )
    .await;
    let (_, test_key) = s.gw.create_key_in(&s.ws, "test", SCOPES).await;
    let (_, test_secret) =
        endpoint(&s.gw, &test_key, &receiver.url("/test"), &["agent.run.*"]).await;

    let event_id = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    let got = received(&receiver, "/agent", 1, Duration::from_secs(10)).await;
    let r = &got[0];
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["id"], event_id.as_str());
    assert_eq!(body["type"], "agent.run.completed");
    assert_eq!(body["workspace"], s.ws.as_str());
    assert_eq!(body["data"]["note"], "ünïcode ✓");
    assert!(body["created"].as_u64().unwrap() > 1_700_000_000);
    let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
    assert_eq!(
        keys.len(),
        5,
        "exactly id, type, created, workspace, data: {keys:?}"
    );
    assert_eq!(header(r, "service-event-id"), event_id);
    assert_eq!(header(r, "content-type"), "application/json");
    let timestamp = header(r, "service-timestamp");
    assert_eq!(
        header(r, "service-signature"),
        expected_signature(&secret, timestamp, &r.body)
    );
    assert!(
        svcgate::webhooks::verify(&secret, &r.headers, &r.body, svcgate::ids::unix_now()).is_ok()
    );

    // A test-mode event goes to the test-mode endpoint only, signed with its secret.
    let test_event = publish(&s.gw, &s.ws, "agent.run.failed", "test").await;
    let got = received(&receiver, "/test", 1, Duration::from_secs(10)).await;
    assert_eq!(header(&got[0], "service-event-id"), test_event);
    let ts = header(&got[0], "service-timestamp");
    assert_eq!(
        header(&got[0], "service-signature"),
        expected_signature(&test_secret, ts, &got[0].body)
    );
    // Nothing else arrived anywhere: one delivery per subscribed endpoint.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received("/agent").len(), 1);
    assert_eq!(receiver.received("/test").len(), 1);
    assert!(receiver.received("/billing").is_empty());

    let listed = deliveries(&s.gw, &s.key, &agent).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["event_id"], event_id.as_str());
    assert_eq!(listed[0]["status"], "succeeded");
    assert_eq!(listed[0]["attempts"], 1);
    assert_eq!(listed[0]["last_attempt"]["status_code"], 200);
}

#[tokio::test]
async fn failures_are_retried_on_schedule_then_the_endpoint_pauses_and_admins_are_mailed() {
    let s = setup(&[1, 2], 2, false).await;
    let receiver = Receiver::start().await;
    receiver.reply(
        "/hook",
        &[Reply::Status(500), Reply::Status(503), Reply::Redirect],
    );
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    let event_id = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;

    let got = received(&receiver, "/hook", 3, Duration::from_secs(15)).await;
    for r in &got {
        assert_eq!(
            header(r, "service-event-id"),
            event_id,
            "the same id on every retry"
        );
    }
    // Each retry waits its scheduled time (spread by up to ±10 %) after the previous failure.
    let gaps = [got[1].at - got[0].at, got[2].at - got[1].at];
    assert!(gaps[0] >= Duration::from_millis(850), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(1750), "{gaps:?}");

    // The last retry (a redirect, which is not followed) failed: paused, admins told.
    let paused = eventually(Duration::from_secs(5), || async {
        endpoint_status(&s.gw, &s.key, &id).await == "paused"
    })
    .await;
    assert!(paused.is_some(), "endpoint not paused");
    let listed = deliveries(&s.gw, &s.key, &id).await;
    assert_eq!(listed[0]["status"], "failed");
    assert_eq!(listed[0]["attempts"], 3);
    assert_eq!(listed[0]["last_attempt"]["status_code"], 302);
    assert!(listed[0]["last_attempt"]["error"]
        .as_str()
        .unwrap()
        .contains("redirect"));
    let mail = eventually(Duration::from_secs(5), || async {
        std::fs::read_dir(s.outbox.path())
            .map(|d| d.count() > 0)
            .unwrap_or(false)
    })
    .await;
    assert!(mail.is_some(), "no mail in the outbox");
    let file = std::fs::read_dir(s.outbox.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let eml = std::fs::read_to_string(file.path()).unwrap();
    assert!(eml.contains("ops@example.com"), "{eml}");
    assert!(eml.contains(&id), "{eml}");
    assert!(!eml.contains("whsec_"), "no secret in mail");

    // While paused, nothing goes out.
    let missed = publish(&s.gw, &s.ws, "agent.run.failed", "live").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.received("/hook").len(), 3);
    let resp = replay(&s, &id, json!({"event_id": missed})).await;
    assert_error(resp, 400, "invalid_request_error").await;

    // Resumed, the missed event can be replayed; it arrives with its own id.
    receiver.reply("/hook", &[Reply::Status(204)]);
    let resp = call(
        &s.gw,
        &s.key,
        Method::POST,
        &format!("/v1/webhooks/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let resp = replay(&s, &id, json!({"event_id": missed})).await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["replayed"], 1);
    let got = received(&receiver, "/hook", 4, Duration::from_secs(10)).await;
    assert_eq!(header(&got[3], "service-event-id"), missed);
    // The attempt is saved after the receiver has answered.
    eventually(Duration::from_secs(5), || async {
        deliveries(&s.gw, &s.key, &id).await[0]["status"] == "succeeded"
    })
    .await
    .expect("the replay is saved as succeeded");
    let listed = deliveries(&s.gw, &s.key, &id).await;
    assert_eq!(listed[0]["replay"], true);
}

#[tokio::test]
async fn an_endpoint_that_is_down_gets_one_attempt_per_retry_whatever_its_backlog() {
    let s = setup(&[1, 1], 2, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/down", &[Reply::Status(500)]);
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/down"), &["agent.run.*"]).await;
    let started = Instant::now();
    for _ in 0..8 {
        publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    }
    let paused = eventually(Duration::from_secs(15), || async {
        endpoint_status(&s.gw, &s.key, &id).await == "paused"
    })
    .await;
    assert!(paused.is_some(), "endpoint not paused");
    // Two steps of one second: paused on time, not after every delivery's own schedule.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    // The first attempts (two may be in flight together, the cap), then one per retry, the
    // same delivery each time, on schedule.
    let got = receiver.received("/down");
    assert!((3..=4).contains(&got.len()), "{} attempts", got.len());
    let (retry1, retry2) = (&got[got.len() - 2], &got[got.len() - 1]);
    assert_eq!(
        header(retry1, "service-event-id"),
        header(retry2, "service-event-id")
    );
    assert!(retry2.at - retry1.at >= Duration::from_millis(850));
    // The rest of the backlog is skipped (it can be replayed), and nothing more goes out.
    let settled = eventually(Duration::from_secs(5), || async {
        deliveries(&s.gw, &s.key, &id)
            .await
            .iter()
            .all(|d| d["status"] != "pending")
    })
    .await;
    assert!(settled.is_some(), "deliveries still pending");
    let listed = deliveries(&s.gw, &s.key, &id).await;
    let count = |status: &str| listed.iter().filter(|d| d["status"] == status).count();
    // (Events fanned out after the pause are not queued for it at all.)
    assert_eq!(
        (count("failed"), count("skipped")),
        (1, listed.len() - 1),
        "{listed:?}"
    );
    let failed = listed.iter().find(|d| d["status"] == "failed").unwrap();
    assert_eq!(failed["attempts"], 3);
    assert_eq!(
        failed["event_id"].as_str(),
        Some(header(retry2, "service-event-id"))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received("/down").len(), got.len());
}

#[tokio::test]
async fn a_failure_holds_the_endpoints_queue_until_its_retry_answers() {
    let s = setup(&[1, 60], 2, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/flaky", &[Reply::Status(503), Reply::Status(200)]);
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/flaky"), &["agent.run.*"]).await;
    let first = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/flaky", 1, Duration::from_secs(10)).await;
    // The failure is saved (and the hold with it) before more events come.
    let saved = eventually(Duration::from_secs(5), || async {
        let listed = deliveries(&s.gw, &s.key, &id).await;
        listed[0]["status"] == "pending" && listed[0]["attempts"] == 1
    })
    .await;
    assert!(saved.is_some(), "the failed attempt is saved");
    let mut later = Vec::new();
    for _ in 0..5 {
        later.push(publish(&s.gw, &s.ws, "agent.run.completed", "live").await);
    }
    let got = received(&receiver, "/flaky", 7, Duration::from_secs(10)).await;
    // Nothing went out before the retry of the failed one, which went first.
    assert_eq!(header(&got[1], "service-event-id"), first);
    assert!(got[1].at - got[0].at >= Duration::from_millis(850));
    // It answered: the queue flowed again, each event once.
    let mut rest: Vec<&str> = got[2..]
        .iter()
        .map(|r| header(r, "service-event-id"))
        .collect();
    rest.sort();
    later.sort();
    assert_eq!(rest, later);
}

#[tokio::test]
async fn an_endpoint_held_back_shows_its_retry_and_its_queue_waits_for_it() {
    let s = setup(&[30], 2, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/down", &[Reply::Status(503)]);
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/down"), &["agent.run.*"]).await;
    publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    let path = format!("/v1/webhooks/{id}");
    let retry = eventually(Duration::from_secs(10), || async {
        let resp = call(&s.gw, &s.key, Method::GET, &path, None).await;
        !resp.json::<Value>().await.unwrap()["retry"].is_null()
    })
    .await;
    assert!(retry.is_some(), "the endpoint shows its retry");
    let shown: Value = call(&s.gw, &s.key, Method::GET, &path, None)
        .await
        .json()
        .await
        .unwrap();
    let now = svcgate::ids::unix_now();
    let next = shown["retry"]["next_attempt_at"].as_u64().unwrap();
    assert_eq!(shown["retry"]["failures"], 1);
    // 30 s, spread by up to ±10 %.
    assert!((now + 25..=now + 34).contains(&next), "{shown}");
    // The operators' view says the same.
    let admin_path = format!("/admin/v1/workspaces/{}/webhooks/{id}", s.ws);
    let seen: Value = admin(&s.gw, Method::GET, &admin_path, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(seen["retry"], shown["retry"]);
    // A new event waits for the retry, and its delivery says so.
    publish(&s.gw, &s.ws, "agent.run.failed", "live").await;
    let queued = eventually(Duration::from_secs(5), || async {
        deliveries(&s.gw, &s.key, &id).await.len() == 2
    })
    .await;
    assert!(queued.is_some());
    for d in deliveries(&s.gw, &s.key, &id).await {
        assert_eq!(d["status"], "pending");
        assert!(d["next_attempt_at"].as_u64().unwrap() >= next, "{d}");
    }
    assert_eq!(receiver.received("/down").len(), 1);
}

/// An event for several endpoints reaches each with the same body, byte for byte, signed with
/// each endpoint's own secret.
#[tokio::test]
async fn an_event_for_several_endpoints_reaches_each_with_the_same_body_signed_for_it() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    let mut secrets = Vec::new();
    for path in ["/a", "/b", "/c"] {
        let url = receiver.url(path);
        secrets.push(endpoint(&s.gw, &s.key, &url, &["agent.run.*"]).await.1);
    }
    let event_id = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    let mut bodies = Vec::new();
    for (path, secret) in ["/a", "/b", "/c"].into_iter().zip(&secrets) {
        let got = received(&receiver, path, 1, Duration::from_secs(10)).await;
        let r = &got[0];
        assert_eq!(header(r, "service-event-id"), event_id);
        let timestamp = header(r, "service-timestamp");
        assert_eq!(
            header(r, "service-signature"),
            expected_signature(secret, timestamp, &r.body)
        );
        bodies.push(r.body.clone());
    }
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    let body: Value = serde_json::from_slice(&bodies[0]).unwrap();
    assert_eq!(body["id"], event_id.as_str());
    assert_eq!(body["data"]["note"], "ünïcode ✓");
}

/// A backend that retries `POST /admin/v1/events` after a lost answer names its event: the
/// same event, delivered once, under the backend's id.
#[tokio::test]
async fn an_event_posted_twice_with_its_id_is_delivered_once() {
    let s = setup(&[30], 2, false).await;
    let receiver = Receiver::start().await;
    endpoint(&s.gw, &s.key, &receiver.url("/once"), &["agent.run.*"]).await;
    for _ in 0..2 {
        let resp =
            s.gw.admin_request(Method::POST, "/admin/v1/events")
                .json(&json!({
                    "workspace": s.ws, "type": "agent.run.completed", "id": "evt_backend_1",
                    "data": {"run_id": "run_1"}
                }))
                .send()
                .await
                .unwrap();
        assert_eq!(resp.status(), 202);
        assert_eq!(resp.json::<Value>().await.unwrap()["id"], "evt_backend_1");
    }
    let got = received(&receiver, "/once", 1, Duration::from_secs(10)).await;
    assert_eq!(header(&got[0], "service-event-id"), "evt_backend_1");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.received("/once").len(), 1, "delivered once");
}

#[tokio::test]
async fn resuming_an_endpoint_held_back_by_a_failure_tries_it_again_at_once() {
    let s = setup(&[30, 30], 2, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/h", &[Reply::Status(500), Reply::Status(200)]);
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/h"), &["agent.run.*"]).await;
    let event_id = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/h", 1, Duration::from_secs(10)).await;
    let path = format!("/v1/webhooks/{id}");
    let held = eventually(Duration::from_secs(5), || async {
        let resp = call(&s.gw, &s.key, Method::GET, &path, None).await;
        !resp.json::<Value>().await.unwrap()["retry"].is_null()
    })
    .await;
    assert!(held.is_some(), "held back 30 s by the failure");
    // The customer fixed the receiver and says so: not another 30 s.
    let resp = call(&s.gw, &s.key, Method::POST, &format!("{path}/resume"), None).await;
    assert_eq!(resp.status(), 200);
    let got = received(&receiver, "/h", 2, Duration::from_secs(8)).await;
    assert_eq!(header(&got[1], "service-event-id"), event_id);
}

#[tokio::test]
async fn a_url_fixed_while_an_attempt_is_on_its_way_is_tried_at_once() {
    // A URL that hangs past the timeout (3 s): the attempt fails after the URL is changed.
    let s = setup(&[30], 3, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/hang", &[Reply::Slow(Duration::from_secs(10))]);
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hang"), &["agent.run.*"]).await;
    let event_id = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/hang", 1, Duration::from_secs(10)).await;
    let resp = call(
        &s.gw,
        &s.key,
        Method::PATCH,
        &format!("/v1/webhooks/{id}"),
        Some(json!({"url": receiver.url("/fixed")})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    // Not held back 30 s by the old URL's failure: delivered to the new one at once.
    let got = received(&receiver, "/fixed", 1, Duration::from_secs(8)).await;
    assert_eq!(header(&got[0], "service-event-id"), event_id);
    let shown: Value = call(
        &s.gw,
        &s.key,
        Method::GET,
        &format!("/v1/webhooks/{id}"),
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert!(shown["retry"].is_null(), "{shown}");
}

#[tokio::test]
async fn the_zero_config_gateway_delivers_too() {
    let outbox = tempfile::tempdir().unwrap();
    let gw = Gateway::builder()
        .config(webhooks(outbox.path(), &[60], 10))
        .start()
        .await;
    let (_, key) = gw.create_key("live", SCOPES).await;
    let receiver = Receiver::start().await;
    let (id, secret) = endpoint(&gw, &key, &receiver.url("/hook"), &["key.auto_revoked"]).await;
    let event_id = publish(&gw, DEMO_WS, "key.auto_revoked", "live").await;
    let got = received(&receiver, "/hook", 1, Duration::from_secs(10)).await;
    assert_eq!(header(&got[0], "service-event-id"), event_id);
    assert!(svcgate::webhooks::verify(
        &secret,
        &got[0].headers,
        &got[0].body,
        svcgate::ids::unix_now()
    )
    .is_ok());
    // The attempt is saved after the receiver has answered.
    let saved = eventually(Duration::from_secs(5), || async {
        deliveries(&gw, &key, &id).await[0]["status"] == "succeeded"
    })
    .await;
    assert!(saved.is_some(), "the delivery is saved as succeeded");
}
