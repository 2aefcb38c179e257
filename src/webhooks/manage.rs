//! What the two webhook APIs do with an endpoint once they know whose it is: show it, list its
//! deliveries, resume it, replay its events. The customers' API on the gateway
//! (`/v1/webhooks…`, scoped to the caller's workspace and environment) and the operators' admin
//! API (`/admin/v1/workspaces/{ws}/webhooks…`, any environment) share these, so a replay from
//! the dashboard is the replay a customer gets.

use serde::{Deserialize, Serialize};

use super::delivery::{Delivery, DeliveryStatus, DeliverySummary, DELIVERIES_LISTED};
use super::endpoint::{
    check_filter, check_url, new_secret_for, Endpoint, EndpointStatus, WebhookFormat,
    MAX_ENDPOINTS_PER_WORKSPACE,
};
use super::store::DeliveryQueue;
use crate::error::ApiError;
use crate::events::{Event, RETENTION_SECS};
use crate::ids::{new_id, unix_millis, unix_now};
use crate::keys::Environment;

/// Most events one replay queues.
pub const REPLAY_MAX: usize = 10_000;

/// Events a replay reads, and queues deliveries of, at a time: what it holds at once (an
/// event's payload may be 256 KiB).
pub const REPLAY_STEP: usize = 10;

/// Deliveries an endpoint may have queued for a replay to be taken: two replays' worth.
pub const REPLAY_QUEUE_MAX: u64 = 2 * REPLAY_MAX as u64;
/// Deliveries listed by default.
pub const LISTED_DEFAULT: usize = 50;

/// An endpoint as the APIs show it; the secret only in the answer that created it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointView<'a> {
    id: &'a str,
    url: &'a str,
    events: &'a [String],
    status: EndpointStatus,
    environment: Environment,
    created_at: u64,
    format: WebhookFormat,
    /// Most deliveries per second, across workers; absent: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limit_per_second: Option<u32>,
    /// While a rotated-out secret still signs beside the current one: until when (unix
    /// seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_secret_expires_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<&'a str>,
    /// While a failure holds it back: its failures in a row and when it is tried next.
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: Option<RetryView>,
}

/// An endpoint's retry, as the APIs show it.
#[derive(Serialize, utoipa::ToSchema)]
struct RetryView {
    failures: u32,
    next_attempt_at: u64,
}

impl<'a> EndpointView<'a> {
    /// The endpoint without its secret.
    pub fn of(e: &'a Endpoint) -> Self {
        Self {
            id: &e.id,
            url: &e.url,
            events: &e.events,
            status: e.status,
            environment: e.environment,
            created_at: e.created_at,
            format: e.format,
            rate_limit_per_second: e.rate_limit_per_second,
            previous_secret_expires_at: e.previous_secret_until.filter(|until| *until > unix_now()),
            secret: None,
            retry: None,
        }
    }

    /// The endpoint with its secret: only in the answers that create it and rotate it.
    pub fn with_secret(e: &'a Endpoint) -> Self {
        Self {
            secret: Some(&e.secret),
            ..Self::of(e)
        }
    }
}

/// A delivery as the APIs show it: the event's id and type, not its payload.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DeliveryView<'a> {
    id: &'a str,
    event_id: &'a str,
    event_type: &'a str,
    status: &'static str,
    attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_attempt_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_attempt: Option<AttemptView<'a>>,
    replay: bool,
    created_at: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
struct AttemptView<'a> {
    at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    duration_ms: u64,
    /// The first KiB of the response body.
    #[serde(skip_serializing_if = "Option::is_none")]
    response_body: Option<&'a str>,
}

impl<'a> DeliveryView<'a> {
    fn of(d: &'a DeliverySummary) -> Self {
        Self {
            id: &d.id,
            event_id: &d.event.id,
            event_type: &d.event.event_type,
            status: d.status.as_str(),
            attempts: d.attempts,
            next_attempt_at: d.next_attempt_ms.map(|ms| ms.div_ceil(1000)),
            last_attempt: d.last_attempt.as_ref().map(|a| AttemptView {
                at: a.at_ms / 1000,
                status_code: a.status_code,
                error: a.error.as_deref(),
                duration_ms: a.duration_ms,
                response_body: a.response_body.as_deref(),
            }),
            replay: d.replay,
            created_at: d.created_ms / 1000,
        }
    }
}

