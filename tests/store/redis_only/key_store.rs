//! Keys in Redis: the schema version, the workspace index, channels and the change log.

use super::*;

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
    use svcgate::keys::cache::{CacheConfig, KeyCache};
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
