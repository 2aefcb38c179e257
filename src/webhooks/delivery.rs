//! Deliveries: one event on its way to one endpoint, with its attempts and schedule.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

use crate::events::Event;
use crate::ids::{derived_id, new_id};

/// How long delivery records are kept for the deliveries listing: as long as events.
pub const DELIVERY_RETENTION_SECS: u64 = crate::events::RETENTION_SECS;

/// How many deliveries the listing keeps per endpoint.
pub const DELIVERIES_LISTED: usize = 1_000;

/// The body every delivery of `event` carries, byte for byte the same on every attempt,
/// retry, replay and `svcgate listen` forward: `{"id","type","created","workspace","data"}`.
pub fn body(event: &Event) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        id: &'a str,
        #[serde(rename = "type")]
        event_type: &'a str,
        created: u64,
        workspace: &'a str,
        data: &'a serde_json::Value,
    }
    serde_json::to_vec(&Body {
        id: &event.id,
        event_type: &event.event_type,
        created: event.created,
        workspace: &event.workspace,
        data: &event.data,
    })
    .expect("an event serializes")
}

/// One event for one endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// `dlv_…`
    pub id: String,
    /// The endpoint (`we_…`).
    pub endpoint: String,
    /// The endpoint's workspace.
    pub workspace: String,
    /// What is delivered; its id is the `Service-Event-Id` of every attempt. The deliveries of
    /// one event fanned out together share it, and hold one copy of its payload between them.
    pub event: Arc<Event>,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due (unix milliseconds), while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_ms: Option<u64>,
    /// The latest attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<Attempt>,
    /// Whether a replay asked for it.
    #[serde(default)]
    pub replay: bool,
    /// Unix milliseconds.
    pub created_ms: u64,
}

/// A delivery as it is listed: all of it but its event's payload, which no listing shows (a
/// listing of up to [`DELIVERIES_LISTED`] would otherwise read as many payloads of up to 256 KiB
/// into the gateway). Read from a stored delivery, the payload is skipped, not parsed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DeliverySummary {
    /// `dlv_…`
    pub id: String,
    /// The endpoint (`we_…`).
    pub endpoint: String,
    /// The event's id and type.
    pub event: EventHead,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due (unix milliseconds), while pending.
    #[serde(default)]
    pub next_attempt_ms: Option<u64>,
    /// The latest attempt.
    #[serde(default)]
    pub last_attempt: Option<Attempt>,
    /// Whether a replay asked for it.
    #[serde(default)]
    pub replay: bool,
    /// Unix milliseconds.
    pub created_ms: u64,
}

/// What a listing shows of a delivery's event.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EventHead {
    /// `evt_…`
    pub id: String,
    /// Its type.
    #[serde(rename = "type")]
    pub event_type: String,
}

impl From<&Delivery> for DeliverySummary {
    fn from(d: &Delivery) -> Self {
        Self {
            id: d.id.clone(),
            endpoint: d.endpoint.clone(),
            event: EventHead {
                id: d.event.id.clone(),
                event_type: d.event.event_type.clone(),
            },
            status: d.status,
            attempts: d.attempts,
            next_attempt_ms: d.next_attempt_ms,
            last_attempt: d.last_attempt.clone(),
            replay: d.replay,
            created_ms: d.created_ms,
        }
    }
}

/// A delivery as a store keeps it beside its event's own record: all of it but the event's
/// payload, which is kept once per event rather than once per delivery (an event for five
/// endpoints would otherwise be stored six times). It reads back as a [`Delivery`] whose
/// event's `data` is `null`, for the store to fill in from the event's record; the field is
/// left out, not written as `null`, so that a version before payloads were kept apart fails
/// to read it and leaves it to its lease, for a worker that can, rather than deliver it empty.
pub struct WithoutPayload<'a>(pub &'a Delivery);

