//! Identifiers (`req_…`, `key_…`, `ws_…`) and the wall clock.

use rand::distr::{Alphanumeric, SampleString};

/// Random characters after an id's prefix (≈119 bits: unique without coordination).
const ID_RANDOM_LEN: usize = 20;

/// A new random id such as `key_3fJ9…`.
pub fn new_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 1 + ID_RANDOM_LEN);
    id.push_str(prefix);
    id.push('_');
    Alphanumeric.append_string(&mut rand::rng(), &mut id, ID_RANDOM_LEN);
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
}
