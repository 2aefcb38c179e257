//! The audit log.

use super::*;

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

store_suite!(
    an_audit_batch_with_an_id_is_appended_once,
    audit_reads_the_newest_records_whichever_batch_holds_them,
    audit_since_finds_records_of_a_gateway_whose_clock_runs_ahead,
    audit_pages_after_a_cursor_hold_every_record_once
);
