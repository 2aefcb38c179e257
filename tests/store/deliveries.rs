//! Webhook endpoints and the delivery queue.

use super::*;

async fn one_queued_delivery(store: &Arc<dyn Store>) -> (String, Endpoint, Event, u64) {
    let ws = new_id("ws");
    let a = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&a, 10).await.unwrap();
    let e = event(&ws, "agent.run.completed");
    let now = svcgate::ids::unix_millis();
    let queued = [Delivery::new(&e, &ws, &a.id, now, false)];
    store.enqueue_deliveries(&[], &[], &queued).await.unwrap();
    (ws, a, e, now)
}

async fn claims_respect_due_times_leases_and_per_endpoint_caps(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let (a, b) = (
        endpoint(&ws, &["agent.run.*"]),
        endpoint(&ws, &["agent.run.*"]),
    );
    store.create_endpoint(&a, 10_000).await.unwrap();
    store.create_endpoint(&b, 10_000).await.unwrap();
    let e = event(&ws, "agent.run.completed");
    let now = 1_000_000u64;
    let mut queued: Vec<Delivery> = (0..3)
        .map(|_| Delivery::new(&e, &ws, &a.id, now, false))
        .collect();
    queued.push(Delivery::new(&e, &ws, &b.id, now, false));
    queued.push(Delivery::new(&e, &ws, &b.id, now + 10_000, false));
    store.enqueue_deliveries(&[], &[], &queued).await.unwrap();
    assert_eq!(store.queue_stats().await.unwrap().pending, 5);
    assert_eq!(store.queue_stats().await.unwrap().oldest_due_ms, Some(now));

    let claim = |now_ms: u64, busy: Vec<(String, usize)>| {
        let store = store.clone();
        async move {
            let busy: Vec<(&str, usize)> = busy.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            store
                .claim_deliveries(&ClaimRequest {
                    now_ms,
                    lease: Duration::from_secs(5),
                    max: 10,
                    per_endpoint: 2,
                    busy: &busy,
                    struggling: &[],
                    struggling_max: 10,
                })
                .await
                .unwrap()
        }
    };
    let first = claim(now, vec![]).await;
    let per =
        |c: &[ClaimedDelivery], id: &str| c.iter().filter(|c| c.delivery.endpoint == id).count();
    assert_eq!(
        (per(&first, &a.id), per(&first, &b.id)),
        (2, 1),
        "cap 2 per endpoint; only due ones"
    );
    assert!(first
        .iter()
        .all(|c| c.endpoint.as_ref().is_some_and(|e| e.workspace == ws)));
    // While those are in flight, A's third must wait for a free slot of A.
    let busy = vec![(a.id.clone(), 2), (b.id.clone(), 1)];
    assert!(claim(now + 1, busy).await.is_empty());
    let third = claim(now + 1, vec![(b.id.clone(), 1)]).await;
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].delivery.endpoint, a.id);

    // A success leaves the queue; a failure is due again at its retry time.
    let of_a: Vec<&Delivery> = first
        .iter()
        .map(|c| &c.delivery)
        .filter(|d| d.endpoint == a.id)
        .collect();
    let mut ok = of_a[0].clone();
    ok.succeed(attempt(now, Some(200)));
    let answered = AfterAttempt::Answered;
    assert_eq!(
        store.save_delivery(&ok, answered).await.unwrap(),
        Saved::Done
    );
    // After the leases end, what is unfinished is due again (the worker died).
    let later = claim(now + 6_000, vec![]).await;
    let ids: Vec<&str> = later.iter().map(|c| c.delivery.id.as_str()).collect();
    assert!(!ids.contains(&ok.id.as_str()), "{ids:?}");
    assert_eq!(
        later.len(),
        3,
        "A's second and third and B's first, leases over: {ids:?}"
    );
    assert!(later.iter().all(|c| c.failures == 0));
    // A failure is due again at its retry time, and holds A's queue until then.
    let mut retry = of_a[1].clone();
    assert!(!retry.fail(
        attempt(now + 6_000, Some(500)),
        &[Duration::from_secs(60)],
        0
    ));
    store
        .save_delivery(&retry, AfterAttempt::Failing(1))
        .await
        .unwrap();
    let held = claim(now + 11_100, vec![]).await;
    assert!(
        held.iter().all(|c| c.delivery.endpoint == b.id),
        "A is held: {held:?}"
    );
    let retried = claim(now + 66_100, vec![]).await;
    let of_a: Vec<&ClaimedDelivery> = retried
        .iter()
        .filter(|c| c.delivery.endpoint == a.id)
        .collect();
    assert_eq!(of_a.len(), 1, "the failed one alone: {retried:?}");
    assert_eq!(
        (
            of_a[0].delivery.id.as_str(),
            of_a[0].delivery.attempts,
            of_a[0].failures
        ),
        (retry.id.as_str(), 1, 1)
    );

    // The final failure pauses the endpoint, once.
    let mut dead = retry.clone();
    assert!(dead.fail(attempt(now + 70_000, None), &[Duration::from_secs(60)], 1));
    let notice = PauseNotice::new(&dead, now + 70_010);
    let pause = AfterAttempt::Pause(&notice, 2);
    assert_eq!(
        store.save_delivery(&dead, pause).await.unwrap(),
        Saved::Paused
    );
    assert_eq!(
        store.save_delivery(&dead, pause).await.unwrap(),
        Saved::Done
    );
    let endpoints = store.endpoints(&ws).await.unwrap();
    let paused = endpoints.iter().find(|e| e.id == a.id).unwrap();
    assert_eq!(paused.status, EndpointStatus::Paused);
    assert_eq!(
        paused.secret, a.secret,
        "the endpoint survives the pause intact"
    );
    assert_eq!(paused.events, a.events);
    assert_eq!(store.queue_stats().await.unwrap().paused_endpoints, 1);
    store
        .update_endpoint(&ws, &a.id, &|e: &mut Endpoint| {
            e.status = EndpointStatus::Active
        })
        .await
        .unwrap();
    assert_eq!(store.queue_stats().await.unwrap().paused_endpoints, 0);

    let listed = store.deliveries(&a.id, 10).await.unwrap();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[2].id, queued[0].id, "newest first");
    assert_eq!(
        listed.iter().find(|d| d.id == ok.id).unwrap().status,
        DeliveryStatus::Succeeded
    );
    assert_eq!(
        listed.iter().find(|d| d.id == dead.id).unwrap().status,
        DeliveryStatus::Failed
    );
}

