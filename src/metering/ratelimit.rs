//! Rate limits: per key, shared across replicas, with no Redis round trip per request.
//!
//! Two checks, both from memory:
//! - a local GCRA (generic cell rate algorithm) per key smooths bursts on this replica:
//!   at most `burst` requests at once, refilled at `requests_per_minute`;
//! - a sliding one-minute window over the counts of every replica, which the usage flusher
//!   exchanges with Redis in batches, caps the total across replicas at `requests_per_minute`.
//!
//! Across replicas a key can exceed its limit by at most what the other replicas admitted in
//! one flush interval.

use dashmap::DashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::MAX_FLUSH_ENTRIES;

/// A per-minute limit with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Sustained rate.
    pub requests_per_minute: u32,
    /// Requests allowed at once.
    pub burst: u32,
}

/// GCRA state: the theoretical arrival time of the next request, in microseconds (so rates
/// above one request per millisecond keep their precision).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gcra {
    tat_us: u64,
}

impl Gcra {
    /// Admits a request at `now_ms` or says how many milliseconds until one would be admitted.
    pub fn admit(&mut self, limit: Limit, now_ms: u64) -> Result<(), u64> {
        if limit.requests_per_minute == 0 {
            return Err(60_000);
        }
        let now = now_ms.saturating_mul(1000);
        let interval = (60_000_000 / u64::from(limit.requests_per_minute)).max(1);
        let tolerance = interval.saturating_mul(u64::from(limit.burst.max(1) - 1));
        let tat = self.tat_us.max(now);
        if tat > now.saturating_add(tolerance) {
            return Err((tat - now - tolerance).div_ceil(1000));
        }
        self.tat_us = tat + interval;
        Ok(())
    }
}

/// The sliding-window estimate of requests in the last minute: all of the current window plus
/// the part of the previous window that still overlaps the last 60 seconds.
pub fn sliding_count(previous: u64, current: u64, ms_into_window: u64) -> u64 {
    let overlap = 60_000u64.saturating_sub(ms_into_window.min(60_000));
    // Rounded up: a limit is never under-counted.
    current + (previous * overlap).div_ceil(60_000)
}

/// Milliseconds from `ms_into_window` until [`sliding_count`] falls below `max`, if nothing more
/// is admitted: the previous minute's weight shrinks as the window slides, so a refused client
/// may be admitted well before the minute ends.
pub fn sliding_wait_ms(previous: u64, current: u64, ms_into_window: u64, max: u64) -> u64 {
    let left = 60_000u64.saturating_sub(ms_into_window);
    // The largest overlap with `previous` at which `count` requests leave room for one more:
    // `count + ceil(p * overlap / 60_000) < max`.
    let overlap_for = |p: u64, count: u64| match p {
        0 => 60_000,
        p => (max.saturating_sub(count + 1) * 60_000 / p).min(60_000),
    };
    if current < max {
        left.saturating_sub(overlap_for(previous, current))
    } else {
        // This minute is full: into the next one, where it is the previous minute.
        left + 60_000 - overlap_for(current, 0)
    }
}

/// What the last flush learned about one key's requests across all replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// The minute window (`unix / 60`) these counts are for.
    pub window: u64,
    /// Requests in the previous window.
    pub previous: u64,
    /// Requests in this window, as of the flush.
    pub current: u64,
}

#[derive(Debug, Default)]
struct KeyState {
    gcra: Gcra,
    /// Counts from the store at the last flush.
    global: WindowCounts,
    /// Requests admitted here since the last flush, for `window`.
    local_window: u64,
    local: u64,
    /// Requests admitted here in the minute before `local_window`, since the last flush: the
    /// minute turned between a flush and the next.
    carried_window: u64,
    carried: u64,
}

/// A rate decision with what the `RateLimit-*` headers report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Admitted or not.
    pub allowed: bool,
    /// The limit (`RateLimit-Limit`).
    pub limit: u32,
    /// Requests left in the window (`RateLimit-Remaining`).
    pub remaining: u32,
    /// Seconds until a request would be admitted / the window frees up (`Retry-After`,
    /// `RateLimit-Reset`).
    pub reset_secs: u64,
}

/// Requests admitted here, per key and minute window, sent to the store as one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateBatch {
    /// The same each time the batch is sent: the store adds a batch once.
    pub id: String,
    /// `(key id, window, requests)`.
    pub counts: Vec<(Arc<str>, u64, u64)>,
}

/// Per-key rate state of this replica.
#[derive(Default)]
pub struct RateLimiter {
    /// Looked up on every request by key id: a fast seeded hash, not SipHash.
    keys: DashMap<Arc<str>, KeyState, foldhash::fast::RandomState>,
    /// The batch whose flush failed, to go again as it was.
    unsent: Mutex<Option<RateBatch>>,
    /// Whether the last batch taken left counts behind.
    deferred: AtomicBool,
}

