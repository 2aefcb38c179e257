//! One reader of the event log per gateway, shared by its `svcgate listen` streams.
//!
//! The log holds every workspace's events. Read by each stream on its own, a thousand streams
//! would read every event a thousand times, each through a blocking Redis connection of its
//! own. The hub reads the log once, while at least one stream is open, and hands each stream
//! the events of its workspace and environment, shared, through a queue of its own.
//!
//! A stream starts with the events the hub reads after it joins: those logged from about the
//! moment it opened. A stream whose queue is full (its client has not taken
//! [`QUEUE_BATCHES`] batches) is dropped from the hub and ends with an error, rather than hold
//! the others back. When the log cannot be read, every stream gets the error and ends; the next
//! stream to open tries the store again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::error::ApiError;
use crate::events::Event;
use crate::keys::Environment;
use crate::store::{EventFeed, Store, StoreError};

/// Most events read from the log at once.
const BATCH: usize = 100;
/// Longest wait for new events before the hub looks whether any stream is still open.
const BLOCK: Duration = Duration::from_secs(2);
/// Batches a stream's queue holds before the stream is dropped for falling behind.
pub const QUEUE_BATCHES: usize = 1_024;

/// What a stream is handed: its events, oldest first, or why the log could not be read.
type Batch = Result<Vec<Arc<Event>>, StoreError>;

/// Which events a stream takes: one workspace's, in one environment.
type Selector = (Arc<str>, Environment);

/// The gateway's reader of the event log.
pub struct EventHub {
    store: Arc<dyn Store>,
    state: Mutex<State>,
    /// Batches a stream's queue holds ([`QUEUE_BATCHES`]).
    queue_batches: usize,
}

#[derive(Default)]
struct State {
    streams: HashMap<u64, Joined>,
    next_id: u64,
    /// A reader task is running (it stops when no stream is left).
    reading: bool,
}

/// A stream, as the hub knows it.
struct Joined {
    selector: Selector,
    queue: mpsc::Sender<Batch>,
}

impl EventHub {
    /// A hub over `store`'s event log; it reads only while a stream is open.
    pub fn new(store: Arc<dyn Store>) -> Arc<Self> {
        Self::with_queue(store, QUEUE_BATCHES)
    }

    /// A hub whose streams' queues hold `batches` batches.
    fn with_queue(store: Arc<dyn Store>, batches: usize) -> Arc<Self> {
        Arc::new(Self {
            store,
            state: Mutex::default(),
            queue_batches: batches,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins a stream for `workspace`'s events in `environment`. When nothing reads the log
    /// yet, the log is opened first, so a store that is down refuses the stream here, before
    /// its answer begins.
    pub async fn join(
        self: &Arc<Self>,
        workspace: Arc<str>,
        environment: Environment,
    ) -> Result<Subscription, StoreError> {
        let (mut state, start) = loop {
            let reading = self.state().reading;
            let feed = match reading {
                true => None,
                false => Some(self.store.tail_events().await?),
            };
            let state = self.state();
            match (feed, state.reading) {
                // A reader runs (another stream may have started it while this one opened
                // the log, whose feed is then not needed).
                (_, true) => break (state, None),
                (Some(feed), false) => break (state, Some(feed)),
                // The reader stopped, its last stream gone, after this one looked.
                (None, false) => continue,
            }
        };
        let (queue, events) = mpsc::channel(self.queue_batches);
        let id = state.next_id;
        state.next_id += 1;
        let selector = (workspace, environment);
        state.streams.insert(id, Joined { selector, queue });
        if let Some(feed) = start {
            state.reading = true;
            tokio::spawn(self.clone().read(feed));
        }
        Ok(Subscription {
            hub: self.clone(),
            id,
            events,
        })
    }

    /// Streams open.
    pub fn streams(&self) -> usize {
        self.state().streams.len()
    }

    /// Reads the log while any stream is open, handing each stream its events.
    async fn read(self: Arc<Self>, mut feed: Box<dyn EventFeed>) {
        loop {
            {
                let mut state = self.state();
                if state.streams.is_empty() {
                    state.reading = false;
                    return;
                }
            }
            let read = feed.next(BATCH, BLOCK).await;
            let mut state = self.state();
            let logged = match read {
                Ok(logged) => logged,
                Err(e) => {
                    tracing::warn!(error = %e, "event log unreadable; ending listen streams");
                    for (_, stream) in state.streams.drain() {
                        // A full queue has the stream dropped anyway: it ends either way.
                        let _ = stream.queue.try_send(Err(e.clone()));
                    }
                    state.reading = false;
                    return;
                }
            };
            if logged.is_empty() {
                continue;
            }
            let mut by_selector: HashMap<Selector, Vec<Arc<Event>>> = HashMap::new();
            for l in logged {
                let selector = (Arc::from(l.event.workspace.as_str()), l.event.environment);
                by_selector
                    .entry(selector)
                    .or_default()
                    .push(Arc::new(l.event));
            }
            state.streams.retain(|id, stream| {
                let Some(events) = by_selector.get(&stream.selector) else {
                    return true;
                };
                match stream.queue.try_send(Ok(events.clone())) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_)) => {
                        tracing::warn!(
                            stream = id,
                            "a listen stream fell behind the event log; ending it"
                        );
                        false
                    }
                    Err(TrySendError::Closed(_)) => false,
                }
            });
        }
    }
}