async fn an_entry_fanned_out_twice_queues_its_deliveries_once(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let (a, b) = (
        endpoint(&ws, &["agent.run.*"]),
        endpoint(&ws, &["agent.run.*"]),
    );
    let e = Arc::new(event(&ws, "agent.run.completed"));
    let now = 1_000_000u64;
    let first = [
        Delivery::fanned_out(&e, &ws, &a.id, now),
        Delivery::fanned_out(&e, &ws, &b.id, now),
    ];
    assert_ne!(first[0].id, first[1].id);
    store.enqueue_deliveries(&[], &[&e], &first).await.unwrap();
    // Taken over from a worker that was only slow, or read again by a recreated group.
    let again = [Delivery::fanned_out(&e, &ws, &a.id, now + 5_000)];
    assert_eq!(again[0].id, first[0].id);
    store.enqueue_deliveries(&[], &[&e], &again).await.unwrap();
    assert_eq!(store.queue_stats().await.unwrap().pending, 2);
    let listed = store.deliveries(&a.id, 10).await.unwrap();
    assert_eq!(
        listed,
        [DeliverySummary::from(&first[0])],
        "the first one, unchanged"
    );
    // A replay is a new delivery of the same event.
    let replay = [Delivery::new(&e, &ws, &a.id, now, true)];
    store.enqueue_deliveries(&[], &[], &replay).await.unwrap();
    assert_eq!(store.queue_stats().await.unwrap().pending, 3);
}

