//! Spend, rate counts and budgets.

use super::*;

async fn a_flush_reads_back_every_project_budget_and_the_watched_projects_spend(
    store: Arc<dyn Store>,
) {
    use svcgate::metering::usage::{UsageFlush, WorkspaceFlush};
    let ws = new_id("ws");
    store
        .set_project_budget(&ws, "web", Some(5_000))
        .await
        .unwrap();
    store
        .set_project_budget(&ws, "batch", Some(7_000))
        .await
        .unwrap();
    let flush = UsageFlush {
        id: new_id("flush"),
        month: "2026-11".into(),
        now: 0,
        workspaces: vec![WorkspaceFlush {
            workspace: ws.clone(),
            total: 30,
            projects: [("web".to_string(), 10), ("made-up".to_string(), 20)].into(),
            watch_projects: vec!["web".into()],
            event_id: new_id("evt"),
            ..Default::default()
        }],
        rate: Vec::new(),
        rate_id: String::new(),
    };
    let totals = &store.flush_usage(&flush).await.unwrap().workspaces[&ws];
    // Every budget, watched or not: a project without one needs no reading.
    assert_eq!(totals.project_budgets.len(), 2);
    assert_eq!(totals.project_budgets["batch"], 7_000);
    // The spend of watched projects only; the others are charged, not read.
    assert_eq!(totals.projects.len(), 1);
    assert_eq!(totals.projects["web"], 10);
    store.set_project_budget(&ws, "web", None).await.unwrap();
    let next = UsageFlush {
        id: new_id("flush"),
        ..flush.clone()
    };
    let totals = &store.flush_usage(&next).await.unwrap().workspaces[&ws];
    assert_eq!(totals.project_budgets.keys().collect::<Vec<_>>(), ["batch"]);
}

/// Spend of more keys than one flush carries goes out in bounded parts, the workspace's total
/// with the first, and all of it lands.
async fn spend_of_many_keys_lands_in_bounded_flushes(store: Arc<dyn Store>) {
    use svcgate::keys::CachedKey;
    use svcgate::metering::usage::{Usage, UsageFlush};
    use svcgate::metering::{Credits, MAX_FLUSH_ENTRIES};
    let ws = new_id("ws");
    let usage = Usage::new(Default::default());
    let keys = 2 * MAX_FLUSH_ENTRIES + 500;
    let record = key(&ws, unix_now());
    let now_ms = unix_now() * 1000;
    for i in 0..keys {
        let mut k = CachedKey::new(&record, ws.as_str().into(), Arc::new(Scopes::default()));
        k.id = format!("key_{i}").into();
        usage.charge(&k, Some("web"), Credits::from_micros(i as i64 + 1), now_ms);
    }
    let month = svcgate::metering::month::month_of(unix_now());
    let mut flushes = 0;
    loop {
        let (id, workspaces) = usage.begin_flush(&month);
        let entries: usize = workspaces
            .iter()
            .map(|w| w.keys.len() + w.projects.len())
            .sum();
        assert!(entries <= MAX_FLUSH_ENTRIES, "{entries} entries in a flush");
        let flush = UsageFlush {
            id,
            month: month.clone(),
            now: unix_now(),
            workspaces,
            rate: Vec::new(),
            rate_id: String::new(),
        };
        usage.finish_flush(&store.flush_usage(&flush).await.unwrap());
        flushes += 1;
        if !usage.deferred() {
            break;
        }
    }
    assert_eq!(flushes, 3);
    let report = store.usage_report(&ws, &month).await.unwrap();
    let expected: i64 = (1..=keys as i64).sum();
    assert_eq!(report.total, expected);
    assert_eq!(report.projects["web"], expected);
    assert_eq!(report.keys.len(), keys);
    assert!((0..keys).all(|i| report.keys[&format!("key_{i}")] == i as i64 + 1));
}