impl RateLimiter {
    /// A limiter with no state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides one request of `key` at `now_ms` (unix milliseconds).
    pub fn check(&self, key: &str, limit: Limit, now_ms: u64) -> Decision {
        self.check_shared(key, || Arc::from(key), limit, now_ms)
    }

    /// [`Self::check`], with the key's id as the caller already holds it, shared into the
    /// limiter's map on the key's first request instead of copied.
    pub fn check_shared(
        &self,
        key: &str,
        shared: impl FnOnce() -> Arc<str>,
        limit: Limit,
        now_ms: u64,
    ) -> Decision {
        let window = now_ms / 60_000;
        let into = now_ms % 60_000;
        // Look up by `&str` first: the map's key is stored only on a key's first request.
        let mut state = match self.keys.get_mut(key) {
            Some(state) => state,
            None => self.keys.entry(shared()).or_default(),
        };
        if state.local_window != window {
            // A new minute: what was admitted here in the old one since the last flush still
            // goes to the store for it, and counts here as that minute's. Counts carried from
            // a minute before it (kept while flushes failed) count for nothing any more: the
            // window looks one minute back. Added to them, they would all land in one minute.
            if state.global.window == state.local_window {
                state.global.current += state.local;
            }
            state.carried = state.local;
            state.carried_window = state.local_window;
            state.local_window = window;
            state.local = 0;
        }
        let (previous, current) = if state.global.window == window {
            (state.global.previous, state.global.current)
        } else if state.global.window + 1 == window {
            (state.global.current, 0)
        } else {
            (0, 0)
        };
        let used = sliding_count(previous, current + state.local, into);
        let max = u64::from(limit.requests_per_minute);
        if used >= max {
            let wait_ms = sliding_wait_ms(previous, current + state.local, into, max);
            return Decision {
                allowed: false,
                limit: limit.requests_per_minute,
                remaining: 0,
                reset_secs: wait_ms.div_ceil(1000).max(1),
            };
        }
        if let Err(wait_ms) = state.gcra.admit(limit, now_ms) {
            // Refused for the burst: nothing may be sent until it refills, whatever the minute
            // has left.
            return Decision {
                allowed: false,
                limit: limit.requests_per_minute,
                remaining: 0,
                reset_secs: wait_ms.div_ceil(1000).max(1),
            };
        }
        state.local += 1;
        Decision {
            allowed: true,
            limit: limit.requests_per_minute,
            remaining: (max - used - 1) as u32,
            reset_secs: (60_000 - into).div_ceil(1000),
        }
    }

    /// Takes the requests admitted since the last call, per key and window, for `max` keys
    /// at most (the rest stay for the next call, and [`Self::deferred`] says so). What is
    /// taken counts here as known to the store from then on.
    fn take_counts(&self, max: usize) -> Vec<(Arc<str>, u64, u64)> {
        let mut out = Vec::new();
        let mut keys = 0;
        let mut deferred = false;
        for mut entry in self.keys.iter_mut() {
            if entry.carried == 0 && entry.local == 0 {
                continue;
            }
            if keys == max {
                deferred = true;
                break;
            }
            keys += 1;
            if entry.carried > 0 {
                out.push((entry.key().clone(), entry.carried_window, entry.carried));
                entry.carried = 0;
            }
            if entry.local > 0 {
                out.push((entry.key().clone(), entry.local_window, entry.local));
                // What was taken now counts as global once the flush lands.
                let taken = entry.local;
                let window = entry.local_window;
                if entry.global.window == window {
                    entry.global.current += taken;
                }
                entry.local = 0;
            }
        }
        self.deferred.store(deferred, Ordering::Relaxed);
        out
    }

    /// Whether the last batch taken left counts behind for the next.
    pub fn deferred(&self) -> bool {
        self.deferred.load(Ordering::Relaxed)
    }

    /// The counts for the next flush. A batch whose flush failed goes again as it was, under
    /// its id: its answer may have been lost after the store added it, and then nothing more
    /// sent under that id would be added; what was admitted meanwhile waits for the batch
    /// after. Otherwise, the requests admitted since the last batch, under a new id.
    pub fn next_batch(&self) -> RateBatch {
        if let Some(batch) = self.unsent().take() {
            return batch;
        }
        RateBatch {
            id: crate::ids::new_id("rate"),
            counts: self.take_counts(MAX_FLUSH_ENTRIES),
        }
    }

    /// The flush of `batch` failed: it goes again, as it is, with the next one.
    pub fn not_sent(&self, batch: RateBatch) {
        *self.unsent() = Some(batch);
    }

    fn unsent(&self) -> std::sync::MutexGuard<'_, Option<RateBatch>> {
        self.unsent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records what the store says about a key's windows after a flush.
    pub fn set_global(&self, key: &str, counts: WindowCounts) {
        if let Some(mut state) = self.keys.get_mut(key) {
            if counts.window >= state.global.window {
                state.global = counts;
            }
        }
    }

