//! `svcgate listen`, from a developer's side: run the real CLI against a gateway, trigger
//! events, and look at what a receiver on loopback got and what the CLI printed.

mod cli;
#[path = "../common/mod.rs"]
mod common;
mod reader;
mod stream;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use svcgate::events::Event;
use svcgate::keys::Environment;

const READ: &[&str] = &["webhooks:read"];
/// A payload with characters that must survive byte for byte.
fn payload(tag: &str) -> Value {
    json!({"run_id": tag, "note": "ünïcödé ✓ \"quoted\"\nsecond line", "steps": 3})
}

/// A running `svcgate listen`, killed on drop.
struct Listener {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    /// The threads copying stdout and stderr; they end when the process closes its pipes.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Listener {
    /// Starts `svcgate listen` with `args` (the key goes in `SVCGATE_API_KEY`).
    fn spawn(gw: &Gateway, key: &str, args: &[&str]) -> Self {
        let mut child = svcgate_command()
            .args(["listen", "--gateway-url", &gw.base])
            .args(args)
            .env("SVCGATE_API_KEY", key)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("svcgate listen starts");
        let mut readers = Vec::new();
        let mut collect = |pipe: Box<dyn std::io::Read + Send>| {
            let lines: Arc<Mutex<Vec<String>>> = Arc::default();
            let sink = lines.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    sink.lock().unwrap().push(line);
                }
            }));
            lines
        };
        let stdout = collect(Box::new(child.stdout.take().unwrap()));
        let stderr = collect(Box::new(child.stderr.take().unwrap()));
        Self {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Starts it and waits for the session's secret.
    async fn start(gw: &Gateway, key: &str, forward_to: &str, extra: &[&str]) -> (Self, String) {
        let mut listener = Self::spawn(gw, key, &[&["--forward-to", forward_to], extra].concat());
        let ready = listener
            .line("Ready. Webhook signing secret for this session: ")
            .await;
        let secret = ready.rsplit(' ').next().unwrap().to_string();
        assert!(secret.starts_with("whsec_") && secret.len() > 20, "{ready}");
        listener.assert_running();
        (listener, secret)
    }

    /// The first stdout line containing `needle`, waiting up to 10 s for it.
    async fn line(&self, needle: &str) -> String {
        let find = || {
            self.stdout
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
                .cloned()
        };
        eventually(Duration::from_secs(10), || async { find().is_some() }).await;
        find().unwrap_or_else(|| {
            panic!(
                "no line with {needle:?}; stdout: {:?}; stderr: {:?}",
                self.stdout.lock().unwrap(),
                self.stderr.lock().unwrap()
            )
        })
    }

    fn output(&self) -> String {
        let out = self.stdout.lock().unwrap().join("\n");
        let err = self.stderr.lock().unwrap().join("\n");
        format!("{out}\n{err}")
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    fn assert_running(&mut self) {
        let exited = self.child.try_wait().unwrap();
        assert!(exited.is_none(), "listen exited: {}", self.output());
    }

    /// Waits up to `limit` for the process to exit and, once it has, for everything it printed
    /// to be read.
    async fn exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut status = None;
        eventually(limit, || {
            status = self.child.try_wait().unwrap();
            let exited = status.is_some();
            async move { exited }
        })
        .await;
        if status.is_some() {
            for reader in self.readers.drain(..) {
                reader.join().expect("output reader");
            }
        }
        status
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes an event through the admin API; returns its id.
async fn trigger(
    gw: &Gateway,
    ws: &str,
    event_type: &str,
    environment: &str,
    data: Value,
) -> String {
    gw.publish_event(ws, event_type, environment, data).await
}

/// Asserts that `got` is the delivery of one event, signed with `secret`; returns the body.
fn assert_delivery(got: &Recorded, secret: &str) -> Value {
    let header = |name: &str| {
        got.headers
            .get(name)
            .unwrap_or_else(|| panic!("{name} header"))
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(got.method, Method::POST);
    assert_eq!(got.path, "/hooks");
    assert_eq!(header("content-type"), "application/json");
    let timestamp = header("service-timestamp");
    let sent_at: u64 = timestamp.parse().unwrap();
    assert!(sent_at.abs_diff(svcgate::ids::unix_now()) < 60);
    assert_eq!(
        header("service-signature"),
        expected_signature(secret, &timestamp, &got.body)
    );
    let body: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(header("service-event-id"), body["id"].as_str().unwrap());
    // Exactly the bytes production sends for this event.
    let event = Event {
        id: body["id"].as_str().unwrap().to_string(),
        event_type: body["type"].as_str().unwrap().to_string(),
        created: body["created"].as_u64().unwrap(),
        workspace: body["workspace"].as_str().unwrap().to_string(),
        environment: Environment::Live,
        data: body["data"].clone(),
        traceparent: None,
    };
    assert_eq!(
        String::from_utf8_lossy(&got.body),
        String::from_utf8_lossy(&svcgate::webhooks::delivery::body(&event))
    );
    body
}

/// Waits until `receiver` has `n` deliveries, then a moment more for any it should not get.
async fn deliveries(receiver: &RecordingUpstream, n: usize) -> Vec<Recorded> {
    eventually(Duration::from_secs(10), || async {
        receiver.requests().len() >= n
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = receiver.requests();
    assert_eq!(got.len(), n, "deliveries: {got:?}");
    got
}

fn ids(got: &[Recorded]) -> std::collections::BTreeSet<String> {
    got.iter()
        .map(|r| r.headers["service-event-id"].to_str().unwrap().to_string())
        .collect()
}
