//! The audit log in Redis: compression, entry ids, spool replays.

use super::*;

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

/// A stream entry's field and value, as `XRANGE` answers them.
type StreamField = (String, Vec<u8>);

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

/// Reads every page of `query` as the admin API's listing does: after a full page from the
/// newest, the next starts after its last record; a scan that stopped goes on from where it
/// stopped. The records, and how many pages it took.
async fn every_page(store: &RedisStore, mut query: AuditQuery) -> (Vec<AuditRecord>, usize) {
    let limit = query.limit;
    let mut records = Vec::new();
    let mut pages = 0;
    loop {
        let scanning = query.resume.is_some();
        query.limit = if scanning { limit } else { limit + 1 };
        let mut read = store.audit_page(&query).await.unwrap();
        pages += 1;
        assert!(pages < 1_000, "no progress");
        if let Some(resume) = read.resume {
            assert!(read.records.len() <= limit);
            records.extend(read.records);
            query.resume = Some(resume);
            continue;
        }
        let more = !scanning && read.records.len() > limit;
        read.records.truncate(limit);
        let last = read.records.last().map(AuditCursor::after);
        records.extend(read.records);
        match (more, last) {
            (true, Some(last)) => query.cursor = Some(last),
            _ => return (records, pages),
        }
    }
}

/// A filter that matches nothing of a large log answers after a bounded read, with where to
/// go on; going on finds every record the filter matches, each once.
#[tokio::test]
async fn redis_an_audit_filter_matching_little_reads_within_its_budget_and_goes_on() {
    let ns = TestNamespace::new();
    let store = RedisStore::connect(&redis_url(), &ns.name)
        .unwrap()
        .with_audit_scan_budget(100);
    let ws = new_id("ws");
    let now = unix_now() * 1000;
    let mut rare = std::collections::HashSet::new();
    // 30 batches of 40: one record in 7 is key_rare's.
    for batch in 0..30u64 {
        let records: Vec<AuditRecord> = (0..40u64)
            .map(|i| {
                let n = batch * 40 + i;
                let mut record = audit_record(&ws, now + n);
                if n % 7 == 0 {
                    record.key_id = "key_rare".into();
                    rare.insert(record.request_id.clone());
                }
                record
            })
            .collect();
        store.append_audit(&records, None).await.unwrap();
    }
    let query = |key_id: &str, limit| AuditQuery {
        workspace: ws.clone(),
        key_id: Some(key_id.into()),
        limit,
        ..AuditQuery::default()
    };
    // Nothing matches: the first page answers at once (three batches read), empty.
    let first = store.audit_page(&query("key_none", 100)).await.unwrap();
    assert!(first.records.is_empty());
    assert!(first.resume.is_some(), "stopped by its budget");
    let (none, pages) = every_page(&store, query("key_none", 100)).await;
    assert!(none.is_empty());
    assert!(pages >= 10, "{pages} pages for 1,200 records at 100 a page");
    // A rare key: every record once, whatever the page size (a page may end inside a batch).
    for limit in [1, 4, 100] {
        let (found, _) = every_page(&store, query("key_rare", limit)).await;
        let ids: std::collections::HashSet<_> =
            found.iter().map(|r| r.request_id.clone()).collect();
        assert_eq!(found.len(), rare.len(), "limit {limit}");
        assert_eq!(ids, rare, "limit {limit}");
    }
    // Without a budget (the store's own reads), one answer holds them all.
    let all = store.audit(&query("key_rare", 1_000)).await.unwrap();
    assert_eq!(all.len(), rare.len());
}