/// A workspace with one endpoint and one delivery of an event queued for it, made now: the
/// workspace, the endpoint, the event and now (unix milliseconds).
/// A listing longer than one read of the records: every delivery once, newest first, each as
/// its summary (the payloads are not read into it).
async fn a_long_deliveries_listing_is_whole_and_newest_first(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let a = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&a, 10_000).await.unwrap();
    let big = serde_json::json!({"blob": "x".repeat(10_000)});
    let mut queued = Vec::new();
    for n in 0..130u64 {
        let e = Event::new("agent.run.completed", &ws, Environment::Live, big.clone());
        let d = Delivery::new(&e, &ws, &a.id, 1_000_000 + n, n % 2 == 0);
        store
            .enqueue_deliveries(&[], &[], std::slice::from_ref(&d))
            .await
            .unwrap();
        queued.push(d);
    }
    let newest_first: Vec<DeliverySummary> =
        queued.iter().rev().map(DeliverySummary::from).collect();
    let listed = store.deliveries(&a.id, 1_000).await.unwrap();
    assert_eq!(listed, newest_first);
    let listed = store.deliveries(&a.id, 101).await.unwrap();
    assert_eq!(listed, newest_first[..101]);
}

async fn resuming_an_endpoint_held_back_puts_its_failed_delivery_due_now(store: Arc<dyn Store>) {
    let (ws, a, _, now) = one_queued_delivery(&store).await;
    assert_eq!(store.queued_deliveries(&a.id).await.unwrap(), 1);
    assert_eq!(store.queued_deliveries("we_other").await.unwrap(), 0);
    let claim = |now_ms: u64| claim_from(&store, now_ms, 10);
    let claimed = claim(now + 1).await;
    assert_eq!(claimed.len(), 1);
    let hour = [Duration::from_secs(3600)];
    let failed = claimed[0].delivery.clone();
    save_failure(&store, failed, attempt(now + 2, Some(500)), &hour, 0).await;
    assert!(claim(now + 10_000).await.is_empty(), "held for an hour");
    let resumed = store.resume_endpoint(&ws, &a.id).await.unwrap().unwrap();
    assert_eq!(resumed.status, EndpointStatus::Active);
    assert!(store.endpoint_retry(&a.id).await.unwrap().is_none());
    let again = claim(svcgate::ids::unix_millis() + 10).await;
    assert_eq!(again.len(), 1, "the failed delivery goes now");
    assert_eq!(again[0].delivery.id, claimed[0].delivery.id);
    assert!(store
        .resume_endpoint(&ws, "we_missing")
        .await
        .unwrap()
        .is_none());
}

async fn a_retry_in_flight_when_its_endpoint_is_resumed_counts_for_nothing(store: Arc<dyn Store>) {
    let (ws, a, e, now) = one_queued_delivery(&store).await;
    let claim = |now_ms: u64| claim_from(&store, now_ms, 10);
    // One retry an hour later, and that is the last.
    let schedule = [Duration::from_secs(3600)];
    let first = claim(now + 1).await.remove(0);
    save_failure(
        &store,
        first.delivery,
        attempt(now + 2, Some(500)),
        &schedule,
        0,
    )
    .await;
    let retry = claim(now + 3_600_100).await.remove(0);
    assert_eq!(retry.failures, 1, "the retry goes under the hold");
    // The customer fixes the receiver and resumes while the retry is on its way; meanwhile a
    // new delivery goes (nothing holds the endpoint now) and fails at once, holding it anew.
    store.resume_endpoint(&ws, &a.id).await.unwrap().unwrap();
    let later = [Delivery::new(&e, &ws, &a.id, now + 3_600_110, false)];
    store.enqueue_deliveries(&[], &[], &later).await.unwrap();
    let other = claim(now + 3_600_120).await.remove(0);
    assert_eq!(
        (other.delivery.id.as_str(), other.failures),
        (later[0].id.as_str(), 0)
    );
    save_failure(
        &store,
        other.delivery,
        attempt(now + 3_600_130, Some(500)),
        &schedule,
        0,
    )
    .await;
    // Then the retry fails: it was claimed under a hold that is gone, whatever holds it now.
    let mut dead = retry.delivery.clone();
    assert!(dead.fail(attempt(now + 3_600_200, None), &schedule, 1));
    let notice = PauseNotice::new(&dead, now + 3_600_300);
    assert_eq!(
        store
            .save_delivery(&dead, AfterAttempt::Pause(&notice, 2))
            .await
            .unwrap(),
        Saved::Superseded,
        "the endpoint as it is now has not failed"
    );
    let endpoints = store.endpoints(&ws).await.unwrap();
    assert_eq!(endpoints[0].status, EndpointStatus::Active, "not paused");
    assert!(
        claim_notices(&store, now + 3_600_400).await.is_empty(),
        "no e-mail"
    );
    // A retry that is not the last, likewise: no hold comes back.
    let mut failed = retry.delivery;
    assert!(!failed.fail(attempt(now + 3_600_200, None), &[schedule[0]; 2], 1));
    assert_eq!(
        store
            .save_delivery(&failed, AfterAttempt::Failing(2))
            .await
            .unwrap(),
        Saved::Superseded
    );
    let hold = store.endpoint_retry(&a.id).await.unwrap().unwrap();
    assert_eq!(hold.failures, 1, "the new delivery's hold stands: {hold:?}");
}

