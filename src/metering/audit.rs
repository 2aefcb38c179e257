//! The audit log: one record per authenticated request, written off the request path.
//!
//! The request path queues a record (in a queue of its thread's own) and moves on. A writer task
//! batches records (per flush interval) into the store, one stream entry per workspace and
//! batch, so the log costs a few Redis commands per second, not one per request. While the
//! store is unreachable, records wait in memory up to a bound in number and in time, then in
//! spool files on disk, and are written, oldest first, when it is back. At shutdown whatever could not be written
//! goes to the spool, and the next start writes it.

use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use thread_local::ThreadLocal;

pub use super::audit_query::{AuditCursor, AuditQuery, AuditRead, AuditResume, ListingCursor};
use super::audit_spool::{Backlog, Spool, SPOOL_FILE_RECORDS};
use super::store::AuditStore;
use crate::ids::RequestId;
use crate::keys::{CachedKey, Environment};
use crate::metering::Credits;

/// One authenticated request. Never holds a secret: the key appears as prefix and last four.
///
/// Rendered for every request, so what it can share it does: the workspace and key id are the
/// cached key's own, the environment and common methods are constants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditRecord {
    /// Unix milliseconds when the request arrived.
    pub time_ms: u64,
    /// `req_…`
    #[schema(value_type = String)]
    pub request_id: CompactString,
    /// `ws_…`
    #[schema(value_type = String)]
    pub workspace: Arc<str>,
    /// The key billed (the parent, for a scoped token).
    #[schema(value_type = String)]
    pub key_id: Arc<str>,
    /// Prefix and last four of the key or token presented.
    #[schema(value_type = String)]
    pub key: CompactString,
    /// `live`, `test` (a scoped token's parent's).
    pub environment: Environment,
    /// `Service-Project`, if sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// HTTP method.
    #[schema(value_type = String)]
    pub method: Cow<'static, str>,
    /// Request path (no query string; a key in it cut to its last four).
    #[schema(value_type = String)]
    pub path: CompactString,
    /// The `model` of the JSON body, or the backend's `Service-Model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub model: Option<CompactString>,
    /// Response status.
    pub status: u16,
    /// Credits charged.
    pub credits: f64,
    /// Client address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub client_ip: Option<IpAddr>,
    /// Time to the end of the response, milliseconds.
    pub latency_ms: u64,
    /// The scoped token used, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// The scoped token's metadata (the token's own copy, shared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// The key's metadata (for a scoped token, its parent's as it was when the token was
    /// minted), shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub key_metadata: Option<crate::keys::Metadata>,
    /// Who acted, on a record of an administrative action rather than a gateway request:
    /// `root` (the configured admin token), `operator:<name>` or `dashboard:<email>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// On a record of a refused credential: how many of the key's refused requests since its
    /// previous record were not recorded (`metering.refused_audit_per_second`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppressed: Option<u64>,
    /// On a record of an upgraded connection (a WebSocket): what went through the tunnel,
    /// written when it closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<Tunnel>,
}

/// What went through an upgraded connection, both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Tunnel {
    /// From the upgrade's answer to the close, milliseconds.
    pub duration_ms: u64,
    /// Bytes the client sent through it.
    pub bytes_from_client: u64,
    /// Bytes the backend sent through it.
    pub bytes_to_client: u64,
}

impl AuditRecord {
    /// Where the record stands in a listing, which runs newest first: by arrival, and among
    /// records of the same millisecond by request id, so every page of a listing is the same.
    pub fn position(&self) -> (u64, &str) {
        (self.time_ms, &self.request_id)
    }

    /// Sorts `records` as a listing shows them: newest first.
    pub fn sort_listing(records: &mut [AuditRecord]) {
        records.sort_unstable_by(|a, b| b.position().cmp(&a.position()));
    }

    /// About how many bytes of memory the record holds once rendered: its own and its strings'
    /// (the token's metadata is shared with the key cache and not counted).
    pub fn memory_size(&self) -> usize {
        std::mem::size_of::<AuditRecord>()
            + self.request_id.len()
            + self.key.len()
            + self.path.len()
            + self.project.as_ref().map_or(0, String::len)
            + self.model.as_ref().map_or(0, |m| m.len())
            + self.token_id.as_ref().map_or(0, String::len)
            + self.actor.as_ref().map_or(0, String::len)
    }

