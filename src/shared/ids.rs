//! Identifiers (`req_…`, `key_…`, `ws_…`) and the wall clock.

use compact_str::CompactString;
use rand::Rng;

/// Random characters after an id's prefix (≈119 bits: unique without coordination).
const ID_RANDOM_LEN: usize = 20;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A new random id such as `key_3fJ9…`.
pub fn new_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 1 + ID_RANDOM_LEN);
    id.push_str(prefix);
    id.push('_');
    id.push_str(random_chars(&mut [0; ID_RANDOM_LEN]));
    id
}

/// An id such as `dlv_3fJ9…` that is the same whenever it is made from the same `parts`: for
/// records that must be created once however often the step creating them runs.
pub fn derived_id(prefix: &str, parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for part in parts {
        // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut id = String::with_capacity(prefix.len() + 1 + ID_RANDOM_LEN);
    id.push_str(prefix);
    id.push('_');
    // Ten characters from each 64-bit word of the digest, as `random_chars` does.
    for word in digest.chunks_exact(8).take(ID_RANDOM_LEN / 10) {
        let mut word = u64::from_le_bytes(word.try_into().unwrap_or_default());
        for _ in 0..10 {
            id.push(BASE62[(word % 62) as usize] as char);
            word /= 62;
        }
    }
    id
}

/// A request id: `req_` and 20 characters, 24 bytes, which a [`CompactString`] holds without
/// a heap allocation. The id goes with the audit record to the store thread, so a `String`
/// would be allocated on one thread and freed on another for every request.
pub type RequestId = CompactString;

/// A new request id, `req_…`.
pub fn request_id() -> RequestId {
    let mut id = [0; 4 + ID_RANDOM_LEN];
    id[..4].copy_from_slice(b"req_");
    random_chars(&mut id[4..]);
    CompactString::from_utf8(id).unwrap_or_default()
}

/// Fills `buf` with random base-62 characters.
///
/// Every request gets an id, so the characters are cut from random words, ten from each
/// (62^10 < 2^64), instead of drawn one by one: a fifth of the instructions. The last
/// characters of each ten are very slightly uneven, which costs an id nothing.
fn random_chars(buf: &mut [u8]) -> &str {
    let mut rng = rand::rng();
    for chunk in buf.chunks_mut(10) {
        let mut word: u64 = rng.random();
        for c in chunk {
            *c = BASE62[(word % 62) as usize];
            word /= 62;
        }
    }
    // Base-62 characters are ASCII.
    std::str::from_utf8(buf).unwrap_or_default()
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_depend_on_every_part_and_nothing_else() {
        let a = derived_id("dlv", &["evt_1", "we_1"]);
        assert!(a.starts_with("dlv_"));
        assert_eq!(a.len(), 4 + ID_RANDOM_LEN);
        assert!(a[4..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_eq!(a, derived_id("dlv", &["evt_1", "we_1"]));
        assert_ne!(a, derived_id("dlv", &["evt_1", "we_2"]));
        assert_ne!(a, derived_id("dlv", &["evt_2", "we_1"]));
        assert_ne!(
            derived_id("dlv", &["ab", "c"]),
            derived_id("dlv", &["a", "bc"])
        );
    }

    #[test]
    fn ids_have_prefix_and_are_unique() {
        let a = new_id("key");
        assert!(a.starts_with("key_"));
        assert_eq!(a.len(), 4 + ID_RANDOM_LEN);
        assert_ne!(a, new_id("key"));
        let request = request_id();
        assert!(request.starts_with("req_"));
        assert_eq!(request.len(), 4 + ID_RANDOM_LEN);
        // Held inline: a request id costs no allocation.
        assert!(!request.is_heap_allocated());
    }

    #[test]
    fn id_characters_are_alphanumeric_and_spread() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let id = new_id("req");
            let random = &id[4..];
            assert!(random.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
            seen.extend(random.bytes());
        }
        // 4,000 characters drawn from 62: every one of them turns up.
        assert_eq!(seen.len(), 62);
    }
}
