//! Deliveries in Redis: payloads kept once, records that do not read.

use super::*;

/// A held endpoint's failed delivery that no worker can read is passed over after a few
/// claims: the endpoint's queue does not wait for the record to expire.
#[tokio::test]
async fn redis_a_retry_no_worker_can_read_gives_way_to_the_next_delivery() {
    let ns = TestNamespace::new();
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis_url(), &ns.name).unwrap());
    let ws = new_id("ws");
    let ep = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&ep, 10).await.unwrap();
    let e = event(&ws, "agent.run.completed");
    let queued: Vec<Delivery> = (0..2)
        .map(|i| Delivery::new(&e, &ws, &ep.id, 1_000 + i, false))
        .collect();
    store.enqueue_deliveries(&[], &[], &queued).await.unwrap();
    let claim = |now_ms: u64| {
        let store = store.clone();
        async move {
            store
                .claim_deliveries(&ClaimRequest {
                    now_ms,
                    lease: Duration::from_secs(5),
                    max: 10,
                    per_endpoint: 1,
                    busy: &[],
                    struggling: &[],
                    struggling_max: 10,
                })
                .await
                .unwrap()
        }
    };
    let first = claim(2_000).await;
    let failed = save_failure(
        &store,
        first[0].delivery.clone(),
        attempt(2_000, Some(500)),
        &[Duration::from_secs(1)],
        0,
    )
    .await;
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("SET")
        .arg(format!("{{{}}}:wh:dlv:{}", ns.name, failed.id))
        .arg(r#"{"id": 7}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Taken (and skipped: it does not read) three times, a lease apart...
    let mut now = failed.next_attempt_ms.unwrap();
    for _ in 0..3 {
        assert!(claim(now).await.is_empty());
        now += 5_001;
    }
    // ...then the other delivery goes in its place, as the endpoint's retry.
    let next = claim(now).await;
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(
        (next[0].delivery.id.as_str(), next[0].failures),
        (queued[1].id.as_str(), 1)
    );
}

/// A delivery record that does not read is passed over: the others of its claim go out.
#[tokio::test]
async fn redis_a_delivery_that_does_not_read_does_not_hold_up_its_claim() {
    let ns = TestNamespace::new();
    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    let ws = new_id("ws");
    let ep = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&ep, 10_000).await.unwrap();
    let e = event(&ws, "agent.run.completed");
    let queued: Vec<Delivery> = (0..3)
        .map(|i| Delivery::new(&e, &ws, &ep.id, 1_000 + i, false))
        .collect();
    store.enqueue_deliveries(&[], &[], &queued).await.unwrap();
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("SET")
        .arg(format!("{{{}}}:wh:dlv:{}", ns.name, queued[1].id))
        .arg(r#"{"id": 7}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    let claimed = store
        .claim_deliveries(&ClaimRequest {
            now_ms: 2_000,
            lease: Duration::from_secs(5),
            max: 10,
            per_endpoint: 10,
            busy: &[],
            struggling: &[],
            struggling_max: 10,
        })
        .await
        .expect("the claim goes through");
    let ids: Vec<&str> = claimed.iter().map(|c| c.delivery.id.as_str()).collect();
    assert_eq!(ids, [queued[0].id.as_str(), queued[2].id.as_str()]);
    // Nor does an endpoint record that does not read stop the workspace's fan-out.
    let _: () = ::redis::cmd("HSET")
        .arg(format!("{{{}}}:endpoints:{ws}", ns.name))
        .arg("we_broken")
        .arg("not json")
        .query_async(&mut conn)
        .await
        .unwrap();
    let listed = store.endpoints(&ws).await.expect("the others are listed");
    assert_eq!(listed, [ep]);
}

