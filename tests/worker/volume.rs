//! Large events and long replays: memory held, and a store that stops part way.

use super::*;

/// Writes `n` events of `workspace` with `size` bytes of data straight to the event log
/// `stream`, created at `created` (unix seconds; by default when logged), all at once.
async fn log_events(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    workspace: &str,
    (n, size): (usize, usize),
    created: Option<u64>,
) {
    let data = json!({"blob": "x".repeat(size)}).to_string();
    let mut pipe = redis::pipe();
    pipe.atomic();
    for _ in 0..n {
        let add = pipe
            .cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("type")
            .arg("agent.run.completed")
            .arg("workspace")
            .arg(workspace)
            .arg("data")
            .arg(&data);
        if let Some(created) = created {
            add.arg("created").arg(created);
        }
        add.ignore();
    }
    pipe.query_async::<()>(conn).await.unwrap();
}

/// Waits until the worker has taken `n` events and indexed them for replay in `index`.
async fn wait_indexed(conn: &redis::aio::MultiplexedConnection, index: &str, n: usize) {
    let indexed = eventually(Duration::from_secs(60), || {
        let mut conn = conn.clone();
        async move {
            let indexed: usize = redis::cmd("ZCARD")
                .arg(index)
                .query_async(&mut conn)
                .await
                .unwrap();
            indexed == n
        }
    })
    .await;
    assert!(indexed.is_some(), "the worker indexed every event");
}

/// The process's resident memory now and at its peak since [`reset_peak_memory`], in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Starts a process's peak resident memory again from what it holds now.
fn reset_peak_memory(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

/// The worker takes large events from the log, a replay reads and queues them, and a listing
/// of their deliveries reads their records, a few at a time: none holds all the payloads at
/// once. Here 600 events of 100 KB (60 MB) are logged at once, replayed and their deliveries
/// listed; the gateway's peak memory grows by far less than the payloads: about 18 MB for the
/// intake, 19 MB for the replay, 2 MB for the listing. (An intake reading 512 entries at
/// once grows it by 118 MB, and 32 at once by 38 MB; a replay that reads and queues all at
/// once, by 321 MB, and with 400 events of 200 KB takes the store so long that it fails as
/// unreachable, a 503; a listing read whole, by 61 MB.)
#[tokio::test]
async fn taking_replaying_and_listing_large_events_hold_a_few_payloads_at_a_time() {
    const EVENTS: usize = 600;
    const SIZE: usize = 100_000;
    let s = setup(&[60], 10, false).await;
    let since = svcgate::ids::unix_now();
    let pid = s.gw.pid();
    let payloads = (EVENTS * SIZE) as u64;
    // Straight to the event log, as a backend may write them: quicker than the admin API; all
    // at once, a backlog for the worker.
    let (mut conn, stream) = event_log(&s).await;
    let index = format!("{{{}}}:wh:replay:{}:live", s._ns.name, s.ws);
    reset_peak_memory(pid);
    let (before, _) = memory(pid);
    // Taken and indexed with no endpoint yet: nothing is delivered.
    log_events(&mut conn, &stream, &s.ws, (EVENTS, SIZE), None).await;
    wait_indexed(&conn, &index, EVENTS).await;
    let (_, peak) = memory(pid);
    let grew = peak.saturating_sub(before);
    assert!(
        grew < payloads / 2,
        "taking {payloads} bytes of payloads from the log took {grew} bytes more at its peak"
    );
    let receiver = Receiver::start().await;
    let (id, _) = endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;

    reset_peak_memory(pid);
    let (before, _) = memory(pid);
    let resp = replay(&s, &id, json!({"since": since})).await;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["replayed"], EVENTS, "{body}");
    assert_eq!(body["truncated"], false, "{body}");
    let (_, peak) = memory(pid);
    let grew = peak.saturating_sub(before);
    assert!(
        grew < payloads / 2,
        "a replay of {payloads} bytes of payloads took {grew} bytes more at its peak"
    );

    reset_peak_memory(pid);
    let (before, _) = memory(pid);
    let path = format!("/v1/webhooks/{id}/deliveries?limit=1000");
    let resp = call(&s.gw, &s.key, Method::GET, &path, None).await;
    assert_eq!(resp.status(), 200);
    let listed: Value = resp.json().await.unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), EVENTS);
    let (_, peak) = memory(pid);
    let grew = peak.saturating_sub(before);
    assert!(
        grew < payloads / 2,
        "a listing of {payloads} bytes of payloads took {grew} bytes more at its peak"
    );
    // The replayed deliveries go out.
    received(&receiver, "/hook", 1, Duration::from_secs(10)).await;
}

