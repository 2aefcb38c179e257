//! Budget leases on the memory store: several meters sharing one store stand for replicas.

use super::*;
use crate::keys::{CachedKey, Environment, KeyStatus, Scopes};
use crate::metering::config::StoreDown;
use crate::metering::meter::{Meter, MeterConfig};
use crate::metering::ratelimit::Limit;
use crate::metering::usage::{Admit, KeyBudget};
use crate::shared::Credits;
use crate::store::MemoryStore;
use std::collections::HashMap;
use std::time::Duration;

const CREDIT: i64 = 1_000_000;

fn key(budget_credits: i64) -> CachedKey {
    CachedKey {
        id: "key_1".into(),
        workspace: "ws_1".into(),
        environment: Environment::Live,
        scopes: Arc::new(Scopes::default()),
        status: KeyStatus::Active,
        grace_until: None,
        monthly_budget: Some(Credits::from_micros(budget_credits * CREDIT)),
        budget_peers: Box::default(),
        scoped: None,
        last4: *b"abcd",
        expires_at: None,
        rate_limit: None,
        workspace_limit: Arc::new(crate::keys::SharedLimit::of(None)),
        metadata: None,
    }
}

/// A replica: a meter on `store`, flushing every 10 ms, and its stop switch.
fn replica(
    store: &Arc<MemoryStore>,
    dir: &std::path::Path,
) -> (
    Arc<Meter>,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let limit = Limit {
        requests_per_minute: 1_000_000,
        burst: 1_000_000,
    };
    let config = MeterConfig {
        flush_interval: Duration::from_millis(10),
        live_limit: limit,
        test_limit: limit,
        spool_dir: dir.to_path_buf(),
        token_mints: limit,
        token_metadata_bytes: 4096,
        audit_backlog: 10_000,
        audit_backlog_bytes: usize::MAX,
        refused_audit_per_second: 5,
        project_budgets: HashMap::new(),
        max_credits_per_request: crate::metering::config::DEFAULT_MAX_CREDITS_PER_REQUEST,
        budget_when_store_down: StoreDown::Admit,
    };
    let (meter, writer) = Meter::new(store.clone(), store.clone(), config);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(meter.clone().run(writer, stopped));
    (meter, stop, run)
}

fn now_ms() -> u64 {
    crate::ids::unix_millis()
}

/// One one-credit request of `k` admitted by `meter`: its reservation, or the refusal.
async fn admit_one(
    meter: &Meter,
    k: &CachedKey,
) -> Result<Option<Reservation>, crate::error::ApiError> {
    let one = Credits::from_micros(CREDIT);
    let (_, verdict) = meter
        .admit(k, None, KeyBudget::of(k), None, true, one, now_ms())
        .await;
    verdict
}

/// `n` one-credit requests at once, spread over `meters`; each finishes (charged one
/// credit) only once every one has been admitted or refused. Answers how many were admitted.
async fn concurrent(meters: &[Arc<Meter>], k: &Arc<CachedKey>, n: usize) -> usize {
    let admitted = futures_util::future::join_all((0..n).map(|i| {
        let meter = meters[i % meters.len()].clone();
        let k = k.clone();
        async move {
            let verdict = admit_one(&meter, &k).await;
            (meter, verdict.ok())
        }
    }))
    .await;
    let mut count = 0;
    for (meter, reservation) in admitted {
        if let Some(reservation) = reservation {
            count += 1;
            meter
                .usage
                .settle(k, None, Credits::from_micros(CREDIT), now_ms(), reservation);
        }
    }
    count
}