async fn a_usage_batch_is_added_once_however_often_it_is_sent(store: Arc<dyn Store>) {
    use svcgate::metering::usage::{UsageFlush, WorkspaceFlush};
    let ws = new_id("ws");
    let mut keys = std::collections::HashMap::new();
    keys.insert("key_1".to_string(), 250);
    let flush = UsageFlush {
        id: new_id("flush"),
        month: "2026-11".into(),
        now: 0,
        workspaces: vec![WorkspaceFlush {
            workspace: ws.clone(),
            total: 250,
            keys,
            watch_keys: vec!["key_1".into()],
            event_id: new_id("evt"),
            ..Default::default()
        }],
        rate: Vec::new(),
        rate_id: String::new(),
    };
    let first = store.flush_usage(&flush).await.unwrap();
    let again = store.flush_usage(&flush).await.unwrap();
    assert_eq!(first.workspaces[&ws].total, 250);
    assert_eq!(
        again.workspaces[&ws].total, 250,
        "a retried batch adds nothing"
    );
    assert_eq!(again.workspaces[&ws].keys["key_1"], 250);
    let next = UsageFlush {
        id: new_id("flush"),
        ..flush.clone()
    };
    assert_eq!(
        store.flush_usage(&next).await.unwrap().workspaces[&ws].total,
        500
    );
    assert_eq!(store.usage_report(&ws, "2026-11").await.unwrap().total, 500);

    // Spend of requests that arrived in October, flushed in November, is October's; a part of
    // another month reads nothing back.
    let late = UsageFlush {
        id: new_id("flush"),
        workspaces: vec![WorkspaceFlush {
            workspace: ws.clone(),
            month: Some("2026-10".into()),
            total: 40,
            keys: [("key_1".to_string(), 40)].into(),
            event_id: new_id("evt"),
            ..Default::default()
        }],
        ..flush.clone()
    };
    let snapshot = store.flush_usage(&late).await.unwrap();
    assert!(!snapshot.workspaces.contains_key(&ws), "{snapshot:?}");
    let october = store.usage_report(&ws, "2026-10").await.unwrap();
    assert_eq!((october.total, october.keys["key_1"]), (40, 40));
    assert_eq!(store.usage_report(&ws, "2026-11").await.unwrap().total, 500);
}

async fn rate_counts_are_added_once_per_batch_of_their_own(store: Arc<dyn Store>) {
    use svcgate::metering::usage::{RateFlush, UsageFlush};
    let key = new_id("key");
    let window = unix_now() / 60;
    let flush = |id: &str, rate_id: &str, count: u64| UsageFlush {
        id: id.into(),
        month: "2026-11".into(),
        now: 0,
        workspaces: Vec::new(),
        rate: vec![RateFlush {
            key: key.clone(),
            window,
            count,
        }],
        rate_id: rate_id.into(),
    };
    let current = |snapshot: svcgate::metering::usage::UsageSnapshot| snapshot.rate[&key].current;
    let (spend, first) = (new_id("flush"), new_id("rate"));
    assert_eq!(
        current(store.flush_usage(&flush(&spend, &first, 3)).await.unwrap()),
        3
    );
    // The answer was lost: the retry sends the same counts under the same id.
    assert_eq!(
        current(store.flush_usage(&flush(&spend, &first, 3)).await.unwrap()),
        3
    );
    // Spend retried under its id, with new rate counts under theirs: those are added.
    let second = new_id("rate");
    assert_eq!(
        current(store.flush_usage(&flush(&spend, &second, 2)).await.unwrap()),
        5
    );
    // Reading alone (no count) adds nothing and notes no id.
    let read = new_id("rate");
    assert_eq!(
        current(
            store
                .flush_usage(&flush(&new_id("flush"), &read, 0))
                .await
                .unwrap()
        ),
        5
    );
    assert_eq!(
        current(
            store
                .flush_usage(&flush(&new_id("flush"), &read, 4))
                .await
                .unwrap()
        ),
        9
    );
}

async fn absurd_spend_saturates_and_never_jams_the_flushes(store: Arc<dyn Store>) {
    use svcgate::metering::usage::{UsageFlush, WorkspaceFlush};
    let ws = new_id("ws");
    let flush = |total: i64| UsageFlush {
        id: new_id("flush"),
        month: "2026-11".into(),
        now: 0,
        workspaces: vec![WorkspaceFlush {
            workspace: ws.clone(),
            total,
            keys: [("key_1".to_string(), total)].into(),
            watch_keys: vec!["key_1".into()],
            event_id: new_id("evt"),
            ..Default::default()
        }],
        rate: Vec::new(),
        rate_id: String::new(),
    };
    // A backend reported a trillion credits a request for a while: the sums pass i64.
    for _ in 0..3 {
        let snapshot = store.flush_usage(&flush(i64::MAX / 2)).await.unwrap();
        assert!(snapshot.workspaces[&ws].total > 0);
    }
    let snapshot = store.flush_usage(&flush(1)).await.unwrap();
    assert_eq!(snapshot.workspaces[&ws].total, i64::MAX);
    assert_eq!(snapshot.workspaces[&ws].keys["key_1"], i64::MAX);
}

