//! The event log in Redis.
//!
//! ## The event log: `{ns}:events`
//!
//! A stream. Backends may add events to it directly:
//!
//! ```text
//! XADD {svcgate}:events * type agent.run.completed workspace ws_123 data '{"run_id":"run_1"}'
//! ```
//!
//! Fields: `type` (an event name), `workspace` and `data` (a JSON object) are required; `id`
//! (`evt_…`; default: derived from the entry id), `created` (unix seconds; default: the entry's
//! time) and `environment` (`live` or `test`; default `live`) are optional. An entry that does
//! not parse is acknowledged, logged and skipped.

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamId;
use redis::{AsyncCommands, Script};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use super::connection::Connections;
use super::*;
use crate::events::{log_position, Event, LoggedEvent, RETENTION_SECS};
use crate::store::{EventFeed, EventLog, StoreError};

#[async_trait]
impl EventLog for RedisStore {
    async fn append_event(&self, event: &Event) -> Result<(), StoreError> {
        let min_id = crate::ids::unix_now().saturating_sub(crate::events::RETENTION_SECS) * 1000;
        let mut xadd = redis::cmd("XADD");
        xadd.arg(self.layout.events())
            .arg("MINID")
            .arg("~")
            .arg(min_id)
            .arg("*")
            .arg("id")
            .arg(&event.id)
            .arg("type")
            .arg(&event.event_type)
            .arg("created")
            .arg(event.created)
            .arg("workspace")
            .arg(&event.workspace)
            .arg("environment")
            .arg(event.environment.as_str())
            .arg("data")
            .arg(event.data.to_string());
        if let Some(traceparent) = &event.traceparent {
            xadd.arg("traceparent").arg(traceparent);
        }
        xadd.query_async::<String>(&mut self.conn())
            .await
            .map(|_| ())
            .map_err(unavailable)
    }

    async fn tail_events(&self) -> Result<Box<dyn EventFeed>, StoreError> {
        self.tail().await
    }

    async fn event_log_floor(&self) -> Result<Option<String>, StoreError> {
        self.log_floor().await
    }

    async fn consume_events(
        &self,
        consumer: &str,
        reclaim_after: Duration,
    ) -> Result<Box<dyn EventFeed>, StoreError> {
        self.consume(consumer, reclaim_after).await
    }
}

/// The workers' consumer group on the event log.
pub(super) const GROUP: &str = "webhooks";

/// Reads an event from a log entry. A field the event reads that is there but not UTF-8 makes
/// the entry malformed: taken for absent, a `data` of raw bytes would go out as `{}`.
pub(super) fn parse(entry: &StreamId) -> Result<Event, String> {
    let not_utf8 = std::cell::OnceCell::new();
    let event = Event::from_log_entry(&entry.id, |name| match entry.map.get(name) {
        Some(redis::Value::BulkString(bytes)) => {
            let text = std::str::from_utf8(bytes).ok();
            if text.is_none() {
                not_utf8.get_or_init(|| name.to_string());
            }
            text
        }
        Some(redis::Value::SimpleString(s)) => Some(s.as_str()),
        _ => None,
    });
    match not_utf8.into_inner() {
        Some(name) => Err(format!("the '{name}' field is not UTF-8")),
        None => event,
    }
}

/// A connection of its own to where the store's connections go now, without a response
/// timeout: for blocking reads.
pub(super) async fn blocking_connection(
    connections: &Connections,
) -> Result<MultiplexedConnection, StoreError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(None);
    connections
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(unavailable)
}

/// Follows the log from a position, without a group.
pub(super) struct Tail {
    pub(super) conn: MultiplexedConnection,
    pub(super) key: String,
    pub(super) after: String,
    /// Where the store's connections go, and news of the master moving (Sentinel): the read
    /// goes on from the new master ([`Resume`]). (A failover ends a blocked read on
    /// the old master, but an old master cut off from the Sentinels and still reachable
    /// would otherwise keep it waiting for events that are logged elsewhere.)
    pub(super) connections: std::sync::Weak<Connections>,
    pub(super) moved: tokio::sync::watch::Receiver<u64>,
    pub(super) resume: Resume,
}

