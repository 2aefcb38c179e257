//! One suite of store behaviour, run against the in-memory store and against a real Redis.

mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;
use svcgate::events::{log_position, Event};
use svcgate::ids::{new_id, unix_now};
use svcgate::keys::KeyHash;
use svcgate::keys::{self, Environment, KeyParams, KeyRecord, KeyStatus, Scopes, Workspace};
use svcgate::metering::audit::{AuditCursor, AuditQuery, AuditRecord};
use svcgate::store::{
    AfterAttempt, AuditStore, ClaimRequest, ClaimedDelivery, DeliveryQueue, EventLog,
    IndexFillTiming, KeyStore, ListenSlots, MemoryStore, NoticeStore, RedisStore, Saved,
    StoreError, StoreHealth, UsageStore, SCHEMA_VERSION,
};
use svcgate::webhooks::delivery::{Attempt, Delivery, DeliveryStatus, DeliverySummary};
use svcgate::webhooks::endpoint::{Endpoint, EndpointStatus};
use svcgate::webhooks::notice::PauseNotice;

/// Every area's storage, as both stores provide it: what the suite runs against.
trait Store:
    StoreHealth
    + KeyStore
    + UsageStore
    + AuditStore
    + EventLog
    + DeliveryQueue
    + NoticeStore
    + ListenSlots
{
}

impl<T> Store for T where
    T: StoreHealth
        + KeyStore
        + UsageStore
        + AuditStore
        + EventLog
        + DeliveryQueue
        + NoticeStore
        + ListenSlots
        + ?Sized
{
}

fn workspace() -> Workspace {
    Workspace {
        id: new_id("ws"),
        name: "Acme".into(),
        admin_emails: vec!["ops@acme.example".into()],
        monthly_credits: None,
        credits_low_threshold: None,
        created_at: unix_now(),
    }
}

fn key(workspace: &str, created_at: u64) -> KeyRecord {
    keys::issue(
        KeyParams {
            workspace: workspace.into(),
            environment: Environment::Live,
            scopes: Scopes::new(["models:read"]),
            name: "k".into(),
            monthly_budget: None,
        },
        created_at,
    )
    .1
}

async fn workspaces_round_trip(store: Arc<dyn Store>) {
    let ws = workspace();
    store.create_workspace(&ws).await.unwrap();
    assert_eq!(store.workspace(&ws.id).await.unwrap(), Some(ws.clone()));
    assert!(matches!(
        store.create_workspace(&ws).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.workspace("ws_missing").await.unwrap(), None);
}

async fn workspaces_are_listed_oldest_first_a_page_at_a_time(store: Arc<dyn Store>) {
    // Created out of order, and two in the same second (then by id).
    let mut made = Vec::new();
    for created_at in [30, 10, 20, 20] {
        let ws = Workspace {
            created_at,
            ..workspace()
        };
        store.create_workspace(&ws).await.unwrap();
        made.push(ws);
    }
    made.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let ids: Vec<String> = made.iter().map(|w| w.id.clone()).collect();
    let listed = |page: (Vec<Workspace>, bool)| -> (Vec<String>, bool) {
        (page.0.into_iter().map(|w| w.id).collect(), page.1)
    };
    assert_eq!(
        listed(store.workspaces(None, 100).await.unwrap()),
        (ids.clone(), false)
    );
    assert_eq!(
        listed(store.workspaces(None, 4).await.unwrap()),
        (ids.clone(), false),
        "exactly a page: nothing more"
    );
    assert_eq!(
        listed(store.workspaces(Some(&ids[0]), 2).await.unwrap()),
        (ids[1..3].to_vec(), true)
    );
    assert_eq!(
        listed(store.workspaces(Some(&ids[2]), 2).await.unwrap()),
        (ids[3..].to_vec(), false)
    );
    assert_eq!(
        listed(store.workspaces(Some(&ids[3]), 2).await.unwrap()),
        (Vec::new(), false)
    );
}

async fn listen_slots_are_capped_leased_renewed_and_freed(store: Arc<dyn Store>) {
    // Real time: Redis times leases by its own clock. A lease of 3 s, renewed at 1.5 s.
    let key = new_id("key");
    let hold = |stream: &'static str| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .hold_listen_slot(&key, stream, 2, 3_000)
                .await
                .unwrap()
        }
    };
    assert!(hold("s1").await);
    assert!(hold("s2").await);
    assert!(!hold("s3").await, "both slots held");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(hold("s1").await, "a holder renews its own");
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    // s2's lease ended at 3 s; s1's, renewed, ends at 4.5 s.
    assert!(hold("s3").await, "an expired lease frees its slot");
    assert!(!hold("s4").await);
    store.release_listen_slot(&key, "s1").await.unwrap();
    assert!(hold("s4").await, "a released slot is free");
}

async fn workspace_changes_keep_identity_and_lose_none(store: Arc<dyn Store>) {
    let ws = workspace();
    store.create_workspace(&ws).await.unwrap();
    // Twelve writers at once, each adding an address: compare-and-set retries keep all twelve.
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let store = store.clone();
            let id = ws.id.clone();
            tokio::spawn(async move {
                store
                    .update_workspace(&id, &move |w: &mut Workspace| {
                        w.admin_emails.push(format!("ops{i}@acme.example"));
                        // What a change may not touch.
                        w.id = "ws_other".into();
                        w.created_at = 7;
                    })
                    .await
                    .unwrap()
                    .unwrap()
            })
        })
        .collect();
    for t in tasks {
        let changed = t.await.unwrap();
        assert_eq!(
            (changed.id.as_str(), changed.created_at),
            (ws.id.as_str(), ws.created_at)
        );
    }
    let read = store.workspace(&ws.id).await.unwrap().unwrap();
    assert_eq!(read.admin_emails.len(), 13, "{:?}", read.admin_emails);
    assert_eq!(store.workspace("ws_other").await.unwrap(), None);
    let missing = store
        .update_workspace("ws_missing", &|w: &mut Workspace| w.name = "x".into())
        .await
        .unwrap();
    assert_eq!(missing, None);
    assert_eq!(
        store.workspace("ws_missing").await.unwrap(),
        None,
        "not created"
    );
}

async fn keys_are_found_every_way(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let (a, b) = (key(&ws, 20), key(&ws, 10));
    let elsewhere = key(&new_id("ws"), 0);
    for k in [&a, &b, &elsewhere] {
        store.insert_key(k).await.unwrap();
    }
    assert_eq!(*store.key_by_hash(&a.hash).await.unwrap().unwrap(), a);
    assert_eq!(*store.key_by_id(&b.id).await.unwrap().unwrap(), b);
    let listed: Vec<String> = store
        .keys_in_workspace(&ws, None, usize::MAX)
        .await
        .unwrap()
        .iter()
        .map(|k| k.id.clone())
        .collect();
    assert_eq!(listed, [b.id.clone(), a.id.clone()], "oldest first");
    assert!(store
        .key_by_hash(&KeyHash::of("x"))
        .await
        .unwrap()
        .is_none());
    assert!(store.key_by_id("key_missing").await.unwrap().is_none());
    assert!(store
        .keys_in_workspace("ws_none", None, usize::MAX)
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        store.insert_key(&a).await,
        Err(StoreError::Conflict(_))
    ));
}

