//! `GET /v1/webhooks/listen`: the gateway's side of `svcgate listen`.
//!
//! The answer is a stream of Server-Sent Events. It opens with `session`, carrying a `whsec_…`
//! secret made for this stream alone; then each event the store logs from now on for the
//! caller's workspace and environment (a test key gets test events only), narrowed by the
//! optional `events=a,b` filter, comes as `delivery`: the exact delivery body and its
//! signature, computed here, so the CLI forwards what production would send and no secret
//! travels after the first event. The stream ends with an `error` event carrying the gateway's
//! error body when the store fails, the key stops being valid or the gateway shuts down.
//!
//! The gateway reads the event log once for all its streams ([`EventHub`]). A key holds at
//! most [`STREAMS_PER_KEY`] streams across the gateways (a scoped token counts as its parent),
//! and a replica at most [`STREAMS_PER_REPLICA`] in all; one more gets a 429
//! ([`Listening`], [`OpenStreams`]).

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, TRANSFER_ENCODING};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::event_hub::{EventHub, Selection, Subscription};
use crate::error::ApiError;
use crate::events::Event;
use crate::ids::unix_now;
use crate::proxy::auth::{Authenticated, Authenticator};
use crate::proxy::policy::check_scope;
use crate::proxy::respond::REQUEST_ID;
use crate::proxy::routes::Route;
use crate::store::{ListenSlots, StoreError};
use crate::webhooks::endpoint::{check_filter, new_secret};
use crate::webhooks::{delivery, sign};
use std::sync::Arc;

/// Most filters one stream may name.
const MAX_FILTERS: usize = 50;
/// Longest wait for new events before the key and the shutdown flag are checked again.
const BLOCK: Duration = Duration::from_secs(2);
/// Idle time after which a comment keeps proxies and the client from closing the stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// A client that takes longer than this to accept a write is gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of events written at once (a single larger event goes alone): each write gets
/// [`WRITE_TIMEOUT`], so a client too slow for a whole batch of large events in one timeout
/// still gets them, at ~35 KB/s or faster, and the slot is renewed between writes.
const WRITE_PIECE: usize = 1 << 20;

/// Most streams one key may hold open, across the gateways: a developer's terminal or three.
pub const STREAMS_PER_KEY: usize = 5;
/// Most streams one replica holds open.
pub const STREAMS_PER_REPLICA: usize = 1_000;
/// The `Retry-After` of a refused stream.
const STREAMS_RETRY_AFTER_SECS: u64 = 5;
/// How long a stream's slot among its key's [`STREAMS_PER_KEY`] holds without a renewal, so a
/// dead replica's slots come free: longer than a stream can go between renewals
/// ([`SLOT_RENEWAL`], then [`BLOCK`] and a [`WRITE_TIMEOUT`] to a slow client).
const SLOT_LEASE: Duration = Duration::from_secs(90);
/// How often an open stream renews its slot.
const SLOT_RENEWAL: Duration = Duration::from_secs(10);

/// The 429 of a key that holds all its streams.
fn too_many_for_key() -> ApiError {
    ApiError::RateLimited {
        message: format!(
            "at most {STREAMS_PER_KEY} listen streams per key may be open at once, across the \
             gateways; close one"
        )
        .into(),
        retry_after_secs: STREAMS_RETRY_AFTER_SECS,
    }
}

/// Holds, or renews, stream `stream`'s slot among key `key_id`'s [`STREAMS_PER_KEY`], shared by
/// every replica (behind a load balancer, a key would otherwise hold that many on each):
/// `false` if the key's other streams hold them all.
async fn hold(store: &dyn ListenSlots, key_id: &str, stream: &str) -> Result<bool, StoreError> {
    let lease_ms = u64::try_from(SLOT_LEASE.as_millis()).unwrap_or(u64::MAX);
    store
        .hold_listen_slot(key_id, stream, STREAMS_PER_KEY, lease_ms)
        .await
}

/// A stream's slot among its key's, freed when dropped (however the stream ends; else its
/// lease runs out).
struct HeldSlot {
    store: Arc<dyn ListenSlots>,
    key_id: String,
    stream: String,
    /// Whether the store may hold the slot: from before it is asked to, until it says no.
    held: bool,
}