/// The body of a replay: one event, or every event since a time.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayInput {
    #[serde(default)]
    event_id: Option<String>,
    #[serde(default)]
    since: Option<u64>,
    /// With `since`: continue past this event (the `next` of a truncated replay). Refused
    /// (400) once `since` is older than the 30-day window.
    #[serde(default)]
    after: Option<String>,
}

/// Most event filters on one endpoint.
pub const MAX_FILTERS: usize = 50;

/// Checks an endpoint's event filters: 1 to [`MAX_FILTERS`] known names or wildcards.
pub fn check_events(events: &[String]) -> Result<(), ApiError> {
    if events.is_empty() || events.len() > MAX_FILTERS {
        return Err(ApiError::invalid(format!(
            "events must name 1-{MAX_FILTERS} event names or wildcards"
        )));
    }
    events
        .iter()
        .try_for_each(|f| check_filter(f))
        .map_err(ApiError::invalid)
}

/// What a new endpoint is asked to be.
pub struct NewEndpoint<'a> {
    /// Where deliveries go (checked by [`create`]).
    pub url: &'a str,
    /// Event filters (checked by [`create`]).
    pub events: Vec<String>,
    /// How deliveries are signed.
    pub format: WebhookFormat,
    /// Deliveries per second at most, across workers; `None`: no limit.
    pub rate_limit_per_second: Option<u32>,
}

/// Creates an endpoint of `workspace` in `environment` for `url` and `events` (checked), with
/// a new secret; the endpoint, whose secret is shown this once.
pub async fn create(
    store: &dyn DeliveryQueue,
    workspace: &str,
    environment: Environment,
    asked: NewEndpoint<'_>,
    allow_insecure: bool,
) -> Result<Endpoint, ApiError> {
    let NewEndpoint {
        url,
        events,
        format,
        rate_limit_per_second,
    } = asked;
    let url = check_url(url, allow_insecure)
        .await
        .map_err(ApiError::invalid)?;
    check_events(&events)?;
    let endpoint = Endpoint {
        id: new_id("we"),
        workspace: workspace.to_string(),
        environment,
        url: url.to_string(),
        events,
        secret: new_secret_for(format),
        status: EndpointStatus::Active,
        created_at: unix_now(),
        format,
        previous_secret: None,
        previous_secret_until: None,
        rate_limit_per_second,
    };
    store
        .create_endpoint(&endpoint, MAX_ENDPOINTS_PER_WORKSPACE)
        .await?;
    Ok(endpoint)
}

/// The endpoint `id` of `workspace`, if it is in `environment` (any, when `None`).
pub async fn find(
    store: &dyn DeliveryQueue,
    workspace: &str,
    environment: Option<Environment>,
    id: &str,
) -> Result<Endpoint, ApiError> {
    store
        .endpoints(workspace)
        .await?
        .into_iter()
        .find(|e| e.id == id && environment.is_none_or(|env| e.environment == env))
        .ok_or_else(|| not_found(id))
}

/// The 404 for an endpoint id the caller sent (cut short: ids are ours and short).
pub fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no webhook endpoint '{}'", truncate(id)))
}

/// One endpoint, without its secret, with its retry while a failure holds it back.
pub async fn show(
    store: &dyn DeliveryQueue,
    endpoint: &Endpoint,
) -> Result<serde_json::Value, ApiError> {
    let retry = match endpoint.status {
        EndpointStatus::Active => store.endpoint_retry(&endpoint.id).await?,
        EndpointStatus::Paused | EndpointStatus::Disabled => None,
    };
    let view = EndpointView {
        retry: retry.map(|r| RetryView {
            failures: r.failures,
            next_attempt_at: r.next_attempt_ms.div_ceil(1000),
        }),
        ..EndpointView::of(endpoint)
    };
    Ok(serde_json::to_value(view).expect("a view serializes"))
}

