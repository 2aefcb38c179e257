//! A Redis outage: spend and audit records spooled to disk and written afterwards.

use super::*;

#[tokio::test]
async fn a_redis_outage_loses_no_audit_record_and_no_spend() {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), "outage")
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (id, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    for _ in 0..5 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    redis.stop().await;
    for _ in 0..7 {
        assert_eq!(gw.chat(&key).await.status(), 200, "a cached key works on");
    }
    redis.resume().await;
    for _ in 0..3 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    eventually(Duration::from_secs(10), || async {
        audit(&gw, &format!("workspace={ws}&limit=1000"))
            .await
            .len()
            == 15
    })
    .await
    .expect("all 15 audit records, including the 7 made while Redis was down");
    until_charged(&gw, &ws, &id, 15.0, "all 15 credits").await;
}

#[tokio::test]
async fn what_cannot_be_written_at_shutdown_is_spooled_and_written_at_the_next_start() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let builder = Gateway::builder()
        .redis(&redis.url(), "spool")
        .spool_dir(spool.path());
    let (mut gw, ws, id, _) = served_in_an_outage(builder, &mut redis).await;
    sigterm(&mut gw);
    let spooled: Vec<_> = std::fs::read_dir(spool.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        spooled.iter().any(|f| f.starts_with("audit-")),
        "{spooled:?}"
    );
    assert!(
        spooled
            .iter()
            .any(|f| f.starts_with("spend-") && f.ends_with(".json")),
        "{spooled:?}"
    );

    redis.resume().await;
    let gw = Gateway::builder()
        .redis(&redis.url(), "spool")
        .spool_dir(spool.path())
        .start()
        .await;
    until_audited(&gw, &ws, 6, "the spooled audit records are written").await;
    until_charged(&gw, &ws, &id, 6.0, "the spooled spend is charged").await;
    let left = std::fs::read_dir(spool.path()).unwrap().count();
    assert_eq!(left, 0, "the spool is emptied");
}

#[tokio::test]
async fn a_gateway_killed_in_a_redis_outage_loses_no_spend_and_no_audit_record_it_checkpointed() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let url = redis.url();
    let builder = || spooling(&url, "killed", spool.path());
    let (mut gw, ws, id, _) = served_in_an_outage(builder(), &mut redis).await;
    // Within seconds of the outage all of it is on disk, not only in memory.
    eventually(Duration::from_secs(15), || async {
        spooled(spool.path()) == (4_000_000, 4)
    })
    .await
    .unwrap_or_else(|| panic!("spooled: {:?}", spooled(spool.path())));
    sigkill(&mut gw);

    redis.resume().await;
    let gw = builder().start().await;
    until_audited(&gw, &ws, 6, "the audit records of the outage are written").await;
    until_charged(&gw, &ws, &id, 6.0, "the spend of the outage is charged").await;
    until_spool_empty(spool.path(), "", "the spool is emptied").await;
}

#[tokio::test]
async fn spend_checkpointed_in_an_outage_is_charged_once_when_redis_comes_back() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let url = redis.url();
    let builder = || spooling(&url, "checkpoint", spool.path());
    let (mut gw, ws, id, key) = served_in_an_outage(builder(), &mut redis).await;
    eventually(Duration::from_secs(15), || async {
        !spool_files(spool.path(), "spend-").is_empty()
    })
    .await
    .expect("the spend is checkpointed");
    redis.resume().await;
    until_charged(
        &gw,
        &ws,
        &id,
        6.0,
        "the spend of the outage is charged by the gateway that kept it",
    )
    .await;
    until_spool_empty(
        spool.path(),
        "spend-",
        "the checkpoint goes once its spend is written",
    )
    .await;
    // Killed now, its successor finds nothing to charge again.
    sigkill(&mut gw);
    let gw = builder().start().await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    until_charged(&gw, &ws, &id, 7.0, "one more request, one more credit").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(usage(&gw, &ws).await["keys"][&id], 7.0);
}

