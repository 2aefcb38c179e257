//! Audit records of refused credentials, bounded per key and second.
//!
//! A key that exists but is refused (revoked, past its grace period, an expired token, a token
//! whose parent is gone) is audited: a leaked key still in use shows who used it and from
//! where. Whoever holds such a credential can send it as fast as the network allows, so its
//! records are kept to a few per key and second; the rest are counted, in
//! `svcgate_audit_records_suppressed_total` and in the `suppressed` field of the key's next
//! record that is kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Keys whose counts are kept before those of past seconds are dropped: a flood over many
/// keys holds a bounded map.
const KEYS_TRACKED: usize = 10_000;

/// One key's records in its current second.
#[derive(Debug, Clone, Copy, Default)]
struct Second {
    /// The unix second counted.
    second: u64,
    /// Records kept in it.
    kept: u32,
    /// Records not kept since the key's last kept record.
    suppressed: u64,
}

/// Decides which refused-credential records are kept.
pub struct RefusedAudit {
    per_second: u32,
    /// By billed key id. A lock, not a sharded map: only refused requests come here.
    seconds: Mutex<HashMap<Arc<str>, Second>>,
}

impl RefusedAudit {
    /// Keeps at most `per_second` records per key and second.
    pub fn new(per_second: u32) -> Self {
        Self {
            per_second,
            seconds: Mutex::default(),
        }
    }

    /// Whether a record of `key_id` at `now_ms` is kept: `Some(n)` with the number of its
    /// records suppressed since the last one kept, or `None` (counted) if it is not.
    pub fn admit(&self, key_id: &Arc<str>, now_ms: u64) -> Option<u64> {
        let second = now_ms / 1000;
        let mut seconds = self.seconds.lock().unwrap_or_else(PoisonError::into_inner);
        if seconds.len() >= KEYS_TRACKED && !seconds.contains_key(key_id) {
            // What was suppressed in a past second has been counted in the metric; only the
            // field of a later record loses it.
            seconds.retain(|_, s| s.second >= second);
            if seconds.len() >= KEYS_TRACKED {
                crate::metrics::record_audit_suppressed();
                return None;
            }
        }
        let entry = seconds.entry(key_id.clone()).or_default();
        if entry.second != second {
            entry.second = second;
            entry.kept = 0;
        }
        if entry.kept >= self.per_second {
            entry.suppressed += 1;
            crate::metrics::record_audit_suppressed();
            return None;
        }
        entry.kept += 1;
        Some(std::mem::take(&mut entry.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_records_per_key_and_second_are_kept_and_the_rest_counted() {
        let limit = RefusedAudit::new(3);
        let (a, b): (Arc<str>, Arc<str>) = ("key_a".into(), "key_b".into());
        let kept: Vec<Option<u64>> = (0..10).map(|i| limit.admit(&a, 5_000 + i)).collect();
        assert_eq!(&kept[..3], [Some(0), Some(0), Some(0)]);
        assert!(kept[3..].iter().all(Option::is_none));
        // Another key has its own.
        assert_eq!(limit.admit(&b, 5_500), Some(0));
        // The next second's first record tells how many were left out.
        assert_eq!(limit.admit(&a, 6_000), Some(7));
        assert_eq!(limit.admit(&a, 6_001), Some(0));
    }

    #[test]
    fn the_map_stays_bounded_under_many_keys() {
        let limit = RefusedAudit::new(1);
        for i in 0..KEYS_TRACKED + 10 {
            let key: Arc<str> = format!("key_{i}").into();
            limit.admit(&key, (i as u64) * 1000);
        }
        assert!(limit.seconds.lock().unwrap().len() <= KEYS_TRACKED);
    }
}