impl Serialize for WithoutPayload<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Delivery's fields, in its order, but for the event's `data` (a test compares the two).
        #[derive(Serialize)]
        struct Head<'a> {
            id: &'a str,
            #[serde(rename = "type")]
            event_type: &'a str,
            created: u64,
            workspace: &'a str,
            environment: crate::keys::Environment,
            #[serde(skip_serializing_if = "Option::is_none")]
            traceparent: Option<&'a str>,
        }
        #[derive(Serialize)]
        struct Record<'a> {
            id: &'a str,
            endpoint: &'a str,
            workspace: &'a str,
            event: Head<'a>,
            status: DeliveryStatus,
            attempts: u32,
            #[serde(skip_serializing_if = "Option::is_none")]
            next_attempt_ms: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            last_attempt: Option<&'a Attempt>,
            replay: bool,
            created_ms: u64,
        }
        let d = self.0;
        Record {
            id: &d.id,
            endpoint: &d.endpoint,
            workspace: &d.workspace,
            event: Head {
                id: &d.event.id,
                event_type: &d.event.event_type,
                created: d.event.created,
                workspace: &d.event.workspace,
                environment: d.event.environment,
                traceparent: d.event.traceparent.as_deref(),
            },
            status: d.status,
            attempts: d.attempts,
            next_attempt_ms: d.next_attempt_ms,
            last_attempt: d.last_attempt.as_ref(),
            replay: d.replay,
            created_ms: d.created_ms,
        }
        .serialize(serializer)
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    /// Waiting for its first attempt or a retry.
    Pending,
    /// The endpoint answered 2xx in time.
    Succeeded,
    /// Every attempt failed; the endpoint was paused.
    Failed,
    /// Not attempted: the endpoint was paused or deleted. It can be replayed.
    Skipped,
}

impl DeliveryStatus {
    /// The name used in JSON and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }
}

/// What one attempt got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// Unix milliseconds when it started.
    pub at_ms: u64,
    /// The HTTP status, if the endpoint answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// Why it failed, if it did: never a secret, never the response body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long it took.
    pub duration_ms: u64,
    /// The URL it went to: a failure counts against the endpoint only while it still has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The start of the response body, at most [`RESPONSE_BODY_KEPT`] bytes (cut at a
    /// character boundary, invalid UTF-8 replaced), for the receiver's owner to see why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_body: Option<String>,
    /// How long the receiver asked to be left alone (`Retry-After` on a 429 or 503); not kept.
    #[serde(skip)]
    pub retry_after: Option<Duration>,
}

/// How much of a response body an attempt keeps.
pub const RESPONSE_BODY_KEPT: usize = 1024;

impl Delivery {
    /// A new delivery of `event` to `endpoint`, due at `now_ms`.
    pub fn new(event: &Event, workspace: &str, endpoint: &str, now_ms: u64, replay: bool) -> Self {
        let id = new_id("dlv");
        Self::pending(
            id,
            Arc::new(event.clone()),
            workspace,
            endpoint,
            now_ms,
            replay,
        )
    }

    /// The delivery of a logged `event` to `endpoint`, due at `now_ms`, sharing the event with
    /// its other deliveries. Its id comes from the event's and the endpoint's, so fanning the
    /// same event out again makes the same delivery, which the store queues once.
    pub fn fanned_out(event: &Arc<Event>, workspace: &str, endpoint: &str, now_ms: u64) -> Self {
        let id = derived_id("dlv", &[&event.id, endpoint]);
        Self::pending(id, Arc::clone(event), workspace, endpoint, now_ms, false)
    }

    fn pending(
        id: String,
        event: Arc<Event>,
        workspace: &str,
        endpoint: &str,
        now_ms: u64,
        replay: bool,
    ) -> Self {
        Self {
            id,
            endpoint: endpoint.to_string(),
            workspace: workspace.to_string(),
            event,
            status: DeliveryStatus::Pending,
            attempts: 0,
            next_attempt_ms: Some(now_ms),
            last_attempt: None,
            replay,
            created_ms: now_ms,
        }
    }

    /// Records a failed attempt to an endpoint that had failed `failures` attempts in a row
    /// before it: the next retry of `schedule` (counted from now), or, when every retry is
    /// spent, `Failed`. Returns whether the delivery has failed for good.
    ///
    /// The schedule is the endpoint's, not the delivery's: while an endpoint fails, only one
    /// of its deliveries is attempted (see [`super::store::AfterAttempt`]), so its retries
    /// keep to the schedule however long its queue.
    pub fn fail(&mut self, attempt: Attempt, schedule: &[Duration], failures: u32) -> bool {
        self.fail_after(attempt, schedule.get(failures as usize).copied())
    }

