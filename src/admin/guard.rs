//! Who may call the admin API: the admin token, a throttle on failed attempts per client
//! address, and the demo token only from a loopback `Host`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed authentications one address may make in a window before it is refused.
pub const MAX_FAILURES: u32 = 20;
/// The window: a minute from an address's first failure.
const WINDOW: Duration = Duration::from_secs(60);
/// Addresses tracked at most. Past it, expired entries go; if all are live, new addresses
/// share one entry, so a flood from many addresses is throttled as one.
const MAX_TRACKED: usize = 10_000;

/// Failed admin authentications per client address, in this process (each replica counts its
/// own).
#[derive(Default)]
pub struct FailedAuths {
    by_address: Mutex<HashMap<Option<IpAddr>, Window>>,
}

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

impl FailedAuths {
    /// Seconds until `address` may try again, if it made [`MAX_FAILURES`] failures in its
    /// window.
    pub fn throttled(&self, address: Option<IpAddr>, now: Instant) -> Option<u64> {
        let table = self.by_address.lock().ok()?;
        let window = table.get(&address).or_else(|| {
            // An address not tracked while the table is full counts in the shared entry.
            (table.len() >= MAX_TRACKED)
                .then(|| table.get(&None))
                .flatten()
        })?;
        let elapsed = now.saturating_duration_since(window.started);
        (window.failures >= MAX_FAILURES && elapsed < WINDOW)
            .then(|| (WINDOW - elapsed).as_secs_f64().ceil().max(1.0) as u64)
    }

    /// Counts a failure of `address`.
    pub fn fail(&self, address: Option<IpAddr>, now: Instant) {
        let Ok(mut table) = self.by_address.lock() else {
            return;
        };
        let mut key = address;
        if !table.contains_key(&key) && table.len() >= MAX_TRACKED {
            table.retain(|_, w| now.saturating_duration_since(w.started) < WINDOW);
            if table.len() >= MAX_TRACKED {
                key = None;
            }
        }
        let window = table.entry(key).or_insert(Window {
            started: now,
            failures: 0,
        });
        if now.saturating_duration_since(window.started) >= WINDOW {
            *window = Window {
                started: now,
                failures: 0,
            };
        }
        window.failures = window.failures.saturating_add(1);
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.by_address.lock().map(|t| t.len()).unwrap_or(0)
    }
}

/// Whether a `Host` value names this machine's loopback: `localhost`, `127.0.0.1` (any of
/// 127.0.0.0/8) or `[::1]`, with or without a port. A page on another name that resolves to
/// 127.0.0.1 (DNS rebinding) sends its own name.
pub fn is_loopback_host(host: &[u8]) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((inner, port)) if port.is_empty() || is_port(port) => inner,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_port(suffix: &str) -> bool {
    suffix
        .strip_prefix(':')
        .unwrap_or(suffix)
        .parse::<u16>()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_from_others() {
        for host in [
            "localhost",
            "LOCALHOST:8081",
            "127.0.0.1",
            "127.0.0.1:8081",
            "[::1]",
            "[::1]:8081",
        ] {
            assert!(is_loopback_host(host.as_bytes()), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8081",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "[::1]x",
            "10.0.0.1:8081",
            "",
        ] {
            assert!(!is_loopback_host(host.as_bytes()), "{host}");
        }
    }

    #[test]
    fn an_address_is_throttled_after_its_failures_until_the_window_ends() {
        let auths = FailedAuths::default();
        let (a, b) = (
            Some("10.0.0.1".parse().unwrap()),
            Some("10.0.0.2".parse().unwrap()),
        );
        let start = Instant::now();
        for _ in 0..MAX_FAILURES {
            assert_eq!(auths.throttled(a, start), None);
            auths.fail(a, start);
        }
        assert_eq!(auths.throttled(a, start), Some(60));
        assert_eq!(auths.throttled(b, start), None);
        assert_eq!(auths.throttled(a, start + WINDOW), None);
    }

    #[test]
    fn the_table_is_bounded() {
        let auths = FailedAuths::default();
        let now = Instant::now();
        for i in 0..(MAX_TRACKED as u32 + 500) {
            auths.fail(Some(IpAddr::from(i.to_be_bytes())), now);
        }
        assert!(auths.tracked() <= MAX_TRACKED + 1);
    }
}
