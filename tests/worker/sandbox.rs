//! The sandbox like production: a test key's simulated async jobs finish after
//! `[simulator] job_seconds` and their events reach the workspace's test-mode endpoints.

use super::*;

const JOB_SCOPES: &[&str] = &[
    "webhooks:read",
    "webhooks:write",
    "images:create",
    "videos:create",
    "voice:create",
    "agents:run",
];

/// A gateway on Redis with a worker; simulated jobs take the default `job_seconds`.
async fn sandbox() -> Setup {
    setup(&[1], 5, false).await
}

async fn post(s: &Setup, key: &str, path: &str, body: Value) -> Value {
    let resp = call(&s.gw, key, Method::POST, path, Some(body)).await;
    assert_eq!(resp.status(), 200, "{path}");
    assert_eq!(resp.headers()["service-credits"], "0");
    resp.json().await.unwrap()
}

async fn get(s: &Setup, key: &str, path: &str) -> reqwest::Response {
    call(&s.gw, key, Method::GET, path, None).await
}

#[tokio::test]
async fn a_test_key_s_image_batch_delivers_image_batch_completed_with_urls_to_test_endpoints() {
    let s = sandbox().await;
    let receiver = Receiver::start().await;
    let (_, test_key) = s.gw.create_key_in(&s.ws, "test", JOB_SCOPES).await;
    let (_, secret) = endpoint(&s.gw, &test_key, &receiver.url("/test"), &["image.batch.*"]).await;
    // The live-mode endpoint of the same workspace hears nothing of the sandbox.
    endpoint(&s.gw, &s.key, &receiver.url("/live"), &["image.batch.*"]).await;

    let batch = post(
        &s,
        &test_key,
        "/v1/images/batches",
        json!({"prompt": "a cat", "n": 3}),
    )
    .await;
    assert_eq!(batch["status"], "queued");
    assert_eq!(batch["simulated"], true);
    let id = batch["id"].as_str().unwrap().to_string();

    let got = received(&receiver, "/test", 1, Duration::from_secs(15)).await;
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["type"], "image.batch.completed");
    assert_eq!(body["workspace"], s.ws.as_str());
    assert_eq!(body["data"]["id"], id.as_str());
    assert_eq!(body["data"]["status"], "completed");
    let images = body["data"]["images"].as_array().unwrap();
    assert_eq!(images.len(), 3);
    for image in images {
        let url = image["url"].as_str().unwrap();
        assert!(
            url.starts_with("https://") && url.contains("signature="),
            "{url}"
        );
    }
    assert!(svcgate::webhooks::verify(
        &secret,
        &got[0].headers,
        &got[0].body,
        svcgate::ids::unix_now()
    )
    .is_ok());

    // Polled from the route table, from the key that made it.
    let polled: Value = get(&s, &test_key, &format!("/v1/images/batches/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(polled["status"], "completed");
    assert_eq!(polled["images"], body["data"]["images"]);
    // Another workspace's key does not see it.
    let other_ws = s.gw.create_workspace().await;
    let (_, other) = s.gw.create_key_in(&other_ws, "test", JOB_SCOPES).await;
    assert_error(
        get(&s, &other, &format!("/v1/images/batches/{id}")).await,
        404,
        "not_found",
    )
    .await;

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        receiver.received("/live").is_empty(),
        "test events stay in the test environment"
    );
}

#[tokio::test]
async fn an_agent_run_waits_for_approval_then_completes_and_videos_fail_when_asked() {
    let s = sandbox().await;
    let receiver = Receiver::start().await;
    let (_, key) = s.gw.create_key_in(&s.ws, "test", JOB_SCOPES).await;
    endpoint(&s.gw, &key, &receiver.url("/agents"), &["agent.run.*"]).await;
    endpoint(
        &s.gw,
        &key,
        &receiver.url("/media"),
        &["video.render.*", "voice.render.*"],
    )
    .await;

    let run = post(
        &s,
        &key,
        "/v1/agents/runs",
        json!({"input": "send the e-mail"}),
    )
    .await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let starved = post(&s, &key, "/v1/agents/runs", json!({"max_steps": 1})).await;
    let got = received(&receiver, "/agents", 2, Duration::from_secs(15)).await;
    let types = |got: &[Received]| -> Vec<(String, String)> {
        let mut t: Vec<(String, String)> = got
            .iter()
            .map(|r| {
                let b: Value = serde_json::from_slice(&r.body).unwrap();
                (
                    b["data"]["id"].as_str().unwrap().to_string(),
                    b["type"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        t.sort();
        t
    };
    let mut expected = vec![
        (run_id.clone(), "agent.run.awaiting_approval".to_string()),
        (
            starved["id"].as_str().unwrap().to_string(),
            "agent.run.failed".to_string(),
        ),
    ];
    expected.sort();
    assert_eq!(types(&got), expected);

    let approved = post(
        &s,
        &key,
        &format!("/v1/agents/runs/{run_id}/approve"),
        json!({}),
    )
    .await;
    assert_eq!(approved["status"], "running");
    let again = call(
        &s.gw,
        &key,
        Method::POST,
        &format!("/v1/agents/runs/{run_id}/approve"),
        Some(json!({})),
    )
    .await;
    assert_error(again, 400, "invalid_request_error").await;
    let got = received(&receiver, "/agents", 3, Duration::from_secs(15)).await;
    assert!(types(&got).contains(&(run_id.clone(), "agent.run.completed".to_string())));
    let polled: Value = get(&s, &key, &format!("/v1/agents/runs/{run_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(polled["status"], "completed");

    let failed = post(
        &s,
        &key,
        "/v1/videos",
        json!({"prompt": "a storm, simulate:failure"}),
    )
    .await;
    let voice = post(&s, &key, "/v1/audio/speech", json!({"input": "hello"})).await;
    let got = received(&receiver, "/media", 2, Duration::from_secs(15)).await;
    for r in &got {
        let b: Value = serde_json::from_slice(&r.body).unwrap();
        if b["data"]["id"] == failed["id"] {
            assert_eq!(b["type"], "video.render.completed");
            assert_eq!(b["data"]["status"], "failed");
            assert!(b["data"]["failure_reason"].as_str().is_some());
        } else {
            assert_eq!(b["data"]["id"], voice["id"]);
            assert_eq!(b["type"], "voice.render.completed");
            assert!(b["data"]["audio_url"]
                .as_str()
                .unwrap()
                .starts_with("https://"));
        }
    }
}