/// What a tail needs to read on from a new master without skipping or repeating events.
pub(super) struct Resume {
    /// Where the tail started: it never reads back past it (its streams see only what is
    /// logged after they opened). The later of the newest entry then and the log's clock
    /// then, less [`RESUME_CLOCK_ALLOWANCE_MS`]: in a quiet log the newest entry may be long
    /// before.
    pub(super) start: String,
    /// The entries read in the last [`RESUME_MARGIN_MS`] of the log (id, its ms), at most
    /// [`RESUME_REMEMBERED`].
    pub(super) recent: std::collections::VecDeque<(String, u64)>,
    /// The newest entry let go of for room (in a busy log) rather than age: a read again
    /// after a move starts past it, so nothing is handed out twice.
    pub(super) forgotten: Option<String>,
    /// After a move, the entries read before it: not handed out again (until the read is
    /// past the furthest it had been).
    pub(super) again: std::collections::HashSet<String>,
    pub(super) again_until: (u64, u64),
}

impl Resume {
    /// For a tail that opened after entry `newest`, when the log's clock read `opened_ms`.
    pub(super) fn new(newest: &str, opened_ms: u64) -> Self {
        let before = clock_floor(opened_ms);
        let start = if opened_ms > RESUME_CLOCK_ALLOWANCE_MS && entry_position(newest) < before {
            format!("{}-{}", before.0, before.1)
        } else {
            newest.to_string()
        };
        Self {
            start,
            recent: std::collections::VecDeque::new(),
            forgotten: None,
            again: std::collections::HashSet::new(),
            again_until: (0, 0),
        }
    }

    /// Keeps `id`, just read, among the entries read in the last [`RESUME_MARGIN_MS`].
    pub(super) fn read(&mut self, id: &str) {
        let (ms, _) = entry_position(id);
        self.recent.push_back((id.to_string(), ms));
        while self
            .recent
            .front()
            .is_some_and(|(_, old)| old.saturating_add(RESUME_MARGIN_MS) < ms)
        {
            self.recent.pop_front();
        }
        while self.recent.len() > RESUME_REMEMBERED {
            self.forgotten = self.recent.pop_front().map(|(id, _)| id);
        }
    }

    /// On a new master, where a read that was at `after` goes on from: [`RESUME_MARGIN_MS`]
    /// back from the furthest it had been (a second move may come before the read is back
    /// there), but not past where the tail started or the entries it no longer remembers.
    pub(super) fn restart(&mut self, after: &str) -> String {
        self.again_until = self.again_until.max(entry_position(after));
        self.again = self.recent.iter().map(|(id, _)| id.clone()).collect();
        let from = (self.again_until.0.saturating_sub(RESUME_MARGIN_MS), 0);
        let floor = match &self.forgotten {
            Some(forgotten) if entry_position(forgotten) > entry_position(&self.start) => forgotten,
            _ => &self.start,
        };
        if from <= entry_position(floor) {
            return floor.clone();
        }
        format!("{}-0", from.0)
    }

    /// Whether entry `id` was read before a move, and is read again after it.
    pub(super) fn read_before(&mut self, id: &str) -> bool {
        if self.again.is_empty() {
            return false;
        }
        if entry_position(id) > self.again_until {
            self.again.clear();
            return false;
        }
        self.again.remove(id)
    }
}

/// Most entries a tail remembers for reading again after a move: in a log busier than this in
/// [`RESUME_MARGIN_MS`], the read again covers less of the margin.
pub(super) const RESUME_REMEMBERED: usize = 10_000;

/// How far back a tail reads again on a new master. Replicas notice a move each on its own
/// poll of the Sentinels (every second), so in the meantime some log on the new master while
/// this one's position moves on with what is logged on the old: events the new master took
/// in that window would be skipped.
pub(super) const RESUME_MARGIN_MS: u64 = 5_000;

/// How far a new master's clock may run behind the old one's without a tail skipping what was
/// logged there after it opened: it reads again no further back than this before its opening.
pub(super) const RESUME_CLOCK_ALLOWANCE_MS: u64 = 500;