/// Every key is listed by its digest, over as many pages as it takes, and nothing of another
/// namespace (the Redis suite shares one Redis among its tests).
async fn every_key_is_listed_by_digest(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let mut keys = std::collections::HashSet::new();
    for n in 0..1_200 {
        let k = key(&ws, n);
        store.insert_key(&k).await.unwrap();
        keys.insert(k.hash);
    }
    let (mut listed, mut cursor, mut pages) = (std::collections::HashSet::new(), 0, 0);
    loop {
        let (digests, next) = store.key_digests(cursor).await.unwrap();
        listed.extend(digests);
        pages += 1;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert_eq!(listed, keys, "in {pages} pages");
}

/// A scoped token of `parent`, for 900 s from `now`.
fn token_of(parent: &KeyRecord, now: u64) -> KeyRecord {
    let cached = keys::CachedKey::new(
        parent,
        parent.workspace.as_str().into(),
        Arc::new(parent.scopes.clone()),
    );
    let scopes = Scopes::new(["models:read"]);
    keys::mint(&cached, parent.hash, scopes, 900, Default::default(), now).1
}

/// A scoped token minted is heard of by the store's replica (on Redis, through the tokens
/// channel every replica subscribes to), until it expires; a key is no token.
async fn a_minted_token_is_heard_of_until_it_expires(store: Arc<dyn Store>) {
    let parent = key(&new_id("ws"), 1);
    store.insert_key(&parent).await.unwrap();
    // Subscribed: on Redis the key-change signal fires once the subscription is up (and for
    // the key written, if it was up then).
    tokio::time::timeout(Duration::from_secs(5), store.key_change_signal().notified())
        .await
        .expect("subscribed");
    let now = unix_now();
    let token = token_of(&parent, now);
    let expires_at = token.scoped.as_ref().unwrap().expires_at;
    store.insert_token(&token, 960).await.unwrap();
    let minted = store.minted_tokens();
    let mut heard = false;
    for _ in 0..500 {
        heard = minted.listed(&token.hash, now);
        if heard {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(heard, "the token is heard of");
    assert!(!minted.listed(&token.hash, expires_at), "not once expired");
    assert!(!minted.listed(&parent.hash, now), "a key is no token");
}

async fn updates_keep_identity_and_are_seen_by_hash(store: Arc<dyn Store>) {
    let k = key(&new_id("ws"), 1);
    store.insert_key(&k).await.unwrap();
    let updated = store
        .update_key(&k.id, &|r: &mut KeyRecord| {
            r.status = KeyStatus::Revoked;
            r.workspace = "ws_evil".into();
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(updated.status, KeyStatus::Revoked);
    assert_eq!(updated.workspace, k.workspace);
    let by_hash = store.key_by_hash(&k.hash).await.unwrap().unwrap();
    assert_eq!(by_hash.status, KeyStatus::Revoked);
    assert!(store
        .update_key("key_missing", &|_: &mut KeyRecord| {})
        .await
        .unwrap()
        .is_none());
}

async fn a_change_that_changes_nothing_emits_nothing(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let k = key(&ws, 1);
    store.insert_key(&k).await.unwrap();
    let revoke = |r: &mut KeyRecord| r.status = KeyStatus::Revoked;
    // Two leak reports of one key, one after the other: the second finds it revoked.
    let events: Vec<Event> = (0..2)
        .map(|_| {
            Event::new(
                "key.auto_revoked",
                &ws,
                Environment::Live,
                serde_json::json!({"key_id": k.id}),
            )
        })
        .collect();
    for event in &events {
        let revoked = store
            .update_key_emitting(&k.id, &revoke, event)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(revoked.status, KeyStatus::Revoked);
    }
    let logged = logged_events(&store, &ws).await;
    let ids: Vec<&str> = logged.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        [events[0].id.as_str()],
        "key.auto_revoked once per key"
    );
}

async fn concurrent_updates_lose_nothing(store: Arc<dyn Store>) {
    let k = key(&new_id("ws"), 1);
    store.insert_key(&k).await.unwrap();
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let store = store.clone();
            let id = k.id.clone();
            tokio::spawn(async move {
                let scope = format!("scope{i}:use");
                store
                    .update_key(&id, &move |r: &mut KeyRecord| {
                        let mut names: Vec<String> = r.scopes.iter().map(String::from).collect();
                        names.push(scope.clone());
                        r.scopes = Scopes::new(names);
                    })
                    .await
                    .unwrap()
                    .unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let r = store.key_by_id(&k.id).await.unwrap().unwrap();
    assert_eq!(r.scopes.iter().count(), 13, "{:?}", r.scopes);
}

async fn changes_are_logged_by_epoch(store: Arc<dyn Store>) {
    let first = store.key_changes_since(0, "").await.unwrap();
    let (start, mark) = (first.epoch, first.mark);
    let nothing = store.key_changes_since(start, &mark).await.unwrap();
    assert_eq!(nothing.changed, Some(vec![]));

    let signal = store.key_change_signal();
    let a = key(&new_id("ws"), 1);
    let b = key(&new_id("ws"), 1);
    store.insert_key(&a).await.unwrap();
    store.insert_key(&b).await.unwrap();
    let mid = store.key_changes_since(start, &mark).await.unwrap();
    assert_eq!(mid.epoch, start + 2);
    store
        .update_key(&a.id, &|r: &mut KeyRecord| r.status = KeyStatus::Revoked)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), signal.notified())
        .await
        .expect("change signal fires");

    let changes = store.key_changes_since(start, &mark).await.unwrap();
    assert_eq!(changes.epoch, start + 3);
    assert_eq!(changes.changed, Some(vec![a.hash, b.hash, a.hash]));
    let later = store.key_changes_since(mid.epoch, &mid.mark).await.unwrap();
    assert_eq!(later.changed, Some(vec![a.hash]));
    // An epoch from the future (the store was reset) means: drop everything.
    let future = store.key_changes_since(start + 1000, &mark).await.unwrap();
    assert_eq!(future.changed, None);
}

async fn a_rotation_keeps_a_change_made_after_its_successor_was_built(store: Arc<dyn Store>) {
    use svcgate::store::Rotation;
    let mut old = key(&new_id("ws"), 1);
    old.scopes = Scopes::new(["models:read", "images:create"]);
    store.insert_key(&old).await.unwrap();
    // The admin API builds the successor from the record it read...
    let stale = store.key_by_id(&old.id).await.unwrap().unwrap();
    let successor = keys::successor(&stale, &keys::format::generate(Environment::Live), 2);
    // ...and a PATCH narrows the old key's scopes before the rotation's step.
    store
        .update_key(&old.id, &|r: &mut KeyRecord| {
            r.scopes = Scopes::new(["models:read"]);
            r.monthly_budget = Some(svcgate::metering::Credits::from_micros(5_000_000));
        })
        .await
        .unwrap();
    let Rotation::Rotated {
        successor: stored, ..
    } = store.rotate_key(&old.id, &successor, 500).await.unwrap()
    else {
        panic!("rotated");
    };
    let found = store.key_by_hash(&successor.hash).await.unwrap().unwrap();
    for record in [&*stored, &*found] {
        assert_eq!(record.scopes, Scopes::new(["models:read"]));
        assert_eq!(
            record.monthly_budget,
            Some(svcgate::metering::Credits::from_micros(5_000_000))
        );
        assert_eq!(record.id, successor.id);
    }
}

async fn rotation_is_atomic_and_idempotent(store: Arc<dyn Store>) {
    use svcgate::store::Rotation;
    let old = key(&new_id("ws"), 1);
    store.insert_key(&old).await.unwrap();
    let successor = keys::successor(&old, &keys::format::generate(Environment::Live), 2);
    let first = store.key_changes_since(0, "").await.unwrap();
    let (start, mark) = (first.epoch, first.mark);

    match store.rotate_key(&old.id, &successor, 500).await.unwrap() {
        Rotation::Rotated { old: rotated, .. } => {
            assert_eq!(rotated.status, KeyStatus::Rotating);
            assert_eq!(rotated.grace_until, Some(500));
            assert_eq!(rotated.rotated_to.as_deref(), Some(successor.id.as_str()));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.rotate_key(&old.id, &successor, 900).await.unwrap(),
        Rotation::AlreadyRotated
    );
    let mut other = successor.clone();
    other.id = new_id("key");
    other.hash = KeyHash::of("another");
    assert_eq!(
        store.rotate_key(&old.id, &other, 900).await.unwrap(),
        Rotation::NotRotatable(KeyStatus::Rotating)
    );
    assert_eq!(
        store.rotate_key("key_missing", &other, 900).await.unwrap(),
        Rotation::NotFound
    );
    let stored_old = store.key_by_id(&old.id).await.unwrap().unwrap();
    assert_eq!(
        stored_old.grace_until,
        Some(500),
        "the retry changed nothing"
    );
    assert_eq!(
        *store.key_by_hash(&successor.hash).await.unwrap().unwrap(),
        successor
    );
    assert_eq!(
        store
            .keys_in_workspace(&old.workspace, None, usize::MAX)
            .await
            .unwrap()
            .len(),
        2
    );
    let changes = store.key_changes_since(start, &mark).await.unwrap();
    assert_eq!(changes.changed, Some(vec![old.hash, successor.hash]));
}

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

fn endpoint(workspace: &str, events: &[&str]) -> Endpoint {
    Endpoint {
        id: new_id("we"),
        workspace: workspace.into(),
        environment: Environment::Live,
        url: "https://example.com/hook".into(),
        events: events.iter().map(|e| e.to_string()).collect(),
        secret: "whsec_x".into(),
        status: EndpointStatus::Active,
        created_at: 1,
    }
}

fn event(workspace: &str, event_type: &str) -> Event {
    Event::new(
        event_type,
        workspace,
        Environment::Live,
        serde_json::json!({"n": 1}),
    )
}

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

/// Every event of `workspace` in the log, as a worker reads it.
async fn logged_events(store: &Arc<dyn Store>, workspace: &str) -> Vec<Event> {
    let mut feed = store
        .consume_events(&new_id("reader"), Duration::from_secs(60))
        .await
        .unwrap();
    let read = feed.next(1_000, Duration::from_millis(200)).await.unwrap();
    read.into_iter()
        .map(|l| l.event)
        .filter(|e| e.workspace == workspace)
        .collect()
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

/// Claims pause notices due at `now_ms` for a 5-second lease; answers their ids.
async fn claim_notices(store: &Arc<dyn Store>, now_ms: u64) -> Vec<String> {
    let claimed = store
        .claim_pause_notices(now_ms, Duration::from_secs(5), 10)
        .await
        .unwrap();
    claimed.into_iter().map(|n| n.id).collect()
}

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

/// Claims at `now_ms` with 5 s leases, up to 10 deliveries, 4 per endpoint, nothing busy.
async fn claim_from(
    store: &Arc<dyn Store>,
    now_ms: u64,
    struggling_max: usize,
) -> Vec<ClaimedDelivery> {
    store
        .claim_deliveries(&ClaimRequest {
            now_ms,
            lease: Duration::from_secs(5),
            max: 10,
            per_endpoint: 4,
            busy: &[],
            struggling: &[],
            struggling_max,
        })
        .await
        .unwrap()
}

/// `delivery` failed `tried`, its endpoint having failed `failures` times in a row before:
/// retried on `schedule`, and saved as the endpoint's failure. Answers it as saved.
async fn save_failure(
    store: &Arc<dyn Store>,
    mut delivery: Delivery,
    tried: Attempt,
    schedule: &[Duration],
    failures: u32,
) -> Delivery {
    assert!(!delivery.fail(tried, schedule, failures));
    store
        .save_delivery(&delivery, AfterAttempt::Failing(failures + 1))
        .await
        .unwrap();
    delivery
}

fn attempt(at_ms: u64, status_code: Option<u16>) -> Attempt {
    Attempt {
        at_ms,
        status_code,
        error: None,
        duration_ms: 5,
        url: None,
    }
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

/// An audit record of `workspace` that arrived at `time_ms`.
fn audit_record(workspace: &str, time_ms: u64) -> AuditRecord {
    AuditRecord {
        time_ms,
        request_id: new_id("req").into(),
        workspace: workspace.into(),
        key_id: "key_1".into(),
        key: "svc_live_…abcd".into(),
        environment: Environment::Live,
        project: None,
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        model: None,
        status: 200,
        credits: 1.0,
        client_ip: None,
        latency_ms: 1,
        token_id: None,
        metadata: None,
    }
}

async fn an_audit_batch_with_an_id_is_appended_once(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let now = unix_now() * 1000;
    let first = [audit_record(&ws, now), audit_record(&ws, now + 1)];
    store.append_audit(&first, Some("spool-1:0")).await.unwrap();
    // The same id again adds nothing, whatever it holds; another id and no id add theirs.
    let again = [audit_record(&ws, now + 2)];
    store.append_audit(&again, Some("spool-1:0")).await.unwrap();
    store
        .append_audit(&[audit_record(&ws, now + 3)], Some("spool-1:5000"))
        .await
        .unwrap();
    store
        .append_audit(&[audit_record(&ws, now + 4)], None)
        .await
        .unwrap();
    let query = AuditQuery {
        workspace: ws.clone(),
        limit: 100,
        ..AuditQuery::default()
    };
    let mut times: Vec<u64> = store
        .audit(&query)
        .await
        .unwrap()
        .iter()
        .map(|r| r.time_ms - now)
        .collect();
    times.sort();
    assert_eq!(times, [0, 1, 3, 4]);
}

/// A spool file replayed, then replayed again by a process that found it still there (the one
/// before it died before it could remove it), is stored once.
#[tokio::test]
async fn redis_an_audit_spool_file_replayed_twice_is_stored_once() {
    let ns = TestNamespace::new();
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis_url(), &ns.name).unwrap());
    let ws = new_id("ws");
    let dir = tempfile::tempdir().unwrap();
    let name = "audit-00000000000000000001-s_test.jsonl";
    let lines: String = (0..3)
        .map(|i| serde_json::to_string(&audit_record(&ws, unix_now() * 1000 + i)).unwrap() + "\n")
        .collect();
    for _ in 0..2 {
        std::fs::write(dir.path().join(name), &lines).unwrap();
        let (_, mut writer) =
            svcgate::metering::audit::audit_log(store.clone(), dir.path().into(), 100);
        assert_eq!(writer.flush().await, 3);
        assert!(!dir.path().join(name).exists(), "replayed, then removed");
    }
    assert_eq!(audit_entries(&ns, &ws).await, 1);
}

/// How many entries a workspace's audit stream holds.
async fn audit_entries(ns: &TestNamespace, ws: &str) -> usize {
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    ::redis::cmd("XLEN")
        .arg(format!("{}:audit:{{{ws}}}", ns.name))
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// A stream entry's field and value, as `XRANGE` answers them.
type StreamField = (String, Vec<u8>);

/// The newest entry of a workspace's audit stream: its id and what its `records` field holds.
async fn newest_audit_entry(ns: &TestNamespace, ws: &str) -> (String, Vec<u8>) {
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut top: Vec<(String, Vec<StreamField>)> = ::redis::cmd("XREVRANGE")
        .arg(format!("{}:audit:{{{ws}}}", ns.name))
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (id, mut fields) = top.remove(0);
    (id, fields.remove(0).1)
}

/// Audit batches are held compressed (a record is ~320 bytes of JSON, kept 30 days), and the
/// uncompressed JSON an earlier version wrote is still read, both in one answer.
#[tokio::test]
async fn redis_audit_batches_are_held_compressed_and_earlier_ones_still_read() {
    let ns = TestNamespace::new();
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis_url(), &ns.name).unwrap());
    let ws = new_id("ws");
    let now = unix_now() * 1000;
    let stream = format!("{}:audit:{{{ws}}}", ns.name);
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // As an earlier version wrote it.
    let earlier = [audit_record(&ws, now - 1_000)];
    let _: String = ::redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("records")
        .arg(serde_json::to_string(&earlier).unwrap())
        .query_async(&mut conn)
        .await
        .unwrap();
    let batch: Vec<AuditRecord> = (0..64).map(|i| audit_record(&ws, now + i)).collect();
    store.append_audit(&batch, None).await.unwrap();
    let (_, held) = newest_audit_entry(&ns, &ws).await;
    let json = serde_json::to_vec(&batch).unwrap();
    assert!(held.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]), "a zstd frame");
    assert!(
        held.len() * 4 < json.len(),
        "{} bytes held for {} of JSON",
        held.len(),
        json.len()
    );
    let got = store
        .audit(&AuditQuery {
            workspace: ws.clone(),
            limit: 100,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    let mut want: Vec<&str> = batch.iter().map(|r| &*r.request_id).collect();
    want.reverse();
    want.push(&earlier[0].request_id);
    assert_eq!(got.iter().map(|r| &*r.request_id).collect::<Vec<_>>(), want);
}

/// A gateway whose clock runs a day ahead of Redis's dates its batches' stream entries at most
/// ten minutes ahead: the stream is trimmed by entry id, and every later entry's id follows
/// the last one's, so an entry dated a day ahead would keep the log untrimmed for a day. The
/// batch is held by one entry.
#[tokio::test]
async fn redis_an_audit_entry_is_dated_at_most_ten_minutes_ahead() {
    let ns = TestNamespace::new();
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis_url(), &ns.name).unwrap());
    let ws = new_id("ws");
    let day_ahead = (unix_now() + 86_400) * 1000;
    store
        .append_audit(&[audit_record(&ws, day_ahead)], None)
        .await
        .unwrap();
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (secs, micros): (u64, u64) = ::redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let redis_now = secs * 1000 + micros / 1000;
    let (id, _) = newest_audit_entry(&ns, &ws).await;
    let id_ms: u64 = id.split('-').next().unwrap().parse().unwrap();
    let ahead = id_ms.saturating_sub(redis_now);
    assert!(
        (590_000..=600_000).contains(&ahead),
        "dated {ahead} ms ahead of Redis's clock"
    );
    // Appended under Redis's time first, then moved: the first entry is gone.
    assert_eq!(audit_entries(&ns, &ws).await, 1);
}

async fn audit_reads_the_newest_records_whichever_batch_holds_them(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let now = unix_now() * 1000;
    // One replica writes the newest records first; another then writes a batch of older ones
    // (a longer backlog, or a spool written back).
    let newest: Vec<AuditRecord> = (0..5).map(|i| audit_record(&ws, now - 100 + i)).collect();
    let older: Vec<AuditRecord> = (0..5)
        .map(|i| audit_record(&ws, now - 60_000 + i))
        .collect();
    store.append_audit(&newest, None).await.unwrap();
    store.append_audit(&older, None).await.unwrap();
    let query = |limit| AuditQuery {
        workspace: ws.clone(),
        limit,
        ..AuditQuery::default()
    };
    let times = |records: Vec<AuditRecord>| records.iter().map(|r| r.time_ms).collect::<Vec<_>>();
    let got = times(store.audit(&query(5)).await.unwrap());
    assert_eq!(got, (0..5).rev().map(|i| now - 100 + i).collect::<Vec<_>>());
    let all = times(store.audit(&query(10)).await.unwrap());
    assert_eq!(all.len(), 10);
    assert_eq!(&all[..3], &got[..3]);
}

/// Records carry their gateway's clock, stream entries Redis's: the records of a gateway whose
/// clock runs ahead of Redis's (a second, a minute) are found by `since`, also when a gateway
/// on time wrote a batch after them, and are the newest in a page.
async fn audit_since_finds_records_of_a_gateway_whose_clock_runs_ahead(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let now_s = unix_now();
    let ahead = |ms: u64| audit_record(&ws, now_s * 1000 + ms);
    store.append_audit(&[ahead(1_500)], None).await.unwrap();
    store
        .append_audit(&[ahead(60_000), ahead(59_000)], None)
        .await
        .unwrap();
    // Spooled through an outage, with an id, as the spool's batches are.
    store
        .append_audit(&[ahead(61_000)], Some("spool-1:0"))
        .await
        .unwrap();
    store
        .append_audit(&[audit_record(&ws, now_s * 1000)], None)
        .await
        .unwrap();
    let query = |since: u64, limit: usize| AuditQuery {
        workspace: ws.clone(),
        since: Some(since),
        limit,
        ..AuditQuery::default()
    };
    let times = |records: Vec<AuditRecord>| {
        records
            .iter()
            .map(|r| r.time_ms - now_s * 1000)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        times(store.audit(&query(now_s + 1, 10)).await.unwrap()),
        [61_000, 60_000, 59_000, 1_500]
    );
    assert_eq!(
        times(store.audit(&query(now_s + 30, 10)).await.unwrap()),
        [61_000, 60_000, 59_000]
    );
    assert_eq!(
        times(store.audit(&query(now_s, 2)).await.unwrap()),
        [61_000, 60_000]
    );
}

async fn audit_pages_after_a_cursor_hold_every_record_once(store: Arc<dyn Store>) {
    let ws = new_id("ws");
    let now = unix_now() * 1000;
    // Three records in one millisecond (a page may end among them), then a batch of older
    // records written after the newer ones, as a spool written back after an outage is.
    let mut newest: Vec<AuditRecord> = (0..3).map(|_| audit_record(&ws, now - 10)).collect();
    newest.extend((0..4).map(|i| audit_record(&ws, now - 20 - i)));
    let older: Vec<AuditRecord> = (0..6).map(|i| audit_record(&ws, now - 5_000 - i)).collect();
    store.append_audit(&newest, None).await.unwrap();
    store.append_audit(&older, None).await.unwrap();
    let mut want: Vec<AuditRecord> = newest.iter().chain(&older).cloned().collect();
    AuditRecord::sort_listing(&mut want);
    let want: Vec<String> = want.iter().map(|r| r.request_id.to_string()).collect();

    for limit in [1, 2, 3, 4, 13] {
        let mut got = Vec::new();
        let mut cursor: Option<AuditCursor> = None;
        loop {
            let page = store
                .audit(&AuditQuery {
                    workspace: ws.clone(),
                    cursor: cursor.clone(),
                    limit,
                    ..AuditQuery::default()
                })
                .await
                .unwrap();
            assert!(page.len() <= limit);
            let Some(last) = page.last() else { break };
            // A cursor goes to the client as text and comes back.
            let text = AuditCursor::after(last).to_string();
            cursor = Some(text.parse().expect("a cursor reads back"));
            got.extend(page.iter().map(|r| r.request_id.to_string()));
            assert!(
                got.len() <= want.len(),
                "limit {limit}: a page repeats records"
            );
        }
        assert_eq!(got, want, "limit {limit}");
    }
}

macro_rules! store_suite {
    ($($name:ident),*) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(Arc::new(MemoryStore::new())).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let ns = TestNamespace::new();
                    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
                    store.ping().await.expect("Redis answers at REDIS_URL");
                    super::$name(Arc::new(store)).await;
                }
            )*
        }
    };
}

