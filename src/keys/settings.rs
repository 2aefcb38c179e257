//! What a platform sets per key and per workspace besides scopes and budgets: a rate limit
//! that overrides the environment's, and free-form metadata that travels with the key.
//!
//! Pure data and checks; the request path reads them from the key cache, where a workspace's
//! limit is one shared cell per workspace ([`SharedLimit`]), refreshed by the change feed.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Highest `requests_per_minute` (and `burst`) a key or workspace may be given.
pub const MAX_REQUESTS_PER_MINUTE: u32 = 10_000_000;

/// Largest metadata, as compact JSON: it is copied into every audit record and, when the
/// gateway forwards it, into a request header.
pub const MAX_METADATA_BYTES: usize = 4096;

/// Free-form key/value pairs of a key (a customer id, a plan), shared rather than copied.
pub type Metadata = Arc<serde_json::Map<String, serde_json::Value>>;

/// A per-minute rate limit with a burst allowance, overriding the environment's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained rate, 1 to 10,000,000.
    pub requests_per_minute: u32,
    /// Requests allowed at once (1 to 10,000,000); absent: the same as `requests_per_minute`.
    #[serde(default)]
    pub burst: Option<u32>,
}

impl RateLimit {
    /// The burst, defaulted.
    pub fn burst(self) -> u32 {
        self.burst.unwrap_or(self.requests_per_minute)
    }

    /// Whether both figures are within 1..=[`MAX_REQUESTS_PER_MINUTE`].
    pub fn check(self) -> Result<Self, String> {
        let valid = |n: u32| (1..=MAX_REQUESTS_PER_MINUTE).contains(&n);
        if !valid(self.requests_per_minute) || !valid(self.burst()) {
            return Err(format!(
                "rate_limit.requests_per_minute and rate_limit.burst must be 1 to {MAX_REQUESTS_PER_MINUTE}"
            ));
        }
        Ok(self)
    }

    /// Packed for a [`SharedLimit`]: never 0 or [`UNLOADED`] for a checked limit.
    fn pack(self) -> u64 {
        (u64::from(self.requests_per_minute) << 32) | u64::from(self.burst())
    }

    fn unpack(packed: u64) -> Option<Self> {
        match packed {
            0 | UNLOADED => None,
            p => Some(Self {
                requests_per_minute: (p >> 32) as u32,
                burst: Some(p as u32),
            }),
        }
    }
}

/// A [`SharedLimit`] not read from the store yet.
const UNLOADED: u64 = u64::MAX;

/// A workspace's rate limit as every cached key of the workspace sees it: one cell, updated in
/// place when the workspace changes, so its keys need not be dropped and read again. Read on
/// every request with one atomic load.
#[derive(Debug)]
pub struct SharedLimit(AtomicU64);

impl SharedLimit {
    /// A cell whose value is not known yet (read as no limit).
    pub fn unloaded() -> Self {
        Self(AtomicU64::new(UNLOADED))
    }

    /// A cell holding `limit`.
    pub fn of(limit: Option<RateLimit>) -> Self {
        Self(AtomicU64::new(limit.map_or(0, RateLimit::pack)))
    }

    /// The limit, if the workspace has one.
    #[inline]
    pub fn get(&self) -> Option<RateLimit> {
        RateLimit::unpack(self.0.load(Ordering::Acquire))
    }

    /// Whether the cell has been read from the store.
    pub fn is_loaded(&self) -> bool {
        self.0.load(Ordering::Acquire) != UNLOADED
    }

    /// Sets the value read by a change: it wins over any earlier read.
    pub fn set(&self, limit: Option<RateLimit>) {
        self.0
            .store(limit.map_or(0, RateLimit::pack), Ordering::Release);
    }

    /// Sets the value of a first read, unless a change has set one meanwhile (a newer read).
    pub fn load_once(&self, limit: Option<RateLimit>) {
        let _ = self.0.compare_exchange(
            UNLOADED,
            limit.map_or(0, RateLimit::pack),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

impl PartialEq for SharedLimit {
    fn eq(&self, other: &Self) -> bool {
        self.0.load(Ordering::Acquire) == other.0.load(Ordering::Acquire)
    }
}

/// Checks metadata given through the admin API: at most [`MAX_METADATA_BYTES`] of compact
/// JSON. (That it is an object is the type's.)
pub fn check_metadata(
    metadata: serde_json::Map<String, serde_json::Value>,
) -> Result<Metadata, String> {
    let size = serde_json::to_vec(&metadata).map_or(usize::MAX, |v| v.len());
    if size > MAX_METADATA_BYTES {
        return Err(format!(
            "metadata must be at most {MAX_METADATA_BYTES} bytes of JSON; this is {size}"
        ));
    }
    Ok(Arc::new(metadata))
}

/// `metadata` as compact JSON of visible ASCII only, for a request header: every character
/// outside it is written as a JSON `\u` escape, which any JSON parser reads back as it was.
pub fn header_json(metadata: &serde_json::Map<String, serde_json::Value>) -> String {
    let json = serde_json::to_string(metadata).unwrap_or_else(|_| "{}".into());
    if json.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    let mut units = [0u16; 2];
    for c in json.chars() {
        if (' '..='~').contains(&c) {
            out.push(c);
        } else {
            // serde_json escapes control characters already; what is left is DEL and
            // non-ASCII, written as UTF-16 escapes (a pair beyond the BMP).
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_limit_is_set_by_a_change_and_loaded_once() {
        let cell = SharedLimit::unloaded();
        assert!(!cell.is_loaded());
        assert_eq!(cell.get(), None);
        let five = RateLimit {
            requests_per_minute: 5,
            burst: None,
        };
        // A change read after the first load began wins over it.
        cell.set(Some(five));
        cell.load_once(None);
        assert_eq!(
            cell.get().map(|l| (l.requests_per_minute, l.burst())),
            Some((5, 5))
        );
        cell.set(None);
        assert!(cell.is_loaded());
        assert_eq!(cell.get(), None);
    }

    #[test]
    fn limits_are_checked() {
        let limit = |rpm, burst| RateLimit {
            requests_per_minute: rpm,
            burst,
        };
        assert!(limit(0, None).check().is_err());
        assert!(limit(5, Some(0)).check().is_err());
        assert!(limit(MAX_REQUESTS_PER_MINUTE + 1, Some(1)).check().is_err());
        assert!(limit(MAX_REQUESTS_PER_MINUTE, None).check().is_ok());
        let packed = limit(7, Some(3)).pack();
        assert_eq!(RateLimit::unpack(packed), Some(limit(7, Some(3))));
    }

    #[test]
    fn metadata_is_capped_and_forwarded_as_ascii_json() {
        let big = serde_json::json!({"blob": "x".repeat(MAX_METADATA_BYTES)});
        let serde_json::Value::Object(big) = big else {
            unreachable!()
        };
        assert!(check_metadata(big).is_err());
        let serde_json::Value::Object(m) =
            serde_json::json!({"customer": "Zoë 😀", "plan": "pro\u{7f}", "n": 1})
        else {
            unreachable!()
        };
        let header = header_json(&m);
        assert!(
            header.bytes().all(|b| (0x20..0x7f).contains(&b)),
            "{header}"
        );
        let back: serde_json::Value = serde_json::from_str(&header).unwrap();
        assert_eq!(back, serde_json::Value::Object(m));
    }
}