/// A stream entry id (`<ms>-<seq>`) as numbers, in the log's order (Redis gives no other).
pub(super) fn entry_position(id: &str) -> (u64, u64) {
    log_position(id).unwrap_or((0, 0))
}

/// The last position [`RESUME_CLOCK_ALLOWANCE_MS`] before the log's clock read `now_ms`:
/// what is logged from then on comes after it, on this master or a new one whose clock runs
/// up to that much behind.
pub(super) fn clock_floor(now_ms: u64) -> (u64, u64) {
    let floor_ms = now_ms.saturating_sub(RESUME_CLOCK_ALLOWANCE_MS);
    (floor_ms.saturating_sub(1), u64::MAX)
}

impl Tail {
    /// Reads on from where the store's connections go now, [`RESUME_MARGIN_MS`] back.
    pub(super) async fn reconnect(&mut self) -> Result<(), StoreError> {
        let connections = self
            .connections
            .upgrade()
            .ok_or_else(|| StoreError::Unavailable("the store is closed".into()))?;
        self.moved.borrow_and_update();
        match blocking_connection(&connections).await {
            Ok(conn) => self.conn = conn,
            Err(e) => {
                // Still to do, if the read goes on.
                self.moved.mark_changed();
                return Err(e);
            }
        }
        self.after = self.resume.restart(&self.after);
        Ok(())
    }
}

#[async_trait]
impl EventFeed for Tail {
    async fn next(&mut self, max: usize, block: Duration) -> Result<Vec<LoggedEvent>, StoreError> {
        if self.moved.has_changed().unwrap_or(false) {
            self.reconnect().await?;
        }
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(&self.after);
        let reply: redis::Value = tokio::select! {
            reply = read.query_async(&mut self.conn) => reply.map_err(unavailable)?,
            Ok(()) = self.moved.changed() => {
                self.reconnect().await?;
                return Ok(Vec::new());
            }
        };
        let mut out = Vec::new();
        for entry in super::streams::read(reply)? {
            self.after.clone_from(&entry.id);
            if self.resume.read_before(&entry.id) {
                continue;
            }
            self.resume.read(&entry.id);
            if let Ok(event) = parse(&entry) {
                out.push(LoggedEvent {
                    position: entry.id,
                    event,
                });
            }
        }
        Ok(out)
    }
}

/// A member of the workers' consumer group.
pub(super) struct Group {
    pub(super) conn: MultiplexedConnection,
    pub(super) key: String,
    pub(super) cursor: String,
    pub(super) consumer: String,
    pub(super) reclaim_after: Duration,
    pub(super) next_reclaim: Instant,
    pub(super) next_trim: Instant,
    /// News of the store's connections being replaced (the master moved, or they were
    /// reopened): the group is read through a feed the worker opens again ([`reconnected`]),
    /// from the next call on.
    pub(super) moved: tokio::sync::watch::Receiver<u64>,
}

/// The error that ends a feed whose connection the store replaced: one to a master the
/// Sentinels no longer name (a failover ends a blocked read on the old master, but one cut off
/// from the Sentinels and still reachable would otherwise be read for events that are logged
/// elsewhere), or one reopened after Redis stopped answering.
pub(super) fn reconnected() -> StoreError {
    StoreError::Reconnected
}

/// How often a consumer trims the log to its retention. Every writer that goes through the
/// store trims too; this covers entries written by scripts and by backends.
pub(super) const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Removes consumers of the group that have nothing pending and have been idle longer than
/// ARGV[2] ms (workers that are gone: each worker names itself anew when it starts), except
/// ARGV[1]. Atomic, so a consumer that takes an entry meanwhile keeps it. KEYS: the event log.
pub(super) static DROP_IDLE_CONSUMERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            format!("local GROUP = '{GROUP}'\n").as_str(),
            include_str!("scripts/drop_idle_consumers.lua"),
        ]
        .concat(),
    )
});

