//! The dashboard's HTTP plumbing: what a request brings (client, cookies, form fields), the
//! headers every answer carries (CSP, no caching), redirects, and error pages.

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, HOST, LOCATION};
use http::{HeaderMap, HeaderValue, StatusCode};
use std::net::{IpAddr, Ipv4Addr};

use crate::error::ApiError;
use crate::keys::manage::KeyError;
use crate::shared::net::ClientAddress;
use crate::shared::store::StoreError;

/// The policy on every page: scripts, styles and images from the dashboard only; no inline
/// script or style; forms post only to the dashboard; never framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "svcgate_dashboard";

/// Largest form body accepted.
pub const FORM_LIMIT: usize = 64 * 1024;

/// What every handler reads from a request besides its path parameters and body.
pub struct Ctx {
    /// The request's headers.
    pub headers: HeaderMap,
    /// The client and whether it came over TLS.
    pub client: ClientAddress,
    /// The request path (no query).
    pub path: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Ctx {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        // Set by whoever serves the router (the gateway, or the dashboard's own listener);
        // without it the client is unknown, and not on TLS.
        let client = parts
            .extensions
            .get::<ClientAddress>()
            .copied()
            .unwrap_or(ClientAddress {
                ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                secure: false,
            });
        Ok(Ctx {
            headers: parts.headers.clone(),
            client,
            path: parts.uri.path().to_string(),
        })
    }
}

impl Ctx {
    /// The value of cookie `name`, if sent.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }

    /// The `Host` the client asked for.
    pub fn host(&self) -> &str {
        self.headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost")
    }
}

/// A submitted form: its fields in order, a name possibly repeated (checkboxes).
pub struct Form(Vec<(String, String)>);

impl Form {
    /// Parses an `application/x-www-form-urlencoded` body.
    pub fn parse(body: &[u8]) -> Result<Self, PageError> {
        if body.len() > FORM_LIMIT {
            return Err(PageError::bad_request("the form is too large"));
        }
        Ok(Form(
            url::form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        ))
    }

    /// The first value of `name`, trimmed; `None` when absent or blank.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// Every non-blank value of `name`.
    pub fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, v)| k == name && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_string())
            .collect()
    }
}

/// Why a page could not be shown: a status and a message for the person, or a redirect.
#[derive(Debug)]
pub enum PageError {
    /// Shown as a page with this status.
    Status(StatusCode, String),
    /// Sent elsewhere (sign-in, mostly).
    Redirect(String),
}

impl PageError {
    /// 400 with `message`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::Status(StatusCode::BAD_REQUEST, message.into())
    }

    /// 404 with `message`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::Status(StatusCode::NOT_FOUND, message.into())
    }

    /// 403 with `message`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::Status(StatusCode::FORBIDDEN, message.into())
    }
}

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
        Self::Status(status, e.to_string())
    }
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<KeyError> for PageError {
    fn from(e: KeyError) -> Self {
        ApiError::from(e).into()
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match self {
            PageError::Redirect(to) => redirect(&to),
            PageError::Status(status, message) => {
                let mut resp = html(super::pages::error_page(status, &message));
                *resp.status_mut() = status;
                resp
            }
        }
    }
}

/// A `303 See Other` to `to`: after a form, the browser GETs the next page.
pub fn redirect(to: &str) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(to) {
        resp.headers_mut().insert(LOCATION, value);
    }
    resp
}

/// An HTML page.
pub fn html(markup: maud::Markup) -> Response {
    (
        [(CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// The headers of every dashboard answer: its CSP, no caching (pages show keys and secrets
/// once), no framing, no sniffing, no referrer (a sign-in link's token stays in its page).
pub async fn security_headers(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut resp = next.run(req).await;
    let headers = resp.headers_mut();
    for (name, value) in [
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// The `Set-Cookie` value of a session cookie holding `token` (empty, and expired, to end it):
/// HttpOnly, SameSite=Strict, and Secure when the client came over TLS.
pub fn session_cookie(token: &str, secure: bool) -> String {
    let mut cookie =
        format!("{SESSION_COOKIE}={token}; Path=/dashboard; HttpOnly; SameSite=Strict");
    if token.is_empty() {
        cookie.push_str("; Max-Age=0");
    }
    if secure {
        cookie.push_str("; Secure");
    }
    cookie
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_keep_repeated_names_and_drop_blanks() {
        let form = Form::parse(b"scopes=a%3Ab&scopes=c%3Ad&name=+x+&budget=").unwrap();
        assert_eq!(form.all("scopes"), ["a:b", "c:d"]);
        assert_eq!(form.get("name"), Some("x"));
        assert_eq!(form.get("budget"), None);
    }

    #[test]
    fn the_session_cookie_is_secure_only_over_tls() {
        let plain = session_cookie("t", false);
        assert!(plain.contains("HttpOnly") && plain.contains("SameSite=Strict"));
        assert!(!plain.contains("Secure"));
        assert!(session_cookie("t", true).ends_with("; Secure"));
        assert!(session_cookie("", false).contains("Max-Age=0"));
    }
}
