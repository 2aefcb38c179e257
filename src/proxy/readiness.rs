//! The gateway port's `/readyz`: whether the store answers, asked at most once a second.
//!
//! The probe is public (it is on the port clients call, before any key): a check per request
//! would let anyone send the shared Redis one command per request, which the unknown-key limit
//! exists to prevent. Probes inside the second get the last answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::store::StoreHealth;

/// How long an answer of the store is reused.
const FRESH_MS: u64 = 1_000;

/// The last answer of the store to a readiness probe.
#[derive(Debug, Default)]
pub struct StoreCheck {
    /// Unix milliseconds of the last check begun (0: never).
    checked_ms: AtomicU64,
    answered: AtomicBool,
}

impl StoreCheck {
    /// Whether the store answers, as of at most [`FRESH_MS`] ago at `now_ms`. One probe at a
    /// time asks the store; the others meanwhile take the last answer.
    pub async fn store_answers(&self, store: &dyn StoreHealth, now_ms: u64) -> bool {
        let checked = self.checked_ms.load(Ordering::Acquire);
        let stale = checked == 0 || now_ms.saturating_sub(checked) >= FRESH_MS;
        if !stale
            || self
                .checked_ms
                .compare_exchange(checked, now_ms.max(1), Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            // Another probe is asking (the very first one included: not ready until it has
            // an answer).
            return self.answered.load(Ordering::Acquire);
        }
        let answered = store.ping().await.is_ok();
        self.answered.store(answered, Ordering::Release);
        answered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[tokio::test]
    async fn the_store_is_asked_at_most_once_a_second() {
        let store = MemoryStore::new();
        let check = StoreCheck::default();
        assert!(check.store_answers(&store, 10_000).await);
        // Within the second: the answer is reused, whatever the store says now.
        check.answered.store(false, Ordering::Release);
        assert!(!check.store_answers(&store, 10_999).await, "reused");
        // After it: asked again.
        assert!(check.store_answers(&store, 11_000).await, "asked again");
    }
}