impl Group {
    /// Drops consumers of workers that are gone (see [`DROP_IDLE_CONSUMERS`]): idle for more
    /// than four leases, which a live worker, reading every second, never is.
    pub(super) async fn drop_idle_consumers(&mut self) -> Result<(), StoreError> {
        let idle = self.reclaim_after * 4;
        let dropped: i64 = DROP_IDLE_CONSUMERS
            .key(&self.key)
            .arg(&self.consumer)
            .arg(idle.as_millis() as u64)
            .invoke_async(&mut self.conn)
            .await
            .map_err(unavailable)?;
        if dropped > 0 {
            tracing::info!(
                dropped,
                "removed idle webhook consumers of workers that are gone"
            );
        }
        Ok(())
    }

    /// Drops log entries past the retention window.
    pub(super) async fn trim(&mut self) -> Result<(), StoreError> {
        let min_id = crate::ids::unix_now().saturating_sub(RETENTION_SECS) * 1000;
        // Exact, not `~`: an approximate trim keeps whole nodes, so a small log would keep
        // expired entries indefinitely. Once a minute, the cost is the entries removed.
        redis::cmd("XTRIM")
            .arg(&self.key)
            .arg("MINID")
            .arg(min_id)
            .query_async::<i64>(&mut self.conn)
            .await
            .map(drop)
            .map_err(unavailable)
    }

    /// Creates the group if it is missing: at the cursor (every entry up to it is fanned out),
    /// if Redis still knows it, else at the start of the log, so nothing logged before any
    /// worker ran is lost. Entries past the cursor that were fanned out already are read again
    /// and queue nothing new.
    pub(super) async fn create(&mut self) -> Result<(), StoreError> {
        let cursor: Option<String> = self.conn.get(&self.cursor).await.map_err(unavailable)?;
        let start = cursor.unwrap_or_else(|| "0".to_string());
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.key)
            .arg(GROUP)
            .arg(&start)
            .arg("MKSTREAM")
            .query_async(&mut self.conn)
            .await;
        match created {
            Err(e) if e.code() != Some("BUSYGROUP") => Err(unavailable(e)),
            _ => Ok(()),
        }
    }

    /// Takes over entries that another consumer took and did not finish in time.
    pub(super) async fn reclaim(&mut self, max: usize) -> Result<Vec<StreamId>, StoreError> {
        let mut start = "0-0".to_string();
        let mut out = Vec::new();
        loop {
            let reply: redis::Value = redis::cmd("XAUTOCLAIM")
                .arg(&self.key)
                .arg(GROUP)
                .arg(&self.consumer)
                .arg(self.reclaim_after.as_millis() as u64)
                .arg(&start)
                .arg("COUNT")
                .arg(max)
                .query_async(&mut self.conn)
                .await
                .map_err(unavailable)?;
            let (next, claimed) = super::streams::autoclaim(reply)?;
            out.extend(claimed);
            if out.len() >= max || next == "0-0" {
                return Ok(out);
            }
            start = next;
        }
    }

    /// New entries for this consumer, as Redis sent them; the group created again if Redis
    /// lost it.
    pub(super) async fn read_or_recreate(
        &mut self,
        max: usize,
        block: Duration,
    ) -> Result<redis::Value, StoreError> {
        match self.read(max, block).await {
            Err(e) if e.code() == Some("NOGROUP") => {
                tracing::warn!("the webhook consumer group was lost; recreating it");
                self.create().await?;
                self.read(max, block).await.map_err(unavailable)
            }
            other => other.map_err(unavailable),
        }
    }

    /// New entries for this consumer, as Redis sent them (read with [`super::streams::read`]).
    pub(super) async fn read(
        &mut self,
        max: usize,
        block: Duration,
    ) -> redis::RedisResult<redis::Value> {
        redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(">")
            .query_async(&mut self.conn)
            .await
    }
}