#[tokio::test]
async fn concurrent_requests_over_two_replicas_never_exceed_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let (a, stop_a, run_a) = replica(&store, dir.path());
    let (b, stop_b, run_b) = replica(&store, dir.path());
    let k = Arc::new(key(10));
    let admitted = concurrent(&[a.clone(), b.clone()], &k, 60).await;
    assert_eq!(admitted, 10, "the budget, and not one request more");
    // Later requests too: the budget is spent everywhere.
    assert_eq!(concurrent(&[a.clone(), b.clone()], &k, 20).await, 0);
    stop_a.send(true).unwrap();
    stop_b.send(true).unwrap();
    run_a.await.unwrap();
    run_b.await.unwrap();
    let report = crate::metering::store::UsageStore::usage_report(
        &*store,
        "ws_1",
        &crate::shared::month::month_of(now_ms() / 1000),
    )
    .await
    .unwrap();
    assert_eq!(
        report.keys["key_1"],
        10 * CREDIT,
        "charged what was admitted"
    );
}

#[tokio::test]
async fn a_lease_returned_at_shutdown_is_spent_by_another_replica() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let (a, stop_a, run_a) = replica(&store, dir.path());
    let k = Arc::new(key(100));
    // A big remainder: replica A takes a slice larger than one request.
    assert_eq!(concurrent(std::slice::from_ref(&a), &k, 1).await, 1);
    {
        let ledger = a.usage.ledger();
        let lease = &ledger.leases.by_workspace["ws_1"].keys["key_1"];
        assert!(
            lease.granted > CREDIT,
            "a slice, not one request: {}",
            lease.granted
        );
    }
    // Replica B, while A holds its lease, cannot spend the whole remainder...
    let (b, stop_b, run_b) = replica(&store, dir.path());
    let held = concurrent(std::slice::from_ref(&b), &k, 99).await;
    assert!(held < 99, "A's lease is A's: {held}");
    assert_eq!(concurrent(std::slice::from_ref(&b), &k, 99).await, 0);
    // ...until A stops and returns it.
    stop_a.send(true).unwrap();
    run_a.await.unwrap();
    tokio::time::sleep(Duration::from_millis(DRY_RETRY_MS + 50)).await;
    assert_eq!(
        concurrent(std::slice::from_ref(&b), &k, 99).await,
        99 - held
    );
    stop_b.send(true).unwrap();
    run_b.await.unwrap();
}

#[tokio::test]
async fn far_from_the_end_most_requests_need_no_store_call() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let (a, stop, run) = replica(&store, dir.path());
    let k = Arc::new(key(1_000_000));
    let (mut fetches, requests) = (0, 2_000);
    for _ in 0..requests {
        let found = a
            .usage
            .admit_budget(&k, KeyBudget::of(&k), None, CREDIT, now_ms());
        let reservation = match found {
            Admit::Reserved(r) => r,
            _ => {
                fetches += 1;
                admit_one(&a, &k).await.unwrap().unwrap()
            }
        };
        a.usage.settle(
            &k,
            None,
            Credits::from_micros(CREDIT),
            now_ms(),
            Some(reservation),
        );
    }
    assert!(
        fetches * 20 <= requests,
        "{fetches} store calls for {requests} requests"
    );
    stop.send(true).unwrap();
    run.await.unwrap();
}

#[test]
fn grants_are_a_share_of_the_remainder_and_never_more() {
    assert_eq!(lease_grant(0, 5, 8, 1), 0);
    assert_eq!(lease_grant(-3, 5, 8, 1), 0);
    assert_eq!(lease_grant(800, 1, 8, 1), 100);
    assert_eq!(lease_grant(801, 1, 8, 1), 101);
    assert_eq!(lease_grant(800, 300, 8, 1), 300);
    assert_eq!(lease_grant(10, 1, 8, 1), 2);
    assert_eq!(lease_grant(1, 1, 8, 1), 1);
    assert_eq!(lease_grant(3, 50, 8, 1), 3, "never more than what is left");
    // In whole units of a request: 10 credits left, one-credit requests: 2, not 1.25.
    assert_eq!(lease_grant(10 * CREDIT, CREDIT, 8, CREDIT), 2 * CREDIT);
    assert_eq!(lease_grant(CREDIT / 2, CREDIT, 8, CREDIT), CREDIT / 2);
}

