//! The unknown-key limit: how many keys that do not exist one client may present per minute.
//!
//! A well-formed key that is not cached costs a store read. Keys that exist are cached after
//! that one read, and an unknown key is remembered as unknown for a while; but a client that
//! makes up a new well-formed key for every request would make every request a store read. So
//! each client address (an IPv6 address by its /64, which one host usually holds whole) may
//! present `per_minute` keys the store does not know, per replica and minute; past that, its
//! requests with keys that are not cached are refused (429) without asking the store, until
//! the minute ends. Cached keys are never held up: a client behind the same address with a
//! valid key goes on as before, and the request path of a cached key never reaches this.

use dashmap::DashMap;
use std::net::IpAddr;

/// Most addresses tracked; past it, those of earlier minutes are forgotten (and, if that is not
/// enough, all: a flood from that many addresses is not held back by one replica's memory).
const TRACKED: usize = 100_000;

/// Counts of unknown keys per client address and minute.
pub struct UnknownKeyLimit {
    per_minute: u32,
    counts: DashMap<IpAddr, (u64, u32), foldhash::fast::RandomState>,
}

impl UnknownKeyLimit {
    /// At most `per_minute` unknown keys per client address and minute.
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            counts: DashMap::default(),
        }
    }

    /// Whether `client` has presented its share of unknown keys this minute (`now`: unix
    /// seconds); if so, the seconds until the next minute.
    pub fn exhausted(&self, client: Option<IpAddr>, now: u64) -> Option<u64> {
        let client = client.map(group)?;
        let minute = now / 60;
        match self.counts.get(&client) {
            Some(count) if count.0 == minute && count.1 >= self.per_minute => Some(60 - now % 60),
            _ => None,
        }
    }

    /// `client` presented a key the store does not know.
    pub fn charge(&self, client: Option<IpAddr>, now: u64) {
        let Some(client) = client.map(group) else {
            return;
        };
        let minute = now / 60;
        if self.counts.len() >= TRACKED {
            self.counts.retain(|_, (m, _)| *m == minute);
            if self.counts.len() >= TRACKED / 2 {
                self.counts.clear();
            }
        }
        let mut count = self.counts.entry(client).or_insert((minute, 0));
        if count.0 != minute {
            *count = (minute, 0);
        }
        count.1 = count.1.saturating_add(1);
    }
}

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
        for _ in 0..3 {
            assert_eq!(limit.exhausted(ip("192.0.2.1"), now), None);
            limit.charge(ip("192.0.2.1"), now);
        }
        assert_eq!(limit.exhausted(ip("192.0.2.1"), now), Some(45));
        assert_eq!(limit.exhausted(ip("192.0.2.2"), now), None);
        // The next minute starts afresh.
        assert_eq!(limit.exhausted(ip("192.0.2.1"), now + 45), None);
        limit.charge(ip("192.0.2.1"), now + 45);
        assert_eq!(limit.exhausted(ip("192.0.2.1"), now + 45), None);
        // No address (a Unix socket): not counted, never held up.
        limit.charge(None, now);
        assert_eq!(limit.exhausted(None, now), None);
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64_and_a_mapped_ipv4_as_ipv4() {
        let limit = UnknownKeyLimit::new(1);
        let now = 1_800_000_000;
        limit.charge(ip("2001:db8:1:2::1"), now);
        assert!(limit.exhausted(ip("2001:db8:1:2:ffff::9"), now).is_some());
        assert!(limit.exhausted(ip("2001:db8:1:3::1"), now).is_none());
        limit.charge(ip("::ffff:192.0.2.7"), now);
        assert!(limit.exhausted(ip("192.0.2.7"), now).is_some());
    }

    #[test]
    fn the_table_stays_bounded() {
        let limit = UnknownKeyLimit::new(1);
        for i in 0..(TRACKED as u32 + 10) {
            limit.charge(Some(IpAddr::V4(i.into())), 1_800_000_000);
        }
        assert!(limit.counts.len() <= TRACKED);
    }
}