store_suite!(
    workspaces_round_trip,
    workspaces_are_listed_oldest_first_a_page_at_a_time,
    listen_slots_are_capped_leased_renewed_and_freed,
    workspace_changes_keep_identity_and_lose_none,
    keys_are_found_every_way,
    every_key_is_listed_by_digest,
    a_minted_token_is_heard_of_until_it_expires,
    updates_keep_identity_and_are_seen_by_hash,
    a_change_that_changes_nothing_emits_nothing,
    concurrent_updates_lose_nothing,
    changes_are_logged_by_epoch,
    rotation_is_atomic_and_idempotent,
    a_rotation_keeps_a_change_made_after_its_successor_was_built,
    a_usage_batch_is_added_once_however_often_it_is_sent,
    spend_of_many_keys_lands_in_bounded_flushes,
    rate_counts_are_added_once_per_batch_of_their_own,
    a_flush_reads_back_every_project_budget_and_the_watched_projects_spend,
    the_event_log_is_consumed_once_and_reclaimed_from_dead_consumers,
    a_tail_sees_only_events_logged_after_it_started,
    an_event_log_floor_is_past_what_was_logged_and_before_what_follows,
    events_since_filter_by_workspace_environment_and_time,
    claims_respect_due_times_leases_and_per_endpoint_caps,
    an_audit_batch_with_an_id_is_appended_once,
    audit_reads_the_newest_records_whichever_batch_holds_them,
    audit_pages_after_a_cursor_hold_every_record_once,
    audit_since_finds_records_of_a_gateway_whose_clock_runs_ahead,
    a_thousand_endpoints_with_no_room_do_not_hold_up_one_that_has,
    struggling_endpoints_take_at_most_their_share_between_them,
    a_failure_holds_its_endpoints_queue_until_the_retry_and_an_answer_releases_it,
    endpoints_are_capped_per_workspace_and_a_delete_makes_room,
    a_replay_since_a_time_goes_on_page_by_page_past_the_last_event,
    a_failure_at_a_url_the_endpoint_no_longer_has_counts_for_nothing,
    absurd_spend_saturates_and_never_jams_the_flushes,
    a_pause_queues_one_notice_leased_while_claimed_and_kept_until_removed,
    an_entry_fanned_out_twice_queues_its_deliveries_once,
    a_long_deliveries_listing_is_whole_and_newest_first,
    resuming_an_endpoint_held_back_puts_its_failed_delivery_due_now,
    a_retry_in_flight_when_its_endpoint_is_resumed_counts_for_nothing
);

