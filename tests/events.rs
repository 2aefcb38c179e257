//! Events entering the log: from backends through the admin API, and from the CLI.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

async fn logged(ns: &str) -> Vec<redis::streams::StreamId> {
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("{{{ns}}}:events"))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    reply.ids
}

#[tokio::test]
async fn a_backend_event_enters_the_log() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/events")
        .json(
            &json!({"workspace": ws, "type": "agent.run.awaiting_approval",
                      "data": {"run_id": "run_1", "step": 3}, "environment": "test"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(id.starts_with("evt_"));
    let entries = logged(&ns.name).await;
    assert_eq!(entries.len(), 1);
    let field = |name: &str| entries[0].get::<String>(name).unwrap();
    assert_eq!(field("id"), id);
    assert_eq!(field("type"), "agent.run.awaiting_approval");
    assert_eq!(field("workspace"), ws);
    assert_eq!(field("environment"), "test");
    let data: Value = serde_json::from_str(&field("data")).unwrap();
    assert_eq!(data, json!({"run_id": "run_1", "step": 3}));

    for (body, status) in [
        (json!({"workspace": ws, "type": "agent.run.exploded"}), 400),
        (json!({"workspace": ws, "type": "agent.run.*"}), 400),
        (
            json!({"workspace": ws, "type": "agent.run.completed", "data": [1]}),
            400,
        ),
        (
            json!({"workspace": ws, "type": "agent.run.completed", "environment": "scoped"}),
            400,
        ),
        (json!({"type": "agent.run.completed"}), 400),
        (
            json!({"workspace": ws, "type": "agent.run.completed", "id": "run_1"}),
            400,
        ),
        (
            json!({"workspace": ws, "type": "agent.run.completed", "id": "evt_a b"}),
            400,
        ),
        (
            json!({"workspace": "ws_none", "type": "agent.run.completed"}),
            404,
        ),
        // Each delivery carries a copy: data is held to 256 KiB.
        (
            json!({"workspace": ws, "type": "agent.run.completed", "data": {"blob": "x".repeat(256 * 1024)}}),
            400,
        ),
    ] {
        let resp = gw
            .admin_request(Method::POST, "/admin/v1/events")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{body}");
    }
    assert_eq!(
        logged(&ns.name).await.len(),
        1,
        "refused events are not logged"
    );
}

#[tokio::test]
async fn events_trigger_publishes_a_sample_of_every_type() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    for event_type in svcgate::events::EVENT_TYPES {
        let out = svcgate_command()
            .args([
                "events",
                "--admin-url",
                &gw.admin,
                "--admin-token",
                ADMIN_TOKEN,
            ])
            .args(["trigger", event_type, "--workspace", &ws])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(answer["id"].as_str().unwrap().starts_with("evt_"));
    }
    // A sample that names its workspace names the one it is sent for.
    let credits_low = logged(&ns.name)
        .await
        .into_iter()
        .find(|e| e.get::<String>("type").as_deref() == Some("billing.credits.low"))
        .unwrap();
    let data: Value = serde_json::from_str(&credits_low.get::<String>("data").unwrap()).unwrap();
    assert_eq!(data["workspace"], ws.as_str());
    let out = svcgate_command()
        .args([
            "events",
            "--admin-url",
            &gw.admin,
            "--admin-token",
            ADMIN_TOKEN,
        ])
        .args(["trigger", "agent.run.completed", "--workspace", &ws])
        .args([
            "--data",
            r#"{"run_id": "run_custom"}"#,
            "--environment",
            "test",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = svcgate_command()
        .args([
            "events",
            "--admin-url",
            &gw.admin,
            "--admin-token",
            ADMIN_TOKEN,
        ])
        .args(["trigger", "no.such.event", "--workspace", &ws])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown event type"));

    let entries = logged(&ns.name).await;
    assert_eq!(entries.len(), svcgate::events::EVENT_TYPES.len() + 1);
    for (entry, event_type) in entries.iter().zip(svcgate::events::EVENT_TYPES) {
        assert_eq!(entry.get::<String>("type").unwrap(), event_type);
        let data: Value = serde_json::from_str(&entry.get::<String>("data").unwrap()).unwrap();
        assert!(
            data.as_object().is_some_and(|o| !o.is_empty()),
            "{event_type}: {data}"
        );
    }
    let last = entries.last().unwrap();
    assert_eq!(last.get::<String>("environment").unwrap(), "test");
    assert!(last.get::<String>("data").unwrap().contains("run_custom"));
}