/// `{"data": [endpoints]}`, without secrets.
pub fn list_body<'a>(endpoints: impl Iterator<Item = &'a Endpoint>) -> serde_json::Value {
    let views: Vec<EndpointView> = endpoints.map(EndpointView::of).collect();
    serde_json::json!({ "data": views })
}

/// Makes a paused or disabled endpoint active again, and one held back by a failure tries again now (the
/// customer says the receiver is fixed); deliveries that failed for good are not resent (that
/// is a replay).
pub async fn resume(store: &dyn DeliveryQueue, endpoint: &Endpoint) -> Result<Endpoint, ApiError> {
    store
        .resume_endpoint(&endpoint.workspace, &endpoint.id)
        .await?
        .ok_or_else(|| not_found(&endpoint.id))
}

/// `{"data": [deliveries]}`, newest first, at most `limit` (see [`deliveries_limit`]).
pub async fn deliveries(
    store: &dyn DeliveryQueue,
    endpoint: &Endpoint,
    limit: usize,
) -> Result<serde_json::Value, ApiError> {
    let deliveries = store.deliveries(&endpoint.id, limit).await?;
    // While a failure holds the endpoint back, nothing pending goes before the hold ends.
    let held_until = store
        .endpoint_retry(&endpoint.id)
        .await?
        .filter(|_| endpoint.status == EndpointStatus::Active)
        .map(|r| r.next_attempt_ms.div_ceil(1000));
    let views: Vec<DeliveryView> = deliveries
        .iter()
        .map(|d| {
            let mut view = DeliveryView::of(d);
            if let (Some(next), Some(held)) = (&mut view.next_attempt_at, held_until) {
                *next = (*next).max(held);
            }
            view
        })
        .collect();
    Ok(serde_json::json!({ "data": views }))
}

/// `limit` of a deliveries listing: 1 to the number kept, [`LISTED_DEFAULT`] if not given.
pub fn deliveries_limit(limit: Option<&str>) -> Result<usize, ApiError> {
    let Some(value) = limit else {
        return Ok(LISTED_DEFAULT);
    };
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=DELIVERIES_LISTED).contains(n))
        .ok_or_else(|| ApiError::invalid(format!("limit must be 1-{DELIVERIES_LISTED}")))
}

/// Queues the replay asked for, and answers what was queued: the new deliveries' ids, and
/// whether [`REPLAY_MAX`] events cut the list short, with the body that replays the rest
/// (`next`). A paused endpoint must be resumed first.
///
/// A replay since a time goes [`REPLAY_STEP`] events at a time, each step queued before the
/// next is read. If the store fails after a step was queued, the answer is what was queued so
/// far, cut short, with the `next` that goes on from there (a step whose answer was lost
/// after the store took it is replayed again by that `next`: its events arrive twice, under
/// their ids).
pub async fn replay(
    store: &dyn DeliveryQueue,
    endpoint: &Endpoint,
    input: ReplayInput,
) -> Result<serde_json::Value, ApiError> {
    require_active(endpoint, "replaying")?;
    // A replay queues up to REPLAY_MAX deliveries at once: not on top of a queue that long
    // already (the same replay sent again and again would fill Redis, and aim it all at the
    // endpoint's URL). A cut-short replay's `next` still goes at once.
    let well_formed = matches!(
        (&input.event_id, &input.since, &input.after),
        (Some(_), None, None) | (None, Some(_), _)
    );
    let queued = match well_formed {
        true => store.queued_deliveries(&endpoint.id).await?,
        false => 0,
    };
    if queued >= REPLAY_QUEUE_MAX {
        return Err(ApiError::RateLimited {
            message: format!(
                "the endpoint has {queued} deliveries queued; replay once they have gone out"
            )
            .into(),
            retry_after_secs: 60,
        });
    }
    let now = unix_now();
    let oldest = now.saturating_sub(RETENTION_SECS);
    let (ids, next) = match (input.event_id, input.since, input.after) {
        (Some(event_id), None, None) => {
            let event = store
                .event(&endpoint.workspace, endpoint.environment, &event_id)
                .await?
                .filter(|e| {
                    e.workspace == endpoint.workspace
                        && e.environment == endpoint.environment
                        && e.created >= oldest
                })
                .ok_or_else(|| {
                    ApiError::not_found(format!(
                        "no event '{}' in the last 30 days",
                        truncate(&event_id)
                    ))
                })?;
            if !endpoint.wants(&event.event_type) {
                return Err(ApiError::invalid(format!(
                    "the endpoint does not subscribe to {}",
                    event.event_type
                )));
            }
            (queue_replays(store, endpoint, &[event]).await?, None)
        }
        (None, Some(since), after) => {
            // A continuation (`after`, from a `next`) may start past the window's edge, which
            // has moved on since (it starts at the edge), or at an event stamped ahead of now.
            if after.is_none() && (since < oldest || since > now) {
                return Err(ApiError::invalid(
                    "since must be a unix time within the last 30 days",
                ));
            }
            if after
                .as_deref()
                .is_some_and(|a| !crate::events::is_event_id(a))
            {
                return Err(ApiError::invalid("after must be an event id"));
            }
            // A continuation still names a time: one from before the window would replay
            // events the log no longer holds (or hold on to a `next` for ever).
            if after.is_some() && since < oldest {
                return Err(ApiError::invalid(
                    "since is older than 30 days: events that old are no longer kept; start \
                     a new replay with a since within the last 30 days",
                ));
            }
            replay_since(store, endpoint, since, after).await?
        }
        _ => {
            return Err(ApiError::invalid(
                "give either event_id or since (a unix time), and after only with since",
            ))
        }
    };
    // Cut short: where the next replay goes on from (a body for the same call).
    let next = next.map(|(since, after)| serde_json::json!({"since": since, "after": after}));
    Ok(serde_json::json!({
        "endpoint": endpoint.id,
        "replayed": ids.len(),
        "delivery_ids": ids,
        "truncated": next.is_some(),
        "next": next,
    }))
}

