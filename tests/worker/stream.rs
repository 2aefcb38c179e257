//! The event log as a stream: entries written by any producer, and its consumer group.

use super::*;

#[tokio::test]
async fn events_written_straight_to_the_stream_are_delivered_and_bad_entries_skipped() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["image.batch.*"]).await;
    let (mut conn, stream) = event_log(&s).await;
    let _ = append_raw(
        &mut conn,
        &stream,
        &[
            ("type", "no.such.event".as_bytes()),
            ("workspace", s.ws.as_bytes()),
        ],
    )
    .await;
    let entry = append_raw(
        &mut conn,
        &stream,
        &[
            ("type", "image.batch.completed".as_bytes()),
            ("workspace", s.ws.as_bytes()),
            ("data", r#"{"batch_id":"batch_1"}"#.as_bytes()),
        ],
    )
    .await;
    let got = received(&receiver, "/hook", 1, Duration::from_secs(10)).await;
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["data"]["batch_id"], "batch_1");
    assert_eq!(body["id"], format!("evt_{}", entry.replace('-', "x")));
    assert!(s.gw.logs().contains("malformed event-log entry"));
}

/// A backend's entry with a value the event reads that is not UTF-8 is skipped; a field whose
/// name is not UTF-8 is a field the event does not read, and ignored (failing the whole read
/// on it would leave the worker delivering nothing more).
#[tokio::test]
async fn an_entry_whose_data_is_not_utf8_is_skipped_and_a_name_that_is_not_ignored() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["image.batch.*"]).await;
    let (mut conn, stream) = event_log(&s).await;
    let bad = append_raw(
        &mut conn,
        &stream,
        &[
            ("type", "image.batch.completed".as_bytes()),
            ("workspace", s.ws.as_bytes()),
            ("data", &b"{\"batch_id\":\"\xff\xfe\"}"[..]),
        ],
    )
    .await;
    let () = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("type")
        .arg("image.batch.completed")
        .arg("workspace")
        .arg(&s.ws)
        .arg("data")
        .arg(r#"{"batch_id":"batch_odd"}"#)
        .arg(&b"\xff\xfe"[..])
        .arg("x")
        .query_async::<String>(&mut conn)
        .await
        .map(drop)
        .unwrap();
    let _ = append_raw(
        &mut conn,
        &stream,
        &[
            ("type", "image.batch.completed".as_bytes()),
            ("workspace", s.ws.as_bytes()),
            ("data", r#"{"batch_id":"batch_2"}"#.as_bytes()),
        ],
    )
    .await;

    // The valid events still go out, and the bad one never does, not even as `{}`.
    let got = received(&receiver, "/hook", 2, Duration::from_secs(10)).await;
    let mut batches: Vec<String> = got
        .iter()
        .map(|d| serde_json::from_slice::<Value>(&d.body).unwrap()["data"]["batch_id"].to_string())
        .collect();
    batches.sort();
    assert_eq!(batches, [r#""batch_2""#, r#""batch_odd""#]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received("/hook").len(), 2);

    // Skipped with a warning that names the entry, and acknowledged, so it is not pending.
    let logs = s.gw.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("skipping a malformed event-log entry") && l.contains(&bad)),
        "{logs}"
    );
    let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(&stream)
        .arg("webhooks")
        .arg("-")
        .arg("+")
        .arg(100)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pending.is_empty(), "{pending:?}");
}

#[tokio::test]
async fn a_worker_recreates_its_consumer_group_when_redis_lost_it() {
    let s = setup(&[60], 10, false).await;
    let receiver = Receiver::start().await;
    endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/hook", 1, Duration::from_secs(10)).await;

    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let destroyed: i64 = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(format!("{{{}}}:events", s._ns.name))
        .arg("webhooks")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(destroyed, 1);
    let after = publish(&s.gw, &s.ws, "agent.run.failed", "live").await;
    let got = received(&receiver, "/hook", 2, Duration::from_secs(10)).await;
    assert_eq!(header(&got[1], "service-event-id"), after);
    // Restarted where the workers left off: the first event is not delivered again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received("/hook").len(), 2);
}

/// Redis loses the group while an older batch is still pending (its fan-out failed) and a newer
/// one was fanned out: the group is recreated behind the older batch, which is delivered, and
/// the newer one is not delivered twice.
#[tokio::test]
async fn a_recreated_consumer_group_delivers_entries_that_were_pending_when_redis_lost_it() {
    let s = setup(&[60], 10, true).await;
    let receiver = Receiver::start().await;
    endpoint(&s.gw, &s.key, &receiver.url("/hook"), &["agent.run.*"]).await;
    let (mut conn, stream) = event_log(&s).await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("webhooks")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    // A worker takes A and stalls (its fan-out keeps failing): A stays pending.
    let a = publish(&s.gw, &s.ws, "agent.run.failed", "live").await;
    let taken: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("webhooks")
        .arg("stalled")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(taken.keys[0].ids.len(), 1);
    // Another worker fans B out (within A's lease, so it does not take A over).
    let _worker = s.gw.start_worker();
    let b = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/hook", 1, Duration::from_secs(10)).await;

    let destroyed: i64 = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(&stream)
        .arg("webhooks")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(destroyed, 1);
    let c = publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    received(&receiver, "/hook", 3, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ids = event_ids(&receiver, "/hook");
    let mut want = vec![a, b, c];
    want.sort();
    assert_eq!(ids, want, "A delivered after all, and each event once");
}

/// Appends an entry to the event log field by field, as any producer may; returns its id.
async fn append_raw(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    fields: &[(&str, &[u8])],
) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (name, value) in fields {
        cmd.arg(*name).arg(*value);
    }
    cmd.query_async(conn).await.unwrap()
}
