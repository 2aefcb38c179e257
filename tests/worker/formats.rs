//! Endpoint formats and secret rotation, checked as receivers check them: the official
//! Standard Webhooks package (PyPI `standardwebhooks`) for that format, the crate's `verify`
//! and an independent HMAC for the service format.

use super::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A Python with the official `standardwebhooks` package: `SVCGATE_TEST_PYTHON`, or the venv
/// `.ci/run` makes (`target/ci-venv`). Panics, saying how to get one, if there is none.
fn python() -> PathBuf {
    let python = std::env::var_os("SVCGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/ci-venv/bin/python")
        });
    let has_package = Command::new(&python)
        .args(["-c", "import standardwebhooks"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_package,
        "no Python with the standardwebhooks package at {}: run .ci/run, or \
         `python3 -m venv target/ci-venv && target/ci-venv/bin/pip install standardwebhooks==1.1.0`, \
         or set SVCGATE_TEST_PYTHON",
        python.display()
    );
    python
}

/// Whether the official Standard Webhooks library verifies `r` with `secret`.
fn standard_library_verifies(secret: &str, r: &Received) -> bool {
    const SCRIPT: &str = "import json, sys\n\
        from standardwebhooks.webhooks import Webhook\n\
        headers = json.loads(sys.argv[2])\n\
        body = sys.stdin.buffer.read()\n\
        try:\n    Webhook(sys.argv[1]).verify(body, headers)\n\
        except Exception as e:\n    print(e); sys.exit(1)\n";
    let headers: serde_json::Map<String, Value> = r
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap())))
        .collect();
    let mut child = Command::new(python())
        .args(["-c", SCRIPT, secret, &Value::Object(headers).to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&r.body).unwrap();
    child.wait_with_output().unwrap().status.success()
}

