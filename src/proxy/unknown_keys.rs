//! The unknown-key limit: how many keys that do not exist one client may present per minute.
//!
//! A well-formed key that is not cached costs a store read. Keys that exist are cached after
//! that one read, and an unknown key is remembered as unknown for a while; but a client that
//! makes up a new well-formed key for every request would make every request a store read. So
//! each client address (an IPv6 address by its /64, which one host usually holds whole) may
//! present `per_minute` keys the store does not know, per replica and minute; past that, its
//! requests with keys that are not cached are refused (429) without asking the store, until
//! the minute ends. Cached keys are never held up, and the request path of a cached key never
//! reaches this. A read is reserved before it is made and given back if the key exists, so
//! requests sent together cannot pass the count between them.
//!
//! Only an address that is one client's is counted
//! ([`TrustedProxies::client_to_limit`](super::client_ip::TrustedProxies::client_to_limit)):
//! an ingress speaking for many is not refused on behalf of one of them.

use dashmap::DashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};

/// Most addresses tracked. When that many have presented unknown keys this minute, new ones
/// are not tracked (nor held up) until it ends: the counts of those already held up are kept.
const TRACKED: usize = 100_000;

/// Counts of unknown keys per client address and minute.
pub struct UnknownKeyLimit {
    per_minute: u32,
    counts: DashMap<IpAddr, (u64, u32), foldhash::fast::RandomState>,
    /// Set while one request sweeps out the counts of earlier minutes.
    sweeping: AtomicBool,
}

impl UnknownKeyLimit {
    /// At most `per_minute` unknown keys per client address and minute.
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            counts: DashMap::default(),
            sweeping: AtomicBool::new(false),
        }
    }

    /// Reserves one store read for `client` at unix second `now`: the reservation, to give
    /// back if the key exists; or, if it has presented its share of unknown keys this minute,
    /// the seconds until the minute ends.
    pub fn reserve(&self, client: Option<IpAddr>, now: u64) -> Result<Reservation, u64> {
        let Some(client) = client.map(group) else {
            return Ok(Reservation(None));
        };
        let minute = now / 60;
        if self.counts.len() >= TRACKED && !self.counts.contains_key(&client) {
            self.sweep(minute);
            if self.counts.len() >= TRACKED {
                return Ok(Reservation(None));
            }
        }
        let mut count = self.counts.entry(client).or_insert((minute, 0));
        // A request that read the clock just before another started the next minute counts
        // in the newer one, rather than take the count back a minute.
        if count.0 < minute {
            *count = (minute, 0);
        }
        if count.1 >= self.per_minute {
            return Err((count.0 + 1) * 60 - now);
        }
        count.1 += 1;
        Ok(Reservation(Some((client, count.0))))
    }

    /// The key a reservation was made for exists: the read is given back.
    pub fn give_back(&self, reservation: Reservation) {
        let Some((client, minute)) = reservation.0 else {
            return;
        };
        if let Some(mut count) = self.counts.get_mut(&client) {
            if count.0 == minute {
                count.1 = count.1.saturating_sub(1);
            }
        }
    }

    /// Drops the counts of earlier minutes; one request at a time does it.
    fn sweep(&self, minute: u64) {
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        self.counts.retain(|_, (m, _)| *m == minute);
        self.sweeping.store(false, Ordering::Release);
    }
}

/// A store read reserved for a client, in the minute it was counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "give it back if the key exists"]
pub struct Reservation(Option<(IpAddr, u64)>);

/// The address a client is counted by: an IPv6 address by its /64.
fn group(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn a_client_gets_its_share_per_minute_and_others_theirs() {
        let limit = UnknownKeyLimit::new(3);
        let now = 1_800_000_015; // 15 s into a minute
        let mut first = None;
        for _ in 0..3 {
            first = first.or(limit.reserve(ip("192.0.2.1"), now).ok());
        }
        assert_eq!(limit.reserve(ip("192.0.2.1"), now), Err(45));
        assert!(limit.reserve(ip("192.0.2.2"), now).is_ok());
        // A key that existed gives its read back.
        limit.give_back(first.unwrap());
        assert!(limit.reserve(ip("192.0.2.1"), now).is_ok());
        assert_eq!(limit.reserve(ip("192.0.2.1"), now), Err(45));
        // The next minute starts afresh, and a late request of the minute before counts in
        // it, gives back in it, and waits for its end.
        assert!(limit.reserve(ip("192.0.2.1"), now + 45).is_ok());
        let late = limit.reserve(ip("192.0.2.1"), now + 44).unwrap();
        assert!(limit.reserve(ip("192.0.2.1"), now + 45).is_ok());
        assert_eq!(limit.reserve(ip("192.0.2.1"), now + 45), Err(60));
        limit.give_back(late);
        assert!(limit.reserve(ip("192.0.2.1"), now + 45).is_ok());
        assert_eq!(limit.reserve(ip("192.0.2.1"), now + 44), Err(61));
        // No address (a Unix socket, or an ingress's): never held up.
        for _ in 0..5 {
            assert!(limit.reserve(None, now).is_ok());
        }
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64_and_a_mapped_ipv4_as_ipv4() {
        let limit = UnknownKeyLimit::new(1);
        let now = 1_800_000_000;
        let _ = limit.reserve(ip("2001:db8:1:2::1"), now).unwrap();
        assert!(limit.reserve(ip("2001:db8:1:2:ffff::9"), now).is_err());
        assert!(limit.reserve(ip("2001:db8:1:3::1"), now).is_ok());
        let _ = limit.reserve(ip("::ffff:192.0.2.7"), now).unwrap();
        assert!(limit.reserve(ip("192.0.2.7"), now).is_err());
    }

    #[test]
    fn a_full_table_keeps_the_counts_it_has() {
        let limit = UnknownKeyLimit::new(1);
        let now = 1_800_000_000;
        let _ = limit.reserve(ip("192.0.2.1"), now).unwrap();
        for i in 0..(TRACKED as u32 + 10) {
            let _ = limit.reserve(Some(IpAddr::V4((0x0a00_0000 + i).into())), now);
        }
        assert!(limit.counts.len() <= TRACKED);
        assert!(limit.reserve(ip("192.0.2.1"), now).is_err(), "not reset");
        // A minute later the old counts are swept out for new addresses.
        assert!(limit.reserve(ip("198.51.100.1"), now + 60).is_ok());
        assert!(limit.counts.len() <= 2);
    }
}
