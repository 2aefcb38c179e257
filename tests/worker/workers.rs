//! Worker processes: slots per endpoint, crashes, several workers, signals, metrics.

use super::*;

#[tokio::test]
async fn a_slow_endpoint_does_not_delay_a_fast_one() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/slow", &[Reply::Slow(Duration::from_secs(10))]);
    endpoint(&s.gw, &s.key, &receiver.url("/slow"), &["agent.run.*"]).await;
    endpoint(&s.gw, &s.key, &receiver.url("/fast"), &["agent.run.*"]).await;
    let started = Instant::now();
    for _ in 0..6 {
        publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    }
    received(&receiver, "/fast", 6, Duration::from_secs(8)).await;
    // The slow endpoint holds its cap (2) of attempts open the whole time.
    assert!(started.elapsed() < Duration::from_secs(9));
    assert_eq!(receiver.received("/slow").len(), 2);
}

#[tokio::test]
async fn endpoints_that_hang_leave_slots_for_the_others() {
    // Four slots, two per endpoint: four endpoints that never answer could hold all of them.
    let ns = TestNamespace::new();
    let outbox = tempfile::tempdir().unwrap();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(webhooks(outbox.path(), &[1; 8], 5))
        .config(|c| c.webhooks.max_in_flight = 4)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", SCOPES).await;
    let receiver = Receiver::start().await;
    receiver.reply("/hang", &[Reply::Slow(Duration::from_secs(60))]);
    for _ in 0..4 {
        endpoint(&gw, &key, &receiver.url("/hang"), &["agent.run.*"]).await;
    }
    endpoint(&gw, &key, &receiver.url("/ok"), &["image.batch.*"]).await;
    for _ in 0..4 {
        publish(&gw, &ws, "agent.run.completed", "live").await;
    }
    // Sixteen deliveries to endpoints that hang, retried a second after each 5 s timeout: the
    // first attempts take all four slots; once they have failed, those endpoints get one slot
    // at a time and two between them.
    eventually(Duration::from_secs(15), || async {
        receiver.received("/hang").len() >= 6
    })
    .await
    .expect("the hanging endpoints are retried");
    for _ in 0..3 {
        let n = receiver.received("/ok").len() + 1;
        let started = Instant::now();
        publish(&gw, &ws, "image.batch.completed", "live").await;
        received(&receiver, "/ok", n, Duration::from_secs(10)).await;
        // Not held up by an attempt that times out (5 s): there is a free slot at once.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}

#[tokio::test]
async fn a_worker_killed_mid_delivery_loses_nothing() {
    let s = setup(&[60], 2, true).await;
    let receiver = Receiver::start().await;
    receiver.reply(
        "/hook",
        &[Reply::Slow(Duration::from_secs(30)), Reply::Status(200)],
    );
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    let mut worker = s.gw.start_worker();
    let event_id = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/hook", 1, Duration::from_secs(10)).await;
    worker.kill();

    // A new worker takes the delivery over once its lease ends, with the same event id.
    let _worker = s.gw.start_worker();
    let got = received(&receiver, "/hook", 2, Duration::from_secs(20)).await;
    assert_eq!(header(&got[1], "service-event-id"), event_id);
    let done = eventually(Duration::from_secs(5), || async {
        deliveries(&s.gw, &s.key, &id).await[0]["status"] == "succeeded"
    })
    .await;
    assert!(done.is_some());
}

#[tokio::test]
async fn webhook_metrics_report_outcomes_and_the_queue() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    receiver.reply("/down", &[Reply::Status(500)]);
    endpoint(&s.gw, &s.key, &receiver.url("/ok"), &["agent.run.*"]).await;
    endpoint(&s.gw, &s.key, &receiver.url("/down"), &["agent.run.*"]).await;
    publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/ok", 1, Duration::from_secs(10)).await;
    received(&receiver, "/down", 1, Duration::from_secs(10)).await;
    let metrics = || s.gw.metrics_text();
    let reported = eventually(Duration::from_secs(10), || async {
        let text = metrics().await;
        text.contains("svcgate_webhook_queue_depth 1")
            && text.contains(r#"svcgate_webhook_deliveries_total{outcome="failed_retrying"} 1"#)
    })
    .await;
    let text = metrics().await;
    assert!(reported.is_some(), "{text}");
    for line in [
        r#"svcgate_webhook_deliveries_total{outcome="succeeded"} 1"#,
        "svcgate_webhook_paused_endpoints 0",
        "svcgate_webhook_oldest_pending_seconds 0",
        "svcgate_webhook_delivery_duration_seconds_count",
        "svcgate_webhook_delivery_lag_seconds_count 1",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
}

#[tokio::test]
async fn several_workers_share_the_work_and_deliver_each_event_once() {
    let s = setup(&[60], 10, true).await;
    let receiver = Receiver::start().await;
    endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    let workers = [s.gw.start_worker(), s.gw.start_worker()];
    let mut published = Vec::new();
    for _ in 0..40 {
        published.push(publish(&s.gw, &s.ws, "agent.run.completed", "live").await);
    }
    received(&receiver, "/hook", 40, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ids = event_ids(&receiver, "/hook");
    published.sort();
    assert_eq!(ids, published, "every event once, none twice");
    for w in &workers {
        assert!(w.logs().contains("webhook worker running"), "{}", w.logs());
    }
}

#[tokio::test]
async fn a_worker_stops_on_sigterm_and_serves_probes_and_metrics_until_then() {
    let s = setup(&[60], 10, true).await;
    let port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = svcgate_command()
        .env("SVCGATE_SERVER_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .args(["worker", "--config"])
        .arg(s.gw.config_path())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let up = eventually(Duration::from_secs(10), || async {
        reqwest::get(format!("{base}/readyz"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(
        up.is_some(),
        "{}",
        std::fs::read_to_string(log.path()).unwrap()
    );
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("svcgate_webhook_queue_depth"), "{metrics}");
    let resp = reqwest::get(format!("{base}/nope")).await.unwrap();
    assert_error(resp, 404, "not_found").await;

    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the worker did not stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(std::fs::read_to_string(log.path())
        .unwrap()
        .contains("webhook worker stopped"));
}
