//! Whether a request comes from a web page: a live key must never be in one.
//!
//! Browsers mark what they send: `Sec-Fetch-Site` (`cross-site`, `same-site`, `same-origin`,
//! `none`), `Sec-Fetch-Mode` (`cors`, `navigate`, `no-cors`, …) and, on cross-origin and most
//! non-GET requests, `Origin`. Servers and command-line clients send none of them. A request
//! the user typed into the address bar (`Sec-Fetch-Site: none`) is not a page's.

use http::HeaderMap;

/// Whether `headers` are a browser's, sent by a page: an `Origin` (other than `null` from
/// a non-browser tool), or `Sec-Fetch-Site` naming another site, or `Sec-Fetch-Mode: cors`.
pub fn from_web_page(headers: &HeaderMap) -> bool {
    let value = |name: &str| headers.get(name).map(|v| v.as_bytes());
    if let Some(site) = value("sec-fetch-site") {
        if site.eq_ignore_ascii_case(b"cross-site") || site.eq_ignore_ascii_case(b"same-site") {
            return true;
        }
    }
    if value("sec-fetch-mode").is_some_and(|m| m.eq_ignore_ascii_case(b"cors")) {
        return true;
    }
    value("origin").is_some_and(|o| {
        let o = o.trim_ascii();
        !o.is_empty() && !o.eq_ignore_ascii_case(b"null")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (http::HeaderName::from_static(k), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn pages_are_told_from_servers() {
        for page in [
            &[("origin", "https://app.example.com")][..],
            &[("sec-fetch-site", "cross-site")],
            &[
                ("sec-fetch-site", "same-site"),
                ("sec-fetch-mode", "navigate"),
            ],
            &[("sec-fetch-mode", "cors")],
        ] {
            assert!(from_web_page(&headers(page)), "{page:?}");
        }
        for server in [
            &[][..],
            &[("origin", "null")],
            &[("sec-fetch-site", "none"), ("sec-fetch-mode", "navigate")],
            &[("user-agent", "curl/8")],
        ] {
            assert!(!from_web_page(&headers(server)), "{server:?}");
        }
    }
}
