//! The reference receiver (`examples/receiver.rs`) over real HTTP: 200 for a good delivery (and
//! for its duplicate, processed once), 400 for a stale one or a header id that is not the
//! body's, 401 for a bad signature; either delivery format, and a rotation's two signatures.

mod common;

use common::free_port;
use std::process::{Command, Stdio};
use std::time::Duration;
use svcgate::webhooks::sign;

const SECRET: &str = "whsec_receiver_test";

fn example(name: &str) -> std::path::PathBuf {
    // target/debug/deps/<test> → target/debug/examples/<name>
    let mut dir = std::env::current_exe().unwrap();
    dir.pop();
    dir.pop();
    dir.join("examples").join(name)
}

struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test]
async fn the_reference_receiver_answers_200_400_401_and_deduplicates() {
    let path = example("receiver");
    if !path.exists() {
        // `cargo test` builds examples first; make sure of it when run on its own.
        let status = Command::new(env!("CARGO"))
            .args(["build", "--example", "receiver"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let port = free_port();
    let child = Command::new(&path)
        .arg(format!("127.0.0.1:{port}"))
        .env("SVCGATE_WEBHOOK_SECRET", SECRET)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed however the test ends, so a failed assertion leaves no receiver behind.
    let mut child = KillOnDrop(Some(child));
    let url = format!("http://127.0.0.1:{port}/hook");
    let http = reqwest::Client::new();
    let body =
        r#"{"id":"evt_1","type":"agent.run.completed","created":1,"workspace":"ws_1","data":{}}"#;
    let now = svcgate::ids::unix_now();
    let post = |ts: u64, sig: String, id: &str| {
        http.post(&url)
            .header("service-timestamp", ts.to_string())
            .header("service-signature", sig)
            .header("service-event-id", id.to_string())
            .body(body)
            .send()
    };
    let mut up = false;
    for _ in 0..100 {
        if post(now, sign(SECRET, now, body.as_bytes()), "evt_1")
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "receiver did not start");
    let status = |r: reqwest::Result<reqwest::Response>| r.unwrap().status().as_u16();
    assert_eq!(
        status(post(now, sign(SECRET, now, body.as_bytes()), "evt_1").await),
        200
    );
    let old = now - 301;
    assert_eq!(
        status(post(old, sign(SECRET, old, body.as_bytes()), "evt_2").await),
        400
    );
    assert_eq!(
        status(post(now, sign("whsec_wrong", now, body.as_bytes()), "evt_3").await),
        401
    );
    assert_eq!(status(post(now, "00".repeat(32), "evt_4").await), 401);
    // A clock ahead is refused as a clock behind.
    let ahead = now + 301;
    assert_eq!(
        status(post(ahead, sign(SECRET, ahead, body.as_bytes()), "evt_1").await),
        400
    );
    // The same signed delivery under another header id is not a new event.
    assert_eq!(
        status(post(now, sign(SECRET, now, body.as_bytes()), "evt_5").await),
        400
    );
    // During a rotation two signatures are listed; either matching is enough.
    let rotated = |id: &str| {
        let body = body.replace("evt_1", id);
        let listed = format!(
            "{},{}",
            sign("whsec_new_one", now, body.as_bytes()),
            sign(SECRET, now, body.as_bytes())
        );
        http.post(&url)
            .header("service-timestamp", now.to_string())
            .header("service-signature", listed)
            .header("service-event-id", id.to_string())
            .body(body)
            .send()
    };
    assert_eq!(status(rotated("evt_6").await), 200);
    // The Standard Webhooks format, as an endpoint of that format gets it.
    let standard = body.replace("evt_1", "evt_7");
    let mut request = http.post(&url).body(standard.clone());
    for (name, value) in svcgate::webhooks::signature::signature_headers(
        svcgate::webhooks::endpoint::WebhookFormat::StandardWebhooks,
        &["whsec_new_one", SECRET],
        "evt_7",
        now,
        standard.as_bytes(),
    ) {
        request = request.header(name, value);
    }
    assert_eq!(status(request.send().await), 200);
    let mut child = child.0.take().unwrap();
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        printed.matches("event evt_1: {").count(),
        1,
        "processed once: {printed}"
    );
    assert!(printed.contains("event evt_1: duplicate"));
    assert!(printed.contains("event evt_6: {") && printed.contains("event evt_7: {"));
    for other in ["evt_2", "evt_3", "evt_5"] {
        assert!(!printed.contains(other), "{other}: {printed}");
    }
}
