//! The mail to a workspace's admins when an endpoint pauses.

use super::*;

/// The pause mail is kept in Redis until it is sent: a relay that is down when the endpoint
/// pauses, and a gateway stopped meanwhile, delay it but do not lose it; the mail for an
/// endpoint deleted meanwhile is dropped.
#[tokio::test]
async fn the_pause_mail_survives_a_relay_outage_and_a_restart() {
    let ns = TestNamespace::new();
    let outbox = tempfile::tempdir().unwrap();
    let start = |smtp_port: u16| {
        Gateway::builder()
            .redis(&redis_url(), &ns.name)
            .config(webhooks(outbox.path(), &[1], 2))
            .config(smtp_relay(smtp_port))
            .start()
    };
    // Nothing listens on the relay's port.
    let mut gw = start(free_port()).await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", SCOPES).await;
    let receiver = Receiver::start().await;
    receiver.reply("/down", &[Reply::Status(500)]);
    receiver.reply("/gone", &[Reply::Status(500)]);
    let (kept, _) = endpoint(&gw, &key, &receiver.url("/down"), &["agent.run.*"]).await;
    let (deleted, _) = endpoint(&gw, &key, &receiver.url("/gone"), &["agent.run.*"]).await;
    publish(&gw, &ws, "agent.run.completed", "live").await;
    let refused = |logs: &str, id: &str| {
        logs.lines()
            .any(|l| l.contains("could not e-mail the admins") && l.contains(id))
    };
    let tried = eventually(Duration::from_secs(20), || async {
        let logs = gw.logs();
        refused(&logs, &kept) && refused(&logs, &deleted)
    })
    .await;
    assert!(tried.is_some(), "no failed try; log:\n{}", gw.logs());
    let resp = call(
        &gw,
        &key,
        Method::DELETE,
        &format!("/v1/webhooks/{deleted}"),
        None,
    )
    .await;
    assert!(resp.status().is_success(), "{}", resp.status());
    std::process::Command::new("kill")
        .args(["-TERM", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(gw.wait_exit(Duration::from_secs(15)).is_some());
    let first_logs = gw.logs();
    drop(gw);

    // A new gateway on the same Redis, with a relay that works, sends the mail.
    let smtp = SmtpSink::start();
    let gw = start(smtp.port).await;
    let mailed = eventually(Duration::from_secs(20), || async {
        !smtp.mails().is_empty()
    })
    .await;
    assert!(mailed.is_some(), "no mail; log:\n{}", gw.logs());
    let mail = &smtp.mails()[0];
    assert_eq!(mail.to, ["ops@example.com"]);
    assert!(
        mail.data
            .contains(&format!("Webhook endpoint {kept} paused")),
        "{}",
        mail.data
    );
    assert!(mail.data.contains("Last error: HTTP 500"), "{}", mail.data);
    // Sent once, and removed: nothing is pending, nothing else is sent.
    let drained = eventually(Duration::from_secs(10), || async {
        gw.metrics_text()
            .await
            .contains("svcgate_webhook_pause_notices_pending 0")
    })
    .await;
    assert!(drained.is_some(), "{}", gw.logs());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        smtp.mails().len(),
        1,
        "one mail, for the endpoint that is left"
    );
    let logs = format!("{first_logs}{}", gw.logs());
    assert!(
        logs.lines()
            .any(|l| l.contains("dropping a pause notice") && l.contains(&deleted)),
        "{logs}"
    );
}

#[tokio::test]
async fn the_zero_config_demo_workspace_has_nobody_to_mail_so_its_pause_notice_is_dropped() {
    let outbox = tempfile::tempdir().unwrap();
    let gw = Gateway::builder()
        .config(webhooks(outbox.path(), &[1], 2))
        .start()
        .await;
    let (_, key) = gw.create_key("live", SCOPES).await;
    let receiver = Receiver::start().await;
    receiver.reply("/down", &[Reply::Status(500)]);
    let (id, _) = endpoint(&gw, &key, &receiver.url("/down"), &["key.auto_revoked"]).await;
    publish(&gw, DEMO_WS, "key.auto_revoked", "live").await;
    let paused = eventually(Duration::from_secs(10), || async {
        endpoint_status(&gw, &key, &id).await == "paused"
    })
    .await;
    assert!(paused.is_some(), "endpoint not paused");
    // Not retried for ever: dropped, counted, and nothing written to the outbox.
    let dropped = eventually(Duration::from_secs(10), || async {
        let text = gw.metrics_text().await;
        text.contains("svcgate_webhook_pause_mails_total{outcome=\"dropped\"} 1")
            && text.contains("svcgate_webhook_pause_notices_pending 0")
    })
    .await;
    assert!(dropped.is_some(), "{}", gw.metrics_text().await);
    assert!(!gw.metrics_text().await.contains("outcome=\"failed\"} "));
    assert_eq!(std::fs::read_dir(outbox.path()).map_or(0, |d| d.count()), 0);
}

/// Gives a new workspace an endpoint that always fails, publishes an event for it and waits
/// until the mail that it was paused reaches `smtp`; returns the endpoint's id.
async fn pause_an_endpoint_and_await_the_mail(gw: &Gateway, smtp: &SmtpSink) -> (String, Receiver) {
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", SCOPES).await;
    let receiver = Receiver::start().await;
    receiver.reply("/down", &[Reply::Status(500)]);
    let (id, _) = endpoint(gw, &key, &receiver.url("/down"), &["agent.run.*"]).await;
    publish(gw, &ws, "agent.run.completed", "live").await;
    let mailed = eventually(Duration::from_secs(15), || async {
        !smtp.mails().is_empty()
    })
    .await;
    assert!(mailed.is_some(), "no mail; log:\n{}", gw.logs());
    (id, receiver)
}

#[tokio::test]
async fn with_smtp_configured_the_pause_mail_goes_over_smtp() {
    let ns = TestNamespace::new();
    let outbox = tempfile::tempdir().unwrap();
    let smtp = SmtpSink::start();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(webhooks(outbox.path(), &[1], 2))
        .config(smtp_relay(smtp.port))
        .start()
        .await;
    let (id, receiver) = pause_an_endpoint_and_await_the_mail(&gw, &smtp).await;
    let mail = &smtp.mails()[0];
    assert_eq!(mail.from, "webhooks@svcgate.test");
    assert_eq!(mail.to, ["ops@example.com"]);
    assert!(
        mail.data.contains(&format!("Webhook endpoint {id} paused")),
        "{}",
        mail.data
    );
    assert!(!mail.data.contains("whsec_"));
    assert_eq!(
        receiver.received("/down").len(),
        2,
        "first attempt and one retry"
    );
    assert!(std::fs::read_dir(outbox.path())
        .map(|d| d.count() == 0)
        .unwrap_or(true));
}

#[tokio::test]
async fn a_relay_that_needs_starttls_and_a_login_gets_the_pause_mail_over_both() {
    let ns = TestNamespace::new();
    let outbox = tempfile::tempdir().unwrap();
    let certs = Certificates::make();
    let password = "relay-pass-9f2c41";
    let smtp = SmtpSink::start_tls(&certs, "svcgate", password);
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(webhooks(outbox.path(), &[1], 2))
        .config(smtp_relay(smtp.port))
        .config(|c| {
            c.smtp.host = Some("localhost".to_string());
            c.smtp.tls = SmtpTls::Starttls;
            c.smtp.username = Some("svcgate".to_string());
            c.smtp.password = Some(password.to_string());
            c.smtp.tls_ca_file = Some(certs.path("ca.pem").display().to_string());
        })
        .start()
        .await;
    let (id, _) = pause_an_endpoint_and_await_the_mail(&gw, &smtp).await;
    // The sink offers AUTH only after STARTTLS, so a login means the session was encrypted
    // (and the relay's certificate, from the test CA, was verified).
    assert_eq!(
        smtp.logins(),
        [("svcgate".to_string(), password.to_string())]
    );
    assert!(smtp.mails()[0]
        .data
        .contains(&format!("Webhook endpoint {id} paused")));
    assert!(
        !gw.logs().contains(password),
        "the SMTP password was logged"
    );
}
