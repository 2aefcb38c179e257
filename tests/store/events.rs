//! The event log.

use super::*;

async fn the_event_log_is_consumed_once_and_reclaimed_from_dead_consumers(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let mut idle = store
        .consume_events("idle", Duration::from_secs(60))
        .await
        .unwrap();
    let mut dying = store
        .consume_events("dying", Duration::from_secs(60))
        .await
        .unwrap();
    let events = [
        event(&ws, "agent.run.completed"),
        event(&ws, "agent.run.failed"),
    ];
    for e in &events {
        store.append_event(e).await.unwrap();
    }
    let taken = dying.next(10, Duration::from_millis(500)).await.unwrap();
    let taken_events: Vec<Event> = taken.iter().map(|l| l.event.clone()).collect();
    assert_eq!(taken_events, events);
    // Another consumer does not get them again while they are in progress.
    assert!(idle
        .next(10, Duration::from_millis(100))
        .await
        .unwrap()
        .is_empty());
    // The taker died: after the idle time, a consumer takes them over.
    let mut rescuer = store
        .consume_events("rescuer", Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rescued = rescuer.next(10, Duration::from_millis(100)).await.unwrap();
    assert_eq!(
        rescued.iter().map(|l| &l.position).collect::<Vec<_>>(),
        taken.iter().map(|l| &l.position).collect::<Vec<_>>()
    );
    // Fanned out (acknowledged): gone for good, and findable by id.
    let positions: Vec<String> = rescued.iter().map(|l| l.position.clone()).collect();
    let refs: Vec<&Event> = events.iter().collect();
    store
        .enqueue_deliveries(&positions, &refs, &[])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rescuer
        .next(10, Duration::from_millis(100))
        .await
        .unwrap()
        .is_empty());
    let of = |e: &Event| (e.workspace.clone(), e.environment, e.id.clone());
    let (ws1, env1, id1) = of(&events[1]);
    assert_eq!(
        store.event(&ws1, env1, &id1).await.unwrap(),
        Some(events[1].clone())
    );
    assert_eq!(store.event(&ws1, env1, "evt_missing").await.unwrap(), None);
    assert_eq!(store.event("ws_other", env1, &id1).await.unwrap(), None);
}

async fn a_tail_sees_only_events_logged_after_it_started(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    store
        .append_event(&event(&ws, "agent.run.completed"))
        .await
        .unwrap();
    let mut tail = store.tail_events().await.unwrap();
    let later = event(&ws, "key.auto_revoked");
    let appender = {
        let (store, later) = (store.clone(), later.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store.append_event(&later).await.unwrap();
        })
    };
    // A blocking read wakes up for the new event.
    let got = tail.next(10, Duration::from_secs(5)).await.unwrap();
    appender.await.unwrap();
    assert_eq!(got.iter().map(|l| &l.event).collect::<Vec<_>>(), [&later]);
    assert!(tail
        .next(10, Duration::from_millis(50))
        .await
        .unwrap()
        .is_empty());
}

/// A stream of `svcgate listen` starts past the floor the store gives it: past what was logged
/// before (with Redis, more than its half second of allowance before), and before what is
/// logged after.
async fn an_event_log_floor_is_past_what_was_logged_and_before_what_follows(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let earlier = event(&ws, "agent.run.completed");
    store.append_event(&earlier).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let floor = store
        .event_log_floor()
        .await
        .unwrap()
        .expect("a floor once something is logged");
    let later = event(&ws, "key.auto_revoked");
    store.append_event(&later).await.unwrap();
    let mut feed = store
        .consume_events(&new_id("reader"), Duration::from_secs(60))
        .await
        .unwrap();
    let read = feed.next(1_000, Duration::from_millis(200)).await.unwrap();
    let position = |e: &Event| {
        let logged = read.iter().find(|l| l.event.id == e.id).expect("logged");
        log_position(&logged.position).expect("a position")
    };
    let floor = log_position(&floor).expect("a position");
    assert!(position(&earlier) <= floor, "{floor:?}");
    assert!(position(&later) > floor, "{floor:?}");
}