    /// Up to `take` of the keys that have a state, except those `skip` names, for a flush to
    /// refresh: round robin, from the `from`-th key (modulo their number) on, wrapping around
    /// once. Also returns how many keys it went past, where the next call goes on from.
    ///
    /// Nothing is collected beyond what is taken: a flush runs five times a second, and copying
    /// every key's id into a list (1.6 MB with 100,000 keys) to take 1,000 of them would cost
    /// more than the flush.
    pub fn keys_round_robin(
        &self,
        from: usize,
        take: usize,
        skip: impl Fn(&str) -> bool,
    ) -> (Vec<Arc<str>>, usize) {
        let n = self.keys.len();
        if n == 0 || take == 0 {
            return (Vec::new(), 0);
        }
        let start = from % n;
        let mut taken = Vec::with_capacity(take.min(n));
        let mut passed = 0;
        for entry in self
            .keys
            .iter()
            .skip(start)
            .chain(self.keys.iter().take(start))
        {
            if taken.len() == take {
                break;
            }
            passed += 1;
            if !skip(entry.key()) {
                taken.push(entry.key().clone());
            }
        }
        (taken, passed)
    }

    /// Drops keys idle since before `window - 1`.
    pub fn forget_idle(&self, window: u64) {
        self.keys
            .retain(|_, s| s.local_window + 1 >= window || s.local > 0 || s.carried > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Limit = Limit {
        requests_per_minute: 60,
        burst: 3,
    };

    #[test]
    fn gcra_allows_a_burst_then_the_rate() {
        let mut g = Gcra::default();
        let t = 1_000_000;
        for _ in 0..3 {
            assert!(g.admit(LIMIT, t).is_ok());
        }
        let wait = g.admit(LIMIT, t).unwrap_err();
        assert_eq!(wait, 1000);
        assert!(g.admit(LIMIT, t + 999).is_err());
        assert!(g.admit(LIMIT, t + 1000).is_ok());
    }

    #[test]
    fn sliding_window_weights_the_previous_minute() {
        assert_eq!(sliding_count(60, 0, 0), 60);
        assert_eq!(sliding_count(60, 10, 30_000), 40);
        assert_eq!(sliding_count(60, 10, 60_000), 10);
        assert_eq!(sliding_count(3, 0, 100), 3, "rounded up");
    }

    #[test]
    fn the_window_counts_every_replica() {
        let limiter = RateLimiter::new();
        let key: Arc<str> = "key_1".into();
        let limit = Limit {
            requests_per_minute: 10,
            burst: 100,
        };
        let now = 60_000 * 1000;
        for _ in 0..4 {
            assert!(limiter.check("key_1", limit, now).allowed);
        }
        // Another replica has used 6 this minute: the limit is reached.
        limiter.set_global(
            "key_1",
            WindowCounts {
                window: 1000,
                previous: 0,
                current: 6,
            },
        );
        let d = limiter.check("key_1", limit, now + 10);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert!(d.reset_secs >= 1);
        // A batch takes the counts.
        let batch = limiter.next_batch();
        assert_eq!(batch.counts, vec![(key.clone(), 1000, 4)]);
        // Its flush failed: the limit here still counts each request once, and the batch goes
        // again as it was, under its id, whatever was admitted meanwhile.
        limiter.not_sent(batch.clone());
        assert!(!limiter.check("key_1", limit, now + 20).allowed);
        // (The store, once back, says this minute holds only these 4.)
        limiter.set_global(
            "key_1",
            WindowCounts {
                window: 1000,
                previous: 0,
                current: 4,
            },
        );
        assert!(limiter.check("key_1", limit, now + 30).allowed);
        assert_eq!(limiter.next_batch(), batch);
        // The batch after it: a new id, with what was admitted meanwhile.
        let next = limiter.next_batch();
        assert_ne!(next.id, batch.id);
        assert_eq!(next.counts, vec![(key.clone(), 1000, 1)]);
        assert!(limiter.next_batch().counts.is_empty());
    }

    #[test]
    fn retry_after_is_when_the_sliding_count_admits_again() {
        // 30 last minute, none yet in this one, 10 s in: ceil(30 * 50/60) = 25 of 20 used.
        let (limiter, limit) = (
            RateLimiter::new(),
            Limit {
                requests_per_minute: 20,
                burst: 100,
            },
        );
        let minute = 1000;
        let start = minute * 60_000;
        assert!(limiter.check("k", limit, start - 1).allowed);
        limiter.take_counts(usize::MAX);
        limiter.set_global(
            "k",
            WindowCounts {
                window: minute,
                previous: 30,
                current: 0,
            },
        );
        let refused = limiter.check("k", limit, start + 10_000);
        assert!(!refused.allowed);
        // At 22 s the previous minute weighs ceil(30 * 38/60) = 19: room for one.
        assert_eq!(refused.reset_secs, 12);
        assert!(!limiter.check("k", limit, start + 21_999).allowed);
        assert!(limiter.check("k", limit, start + 22_000).allowed);
    }

    #[test]
    fn a_full_minute_waits_into_the_next() {
        assert_eq!(sliding_wait_ms(0, 20, 50_000, 20), 10_000 + 3_000);
        assert_eq!(sliding_count(20, 0, 3_000), 19);
        assert_eq!(sliding_count(20, 0, 2_999), 20);
        assert_eq!(sliding_wait_ms(0, 20, 50_000, 1), 10_000 + 60_000);
    }

    #[test]
    fn a_burst_refusal_says_nothing_is_left_for_now() {
        let limiter = RateLimiter::new();
        let limit = Limit {
            requests_per_minute: 60,
            burst: 2,
        };
        let t = 60_000 * 7;
        assert!(limiter.check("k", limit, t).allowed);
        assert!(limiter.check("k", limit, t).allowed);
        let refused = limiter.check("k", limit, t);
        assert!(!refused.allowed);
        assert_eq!((refused.remaining, refused.reset_secs), (0, 1));
    }

    #[test]
    fn a_new_minute_starts_fresh() {
        let limiter = RateLimiter::new();
        let limit = Limit {
            requests_per_minute: 2,
            burst: 2,
        };
        let t = 60_000 * 5;
        assert!(limiter.check("k", limit, t).allowed);
        assert!(limiter.check("k", limit, t + 1).allowed);
        assert!(!limiter.check("k", limit, t + 2).allowed);
        // Two minutes later nothing of it remains.
        assert!(limiter.check("k", limit, t + 120_000).allowed);
    }

    #[test]
    fn what_a_minute_admitted_before_it_turned_is_still_flushed_and_counted() {
        let limiter = RateLimiter::new();
        let key: Arc<str> = "k".into();
        let limit = Limit {
            requests_per_minute: 4,
            burst: 10,
        };
        let minute = 1000;
        let t = minute * 60_000;
        limiter.check("k", limit, t - 60_000);
        limiter.take_counts(usize::MAX);
        limiter.set_global(
            "k",
            WindowCounts {
                window: minute - 1,
                previous: 0,
                current: 1,
            },
        );
        // Three more in the last moments of the minute, then it turns before the next flush.
        for _ in 0..3 {
            assert!(limiter.check("k", limit, t - 1).allowed);
        }
        // At the start of the next minute the previous one weighs all four: no room.
        assert!(!limiter.check("k", limit, t).allowed);
        assert!(limiter.check("k", limit, t + 15_000).allowed);
        assert_eq!(
            limiter.take_counts(usize::MAX),
            vec![(key.clone(), minute - 1, 3), (key.clone(), minute, 1)]
        );
        assert!(limiter.take_counts(usize::MAX).is_empty());
    }

    #[test]
    fn minutes_admitted_while_flushes_fail_are_not_piled_into_one() {
        // Redis is away for minutes: no batch takes the counts. Each minute's count stays that
        // minute's, and only the minute before this one is still sent.
        let limiter = RateLimiter::new();
        let key: Arc<str> = "k".into();
        let limit = Limit {
            requests_per_minute: 100,
            burst: 100,
        };
        let minute = 1000;
        for (m, requests) in [(0, 5), (1, 7), (2, 11), (3, 2)] {
            for _ in 0..requests {
                assert!(limiter.check("k", limit, (minute + m) * 60_000).allowed);
            }
        }
        assert_eq!(
            limiter.take_counts(usize::MAX),
            vec![(key.clone(), minute + 2, 11), (key, minute + 3, 2)]
        );
    }

    #[test]
    fn a_batch_takes_a_bounded_share_of_the_keys_and_the_rest_follows() {
        let limiter = RateLimiter::new();
        let keys = 2 * MAX_FLUSH_ENTRIES + 5;
        for i in 0..keys {
            assert!(limiter.check(&format!("key_{i}"), LIMIT, 1_000).allowed);
        }
        let mut seen = std::collections::HashSet::new();
        for (expected, deferred) in [
            (MAX_FLUSH_ENTRIES, true),
            (MAX_FLUSH_ENTRIES, true),
            (5, false),
        ] {
            let batch = limiter.next_batch();
            assert_eq!(batch.counts.len(), expected);
            assert_eq!(limiter.deferred(), deferred);
            for (key, window, count) in batch.counts {
                assert_eq!((window, count), (0, 1));
                assert!(seen.insert(key), "a key's count goes once");
            }
        }
        assert_eq!(seen.len(), keys);
        assert!(limiter.next_batch().counts.is_empty());
    }
}
