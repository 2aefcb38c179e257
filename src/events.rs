//! Events: what the gateway, the key registry and the backends announce, for the webhook
//! worker to deliver. This module holds the event model; the store keeps the event log.

use serde::{Deserialize, Serialize};

use crate::ids::{new_id, unix_now};
use crate::keys::Environment;

/// The event types of the service interface.
pub const EVENT_TYPES: [&str; 8] = [
    "image.batch.completed",
    "video.render.completed",
    "voice.render.completed",
    "agent.run.awaiting_approval",
    "agent.run.completed",
    "agent.run.failed",
    "billing.credits.low",
    "key.auto_revoked",
];

/// How long events are kept (and can be replayed): 30 days.
pub const RETENTION_SECS: u64 = 30 * 86_400;

/// Whether `name` is one of [`EVENT_TYPES`].
pub fn is_event_type(name: &str) -> bool {
    EVENT_TYPES.contains(&name)
}

/// A realistic payload for each event type, for `svcgate events trigger` and for testing an
/// endpoint end to end.
pub fn sample_data(event_type: &str) -> Option<serde_json::Value> {
    use serde_json::json;
    let id = |prefix: &str| new_id(prefix);
    Some(match event_type {
        "image.batch.completed" => json!({
            "batch_id": id("batch"), "status": "completed", "count": 2,
            "images": [
                {"url": "https://cdn.example.com/signed/img_1.png?sig=…&expires=…"},
                {"url": "https://cdn.example.com/signed/img_2.png?sig=…&expires=…"}
            ]
        }),
        "video.render.completed" => json!({
            "render_id": id("video"), "status": "succeeded", "duration_seconds": 12.5,
            "url": "https://cdn.example.com/signed/video.mp4?sig=…&expires=…"
        }),
        "voice.render.completed" => json!({
            "render_id": id("voice"), "status": "succeeded", "duration_seconds": 642.0,
            "url": "https://cdn.example.com/signed/speech.mp3?sig=…&expires=…"
        }),
        "agent.run.awaiting_approval" => json!({
            "run_id": id("run"), "step": 4,
            "action": {"tool": "send_email", "summary": "Email the quarterly report to finance"}
        }),
        "agent.run.completed" => json!({
            "run_id": id("run"), "steps": 7, "result": {"verified": true, "output": "Report sent."}
        }),
        "agent.run.failed" => json!({
            "run_id": id("run"), "steps": 25, "reason": "max_steps_exhausted", "max_steps": 25
        }),
        "billing.credits.low" => json!({
            "workspace": "ws_…", "remaining": 120.5, "threshold": 500.0, "month": "2026-11"
        }),
        "key.auto_revoked" => json!({
            "key_id": id("key"), "prefix": "svc_live_", "last4": "AbC1",
            "url": "https://github.com/example/repo/blob/main/config.py", "source": "content"
        }),
        _ => return None,
    })
}

/// One event, as it is logged and (later) delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `evt_…`; the same on every delivery, retry and replay.
    pub id: String,
    /// One of [`EVENT_TYPES`].
    #[serde(rename = "type")]
    pub event_type: String,
    /// Unix seconds.
    pub created: u64,
    /// The workspace it belongs to.
    pub workspace: String,
    /// `live` or `test`: test-mode events go only to test-mode endpoints.
    pub environment: Environment,
    /// The payload.
    pub data: serde_json::Value,
}

impl Event {
    /// A new event, created now.
    pub fn new(
        event_type: &str,
        workspace: &str,
        environment: Environment,
        data: serde_json::Value,
    ) -> Self {
        Self {
            id: new_id("evt"),
            event_type: event_type.to_string(),
            created: unix_now(),
            workspace: workspace.to_string(),
            environment,
            data,
        }
    }
}