    /// Appends `records` to `out` as a JSON array, byte for byte what `serde_json` writes for
    /// them (the format is serde's: records are read back with [`Deserialize`]).
    ///
    /// Every request's record is serialized, off the request path but on the same two cores:
    /// through serde, each field costs a call per name, a scan of its name for characters to
    /// escape, and several small writes, about 4,800 instructions a record. Here the names are
    /// constants written with their punctuation, and a string is handed to `serde_json` only if
    /// it holds a character JSON escapes (ids, key and environment never do).
    pub fn write_json_array(records: &[&AuditRecord], out: &mut Vec<u8>) {
        out.push(b'[');
        for (i, record) in records.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            record.write_json(out);
        }
        out.push(b']');
    }

    /// Appends the record to `out` as `serde_json` writes it, fields in declaration order.
    fn write_json(&self, out: &mut Vec<u8>) {
        let mut number = itoa::Buffer::new();
        out.extend_from_slice(b"{\"time_ms\":");
        out.extend_from_slice(number.format(self.time_ms).as_bytes());
        out.extend_from_slice(b",\"request_id\":");
        json_str(out, &self.request_id);
        out.extend_from_slice(b",\"workspace\":");
        json_str(out, &self.workspace);
        out.extend_from_slice(b",\"key_id\":");
        json_str(out, &self.key_id);
        out.extend_from_slice(b",\"key\":");
        json_str(out, &self.key);
        out.extend_from_slice(b",\"environment\":");
        json_str(out, self.environment.as_str());
        if let Some(project) = &self.project {
            out.extend_from_slice(b",\"project\":");
            json_str(out, project);
        }
        out.extend_from_slice(b",\"method\":");
        json_str(out, &self.method);
        out.extend_from_slice(b",\"path\":");
        json_str(out, &self.path);
        if let Some(model) = &self.model {
            out.extend_from_slice(b",\"model\":");
            json_str(out, model);
        }
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(number.format(self.status).as_bytes());
        out.extend_from_slice(b",\"credits\":");
        json_value(out, &self.credits);
        if let Some(ip) = &self.client_ip {
            out.extend_from_slice(b",\"client_ip\":");
            json_value(out, ip);
        }
        out.extend_from_slice(b",\"latency_ms\":");
        out.extend_from_slice(number.format(self.latency_ms).as_bytes());
        if let Some(token_id) = &self.token_id {
            out.extend_from_slice(b",\"token_id\":");
            json_str(out, token_id);
        }
        if let Some(metadata) = &self.metadata {
            out.extend_from_slice(b",\"metadata\":");
            json_value(out, metadata);
        }
        if let Some(key_metadata) = &self.key_metadata {
            out.extend_from_slice(b",\"key_metadata\":");
            json_value(out, key_metadata);
        }
        if let Some(actor) = &self.actor {
            out.extend_from_slice(b",\"actor\":");
            json_str(out, actor);
        }
        if let Some(suppressed) = self.suppressed {
            out.extend_from_slice(b",\"suppressed\":");
            out.extend_from_slice(number.format(suppressed).as_bytes());
        }
        if let Some(tunnel) = &self.tunnel {
            out.extend_from_slice(b",\"tunnel\":");
            json_value(out, tunnel);
        }
        out.push(b'}');
    }
}

/// Appends `s` as a JSON string: as it is, quoted, unless it holds a character JSON escapes
/// (a control character, `"` or `\`, the same set as `serde_json`'s), which `serde_json` then
/// escapes.
fn json_str(out: &mut Vec<u8>, s: &str) {
    // Without an early exit, so the compiler checks many bytes at once.
    let escapes = s.bytes().fold(false, |found, b| {
        found | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !escapes {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        json_value(out, s);
    }
}

/// Appends `value` as `serde_json` writes it.
fn json_value<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing to a vector cannot fail, and none of the record's values (strings, numbers, an
    // address, a map with string keys) can fail to serialize.
    let start = out.len();
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        tracing::error!(error = %e, "audit record value not serialized");
        out.truncate(start);
        out.extend_from_slice(b"null");
    }
}

/// An audit record as the request path leaves it: the key it already holds and plain values.
/// The writer renders it into an [`AuditRecord`] (the masked key, the token's metadata) off the
/// request path. The strings are [`CompactString`]s, which hold the usual request id, path and
/// model inline: a heap string would be allocated on a worker thread and freed on the store
/// thread's, for every request.
#[derive(Debug)]
pub struct PendingAudit {
    /// Unix milliseconds when the request arrived.
    pub time_ms: u64,
    /// `req_…`
    pub request_id: RequestId,
    /// The key or scoped token presented.
    pub key: Arc<CachedKey>,
    /// `Service-Project`, if sent.
    pub project: Option<String>,
    /// The request's method.
    pub method: http::Method,
    /// The request's path, a key in it cut to its last four.
    pub path: CompactString,
    /// The `model` of the JSON body, or the backend's `Service-Model`.
    pub model: Option<CompactString>,
    /// Response status.
    pub status: u16,
    /// Credits charged.
    pub credits: Credits,
    /// Client address.
    pub client_ip: Option<IpAddr>,
    /// Time to the end of the response, milliseconds.
    pub latency_ms: u64,
    /// A refused credential's record: its key's records left out before it.
    pub suppressed: Option<u64>,
    /// An upgraded connection's traffic.
    pub tunnel: Option<Tunnel>,
}