/// Redis keeps an event's payload once, in the event's record, not once per delivery: each
/// claim reads it back whole; a save keeps the record as long as the delivery; a record from
/// before schema version 4 with its payload still goes out and is saved without it; a delivery
/// whose event's record is gone is skipped, not sent empty.
#[tokio::test]
async fn redis_an_events_payload_is_stored_once_for_all_its_deliveries() {
    use ::redis::AsyncCommands;
    let ns = TestNamespace::new();
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis_url(), &ns.name).unwrap());
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let p = format!("{{{}}}", ns.name);
    let ws = new_id("ws");
    let endpoints: Vec<Endpoint> = (0..5).map(|_| endpoint(&ws, &["agent.run.*"])).collect();
    for e in &endpoints {
        store.create_endpoint(e, 10).await.unwrap();
    }
    let blob = serde_json::json!({"blob": "x".repeat(100_000), "n": [1, {"a": null}]});
    let e = Event::new("agent.run.completed", &ws, Environment::Live, blob);
    let record = format!("{p}:wh:evt:{ws}:live:{}", e.id);
    let queued: Vec<Delivery> = endpoints
        .iter()
        .map(|ep| Delivery::fanned_out(&Arc::new(e.clone()), &ws, &ep.id, 1_000))
        .collect();
    store.enqueue_deliveries(&[], &[&e], &queued).await.unwrap();
    let reader = conn.clone();
    let strlen = |key: String| {
        let mut conn = reader.clone();
        async move {
            ::redis::cmd("STRLEN")
                .arg(key)
                .query_async::<usize>(&mut conn)
                .await
                .unwrap()
        }
    };
    assert!(strlen(record.clone()).await > 100_000);
    for d in &queued {
        let kept = strlen(format!("{p}:wh:dlv:{}", d.id)).await;
        assert!(kept < 1_000, "a delivery keeps {kept} bytes");
    }
    let used: usize = ::redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&record)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(used < 150_000, "{used} bytes");
    // Every claim carries the whole event, each delivery as it was queued, all five sharing
    // one copy of it.
    let claimed = claim_from(&store, 2_000, 10).await;
    assert_eq!(claimed.len(), 5);
    let first = &claimed[0].delivery.event;
    assert!(claimed
        .iter()
        .all(|c| Arc::ptr_eq(&c.delivery.event, first)));
    let mut got: Vec<Delivery> = claimed.into_iter().map(|c| c.delivery).collect();
    got.sort_by(|a, b| a.id.cmp(&b.id));
    let mut want = queued.clone();
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(got, want);

    // A failure is saved without the payload, and the record lives as long as the delivery.
    let _: () = ::redis::cmd("EXPIRE")
        .arg(&record)
        .arg(60)
        .query_async(&mut conn)
        .await
        .unwrap();
    let failed = save_failure(
        &store,
        queued[0].clone(),
        attempt(2_000, Some(500)),
        &[Duration::from_secs(1)],
        0,
    )
    .await;
    assert!(strlen(format!("{p}:wh:dlv:{}", failed.id)).await < 1_000);
    let ttl: i64 = conn.ttl(&record).await.unwrap();
    assert!(ttl > 29 * 86_400, "the event's record expires in {ttl} s");
    let retried = claim_from(&store, failed.next_attempt_ms.unwrap(), 10).await;
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0].delivery, failed);

    // A delivery stored whole by an earlier version goes out whole, even with its event's
    // record gone, which its save writes again, and it is saved without the payload.
    let other = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&other, 10).await.unwrap();
    let legacy = Delivery::new(&e, &ws, &other.id, 1_000, true);
    store
        .enqueue_deliveries(&[], &[], std::slice::from_ref(&legacy))
        .await
        .unwrap();
    assert!(strlen(format!("{p}:wh:dlv:{}", legacy.id)).await > 100_000);
    let _: () = conn.del(&record).await.unwrap();
    let claimed = claim_from(&store, 3_000, 10).await;
    let legacy_claim = claimed.iter().find(|c| c.delivery.id == legacy.id).unwrap();
    assert_eq!(legacy_claim.delivery, legacy);
    let mut answered = legacy.clone();
    answered.succeed(attempt(3_000, Some(200)));
    store
        .save_delivery(&answered, AfterAttempt::Answered)
        .await
        .unwrap();
    assert!(strlen(format!("{p}:wh:dlv:{}", legacy.id)).await < 1_000);
    let back: String = conn.get(&record).await.unwrap();
    assert_eq!(serde_json::from_str::<Event>(&back).unwrap(), e);

    // With the record gone, a delivery kept without its payload is skipped, and says why: the
    // four never tried and the retry, due again.
    let _: () = conn.del(&record).await.unwrap();
    assert_eq!(store.queue_stats().await.unwrap().pending, 5);
    assert!(claim_from(&store, 10_000, 10).await.is_empty());
    assert_eq!(store.queue_stats().await.unwrap().pending, 0);
    let listed = store.deliveries(&endpoints[1].id, 10).await.unwrap();
    assert_eq!(listed[0].status, DeliveryStatus::Skipped);
    let why = listed[0]
        .last_attempt
        .as_ref()
        .and_then(|a| a.error.as_deref());
    assert_eq!(why, Some("its event is no longer stored"));

    // A replay passes its event along: its record is written again, and the replay goes out
    // whole.
    let replay = Delivery::new(&e, &ws, &endpoints[1].id, 20_000, true);
    store
        .enqueue_deliveries(&[], &[&e], std::slice::from_ref(&replay))
        .await
        .unwrap();
    assert!(strlen(format!("{p}:wh:dlv:{}", replay.id)).await < 1_000);
    let claimed = claim_from(&store, 20_000, 10).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].delivery, replay);
}