async fn a_thousand_endpoints_with_no_room_do_not_hold_up_one_that_has(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let e = event(&ws, "agent.run.completed");
    let now = 1_000_000u64;
    // 1,200 endpoints whose deliveries are overdue and which this worker has no room for (the
    // first page of due endpoints is 1,000), then one with room, due last.
    let mut stuck = Vec::new();
    let mut queued = Vec::new();
    for i in 0..1_200u64 {
        let ep = endpoint(&ws, &["agent.run.*"]);
        store.create_endpoint(&ep, 10_000).await.unwrap();
        queued.push(Delivery::new(&e, &ws, &ep.id, now - 10_000 + i, false));
        stuck.push(ep.id);
    }
    let free = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&free, 10_000).await.unwrap();
    queued.push(Delivery::new(&e, &ws, &free.id, now, false));
    store.enqueue_deliveries(&[], &[], &queued).await.unwrap();
    let busy: Vec<(&str, usize)> = stuck.iter().map(|id| (id.as_str(), 1)).collect();
    let claimed = store
        .claim_deliveries(&ClaimRequest {
            now_ms: now,
            lease: Duration::from_secs(5),
            max: 4,
            per_endpoint: 1,
            busy: &busy,
            struggling: &[],
            struggling_max: 0,
        })
        .await
        .unwrap();
    let ids: Vec<&str> = claimed
        .iter()
        .map(|c| c.delivery.endpoint.as_str())
        .collect();
    assert_eq!(ids, [free.id.as_str()]);
}

async fn struggling_endpoints_take_at_most_their_share_between_them(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let e = event(&ws, "agent.run.completed");
    let now = 1_000_000u64;
    let endpoints: Vec<Endpoint> = (0..3).map(|_| endpoint(&ws, &["agent.run.*"])).collect();
    let mut queued = Vec::new();
    for (i, ep) in endpoints.iter().enumerate() {
        store.create_endpoint(ep, 10_000).await.unwrap();
        for j in 0..3u64 {
            queued.push(Delivery::new(
                &e,
                &ws,
                &ep.id,
                now - 1_000 + i as u64 * 10 + j,
                false,
            ));
        }
    }
    store.enqueue_deliveries(&[], &[], &queued).await.unwrap();
    // The first two struggle and may take 2 between them; the third answers.
    let struggling = [endpoints[0].id.as_str(), endpoints[1].id.as_str()];
    let claimed = store
        .claim_deliveries(&ClaimRequest {
            now_ms: now,
            lease: Duration::from_secs(5),
            max: 10,
            per_endpoint: 3,
            busy: &[],
            struggling: &struggling,
            struggling_max: 2,
        })
        .await
        .unwrap();
    let per = |id: &str| claimed.iter().filter(|c| c.delivery.endpoint == id).count();
    assert_eq!(per(&endpoints[0].id) + per(&endpoints[1].id), 2);
    assert_eq!(
        per(&endpoints[2].id),
        3,
        "the healthy endpoint is not held back"
    );
}

