//! One suite of store behaviour, run against the in-memory store and against a real Redis.

mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;
use svcgate::ids::{new_id, unix_now};
use svcgate::keys::KeyHash;
use svcgate::keys::{self, Environment, KeyParams, KeyRecord, KeyStatus, Scopes, Workspace};
use svcgate::store::{MemoryStore, RedisStore, Store, StoreError};

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
        .keys_in_workspace(&ws)
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
    assert!(store.keys_in_workspace("ws_none").await.unwrap().is_empty());
    assert!(matches!(
        store.insert_key(&a).await,
        Err(StoreError::Conflict(_))
    ));
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
    let start = store.key_changes_since(0).await.unwrap().epoch;
    let nothing = store.key_changes_since(start).await.unwrap();
    assert_eq!(nothing.changed, Some(vec![]));

    let signal = store.key_change_signal();
    let a = key(&new_id("ws"), 1);
    let b = key(&new_id("ws"), 1);
    store.insert_key(&a).await.unwrap();
    store.insert_key(&b).await.unwrap();
    store
        .update_key(&a.id, &|r: &mut KeyRecord| r.status = KeyStatus::Revoked)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), signal.notified())
        .await
        .expect("change signal fires");

    let changes = store.key_changes_since(start).await.unwrap();
    assert_eq!(changes.epoch, start + 3);
    assert_eq!(changes.changed, Some(vec![a.hash, b.hash, a.hash]));
    let later = store.key_changes_since(start + 2).await.unwrap();
    assert_eq!(later.changed, Some(vec![a.hash]));
    // An epoch from the future (the store was reset) means: drop everything.
    let future = store.key_changes_since(start + 1000).await.unwrap();
    assert_eq!(future.changed, None);
}

async fn rotation_is_atomic_and_idempotent(store: Arc<dyn Store>) {
    use svcgate::store::Rotation;
    let old = key(&new_id("ws"), 1);
    store.insert_key(&old).await.unwrap();
    let (_, fresh) = keys::issue(
        KeyParams {
            workspace: old.workspace.clone(),
            environment: Environment::Live,
            scopes: old.scopes.clone(),
            name: String::new(),
            monthly_budget: None,
        },
        2,
    );
    let mut successor = fresh;
    successor.rotated_from = Some(old.id.clone());
    let start = store.key_changes_since(0).await.unwrap().epoch;

    match store.rotate_key(&old.id, &successor, 500).await.unwrap() {
        Rotation::Rotated { old: rotated } => {
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
        store.keys_in_workspace(&old.workspace).await.unwrap().len(),
        2
    );
    let changes = store.key_changes_since(start).await.unwrap();
    assert_eq!(changes.changed, Some(vec![old.hash, successor.hash]));
}

async fn secrets_are_created_once_and_shared(store: Arc<dyn Store>) {
    let a = store.secret("rotation").await.unwrap();
    assert_eq!(store.secret("rotation").await.unwrap(), a);
    assert_ne!(store.secret("tokens").await.unwrap(), a);
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
    keys_are_found_every_way,
    updates_keep_identity_and_are_seen_by_hash,
    concurrent_updates_lose_nothing,
    changes_are_logged_by_epoch,
    rotation_is_atomic_and_idempotent,
    secrets_are_created_once_and_shared,
    a_usage_batch_is_added_once_however_often_it_is_sent
);
