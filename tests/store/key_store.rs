//! Workspaces, keys, scoped tokens and the key change log.

use super::*;

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

store_suite!(
    workspaces_round_trip,
    workspaces_are_listed_oldest_first_a_page_at_a_time,
    workspace_changes_keep_identity_and_lose_none,
    keys_are_found_every_way,
    every_key_is_listed_by_digest,
    a_minted_token_is_heard_of_until_it_expires,
    updates_keep_identity_and_are_seen_by_hash,
    a_change_that_changes_nothing_emits_nothing,
    concurrent_updates_lose_nothing,
    changes_are_logged_by_epoch,
    a_rotation_keeps_a_change_made_after_its_successor_was_built,
    rotation_is_atomic_and_idempotent
);