impl PendingAudit {
    /// The record as it is stored.
    pub fn render(self) -> AuditRecord {
        let key = &self.key;
        AuditRecord {
            time_ms: self.time_ms,
            request_id: self.request_id,
            workspace: key.workspace.clone(),
            key_id: key.billed_key_id_shared(),
            key: key.masked(),
            environment: key.effective_environment(),
            project: self.project,
            method: method_name(&self.method),
            path: self.path,
            model: self.model,
            status: self.status,
            credits: self.credits.as_f64(),
            client_ip: self.client_ip,
            latency_ms: self.latency_ms,
            token_id: key.scoped.as_ref().map(|_| key.id.to_string()),
            metadata: key
                .scoped
                .as_ref()
                .filter(|g| !g.metadata.is_empty())
                .map(|g| g.metadata.clone()),
            key_metadata: key.metadata.as_ref().map(|(m, _)| m.clone()),
            actor: None,
            suppressed: self.suppressed,
            tunnel: self.tunnel,
        }
    }
}

/// A method's name, without a copy for the standard ones.
fn method_name(method: &http::Method) -> Cow<'static, str> {
    const STANDARD: [&str; 7] = ["POST", "GET", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"];
    match STANDARD.iter().find(|m| **m == method.as_str()) {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(method.to_string()),
    }
}

/// The request path's handle: hands records to the writer.
///
/// Each worker thread queues into a vector of its own, behind a lock that only the writer
/// also takes (when it drains, every few milliseconds): an uncontended lock per record. A
/// shared channel cost several atomic operations per record that all cores contend for.
#[derive(Clone)]
pub struct AuditLog {
    queues: Arc<Queues>,
}

/// Audit records a thread's queue holds when the writer is told a batch is ready (it writes
/// them then). A batch's fixed cost (a wakeup, a round trip) favours large batches; 256 keeps
/// most of that gain while a batch stays a short burst next to the request path.
pub const AUDIT_BATCH: usize = 256;

/// Records queued by the request path, per thread.
#[derive(Default)]
struct Queues {
    per_thread: ThreadLocal<Mutex<Vec<PendingAudit>>>,
    /// Set before the writer's last drain: a record queued after it would never be written.
    closed: AtomicBool,
    /// Told when a thread's queue reaches [`AUDIT_BATCH`] (its permit kept if the writer is
    /// not waiting).
    batch_ready: tokio::sync::Notify,
}

