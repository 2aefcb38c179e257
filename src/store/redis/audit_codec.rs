//! How an audit batch is held in its stream entry: the records' JSON array, compressed with
//! zstd.
//!
//! An audit record is about 320 bytes of JSON, and Redis keeps every one for the retention
//! (30 days by default): uncompressed, a stream held about 370 bytes of memory per request.
//! A batch's records share their workspace, keys, routes and models, and compress about
//! sevenfold at zstd's level 1 (64 records: 20 KB to 2.8 KB, in about 30 µs on the store
//! thread), which also leaves Redis less to copy on every append. Entries of schema versions
//! before 6 hold the JSON as it is; a zstd frame cannot be mistaken for one (JSON begins
//! with `[`), so both are read.

use std::borrow::Cow;
use std::sync::{Mutex, PoisonError};

/// zstd's level 1: its fastest at nearly its best ratio on audit JSON (level 3 compressed a
/// batch no smaller and took longer; the negative levels were faster and a fifth larger).
const LEVEL: i32 = 1;

/// The first four bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// The largest batch read back (a batch holds at most a spool file's 5,000 records, about
/// 2 MB): a corrupt or foreign entry claiming more is skipped, not allocated.
const MAX_BATCH_BYTES: usize = 64 << 20;

/// Compresses audit batches; one compression context, reused (the store thread is its only
/// user, so the lock is not contended).
pub(super) struct AuditCodec {
    compressor: Mutex<Option<zstd::bulk::Compressor<'static>>>,
}

impl AuditCodec {
    pub(super) fn new() -> Self {
        Self {
            compressor: Mutex::new(None),
        }
    }

    /// A batch's JSON as its stream entry holds it: compressed, or as it is if zstd fails
    /// (which it does only when it cannot allocate; the reader takes both).
    pub(super) fn encode(&self, json: Vec<u8>) -> Vec<u8> {
        let mut compressor = self
            .compressor
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if compressor.is_none() {
            *compressor = zstd::bulk::Compressor::new(LEVEL).ok();
        }
        match compressor.as_mut().map(|c| c.compress(&json)) {
            Some(Ok(packed)) => packed,
            _ => json,
        }
    }
}

/// The JSON of a batch as its stream entry holds it: decompressed, or as it is if it was
/// written uncompressed. `None` for a frame that cannot be read back.
pub(super) fn decode(raw: &[u8]) -> Option<Cow<'_, [u8]>> {
    decode_within(raw, MAX_BATCH_BYTES)
}

/// [`decode`], for a batch of at most `max` bytes.
fn decode_within(raw: &[u8], max: usize) -> Option<Cow<'_, [u8]>> {
    if !raw.starts_with(&ZSTD_MAGIC) {
        return Some(Cow::Borrowed(raw));
    }
    let size = zstd::bulk::Decompressor::upper_bound(raw)?;
    if size > max {
        return None;
    }
    zstd::bulk::decompress(raw, size).ok().map(Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_comes_back_as_it_went_in_and_smaller() {
        let record = r#"{"time_ms":1795918179564,"request_id":"req_hKvOhNoLKRisxIu2iK1y","workspace":"ws_kX23yyAOAwiLVVC5IOkV","key_id":"key_89z9Z35VoedfhBxcFwYU","environment":"live","status":200}"#;
        let json = format!("[{}]", vec![record; 64].join(",")).into_bytes();
        let packed = AuditCodec::new().encode(json.clone());
        assert!(packed.starts_with(&ZSTD_MAGIC));
        assert!(packed.len() * 5 < json.len(), "{} bytes", packed.len());
        assert_eq!(decode(&packed).as_deref(), Some(&json[..]));
    }

    #[test]
    fn json_written_uncompressed_is_read_as_it_is() {
        let json = br#"[{"time_ms":1}]"#;
        assert!(matches!(decode(json), Some(Cow::Borrowed(b)) if b == json));
    }

    #[test]
    fn a_frame_that_cannot_be_read_is_skipped() {
        let mut packed = AuditCodec::new().encode(b"[]".repeat(100));
        packed.truncate(packed.len() - 3);
        assert_eq!(decode(&packed), None);
        assert_eq!(decode(&ZSTD_MAGIC), None);
    }

    #[test]
    fn a_frame_holding_more_than_a_batch_can_is_skipped() {
        let json = b"[{}]".repeat(1000);
        let packed = AuditCodec::new().encode(json.clone());
        assert_eq!(
            decode_within(&packed, json.len()).as_deref(),
            Some(&json[..])
        );
        assert_eq!(decode_within(&packed, json.len() - 1), None);
    }
}
