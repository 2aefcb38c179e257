//! Unit tests of audit records: their JSON, and the writer's batches and spools.

use super::*;
use crate::keys::{KeyStatus, Scopes};
use crate::store::MemoryStore;

fn key() -> Arc<CachedKey> {
    let mut record = crate::keys::tests::record(KeyStatus::Active, None);
    record.last4 = "Ab9z".into();
    Arc::new(CachedKey::new(
        &record,
        "ws_1".into(),
        Arc::new(Scopes::default()),
    ))
}

fn pending(key: &Arc<CachedKey>, n: usize) -> PendingAudit {
    PendingAudit {
        time_ms: n as u64,
        request_id: crate::ids::request_id(),
        key: key.clone(),
        project: None,
        method: http::Method::POST,
        path: "/v1/chat/completions".into(),
        model: Some("m".into()),
        status: 200,
        credits: Credits::ZERO,
        client_ip: None,
        latency_ms: 1,
    }
}

/// A record with every optional field set, or none, and the given strings.
fn record(text: &str, full: bool, credits: f64, ip: Option<IpAddr>) -> AuditRecord {
    let mut metadata = serde_json::Map::new();
    metadata.insert(
        text.into(),
        serde_json::json!({ "n": [1, 2.5, null], "s": text }),
    );
    AuditRecord {
        time_ms: u64::MAX,
        request_id: format!("req_{text}").into(),
        workspace: format!("ws_{text}").into(),
        key_id: "key_1".into(),
        key: "svc_live_…Ab9z".into(),
        environment: Environment::Scoped,
        project: full.then(|| text.to_string()),
        method: Cow::Owned(text.to_string()),
        path: format!("/v1/{text}").into(),
        model: full.then(|| text.into()),
        status: 599,
        credits,
        client_ip: ip,
        latency_ms: 0,
        token_id: full.then(|| format!("tok_{text}")),
        metadata: full.then(|| Arc::new(metadata.clone())),
        key_metadata: full.then(|| Arc::new(metadata)),
        actor: full.then(|| format!("dashboard:{text}")),
    }
}

#[test]
fn records_are_written_as_serde_json_writes_them() {
    use rand::{Rng, SeedableRng};
    // Everything JSON escapes, what it does not (DEL, non-ASCII), and plain text.
    let alphabet: Vec<char> = "\0\u{1}\t\n\u{1f} \"\\/\u{7f}aZ9_-…é😀\u{2028}"
        .chars()
        .collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut texts: Vec<String> = ["", "plain", "\"", "\\", "a\u{0}b", "…"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Each character at each place of a string a few words long.
    for c in [
        '\0', '\u{1}', '\u{1f}', ' ', '"', '\\', '\u{7f}', 'é', '!', '#', '[', ']',
    ] {
        for at in 0..26 {
            texts.push((0..26).map(|i| if i == at { c } else { 'a' }).collect());
        }
    }
    for _ in 0..500 {
        let len = rng.random_range(0..40);
        texts.push(
            (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect(),
        );
    }
    let ips = [
        None,
        Some(IpAddr::from([127, 0, 0, 1])),
        Some("2001:db8::1".parse().unwrap()),
    ];
    let credits = [0.0, 1.0, 1.5, 1e-7, 1e21, 123456.789, f64::NAN];
    let records: Vec<AuditRecord> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            record(
                t,
                i % 2 == 0,
                credits[i % credits.len()],
                ips[i % ips.len()],
            )
        })
        .collect();
    for chunk in [&records[..0], &records[..1], &records[..]] {
        let refs: Vec<&AuditRecord> = chunk.iter().collect();
        let mut ours = Vec::new();
        AuditRecord::write_json_array(&refs, &mut ours);
        let serde = serde_json::to_vec(&refs).unwrap();
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            String::from_utf8(serde).unwrap()
        );
    }
}

#[tokio::test]
async fn the_writer_is_told_when_a_thread_has_queued_a_batch() {
    use futures_util::FutureExt;
    let spool = tempfile::tempdir().unwrap();
    let (log, mut writer) = audit_log(Arc::new(MemoryStore::new()), spool.path().into(), 1000);
    let key = key();
    for i in 0..AUDIT_BATCH - 1 {
        log.record(pending(&key, i));
    }
    assert!(writer.batch_ready().now_or_never().is_none(), "one short");
    log.record(pending(&key, AUDIT_BATCH));
    assert!(writer.batch_ready().now_or_never().is_some());
    assert!(writer.batch_ready().now_or_never().is_none(), "told once");
    // Another thread's queue counts for itself.
    let other = std::thread::spawn({
        let (log, key) = (log.clone(), key.clone());
        move || (0..AUDIT_BATCH).for_each(|i| log.record(pending(&key, i)))
    });
    other.join().unwrap();
    assert!(writer.batch_ready().now_or_never().is_some());
    // Drained, a queue is told of again when it has refilled.
    assert_eq!(writer.flush().await, 2 * AUDIT_BATCH);
    for i in 0..AUDIT_BATCH {
        log.record(pending(&key, i));
    }
    assert!(writer.batch_ready().now_or_never().is_some());
}

#[tokio::test]
async fn records_from_every_thread_are_written_once() {
    let store = Arc::new(MemoryStore::new());
    let spool = tempfile::tempdir().unwrap();
    let (log, mut writer) = audit_log(store.clone(), spool.path().into(), 10_000);
    let key = key();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (log, key) = (log.clone(), key.clone());
            std::thread::spawn(move || {
                for i in 0..250 {
                    log.record(pending(&key, t * 1000 + i));
                }
            })
        })
        .collect();
    // Drains while the threads are still queueing, and after.
    let mut written = writer.flush().await;
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(writer.queued(), 1000 - written);
    written += writer.flush().await;
    assert_eq!(written, 1000);
    assert_eq!(writer.queued(), 0);

    let query = AuditQuery {
        workspace: "ws_1".into(),
        limit: 2000,
        ..AuditQuery::default()
    };
    let records = store.audit(&query).await.unwrap();
    assert_eq!(records.len(), 1000);
    let ids: std::collections::HashSet<_> = records.iter().map(|r| &r.request_id).collect();
    assert_eq!(ids.len(), 1000);
    assert!(records.iter().all(|r| r.key == "svc_live_…Ab9z"));
}

#[tokio::test]
async fn after_the_last_drain_no_record_is_queued_unseen() {
    let store = Arc::new(MemoryStore::new());
    let spool = tempfile::tempdir().unwrap();
    let (log, writer) = audit_log(store.clone(), spool.path().into(), 10_000);
    let key = key();
    log.record(pending(&key, 1));
    writer.close().await;
    // From a thread that queued before and from one that never did: both refused (and
    // logged), neither left in a queue nobody drains.
    log.record(pending(&key, 2));
    let (log2, key2) = (log.clone(), key.clone());
    std::thread::spawn(move || log2.record(pending(&key2, 3)))
        .join()
        .unwrap();
    assert_eq!(log.queues.each().map(|q| q.len()).sum::<usize>(), 0);
    let query = AuditQuery {
        workspace: "ws_1".into(),
        limit: 10,
        ..AuditQuery::default()
    };
    let written = store.audit(&query).await.unwrap();
    assert_eq!(written.iter().map(|r| r.time_ms).collect::<Vec<_>>(), [1]);
}