impl Queues {
    /// Each thread's queue, locked. A thread that panicked holding the lock left the queue
    /// whole (a push or a swap), so its records are still good.
    fn each(&self) -> impl Iterator<Item = MutexGuard<'_, Vec<PendingAudit>>> {
        self.per_thread
            .iter()
            .map(|q| q.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl AuditLog {
    /// Queues one record; never blocks on the store.
    pub fn record(&self, record: PendingAudit) {
        let queue = self.queues.per_thread.get_or_default();
        let mut queue = queue.lock().unwrap_or_else(PoisonError::into_inner);
        // Read under the queue's lock: a queue drained for the last time was drained after
        // the flag was set, and this lock orders the two.
        if self.queues.closed.load(Ordering::SeqCst) {
            tracing::error!("audit writer is gone; a record could not be queued");
            return;
        }
        queue.push(record);
        let ready = queue.len() == AUDIT_BATCH;
        drop(queue);
        if ready {
            self.queues.batch_ready.notify_one();
        }
    }
}

/// Writes queued records to the store in batches, spooling while it cannot.
pub struct AuditWriter {
    queues: Arc<Queues>,
    /// An empty vector, swapped for a thread's queue when draining it: the queue keeps its
    /// capacity, and does not grow again from nothing after every drain.
    spare: Vec<PendingAudit>,
    store: Arc<dyn AuditStore>,
    /// Records taken from the queues and not yet written, oldest first.
    backlog: Backlog,
    spool: Spool,
    max_backlog: usize,
    /// The most memory the backlog may hold (bytes), spooled past it; dropped past it only
    /// while the spool directory does not take them either.
    max_backlog_bytes: usize,
    /// Since when the backlog has not been empty at the end of a flush, if it has not.
    unwritten_since: Option<std::time::Instant>,
}

/// An audit log handle and the writer that serves it.
pub fn audit_log(
    store: Arc<dyn AuditStore>,
    spool_dir: PathBuf,
    max_backlog: usize,
) -> (AuditLog, AuditWriter) {
    let queues = Arc::new(Queues::default());
    (
        AuditLog {
            queues: queues.clone(),
        },
        AuditWriter {
            queues,
            spare: Vec::new(),
            store,
            backlog: Backlog::default(),
            spool: Spool::new(spool_dir),
            max_backlog,
            max_backlog_bytes: usize::MAX,
            unwritten_since: None,
        },
    )
}

impl AuditWriter {
    /// Bounds the memory the backlog holds to about `bytes`.
    pub fn with_max_backlog_bytes(mut self, bytes: usize) -> Self {
        self.max_backlog_bytes = bytes;
        self
    }

    /// Moves everything queued so far into the backlog, rendered. With `close`, the queues
    /// take no more records.
    fn drain_queues(&mut self, close: bool) {
        if close {
            self.queues.closed.store(true, Ordering::SeqCst);
        }
        for mut queue in self.queues.each() {
            std::mem::swap(&mut *queue, &mut self.spare);
            drop(queue);
            self.backlog
                .extend(self.spare.drain(..).map(PendingAudit::render));
        }
    }

    /// One write attempt: spooled records first (they are older), then the backlog. Returns
    /// how many records were written. While the store does not take them, the backlog keeps
    /// at most `max_backlog` records and `max_backlog_bytes`: the rest goes to spool files.
    pub async fn flush(&mut self) -> usize {
        self.drain_queues(false);
        let mut written = 0;
        let mut spool_refused = false;
        // Bounded, so a large spool does not hold up the next spend flush for long.
        for _ in 0..SPOOL_WRITES_PER_FLUSH {
            let Some(file) = self.spool.oldest() else {
                break;
            };
            let chunk = file.chunk();
            let n = chunk.len();
            if self
                .store
                .append_audit(chunk, Some(&file.chunk_id()))
                .await
                .is_err()
            {
                spool_refused = true;
                break;
            }
            written += n;
            self.spool.chunk_written();
        }
        // Behind a file the store refuses, the backlog waits: most likely the store is down.
        // A file refused a few times in a row is tried past: if the store takes the backlog
        // and still refuses the file, again and again, it is the file (set aside), not the
        // store (which may answer and refuse writes a while: out of memory, read-only).
        let try_backlog = !spool_refused || self.spool.refused_often();
        let mut backlog_taken = false;
        while try_backlog && !self.backlog.is_empty() {
            // Moved out, not copied; put back in order if the store refuses them.
            let batch = self.backlog.take_oldest(SPOOL_FILE_RECORDS);
            let n = batch.len();
            if let Err(e) = self.store.append_audit(&batch, None).await {
                tracing::debug!(error = %e, "audit records not written; kept");
                self.backlog.put_back(batch);
                break;
            }
            written += n;
            backlog_taken = true;
        }
        if spool_refused && backlog_taken {
            self.spool.refused_alone();
        }
        let waited_long = match self.backlog.is_empty() {
            true => {
                self.unwritten_since = None;
                false
            }
            false => {
                let since = self
                    .unwritten_since
                    .get_or_insert_with(std::time::Instant::now);
                since.elapsed() >= SPILL_AFTER
            }
        };
        // Spilled when there are too many, or they have waited long: a crash loses what is in
        // memory, so about `SPILL_AFTER` (and a flush interval) of records at most.
        let too_many = self.backlog.len() > self.max_backlog;
        if too_many || self.backlog.bytes() > self.max_backlog_bytes || waited_long {
            self.spill();
            self.unwritten_since = None;
        }
        // Neither the store nor the disk takes them: memory is bounded all the same. Spend is
        // not in these records (it is kept apart, and spooled apart), so none is lost here.
        let dropped = self.backlog.drop_oldest_over(self.max_backlog_bytes);
        if dropped > 0 {
            crate::metrics::record_audit_dropped(dropped);
            tracing::error!(
                records = dropped,
                "audit records dropped: the store and the spool directory refuse them and \
                 metering.audit_backlog_bytes is reached"
            );
        }
        written
    }

    /// Moves the whole backlog to spool files; what cannot be written stays in memory.
    fn spill(&mut self) {
        let spilled = self.backlog.take_oldest(usize::MAX);
        match self.spool.write(&spilled) {
            Ok(()) => tracing::warn!(
                records = spilled.len(),
                "store unreachable: audit records spooled to disk"
            ),
            Err((e, kept)) => {
                tracing::error!(error = %e, "cannot spool audit records; keeping them in memory");
                self.backlog.put_back(kept);
            }
        }
    }

    /// At shutdown: one attempt at the backlog (spool files are left for the next start, or
    /// the process taking over), then whatever is left goes to the spool.
    pub async fn close(mut self) {
        self.drain_queues(true);
        while !self.backlog.is_empty() {
            let batch = self.backlog.take_oldest(SPOOL_FILE_RECORDS);
            if self.store.append_audit(&batch, None).await.is_err() {
                self.backlog.put_back(batch);
                break;
            }
        }
        if !self.backlog.is_empty() {
            let left = self.backlog.take_oldest(usize::MAX);
            let records = left.len();
            match self.spool.write(&left) {
                Ok(()) => tracing::warn!(records, "audit records spooled for the next start"),
                Err((e, lost)) => {
                    tracing::error!(error = %e, records = lost.len(), "audit records lost: cannot spool")
                }
            }
        }
    }

    /// Resolves when a thread's queue has reached [`AUDIT_BATCH`] records since the last time
    /// it did (at once if it had while nobody waited).
    pub async fn batch_ready(&self) {
        self.queues.batch_ready.notified().await;
    }

    /// Records queued by the request path or waiting in memory.
    pub fn queued(&self) -> usize {
        self.queues.each().map(|q| q.len()).sum::<usize>() + self.backlog.len()
    }

    /// Records waiting in memory.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }
}

/// How long records the store does not take wait in memory before they are spooled to disk,
/// however few.
const SPILL_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Writes of spooled records in one flush, at most.
const SPOOL_WRITES_PER_FLUSH: usize = 20;

#[cfg(test)]
mod tests {
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
            suppressed: None,
            tunnel: None,
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
            suppressed: full.then_some(3),
            tunnel: full.then_some(Tunnel {
                duration_ms: 12,
                bytes_from_client: 1,
                bytes_to_client: u64::MAX,
            }),
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

    /// A store that takes nothing.
    struct Unreachable;

    #[async_trait::async_trait]
    impl AuditStore for Unreachable {
        async fn append_audit(
            &self,
            _: &[AuditRecord],
            _: Option<&str>,
        ) -> Result<(), crate::shared::store::StoreError> {
            Err(crate::shared::store::StoreError::Unavailable("down".into()))
        }

        async fn audit(
            &self,
            _: &AuditQuery,
        ) -> Result<Vec<AuditRecord>, crate::shared::store::StoreError> {
            Ok(Vec::new())
        }
    }

    fn long_path(key: &Arc<CachedKey>, n: usize) -> PendingAudit {
        PendingAudit {
            path: "/v1/"
                .chars()
                .chain(std::iter::repeat_n('a', 2000))
                .collect(),
            ..pending(key, n)
        }
    }

    #[tokio::test]
    async fn past_its_bytes_the_backlog_goes_to_the_spool_before_its_count_is_reached() {
        let spool = tempfile::tempdir().unwrap();
        let (log, writer) = audit_log(Arc::new(Unreachable), spool.path().into(), 1_000_000);
        let mut writer = writer.with_max_backlog_bytes(64 * 1024);
        let key = key();
        for i in 0..100 {
            log.record(long_path(&key, i));
        }
        writer.flush().await;
        assert_eq!(writer.backlog_len(), 0, "spooled");
        let files = std::fs::read_dir(spool.path()).unwrap().count();
        assert!(files > 0);
    }

    #[tokio::test]
    async fn with_neither_store_nor_spool_the_backlog_stays_within_its_bytes() {
        // A file where the spool directory should be: nothing can be spooled.
        let spool = tempfile::NamedTempFile::new().unwrap();
        let (log, writer) = audit_log(Arc::new(Unreachable), spool.path().into(), 1_000_000);
        let max = 64 * 1024;
        let mut writer = writer.with_max_backlog_bytes(max);
        let key = key();
        for round in 0..5 {
            for i in 0..100 {
                log.record(long_path(&key, round * 100 + i));
            }
            writer.flush().await;
            assert!(writer.backlog.bytes() <= max, "{}", writer.backlog.bytes());
            assert!(writer.backlog_len() > 0, "the newest are kept");
        }
        // The newest records are the ones kept.
        let newest = writer.backlog.take_oldest(usize::MAX);
        assert_eq!(newest.last().map(|r| r.time_ms), Some(499));
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
}
