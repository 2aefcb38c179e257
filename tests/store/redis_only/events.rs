//! The event log in Redis: consumer groups, retention, events kept by id alone.

use super::*;

/// Workers name themselves anew on each start: the consumers of those that are gone leave the
/// group once idle with nothing pending; one that still holds an entry stays until it is taken
/// over.
#[tokio::test]
async fn redis_consumers_of_workers_that_are_gone_leave_the_group() {
    let ns = TestNamespace::new();
    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    let ws = new_id("ws");
    let lease = Duration::from_millis(250);
    let mut done = store.consume_events("done", lease).await.unwrap();
    let a = event(&ws, "agent.run.completed");
    store.append_event(&a).await.unwrap();
    let taken = done.next(10, Duration::from_millis(500)).await.unwrap();
    store
        .enqueue_deliveries(&[taken[0].position.clone()], &[&a], &[])
        .await
        .unwrap();
    let mut holding = store.consume_events("holding", lease * 100).await.unwrap();
    let b = event(&ws, "agent.run.completed");
    store.append_event(&b).await.unwrap();
    assert_eq!(
        holding
            .next(10, Duration::from_millis(500))
            .await
            .unwrap()
            .len(),
        1
    );
    tokio::time::sleep(lease * 4 + Duration::from_millis(200)).await;
    // A new worker, on its first read, tidies up.
    let mut fresh = store.consume_events("fresh", lease).await.unwrap();
    fresh.next(10, Duration::from_millis(100)).await.unwrap();
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let reply: ::redis::streams::StreamInfoConsumersReply = ::redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(format!("{{{}}}:events", ns.name))
        .arg("webhooks")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut names: Vec<&str> = reply.consumers.iter().map(|c| c.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["fresh", "holding"]);
}

/// An event kept by id alone (before schema version 2) can still be replayed by id, by its own
/// workspace only.
#[tokio::test]
async fn redis_an_event_kept_by_id_alone_is_still_found_for_its_workspace() {
    let ns = TestNamespace::new();
    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    let e = event(&new_id("ws"), "agent.run.completed");
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("SET")
        .arg(format!("{{{}}}:wh:evt:{}", ns.name, e.id))
        .arg(serde_json::to_string(&e).unwrap())
        .query_async(&mut conn)
        .await
        .unwrap();
    let found = store
        .event(&e.workspace, e.environment, &e.id)
        .await
        .unwrap();
    assert_eq!(found.as_ref(), Some(&e));
    let elsewhere = store.event("ws_other", e.environment, &e.id).await.unwrap();
    assert_eq!(elsewhere, None);
}

/// Entries written past the store (by scripts or backends) are trimmed to the 30 days too.
#[tokio::test]
async fn redis_log_entries_past_retention_are_trimmed_and_never_delivered() {
    let ns = TestNamespace::new();
    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("{{{}}}:events", ns.name);
    let _: String = ::redis::cmd("XADD")
        .arg(&stream)
        .arg("1000-0")
        .arg("type")
        .arg("agent.run.completed")
        .arg("workspace")
        .arg("ws_old")
        .arg("data")
        .arg("{}")
        .query_async(&mut conn)
        .await
        .unwrap();
    let fresh = event("ws_new", "agent.run.completed");
    let mut feed = store
        .consume_events("c", Duration::from_secs(60))
        .await
        .unwrap();
    store.append_event(&fresh).await.unwrap();
    let got = feed.next(10, Duration::from_millis(500)).await.unwrap();
    assert_eq!(got.iter().map(|l| &l.event).collect::<Vec<_>>(), [&fresh]);
    let len: u64 = ::redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 1);
}

/// A consumer group Redis lost is recreated behind every entry still pending in it: a batch
/// whose fan-out failed is read again even though a newer batch was fanned out meanwhile.
#[tokio::test]
async fn redis_a_recreated_group_still_reads_entries_that_were_pending_when_it_was_lost() {
    let ns = TestNamespace::new();
    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    let ws = new_id("ws");
    let ep = endpoint(&ws, &["agent.run.*"]);
    let mut stalled = store
        .consume_events("stalled", Duration::from_secs(60))
        .await
        .unwrap();
    let mut busy = store
        .consume_events("busy", Duration::from_secs(60))
        .await
        .unwrap();
    let a = event(&ws, "agent.run.failed");
    store.append_event(&a).await.unwrap();
    let taken = stalled.next(10, Duration::from_millis(500)).await.unwrap();
    assert_eq!(
        taken.len(),
        1,
        "A is taken, and its fan-out fails: it stays pending"
    );
    let b = event(&ws, "agent.run.completed");
    store.append_event(&b).await.unwrap();
    let got = busy.next(10, Duration::from_millis(500)).await.unwrap();
    assert_eq!(got.iter().map(|l| &l.event).collect::<Vec<_>>(), [&b]);
    store
        .enqueue_deliveries(
            &[got[0].position.clone()],
            &[&b],
            &[Delivery::fanned_out(
                &Arc::new(b.clone()),
                &ws,
                &ep.id,
                1_000,
            )],
        )
        .await
        .unwrap();

    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let destroyed: i64 = ::redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(format!("{{{}}}:events", ns.name))
        .arg("webhooks")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(destroyed, 1);
    let again = busy.next(10, Duration::from_millis(500)).await.unwrap();
    let events: Vec<&Event> = again.iter().map(|l| &l.event).collect();
    assert_eq!(events, [&a, &b], "A is read again, and B after it");
    // B is fanned out again: its delivery is queued once.
    let positions: Vec<String> = again.iter().map(|l| l.position.clone()).collect();
    let a_delivery = Delivery::fanned_out(&Arc::new(a.clone()), &ws, &ep.id, 2_000);
    let b_again = Delivery::fanned_out(&Arc::new(b.clone()), &ws, &ep.id, 2_000);
    store
        .enqueue_deliveries(&positions, &[&a, &b], &[a_delivery, b_again])
        .await
        .unwrap();
    assert_eq!(store.queue_stats().await.unwrap().pending, 2);
    // Everything is fanned out now: a group lost again restarts past B.
    let _: i64 = ::redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(format!("{{{}}}:events", ns.name))
        .arg("webhooks")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(busy
        .next(10, Duration::from_millis(200))
        .await
        .unwrap()
        .is_empty());
}
