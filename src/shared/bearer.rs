//! The `Authorization: Bearer <credential>` header, as the gateway and the admin API read it.

use http::HeaderValue;

/// Why a request carries no usable `Bearer` credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BearerError {
    /// No `Authorization` header.
    Missing,
    /// More than one `Authorization` header: which one counts would depend on who reads it.
    Ambiguous,
    /// The header is not `Bearer <token>`.
    Scheme,
}

/// The request's one `Authorization` header, if it has one. Two are refused whatever they hold:
/// a proxy in front that reads the last one would authorize a different key than this gateway.
pub fn authorization(headers: &http::HeaderMap) -> Result<Option<&HeaderValue>, BearerError> {
    let mut all = headers.get_all(http::header::AUTHORIZATION).iter();
    match (all.next(), all.next()) {
        (first, None) => Ok(first),
        _ => Err(BearerError::Ambiguous),
    }
}

/// The credential of a `Bearer` header: `Bearer`, in any case (an auth scheme is
/// case-insensitive, RFC 9110 §11.1), one or more spaces (RFC 6750 §2.1), the credential.
pub fn bearer_credential(header: Option<&HeaderValue>) -> Result<&[u8], BearerError> {
    let value = header.ok_or(BearerError::Missing)?.as_bytes();
    match value.split_at_checked(7) {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case(b"bearer ") => {
            let credential = rest.trim_ascii_start();
            match credential.is_empty() {
                true => Err(BearerError::Scheme),
                false => Ok(credential),
            }
        }
        _ => Err(BearerError::Scheme),
    }
}