/// A stream's place in the hub; leaves it when dropped.
pub struct Subscription {
    hub: Arc<EventHub>,
    id: u64,
    events: mpsc::Receiver<Batch>,
}

impl Subscription {
    /// The stream's next events, oldest first, waiting up to `wait` (none: empty). A 503
    /// when the log could not be read, or the stream fell behind it.
    pub async fn next(&mut self, wait: Duration) -> Result<Vec<Arc<Event>>, ApiError> {
        match tokio::time::timeout(wait, self.events.recv()).await {
            Err(_elapsed) => Ok(Vec::new()),
            Ok(Some(batch)) => batch.map_err(ApiError::from),
            Ok(None) => Err(ApiError::ServiceUnavailable(
                "this stream fell behind the event log; reconnect".into(),
            )),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.state().streams.remove(&self.id);
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
    async fn each_stream_gets_its_workspace_and_environment_from_one_reader() {
        let store = Arc::new(MemoryStore::new());
        let hub = EventHub::new(store.clone());
        let mut a_live = hub.join("ws_a".into(), Environment::Live).await.unwrap();
        let mut a_test = hub.join("ws_a".into(), Environment::Test).await.unwrap();
        let mut b_live = hub.join("ws_b".into(), Environment::Live).await.unwrap();
        assert_eq!(hub.streams(), 3);
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
        let wait = Duration::from_millis(300);
        assert_eq!(numbers(&mut a_live, wait).await, [0, 3]);
        assert_eq!(numbers(&mut a_test, wait).await, [2]);
        assert_eq!(numbers(&mut b_live, wait).await, [1]);
    }

    #[tokio::test]
    async fn the_reader_stops_with_the_last_stream_and_starts_with_the_next() {
        let store = Arc::new(MemoryStore::new());
        let hub = EventHub::new(store.clone());
        let first = hub.join("ws_a".into(), Environment::Live).await.unwrap();
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
        let mut next = hub.join("ws_a".into(), Environment::Live).await.unwrap();
        assert!(hub.state().reading);
        store
            .append_event(&event("ws_a", Environment::Live, 2))
            .await
            .unwrap();
        assert_eq!(numbers(&mut next, Duration::from_millis(300)).await, [2]);
    }

    #[tokio::test]
    async fn a_stream_that_falls_behind_is_dropped_and_the_others_go_on() {
        let store = Arc::new(MemoryStore::new());
        let hub = EventHub::with_queue(store.clone(), 2);
        let mut slow = hub.join("ws_a".into(), Environment::Live).await.unwrap();
        let mut quick = hub.join("ws_a".into(), Environment::Live).await.unwrap();
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
        // The slow one gets what its queue held, then the error.
        assert_eq!(slow.next(BLOCK).await.unwrap()[0].data["n"], 0);
        assert_eq!(slow.next(BLOCK).await.unwrap()[0].data["n"], 1);
        let ended = slow.next(BLOCK).await.unwrap_err();
        assert!(ended.to_string().contains("fell behind"), "{ended}");
    }
}