/// A replay the store stops taking part way through answers what it queued, cut short, with
/// the `next` that goes on from there; once the store takes writes again, that `next` replays
/// the rest, and between the two every event is replayed once.
#[tokio::test]
async fn a_replay_the_store_stops_taking_part_way_answers_what_it_queued_and_where_to_go_on() {
    const EVENTS: usize = 200;
    let redis = RedisServer::start().await;
    let outbox = tempfile::tempdir().unwrap();
    let gw = Gateway::builder()
        .redis(&redis.url(), "replay")
        .config(webhooks(outbox.path(), &[60], 10))
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw.create_key_in(&ws, "live", SCOPES).await;
    let since = svcgate::ids::unix_now();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // Small events, but for one of 200 KB past the first few steps (replays go by `created`).
    let log = "{replay}:events";
    log_events(&mut conn, log, &ws, (30, 1_000), Some(since)).await;
    log_events(&mut conn, log, &ws, (1, 200_000), Some(since + 1)).await;
    log_events(&mut conn, log, &ws, (EVENTS - 31, 1_000), Some(since + 2)).await;
    wait_indexed(&conn, &format!("{{replay}}:wh:replay:{ws}:live"), EVENTS).await;
    let receiver = Receiver::start().await;
    let (id, _) = endpoint(&gw, &key, &receiver.url("/hook"), &["agent.run.*"]).await;
    let path = format!("/v1/webhooks/{id}/replay");

    // Redis refuses writes past a little more memory than it uses now: room for the small
    // steps (their deliveries are kept without the payload, and their events' records are
    // written again as they were), not for the step that carries the large event's record.
    // (Here the first replay passed 1 to 3 small steps from 150 to 450 KB more, all of them
    // from 500 KB.) Memory is read as the least of readings over 1.5 s: after the large event
    // went in, Redis keeps a query buffer of its size on that connection until its cron,
    // which visits every client once a second, shrinks it; counted in, it can make room for
    // the large step too (as seen on CI).
    let mut used = u64::MAX;
    for _ in 0..15 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .unwrap();
        let now: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        used = used.min(now);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let set_max = |max: u64| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(max)
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
        }
    };
    set_max(used + 300_000).await;
    let resp = call(
        &gw,
        &key,
        Method::POST,
        &path,
        Some(json!({"since": since})),
    )
    .await;
    let status = resp.status();
    let first: Value = resp.json().await.unwrap();
    assert_eq!(status, 202, "{first}");
    let replayed = first["replayed"].as_u64().unwrap() as usize;
    assert!((1..=30).contains(&replayed), "{first}");
    assert_eq!(first["truncated"], true, "{first}");
    assert_eq!(first["next"]["since"], since, "{first}");
    assert!(gw.logs().contains("a replay stopped short"));

    set_max(0).await;
    let resp = call(&gw, &key, Method::POST, &path, Some(first["next"].clone())).await;
    let status = resp.status();
    let rest: Value = resp.json().await.unwrap();
    assert_eq!(status, 202, "{rest}");
    assert_eq!(rest["replayed"], EVENTS - replayed, "{rest}");
    assert_eq!(rest["truncated"], false, "{rest}");
    // Every event once, between the two.
    let resp = call(
        &gw,
        &key,
        Method::GET,
        &format!("/v1/webhooks/{id}/deliveries?limit=1000"),
        None,
    )
    .await;
    let listed: Value = resp.json().await.unwrap();
    let mut events: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["event_id"].as_str().unwrap())
        .collect();
    events.sort();
    events.dedup();
    assert_eq!(events.len(), EVENTS);
}
