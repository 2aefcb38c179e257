//! Events: what the gateway, the key registry and the backends announce, for the webhook
//! worker to deliver. This module holds the event model; the store keeps the event log.

use serde::{Deserialize, Serialize};

use crate::ids::{new_id, unix_now};
use crate::shared::environment::Environment;

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
/// endpoint end to end, in `workspace` (which some payloads name).
pub fn sample_data(event_type: &str, workspace: &str) -> Option<serde_json::Value> {
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
            "workspace": workspace, "remaining": 120.5, "threshold": 500.0,
            "month": crate::shared::month::month_of(crate::ids::unix_now())
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
    /// The payload: a JSON object; `null` in a delivery read from a record that keeps it
    /// apart ([`crate::webhooks::delivery::WithoutPayload`]) until the store fills it in.
    #[serde(default)]
    pub data: serde_json::Value,
    /// The W3C `traceparent` of the request that caused the event, when it was traced: its
    /// deliveries continue that trace. Never part of what is delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
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
            traceparent: None,
        }
    }

    /// The event, continuing the trace of `traceparent` if that is a valid W3C
    /// `traceparent` (anything else is dropped: it is a hint, not part of the event).
    pub fn caused_by(mut self, traceparent: Option<&str>) -> Self {
        self.traceparent = traceparent
            .filter(|t| crate::telemetry::is_traceparent(t))
            .map(str::to_owned);
        self
    }
}

/// The most an event's `data` may take, as JSON.
pub const MAX_EVENT_DATA_BYTES: usize = 256 * 1024;

/// Why `data` of `len` bytes is refused, if it is.
pub fn data_too_large(len: usize) -> Option<String> {
    (len > MAX_EVENT_DATA_BYTES).then(|| {
        format!(
            "'data' is {len} bytes of JSON; an event carries at most {} KiB",
            MAX_EVENT_DATA_BYTES / 1024
        )
    })
}

/// An event as read from the event log, with its position there.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedEvent {
    /// The log position (a Redis stream entry id such as `1764115200000-0`).
    pub position: String,
    /// The event.
    pub event: Event,
}

/// A log position as numbers, to compare: a Redis stream entry id `<ms>-<seq>` as `(ms, seq)`,
/// the in-memory log's sequence number `n` as `(n, 0)`; `None` if it is neither.
pub fn log_position(position: &str) -> Option<(u64, u64)> {
    let (first, second) = position.split_once('-').unwrap_or((position, "0"));
    Some((first.parse().ok()?, second.parse().ok()?))
}

impl Event {
    /// Reads an event from the fields of an event-log entry at `position`.
    ///
    /// Backends may add entries straight to the log, so only `type`, `workspace` and `data` (a
    /// JSON object) are required. Without an `id`, one is derived from the position, so it is
    /// the same on every delivery; without `created`, the time of the position is used;
    /// without `environment`, `live`. A given `id` is `evt_` and up to 60 letters, digits, `_`
    /// or `-`: it goes out in the `Service-Event-Id` header, so a byte a header cannot carry
    /// would fail every attempt and pause the endpoint for the producer's mistake.
    pub fn from_log_entry<'a>(
        position: &str,
        field: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<Self, String> {
        let event_type = field("type").ok_or("no 'type' field")?;
        if !is_event_type(event_type) {
            return Err(format!("unknown event type '{event_type}'"));
        }
        let workspace = field("workspace")
            .filter(|w| !w.is_empty())
            .ok_or("no 'workspace' field")?;
        let raw = field("data").ok_or("no 'data' field")?;
        if let Some(why) = data_too_large(raw.len()) {
            return Err(why);
        }
        let data: serde_json::Value =
            serde_json::from_str(raw).map_err(|e| format!("'data' is not JSON: {e}"))?;
        if !data.is_object() {
            return Err("'data' must be a JSON object".into());
        }
        let environment = match field("environment") {
            None => Environment::Live,
            Some("live") => Environment::Live,
            Some("test") => Environment::Test,
            Some(e) => return Err(format!("unknown environment '{e}'")),
        };
        let position_ms = position
            .split('-')
            .next()
            .and_then(|ms| ms.parse::<u64>().ok());
        let created = match field("created") {
            Some(c) => c
                .parse()
                .map_err(|_| format!("'created' is not a unix time: {c}"))?,
            None => position_ms.map_or_else(unix_now, |ms| ms / 1000),
        };
        // Seconds, not milliseconds: a time far ahead would sort after every event to come.
        let latest = position_ms.map_or(0, |ms| ms / 1000).max(unix_now()) + 86_400;
        if created > latest {
            return Err(format!(
                "'created' is more than a day ahead (unix seconds expected): {created}"
            ));
        }
        let id = match field("id") {
            Some(id) if is_event_id(id) => id.to_string(),
            Some(id) => {
                return Err(format!(
                    "'id' {id:?} is not evt_ and 1 to 60 letters, digits, _ or -"
                ))
            }
            None => format!("evt_{}", position.replace('-', "x")),
        };
        Ok(Self {
            id,
            event_type: event_type.to_string(),
            created,
            workspace: workspace.to_string(),
            environment,
            data,
            traceparent: None,
        }
        .caused_by(field("traceparent")))
    }
}