/// The schema version: none (data of a version before it was kept) or an older one passes the
/// start-up check, and the upkeep writes the current one; one newer than this build knows fails
/// both, and is left as it is.
#[tokio::test]
async fn redis_the_schema_version_is_written_by_the_upkeep_and_a_newer_one_refused() {
    let ns = TestNamespace::new();
    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{{{}}}:schema", ns.name);

    assert_eq!(store.schema_version().await.unwrap(), None);
    store.check_schema().await.unwrap();
    store.prepare().await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), Some(SCHEMA_VERSION));
    store.check_schema().await.unwrap();
    store.prepare().await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), Some(SCHEMA_VERSION));

    let _: () = ::redis::AsyncCommands::set(&mut conn, &key, 1)
        .await
        .unwrap();
    store.check_schema().await.unwrap();
    store.prepare().await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), Some(SCHEMA_VERSION));

    let newer = SCHEMA_VERSION + 1;
    let _: () = ::redis::AsyncCommands::set(&mut conn, &key, newer)
        .await
        .unwrap();
    match store.check_schema().await {
        Err(StoreError::Conflict(why)) => assert!(why.contains("newer"), "{why}"),
        other => panic!("a newer schema version is refused, not {other:?}"),
    }
    assert!(matches!(
        store.prepare().await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.schema_version().await.unwrap(), Some(newer));
}

