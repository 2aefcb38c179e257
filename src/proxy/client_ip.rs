//! The client's address, for the audit record, when svcgate runs behind load balancers or an
//! ingress: the peer is then the proxy, and the client is in `X-Forwarded-For`.
//!
//! `X-Forwarded-For` is believed only from peers in `[server] trusted_proxies`, and only as far
//! as trusted proxies wrote it: reading from the right, each proxy appends the address it saw,
//! so the first address that is not a trusted proxy is the client (whatever a client put to
//! the left of it is its own claim). With no trusted proxies the peer is the client.
//!
//! The backend gets an `X-Forwarded-For` the gateway vouches for ([`TrustedProxies::forwarded_for`]):
//! what trusted proxies wrote, then the peer, as nginx's `$proxy_add_x_forwarded_for` and Envoy
//! write it. From a peer that is not trusted, the list starts afresh with the peer: a backend
//! behind the sidecar sees only the gateway's address as its own peer, and must not take a
//! client's claim for the gateway's word.

use http::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;
use std::io::Write;
use std::net::IpAddr;

/// `X-Forwarded-For`, read for the audit record and rewritten for the backend.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`, believed from a trusted proxy: whether the client used TLS.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The proxies whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// From `[server] trusted_proxies` (validated: addresses or CIDR blocks).
    pub fn new(entries: &[String]) -> Self {
        Self {
            nets: entries.iter().filter_map(|e| parse(e)).collect(),
        }
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request from `peer` with `headers` (read only when the peer is a
    /// trusted proxy: nothing is looked up on the common path).
    pub fn client(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = peer?;
        if self.nets.is_empty() || !self.trusts(peer) {
            return Some(peer);
        }
        let mut client = peer;
        for value in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
            let Ok(text) = value.to_str() else {
                return Some(client);
            };
            for hop in text.rsplit(',') {
                let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                    // Not an address (`unknown`, a port, garbage): stop at what was proven.
                    return Some(client);
                };
                client = ip.to_canonical();
                if !self.trusts(client) {
                    return Some(client);
                }
            }
        }
        Some(client)
    }

    /// The client of a request from `peer` and whether it came over TLS: `tls` on the
    /// connection itself, or `X-Forwarded-Proto: https` from a trusted proxy.
    pub fn client_address(
        &self,
        peer: IpAddr,
        headers: &HeaderMap,
        tls: bool,
    ) -> crate::shared::net::ClientAddress {
        let forwarded_tls = || {
            self.trusts(peer)
                && headers
                    .get_all(&X_FORWARDED_PROTO)
                    .iter()
                    .next_back()
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.rsplit(',').next())
                    .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
        };
        crate::shared::net::ClientAddress {
            ip: self.client(Some(peer), headers).unwrap_or(peer),
            secure: tls || forwarded_tls(),
        }
    }

    /// The client's address for a limit that refuses requests by address: [`Self::client`],
    /// when it is one client's. With no trusted proxies configured, a peer at a private,
    /// loopback or other internal address is most likely an ingress or a load balancer
    /// speaking for many clients: `None`, so they are not refused together.
    pub fn client_to_limit(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = peer?;
        if self.nets.is_empty() && crate::shared::net::is_internal(&peer) {
            return None;
        }
        self.client(Some(peer), headers)
    }

    /// The `X-Forwarded-For` to send the backend for a request from `peer`: the header as
    /// trusted proxies wrote it with the peer appended, or the peer alone. `None` (the header is
    /// dropped) when the peer has no IP address. From an untrusted peer, no allocation as a rule.
    pub fn forwarded_for(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<HeaderValue> {
        let peer = peer?.to_canonical();
        if !self.nets.is_empty() && self.trusts(peer) {
            let mut list = Vec::with_capacity(64);
            for value in headers.get_all(&X_FORWARDED_FOR) {
                list.extend_from_slice(value.as_bytes());
                list.extend_from_slice(b", ");
            }
            write!(list, "{peer}").ok()?;
            return HeaderValue::from_maybe_shared(bytes::Bytes::from(list)).ok();
        }
        peer_value(peer)
    }
}

thread_local! {
    /// The last peer this thread wrote, and its header value: a sidecar's peers are a few
    /// ingress and node addresses, so most requests reuse it (a shared buffer's count goes up)
    /// instead of formatting the address into a new one.
    static LAST_PEER: std::cell::RefCell<Option<(IpAddr, HeaderValue)>> =
        const { std::cell::RefCell::new(None) };
}

/// `peer` as a header value.
fn peer_value(peer: IpAddr) -> Option<HeaderValue> {
    LAST_PEER.with_borrow_mut(|last| {
        if let Some((_, value)) = last.as_ref().filter(|(ip, _)| *ip == peer) {
            return Some(value.clone());
        }
        // The longest IPv6 text is 45 bytes (`ffff:…:255.255.255.255`).
        let mut buf = [0u8; 48];
        let mut cursor = &mut buf[..];
        write!(cursor, "{peer}").ok()?;
        let written = 48 - cursor.len();
        let value =
            HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(&buf[..written])).ok()?;
        *last = Some((peer, value.clone()));
        Some(value)
    })
}