/// Budget leases: granted against the month's spend and every other lease, a share of what is
/// left in whole units; settled and returned with a flush; a project's budget in the store
/// wins over the one asked with; a key's lineage counts.
async fn leases_are_granted_against_spend_and_every_other_lease(store: Arc<dyn Store>) {
    use svcgate::metering::usage::{
        LeaseAsk, LeaseFlush, LeaseGrant, LeaseRequest, UsageFlush, WorkspaceFlush,
    };
    const C: i64 = 1_000_000;
    let ws = new_id("ws");
    let ask_for = |scope: &str, id: &str, limit: Option<i64>, ask: i64| LeaseAsk {
        scope: scope.into(),
        id: id.into(),
        limit,
        peers: Vec::new(),
        ask,
    };
    let request = |asks: Vec<LeaseAsk>| LeaseRequest {
        workspace: ws.clone(),
        month: "2026-11".into(),
        ttl_ms: 30_000,
        share: 8,
        unit: C,
        asks,
    };
    let grant = |granted: i64, free: i64| LeaseGrant { granted, free };
    let lease = |store: Arc<dyn Store>, asks: Vec<LeaseAsk>| {
        let request = request(asks);
        async move { store.lease_budget(&request).await.unwrap() }
    };
    let key = |id: &str, ask: i64| ask_for("key:key_1", id, Some(10 * C), ask);
    // An eighth of 10 credits, in whole credits: 2. Then all that is left to who asks for it.
    assert_eq!(
        lease(store.clone(), vec![key("a.1", C)]).await,
        [grant(2 * C, 8 * C)]
    );
    assert_eq!(
        lease(store.clone(), vec![key("b.1", 99 * C)]).await,
        [grant(8 * C, 0)]
    );
    assert_eq!(
        lease(store.clone(), vec![key("a.1", C)]).await,
        [grant(2 * C, 0)]
    );
    // Replica a spent its 2 credits and returns its lease; b spent 3 of its 8 and keeps it.
    let flush = |id: &str, total: i64, leases: Vec<LeaseFlush>| UsageFlush {
        id: new_id("flush"),
        month: "2026-11".into(),
        now: 0,
        workspaces: vec![WorkspaceFlush {
            workspace: ws.clone(),
            month: Some("2026-11".into()),
            total,
            keys: [("key_1".to_string(), total)].into(),
            event_id: new_id("evt"),
            leases,
            ..Default::default()
        }],
        rate: Vec::new(),
        rate_id: id.into(),
    };
    let settle = |id: &str, spent: i64, release: bool| LeaseFlush {
        scope: "key:key_1".into(),
        id: id.into(),
        spent,
        release,
    };
    let batch = flush("r1", 2 * C, vec![settle("a.1", 2 * C, true)]);
    store.flush_usage(&batch).await.unwrap();
    // Sent again (its answer lost): nothing changes twice.
    store.flush_usage(&batch).await.unwrap();
    store
        .flush_usage(&flush("r2", 3 * C, vec![settle("b.1", 3 * C, false)]))
        .await
        .unwrap();
    // Spent 5, b holds 5 more: nothing left for a new lease.
    assert_eq!(
        lease(store.clone(), vec![key("a.2", C)]).await,
        [grant(0, 0)]
    );
    // b returns the 5 it holds: they are free again.
    store
        .flush_usage(&flush("r3", 0, vec![settle("b.1", 3 * C, true)]))
        .await
        .unwrap();
    assert_eq!(
        lease(store.clone(), vec![key("a.2", C)]).await,
        [grant(C, 4 * C)]
    );
    // A key of the same lineage counts key_1's spend and leases.
    let mut successor = ask_for("key:key_2", "a.3", Some(10 * C), 20 * C);
    successor.peers = vec!["key_1".into()];
    assert_eq!(
        lease(store.clone(), vec![successor]).await,
        [grant(4 * C, 0)]
    );
    // A project's budget in the store wins over the one the replica asks with; the workspace
    // without credits grants what is asked. One call answers every ask, in order.
    store
        .set_project_budget(&ws, "p", Some(3 * C))
        .await
        .unwrap();
    let grants = lease(
        store.clone(),
        vec![
            ask_for("project:p", "a.4", Some(100 * C), 5 * C),
            ask_for("workspace", "a.5", None, C),
        ],
    )
    .await;
    assert_eq!(grants[0], grant(3 * C, 0));
    assert!(grants[1].granted >= C, "{grants:?}");
}

store_suite!(
    leases_are_granted_against_spend_and_every_other_lease,
    a_flush_reads_back_every_project_budget_and_the_watched_projects_spend,
    spend_of_many_keys_lands_in_bounded_flushes,
    a_usage_batch_is_added_once_however_often_it_is_sent,
    rate_counts_are_added_once_per_batch_of_their_own,
    absurd_spend_saturates_and_never_jams_the_flushes
);