/// Workspaces an earlier version created, with no index, are listed too: those there at the
/// first listing, and one created later (during a rolling upgrade) once it is read; and a page
/// after such a one does not start again from the first.
#[tokio::test]
async fn redis_workspaces_made_before_the_index_are_listed() {
    let ns = TestNamespace::new();
    let client = ::redis::Client::open(redis_url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let unindexed = |ws: Workspace| {
        let mut conn = conn.clone();
        let key = format!("{{{}}}:ws:{}", ns.name, ws.id);
        async move {
            ::redis::cmd("SET")
                .arg(key)
                .arg(serde_json::to_string(&ws).unwrap())
                .query_async::<()>(&mut conn)
                .await
                .unwrap()
        }
    };
    let older = Workspace {
        created_at: 5,
        ..workspace()
    };
    unindexed(older.clone()).await;
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis_url(), &ns.name).unwrap());
    let newer = Workspace {
        created_at: 20,
        ..workspace()
    };
    store.create_workspace(&newer).await.unwrap();
    let ids = |page: (Vec<Workspace>, bool)| -> Vec<String> {
        page.0.into_iter().map(|w| w.id).collect()
    };
    assert_eq!(
        ids(store.workspaces(None, 10).await.unwrap()),
        [older.id.clone(), newer.id.clone()]
    );
    // After the index is filled, an old replica writes one more.
    let late = Workspace {
        created_at: 10,
        ..workspace()
    };
    unindexed(late.clone()).await;
    assert_eq!(
        ids(store.workspaces(Some(&late.id), 10).await.unwrap()),
        std::slice::from_ref(&newer.id),
        "a page after it goes on from where it belongs"
    );
    assert_eq!(
        ids(store.workspaces(None, 10).await.unwrap()),
        [older.id, late.id, newer.id],
        "read once, it is listed"
    );
}

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