/// An address (`10.0.0.7`) or a CIDR block (`10.0.0.0/8`).
pub fn parse(entry: &str) -> Option<IpNet> {
    entry
        .parse::<IpNet>()
        .ok()
        .or_else(|| entry.parse::<IpAddr>().ok().map(IpNet::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(trusted: &[&str], peer: &str, xff: &[&str]) -> String {
        let trusted: Vec<String> = trusted.iter().map(|s| s.to_string()).collect();
        let mut headers = HeaderMap::new();
        for v in xff {
            headers.append(&X_FORWARDED_FOR, v.parse().unwrap());
        }
        TrustedProxies::new(&trusted)
            .client(Some(peer.parse().unwrap()), &headers)
            .unwrap()
            .to_string()
    }

    #[test]
    fn forwarded_addresses_are_believed_only_from_trusted_proxies() {
        // No trusted proxies, or an untrusted peer: the peer, whatever the header says.
        assert_eq!(client(&[], "10.0.0.5", &["203.0.113.7"]), "10.0.0.5");
        assert_eq!(
            client(&["10.0.0.0/8"], "198.51.100.1", &["203.0.113.7"]),
            "198.51.100.1"
        );
        // A trusted ingress: the address it appended.
        assert_eq!(
            client(&["10.0.0.0/8"], "10.0.0.5", &["203.0.113.7"]),
            "203.0.113.7"
        );
        // A client's own claim to the left of what the ingress saw is not believed.
        assert_eq!(
            client(&["10.0.0.0/8"], "10.0.0.5", &["1.2.3.4, 203.0.113.7"]),
            "203.0.113.7"
        );
        // Two trusted hops, over two header lines.
        assert_eq!(
            client(
                &["10.0.0.0/8", "192.0.2.10"],
                "10.0.0.5",
                &["203.0.113.7", "192.0.2.10"]
            ),
            "203.0.113.7"
        );
        // Garbage stops the walk at the last proven address; a missing header leaves the peer.
        assert_eq!(
            client(&["10.0.0.0/8"], "10.0.0.5", &["unknown"]),
            "10.0.0.5"
        );
        assert_eq!(client(&["10.0.0.0/8"], "10.0.0.5", &[]), "10.0.0.5");
        // IPv4-mapped peers are matched as IPv4.
        assert_eq!(
            client(&["127.0.0.1"], "::ffff:127.0.0.1", &["203.0.113.7"]),
            "203.0.113.7"
        );
    }

    fn forwarded(trusted: &[&str], peer: &str, xff: &[&str]) -> String {
        let trusted: Vec<String> = trusted.iter().map(|s| s.to_string()).collect();
        let mut headers = HeaderMap::new();
        for v in xff {
            headers.append(&X_FORWARDED_FOR, v.parse().unwrap());
        }
        let value = TrustedProxies::new(&trusted)
            .forwarded_for(Some(peer.parse().unwrap()), &headers)
            .unwrap();
        value.to_str().unwrap().to_string()
    }

    #[test]
    fn the_backend_gets_a_forwarded_list_the_gateway_vouches_for() {
        // An untrusted peer's own list is dropped: the peer starts it afresh.
        assert_eq!(forwarded(&[], "198.51.100.1", &["1.2.3.4"]), "198.51.100.1");
        assert_eq!(
            forwarded(&["10.0.0.0/8"], "198.51.100.1", &["1.2.3.4"]),
            "198.51.100.1"
        );
        assert_eq!(forwarded(&[], "198.51.100.1", &[]), "198.51.100.1");
        // A trusted peer's list is kept, with the peer appended, over every header line.
        assert_eq!(
            forwarded(&["10.0.0.0/8"], "10.0.0.5", &["203.0.113.7"]),
            "203.0.113.7, 10.0.0.5"
        );
        assert_eq!(
            forwarded(
                &["10.0.0.0/8"],
                "10.0.0.5",
                &["1.2.3.4, 203.0.113.7", "10.0.0.9"]
            ),
            "1.2.3.4, 203.0.113.7, 10.0.0.9, 10.0.0.5"
        );
        assert_eq!(forwarded(&["10.0.0.0/8"], "10.0.0.5", &[]), "10.0.0.5");
        // Addresses are written canonically; the longest IPv6 text fits.
        assert_eq!(forwarded(&[], "::ffff:127.0.0.1", &[]), "127.0.0.1");
        let long = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        assert_eq!(forwarded(&[], long, &["x"]), long);
        // No address (a Unix socket): no header.
        assert!(TrustedProxies::default()
            .forwarded_for(None, &HeaderMap::new())
            .is_none());
    }

    #[test]
    fn entries_are_addresses_or_blocks() {
        assert!(parse("10.0.0.0/8").is_some());
        assert!(parse("127.0.0.1").is_some());
        assert!(parse("fd00::/8").is_some());
        assert!(parse("10.0.0.0/33").is_none());
        assert!(parse("ingress").is_none());
    }
}