async fn a_failure_holds_its_endpoints_queue_until_the_retry_and_an_answer_releases_it(
    store: Arc<dyn Store>,
) {
    let ws = new_id("ws");
    let a = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&a, 10_000).await.unwrap();
    let e = event(&ws, "agent.run.completed");
    let now = 1_000_000u64;
    let queued: Vec<Delivery> = (0..4)
        .map(|i| Delivery::new(&e, &ws, &a.id, now + i, false))
        .collect();
    store.enqueue_deliveries(&[], &[], &queued).await.unwrap();
    let claim = |now_ms: u64, struggling_max: usize| claim_from(&store, now_ms, struggling_max);
    let first = claim(now + 10, 10).await;
    assert_eq!(first.len(), 4);
    assert!(first.iter().all(|c| c.failures == 0));
    let schedule = [Duration::from_secs(60), Duration::from_secs(300)];
    let mut probe = first[0].delivery.clone();
    assert!(!probe.fail(attempt(now + 10, Some(500)), &schedule, 0));
    let retry_at = probe.next_attempt_ms.unwrap();
    store
        .save_delivery(&probe, AfterAttempt::Failing(1))
        .await
        .unwrap();

    // Held: neither the others (their leases over) nor a new one go before the retry.
    let late = [Delivery::new(&e, &ws, &a.id, now + 100, false)];
    store.enqueue_deliveries(&[], &[], &late).await.unwrap();
    assert!(claim(now + 6_000, 10).await.is_empty());
    assert!(claim(retry_at - 1, 10).await.is_empty());
    assert_eq!(
        store.queue_stats().await.unwrap().oldest_due_ms,
        Some(retry_at),
        "nothing of a held endpoint is overdue before its retry"
    );
    // Then the failed one goes first and alone, as a struggling endpoint's.
    assert!(claim(retry_at, 0).await.is_empty(), "no struggling room");
    let retried = claim(retry_at, 10).await;
    assert_eq!(retried.len(), 1, "{retried:?}");
    assert_eq!(
        (retried[0].delivery.id.as_str(), retried[0].failures),
        (probe.id.as_str(), 1)
    );
    assert!(claim(retry_at + 1, 10).await.is_empty(), "one in flight");

    // It fails again: the next step. An attempt that was in flight before the hold and fails
    // late counts one failure and leaves the longer hold as it is.
    assert!(!probe.fail(attempt(retry_at, None), &schedule, 1));
    let second_retry = probe.next_attempt_ms.unwrap();
    store
        .save_delivery(&probe, AfterAttempt::Failing(2))
        .await
        .unwrap();
    save_failure(
        &store,
        first[1].delivery.clone(),
        attempt(retry_at + 2, None),
        &schedule,
        0,
    )
    .await;
    assert!(claim(second_retry - 1, 10).await.is_empty());
    let retried = claim(second_retry, 10).await;
    assert_eq!(
        retried
            .iter()
            .map(|c| (c.delivery.id.as_str(), c.failures))
            .collect::<Vec<_>>(),
        [(probe.id.as_str(), 2)]
    );

    // It answers: the whole queue is due again, at the endpoint's cap.
    let mut answered = probe.clone();
    answered.succeed(attempt(second_retry, Some(200)));
    store
        .save_delivery(&answered, AfterAttempt::Answered)
        .await
        .unwrap();
    let released = claim(second_retry + 1, 10).await;
    assert_eq!(released.len(), 4, "{released:?}");
    assert!(released.iter().all(|c| c.failures == 0));
    assert!(released.iter().all(|c| c.delivery.id != probe.id));

    // Two attempts in flight together fail: the first holds the queue, the second, with the
    // same count, moves nothing.
    let now = second_retry + 1;
    let failed = save_failure(
        &store,
        released[0].delivery.clone(),
        attempt(now, None),
        &schedule,
        0,
    )
    .await;
    save_failure(
        &store,
        released[1].delivery.clone(),
        attempt(now + 30_000, None),
        &schedule,
        0,
    )
    .await;
    let retried = claim(failed.next_attempt_ms.unwrap(), 10).await;
    let ids: Vec<&str> = retried.iter().map(|c| c.delivery.id.as_str()).collect();
    assert_eq!(ids, [failed.id.as_str()]);

    // A new URL starts afresh: the hold goes, and the queue is due as it was.
    let now = failed.next_attempt_ms.unwrap() + 1;
    store
        .update_endpoint(&ws, &a.id, &|e: &mut Endpoint| {
            e.url = "https://example.com/fixed".into()
        })
        .await
        .unwrap();
    let fresh = claim(now + 5_000, 10).await;
    assert_eq!(fresh.len(), 3, "{fresh:?}");
    assert!(fresh.iter().all(|c| c.failures == 0));

    // A hold on an endpoint that is deleted is dropped at once: its queue is skipped at full
    // speed, not when the hold would have ended.
    save_failure(
        &store,
        fresh[0].delivery.clone(),
        attempt(now + 5_000, None),
        &schedule,
        0,
    )
    .await;
    assert!(store.delete_endpoint(&ws, &a.id).await.unwrap());
    let skipped = claim(now + 10_001, 10).await;
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(skipped
        .iter()
        .all(|c| c.endpoint.is_none() && c.failures == 0));
    // And a failure saved late for it holds nothing.
    save_failure(
        &store,
        skipped[0].delivery.clone(),
        attempt(now + 10_001, None),
        &schedule,
        0,
    )
    .await;
    let due = claim(now + 15_002, 10).await;
    assert_eq!(due.len(), 1, "{due:?}");
}