/// Replays the endpoint's events since `since` (past `after`), [`REPLAY_STEP`] at a time and at
/// most [`REPLAY_MAX`]: the new deliveries' ids, and where the rest starts if any is left.
async fn replay_since(
    store: &dyn DeliveryQueue,
    endpoint: &Endpoint,
    since: u64,
    after: Option<String>,
) -> Result<(Vec<String>, Option<(u64, String)>), ApiError> {
    let mut ids = Vec::new();
    let mut read = 0;
    let mut from = (since, after);
    loop {
        let max = REPLAY_STEP.min(REPLAY_MAX - read);
        let step = async {
            let page = store
                .events_since(
                    &endpoint.workspace,
                    endpoint.environment,
                    from.0,
                    from.1.as_deref(),
                    max,
                )
                .await?;
            let wanted: Vec<Event> = page
                .events
                .into_iter()
                .filter(|e| endpoint.wants(&e.event_type))
                .collect();
            let queued = queue_replays(store, endpoint, &wanted).await?;
            Ok::<_, ApiError>((queued, page.next))
        };
        match step.await {
            Ok((queued, next)) => {
                ids.extend(queued);
                read += max;
                match next {
                    Some((since, after)) if read < REPLAY_MAX => from = (since, Some(after)),
                    next => return Ok((ids, next)),
                }
            }
            Err(e) => {
                // Nothing queued yet: the replay failed as a whole. (After a step, `from` is
                // where the page before ended, an event.)
                let (since, Some(after)) = from else {
                    return Err(e);
                };
                if ids.is_empty() {
                    return Err(e);
                }
                tracing::warn!(
                    endpoint = %endpoint.id,
                    error = %e,
                    replayed = ids.len(),
                    "a replay stopped short; its answer says where to go on"
                );
                return Ok((ids, Some((since, after))));
            }
        }
    }
}

/// Queues a replayed delivery of each of `events`; their ids. The events go along, so that
/// their records are kept for as long as the new deliveries (which read their payload there).
async fn queue_replays(
    store: &dyn DeliveryQueue,
    endpoint: &Endpoint,
    events: &[Event],
) -> Result<Vec<String>, ApiError> {
    let now_ms = unix_millis();
    let deliveries: Vec<Delivery> = events
        .iter()
        .map(|e| Delivery::new(e, &endpoint.workspace, &endpoint.id, now_ms, true))
        .collect();
    let events: Vec<&Event> = events.iter().collect();
    store.enqueue_deliveries(&[], &events, &deliveries).await?;
    Ok(deliveries.into_iter().map(|d| d.id).collect())
}

