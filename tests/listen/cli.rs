//! `svcgate listen` forwarding events to a receiver on loopback.

use super::*;

#[tokio::test]
async fn listen_forwards_signed_events_of_the_chosen_types_from_its_workspace() {
    let gw = Gateway::builder().start().await;
    let other_ws = gw.create_workspace().await;
    let (_, key) = gw.create_key("live", READ).await;
    let receiver = RecordingUpstream::start("receiver").await;
    let url = format!("http://{}/hooks", receiver.addr);
    let (listener, secret) = Listener::start(&gw, &key, &url, &["--events", "agent.run.*"]).await;

    trigger(&gw, DEMO_WS, "image.batch.completed", "live", json!({})).await;
    trigger(&gw, DEMO_WS, "agent.run.completed", "test", json!({})).await;
    trigger(&gw, &other_ws, "agent.run.completed", "live", json!({})).await;
    let completed = trigger(
        &gw,
        DEMO_WS,
        "agent.run.completed",
        "live",
        payload("run_1"),
    )
    .await;
    let failed = trigger(&gw, DEMO_WS, "agent.run.failed", "live", payload("run_2")).await;

    let got = deliveries(&receiver, 2).await;
    assert_eq!(ids(&got), [completed.clone(), failed.clone()].into());
    for delivery in &got {
        let body = assert_delivery(delivery, &secret);
        assert_eq!(body["workspace"], DEMO_WS);
        let tag = if body["id"] == completed.as_str() {
            "run_1"
        } else {
            "run_2"
        };
        assert_eq!(body["data"], payload(tag));
    }
    for (id, event_type) in [
        (&completed, "agent.run.completed"),
        (&failed, "agent.run.failed"),
    ] {
        let line = listener.line(id).await;
        assert!(
            line.contains(event_type) && line.contains("-> 200 ("),
            "{line}"
        );
    }
    assert!(
        !listener.output().contains(&key),
        "the API key is never printed"
    );
}

#[tokio::test]
async fn listen_forwards_in_the_standard_webhooks_format_when_asked() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", READ).await;
    let receiver = RecordingUpstream::start("receiver").await;
    let url = format!("http://{}/hooks", receiver.addr);
    let (_listener, secret) =
        Listener::start(&gw, &key, &url, &["--format", "standard-webhooks"]).await;
    let id = trigger(
        &gw,
        DEMO_WS,
        "agent.run.completed",
        "live",
        payload("run_1"),
    )
    .await;
    let got = deliveries(&receiver, 1).await;
    let headers = &got[0].headers;
    assert_eq!(headers["webhook-id"], id.as_str());
    assert!(headers["webhook-signature"]
        .to_str()
        .unwrap()
        .starts_with("v1,"));
    assert!(headers.get("service-signature").is_none());
    let now = svcgate::ids::unix_now();
    svcgate::webhooks::verify(&secret, headers, &got[0].body, now).unwrap();
    assert!(svcgate::webhooks::verify("whsec_b3RoZXI=", headers, &got[0].body, now).is_err());
}

#[tokio::test]
async fn a_test_key_gets_only_test_mode_events() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("test", READ).await;
    let receiver = RecordingUpstream::start("receiver").await;
    let url = format!("http://{}/hooks", receiver.addr);
    let (_listener, secret) = Listener::start(&gw, &key, &url, &[]).await;

    trigger(&gw, DEMO_WS, "agent.run.completed", "live", json!({})).await;
    let revoked = trigger(&gw, DEMO_WS, "key.auto_revoked", "test", json!({})).await;
    let failed = trigger(&gw, DEMO_WS, "agent.run.failed", "test", json!({})).await;

    let got = deliveries(&receiver, 2).await;
    assert_eq!(ids(&got), [revoked, failed].into());
    for delivery in &got {
        assert_delivery(delivery, &secret);
    }
}

#[tokio::test]
async fn listen_on_redis_forwards_admin_events_and_entries_added_to_the_stream() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let other_ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", READ).await;
    let receiver = RecordingUpstream::start("receiver").await;
    let url = format!("http://{}/hooks", receiver.addr);
    let (listener, secret) = Listener::start(&gw, &key, &url, &[]).await;

    trigger(&gw, &other_ws, "agent.run.completed", "live", json!({})).await;
    // A backend may add to the event stream directly, with no id of its own.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(format!("{{{}}}:events", ns.name))
        .arg("*")
        .arg(&[
            ("type", "image.batch.completed"),
            ("workspace", ws.as_str()),
            ("data", r#"{"batch_id":"batch_1"}"#),
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let from_admin = trigger(&gw, &ws, "agent.run.completed", "live", payload("run_3")).await;

    let got = deliveries(&receiver, 2).await;
    let bodies: Vec<Value> = got.iter().map(|d| assert_delivery(d, &secret)).collect();
    let direct = bodies
        .iter()
        .find(|b| b["type"] == "image.batch.completed")
        .expect("the entry added to the stream");
    assert_eq!(direct["data"], json!({"batch_id": "batch_1"}));
    assert_eq!(direct["workspace"], ws.as_str());
    assert!(bodies
        .iter()
        .any(|b| b["id"] == from_admin.as_str() && b["data"] == payload("run_3")));
    listener.line(&from_admin).await;
    listener.line(direct["id"].as_str().unwrap()).await;
}