async fn endpoints_are_capped_per_workspace_and_a_delete_makes_room(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let mine: Vec<Endpoint> = (0..4).map(|_| endpoint(&ws, &["agent.run.*"])).collect();
    for e in &mine[..3] {
        store.create_endpoint(e, 3).await.unwrap();
    }
    match store.create_endpoint(&mine[3], 3).await {
        Err(StoreError::Conflict(why)) => {
            assert!(why.contains("3 live webhook endpoints"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.endpoints(&ws).await.unwrap().len(), 3);
    // Test mode counts apart.
    let mut in_test = endpoint(&ws, &["agent.run.*"]);
    in_test.environment = Environment::Test;
    store.create_endpoint(&in_test, 3).await.unwrap();
    let elsewhere = endpoint(&new_id("ws"), &["agent.run.*"]);
    store.create_endpoint(&elsewhere, 3).await.unwrap();
    assert!(store.delete_endpoint(&ws, &mine[0].id).await.unwrap());
    store.create_endpoint(&mine[3], 3).await.unwrap();
    // A taken id is still a conflict of its own.
    match store.create_endpoint(&mine[3], 10).await {
        Err(StoreError::Conflict(why)) => assert!(why.contains("exists"), "{why}"),
        other => panic!("{other:?}"),
    }
}

async fn a_failure_at_a_url_the_endpoint_no_longer_has_counts_for_nothing(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let a = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&a, 10).await.unwrap();
    let e = event(&ws, "agent.run.completed");
    let now = 1_000_000u64;
    let queued = [Delivery::new(&e, &ws, &a.id, now, false)];
    store.enqueue_deliveries(&[], &[], &queued).await.unwrap();
    store
        .update_endpoint(&ws, &a.id, &|e: &mut Endpoint| {
            e.url = "https://example.com/fixed".into()
        })
        .await
        .unwrap();
    let at_old_url = |mut d: Delivery, last: bool| {
        let mut tried = attempt(now, Some(500));
        tried.url = Some(a.url.clone());
        let schedule: &[Duration] = if last {
            &[]
        } else {
            &[Duration::from_secs(60)]
        };
        d.fail(tried, schedule, 0);
        d
    };
    let failed = at_old_url(queued[0].clone(), false);
    assert_eq!(
        store
            .save_delivery(&failed, AfterAttempt::Failing(1))
            .await
            .unwrap(),
        Saved::Superseded
    );
    let dead = at_old_url(queued[0].clone(), true);
    let notice = PauseNotice::new(&dead, now);
    assert_eq!(
        store
            .save_delivery(&dead, AfterAttempt::Pause(&notice, 1))
            .await
            .unwrap(),
        Saved::Superseded
    );
    // Nothing was saved: no hold, no pause, the delivery as it was.
    assert_eq!(store.endpoint_retry(&a.id).await.unwrap(), None);
    let now_endpoint = store.endpoints(&ws).await.unwrap();
    assert_eq!(now_endpoint[0].status, EndpointStatus::Active);
    assert_eq!(
        store.deliveries(&a.id, 10).await.unwrap(),
        queued.iter().map(DeliverySummary::from).collect::<Vec<_>>()
    );
    // At the URL it has, a failure counts.
    let mut at_new_url = queued[0].clone();
    let mut tried = attempt(now, Some(500));
    tried.url = Some("https://example.com/fixed".into());
    at_new_url.fail(tried, &[Duration::from_secs(60)], 0);
    assert_eq!(
        store
            .save_delivery(&at_new_url, AfterAttempt::Failing(1))
            .await
            .unwrap(),
        Saved::Done
    );
    assert_eq!(
        store
            .endpoint_retry(&a.id)
            .await
            .unwrap()
            .map(|r| r.failures),
        Some(1)
    );
}

/// An endpoint's rate limit: so many deliveries a second, counted across callers.
async fn rate_slots_are_counted_per_endpoint_and_second(store: Arc<dyn Store>) {
    let (a, b) = (new_id("we"), new_id("we"));
    let second = unix_now() * 1000;
    for _ in 0..2 {
        assert!(store.take_rate_slot(&a, 2, second).await.unwrap());
    }
    assert!(!store.take_rate_slot(&a, 2, second + 999).await.unwrap());
    assert!(store.take_rate_slot(&b, 2, second).await.unwrap());
    assert!(store.take_rate_slot(&a, 2, second + 1000).await.unwrap());
}

/// A rotation changes the secret and keeps the old one beside it; both stores keep what the
/// change wrote.
async fn a_rotated_secret_and_the_new_fields_are_kept(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let e = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&e, 10).await.unwrap();
    let rotated = store
        .update_endpoint(&ws, &e.id, &|e: &mut Endpoint| {
            e.rotate_secret("whsec_new".into(), 60, 1_000);
            e.format = svcgate::webhooks::endpoint::WebhookFormat::StandardWebhooks;
            e.rate_limit_per_second = Some(5);
        })
        .await
        .unwrap()
        .unwrap();
    let read = store.endpoints(&ws).await.unwrap().pop().unwrap();
    assert_eq!(read, rotated);
    assert_eq!(read.signing_secrets(1_000), ["whsec_new", "whsec_x"]);
    assert_eq!(read.rate_limit_per_second, Some(5));
}

store_suite!(
    rate_slots_are_counted_per_endpoint_and_second,
    a_rotated_secret_and_the_new_fields_are_kept,
    claims_respect_due_times_leases_and_per_endpoint_caps,
    an_entry_fanned_out_twice_queues_its_deliveries_once,
    a_long_deliveries_listing_is_whole_and_newest_first,
    resuming_an_endpoint_held_back_puts_its_failed_delivery_due_now,
    a_retry_in_flight_when_its_endpoint_is_resumed_counts_for_nothing,
    a_thousand_endpoints_with_no_room_do_not_hold_up_one_that_has,
    struggling_endpoints_take_at_most_their_share_between_them,
    a_failure_holds_its_endpoints_queue_until_the_retry_and_an_answer_releases_it,
    endpoints_are_capped_per_workspace_and_a_delete_makes_room,
    a_failure_at_a_url_the_endpoint_no_longer_has_counts_for_nothing
);