#[test]
fn a_request_costing_more_than_it_reserved_overspends_by_the_excess_only() {
    let mut leases = Leases::new();
    let k = key(10);
    let applies = Applies {
        key: Some(("key_1", 10 * CREDIT, &[])),
        ..Applies::default()
    };
    let Reserve::Fetch(asks) = leases.reserve("ws_1", applies, CREDIT, 1_000) else {
        panic!("no lease yet");
    };
    let request = LeaseRequest {
        workspace: k.workspace.to_string(),
        month: "2026-01".into(),
        ttl_ms: LEASE_TTL_MS,
        share: LEASE_SHARE,
        unit: CREDIT,
        asks,
    };
    // The store grants 2 credits and has 8 left beyond them.
    let grant = LeaseGrant {
        granted: 2 * CREDIT,
        free: 8 * CREDIT,
    };
    leases.granted(&request, &[grant], 1_000, 1_000);
    let Reserve::Reserved(first) = leases.reserve("ws_1", applies, CREDIT, 1_001) else {
        panic!("within the lease");
    };
    let Reserve::Reserved(second) = leases.reserve("ws_1", applies, CREDIT, 1_002) else {
        panic!("within the lease");
    };
    assert!(matches!(
        leases.reserve("ws_1", applies, CREDIT, 1_003),
        Reserve::Fetch(_)
    ));
    // The first costs 3 credits: the lease is overdrawn by 1, the second still settles.
    leases.settle("ws_1", "key_1", None, 3 * CREDIT, Some(first));
    leases.settle("ws_1", "key_1", None, CREDIT, Some(second));
    let lease = &leases.by_workspace["ws_1"].keys["key_1"];
    assert_eq!((lease.charged, lease.reserved), (4 * CREDIT, 0));
    assert_eq!(lease.available(), -2 * CREDIT);
    // The flush records the spend and keeps the lease (used just now).
    let flushed = leases.for_flush("ws_1", 1_100, |_| true);
    assert_eq!(flushed.len(), 1);
    assert_eq!((flushed[0].spent, flushed[0].release), (4 * CREDIT, false));
    leases.flushed("ws_1", &flushed, 1_100);
    // Idle for long enough, it is returned, and dropped here.
    let flushed = leases.for_flush("ws_1", 1_100 + LEASE_IDLE_MS + 1, |_| true);
    assert_eq!(flushed.len(), 1);
    assert!(flushed[0].release);
    assert!(leases.by_workspace.is_empty());
}

#[test]
fn a_dry_budget_lends_what_is_left_then_refuses() {
    let mut leases = Leases::new();
    let applies = Applies {
        workspace: true,
        ..Applies::default()
    };
    let Reserve::Fetch(asks) = leases.reserve("ws_1", applies, CREDIT, 1_000) else {
        panic!("no lease yet");
    };
    let request = LeaseRequest {
        workspace: "ws_1".into(),
        month: "2026-01".into(),
        ttl_ms: LEASE_TTL_MS,
        share: LEASE_SHARE,
        unit: CREDIT,
        asks,
    };
    // Half a credit was left, and it is all this replica's now.
    let grant = LeaseGrant {
        granted: CREDIT / 2,
        free: 0,
    };
    leases.granted(&request, &[grant], 1_000, 1_000);
    let Reserve::Reserved(r) = leases.reserve("ws_1", applies, CREDIT, 1_001) else {
        panic!("what is left is lent");
    };
    assert_eq!(r.amount, CREDIT / 2);
    assert!(matches!(
        leases.reserve("ws_1", applies, CREDIT, 1_002),
        Reserve::Spent(BudgetScope::Workspace)
    ));
    // Once the retry interval is over, the store is asked again.
    assert!(matches!(
        leases.reserve("ws_1", applies, CREDIT, 1_000 + DRY_RETRY_MS + 1),
        Reserve::Fetch(_)
    ));
}