/// A 400 unless `endpoint` is active: a paused or disabled one must be resumed before `doing`.
fn require_active(endpoint: &Endpoint, doing: &str) -> Result<(), ApiError> {
    match endpoint.is_active() {
        true => Ok(()),
        false => Err(ApiError::invalid(format!(
            "the endpoint is {}; resume it before {doing}",
            endpoint.status.as_str()
        ))),
    }
}

/// Default grace period of a secret rotation: a day, as for keys.
pub const ROTATION_GRACE_DEFAULT: u64 = 86_400;
/// Longest grace period of a secret rotation: a week.
pub const ROTATION_GRACE_MAX: u64 = 7 * 86_400;

/// The body of a secret rotation.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateInput {
    /// How long the old secret keeps signing beside the new one (seconds, 0 to a week;
    /// default a day). 0 ends it at once.
    #[serde(default)]
    grace_period_seconds: Option<u64>,
}

/// Gives `endpoint` a new secret, in its format; the old one signs beside it for the grace
/// period. Answers the endpoint with its new secret: the only time it is shown.
pub async fn rotate_secret(
    store: &dyn DeliveryQueue,
    endpoint: &Endpoint,
    input: RotateInput,
) -> Result<serde_json::Value, ApiError> {
    let grace = input.grace_period_seconds.unwrap_or(ROTATION_GRACE_DEFAULT);
    if grace > ROTATION_GRACE_MAX {
        return Err(ApiError::invalid(format!(
            "grace_period_seconds must be 0-{ROTATION_GRACE_MAX}"
        )));
    }
    let secret = new_secret_for(endpoint.format);
    let now = unix_now();
    let rotated = store
        .update_endpoint(&endpoint.workspace, &endpoint.id, &|e: &mut Endpoint| {
            e.rotate_secret(secret.clone(), grace, now)
        })
        .await?
        .ok_or_else(|| not_found(&endpoint.id))?;
    Ok(serde_json::to_value(EndpointView::with_secret(&rotated)).expect("a view serializes"))
}

/// Queues one failed (or skipped) delivery of `endpoint` again, as a new delivery of the same
/// event: answers its id.
pub async fn retry_delivery(
    store: &dyn DeliveryQueue,
    endpoint: &Endpoint,
    delivery_id: &str,
) -> Result<serde_json::Value, ApiError> {
    require_active(endpoint, "retrying")?;
    let listed = store.deliveries(&endpoint.id, DELIVERIES_LISTED).await?;
    let delivery = listed
        .iter()
        .find(|d| d.id == delivery_id)
        .ok_or_else(|| ApiError::not_found(format!("no delivery '{}'", truncate(delivery_id))))?;
    if !matches!(
        delivery.status,
        DeliveryStatus::Failed | DeliveryStatus::Skipped
    ) {
        return Err(ApiError::invalid(format!(
            "the delivery is {}; only a failed or skipped one is retried",
            delivery.status.as_str()
        )));
    }
    let event = store
        .event(
            &endpoint.workspace,
            endpoint.environment,
            &delivery.event.id,
        )
        .await?
        .ok_or_else(|| ApiError::not_found("the delivery's event is no longer kept"))?;
    let ids = queue_replays(store, endpoint, &[event]).await?;
    Ok(serde_json::json!({
        "endpoint": endpoint.id,
        "retry_of": delivery.id,
        "delivery_id": ids.first(),
    }))
}

/// The body of a test delivery.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestInput {
    /// The event type to send (default: the first the endpoint subscribes to).
    #[serde(default, rename = "type")]
    event_type: Option<String>,
}

