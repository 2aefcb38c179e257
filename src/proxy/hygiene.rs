//! What a client sends that the backend must not act on.
//!
//! - The `Service-*` request-header namespace is the gateway's: a backend reads
//!   `Service-Workspace`, `Service-Scopes` or `Service-Credits` on a request as the gateway's
//!   statement. Every client-sent `Service-*` header goes before forwarding, except the
//!   validated `Service-Project`; so do names that CGI, WSGI and Rack read as one of them or as
//!   the gateway's `X-Forwarded-For` (`Service_Workspace`, `X_Forwarded_For`: both `-` and `_`
//!   become `_` there).
//! - Method-override headers (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`)
//!   make a backend that honours them serve another method than the one whose route and scope
//!   were checked: refused.
//! - A protocol upgrade (`Upgrade`, or `Connection: upgrade`) turns the exchange into a tunnel
//!   the gateway neither meters nor reads: refused unless the route takes upgrades.
//!
//! All three are found in one pass over the request's header names ([`scan`]); the common
//! request, with none of them, costs a look at each name and no allocation.

use http::header::CONNECTION;
use http::HeaderMap;
use pingora::http::RequestHeader;

/// What [`scan`] found in a request's headers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Findings {
    /// A method-override header.
    pub method_override: bool,
    /// A protocol upgrade: an `Upgrade` header, or `upgrade` in `Connection`.
    pub upgrade: bool,
    /// A header the backend must not get from the client ([`drop_gateway_names`]).
    pub gateway_names: bool,
}

/// Looks at each header name of `headers` once.
pub fn scan(headers: &HeaderMap) -> Findings {
    let mut found = Findings::default();
    for name in headers.keys() {
        let name = name.as_str().as_bytes();
        match name.first() {
            Some(b's') if is_gateway_name(name) => found.gateway_names = true,
            Some(b'x') if is_method_override(name) => found.method_override = true,
            Some(b'u') if name == b"upgrade" => found.upgrade = true,
            Some(b'c') if name == b"connection" => {
                found.upgrade |= headers.get_all(CONNECTION).iter().any(|line| {
                    line.as_bytes()
                        .split(|b| *b == b',')
                        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
                });
            }
            _ => {}
        }
        if name.contains(&b'_') && is_lookalike(name) {
            found.gateway_names = true;
        }
    }
    found
}

/// Drops every header [`scan`] counts in [`Findings::gateway_names`]: called only when it
/// found one.
pub fn drop_gateway_names(req: &mut RequestHeader) {
    let dropped: Vec<http::HeaderName> = req
        .headers
        .keys()
        .filter(|n| {
            let name = n.as_str().as_bytes();
            is_gateway_name(name) || (name.contains(&b'_') && is_lookalike(name))
        })
        .cloned()
        .collect();
    for name in dropped {
        req.remove_header(&name);
    }
}

/// A `service-` name other than `service-project` (lower case: `http` keeps names so).
fn is_gateway_name(name: &[u8]) -> bool {
    name.starts_with(b"service-") && name != b"service-project"
}

/// A name with `_` that a CGI-style backend reads as a gateway header.
fn is_lookalike(name: &[u8]) -> bool {
    let dashed_eq = |part: &[u8], lit: &[u8]| {
        part.len() == lit.len()
            && part
                .iter()
                .zip(lit)
                .all(|(a, b)| a == b || (*a == b'_' && *b == b'-'))
    };
    name.get(..8)
        .is_some_and(|head| dashed_eq(head, b"service-"))
        || dashed_eq(name, b"x-forwarded-for")
        || dashed_eq(name, b"x-real-ip")
}

fn is_method_override(name: &[u8]) -> bool {
    matches!(
        name,
        b"x-http-method-override" | b"x-http-method" | b"x-method-override"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn an_ordinary_request_has_nothing() {
        let found = scan(&headers(&[
            ("content-type", "application/json"),
            ("connection", "keep-alive"),
            ("service-project", "p1"),
            ("x-request-id", "1"),
        ]));
        assert_eq!(found, Findings::default());
    }

    #[test]
    fn each_finding_is_found() {
        for (pairs, expected) in [
            (
                &[("Service-Scopes", "admin")][..],
                Findings {
                    gateway_names: true,
                    ..Findings::default()
                },
            ),
            (
                &[("service_workspace", "ws")][..],
                Findings {
                    gateway_names: true,
                    ..Findings::default()
                },
            ),
            (
                &[("x_forwarded_for", "1.2.3.4")][..],
                Findings {
                    gateway_names: true,
                    ..Findings::default()
                },
            ),
            (
                &[("X-HTTP-Method", "DELETE")][..],
                Findings {
                    method_override: true,
                    ..Findings::default()
                },
            ),
            (
                &[("connection", "keep-alive, Upgrade")][..],
                Findings {
                    upgrade: true,
                    ..Findings::default()
                },
            ),
            (
                &[("upgrade", "websocket")][..],
                Findings {
                    upgrade: true,
                    ..Findings::default()
                },
            ),
        ] {
            assert_eq!(scan(&headers(pairs)), expected, "{pairs:?}");
        }
    }

    #[test]
    fn only_service_project_of_the_namespace_stays() {
        let mut req = RequestHeader::build("POST", b"/v1/chat", None).unwrap();
        for name in [
            "Service-Scopes",
            "Service-Credits",
            "Service-Project",
            "Service_Key_Id",
            "X-Custom",
        ] {
            req.append_header(name, "v").unwrap();
        }
        drop_gateway_names(&mut req);
        let mut left: Vec<&str> = req.headers.keys().map(|n| n.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["service-project", "x-custom"]);
    }
}