#[tokio::test]
async fn a_long_outage_keeps_spooling_audit_records_past_the_memory_bound() {
    let mut redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let builder = Gateway::builder()
        .redis(&redis.url(), "long-outage")
        .spool_dir(spool.path())
        .config(|c| c.metering.audit_backlog = 5);
    let (gw, ws, _, key) = warmed_up(builder).await;
    redis.stop().await;
    // In three bursts, each past the bound: each goes to the spool, not only the first.
    for burst in 1..=3 {
        for _ in 0..10 {
            assert_eq!(gw.chat(&key).await.status(), 200);
        }
        eventually(Duration::from_secs(5), || async {
            spool_files(spool.path(), "audit-").len() >= burst
        })
        .await
        .unwrap_or_else(|| {
            let files = spool_files(spool.path(), "audit-");
            panic!("burst {burst} is spooled: {files:?}")
        });
    }
    redis.resume().await;
    eventually(Duration::from_secs(15), || async {
        audit(&gw, &format!("workspace={ws}&limit=1000"))
            .await
            .len()
            == 32
    })
    .await
    .expect("all 32 audit records, 30 of them through the spool");
    assert!(spool_files(spool.path(), "audit-").is_empty());
}

#[tokio::test]
async fn a_spool_file_the_store_refuses_is_set_aside_and_holds_up_nothing() {
    let redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    // A record for a workspace whose audit stream Redis will not append to (the key holds a
    // string): the store refuses this file for ever, while it takes every other record.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("SET")
        .arg("refused:audit:{ws_broken}")
        .arg("not a stream")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let record = json!({
        "time_ms": 1_700_000_000_000u64, "request_id": "req_spooled", "workspace": "ws_broken",
        "key_id": "key_1", "key": "svc_live_…abcd", "environment": "live", "project": null,
        "method": "POST", "path": "/v1/chat/completions", "model": null, "status": 200,
        "credits": 1.0, "client_ip": null, "latency_ms": 1
    });
    let name = "audit-00000000000000000001-s_test.jsonl";
    std::fs::write(spool.path().join(name), format!("{record}\n")).unwrap();
    let gw = Gateway::builder()
        .redis(&redis.url(), "refused")
        .spool_dir(spool.path())
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    // Records keep coming: each flush that writes some and not the file counts against it.
    let mut made = 0;
    eventually(Duration::from_secs(10), || {
        made += 1;
        let (gw, key, spool, name) = (&gw, &key, spool.path(), name);
        async move {
            assert_eq!(gw.chat(key).await.status(), 200);
            spool_files(spool, "audit-") == [format!("{name}.refused")]
        }
    })
    .await
    .expect("the refused file is set aside, kept");
    eventually(Duration::from_secs(10), || async {
        audit(&gw, &format!("workspace={ws}&limit=1000"))
            .await
            .len()
            == made
    })
    .await
    .expect("records are written past a file the store refuses");
}

#[tokio::test]
async fn a_redis_that_refuses_writes_for_a_while_sets_no_spool_file_aside() {
    let redis = RedisServer::start().await;
    let spool = tempfile::tempdir().unwrap();
    let gw = Gateway::builder()
        .redis(&redis.url(), "out-of-memory")
        .spool_dir(spool.path())
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    // Out of memory: Redis answers PING and refuses every write.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let maxmemory = |bytes: &str| {
        redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory", bytes])
            .clone()
    };
    maxmemory("1").query_async::<()>(&mut conn).await.unwrap();
    let record = json!({
        "time_ms": 1_700_000_000_000u64, "request_id": "req_spooled", "workspace": ws,
        "key_id": "key_1", "key": "svc_live_…abcd", "environment": "live", "project": null,
        "method": "POST", "path": "/v1/chat/completions", "model": null, "status": 200,
        "credits": 1.0, "client_ip": null, "latency_ms": 1
    });
    std::fs::write(
        spool.path().join("audit-00000000000000000001-s_test.jsonl"),
        format!("{record}\n"),
    )
    .unwrap();
    // Long enough for the spool to be listed again (every 5 s) and refused many times over,
    // with records arriving all along.
    let until = std::time::Instant::now() + Duration::from_secs(7);
    let mut made = 1;
    while std::time::Instant::now() < until {
        assert_eq!(gw.chat(&key).await.status(), 200);
        made += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    maxmemory("0").query_async::<()>(&mut conn).await.unwrap();
    eventually(Duration::from_secs(15), || async {
        audit(&gw, &format!("workspace={ws}&limit=1000"))
            .await
            .len()
            == made + 1
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "every record written; spool: {:?}",
            spool_files(spool.path(), "")
        )
    });
    assert!(spool_files(spool.path(), "audit-").is_empty());
}
