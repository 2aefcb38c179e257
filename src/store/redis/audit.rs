//! The audit log in Redis: one stream per workspace.

use async_trait::async_trait;

use std::collections::HashMap;

use super::*;
use crate::metering::audit::{AuditQuery, AuditRead, AuditRecord, AuditResume};
use crate::store::{AuditStore, StoreError};

/// Appends a batch of audit records to a workspace's stream, unless a batch of its id was
/// appended (when given one), or moves a batch appended under too early an id. KEYS: stream[,
/// marker]. ARGV: the oldest id kept, the records (as the entry holds them: [`audit_codec`]),
/// the arrival time (Unix ms) of the newest record in the batch, how far ahead of Redis's
/// clock an id may be dated (ms)[, the id of the entry the batch was appended under, deleted
/// once it is appended again]. Returns 1, or 0 for a batch seen.
///
/// An entry's id is not earlier than the newest record it holds: records carry their
/// gateway's clock, the entry id Redis's, and a query `since` a time stops at the first entry
/// written before it. A batch from a gateway whose clock runs ahead of Redis's gets that
/// record's time as its id (or, where the stream already holds a later id, the next one after
/// it), so its records are found. Otherwise the id is Redis's time. Ids are dated at most
/// [`AUDIT_AHEAD_MAX_MS`] ahead: every later entry's id follows the stream's last, and the
/// stream is trimmed by id, so one gateway a year ahead would keep the log from being trimmed
/// for a year.
///
/// The entry is added under Redis's time (or the next id after the stream's last), and only
/// when that is earlier than its newest record is Redis's clock read and the entry added again
/// under the later id, then the first deleted: a script is not rolled back when a command
/// fails, and nothing is deleted before its records are held by another entry. The marker is
/// set after the append, for the same reason: a batch the stream refused must not count as
/// appended. Sent with `EVAL` (Redis keeps it compiled): one round trip per pipeline, and no
/// script cache to find empty after a restart.
///
/// A batch without an id is not sent through this script first but appended with a bare
/// `XADD` ([`RedisStore::append_audit`]): Redis spends less than half the time on that (20 µs
/// against 50 µs for 64 records), on a core a sidecar shares with its model service. Only a
/// batch whose entry came out earlier than its newest record (a gateway's clock ahead of
/// Redis's) is then moved by the script, with the first entry's id as ARGV[5].
pub(super) const APPEND_AUDIT: &str = include_str!("scripts/append_audit.lua");

/// One workspace's records of an audit append, rendered for its stream.
pub(super) struct AuditBatch<'a> {
    pub(super) workspace: &'a str,
    pub(super) stream: String,
    /// The arrival time (Unix ms) of its newest record.
    pub(super) newest: u64,
    /// The records, as the entry holds them ([`audit_codec`]).
    pub(super) records: Vec<u8>,
}

