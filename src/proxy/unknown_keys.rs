//! The unknown-key limit: how many keys that do not exist clients may present per minute.
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
//!
//! All clients together, those without an address of their own included, may present
//! `total_per_minute` unknown keys per replica and minute: made-up keys sent from many
//! addresses, or through an ingress, cost the store at most that many reads. Past it, every
//! key that is not cached is refused until the minute ends, a real one new to this replica
//! too: the price of keeping a flood off the store, paid only while one lasts.

use dashmap::DashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most addresses tracked. When that many have presented unknown keys this minute, new ones
/// are not tracked (nor held up) until it ends: the counts of those already held up are kept.
const TRACKED: usize = 100_000;

/// Counts of unknown keys per client address and minute, and of all clients' together.
pub struct UnknownKeyLimit {
    per_minute: u32,
    counts: DashMap<IpAddr, (u64, u32), foldhash::fast::RandomState>,
    /// Set while one request sweeps out the counts of earlier minutes.
    sweeping: AtomicBool,
    total_per_minute: u32,
    /// All clients' count: its minute in the high 32 bits, the count in the low 32.
    total: AtomicU64,
}

/// Which limit refused a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitReached {
    /// The client's address has presented its share this minute.
    Client,
    /// All clients together have presented this replica's share this minute.
    AllClients,
}

/// A key refused a store read: by which limit, and for how many seconds (until its minute ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The limit reached.
    pub reached: LimitReached,
    /// Seconds until the minute ends.
    pub retry_after_secs: u64,
}

impl UnknownKeyLimit {
    /// At most `per_minute` unknown keys per client address and minute, and
    /// `total_per_minute` of all clients together.
    pub fn new(per_minute: u32, total_per_minute: u32) -> Self {
        Self {
            per_minute,
            counts: DashMap::default(),
            sweeping: AtomicBool::new(false),
            total_per_minute,
            total: AtomicU64::new(0),
        }
    }

    /// Reserves one store read for `client` at unix second `now`: the reservation, to give
    /// back if the key exists; or, if the client or all clients together have presented their
    /// share of unknown keys this minute, the refusal.
    pub fn reserve(&self, client: Option<IpAddr>, now: u64) -> Result<Reservation, Refusal> {
        let minute = now / 60;
        let refusal = |reached, counted_in: u64| Refusal {
            reached,
            retry_after_secs: (counted_in + 1) * 60 - now,
        };
        let client = match client.map(group) {
            Some(client) => self
                .reserve_for(client, minute)
                .map_err(|counted_in| refusal(LimitReached::Client, counted_in))?,
            None => None,
        };
        match self.reserve_total(minute) {
            Ok(total) => Ok(Reservation { client, total }),
            Err(counted_in) => {
                self.give_back_for(client);
                Err(refusal(LimitReached::AllClients, counted_in))
            }
        }
    }

    /// The key a reservation was made for exists: the read is given back.
    pub fn give_back(&self, reservation: Reservation) {
        self.give_back_for(reservation.client);
        let _ = self
            .total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                match unpack(word) {
                    (minute, count) if minute == reservation.total && count > 0 => {
                        Some(pack(minute, count - 1))
                    }
                    _ => None,
                }
            });
    }

    /// One read of `client`'s share in `minute`: the client and the minute it counted in, or
    /// `None` if the client is not tracked (the table is full); or the minute its share is
    /// spent in.
    fn reserve_for(&self, client: IpAddr, minute: u64) -> Result<Option<(IpAddr, u64)>, u64> {
        if self.counts.len() >= TRACKED && !self.counts.contains_key(&client) {
            self.sweep(minute);
            if self.counts.len() >= TRACKED {
                return Ok(None);
            }
        }
        let mut count = self.counts.entry(client).or_insert((minute, 0));
        // A request that read the clock just before another started the next minute counts
        // in the newer one, rather than take the count back a minute.
        if count.0 < minute {
            *count = (minute, 0);
        }
        if count.1 >= self.per_minute {
            return Err(count.0);
        }
        count.1 += 1;
        Ok(Some((client, count.0)))
    }

    fn give_back_for(&self, client: Option<(IpAddr, u64)>) {
        let Some((client, minute)) = client else {
            return;
        };
        if let Some(mut count) = self.counts.get_mut(&client) {
            if count.0 == minute {
                count.1 = count.1.saturating_sub(1);
            }
        }
    }

    /// One read of all clients' share in `minute`: the minute it counted in (a later one, if
    /// another request started it), or the minute the share is spent in.
    fn reserve_total(&self, minute: u64) -> Result<u64, u64> {
        let counted_in = |word| unpack(word).0.max(minute);
        self.total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                let count = match unpack(word) {
                    (m, _) if m < minute => 0,
                    (_, count) => count,
                };
                (count < self.total_per_minute).then(|| pack(counted_in(word), count + 1))
            })
            .map(counted_in)
            .map_err(counted_in)
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

/// A store read reserved: for a client, in the minute it was counted in, and in all clients'
/// count, in the minute that was counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "give it back if the key exists"]
pub struct Reservation {
    client: Option<(IpAddr, u64)>,
    total: u64,
}