    /// Records a failed attempt that waits `wait` for the next one (see
    /// [`super::schedule::next_wait`]), or, with none, `Failed`. Returns whether the delivery
    /// has failed for good.
    pub fn fail_after(&mut self, attempt: Attempt, wait: Option<Duration>) -> bool {
        let now_ms = attempt.at_ms + attempt.duration_ms;
        self.attempts += 1;
        self.last_attempt = Some(attempt);
        match wait {
            Some(wait) => {
                self.next_attempt_ms = Some(now_ms + wait.as_millis() as u64);
                false
            }
            None => {
                self.status = DeliveryStatus::Failed;
                self.next_attempt_ms = None;
                true
            }
        }
    }

    /// Records a failed attempt that says nothing of the endpoint as it is now (its URL was
    /// changed while the attempt was on its way): due again at once, to the new URL.
    pub fn fail_to_a_changed_endpoint(&mut self, attempt: Attempt) {
        self.attempts += 1;
        self.status = DeliveryStatus::Pending;
        self.next_attempt_ms = Some(attempt.at_ms + attempt.duration_ms);
        self.last_attempt = Some(attempt);
    }

    /// Puts the delivery off, unattempted, until `due_ms` (its endpoint's rate limit).
    pub fn defer(&mut self, due_ms: u64) {
        self.status = DeliveryStatus::Pending;
        self.next_attempt_ms = Some(due_ms);
    }

    /// The URL the latest attempt went to, if it says.
    pub fn attempted_url(&self) -> Option<&str> {
        self.last_attempt.as_ref()?.url.as_deref()
    }

    /// Records a successful attempt.
    pub fn succeed(&mut self, attempt: Attempt) {
        self.attempts += 1;
        self.last_attempt = Some(attempt);
        self.status = DeliveryStatus::Succeeded;
        self.next_attempt_ms = None;
    }

    /// Gives the delivery up without an attempt: its endpoint is paused or gone.
    pub fn skip(&mut self, why: &str, now_ms: u64) {
        self.status = DeliveryStatus::Skipped;
        self.next_attempt_ms = None;
        self.last_attempt = Some(Attempt {
            at_ms: now_ms,
            status_code: None,
            error: Some(why.to_string()),
            duration_ms: 0,
            url: None,
            response_body: None,
            retry_after: None,
        });
    }