/// Redis 7 gives an ACL user no channel rights unless granted: the change notice is best
/// effort (replicas also poll the change log), so a key write is still whole and answered.
#[tokio::test]
async fn redis_a_user_without_channel_rights_still_writes_keys() {
    let redis = RedisServer::start().await;
    let url = redis
        .set_user("writer", &["resetchannels", "~*", "+@all"])
        .await;
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&url, "acl").unwrap());
    let ws = new_id("ws");
    let k = key(&ws, 1);
    store
        .insert_key(&k)
        .await
        .expect("the key is written and answered");
    assert_eq!(
        store.key_by_hash(&k.hash).await.unwrap().as_deref(),
        Some(&k)
    );
    let revoked = store
        .update_key(&k.id, &|r: &mut KeyRecord| r.status = KeyStatus::Revoked)
        .await
        .expect("the update is answered")
        .unwrap();
    assert_eq!(revoked.status, KeyStatus::Revoked);
}

/// A Redis user allowed the key-change channel and not the tokens channel still hears of key
/// changes (the two are subscribed to apart), and still mints tokens.
/// Pub/sub keeps no backlog: a replica reads the tokens still live when it subscribes, so those
/// minted before (while it was not subscribed) are heard of too, and expired ones are not.
#[tokio::test]
async fn redis_tokens_minted_before_a_replica_subscribed_are_heard_of() {
    let ns = TestNamespace::new();
    let writer = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    let parent = key(&new_id("ws"), 1);
    writer.insert_key(&parent).await.unwrap();
    let now = unix_now();
    let live = token_of(&parent, now);
    writer.insert_token(&live, 960).await.unwrap();
    // Expired 100 s ago; its record is still held.
    let expired = token_of(&parent, now - 1_000);
    writer.insert_token(&expired, 60).await.unwrap();

    let replica = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    // The signal fires once subscribed, after the live tokens were read.
    tokio::time::timeout(
        Duration::from_secs(5),
        replica.key_change_signal().notified(),
    )
    .await
    .expect("subscribed");
    let minted = replica.minted_tokens();
    assert!(minted.listed(&live.hash, now), "minted before, heard of");
    assert!(!minted.listed(&expired.hash, now));
    assert_eq!(minted.len(), 1, "the expired one is not held");
}

#[tokio::test]
async fn redis_a_user_allowed_only_the_key_change_channel_hears_of_changes() {
    let redis = RedisServer::start().await;
    let url = redis
        .set_user(
            "keys-only",
            &["resetchannels", "&partial:keys:changed", "~*", "+@all"],
        )
        .await;
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&url, "partial").unwrap());
    let writer: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis.url(), "partial").unwrap());
    let signal = store.key_change_signal();
    tokio::time::timeout(Duration::from_secs(5), signal.notified())
        .await
        .expect("subscribed to key changes");
    writer.insert_key(&key(&new_id("ws"), 1)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), signal.notified())
        .await
        .expect("told of the change");

    let parent = key(&new_id("ws"), 1);
    store.insert_key(&parent).await.unwrap();
    let token = token_of(&parent, unix_now());
    store
        .insert_token(&token, 960)
        .await
        .expect("minted without the tokens channel");
    assert!(store.key_by_hash(&token.hash).await.unwrap().is_some());
}

/// A TCP relay to a Redis that can stop carrying the connections it has, keeping their
/// sockets open, while it carries new ones: a Redis host gone without a reset, or a NAT or
/// proxy that dropped the flow.
struct FreezingRelay {
    addr: std::net::SocketAddr,
    connections: Arc<std::sync::Mutex<Vec<RelayedConnection>>>,
}

/// One connection through a [`FreezingRelay`].
#[derive(Clone, Default)]
struct RelayedConnection {
    frozen: Arc<std::sync::atomic::AtomicBool>,
    /// It has sent `SUBSCRIBE`.
    subscriber: Arc<std::sync::atomic::AtomicBool>,
}