/// All clients' count as one word: minutes since 1970 fit 32 bits until the year 10136.
fn pack(minute: u64, count: u32) -> u64 {
    (minute << 32) | u64::from(count)
}

fn unpack(word: u64) -> (u64, u32) {
    (word >> 32, word as u32)
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

    fn client_refusal(retry_after_secs: u64) -> Refusal {
        Refusal {
            reached: LimitReached::Client,
            retry_after_secs,
        }
    }

    fn all_clients_refusal(retry_after_secs: u64) -> Refusal {
        Refusal {
            reached: LimitReached::AllClients,
            retry_after_secs,
        }
    }

    #[test]
    fn all_clients_together_get_a_share_per_minute_those_without_an_address_too() {
        let limit = UnknownKeyLimit::new(2, 4);
        let now = 1_800_000_010; // 10 s into a minute
        let first = limit.reserve(ip("192.0.2.1"), now).unwrap();
        let _ = limit.reserve(ip("192.0.2.1"), now).unwrap();
        let _ = limit.reserve(ip("192.0.2.2"), now).unwrap();
        let _ = limit.reserve(None, now).unwrap();
        // Four reads this minute: a new address, and one without, are refused too.
        assert_eq!(
            limit.reserve(ip("192.0.2.3"), now),
            Err(all_clients_refusal(50))
        );
        assert_eq!(limit.reserve(None, now), Err(all_clients_refusal(50)));
        // A client past its own share is refused by it, and takes nothing from the others'.
        assert_eq!(limit.reserve(ip("192.0.2.1"), now), Err(client_refusal(50)));
        // A key that existed gives its read back to both counts.
        limit.give_back(first);
        let again = limit.reserve(ip("192.0.2.1"), now).unwrap();
        assert_eq!(
            limit.reserve(ip("192.0.2.3"), now),
            Err(all_clients_refusal(50))
        );
        // A read refused by all clients' count is not held against the client: 192.0.2.3 was
        // refused twice above and still has its own share once there is room.
        limit.give_back(again);
        let _ = limit.reserve(ip("192.0.2.3"), now).unwrap();
        assert_eq!(
            limit.reserve(ip("192.0.2.3"), now),
            Err(all_clients_refusal(50))
        );
        // The next minute starts afresh; a late request of the minute before counts in it,
        // and its give-back reaches it.
        let _ = limit.reserve(None, now + 50).unwrap();
        let late = limit.reserve(None, now + 49).unwrap();
        for _ in 0..2 {
            let _ = limit.reserve(None, now + 50).unwrap();
        }
        assert_eq!(limit.reserve(None, now + 50), Err(all_clients_refusal(60)));
        limit.give_back(late);
        assert!(limit.reserve(None, now + 50).is_ok());
        assert_eq!(limit.reserve(None, now + 49), Err(all_clients_refusal(61)));
    }

    #[test]
    fn a_client_gets_its_share_per_minute_and_others_theirs() {
        let limit = UnknownKeyLimit::new(3, u32::MAX);
        let now = 1_800_000_015; // 15 s into a minute
        let mut first = None;
        for _ in 0..3 {
            first = first.or(limit.reserve(ip("192.0.2.1"), now).ok());
        }
        assert_eq!(limit.reserve(ip("192.0.2.1"), now), Err(client_refusal(45)));
        assert!(limit.reserve(ip("192.0.2.2"), now).is_ok());
        // A key that existed gives its read back.
        limit.give_back(first.unwrap());
        assert!(limit.reserve(ip("192.0.2.1"), now).is_ok());
        assert_eq!(limit.reserve(ip("192.0.2.1"), now), Err(client_refusal(45)));
        // The next minute starts afresh, and a late request of the minute before counts in
        // it, gives back in it, and waits for its end.
        assert!(limit.reserve(ip("192.0.2.1"), now + 45).is_ok());
        let late = limit.reserve(ip("192.0.2.1"), now + 44).unwrap();
        assert!(limit.reserve(ip("192.0.2.1"), now + 45).is_ok());
        assert_eq!(
            limit.reserve(ip("192.0.2.1"), now + 45),
            Err(client_refusal(60))
        );
        limit.give_back(late);
        assert!(limit.reserve(ip("192.0.2.1"), now + 45).is_ok());
        assert_eq!(
            limit.reserve(ip("192.0.2.1"), now + 44),
            Err(client_refusal(61))
        );
        // No address (a Unix socket, or an ingress's): never held up.
        for _ in 0..5 {
            assert!(limit.reserve(None, now).is_ok());
        }
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64_and_a_mapped_ipv4_as_ipv4() {
        let limit = UnknownKeyLimit::new(1, u32::MAX);
        let now = 1_800_000_000;
        let _ = limit.reserve(ip("2001:db8:1:2::1"), now).unwrap();
        assert!(limit.reserve(ip("2001:db8:1:2:ffff::9"), now).is_err());
        assert!(limit.reserve(ip("2001:db8:1:3::1"), now).is_ok());
        let _ = limit.reserve(ip("::ffff:192.0.2.7"), now).unwrap();
        assert!(limit.reserve(ip("192.0.2.7"), now).is_err());
    }

    #[test]
    fn a_full_table_keeps_the_counts_it_has() {
        let limit = UnknownKeyLimit::new(1, u32::MAX);
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