impl HeldSlot {
    /// Holds a slot of key `key_id` for stream `stream`: a 429 if the key's other streams, on
    /// any replica, hold them all.
    ///
    /// The guard exists before the store is asked: a hold that fails or is dropped part way
    /// (a timeout, a client gone) may still have reached the store, and its slot is let go
    /// rather than held for its lease.
    async fn take(
        store: Arc<dyn ListenSlots>,
        key_id: &str,
        stream: &str,
    ) -> Result<Self, ApiError> {
        let mut slot = Self {
            store,
            key_id: key_id.to_string(),
            stream: stream.to_string(),
            held: true,
        };
        if !hold(slot.store.as_ref(), key_id, stream).await? {
            slot.held = false;
            return Err(too_many_for_key());
        }
        Ok(slot)
    }

    /// Renews the slot's lease: `false` if it ran out and another stream took the place.
    async fn renew(&self) -> Result<bool, StoreError> {
        hold(self.store.as_ref(), &self.key_id, &self.stream).await
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key_id, stream) = (
            self.store.clone(),
            std::mem::take(&mut self.key_id),
            std::mem::take(&mut self.stream),
        );
        runtime.spawn(async move {
            if let Err(e) = store.release_listen_slot(&key_id, &stream).await {
                tracing::debug!(error = %e, "a listen stream's slot is freed when its lease ends");
            }
        });
    }
}

/// What an open stream holds in the store and the gateway, released when it is dropped.
pub struct Listening {
    /// Its place among its key's streams, across the gateways.
    slot: HeldSlot,
    /// The events it selects: its workspace's, in its environment, narrowed by its filters.
    feed: Subscription,
}

impl Listening {
    /// Reads the stream's filters from `query` (a 400 if they are bad), takes a place among
    /// the caller's key's streams (a 429 when they are all taken) and joins the gateway's
    /// reader of the event log (a 503 when the store is down, before the answer begins rather
    /// than as an empty stream).
    pub async fn open(
        store: Arc<dyn ListenSlots>,
        hub: &Arc<EventHub>,
        caller: &Authenticated,
        stream: &str,
        query: Option<&str>,
    ) -> Result<Self, ApiError> {
        let key = &caller.key;
        let selection = Selection {
            workspace: key.workspace.clone(),
            environment: key.effective_environment(),
            filters: parse_filters(query)?,
        };
        let slot = HeldSlot::take(store, key.billed_key_id(), stream).await?;
        let feed = hub.join(selection).await?;
        Ok(Self { slot, feed })
    }
}

/// The streams open on this replica, per key.
#[derive(Default)]
pub struct OpenStreams {
    /// Open streams per key id (entries go when their count does).
    per_key: Mutex<HashMap<String, usize>>,
}

/// One open stream, counted until dropped.
pub struct StreamSlot<'a> {
    streams: &'a OpenStreams,
    key_id: String,
}

impl OpenStreams {
    /// Counts a new stream of `key_id`, or refuses it with a 429 when the key or the replica
    /// holds as many as allowed.
    pub fn open(&self, key_id: &str) -> Result<StreamSlot<'_>, ApiError> {
        let mut per_key = self.per_key.lock().unwrap_or_else(PoisonError::into_inner);
        let total: usize = per_key.values().sum();
        let mine = per_key.get(key_id).copied().unwrap_or(0);
        if mine >= STREAMS_PER_KEY {
            return Err(too_many_for_key());
        }
        if total >= STREAMS_PER_REPLICA {
            return Err(ApiError::RateLimited {
                message: "this gateway holds as many listen streams as it can; retry shortly"
                    .into(),
                retry_after_secs: STREAMS_RETRY_AFTER_SECS,
            });
        }
        per_key.insert(key_id.to_string(), mine + 1);
        Ok(StreamSlot {
            streams: self,
            key_id: key_id.to_string(),
        })
    }
}

impl Drop for StreamSlot<'_> {
    fn drop(&mut self) {
        let mut per_key = self
            .streams
            .per_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = per_key.get_mut(&self.key_id) {
            *count -= 1;
            if *count == 0 {
                per_key.remove(&self.key_id);
            }
        }
    }
}

