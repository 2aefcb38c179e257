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
