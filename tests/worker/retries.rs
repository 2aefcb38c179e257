//! What a receiver's answer does to the retries: 410 Gone disables the endpoint, 429 and 503
//! with `Retry-After` are waited for; what each attempt keeps; a single delivery retried; a
//! test event.

use super::*;

#[tokio::test]
async fn a_410_disables_the_endpoint_after_one_attempt_and_it_can_be_resumed() {
    let s = setup(&[1, 1, 1], 5, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/gone", &[Reply::Full(410, &[], "this hook was removed")]);
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/gone"), &["agent.run.*"]).await;
    publish(&s.gw, &s.ws, "agent.run.completed", "live").await;

    let disabled = eventually(Duration::from_secs(10), || async {
        endpoint_status(&s.gw, &s.key, &id).await == "disabled"
    })
    .await;
    assert!(disabled.is_some(), "endpoint not disabled");
    let listed = deliveries(&s.gw, &s.key, &id).await;
    assert_eq!(listed[0]["status"], "failed");
    assert_eq!(listed[0]["attempts"], 1);
    assert_eq!(listed[0]["last_attempt"]["status_code"], 410);
    assert_eq!(
        listed[0]["last_attempt"]["response_body"],
        "this hook was removed"
    );
    // The admins are told, as for a pause.
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
    assert!(eml.contains("disabled") && eml.contains("410"), "{eml}");
    assert!(eml.contains(&id), "{eml}");

    // Nothing more goes out, though the schedule had three retries a second apart.
    publish(&s.gw, &s.ws, "agent.run.failed", "live").await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(receiver.received("/gone").len(), 1);
    let resp = replay(&s, &id, json!({"since": svcgate::ids::unix_now() - 60})).await;
    assert_error(resp, 400, "invalid_request_error").await;

    // Resumed like a paused endpoint, it gets events again.
    receiver.reply("/gone", &[Reply::Status(200)]);
    let resp = call(
        &s.gw,
        &s.key,
        Method::POST,
        &format!("/v1/webhooks/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(endpoint_status(&s.gw, &s.key, &id).await, "active");
    publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/gone", 2, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_429_with_retry_after_waits_at_least_that_long_on_a_shorter_schedule() {
    let s = setup(&[1, 1], 5, false).await;
    let receiver = Receiver::start().await;
    receiver.reply(
        "/busy",
        &[
            Reply::Full(429, &[("retry-after", "4")], "slow down"),
            Reply::Full(503, &[("retry-after", "Thu, 01 Jan 1970 00:00:00 GMT")], ""),
            Reply::Status(200),
        ],
    );
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/busy"), &["agent.run.*"]).await;
    publish(&s.gw, &s.ws, "agent.run.completed", "live").await;

    let got = received(&receiver, "/busy", 3, Duration::from_secs(20)).await;
    let waited = got[1].at - got[0].at;
    assert!(
        waited >= Duration::from_secs(4),
        "retried {waited:?} after a Retry-After of 4 s"
    );
    // A Retry-After in the past asks for nothing: the schedule's second (±10 %) applies.
    let waited = got[2].at - got[1].at;
    assert!(waited >= Duration::from_millis(850), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    eventually(Duration::from_secs(5), || async {
        deliveries(&s.gw, &s.key, &id).await[0]["status"] == "succeeded"
    })
    .await
    .expect("the delivery succeeded on its third attempt");
    assert_eq!(endpoint_status(&s.gw, &s.key, &id).await, "active");
}

#[tokio::test]
async fn retry_after_is_capped_by_max_retry_after_seconds() {
    let ns = TestNamespace::new();
    let outbox = tempfile::tempdir().unwrap();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(webhooks(outbox.path(), &[1, 1], 5))
        .config(|c| c.webhooks.max_retry_after_seconds = 2)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", SCOPES).await;
    let receiver = Receiver::start().await;
    receiver.reply(
        "/busy",
        &[
            Reply::Full(503, &[("retry-after", "3600")], ""),
            Reply::Status(200),
        ],
    );
    endpoint(&gw, &key, &receiver.url("/busy"), &["agent.run.*"]).await;
    publish(&gw, &ws, "agent.run.completed", "live").await;
    let got = received(&receiver, "/busy", 2, Duration::from_secs(15)).await;
    let waited = got[1].at - got[0].at;
    assert!(
        waited >= Duration::from_millis(1950) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
}

#[tokio::test]
async fn a_failed_delivery_can_be_retried_alone_and_a_test_event_sent() {
    let s = setup(&[1], 5, false).await;
    let receiver = Receiver::start().await;
    let long: &'static str = Box::leak("é".repeat(700).into_boxed_str());
    receiver.reply(
        "/hook",
        &[
            Reply::Full(500, &[], "down"),
            Reply::Full(500, &[], long),
            Reply::Status(200),
        ],
    );
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    let event_id = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    let paused = eventually(Duration::from_secs(10), || async {
        endpoint_status(&s.gw, &s.key, &id).await == "paused"
    })
    .await;
    assert!(paused.is_some());
    let listed = deliveries(&s.gw, &s.key, &id).await;
    let failed = &listed[0];
    assert_eq!(failed["status"], "failed");
    let attempt = &failed["last_attempt"];
    assert_eq!(attempt["status_code"], 500);
    assert_eq!(attempt["error"], "HTTP 500");
    // The first KiB of the body, cut at a character boundary.
    assert_eq!(attempt["response_body"], "é".repeat(512));
    assert!(attempt["duration_ms"].as_u64().is_some());
    let failed_id = failed["id"].as_str().unwrap();

    let retry = format!("/v1/webhooks/{id}/deliveries/{failed_id}/retry");
    // Not while the endpoint is paused.
    let resp = call(&s.gw, &s.key, Method::POST, &retry, None).await;
    assert_error(resp, 400, "invalid_request_error").await;
    let resume = format!("/v1/webhooks/{id}/resume");
    assert_eq!(
        call(&s.gw, &s.key, Method::POST, &resume, None)
            .await
            .status(),
        200
    );
    let resp = call(&s.gw, &s.key, Method::POST, &retry, None).await;
    assert_eq!(resp.status(), 202);
    let queued: Value = resp.json().await.unwrap();
    assert_eq!(queued["retry_of"], failed_id);
    let got = received(&receiver, "/hook", 3, Duration::from_secs(10)).await;
    assert_eq!(header(&got[2], "service-event-id"), event_id);
    // A delivery that is not failed, or not there, is not retried.
    let new_id = queued["delivery_id"].as_str().unwrap();
    eventually(Duration::from_secs(5), || async {
        deliveries(&s.gw, &s.key, &id).await[0]["status"] == "succeeded"
    })
    .await
    .expect("the retry succeeded");
    let path = format!("/v1/webhooks/{id}/deliveries/{new_id}/retry");
    let resp = call(&s.gw, &s.key, Method::POST, &path, None).await;
    assert_error(resp, 400, "invalid_request_error").await;
    let path = format!("/v1/webhooks/{id}/deliveries/dlv_nope/retry");
    let resp = call(&s.gw, &s.key, Method::POST, &path, None).await;
    assert_error(resp, 404, "not_found").await;

    // A test event: a sample of a type the endpoint subscribes to, to it alone.
    let (other, _) = endpoint(&s.gw, &s.key, &receiver.url("/other"), &["agent.run.*"]).await;
    let test = format!("/v1/webhooks/{id}/test");
    let resp = call(
        &s.gw,
        &s.key,
        Method::POST,
        &test,
        Some(json!({"type": "agent.run.failed"})),
    )
    .await;
    assert_eq!(resp.status(), 202);
    let sent: Value = resp.json().await.unwrap();
    let got = received(&receiver, "/hook", 4, Duration::from_secs(10)).await;
    let body: Value = serde_json::from_slice(&got[3].body).unwrap();
    assert_eq!(body["id"], sent["event_id"]);
    assert_eq!(body["type"], "agent.run.failed");
    assert_eq!(body["data"]["reason"], "max_steps_exhausted");
    let resp = call(&s.gw, &s.key, Method::POST, &test, None).await;
    assert_eq!(resp.status(), 202);
    received(&receiver, "/hook", 5, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(receiver.received("/other").is_empty(), "{other} got a test");
    let resp = call(
        &s.gw,
        &s.key,
        Method::POST,
        &test,
        Some(json!({"type": "billing.credits.low"})),
    )
    .await;
    assert_error(resp, 400, "invalid_request_error").await;
}