impl FreezingRelay {
    async fn start(redis: &RedisServer) -> Self {
        let socket = redis
            .url()
            .strip_prefix("redis+unix://")
            .unwrap()
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections: Arc<std::sync::Mutex<Vec<_>>> = Arc::default();
        let registry = connections.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::UnixStream::connect(&socket).await else {
                    continue;
                };
                let connection = RelayedConnection::default();
                registry.lock().unwrap().push(connection.clone());
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(
                    client_read,
                    server_write,
                    connection.frozen.clone(),
                    Some(connection.subscriber),
                ));
                tokio::spawn(pump(server_read, client_write, connection.frozen, None));
            }
        });
        Self { addr, connections }
    }

    /// Every connection made so far carries nothing more; new ones work.
    fn freeze_existing(&self) {
        self.freeze(|_| true);
    }

    /// The subscriptions made so far carry nothing more; the other connections work.
    fn freeze_subscribers(&self) {
        self.freeze(|c| c.subscriber.load(std::sync::atomic::Ordering::SeqCst));
    }

    fn freeze(&self, which: impl Fn(&RelayedConnection) -> bool) {
        for connection in self.connections.lock().unwrap().iter().filter(|c| which(c)) {
            connection
                .frozen
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// Carries bytes from `from` to `to` until `frozen`; notes in `subscriber` a `SUBSCRIBE` sent.
async fn pump(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    frozen: Arc<std::sync::atomic::AtomicBool>,
    subscriber: Option<Arc<std::sync::atomic::AtomicBool>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(subscriber) = &subscriber {
            if buf[..n]
                .windows(9)
                .any(|w| w.eq_ignore_ascii_case(b"SUBSCRIBE"))
            {
                subscriber.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        if frozen.load(std::sync::atomic::Ordering::SeqCst) {
            // Holds both sockets open, and forwards nothing.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A command that times out leaves the connection manager's socket in place: without a
/// watchdog, every command on it would time out for as long as the socket stays open.
#[tokio::test]
async fn redis_a_connection_that_stops_answering_is_replaced() {
    let redis = RedisServer::start().await;
    let relay = FreezingRelay::start(&redis).await;
    let store = RedisStore::connect(&format!("redis://{}", relay.addr), "frozen").unwrap();
    store.ping().await.expect("Redis answers through the relay");
    relay.freeze_existing();
    assert!(
        store.ping().await.is_err(),
        "the frozen connection times out"
    );
    eventually(Duration::from_secs(15), || async {
        store.ping().await.is_ok()
    })
    .await
    .expect("a new connection answers");
}

/// A subscription whose connection stays open and carries nothing (a NAT or proxy that dropped
/// the flow, while the store's other connections work) is noticed by its PING, and opened anew:
/// changes reach the key cache at once again, not only from its poll.
#[tokio::test]
async fn redis_a_subscription_that_stops_answering_is_replaced() {
    let redis = RedisServer::start().await;
    let relay = FreezingRelay::start(&redis).await;
    let store = RedisStore::connect(&format!("redis://{}", relay.addr), "silent").unwrap();
    let signal = store.key_change_signal();
    tokio::time::timeout(Duration::from_secs(5), signal.notified())
        .await
        .expect("subscribed");
    relay.freeze_subscribers();
    // Changes go on through the store's own connection, and are published.
    let ws = new_id("ws");
    let writes = async {
        loop {
            store.insert_key(&key(&ws, 1)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        _ = writes => unreachable!(),
        _ = signal.notified() => {}
        _ = tokio::time::sleep(Duration::from_secs(15)) => {
            panic!("the silent subscription was never replaced");
        }
    }
    assert!(
        relay.connections.lock().unwrap().len() >= 3,
        "a new subscription was opened"
    );
}

/// After a failover that lost the last writes (or a restore from an older copy), the epoch a
/// replica read may name another change: the mark of the change tells, and the replica starts
/// over instead of taking "nothing new" (or the changes after it) for the truth.
#[tokio::test]
async fn redis_a_change_log_that_lost_writes_is_not_taken_for_the_one_read() {
    let ns = TestNamespace::new();
    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
    let ws = new_id("ws");
    store.insert_key(&key(&ws, 1)).await.unwrap();
    let lost = key(&ws, 2);
    store.insert_key(&lost).await.unwrap();
    let read = store.key_changes_since(0, "").await.unwrap();

    // The write of `lost` never reached the node that takes over: its epoch and log entry go.
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let prefix = format!("{{{}}}:keys:", ns.name);
    ::redis::Script::new(
        r"
local kept = redis.call('XRANGE', KEYS[1], '-', ARGV[1] .. '-0')
redis.call('DEL', KEYS[1])
for _, e in ipairs(kept) do redis.call('XADD', KEYS[1], e[1], unpack(e[2])) end
redis.call('SET', KEYS[2], ARGV[1])
",
    )
    .key(format!("{prefix}log"))
    .key(format!("{prefix}epoch"))
    .arg(read.epoch - 1)
    .invoke_async::<()>(&mut conn)
    .await
    .unwrap();
    // Another replica writes on the new node: the same epoch, another change.
    let revoked = key(&ws, 3);
    store.insert_key(&revoked).await.unwrap();
    let after = store
        .key_changes_since(read.epoch, &read.mark)
        .await
        .unwrap();
    assert_eq!(after.epoch, read.epoch);
    assert_eq!(after.changed, None, "every cached key must go");
    // And from the new history's mark on, changes are read again.
    let again = store
        .key_changes_since(after.epoch, &after.mark)
        .await
        .unwrap();
    assert_eq!(again.changed, Some(vec![]));
}

/// Writes `count` workspace records as a version before the workspace index wrote them: not
/// indexed.
async fn seed_unindexed_workspaces(
    conn: &mut ::redis::aio::MultiplexedConnection,
    ns: &str,
    count: usize,
) {
    let mut seed = ::redis::pipe();
    for i in 0..count {
        let id = format!("ws_earlier{i:05}");
        let record = serde_json::json!({
            "id": id, "name": "old", "admin_emails": ["ops@example.com"],
            "created_at": 1_700_000_000 + i
        });
        seed.set(format!("{{{ns}}}:ws:{id}"), record.to_string())
            .ignore();
    }
    seed.query_async::<()>(conn).await.unwrap();
}

/// Writes `count` keys of another kind than workspaces in namespace `ns`, for a scan of it to
/// pass over.
async fn seed_other_keys(conn: &mut ::redis::aio::MultiplexedConnection, ns: &str, count: usize) {
    use ::redis::AsyncCommands;
    for start in (0..count).step_by(1_000) {
        let others: Vec<(String, u8)> = (start..count.min(start + 1_000))
            .map(|i| (format!("{{{ns}}}:other:{i}"), 1))
            .collect();
        let () = conn.mset(&others).await.unwrap();
    }
}

/// Namespace `ns`'s workspace index fill leased to another replica for `ms` milliseconds.
async fn lease_held_elsewhere(conn: &mut ::redis::aio::MultiplexedConnection, ns: &str, ms: u64) {
    use ::redis::AsyncCommands;
    let expiry = ::redis::SetOptions::default().with_expiration(::redis::SetExpiry::PX(ms));
    let () = conn
        .set_options(
            format!("{{{ns}}}:workspaces:filling"),
            "fill_ofanotherreplica",
            expiry,
        )
        .await
        .unwrap();
}

/// Whether Redis key `key` exists within `limit`.
async fn key_appears(
    conn: &::redis::aio::MultiplexedConnection,
    key: &'static str,
    limit: Duration,
) -> bool {
    use ::redis::AsyncCommands;
    let found = eventually(limit, || {
        let mut conn = conn.clone();
        async move { conn.exists(key).await.unwrap() }
    })
    .await;
    found.is_some()
}

/// Replicas that start together index an earlier version's workspaces once: one scans, under
/// a lease in Redis, and the other waits for it to finish. A listing waits for a fill only
/// briefly, and one it starts itself goes on without it.
#[tokio::test]
async fn redis_replicas_starting_together_fill_the_workspace_index_once() {
    use ::redis::AsyncCommands;
    const EARLIER: usize = 1_500;
    // A server of the test's own: its command counts are this test's alone.
    let redis = RedisServer::start().await;
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    seed_unindexed_workspaces(&mut conn, "together", EARLIER).await;
    let a = RedisStore::connect(&redis.url(), "together").unwrap();
    let b = RedisStore::connect(&redis.url(), "together").unwrap();
    let (filled_a, filled_b) = tokio::join!(a.prepare(), b.prepare());
    filled_a.unwrap();
    filled_b.unwrap();
    let indexed: usize = conn.zcard("{together}:workspaces").await.unwrap();
    assert_eq!(indexed, EARLIER);
    // A scan indexes each workspace it finds with a `ZADD` (a `SCAN` may return one twice):
    // two scans would make twice as many.
    let zadds = redis.command_calls("zadd").await;
    assert!(
        (EARLIER..EARLIER * 3 / 2).contains(&zadds),
        "{zadds} ZADDs: one scan makes {EARLIER}"
    );
    let lease: bool = conn.exists("{together}:workspaces:filling").await.unwrap();
    assert!(!lease, "the lease is let go");

    // A replica that died mid-scan leaves its lease: another takes over when it runs out.
    seed_unindexed_workspaces(&mut conn, "orphaned", 10).await;
    lease_held_elsewhere(&mut conn, "orphaned", 1_500).await;
    let started = std::time::Instant::now();
    let c = RedisStore::connect(&redis.url(), "orphaned").unwrap();
    tokio::time::timeout(Duration::from_secs(20), c.prepare())
        .await
        .expect("takes over once the lease runs out")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(1_000),
        "waited for the lease"
    );
    let indexed: usize = conn.zcard("{orphaned}:workspaces").await.unwrap();
    assert_eq!(indexed, 10);

    // A fill cut short (the start-up fill running it was dropped) lets go of its lease at
    // once. Keys of other kinds make the scan long enough to be cut.
    seed_unindexed_workspaces(&mut conn, "cut", 10).await;
    seed_other_keys(&mut conn, "cut", 200_000).await;
    let d = Arc::new(RedisStore::connect(&redis.url(), "cut").unwrap());
    let fill = tokio::spawn({
        let d = d.clone();
        async move { d.prepare().await }
    });
    let leased = key_appears(&conn, "{cut}:workspaces:filling", Duration::from_secs(10)).await;
    assert!(leased, "the fill takes the lease");
    fill.abort();
    let _ = fill.await;
    let filled: bool = conn.exists("{cut}:workspaces:filled").await.unwrap();
    assert!(!filled, "cut short mid-scan");
    let released = eventually(Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move {
            !conn
                .exists::<_, bool>("{cut}:workspaces:filling")
                .await
                .unwrap()
        }
    })
    .await;
    assert!(released.is_some(), "let go, not held for its 30 s");

    // A listing that finds no fill under way (the start-up fill above was cut short) starts
    // one, which goes on when the listing is dropped: it does not run the scan itself.
    let listing = tokio::spawn({
        let d = d.clone();
        async move { d.workspaces(None, 10).await.map(|(page, _)| page.len()) }
    });
    let leased = key_appears(&conn, "{cut}:workspaces:filling", Duration::from_secs(10)).await;
    assert!(leased, "the listing starts the fill");
    listing.abort();
    let _ = listing.await;
    let filled: bool = conn.exists("{cut}:workspaces:filled").await.unwrap();
    assert!(!filled, "the listing was dropped mid-scan");
    let filled = key_appears(&conn, "{cut}:workspaces:filled", Duration::from_secs(20)).await;
    assert!(filled, "the fill goes on without the listing");
    let indexed: usize = conn.zcard("{cut}:workspaces").await.unwrap();
    assert_eq!(indexed, 10);

    // A listing waits for another replica's fill only briefly (it is an admin's request), also
    // when this replica's own start-up fill is the one waiting.
    seed_unindexed_workspaces(&mut conn, "busy", 10).await;
    lease_held_elsewhere(&mut conn, "busy", 60_000).await;
    let e = Arc::new(RedisStore::connect(&redis.url(), "busy").unwrap());
    let waiting = tokio::spawn({
        let e = e.clone();
        async move { e.prepare().await }
    });
    // The start-up fill runs first (the test's runtime has one thread): it holds the store's
    // own fill lock while it waits for the other replica's lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listed = tokio::time::timeout(Duration::from_secs(20), e.workspaces(None, 10))
        .await
        .expect("a listing does not wait for the other replica's whole fill");
    assert!(
        matches!(listed, Err(StoreError::Unavailable(_))),
        "{listed:?}"
    );
    assert!(!waiting.is_finished(), "the start-up fill waits on");
    waiting.abort();
}

/// The replica filling the workspace index renews its lease as it scans: a scan that lasts
/// many leases keeps it, and a replica waiting for the fill never takes it over (it would scan
/// again). The lease is cut to 300 ms, renewed every 30 ms (a stall of a quarter second does
/// not lose it), and the scan looks at 10 keys a call over 200,000 keys of other kinds: it
/// takes ~2.6 s here, and must outlast three leases.
#[tokio::test]
async fn redis_index_fill_renews_its_lease_while_it_scans() {
    use ::redis::AsyncCommands;
    const EARLIER: usize = 10;
    let redis = RedisServer::start().await;
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    seed_unindexed_workspaces(&mut conn, "renewed", EARLIER).await;
    seed_other_keys(&mut conn, "renewed", 200_000).await;
    let timing = IndexFillTiming {
        lease: Duration::from_millis(300),
        renewal: Duration::from_millis(30),
        poll: Duration::from_millis(10),
        scan_count: 10,
    };
    let store = || {
        RedisStore::connect(&redis.url(), "renewed")
            .unwrap()
            .with_index_fill_timing(timing)
    };
    let (a, b) = (store(), store());
    let first = tokio::spawn(async move { a.prepare().await });
    let leased = key_appears(
        &conn,
        "{renewed}:workspaces:filling",
        Duration::from_secs(10),
    )
    .await;
    assert!(leased, "the first replica takes the lease");
    let started = std::time::Instant::now();
    // The second replica asks for the lease every 10 ms while the first scans.
    let second = tokio::spawn(async move { b.prepare().await });
    first.await.unwrap().unwrap();
    let scanned_for = started.elapsed();
    second.await.unwrap().unwrap();
    assert!(
        scanned_for >= timing.lease * 3,
        "the scan took {scanned_for:?}, too short to outlast its lease: seed more keys"
    );
    let indexed: usize = conn.zcard("{renewed}:workspaces").await.unwrap();
    assert_eq!(indexed, EARLIER);
    // One scan indexes each workspace once (a `SCAN` may return one twice); a second replica
    // that took over a lapsed lease would have scanned and indexed them all again.
    let zadds = redis.command_calls("zadd").await;
    assert!(
        (EARLIER..EARLIER * 3 / 2).contains(&zadds),
        "{zadds} ZADDs: one scan makes {EARLIER}"
    );
    let renewals = redis.command_calls("pexpire").await;
    assert!(
        renewals >= 3,
        "{renewals} renewals over a scan of {scanned_for:?}"
    );
}

/// Syncs of the key cache that callers ask for together are shared, and so is a failure: with
/// a store that does not answer, eight callers wait out one timeout together, not eight in
/// turn.
#[tokio::test]
async fn redis_key_cache_syncs_asked_for_together_are_one_read_failed_or_not() {
    use svcgate::store::{CacheConfig, KeyCache};
    let redis = RedisServer::start().await;
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&redis.url(), "syncs").unwrap());
    store.insert_key(&key("ws_1", 1)).await.unwrap();
    let cache = KeyCache::new(store, CacheConfig::default());
    cache.sync().await.unwrap();
    // A read of the change log runs `XRANGE` on it (where the cache is, where the store is).
    let before = redis.command_calls("xrange").await;
    let synced = futures_util::future::join_all((0..8).map(|_| cache.sync())).await;
    assert!(synced.iter().all(Result::is_ok));
    let together = redis.command_calls("xrange").await - before;
    assert!(
        together <= 4,
        "{together} XRANGEs for 8 syncs asked for together"
    );

    // Redis stops answering: the commands wait in its socket, and run once it is thawed.
    redis.freeze();
    let failed = futures_util::future::join_all((0..8).map(|_| cache.sync())).await;
    redis.thaw();
    assert!(failed.iter().all(Result::is_err));
    let before = before + together;
    let reads = eventually(Duration::from_secs(5), || async {
        redis.command_calls("xrange").await > before
    })
    .await;
    assert!(
        reads.is_some(),
        "the read sent while it was frozen runs once it is thawed"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = redis.command_calls("xrange").await - before;
    assert!(sent <= 4, "{sent} XRANGEs for 8 syncs that failed together");
}