    /// Whether no more attempts will be made.
    pub fn is_final(&self) -> bool {
        self.status != DeliveryStatus::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Environment;

    fn attempt(at_ms: u64) -> Attempt {
        Attempt {
            at_ms,
            status_code: Some(500),
            error: None,
            duration_ms: 10,
            url: None,
            response_body: None,
            retry_after: None,
        }
    }

    #[test]
    fn a_stored_delivery_reads_as_its_summary_without_the_payload() {
        let data = serde_json::json!({"blob": "x".repeat(1000), "nested": [1, {"a": null}]});
        let event = Event::new("agent.run.failed", "ws_1", Environment::Live, data);
        let mut d = Delivery::new(&event, "ws_1", "we_1", 1_000, true);
        d.fail(attempt(1_000), &[Duration::from_secs(60)], 0);
        let stored = serde_json::to_string(&d).unwrap();
        let summary: DeliverySummary = serde_json::from_str(&stored).unwrap();
        assert_eq!(summary, DeliverySummary::from(&d));
        assert_eq!(summary.event.id, event.id);
        assert_eq!(summary.event.event_type, "agent.run.failed");
        assert_eq!((summary.attempts, summary.replay), (1, true));
        assert_eq!(summary.next_attempt_ms, Some(1_010 + 60_000));
        // A delivery not yet attempted leaves out what it has not got.
        let fresh = Delivery::new(&event, "ws_1", "we_1", 1_000, false);
        let summary: DeliverySummary =
            serde_json::from_str(&serde_json::to_string(&fresh).unwrap()).unwrap();
        assert_eq!(summary, DeliverySummary::from(&fresh));
    }

    #[test]
    fn a_delivery_kept_without_its_payload_reads_back_whole_but_for_it() {
        let data = serde_json::json!({"blob": "x".repeat(1000), "nested": [1, {"a": null}]});
        let event = Event::new("agent.run.failed", "ws_1", Environment::Test, data);
        let fresh = Delivery::new(&event, "ws_1", "we_1", 1_000, true);
        let mut attempted = Delivery::fanned_out(&Arc::new(event.clone()), "ws_1", "we_2", 2_000);
        let mut tried = attempt(2_000);
        (tried.error, tried.url) = (Some("timed out".into()), Some("https://x.test/".into()));
        attempted.fail(tried, &[Duration::from_secs(60)], 0);
        for d in [fresh, attempted] {
            let kept = serde_json::to_string(&WithoutPayload(&d)).unwrap();
            assert!(
                !kept.contains("xxxx") && !kept.contains("\"data\""),
                "{kept}"
            );
            // Every field but the payload, as the delivery itself writes them.
            let mut whole = serde_json::to_value(&d).unwrap();
            whole["event"].as_object_mut().unwrap().remove("data");
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&kept).unwrap(),
                whole
            );
            let mut read: Delivery = serde_json::from_str(&kept).unwrap();
            assert!(read.event.data.is_null());
            read.event = Arc::new(event.clone());
            assert_eq!(read, d);
            // A listing reads it as it reads the whole record.
            let summary: DeliverySummary = serde_json::from_str(&kept).unwrap();
            assert_eq!(summary, DeliverySummary::from(&d));
        }
    }

    #[test]
    fn the_deliveries_of_an_event_fanned_out_share_it_and_a_replay_has_its_own() {
        let event = Arc::new(Event::new(
            "agent.run.failed",
            "ws_1",
            Environment::Live,
            serde_json::json!({"blob": "x".repeat(1000)}),
        ));
        let a = Delivery::fanned_out(&event, "ws_1", "we_1", 1_000);
        let b = Delivery::fanned_out(&event, "ws_1", "we_2", 1_000);
        assert!(Arc::ptr_eq(&a.event, &event) && Arc::ptr_eq(&b.event, &event));
        assert_ne!(a.id, b.id);
        assert_eq!(a.id, Delivery::fanned_out(&event, "ws_1", "we_1", 5_000).id);
        let replay = Delivery::new(&event, "ws_1", "we_1", 1_000, true);
        assert_eq!(replay.event, event);
        assert!(!Arc::ptr_eq(&replay.event, &event));
        assert_ne!(replay.id, a.id);
    }

    #[test]
    fn failures_follow_the_schedule_from_the_previous_failure_then_fail_for_good() {
        let event = Event::new(
            "agent.run.failed",
            "ws_1",
            Environment::Live,
            "{}".parse().unwrap(),
        );
        let mut d = Delivery::new(&event, "ws_1", "we_1", 1_000, false);
        let schedule = [Duration::from_secs(60), Duration::from_secs(300)];
        assert!(!d.fail(attempt(1_000), &schedule, 0));
        assert_eq!(d.next_attempt_ms, Some(1_010 + 60_000));
        assert!(!d.fail(attempt(70_000), &schedule, 1));
        assert_eq!(d.next_attempt_ms, Some(70_010 + 300_000));
        assert!(d.fail(attempt(400_000), &schedule, 2));
        assert_eq!(
            (d.status, d.attempts, d.next_attempt_ms),
            (DeliveryStatus::Failed, 3, None)
        );
        assert!(d.is_final());
    }

    #[test]
    fn the_schedule_step_is_the_endpoints_not_the_deliverys() {
        let event = Event::new(
            "agent.run.failed",
            "ws_1",
            Environment::Live,
            "{}".parse().unwrap(),
        );
        let schedule = [Duration::from_secs(60), Duration::from_secs(300)];
        // A first attempt to an endpoint that has failed once already waits the second step.
        let mut d = Delivery::new(&event, "ws_1", "we_1", 1_000, false);
        assert!(!d.fail(attempt(1_000), &schedule, 1));
        assert_eq!((d.attempts, d.next_attempt_ms), (1, Some(1_010 + 300_000)));
        // One whose endpoint has failed every step fails for good on its first attempt.
        let mut d = Delivery::new(&event, "ws_1", "we_1", 1_000, false);
        assert!(d.fail(attempt(1_000), &schedule, 2));
        assert_eq!(d.status, DeliveryStatus::Failed);
    }
}