async fn a_replay_since_a_time_goes_on_page_by_page_past_the_last_event(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let second = unix_now() - 600;
    // Five events in one second (a page ends among them), two later ones.
    let mut events: Vec<Event> = (0..7)
        .map(|i| {
            let mut e = event(&ws, "agent.run.completed");
            e.created = second + if i < 5 { 0 } else { i };
            e
        })
        .collect();
    let refs: Vec<&Event> = events.iter().collect();
    store.enqueue_deliveries(&[], &refs, &[]).await.unwrap();
    events.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    let mut got = Vec::new();
    let (mut since, mut after) = (second - 5, None::<String>);
    loop {
        let page = store
            .events_since(&ws, Environment::Live, since, after.as_deref(), 3)
            .await
            .unwrap();
        got.extend(page.events.iter().map(|e| e.id.clone()));
        match page.next {
            Some((next_since, next_after)) => (since, after) = (next_since, Some(next_after)),
            None => break,
        }
    }
    let want: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    assert_eq!(got, want);
    // Past an id that is not there: the events of that second that sort after it.
    let past = format!("{}~", events[1].id);
    let rest = store
        .events_since(&ws, Environment::Live, second, Some(past.as_str()), 100)
        .await
        .unwrap();
    assert_eq!(rest.next, None);
    let rest: Vec<&str> = rest.events.iter().map(|e| e.id.as_str()).collect();
    let want: Vec<&str> = events[2..].iter().map(|e| e.id.as_str()).collect();
    assert_eq!(rest, want);
}

async fn events_since_filter_by_workspace_environment_and_time(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let mut old = event(&ws, "agent.run.completed");
    old.created = unix_now() - 3_600;
    let live = event(&ws, "agent.run.failed");
    let mut test = event(&ws, "agent.run.failed");
    test.environment = Environment::Test;
    let other = event(&new_id("ws"), "agent.run.failed");
    for e in [&old, &live, &test, &other] {
        store.append_event(e).await.unwrap();
    }
    // Replay reads what workers have taken from the log.
    store
        .enqueue_deliveries(&[], &[&old, &live, &test, &other], &[])
        .await
        .unwrap();
    let since = unix_now() - 60;
    let got = store
        .events_since(&ws, Environment::Live, since, None, 100)
        .await
        .unwrap()
        .events;
    assert_eq!(got, std::slice::from_ref(&live));
    let got = store
        .events_since(&ws, Environment::Test, since, None, 100)
        .await
        .unwrap()
        .events;
    assert_eq!(got, [test]);
    // An id another workspace uses too (backends choose ids): each replays its own.
    let mut collide = event(&new_id("ws"), "agent.run.failed");
    collide.id = live.id.clone();
    store
        .enqueue_deliveries(&[], &[&collide], &[])
        .await
        .unwrap();
    let got = store
        .events_since(&ws, Environment::Live, since, None, 100)
        .await
        .unwrap()
        .events;
    assert_eq!(
        got,
        std::slice::from_ref(&live),
        "its own, not the other workspace's"
    );
    let by_id = store.event(&ws, Environment::Live, &live.id).await.unwrap();
    assert_eq!(by_id.as_ref(), Some(&live));
    let theirs = store
        .event(&collide.workspace, Environment::Live, &live.id)
        .await
        .unwrap();
    assert_eq!(theirs, Some(collide));
}

store_suite!(
    the_event_log_is_consumed_once_and_reclaimed_from_dead_consumers,
    a_tail_sees_only_events_logged_after_it_started,
    an_event_log_floor_is_past_what_was_logged_and_before_what_follows,
    a_replay_since_a_time_goes_on_page_by_page_past_the_last_event,
    events_since_filter_by_workspace_environment_and_time
);
