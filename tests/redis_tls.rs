//! The Redis store over TLS (`rediss://`): a real `redis-server` with a TLS port, certificates
//! made by a test CA, and the gateway verifying the server (and, where Redis asks for one,
//! presenting a client certificate).

mod common;

use common::*;
use reqwest::Method;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `redis-server` listening only on a TLS port, killed on drop.
struct TlsRedis {
    child: Child,
    port: u16,
}

impl TlsRedis {
    async fn start(certs: &Certificates, client_certificates: &str) -> Self {
        let port = free_port();
        let arg = |p: PathBuf| p.display().to_string();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--tls-cert-file", &arg(certs.path("server.pem"))])
            .args(["--tls-key-file", &arg(certs.path("server.key"))])
            .args(["--tls-ca-cert-file", &arg(certs.path("ca.pem"))])
            .args(["--tls-auth-clients", client_certificates])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/install)");
        wait_for_port(port, "redis-server").await;
        Self { child, port }
    }

    fn url(&self) -> String {
        format!("rediss://localhost:{}/0", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn toml_path(key: &str, path: &Path) -> String {
    format!("{key} = \"{}\"", path.display())
}

/// A PEM file as a `[store]` setting takes it.
fn pem(path: &Path) -> Option<String> {
    Some(path.display().to_string())
}

async fn readiness(gw: &Gateway) -> u16 {
    gw.request(Method::GET, "/readyz")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn the_gateway_verifies_redis_over_tls_and_presents_its_client_certificate() {
    let certs = Certificates::make();
    let redis = TlsRedis::start(&certs, "yes").await;
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis.url(), &ns.name)
        .config(|c| {
            c.store.tls_ca_file = pem(&certs.path("ca.pem"));
            c.store.tls_cert_file = pem(&certs.path("client.pem"));
            c.store.tls_key_file = pem(&certs.path("client.key"));
        })
        .start()
        .await;
    assert_eq!(readiness(&gw).await, 200, "{}", gw.logs());

    // Keys, spend and audit records go through the TLS connection.
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .json(&json!({"model": "svc-chat-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let audit = eventually(Duration::from_secs(5), || async {
        let records = gw
            .admin_get(&format!("/admin/v1/audit?workspace={ws}"))
            .await;
        records["data"].as_array().is_some_and(|r| !r.is_empty())
    })
    .await;
    assert!(audit.is_some(), "the audit record reached Redis over TLS");
}

#[tokio::test]
async fn a_redis_certificate_from_an_unknown_ca_or_a_missing_client_certificate_is_not_ready() {
    let certs = Certificates::make();
    let ns = TestNamespace::new();

    // The system's roots do not include the test CA: the server is not trusted.
    let redis = TlsRedis::start(&certs, "no").await;
    let untrusting = Gateway::builder()
        .redis(&redis.url(), &ns.name)
        .start()
        .await;
    assert_eq!(readiness(&untrusting).await, 503);
    let trusting = Gateway::builder()
        .redis(&redis.url(), &ns.name)
        .config(|c| c.store.tls_ca_file = pem(&certs.path("ca.pem")))
        .start()
        .await;
    assert_eq!(readiness(&trusting).await, 200, "{}", trusting.logs());

    // A Redis that asks for a client certificate refuses a gateway without one.
    let strict = TlsRedis::start(&certs, "yes").await;
    let anonymous = Gateway::builder()
        .redis(&strict.url(), &ns.name)
        .config(|c| c.store.tls_ca_file = pem(&certs.path("ca.pem")))
        .start()
        .await;
    assert_eq!(readiness(&anonymous).await, 503);
}

#[test]
fn tls_files_that_cannot_be_used_stop_start_up_naming_the_setting() {
    let certs = Certificates::make();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            format!(
                "url = \"redis://127.0.0.1:6379\"\n{}",
                toml_path("tls_ca_file", &certs.path("ca.pem"))
            ),
            "store.tls_ca_file",
            "needs a rediss://",
        ),
        (
            format!(
                "url = \"rediss://localhost:6379\"\n{}",
                toml_path("tls_ca_file", &dir.path().join("absent.pem"))
            ),
            "store.tls_ca_file",
            "cannot read",
        ),
        (
            format!(
                "url = \"rediss://localhost:6379\"\n{}",
                toml_path("tls_cert_file", &certs.path("client.pem"))
            ),
            "store.tls_key_file",
            "tls_cert_file needs it",
        ),
    ];
    for (store, key, reason) in cases {
        let path = dir.path().join("svcgate.toml");
        std::fs::write(&path, format!("[store]\nkind = \"redis\"\n{store}\n")).unwrap();
        let out = svcgate_command()
            .args(["serve", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{store}: {stderr}");
        assert!(
            stderr.contains(key) && stderr.contains(reason),
            "{store}: {stderr}"
        );
    }
}
