//! One reader of the event log per gateway, shared by its `svcgate listen` streams.
//!
//! The log holds every workspace's events. Read by each stream on its own, a thousand streams
//! would read every event a thousand times, each through a blocking Redis connection of its
//! own. The hub reads the log once, while at least one stream is open, and hands each stream
//! the events it selects (its workspace, environment and filters), shared, through a queue of
//! its own.
//!
//! A stream gets the events the hub reads after it joins, but only those logged after the
//! position the store gave it when it joined ([`EventLog::event_log_floor`]): with Redis, half a
//! second before it joined, by the log's clock. That holds even when the hub, on a new master
//! after a failover, reads again what was logged there before it noticed the move: a stream
//! that joined meanwhile gets at most the last half second before it joined, if the two
//! masters' clocks agree. (If the new master's clock runs more than that half second behind
//! the old one's, the events it takes in the first moments after a stream joined, until its
//! clock passes the stream's floor, fall below that floor: the stream misses them. Keep the
//! Redis hosts' clocks in sync.)
//!
//! A stream whose client lets more than [`QUEUED_EVENTS`] events pile up is dropped from the
//! hub and ends with an error, rather than hold the others back or the gateway's memory. When
//! the log cannot be read, or a read takes far longer than it may block, every stream gets the
//! error and ends; the next stream to open tries the store again. (A stream that opens while a
//! reader runs does not open the log again, but it asks the store for its position, and the
//! gateway has asked the store for the stream's place among its key's first, so a store that
//! is down still refuses it with a 503 before its answer begins.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{self, error::TryRecvError};

use crate::error::ApiError;
use crate::events::{log_position, Event};
use crate::keys::Environment;
use crate::metrics;
use crate::store::{EventFeed, EventLog, StoreError};
use crate::webhooks::endpoint::matches_filter;

/// Most events read from the log at once, and handed to a stream at once.
const BATCH: usize = 100;
/// Longest wait for new events before the hub looks whether any stream is still open.
const BLOCK: Duration = Duration::from_secs(2);
/// How much longer than [`BLOCK`] a read may take before the store is taken for gone (a
/// connection cut without a word, a Redis that hangs): the streams end rather than wait on it.
const READ_GRACE: Duration = Duration::from_secs(5);
/// Longest a stream waits for the log to open.
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a stream waits for its floor ([`EventLog::event_log_floor`]: one Redis `TIME`).
const FLOOR_TIMEOUT: Duration = Duration::from_secs(1);
/// Events a stream's queue holds before the stream is dropped for falling behind.
pub const QUEUED_EVENTS: usize = 1_000;

/// What a stream is handed: its events, oldest first, or why the log could not be read.
type Batch = Result<Vec<Arc<Event>>, StoreError>;

/// The events a stream forwards: its caller's workspace and environment, narrowed by its
/// filters (event names and `resource.*` wildcards; none: all).
#[derive(Debug, Clone)]
pub struct Selection {
    /// The caller's workspace.
    pub workspace: Arc<str>,
    /// The caller's key's environment (a test key gets test events only).
    pub environment: Environment,
    /// `events=a,b`.
    pub filters: Vec<String>,
}

impl Selection {
    /// Whether the stream forwards events of `event_type` (its workspace and environment are
    /// matched by the reader, for all the streams at once).
    fn takes_type(&self, event_type: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| matches_filter(f, event_type))
    }
}

/// The gateway's reader of the event log.
pub struct EventHub {
    store: Arc<dyn EventLog>,
    state: Mutex<State>,
    /// Held by a stream that opens the log for a reader, so streams that arrive together
    /// while none runs open it once, not once each.
    opening: tokio::sync::Mutex<()>,
    /// Events a stream's queue holds ([`QUEUED_EVENTS`]).
    queued_events: usize,
}

#[derive(Default)]
struct State {
    streams: HashMap<u64, Joined>,
    next_id: u64,
    /// A reader task is running (it stops when no stream is left).
    reading: bool,
    /// When the log last failed to open, and why: streams that waited for that try are
    /// refused with it rather than each try again in turn.
    open_failed: Option<(Instant, StoreError)>,
}

/// A stream, as the hub knows it.
struct Joined {
    selection: Selection,
    /// Events at or before this position ([`log_position`]) were logged before the stream
    /// joined, and are not its.
    floor: Option<(u64, u64)>,
    queue: mpsc::UnboundedSender<Batch>,
    /// Events handed over and not yet taken.
    queued: Arc<AtomicUsize>,
}