/// Sends `endpoint` alone a test event: a sample payload of a type it subscribes to, as a new
/// event of its workspace and environment (kept for the delivery's sake, not offered to
/// replays since a time). Answers the event's and the delivery's ids.
pub async fn send_test(
    store: &dyn DeliveryQueue,
    endpoint: &Endpoint,
    input: TestInput,
) -> Result<serde_json::Value, ApiError> {
    require_active(endpoint, "testing it")?;
    let event_type = match input.event_type {
        Some(t) if crate::events::is_event_type(&t) => t,
        Some(t) => {
            return Err(ApiError::invalid(format!(
                "'{}' is not an event type",
                truncate(&t)
            )))
        }
        None => crate::events::EVENT_TYPES
            .iter()
            .find(|t| endpoint.wants(t))
            .map(|t| t.to_string())
            .ok_or_else(|| ApiError::invalid("the endpoint subscribes to no event type"))?,
    };
    if !endpoint.wants(&event_type) {
        return Err(ApiError::invalid(format!(
            "the endpoint does not subscribe to {event_type}"
        )));
    }
    let data = crate::events::sample_data(&event_type, &endpoint.workspace)
        .expect("every event type has a sample");
    let event = Event::new(&event_type, &endpoint.workspace, endpoint.environment, data);
    let delivery = Delivery::new(
        &event,
        &endpoint.workspace,
        &endpoint.id,
        unix_millis(),
        false,
    );
    // The event is not recorded for replays: its payload travels in the delivery's record.
    store
        .enqueue_deliveries(&[], &[], std::slice::from_ref(&delivery))
        .await?;
    Ok(serde_json::json!({
        "endpoint": endpoint.id,
        "event_id": event.id,
        "type": event.event_type,
        "delivery_id": delivery.id,
    }))
}

fn truncate(id: &str) -> String {
    id.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Event;
    use crate::store::MemoryStore;
    use crate::webhooks::endpoint::Endpoint;

    #[tokio::test]
    async fn a_replay_cut_short_says_where_to_go_on_and_that_body_replays_the_rest() {
        let store = MemoryStore::new();
        let endpoint = Endpoint {
            id: "we_1".into(),
            workspace: "ws_1".into(),
            environment: Environment::Live,
            url: "https://example.com/hook".into(),
            events: vec!["agent.run.*".into()],
            secret: "whsec_x".into(),
            status: EndpointStatus::Active,
            created_at: 1,
            format: Default::default(),
            previous_secret: None,
            previous_secret_until: None,
            rate_limit_per_second: None,
        };
        let since = unix_now() - 600;
        let events: Vec<Event> = (0..=REPLAY_MAX as u64)
            .map(|i| {
                let mut e = Event::new(
                    "agent.run.completed",
                    "ws_1",
                    Environment::Live,
                    serde_json::json!({}),
                );
                e.created = since + i / 1_000;
                e
            })
            .collect();
        let refs: Vec<&Event> = events.iter().collect();
        store.enqueue_deliveries(&[], &refs, &[]).await.unwrap();
        let body = |v: serde_json::Value| serde_json::from_value::<ReplayInput>(v).unwrap();
        let first = replay(&store, &endpoint, body(serde_json::json!({"since": since})))
            .await
            .unwrap();
        assert_eq!(
            (first["replayed"].as_u64(), first["truncated"].as_bool()),
            (Some(REPLAY_MAX as u64), Some(true))
        );
        let rest = replay(&store, &endpoint, body(first["next"].clone()))
            .await
            .unwrap();
        assert_eq!(rest["replayed"], 1);
        assert_eq!(rest["truncated"], false);
        assert!(rest["next"].is_null());
        // Sent again and again: once two replays' worth wait, the next waits for them.
        let again = replay(&store, &endpoint, body(serde_json::json!({"since": since})))
            .await
            .unwrap();
        assert_eq!(again["replayed"], REPLAY_MAX as u64);
        let refused = replay(&store, &endpoint, body(serde_json::json!({"since": since})))
            .await
            .unwrap_err();
        assert_eq!(refused.status(), 429);
        assert_eq!(
            store.queued_deliveries("we_1").await.unwrap(),
            2 * REPLAY_MAX as u64 + 1
        );
        // `after` only goes with `since`.
        let bad = body(serde_json::json!({"event_id": "evt_1", "after": "evt_2"}));
        assert_eq!(
            replay(&store, &endpoint, bad).await.unwrap_err().status(),
            400
        );
    }
}