/// `evt_` and 1 to 60 letters, digits, `_` or `-`.
pub fn is_event_id(id: &str) -> bool {
    id.strip_prefix("evt_").is_some_and(|rest| {
        (1..=60).contains(&rest.len())
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(fields: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |name| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    #[test]
    fn log_entries_from_backends_need_only_type_workspace_and_data() {
        let e = Event::from_log_entry(
            "1764115200123-4",
            entry(&[
                ("type", "agent.run.completed"),
                ("workspace", "ws_1"),
                ("data", r#"{"run_id":"run_1"}"#),
            ]),
        )
        .unwrap();
        assert_eq!(e.id, "evt_1764115200123x4");
        assert_eq!(e.created, 1_764_115_200);
        assert_eq!(e.environment, Environment::Live);
        assert_eq!(e.data["run_id"], "run_1");
        let full = Event::new(
            "key.auto_revoked",
            "ws_2",
            Environment::Test,
            serde_json::json!({}),
        );
        let created = full.created.to_string();
        let fields = [
            ("id", full.id.as_str()),
            ("type", "key.auto_revoked"),
            ("created", created.as_str()),
            ("workspace", "ws_2"),
            ("environment", "test"),
            ("data", "{}"),
        ];
        assert_eq!(Event::from_log_entry("1-0", entry(&fields)).unwrap(), full);
    }

    #[test]
    fn malformed_log_entries_are_refused() {
        let base = [
            ("type", "agent.run.failed"),
            ("workspace", "ws_1"),
            ("data", "{}"),
        ];
        assert!(Event::from_log_entry("1-0", entry(&base)).is_ok());
        let long_id = format!("evt_{}", "a".repeat(61));
        // Each case changes one field of `base` (`None`: leaves it out); the error names it.
        let too_large = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_EVENT_DATA_BYTES));
        let cases: [(&str, Option<&str>); 18] = [
            ("type", None),
            ("type", Some("nope")),
            ("workspace", None),
            ("workspace", Some("")),
            ("data", None),
            ("data", Some("[1]")),
            ("data", Some("{")),
            ("data", Some(&too_large)),
            ("id", Some("x")),
            ("id", Some("evt_")),
            ("id", Some("evt_a\nb")),
            ("id", Some("evt_a b")),
            ("id", Some("evt_caf\u{e9}")),
            ("id", Some(&long_id)),
            ("environment", Some("prod")),
            ("created", Some("soon")),
            ("created", Some("-1")),
            ("created", Some("1764115200123")),
        ];
        for (name, value) in cases {
            let mut fields: Vec<(&str, &str)> =
                base.iter().filter(|(k, _)| *k != name).copied().collect();
            fields.extend(value.map(|v| (name, v)));
            let err = Event::from_log_entry("1-0", entry(&fields)).unwrap_err();
            let shown = if name == "type" && value.is_some() {
                "event type"
            } else {
                name
            };
            assert!(err.contains(shown), "{name}={value:?}: {err}");
        }
    }

    #[test]
    fn a_given_event_id_is_kept_when_it_can_go_in_a_header() {
        let id = format!("evt_Ab-9_{}", "z".repeat(54));
        let fields = [
            ("id", id.as_str()),
            ("type", "agent.run.failed"),
            ("workspace", "ws_1"),
            ("data", "{}"),
        ];
        let event = Event::from_log_entry("1-0", entry(&fields)).unwrap();
        assert_eq!(event.id, id);
        assert!(http::HeaderValue::from_str(&event.id).is_ok());
        assert!(http::HeaderValue::from_str(&new_id("evt")).is_ok() && is_event_id(&new_id("evt")));
    }
}