#[async_trait]
impl EventFeed for Group {
    async fn next(&mut self, max: usize, block: Duration) -> Result<Vec<LoggedEvent>, StoreError> {
        if self.moved.has_changed().unwrap_or(false) {
            return Err(reconnected());
        }
        if Instant::now() >= self.next_trim {
            self.next_trim = Instant::now() + TRIM_EVERY;
            self.trim().await?;
            // Housekeeping: a group Redis lost is recreated by the read below.
            if let Err(e) = self.drop_idle_consumers().await {
                tracing::debug!(error = %e, "could not look for idle webhook consumers");
            }
        }
        let mut entries = Vec::new();
        if Instant::now() >= self.next_reclaim {
            self.next_reclaim =
                Instant::now() + (self.reclaim_after / 4).max(Duration::from_secs(1));
            entries = self.reclaim(max).await?;
            if !entries.is_empty() {
                tracing::warn!(
                    entries = entries.len(),
                    "took over events another worker did not finish"
                );
            }
        }
        if entries.is_empty() {
            // Not cut short by a move (the entries of a read answered meanwhile would wait out
            // a lease, pending under this consumer): the next call sees it, within a `block`.
            let reply = self.read_or_recreate(max, block).await?;
            entries = super::streams::read(reply)?;
        }
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            match parse(&entry) {
                Ok(event) => out.push(LoggedEvent {
                    position: entry.id,
                    event,
                }),
                Err(why) => {
                    tracing::warn!(entry = %entry.id, %why, "skipping a malformed event-log entry");
                    redis::cmd("XACK")
                        .arg(&self.key)
                        .arg(GROUP)
                        .arg(&entry.id)
                        .query_async::<i64>(&mut self.conn)
                        .await
                        .map_err(unavailable)?;
                }
            }
        }
        Ok(out)
    }
}