/// Streams the caller's events (the caller holds its [`StreamSlot`], and `listening` the rest
/// of what the stream holds) until the client goes away, the store fails, the key is no longer
/// allowed on `route`, or the gateway shuts down. Errors before the first byte are answered by
/// the caller as usual.
pub async fn stream(
    session: &mut Session,
    auth: &Authenticator,
    route: &Route,
    mut listening: Listening,
    request_id: &str,
    answer_headers: &[(&'static str, String)],
) -> Result<(), ApiError> {
    let secret = new_secret();

    session.set_keepalive(None);
    session.set_write_timeout(Some(WRITE_TIMEOUT));
    if write_header(session, request_id, answer_headers)
        .await
        .is_err()
    {
        return Ok(());
    }
    let opening = frame(
        "session",
        &serde_json::json!({ "secret": secret }).to_string(),
    );
    if send(session, opening).await.is_err() {
        return Ok(());
    }

    let mut last_write = Instant::now();
    let mut renewed = Instant::now();
    let ended = loop {
        if session.is_process_shutting_down() {
            break ApiError::ServiceUnavailable("the gateway is shutting down; reconnect".into());
        }
        if let Err(lost) = renew_if_due(&listening.slot, &mut renewed, request_id).await {
            break lost;
        }
        if let Err(refused) = still_allowed(session, auth, route).await {
            break refused;
        }
        // Waiting for events, also watch the connection: a client that hangs up ends the
        // stream (and frees its slot) at once rather than at the next write.
        let next = tokio::select! {
            next = listening.feed.next(BLOCK) => next,
            gone = session.read_body_or_idle(true) => {
                tracing::debug!(request_id, closed = ?gone.err(), "listen stream ended: the client went away");
                return Ok(());
            }
        };
        let events = match next {
            Ok(events) => events,
            Err(e) => break e,
        };
        // The key may have been revoked while the read waited, in the very step that logged
        // these events (a leak report logs `key.auto_revoked` as it revokes): bring the key
        // cache up to date with the store and check again before anything is sent (only when
        // something is to be sent). The hub hands over only the events the stream selects.
        if !events.is_empty() {
            if let Err(e) = auth.catch_up().await {
                break e.into();
            }
            if let Err(refused) = still_allowed(session, auth, route).await {
                break refused;
            }
        }
        let now = unix_now();
        let frames = events
            .iter()
            .map(|event| delivery_frame(&secret, event, now));
        let mut pieces = pieces(frames, WRITE_PIECE);
        if pieces.is_empty() && last_write.elapsed() >= KEEP_ALIVE {
            pieces.push(": keep-alive\n\n".to_string());
        }
        let mut lost = None;
        for (i, piece) in pieces.into_iter().enumerate() {
            if i > 0 {
                // A slow client's batch can take a while: the slot must outlive it.
                if let Err(e) = renew_if_due(&listening.slot, &mut renewed, request_id).await {
                    lost = Some(e);
                    break;
                }
            }
            if send(session, piece).await.is_err() {
                tracing::debug!(request_id, "listen stream ended: the client went away");
                return Ok(());
            }
            last_write = Instant::now();
        }
        if let Some(lost) = lost {
            break lost;
        }
    };
    tracing::debug!(request_id, reason = %ended, "listen stream ended");
    let body = String::from_utf8_lossy(&ended.body(request_id)).into_owned();
    if send(session, frame("error", &body)).await.is_ok() {
        let _ = session.write_response_body(None, true).await;
    }
    Ok(())
}

/// Renews the stream's slot if [`SLOT_RENEWAL`] has passed since `renewed`; the error to end
/// the stream with if its lease ran out (a client too slow for long) and another stream took
/// it. A store that does not answer is tried again next time: the lease outlasts a blip.
async fn renew_if_due(
    slot: &HeldSlot,
    renewed: &mut Instant,
    request_id: &str,
) -> Result<(), ApiError> {
    if renewed.elapsed() < SLOT_RENEWAL {
        return Ok(());
    }
    match slot.renew().await {
        Ok(true) => *renewed = Instant::now(),
        Ok(false) => return Err(too_many_for_key()),
        Err(e) => tracing::debug!(request_id, error = %e, "cannot renew a listen slot"),
    }
    Ok(())
}

/// `frames` joined into writes of at most `most` bytes each; a frame longer than that is a
/// write of its own. Empty frames are left out (`delivery_frame` makes one only of a body that
/// is not UTF-8, which serde_json never writes).
fn pieces(frames: impl Iterator<Item = String>, most: usize) -> Vec<String> {
    let mut pieces: Vec<String> = Vec::new();
    for frame in frames.filter(|f| !f.is_empty()) {
        match pieces.last_mut() {
            Some(last) if last.len() + frame.len() <= most => last.push_str(&frame),
            _ => pieces.push(frame),
        }
    }
    pieces
}

/// The key as it is now: still valid, and still holding the route's scope.
async fn still_allowed(
    session: &Session,
    auth: &Authenticator,
    route: &Route,
) -> Result<(), ApiError> {
    let header = crate::proxy::auth::authorization(&session.req_header().headers)?;
    // The key was authenticated when the stream opened: it is cached, or counted already.
    let caller = auth.authenticate(header, unix_now(), || None).await?;
    check_scope(&caller, route)
}

async fn write_header(
    session: &mut Session,
    request_id: &str,
    answer_headers: &[(&'static str, String)],
) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build_no_case(200, Some(5))?;
    resp.insert_header(CONTENT_TYPE, "text/event-stream")?;
    resp.insert_header(CACHE_CONTROL, "no-cache")?;
    resp.insert_header(&REQUEST_ID, request_id)?;
    for (name, value) in answer_headers {
        resp.insert_header(*name, value)?;
    }
    // Tells buffering reverse proxies (nginx and the like) to pass events on at once.
    resp.insert_header("X-Accel-Buffering", "no")?;
    let req = session.req_header();
    if !session.is_http2() && req.version == http::Version::HTTP_11 {
        // Without a length the body would be delimited by closing the connection; chunks let
        // a client tell a finished stream from a broken one.
        resp.insert_header(TRANSFER_ENCODING, "chunked")?;
    }
    session.write_response_header(Box::new(resp), false).await
}

/// Writes one chunk; Pingora flushes every body chunk to the client as it is written.
async fn send(session: &mut Session, chunk: String) -> pingora::Result<()> {
    session
        .write_response_body(Some(Bytes::from(chunk)), false)
        .await
}

/// The `events=a,b` query parameter: event names and `resource.*` wildcards; none means all.
fn parse_filters(query: Option<&str>) -> Result<Vec<String>, ApiError> {
    let mut filters = Vec::new();
    let params = url::form_urlencoded::parse(query.unwrap_or_default().as_bytes());
    for (name, value) in params.filter(|(name, _)| name == "events") {
        let before = filters.len();
        for filter in value.split(',').map(str::trim).filter(|f| !f.is_empty()) {
            check_filter(filter).map_err(ApiError::invalid)?;
            filters.push(filter.to_string());
        }
        if filters.len() == before {
            return Err(ApiError::invalid(format!(
                "{name} must name event names or wildcards, comma-separated"
            )));
        }
    }
    if filters.len() > MAX_FILTERS {
        return Err(ApiError::invalid(format!(
            "events may name at most {MAX_FILTERS} event names or wildcards"
        )));
    }
    Ok(filters)
}

/// One delivery, signed at `timestamp` as the worker signs it.
#[derive(Serialize)]
struct DeliveryFrame<'a> {
    event_id: &'a str,
    event_type: &'a str,
    timestamp: u64,
    signature: String,
    body: &'a str,
}

fn delivery_frame(secret: &str, event: &Event, timestamp: u64) -> String {
    let body = delivery::body(event);
    let signature = sign(secret, timestamp, &body);
    // serde_json writes UTF-8, so this holds; the body must travel as the very bytes signed.
    let Ok(body) = std::str::from_utf8(&body) else {
        return String::new();
    };
    let data = DeliveryFrame {
        event_id: &event.id,
        event_type: &event.event_type,
        timestamp,
        signature,
        body,
    };
    frame(
        "delivery",
        &serde_json::to_string(&data).unwrap_or_default(),
    )
}

/// An SSE event whose data is one line of compact JSON (JSON escapes every line break).
fn frame(name: &str, json: &str) -> String {
    format!("event: {name}\ndata: {json}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Environment;

    #[test]
    fn a_batch_is_written_in_pieces_of_whole_frames() {
        let frames = |lens: &[usize]| -> Vec<String> {
            lens.iter()
                .enumerate()
                .map(|(i, n)| char::from(b'a' + i as u8).to_string().repeat(*n))
                .collect()
        };
        let lens = |pieces: &[String]| pieces.iter().map(String::len).collect::<Vec<_>>();
        // Frames fill a piece up to the most, never split; one larger goes alone.
        let written = pieces(frames(&[4, 4, 3, 9, 12, 1, 0, 2]).into_iter(), 10);
        assert_eq!(lens(&written), [8, 3, 9, 12, 3]);
        assert_eq!(written[0], "aaaabbbb");
        assert_eq!(written[4], "fhh", "an empty frame is left out");
        assert_eq!(
            written.concat(),
            frames(&[4, 4, 3, 9, 12, 1, 0, 2]).concat(),
            "every byte, in order"
        );
        assert!(pieces(std::iter::empty(), 10).is_empty());
        assert!(pieces(frames(&[0, 0]).into_iter(), 10).is_empty());
    }

    fn refused(result: Result<StreamSlot<'_>, ApiError>) -> bool {
        matches!(result, Err(ApiError::RateLimited { .. }))
    }

    #[test]
    fn streams_are_capped_per_key_and_per_replica_and_freed_when_they_end() {
        let streams = OpenStreams::default();
        let mut held: Vec<StreamSlot> = (0..STREAMS_PER_KEY)
            .map(|_| streams.open("key_a").unwrap())
            .collect();
        assert!(refused(streams.open("key_a")));
        // Another key is not held back by this one's.
        let other = streams.open("key_b").unwrap();
        // A stream that ends gives its place back.
        held.pop();
        held.push(streams.open("key_a").unwrap());
        assert!(refused(streams.open("key_a")));
        drop(held);
        drop(other);
        assert!(
            streams.per_key.lock().unwrap().is_empty(),
            "counts are forgotten"
        );

        // The replica's cap, over many keys.
        let many: Vec<StreamSlot> = (0..STREAMS_PER_REPLICA)
            .map(|i| {
                streams
                    .open(&format!("key_{}", i / STREAMS_PER_KEY))
                    .unwrap()
            })
            .collect();
        assert!(refused(streams.open("key_new")));
        drop(many);
        assert!(streams.open("key_new").is_ok());
    }

    #[test]
    fn filters_are_checked_names_or_wildcards() {
        assert_eq!(parse_filters(None).unwrap(), Vec::<String>::new());
        assert_eq!(
            parse_filters(Some("other=1")).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            parse_filters(Some("events=agent.run.*,%20key.auto_revoked")).unwrap(),
            ["agent.run.*", "key.auto_revoked"]
        );
        assert_eq!(
            parse_filters(Some("events=agent.run.*&events=image.batch.completed")).unwrap(),
            ["agent.run.*", "image.batch.completed"]
        );
        for bad in ["events=", "events=,", "events=nope", "events=agent.run.*,*"] {
            let err = parse_filters(Some(bad)).unwrap_err();
            assert_eq!(err.status(), 400, "{bad}");
        }
        let many = vec!["agent.run.*"; MAX_FILTERS + 1].join(",");
        assert!(parse_filters(Some(&format!("events={many}"))).is_err());
    }

    #[test]
    fn a_delivery_frame_carries_the_signed_body() {
        let event = Event::new(
            "agent.run.completed",
            "ws_1",
            Environment::Live,
            serde_json::json!({"note": "two\nlines"}),
        );
        let frame = delivery_frame("whsec_x", &event, 1_700_000_000);
        let data = frame
            .strip_prefix("event: delivery\ndata: ")
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .expect("one event, one data line");
        assert!(!data.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        let body = v["body"].as_str().unwrap();
        assert_eq!(body.as_bytes(), delivery::body(&event));
        assert_eq!(v["event_id"], event.id.as_str());
        assert_eq!(v["event_type"], "agent.run.completed");
        assert_eq!(v["timestamp"], 1_700_000_000);
        assert_eq!(
            v["signature"],
            sign("whsec_x", 1_700_000_000, body.as_bytes())
        );
    }
}
