//! Cross-origin requests: browser apps call the API with scoped tokens (`svc_scoped_`) their
//! backend mints.
//!
//! Only origins listed in `[cors] allowed_origins` are let in (none by default, which keeps
//! every browser out: a request with an `Authorization` header needs a preflight, and none is
//! granted). For an allowed origin the gateway answers preflights itself, before
//! authentication (a browser sends no credentials with them), and puts
//! `Access-Control-Allow-Origin` on every answer, its own and the backend's. A live key is
//! refused from a browser: production keys never reach one.

use http::HeaderValue;

/// The request headers a browser may send: the credential, the body's type, the project.
pub const ALLOW_HEADERS: &str = "authorization, content-type, service-project";
/// The response headers a browser app may read.
pub const EXPOSE_HEADERS: &str = "service-request-id, service-credits, ratelimit-limit, \
                                  ratelimit-remaining, ratelimit-reset, retry-after";
/// How long a browser may reuse a preflight's answer (seconds).
pub const MAX_AGE: &str = "600";

/// The origins let in.
#[derive(Debug, Clone, Default)]
pub struct Cors {
    any: bool,
    origins: Vec<String>,
}

impl Cors {
    /// From `[cors] allowed_origins` (validated: `*` or `scheme://host[:port]`).
    pub fn new(allowed_origins: &[String]) -> Self {
        Self {
            any: allowed_origins.iter().any(|o| o == "*"),
            origins: allowed_origins
                .iter()
                .filter(|o| *o != "*")
                .cloned()
                .collect(),
        }
    }

    /// Whether any origin is let in at all.
    pub fn is_enabled(&self) -> bool {
        self.any || !self.origins.is_empty()
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`, if it is let in.
    pub fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        let text = origin.to_str().ok()?;
        let listed = self.any || self.origins.iter().any(|o| o == text);
        listed.then(|| origin.clone())
    }
}

/// Whether `origin` is one `[cors] allowed_origins` may list: `*`, or a scheme, host and
/// optional port with nothing after (browsers send origins exactly so).
pub fn is_valid_origin(origin: &str) -> bool {
    if origin == "*" {
        return true;
    }
    let Some(rest) = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
    else {
        return false;
    };
    !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.:[]".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_origins_are_let_in() {
        let cors = Cors::new(&["https://app.example.com".into()]);
        assert!(cors.is_enabled());
        let allowed = HeaderValue::from_static("https://app.example.com");
        assert_eq!(cors.allow(&allowed), Some(allowed));
        for other in [
            "https://evil.example.com",
            "http://app.example.com",
            "https://app.example.com.evil.net",
            "null",
        ] {
            assert_eq!(
                cors.allow(&HeaderValue::from_static(other)),
                None,
                "{other}"
            );
        }
        assert!(!Cors::new(&[]).is_enabled());
        let any = Cors::new(&["*".into()]);
        assert!(any
            .allow(&HeaderValue::from_static("https://x.test"))
            .is_some());
    }

    #[test]
    fn origins_are_checked_as_browsers_send_them() {
        for ok in [
            "*",
            "https://app.example.com",
            "http://localhost:3000",
            "https://[::1]:8443",
        ] {
            assert!(is_valid_origin(ok), "{ok}");
        }
        for bad in [
            "",
            "app.example.com",
            "https://",
            "https://app.example.com/",
            "https://app.example.com/path",
            "https://App.Example.com",
            "ftp://x.test",
            "https://*.example.com",
        ] {
            assert!(!is_valid_origin(bad), "{bad}");
        }
    }
}