impl RedisStore {
    /// The log's clock (Redis `TIME`), in unix milliseconds: Redis gives the entries logged from
    /// then on ids at or past it, and never lower than the last.
    pub(super) async fn log_clock_ms(&self) -> Result<u64, StoreError> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(secs.saturating_mul(1000) + micros / 1000)
    }

    pub(super) async fn tail(&self) -> Result<Box<dyn EventFeed>, StoreError> {
        let key = self.layout.events();
        // The log's clock, read before its newest entry.
        let opened_ms = self.log_clock_ms().await?;
        let newest = self.stream_range("XREVRANGE", &key, "+", "-", 1).await?;
        let after = newest
            .first()
            .map_or_else(|| "0-0".to_string(), |e| e.id.clone());
        // News of a move is subscribed to before the connection is made: a move while it is
        // made is then seen, and the read goes to the new master.
        let moved = self.connections.moved();
        Ok(Box::new(Tail {
            conn: self.blocking_connection().await?,
            key,
            resume: Resume::new(&after, opened_ms),
            after,
            connections: std::sync::Arc::downgrade(&self.connections),
            moved,
        }))
    }

    /// [`crate::store::EventLog::event_log_floor`]: from the log's clock, as a tail's own floor
    /// ([`Resume`]), not from its newest entry (which the master a gateway still reads may not
    /// have, after a move).
    pub(super) async fn log_floor(&self) -> Result<Option<String>, StoreError> {
        let (ms, seq) = clock_floor(self.log_clock_ms().await?);
        Ok(Some(format!("{ms}-{seq}")))
    }

    pub(super) async fn consume(
        &self,
        consumer: &str,
        reclaim_after: Duration,
    ) -> Result<Box<dyn EventFeed>, StoreError> {
        // As for a tail: subscribed to before the connection is made.
        let moved = self.connections.moved();
        let mut group = Group {
            conn: self.blocking_connection().await?,
            key: self.layout.events(),
            cursor: format!("{}:wh:cursor", self.prefix()),
            consumer: consumer.to_string(),
            reclaim_after,
            next_reclaim: Instant::now(),
            next_trim: Instant::now(),
            moved,
        };
        group.create().await?;
        Ok(Box::new(group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_on_a_new_master_reads_the_margin_again_and_hands_out_only_what_it_missed() {
        let mut resume = Resume::new("500-0", 0);
        for id in ["1000-0", "7000-0", "9000-0", "9000-1"] {
            assert!(!resume.read_before(id));
            resume.read(id);
        }
        // Older than the margin before the newest: forgotten.
        assert_eq!(resume.recent.len(), 3);
        assert_eq!(resume.restart("9000-1"), "4000-0");
        // The new master holds what the old one had, and what other replicas logged on it
        // before this one moved (8000-0), which is handed out.
        let handed: Vec<&str> = ["7000-0", "8000-0", "9000-0", "9000-1", "9500-0"]
            .into_iter()
            .filter(|id| !resume.read_before(id))
            .collect();
        assert_eq!(handed, ["8000-0", "9500-0"]);
        assert!(resume.again.is_empty());
        // Never back past where the tail started: its streams see only what came after.
        assert_eq!(Resume::new("2000-3", 0).restart("3000-5"), "2000-3");
    }

    #[test]
    fn a_tail_that_opened_on_a_quiet_log_reads_again_no_further_back_than_its_opening() {
        // The newest entry was long before the tail opened, at 8000 by the log's clock.
        let mut resume = Resume::new("500-0", 8_000);
        resume.read("9000-0");
        let after = resume.restart("9000-0");
        assert_eq!(after, format!("7499-{}", u64::MAX));
        // What a new master's clock, up to the allowance behind, gives an entry logged after
        // the tail opened is still read.
        assert!(entry_position("7500-0") > entry_position(&after));
        // A newest entry later than that is the start itself.
        assert_eq!(Resume::new("7800-2", 8_000).restart("9000-0"), "7800-2");
    }

    #[test]
    fn a_second_move_before_the_tail_caught_up_hands_out_nothing_twice() {
        let read = |resume: &mut Resume, ids: &[&'static str]| -> Vec<&'static str> {
            let handed: Vec<&str> = ids
                .iter()
                .copied()
                .filter(|id| !resume.read_before(id))
                .collect();
            for id in &handed {
                resume.read(id);
            }
            handed
        };
        for partial in [&[][..], &["7000-0"][..]] {
            let mut resume = Resume::new("500-0", 0);
            read(&mut resume, &["1000-0", "7000-0", "9000-0", "9000-1"]);
            let after = resume.restart("9000-1");
            assert_eq!(after, "4000-0");
            let mut handed = read(&mut resume, partial);
            let at = partial.last().copied().unwrap_or(&after);
            assert_eq!(
                resume.restart(at),
                "4000-0",
                "from the furthest it had been"
            );
            handed.extend(read(
                &mut resume,
                &["7000-0", "8000-0", "9000-0", "9000-1", "9500-0"],
            ));
            assert_eq!(handed, ["8000-0", "9500-0"]);
        }
    }

    #[test]
    fn in_a_busy_log_a_tail_reads_again_only_what_it_remembers() {
        let mut resume = Resume::new("0-0", 0);
        let ids: Vec<String> = (0..RESUME_REMEMBERED + 5)
            .map(|seq| format!("9000-{seq}"))
            .collect();
        for id in &ids {
            resume.read(id);
        }
        let last = ids.last().unwrap();
        // From past the newest entry let go of, all of the rest remembered and not handed out.
        assert_eq!(resume.restart(last), "9000-4");
        assert!(ids[5..].iter().all(|id| resume.read_before(id)));
    }

    fn entry(fields: &[(&str, &[u8])]) -> StreamId {
        StreamId {
            id: "1764115200123-0".into(),
            map: fields
                .iter()
                .map(|(k, v)| (k.to_string(), redis::Value::BulkString(v.to_vec())))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_field_that_is_not_utf8_makes_the_entry_malformed() {
        let good = entry(&[
            ("type", b"image.batch.completed"),
            ("workspace", b"ws_1"),
            ("data", br#"{"batch_id":"b"}"#),
        ]);
        assert_eq!(parse(&good).unwrap().data["batch_id"], "b");
        for (name, bad) in [
            ("data", &b"{\"x\":\"\xff\"}"[..]),
            ("workspace", b"ws_\xfe"),
        ] {
            let mut fields = vec![
                ("type", &b"image.batch.completed"[..]),
                ("workspace", b"ws_1"),
                ("data", b"{}"),
            ];
            fields.retain(|(k, _)| *k != name);
            fields.push((name, bad));
            let why = parse(&entry(&fields)).unwrap_err();
            assert_eq!(why, format!("the '{name}' field is not UTF-8"));
        }
    }
}
