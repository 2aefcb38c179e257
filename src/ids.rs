//! Identifiers (`req_…`, `key_…`, `ws_…`) and the wall clock.

use rand::Rng;

/// Random characters after an id's prefix (≈119 bits: unique without coordination).
const ID_RANDOM_LEN: usize = 20;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A new random id such as `key_3fJ9…`.
///
/// Every request gets one, so it is cut from two random words, ten characters from each
/// (62^10 < 2^64), instead of drawing the characters one by one: a fifth of the instructions.
/// The last characters of each ten are very slightly uneven, which costs an id nothing.
pub fn new_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 1 + ID_RANDOM_LEN);
    id.push_str(prefix);
    id.push('_');
    let mut rng = rand::rng();
    for _ in 0..ID_RANDOM_LEN / 10 {
        let mut word: u64 = rng.random();
        for _ in 0..10 {
            id.push(BASE62[(word % 62) as usize] as char);
            word /= 62;
        }
    }
    id
}

/// A new request id, `req_…`.
pub fn request_id() -> String {
    new_id("req")
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
    fn ids_have_prefix_and_are_unique() {
        let a = new_id("key");
        assert!(a.starts_with("key_"));
        assert_eq!(a.len(), 4 + ID_RANDOM_LEN);
        assert_ne!(a, new_id("key"));
        assert!(request_id().starts_with("req_"));
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