/// The time (Unix ms) in a stream entry's id (`<ms>-<seq>`).
pub(super) fn stream_id_ms(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

/// How far ahead of Redis's clock an audit batch's stream entry is dated at most, for a gateway
/// whose clock runs ahead ([`APPEND_AUDIT`]): the records of one further ahead than this (and
/// than [`AUDIT_CLOCK_SKEW_MS`]) can be left out of a `since` query.
pub(super) const AUDIT_AHEAD_MAX_MS: u64 = 10 * 60 * 1000;

/// How far ahead of Redis's clock a gateway's may run without its audit records being left
/// out of a `since` query or a page: the stream entries read go back this much further. Needed
/// for entries of schema versions before 5, which took Redis's time as their id whatever their
/// records' times; an entry written since has an id no earlier than its newest record
/// ([`APPEND_AUDIT`]).
pub(super) const AUDIT_CLOCK_SKEW_MS: u64 = 2_000;

#[async_trait]
impl AuditStore for RedisStore {
    async fn append_audit(
        &self,
        records: &[AuditRecord],
        once: Option<&str>,
    ) -> Result<(), StoreError> {
        // One entry per record: a fast hash, not SipHash (workspace ids are not secrets).
        let mut by_workspace: HashMap<&str, Vec<&AuditRecord>, foldhash::fast::RandomState> =
            HashMap::default();
        for r in records {
            by_workspace.entry(&r.workspace).or_default().push(r);
        }
        let min_id = (crate::ids::unix_now().saturating_sub(self.audit_retention_secs)) * 1000;
        let batches: Vec<AuditBatch> = by_workspace
            .into_iter()
            .map(|(ws, batch)| {
                // Sized for a typical record, so the buffer is not grown record by record.
                let mut json = Vec::with_capacity(batch.len() * 400);
                AuditRecord::write_json_array(&batch, &mut json);
                AuditBatch {
                    workspace: ws,
                    stream: self.layout.audit(ws),
                    newest: batch.iter().map(|r| r.time_ms).max().unwrap_or(0),
                    records: self.audit_codec.encode(json),
                }
            })
            .collect();
        let mut conn = self.conn();
        if let Some(once) = once {
            let mut pipe = redis::pipe();
            for b in &batches {
                pipe.cmd("EVAL")
                    .arg(APPEND_AUDIT)
                    .arg(2)
                    .arg(&b.stream)
                    .arg(self.layout.audit_once(b.workspace, once))
                    .arg(min_id)
                    .arg(&b.records)
                    .arg(b.newest)
                    .arg(AUDIT_AHEAD_MAX_MS)
                    .ignore();
            }
            return pipe.query_async(&mut conn).await.map_err(unavailable);
        }
        let mut pipe = redis::pipe();
        for b in &batches {
            pipe.cmd("XADD")
                .arg(&b.stream)
                .arg("MINID")
                .arg("~")
                .arg(min_id)
                .arg("*")
                .arg("records")
                .arg(&b.records);
        }
        let ids: Vec<String> = pipe.query_async(&mut conn).await.map_err(unavailable)?;
        // Entries dated earlier than their newest record: moved, and if that fails the batch
        // is sent again (and shown once), so that a query `since` a time finds its records.
        let mut moves = redis::pipe();
        for (b, id) in batches.iter().zip(&ids) {
            if b.newest > stream_id_ms(id).unwrap_or(u64::MAX) {
                moves
                    .cmd("EVAL")
                    .arg(APPEND_AUDIT)
                    .arg(1)
                    .arg(&b.stream)
                    .arg(min_id)
                    .arg(&b.records)
                    .arg(b.newest)
                    .arg(AUDIT_AHEAD_MAX_MS)
                    .arg(id)
                    .ignore();
            }
        }
        if !moves.is_empty() {
            moves
                .query_async::<()>(&mut conn)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        Ok(self.read_audit(query, None).await?.records)
    }

    async fn audit_page(&self, query: &AuditQuery) -> Result<AuditRead, StoreError> {
        self.read_audit(query, Some(self.audit_scan_budget)).await
    }
}

/// Audit records one page of a listing decodes at most, by default: a filter that matches
/// little or nothing of a large log answers within about this much work (tens of
/// milliseconds), with a cursor to go on from.
pub const AUDIT_SCAN_BUDGET: usize = 50_000;

/// When an audit stream entry was written, as late as its records' clocks may say: a batch is
/// written after every record in it arrived, by Redis's clock, while records carry their
/// gateway's, which may run a little ahead.
fn written_ms(entry: &redis::streams::StreamId) -> u64 {
    stream_id_ms(&entry.id)
        .unwrap_or(u64::MAX)
        .saturating_add(AUDIT_CLOCK_SKEW_MS)
}

/// The records of an audit stream entry.
fn entry_records(entry: &redis::streams::StreamId) -> Vec<AuditRecord> {
    let raw: Vec<u8> = entry.get("records").unwrap_or_default();
    audit_codec::decode(&raw)
        .and_then(|json| serde_json::from_slice(&json).ok())
        .unwrap_or_default()
}

impl RedisStore {
    /// Reads audit records for `query`, decoding at most `budget` records (then stopping at
    /// the end of a batch, with where to go on), or all it takes without one.
    async fn read_audit(
        &self,
        query: &AuditQuery,
        budget: Option<usize>,
    ) -> Result<AuditRead, StoreError> {
        match &query.resume {
            Some(resume) => self.resume_audit(query, resume, budget).await,
            None => self.newest_audit(query, budget).await,
        }
    }

    /// Reads from the newest batch, newest records first.
    async fn newest_audit(
        &self,
        query: &AuditQuery,
        budget: Option<usize>,
    ) -> Result<AuditRead, StoreError> {
        let key = self.layout.audit(&query.workspace);
        let mut out = Vec::new();
        let mut end = "+".to_string();
        let since_ms = query.since.map(|s| s.saturating_mul(1000));
        let mut seen = std::collections::HashSet::new();
        let mut decoded = 0;
        let mut resume = None;
        // Entries come newest-written first, but replicas write their batches at different
        // times: an entry written earlier can hold newer records. A batch is written after
        // every record in it arrived, so once `limit` records are held, an entry written before
        // the oldest of them holds none that belongs in the answer. A page after a cursor reads
        // from the newest entry too: a batch written later may hold older records (spooled
        // through an outage, or sent by a replica whose writer was behind).
        let mut cutoff_ms: Option<u64> = None;
        'pages: loop {
            let page = self.stream_range("XREVRANGE", &key, &end, "-", 100).await?;
            if page.is_empty() {
                break;
            }
            for entry in &page {
                let written_ms = written_ms(entry);
                if since_ms.is_some_and(|s| written_ms < s)
                    || cutoff_ms.is_some_and(|c| written_ms < c)
                {
                    break 'pages;
                }
                let batch = entry_records(entry);
                decoded += batch.len();
                let matching: Vec<AuditRecord> =
                    batch.into_iter().filter(|r| query.matches(r)).collect();
                let matched = matching.len();
                // A batch whose acknowledgement was lost is written again: show it once.
                out.extend(
                    matching
                        .into_iter()
                        .filter(|r| seen.insert(r.request_id.clone())),
                );
                if out.len() >= query.limit {
                    AuditRecord::sort_listing(&mut out);
                    out.truncate(query.limit);
                    cutoff_ms = out.last().map(|r| r.time_ms);
                }
                end = format!("({}", entry.id);
                // Out of budget with the page not full: what was found, and where to go on.
                // (A full page reads on to its cutoff, a few batches at most.)
                if cutoff_ms.is_none() && budget.is_some_and(|b| decoded >= b) {
                    resume = Some(AuditResume {
                        entry: entry.id.clone(),
                        skip: matched,
                    });
                    break 'pages;
                }
            }
        }
        AuditRecord::sort_listing(&mut out);
        out.truncate(query.limit);
        Ok(AuditRead {
            records: out,
            resume,
        })
    }

    /// Goes on with a scan from where it stopped, batch after batch in the order the log
    /// holds them (newest written first), each page's records newest first.
    async fn resume_audit(
        &self,
        query: &AuditQuery,
        from: &AuditResume,
        budget: Option<usize>,
    ) -> Result<AuditRead, StoreError> {
        let key = self.layout.audit(&query.workspace);
        let mut out = Vec::new();
        let mut end = from.entry.clone();
        let since_ms = query.since.map(|s| s.saturating_mul(1000));
        let mut seen = std::collections::HashSet::new();
        let mut decoded = 0;
        let mut resume = None;
        'pages: loop {
            let page = self.stream_range("XREVRANGE", &key, &end, "-", 100).await?;
            if page.is_empty() {
                break;
            }
            for entry in &page {
                if since_ms.is_some_and(|s| written_ms(entry) < s) {
                    break 'pages;
                }
                let batch = entry_records(entry);
                decoded += batch.len();
                // Matching records are counted before the duplicates of a batch written twice
                // are left out, so a batch's count is the same on every page that reads it.
                let matching: Vec<AuditRecord> =
                    batch.into_iter().filter(|r| query.matches(r)).collect();
                let skip = if entry.id == from.entry { from.skip } else { 0 };
                for (i, record) in matching.iter().enumerate().skip(skip) {
                    if out.len() == query.limit {
                        resume = Some(AuditResume {
                            entry: entry.id.clone(),
                            skip: i,
                        });
                        break 'pages;
                    }
                    if seen.insert(record.request_id.clone()) {
                        out.push(record.clone());
                    }
                }
                end = format!("({}", entry.id);
                if out.len() == query.limit || budget.is_some_and(|b| decoded >= b) {
                    resume = Some(AuditResume {
                        entry: entry.id.clone(),
                        skip: matching.len(),
                    });
                    break 'pages;
                }
            }
        }
        AuditRecord::sort_listing(&mut out);
        Ok(AuditRead {
            records: out,
            resume,
        })
    }
}
