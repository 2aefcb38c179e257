//! The one reader of the event log a gateway's streams share, on a Redis of the test's own.

use super::*;

/// A listen stream read by hand: whole Server-Sent Events, keep-alive comments skipped.
struct Sse {
    resp: reqwest::Response,
    buffer: String,
}

impl Sse {
    async fn open(gw: &Gateway, key: &str) -> Self {
        Self::try_open(gw, key).await.expect("the stream opens")
    }

    /// Opens a stream and reads its opening event; the status if it is refused.
    async fn try_open(gw: &Gateway, key: &str) -> Result<Self, u16> {
        let resp = gw
            .request(Method::GET, "/v1/webhooks/listen")
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        if resp.status() != 200 {
            return Err(resp.status().as_u16());
        }
        let mut sse = Self {
            resp,
            buffer: String::new(),
        };
        let opening = sse.next(Duration::from_secs(5)).await.unwrap();
        assert!(opening.starts_with("event: session\n"), "{opening}");
        Ok(sse)
    }

    /// The next event within `wait`; `None` if none came.
    async fn next(&mut self, wait: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                if !event.starts_with(':') {
                    return Some(event);
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .ok()?;
            let chunk = chunk.unwrap().expect("the stream goes on");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

/// A gateway on a redis-server of the test's own (to count its clients and commands, or stop
/// it), with a workspace and a live key that may listen.
async fn on_own_redis(namespace: &str) -> (RedisServer, Gateway, String, String) {
    let redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), namespace)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", READ).await;
    (redis, gw, ws, key)
}

/// Connections of `redis` whose last command was `command` (a blocked read shows its command).
async fn clients_running(redis: &RedisServer, command: &str) -> usize {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    list.lines()
        .filter(|l| l.split(' ').any(|f| f == format!("cmd={command}")))
        .count()
}

#[tokio::test]
async fn a_gateways_streams_share_one_reader_of_the_log_and_all_end_when_it_fails() {
    let (mut redis, gw, ws, key) = on_own_redis("listen-hub").await;
    let other_ws = gw.create_workspace().await;
    let (_, other_key) = gw.create_key_in(&other_ws, "live", READ).await;
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(Sse::open(&gw, &key).await);
    }
    let mut other = Sse::open(&gw, &other_key).await;
    // One blocking read of the log for the four, not one held per stream.
    // (Polled: the reader's first read may still be on its way.)
    let one = eventually(Duration::from_secs(2), || async {
        clients_running(&redis, "xread").await == 1
    })
    .await;
    assert!(
        one.is_some(),
        "{} readers",
        clients_running(&redis, "xread").await
    );
    assert!(gw
        .metrics_text()
        .await
        .contains("\nsvcgate_listen_streams 4\n"));

    let id = trigger(&gw, &ws, "agent.run.completed", "live", payload("hub")).await;
    for stream in &mut mine {
        let event = stream
            .next(Duration::from_secs(5))
            .await
            .expect("the event");
        assert!(
            event.starts_with("event: delivery\n") && event.contains(&id),
            "{event}"
        );
    }
    assert_eq!(other.next(Duration::from_millis(500)).await, None);

