//! Addresses the gateway never connects to on a customer's behalf.

use std::net::IpAddr;

/// Whether `ip` is an address no customer endpoint may use: loopback, private, link-local
/// (cloud metadata lives at 169.254.169.254), shared, unspecified, multicast, documentation.
pub fn is_internal(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xC0) == 64)
                || (o[0] == 198 && (o[1] & 0xFE) == 18)
                // IETF protocol assignments (192.0.0.0/24: DS-Lite, NAT64 discovery, …)
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                let [a, b] = hi.to_be_bytes();
                let [c, d] = lo.to_be_bytes();
                is_internal(&IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d)))
            };
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                // site-local (deprecated, still routed by some networks)
                || (s[0] & 0xffc0) == 0xfec0
                // ::a.b.c.d and ::ffff:a.b.c.d
                || v6.to_ipv4().is_some_and(|v4| is_internal(&IpAddr::V4(v4)))
                // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits; the
                // local-use prefix 64:ff9b:1::/48 reaches whatever its operator maps.
                || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && embedded(s[6], s[7]))
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
                // 6to4 (2002::/16) carries its IPv4 address in bits 16 to 48.
                || (s[0] == 0x2002 && embedded(s[1], s[2]))
                // IPv4-translated (SIIT, ::ffff:0:a.b.c.d) carries it in its last 32 bits.
                || (s[..6] == [0, 0, 0, 0, 0xffff, 0] && embedded(s[6], s[7]))
                // Teredo (2001::/32) tunnels to an IPv4 address it hides (XORed) in its last
                // 32 bits; documentation (2001:db8::/32); discard-only (100::/64).
                || (s[0] == 0x2001 && (s[1] == 0 || s[1] == 0x0db8))
                || s[..4] == [0x100, 0, 0, 0]
        }
    }
}

/// Who sent a request the gateway hands to a service of its own (the dashboard): the client's
/// address (past trusted proxies) and whether the request reached the edge over TLS (directly,
/// or per a trusted proxy's `X-Forwarded-Proto`). Carried as a request extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress {
    /// The client's address.
    pub ip: IpAddr,
    /// Whether the request came over TLS.
    pub secure: bool,
}