/// Creates an endpoint with `body` (its url and events are added); returns the answer.
async fn create(s: &Setup, url: &str, extra: Value) -> Value {
    let mut body = json!({"url": url, "events": ["agent.run.*"]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let resp = call(&s.gw, &s.key, Method::POST, "/v1/webhooks", Some(body)).await;
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

async fn rotate(s: &Setup, id: &str, grace: u64) -> Value {
    let path = format!("/v1/webhooks/{id}/rotate-secret");
    let body = json!({"grace_period_seconds": grace});
    let resp = call(&s.gw, &s.key, Method::POST, &path, Some(body)).await;
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

#[tokio::test]
async fn a_standard_webhooks_delivery_is_verified_by_the_official_package() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    let created = create(
        &s,
        &receiver.url("/std"),
        json!({"format": "standard-webhooks"}),
    )
    .await;
    assert_eq!(created["format"], "standard-webhooks");
    let secret = created["secret"].as_str().unwrap();
    // `whsec_` and the base64 of 24-64 random bytes.
    use base64::Engine;
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    assert!((24..=64).contains(&key.len()));

    let event_id = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    let got = received(&receiver, "/std", 1, Duration::from_secs(10)).await;
    let r = &got[0];
    assert_eq!(header(r, "webhook-id"), event_id);
    assert!(header(r, "webhook-signature").starts_with("v1,"));
    assert!(header(r, "service-signature").is_empty());
    assert!(
        standard_library_verifies(secret, r),
        "the official package refused the delivery"
    );
    assert!(!standard_library_verifies(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        r
    ));
    assert!(
        svcgate::webhooks::verify(secret, &r.headers, &r.body, svcgate::ids::unix_now()).is_ok()
    );

    // Switched to the service format by PATCH, the same endpoint signs as the seed describes.
    let id = created["id"].as_str().unwrap();
    let resp = call(
        &s.gw,
        &s.key,
        Method::PATCH,
        &format!("/v1/webhooks/{id}"),
        Some(json!({"format": "service"})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["format"], "service");
    assert!(body.get("secret").is_none());
    publish(&s.gw, &s.ws, "agent.run.failed", "live").await;
    let got = received(&receiver, "/std", 2, Duration::from_secs(10)).await;
    let r = &got[1];
    assert!(header(r, "webhook-signature").is_empty());
    assert_eq!(
        header(r, "service-signature"),
        expected_signature(secret, header(r, "service-timestamp"), &r.body)
    );
    // A format svcgate does not know is a 400.
    let resp = call(
        &s.gw,
        &s.key,
        Method::PATCH,
        &format!("/v1/webhooks/{id}"),
        Some(json!({"format": "svix"})),
    )
    .await;
    assert_error(resp, 400, "invalid_request_error").await;
}

#[tokio::test]
async fn during_a_rotation_both_secrets_verify_and_after_it_only_the_new_one() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    let standard = create(
        &s,
        &receiver.url("/std"),
        json!({"format": "standard-webhooks"}),
    )
    .await;
    let service = create(&s, &receiver.url("/svc"), json!({})).await;
    let old = |e: &Value| e["secret"].as_str().unwrap().to_string();
    let (std_old, svc_old) = (old(&standard), old(&service));

    let grace = 4;
    let std_rotated = rotate(&s, standard["id"].as_str().unwrap(), grace).await;
    let svc_rotated = rotate(&s, service["id"].as_str().unwrap(), grace).await;
    let (std_new, svc_new) = (old(&std_rotated), old(&svc_rotated));
    assert_ne!(std_new, std_old);
    assert_ne!(svc_new, svc_old);
    assert!(std_rotated["previous_secret_expires_at"].as_u64().is_some());
    // The secret is shown once: not in the endpoint's listing.
    let shown = call(
        &s.gw,
        &s.key,
        Method::GET,
        &format!("/v1/webhooks/{}", service["id"].as_str().unwrap()),
        None,
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(!shown.contains("whsec_"), "{shown}");

    // Within the grace period: two signatures, either secret verifies.
    publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    let std_got = received(&receiver, "/std", 1, Duration::from_secs(10)).await;
    let svc_got = received(&receiver, "/svc", 1, Duration::from_secs(10)).await;
    let now = svcgate::ids::unix_now();
    let (r, q) = (&std_got[0], &svc_got[0]);
    assert_eq!(header(r, "webhook-signature").split(' ').count(), 2);
    assert!(standard_library_verifies(&std_new, r));
    assert!(standard_library_verifies(&std_old, r));
    let signatures: Vec<&str> = header(q, "service-signature").split(',').collect();
    let ts = header(q, "service-timestamp");
    assert_eq!(
        signatures,
        [
            expected_signature(&svc_new, ts, &q.body),
            expected_signature(&svc_old, ts, &q.body)
        ]
    );
    for (secret, r) in [(&std_new, r), (&std_old, r), (&svc_new, q), (&svc_old, q)] {
        assert!(
            svcgate::webhooks::verify(secret, &r.headers, &r.body, now).is_ok(),
            "{secret}"
        );
    }

    // After it: one signature, the new secret's.
    tokio::time::sleep(Duration::from_secs(grace + 1)).await;
    publish(&s.gw, &s.ws, "agent.run.failed", "live").await;
    let std_got = received(&receiver, "/std", 2, Duration::from_secs(10)).await;
    let svc_got = received(&receiver, "/svc", 2, Duration::from_secs(10)).await;
    let now = svcgate::ids::unix_now();
    let (r, q) = (&std_got[1], &svc_got[1]);
    assert_eq!(header(r, "webhook-signature").split(' ').count(), 1);
    assert!(standard_library_verifies(&std_new, r));
    assert!(!standard_library_verifies(&std_old, r));
    assert!(!header(q, "service-signature").contains(','));
    assert!(svcgate::webhooks::verify(&svc_new, &q.headers, &q.body, now).is_ok());
    assert!(svcgate::webhooks::verify(&svc_old, &q.headers, &q.body, now).is_err());
    let shown = call(
        &s.gw,
        &s.key,
        Method::GET,
        &format!("/v1/webhooks/{}", service["id"].as_str().unwrap()),
        None,
    )
    .await;
    let shown: Value = shown.json().await.unwrap();
    assert!(shown.get("previous_secret_expires_at").is_none());

    // A grace period longer than a week is refused.
    let path = format!(
        "/v1/webhooks/{}/rotate-secret",
        service["id"].as_str().unwrap()
    );
    let resp = call(
        &s.gw,
        &s.key,
        Method::POST,
        &path,
        Some(json!({"grace_period_seconds": 8 * 86_400})),
    )
    .await;
    assert_error(resp, 400, "invalid_request_error").await;
}