    // The store goes away: every stream ends with the documented error body.
    redis.stop().await;
    for stream in mine.iter_mut().chain([&mut other]) {
        let event = stream
            .next(Duration::from_secs(10))
            .await
            .expect("an error event");
        assert!(event.starts_with("event: error\n"), "{event}");
        assert!(event.contains("service_unavailable"), "{event}");
    }
    let metrics = gw.metrics_text().await;
    assert!(
        metrics.contains("\nsvcgate_listen_streams 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("svcgate_listen_streams_cut_total{reason=\"log_unreadable\"} 4\n"),
        "{metrics}"
    );
    // A bad filter is a 400 whatever the store's state (checked before the store is asked).
    let bad = gw
        .request(Method::GET, "/v1/webhooks/listen?events=agent.run.nope")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_error(bad, 400, "invalid_request_error").await;
    // Back again, a new stream opens and gets what is logged from then on.
    redis.resume().await;
    let mut again = None;
    for _ in 0..50 {
        if let Ok(stream) = Sse::try_open(&gw, &key).await {
            again = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut again = again.expect("a stream opens once Redis is back");
    let id = trigger(&gw, &ws, "agent.run.completed", "live", payload("back")).await;
    let event = again.next(Duration::from_secs(5)).await.expect("the event");
    assert!(event.contains(&id), "{event}");
}

#[tokio::test]
async fn streams_end_when_the_store_stops_answering() {
    let (redis, gw, ws, key) = on_own_redis("listen-hang").await;
    let mut streams = vec![Sse::open(&gw, &key).await, Sse::open(&gw, &key).await];
    // A Redis that holds the connection and never answers: the read waits 2 s for events,
    // then 5 s more at most.
    redis.freeze();
    for stream in &mut streams {
        let event = stream.next(Duration::from_secs(15)).await;
        let event = event.expect("an error event, not keep-alives for ever");
        assert!(event.starts_with("event: error\n"), "{event}");
        assert!(event.contains("service_unavailable"), "{event}");
    }
    redis.thaw();
    // The next stream reads the log anew.
    let mut again = Sse::open(&gw, &key).await;
    let id = trigger(&gw, &ws, "agent.run.completed", "live", json!({})).await;
    let event = again.next(Duration::from_secs(5)).await.expect("the event");
    assert!(event.contains(&id), "{event}");
}

#[tokio::test]
async fn streams_that_open_together_open_the_log_once() {
    let (redis, gw, _, key) = on_own_redis("listen-together").await;
    let (_a, _b, _c, _d) = tokio::join!(
        Sse::open(&gw, &key),
        Sse::open(&gw, &key),
        Sse::open(&gw, &key),
        Sse::open(&gw, &key)
    );
    // Opening the log reads its newest entry once (`XREVRANGE`); only the first stream did.
    assert_eq!(redis.command_calls("xrevrange").await, 1);
}

/// The streams an event wakes each bring the key cache up to date before they send it (a
/// key may have been revoked in the step that logged it): together, in one read of the
/// store's change log, not one each (eight streams must not make eight reads).
#[tokio::test]
async fn streams_woken_together_catch_up_with_key_changes_in_one_read() {
    let (redis, gw, ws, key) = on_own_redis("listen-catch-up").await;
    let (_, other_key) = gw.create_key_in(&ws, "live", READ).await;
    let mut streams = Vec::new();
    for key in [&key, &other_key] {
        for _ in 0..4 {
            streams.push(Sse::open(&gw, key).await);
        }
    }
    // A read of the change log runs `XRANGE` on it twice (where the cache is, where the
    // store is) and once more if it changed; the cache also reads it every second.
    let before = redis.command_calls("xrange").await;
    let id = trigger(&gw, &ws, "agent.run.completed", "live", json!({})).await;
    for stream in &mut streams {
        let event = stream
            .next(Duration::from_secs(5))
            .await
            .expect("the event");
        assert!(event.contains(&id), "{event}");
    }
    let reads = redis.command_calls("xrange").await - before;
    assert!(reads <= 8, "{reads} XRANGEs for 8 streams");
}

/// A backend's entry with a field whose name is not UTF-8 (a field the event does not read)
/// reaches the streams: it must not fail the log's read, which would end every stream.
#[tokio::test]
async fn an_entry_with_a_field_name_that_is_not_utf8_does_not_stop_the_streams() {
    let (redis, gw, ws, key) = on_own_redis("listen-names").await;
    let mut stream = Sse::open(&gw, &key).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg("{listen-names}:events")
        .arg("*")
        .arg("type")
        .arg("image.batch.completed")
        .arg("workspace")
        .arg(&ws)
        .arg("data")
        .arg(r#"{"batch_id":"batch_odd"}"#)
        .arg(&b"\xff\xfe"[..])
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let after = trigger(&gw, &ws, "agent.run.completed", "live", payload("after")).await;
    let odd = stream
        .next(Duration::from_secs(5))
        .await
        .expect("the entry");
    assert!(odd.contains("batch_odd"), "{odd}");
    let next = stream
        .next(Duration::from_secs(5))
        .await
        .expect("the next event");
    assert!(next.contains(&after), "{next}");
}

/// A stream refused because the store did not answer in time may still be given its slot when
/// the store gets to the command: the slot is let go, not held for its 90 s lease.
#[tokio::test]
async fn a_slot_the_store_gives_after_the_stream_was_refused_is_let_go() {
    let (redis, gw, _, key) = on_own_redis("listen-late").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let slots_held = || {
        let mut conn = conn.clone();
        async move {
            let slots: Vec<String> = redis::cmd("KEYS")
                .arg("{listen-late}:listen:*")
                .query_async(&mut conn)
                .await
                .unwrap();
            !slots.is_empty()
        }
    };
    // A stream opened and closed: Redis has the slot's script (a script it lacks is sent
    // again after the `NOSCRIPT` answer, and a hold that timed out is not).
    drop(Sse::open(&gw, &key).await);
    let closed = eventually(Duration::from_secs(5), || async { !slots_held().await }).await;
    assert!(closed.is_some());
    let holds_before = redis.command_calls("zadd").await;
    redis.freeze();
    assert_eq!(Sse::try_open(&gw, &key).await.err(), Some(503));
    // Past the release's own timeout: it waits in the connection, behind the hold.
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.thaw();
    // The hold ran (its `ZADD`), and its slot is gone.
    let freed = eventually(Duration::from_secs(5), || async {
        redis.command_calls("zadd").await > holds_before && !slots_held().await
    })
    .await;
    assert!(freed.is_some(), "{}", gw.logs());
}
