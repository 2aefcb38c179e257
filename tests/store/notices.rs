//! Pause notices.

use super::*;

async fn a_pause_queues_one_notice_leased_while_claimed_and_kept_until_removed(
    store: Arc<dyn Store>,
) {
    let ws = new_id("ws");
    let a = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&a, 10_000).await.unwrap();
    let now = 1_000_000u64;
    let mut dead = Delivery::new(&event(&ws, "agent.run.failed"), &ws, &a.id, now, false);
    let mut last = attempt(now, None);
    last.error = Some("connection refused".into());
    assert!(dead.fail(last, &[], 0));

    // Queued with the pause, once: a retried save (its reply was lost) queues nothing more.
    let notice = PauseNotice::new(&dead, now + 10);
    assert_eq!(
        store
            .save_delivery(&dead, AfterAttempt::Pause(&notice, 1))
            .await
            .unwrap(),
        Saved::Paused
    );
    let again = PauseNotice::new(&dead, now + 20);
    assert_eq!(
        store
            .save_delivery(&dead, AfterAttempt::Pause(&again, 1))
            .await
            .unwrap(),
        Saved::Done
    );
    assert_eq!(store.queue_stats().await.unwrap().pause_notices, 1);
    assert!(claim_notices(&store, now).await.is_empty(), "not due yet");
    let claimed = store
        .claim_pause_notices(now + 10, Duration::from_secs(5), 10)
        .await
        .unwrap();
    assert_eq!(claimed, std::slice::from_ref(&notice));
    assert_eq!(claimed[0].last_error, "connection refused");
    assert_eq!(
        (claimed[0].workspace.as_str(), claimed[0].endpoint.as_str()),
        (ws.as_str(), a.id.as_str())
    );

    // Leased: no other worker takes it until the lease ends (its worker died), then one does.
    assert!(claim_notices(&store, now + 4_000).await.is_empty());
    assert_eq!(
        claim_notices(&store, now + 5_010).await,
        std::slice::from_ref(&notice.id)
    );

    // A failed try puts it back for later, counted.
    let mut failed = notice.clone();
    failed.failures = 1;
    store
        .retry_pause_notice(&failed, now + 60_000)
        .await
        .unwrap();
    assert!(claim_notices(&store, now + 59_999).await.is_empty());
    let claimed = store
        .claim_pause_notices(now + 60_000, Duration::from_secs(5), 10)
        .await
        .unwrap();
    assert_eq!(claimed, [failed.clone()]);

    // Sent: removed for good, and a late retry from a worker whose lease ran out brings
    // nothing back.
    store.remove_pause_notice(&notice.id).await.unwrap();
    store
        .retry_pause_notice(&failed, now + 70_000)
        .await
        .unwrap();
    assert!(claim_notices(&store, u64::MAX / 2).await.is_empty());
    assert_eq!(store.queue_stats().await.unwrap().pause_notices, 0);
    store.remove_pause_notice(&notice.id).await.unwrap();

    // Resumed and paused again: a new notice. An endpoint that is gone queues none.
    store
        .update_endpoint(&ws, &a.id, &|e: &mut Endpoint| {
            e.status = EndpointStatus::Active
        })
        .await
        .unwrap();
    let second = PauseNotice::new(&dead, now + 80_000);
    assert_eq!(
        store
            .save_delivery(&dead, AfterAttempt::Pause(&second, 1))
            .await
            .unwrap(),
        Saved::Paused
    );
    store.delete_endpoint(&ws, &a.id).await.unwrap();
    let orphan = PauseNotice::new(&dead, now + 80_000);
    assert_eq!(
        store
            .save_delivery(&dead, AfterAttempt::Pause(&orphan, 1))
            .await
            .unwrap(),
        Saved::Done
    );
    assert_eq!(claim_notices(&store, now + 90_000).await, [second.id]);
}

/// A 410 Gone: the same step as a pause, but the endpoint is `disabled`; resumed like a paused
/// one.
async fn a_notice_for_a_gone_receiver_disables_the_endpoint(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let a = endpoint(&ws, &["agent.run.*"]);
    store.create_endpoint(&a, 10_000).await.unwrap();
    let now = 1_000_000u64;
    let mut gone = Delivery::new(&event(&ws, "agent.run.failed"), &ws, &a.id, now, false);
    let mut last = attempt(now, Some(410));
    last.error = Some("HTTP 410".into());
    assert!(gone.fail_after(last, None));
    let mut notice = PauseNotice::new(&gone, now + 10);
    notice.disabled = true;
    assert_eq!(
        store
            .save_delivery(&gone, AfterAttempt::Pause(&notice, 1))
            .await
            .unwrap(),
        Saved::Paused
    );
    let status = |list: Vec<Endpoint>| list.into_iter().find(|e| e.id == a.id).unwrap().status;
    assert_eq!(
        status(store.endpoints(&ws).await.unwrap()),
        EndpointStatus::Disabled
    );
    let stats = store.queue_stats().await.unwrap();
    assert_eq!((stats.paused_endpoints, stats.pause_notices), (1, 1));
    let claimed = store
        .claim_pause_notices(now + 10, Duration::from_secs(5), 10)
        .await
        .unwrap();
    assert!(claimed[0].disabled);
    let resumed = store.resume_endpoint(&ws, &a.id).await.unwrap().unwrap();
    assert_eq!(resumed.status, EndpointStatus::Active);
    assert_eq!(store.queue_stats().await.unwrap().paused_endpoints, 0);
}

store_suite!(
    a_pause_queues_one_notice_leased_while_claimed_and_kept_until_removed,
    a_notice_for_a_gone_receiver_disables_the_endpoint
);