impl EventHub {
    /// A hub over `store`'s event log; it reads only while a stream is open.
    pub fn new(store: Arc<dyn EventLog>) -> Arc<Self> {
        Self::with_queue(store, QUEUED_EVENTS)
    }

    /// A hub whose streams' queues hold `events` events.
    fn with_queue(store: Arc<dyn EventLog>, events: usize) -> Arc<Self> {
        Arc::new(Self {
            store,
            state: Mutex::default(),
            opening: tokio::sync::Mutex::new(()),
            queued_events: events,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins a stream for the events `selection` selects, logged after the floor the store
    /// gives it now. When nothing reads the log yet, the log is opened first. A store that is
    /// down refuses the stream here, before its answer begins.
    pub async fn join(self: &Arc<Self>, selection: Selection) -> Result<Subscription, StoreError> {
        let floor = tokio::time::timeout(FLOOR_TIMEOUT, self.store.event_log_floor())
            .await
            .unwrap_or_else(|_| Err(not_in_time()))?;
        let (queue, events) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let joined = Joined {
            selection,
            floor: floor.as_deref().and_then(log_position),
            queue,
            queued: queued.clone(),
        };
        let id = match self.join_running(joined) {
            Ok(id) => id,
            Err(joined) => self.join_opening(joined).await?,
        };
        Ok(Subscription {
            hub: self.clone(),
            id,
            events,
            queued,
            ended: None,
        })
    }

    /// Adds the stream once the log is open and a reader runs: the first of the streams that
    /// arrive while none runs opens the log and starts one; the others join it, or are
    /// refused with its error.
    async fn join_opening(self: &Arc<Self>, joined: Joined) -> Result<u64, StoreError> {
        let waiting_since = Instant::now();
        let _opening = self.opening.lock().await;
        // Another stream may have started a reader, or failed to, while this one waited.
        let joined = match self.join_running(joined) {
            Ok(id) => return Ok(id),
            Err(joined) => joined,
        };
        if let Some((at, e)) = &self.state().open_failed {
            if *at >= waiting_since {
                return Err(e.clone());
            }
        }
        let opened = tokio::time::timeout(OPEN_TIMEOUT, self.store.tail_events())
            .await
            .unwrap_or_else(|_| Err(not_in_time()));
        let feed = match opened {
            Ok(feed) => feed,
            Err(e) => {
                self.state().open_failed = Some((Instant::now(), e.clone()));
                return Err(e);
            }
        };
        // Made before the task is spawned: it ends the reading even if the task never runs.
        let running = Running {
            hub: self.clone(),
            armed: true,
        };
        let id = {
            let mut state = self.state();
            // Only a stream holding `opening` starts a reader, and none runs.
            state.reading = true;
            state.add(joined)
        };
        tokio::spawn(read(running, feed));
        Ok(id)
    }

    /// Adds the stream if a reader runs; gives it back if none does.
    fn join_running(&self, joined: Joined) -> Result<u64, Joined> {
        let mut state = self.state();
        match state.reading {
            true => Ok(state.add(joined)),
            false => Err(joined),
        }
    }

    /// Streams open.
    #[cfg(test)]
    fn streams(&self) -> usize {
        self.state().streams.len()
    }
}

/// The log did not answer within its time.
fn not_in_time() -> StoreError {
    StoreError::Unavailable("the event log did not answer in time".into())
}

/// An event read from the log, with its position ([`log_position`]).
type Positioned = ((u64, u64), Arc<Event>);

/// Reads the log while any stream is open, handing each stream its events.
async fn read(mut running: Running, mut feed: Box<dyn EventFeed>) {
    let hub = running.hub.clone();
    loop {
        {
            let mut state = hub.state();
            if state.streams.is_empty() {
                state.end_reading(None);
                running.armed = false;
                return;
            }
        }
        let read = tokio::time::timeout(BLOCK + READ_GRACE, feed.next(BATCH, BLOCK))
            .await
            .unwrap_or_else(|_| Err(not_in_time()));
        let logged = match read {
            Ok(logged) => logged,
            Err(e) => {
                let mut state = hub.state();
                let streams = state.streams.len();
                tracing::warn!(error = %e, streams, "event log unreadable; ending listen streams");
                state.end_reading(Some(("log_unreadable", &e)));
                running.armed = false;
                return;
            }
        };
        if logged.is_empty() {
            continue;
        }
        let events: Vec<Positioned> = logged
            .into_iter()
            // A position that cannot be read cannot be put before a floor: it is handed out.
            .map(|l| {
                let at = log_position(&l.position).unwrap_or((u64::MAX, u64::MAX));
                (at, Arc::new(l.event))
            })
            .collect();
        let mut by_source: HashMap<(&str, Environment), Vec<&Positioned>> = HashMap::new();
        for logged in &events {
            let event = &logged.1;
            by_source
                .entry((event.workspace.as_str(), event.environment))
                .or_default()
                .push(logged);
        }
        let limit = hub.queued_events;
        let mut state = hub.state();
        state.streams.retain(|id, stream| {
            let selection = &stream.selection;
            let source = (&*selection.workspace, selection.environment);
            let Some(candidates) = by_source.get(&source) else {
                return true;
            };
            let mine: Vec<Arc<Event>> = candidates
                .iter()
                .filter(|(at, e)| {
                    stream.floor.is_none_or(|floor| *at > floor)
                        && selection.takes_type(&e.event_type)
                })
                .map(|(_, e)| Arc::clone(e))
                .collect();
            if mine.is_empty() {
                return true;
            }
            if stream.queued.fetch_add(mine.len(), Ordering::AcqRel) + mine.len() > limit {
                tracing::warn!(
                    stream = id,
                    "a listen stream fell behind the event log; ending it"
                );
                metrics::record_listen_streams_cut("fell_behind", 1);
                return false;
            }
            stream.queue.send(Ok(mine)).is_ok()
        });
        state.count();
    }
}

/// The hub's reader, from just before its task is spawned. However the task ends — its last
/// stream gone, the store failing, a panic, the runtime dropping it, even before it first
/// runs — the hub then knows that no reader runs, and the streams left end with an error once
/// they have taken what was queued for them.
struct Running {
    hub: Arc<EventHub>,
    /// The task has not ended the reading itself.
    armed: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.armed {
            let mut state = self.hub.state();
            let streams = state.streams.len();
            tracing::error!(
                streams,
                "the event log's reader stopped unexpectedly; ending listen streams"
            );
            let stopped = StoreError::Unavailable("the event log's reader stopped".into());
            state.end_reading(Some(("reader_stopped", &stopped)));
        }
    }
}

impl State {
    /// No reader runs any more (in the same lock as its last look at the streams: a stream
    /// that joins after it starts a new one); the streams left, if any, are told `why`.
    /// `why`: the reason the streams are cut, as counted (`log_unreadable`, `reader_stopped`),
    /// and the error they end with.
    fn end_reading(&mut self, why: Option<(&'static str, &StoreError)>) {
        if let Some((reason, _)) = why {
            metrics::record_listen_streams_cut(reason, self.streams.len());
        }
        for (_, stream) in self.streams.drain() {
            if let Some((_, e)) = why {
                // Unbounded: the error is queued after what the stream has not taken.
                let _ = stream.queue.send(Err(e.clone()));
            }
        }
        self.reading = false;
        self.count();
    }

    fn add(&mut self, joined: Joined) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.streams.insert(id, joined);
        self.count();
        id
    }

    /// Shows how many streams are open.
    fn count(&self) {
        metrics::record_listen_streams(self.streams.len());
    }
}

/// A stream's place in the hub; leaves it when dropped.
pub struct Subscription {
    hub: Arc<EventHub>,
    id: u64,
    events: mpsc::UnboundedReceiver<Batch>,
    queued: Arc<AtomicUsize>,
    /// Why the stream ends, found while taking the events queued before it.
    ended: Option<ApiError>,
}

impl Subscription {
    /// The stream's next events, oldest first, those queued (fewer than 2 × [`BATCH`]),
    /// waiting up to `wait` for one (none: empty). A 503 when the log could not be read, or
    /// the stream fell behind it, once the events queued before are taken.
    pub async fn next(&mut self, wait: Duration) -> Result<Vec<Arc<Event>>, ApiError> {
        if let Some(ended) = self.ended.take() {
            return Err(ended);
        }
        let first = match tokio::time::timeout(wait, self.events.recv()).await {
            Err(_elapsed) => return Ok(Vec::new()),
            Ok(first) => first,
        };
        let mut events = self.take(first)?;
        while events.len() < BATCH {
            let more = match self.events.try_recv() {
                Ok(batch) => Some(batch),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => None,
            };
            match self.take(more) {
                Ok(more) => events.extend(more),
                Err(ended) => {
                    self.ended = Some(ended);
                    break;
                }
            }
        }
        Ok(events)
    }

    /// A batch taken from the queue (`None`: the hub closed it), counted off.
    fn take(&self, batch: Option<Batch>) -> Result<Vec<Arc<Event>>, ApiError> {
        match batch {
            Some(Ok(events)) => {
                self.queued.fetch_sub(events.len(), Ordering::AcqRel);
                Ok(events)
            }
            Some(Err(e)) => Err(e.into()),
            None => Err(ApiError::ServiceUnavailable(
                "this stream fell behind the event log; reconnect".into(),
            )),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = self.hub.state();
        state.streams.remove(&self.id);
        state.count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn event(workspace: &str, environment: Environment, n: u64) -> Event {
        Event::new(
            "agent.run.completed",
            workspace,
            environment,
            serde_json::json!({ "n": n }),
        )
    }

    fn selection(workspace: &str, environment: Environment) -> Selection {
        Selection {
            workspace: workspace.into(),
            environment,
            filters: Vec::new(),
        }
    }

    /// The `n`s of the events a stream is handed within `wait`.
    async fn numbers(stream: &mut Subscription, wait: Duration) -> Vec<u64> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < deadline {
            for e in stream.next(Duration::from_millis(50)).await.unwrap() {
                got.push(e.data["n"].as_u64().unwrap());
            }
        }
        got
    }

    #[tokio::test]
    async fn each_stream_gets_what_it_selects_from_one_reader() {
        let store = Arc::new(MemoryStore::new());
        let hub = EventHub::new(store.clone());
        let mut a_live = hub
            .join(selection("ws_a", Environment::Live))
            .await
            .unwrap();
        let mut a_test = hub
            .join(selection("ws_a", Environment::Test))
            .await
            .unwrap();
        let mut b_live = hub
            .join(selection("ws_b", Environment::Live))
            .await
            .unwrap();
        let mut a_keys = hub
            .join(Selection {
                filters: vec!["key.*".into()],
                ..selection("ws_a", Environment::Live)
            })
            .await
            .unwrap();
        assert_eq!(hub.streams(), 4);
        for (n, (ws, env)) in [
            ("ws_a", Environment::Live),
            ("ws_b", Environment::Live),
            ("ws_a", Environment::Test),
            ("ws_a", Environment::Live),
            ("ws_c", Environment::Live),
        ]
        .into_iter()
        .enumerate()
        {
            store.append_event(&event(ws, env, n as u64)).await.unwrap();
        }
        let revoked = Event::new(
            "key.auto_revoked",
            "ws_a",
            Environment::Live,
            serde_json::json!({ "n": 5 }),
        );
        store.append_event(&revoked).await.unwrap();
        let wait = Duration::from_millis(300);
        assert_eq!(numbers(&mut a_live, wait).await, [0, 3, 5]);
        assert_eq!(numbers(&mut a_keys, wait).await, [5]);
        assert_eq!(numbers(&mut a_test, wait).await, [2]);
        assert_eq!(numbers(&mut b_live, wait).await, [1]);
    }

    // One thread: the reader does not run until the test waits, which it does not do between
    // logging the first event and the second stream's joining.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stream_joining_a_running_reader_gets_nothing_logged_before_it_joined() {
        let store = Arc::new(MemoryStore::new());
        let hub = EventHub::new(store.clone());
        let mut first = hub
            .join(selection("ws_a", Environment::Live))
            .await
            .unwrap();
        // Logged while the reader has not run since (this test's runtime has one thread, and
        // nothing here yields to it): it reads the event after the second stream joins, as a
        // reader on a new master reads again what was logged there before it noticed.
        store
            .append_event(&event("ws_a", Environment::Live, 0))
            .await
            .unwrap();
        let mut second = hub
            .join(selection("ws_a", Environment::Live))
            .await
            .unwrap();
        store
            .append_event(&event("ws_a", Environment::Live, 1))
            .await
            .unwrap();
        let wait = Duration::from_millis(300);
        assert_eq!(numbers(&mut first, wait).await, [0, 1]);
        assert_eq!(numbers(&mut second, wait).await, [1]);
    }

    #[tokio::test]
    async fn the_reader_stops_with_the_last_stream_and_starts_with_the_next() {
        let store = Arc::new(MemoryStore::new());
        let hub = EventHub::new(store.clone());
        let first = hub
            .join(selection("ws_a", Environment::Live))
            .await
            .unwrap();
        assert!(hub.state().reading);
        drop(first);
        assert_eq!(hub.streams(), 0);
        // It notices within one wait for events.
        let stopped = async {
            while hub.state().reading {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(BLOCK * 3, stopped).await.unwrap();
        // An event logged while nothing read is not handed to a stream that opens later.
        store
            .append_event(&event("ws_a", Environment::Live, 1))
            .await
            .unwrap();
        let mut next = hub
            .join(selection("ws_a", Environment::Live))
            .await
            .unwrap();
        assert!(hub.state().reading);
        store
            .append_event(&event("ws_a", Environment::Live, 2))
            .await
            .unwrap();
        assert_eq!(numbers(&mut next, Duration::from_millis(300)).await, [2]);
    }

    #[tokio::test]
    async fn a_stream_that_falls_behind_is_dropped_and_the_others_go_on() {
        // Queues of 2 events.
        let store = Arc::new(MemoryStore::new());
        let hub = EventHub::with_queue(store.clone(), 2);
        let mut slow = hub
            .join(selection("ws_a", Environment::Live))
            .await
            .unwrap();
        let mut quick = hub
            .join(selection("ws_a", Environment::Live))
            .await
            .unwrap();
        let mut seen = Vec::new();
        for n in 0..5 {
            store
                .append_event(&event("ws_a", Environment::Live, n))
                .await
                .unwrap();
            // One batch each: the quick stream takes it before the next is logged.
            seen.extend(numbers(&mut quick, Duration::from_millis(150)).await);
        }
        assert_eq!(seen, [0, 1, 2, 3, 4]);
        assert_eq!(hub.streams(), 1);
        // The slow one gets what its queue held, at once, then the error.
        let held: Vec<_> = slow
            .next(BLOCK)
            .await
            .unwrap()
            .iter()
            .map(|e| e.data["n"].clone())
            .collect();
        assert_eq!(held, [0, 1]);
        let ended = slow.next(BLOCK).await.unwrap_err();
        assert!(ended.to_string().contains("fell behind"), "{ended}");
    }

    #[test]
    fn a_reader_dropped_before_it_runs_leaves_no_stream_waiting_on_it() {
        let hub = EventHub::new(Arc::new(MemoryStore::new()));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // `block_on` returns as `join` does, before the reader it spawned has run.
        let mut stream = runtime
            .block_on(hub.join(selection("ws_a", Environment::Live)))
            .unwrap();
        drop(runtime);
        assert!(!hub.state().reading);
        assert_eq!(hub.streams(), 0);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ended = runtime.block_on(stream.next(BLOCK)).unwrap_err();
        assert!(ended.to_string().contains("unreachable"), "{ended}");
        // The next stream starts a reader of its own.
        runtime.block_on(async {
            let _next = hub
                .join(selection("ws_a", Environment::Live))
                .await
                .unwrap();
            assert!(hub.state().reading);
        });
    }

    #[tokio::test]
    async fn a_queue_is_bounded_by_events_not_batches() {
        // One read that returns two events, for a stream whose queue holds one event: cut,
        // though it holds no batch yet.
        let store = Arc::new(MemoryStore::new());
        let hub = EventHub::with_queue(store.clone(), 1);
        let feed = store.tail_events().await.unwrap();
        for n in 0..2 {
            store
                .append_event(&event("ws_a", Environment::Live, n))
                .await
                .unwrap();
        }
        let (queue, mut events) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        {
            let mut state = hub.state();
            state.reading = true;
            state.add(Joined {
                selection: selection("ws_a", Environment::Live),
                floor: None,
                queue,
                queued,
            });
        }
        let running = Running {
            hub: hub.clone(),
            armed: true,
        };
        tokio::spawn(read(running, feed));
        let closed = tokio::time::timeout(BLOCK, events.recv()).await.unwrap();
        assert!(closed.is_none(), "cut without a batch: {closed:?}");
        assert_eq!(hub.streams(), 0);
    }
}
