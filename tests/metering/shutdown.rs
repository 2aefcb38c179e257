//! Shutdown and upgrade: what is in flight or spooled is written, once.

use super::*;

#[tokio::test]
async fn spend_behind_a_batch_in_flight_at_shutdown_is_written() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    // No flush but the ones requests ask for (totals unknown) and the last one.
    let url = redis.url();
    let builder = || {
        Gateway::builder()
            .redis(&url, "closing")
            .spool_dir(spool.path())
            .config(|c| c.metering.flush_interval_ms = 600000)
    };
    let mut gw = builder().start().await;
    let ws1 = gw.create_workspace().await;
    let ws2 = gw.create_workspace().await;
    let (id1, key1) = gw
        .create_key_in(&ws1, "live", &["chat.completions:create"])
        .await;
    let (id2, key2) = gw
        .create_key_in(&ws2, "live", &["chat.completions:create"])
        .await;
    assert_eq!(gw.chat(&key1).await.status(), 200);
    // Both keys cached (a refused request is not charged; a second use, after the key cache
    // has synced their creation, stays cached), and key2's workspace's totals not read yet.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for key in [&key1, &key2] {
        let resp = gw
            .request(Method::GET, "/v1/nope")
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
    }
    redis.stop().await;
    // Asks for a flush that fails: a batch in flight.
    assert_eq!(gw.chat(&key2).await.status(), 200);
    for _ in 0..3 {
        assert_eq!(gw.chat(&key1).await.status(), 200);
        assert_eq!(gw.chat(&key2).await.status(), 200);
    }
    redis.resume().await;
    sigterm(&mut gw);
    drop(gw);
    let gw = builder().start().await;
    eventually(Duration::from_secs(5), || async {
        usage(&gw, &ws1).await["keys"][&id1] == 4.0 && usage(&gw, &ws2).await["keys"][&id2] == 4.0
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "all spend written; spool: {:?}",
            spool_files(spool.path(), "")
        )
    });
}

#[tokio::test]
async fn spooled_spend_stays_on_disk_until_it_is_written() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let url = redis.url();
    let builder = || spooling(&url, "kept-spool", spool.path());
    let (mut gw, ws, id, _) = served_in_an_outage(builder(), &mut redis).await;
    sigterm(&mut gw);
    drop(gw);
    let spooled = spool_files(spool.path(), "spend-");
    assert_eq!(spooled.len(), 1);
    // Started again while Redis is still down, then killed: nothing written, nothing lost (the
    // file is the new process's checkpoint, rewritten in place).
    let gw = builder().start().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(spool_files(spool.path(), "spend-"), spooled);
    drop(gw);
    redis.resume().await;
    let gw = builder().start().await;
    until_charged(&gw, &ws, &id, 6.0, "the spooled spend is charged").await;
    until_spool_empty(spool.path(), "spend-", "and its file removed once written").await;
}

#[tokio::test]
async fn a_graceful_upgrade_during_an_outage_hands_over_what_the_old_process_spooled() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let builder = Gateway::builder()
        .redis(&redis.url(), "upgrade-spool")
        .spool_dir(spool.path());
    let (mut gw, ws, id, key) = warmed_up(builder).await;
    redis.stop().await;
    for _ in 0..3 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    gw.upgrade();
    assert!(!spool_files(spool.path(), "spend-").is_empty());
    redis.resume().await;
    // Taken over by the new process, without a restart.
    eventually(Duration::from_secs(15), || async {
        usage(&gw, &ws).await["keys"][&id] == 5.0
            && audit(&gw, &format!("workspace={ws}")).await.len() == 5
    })
    .await
    .expect("the old process's spend and audit records are written");
    until_spool_empty(spool.path(), "", "and the spool emptied").await;
}

/// The shared Redis connection is reopened by whichever task finds it broken; after a Redis
/// restart that can be a request, on a gateway thread's runtime, which stops before the last
/// flush. The last flush still reaches Redis. (A race: the watchdog or the key cache's sync,
/// on the store runtime, may reopen the connection first; a last flush tied to the request's
/// runtime would be lost in about 2 runs of 3.)
#[tokio::test]
async fn spend_is_written_at_shutdown_after_a_request_reopened_the_connection() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let url = redis.url();
    let builder = || {
        Gateway::builder()
            .redis(&url, "reopened")
            .spool_dir(spool.path())
            .no_worker()
            .config(|c| c.store.sync_interval_ms = 600000)
            .config(|c| c.metering.flush_interval_ms = 600000)
    };
    let mut gw = builder().start().await;
    let ws = gw.create_workspace().await;
    let (id, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    redis.stop().await;
    redis.resume().await;
    // An uncached key: its lookup is the first store call after the restart.
    eventually(Duration::from_secs(10), || async {
        gw.chat(&key).await.status() == 200
    })
    .await
    .expect("the key is served once Redis is back");
    sigterm(&mut gw);
    assert!(
        spool_files(spool.path(), "spend").is_empty(),
        "spend spooled with Redis up: {}",
        gw.logs()
    );
    drop(gw);
    let gw = builder().start().await;
    assert_eq!(usage(&gw, &ws).await["keys"][&id], 1.0);
}
