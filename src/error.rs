//! The one error type for everything the gateway and the admin API answer themselves.
//!
//! Each variant maps to its documented status and code here, in one place; every such answer has
//! the body `{"error": {"code", "message", "request_id"}}`.

use std::borrow::Cow;

use crate::keys::format::{last4, redact, rewrite_words};
use crate::shared::store::StoreError;

/// Message text: static on the hot path, owned where it names the input.
pub type Message = Cow<'static, str>;

/// An error answered to the client. Messages never contain a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// Missing, malformed, unknown, expired, revoked or past-grace credentials.
    #[error("{0}")]
    Authentication(Message),
    /// Authenticated, but the key lacks the scope the route needs.
    #[error("{0}")]
    Permission(Message),
    /// Malformed input.
    #[error("{0}")]
    InvalidRequest(Message),
    /// The method is not served on this path.
    #[error("{0}")]
    MethodNotAllowed(Message),
    /// A monthly budget is spent.
    #[error("{0}")]
    BudgetExceeded(Message),
    /// The request's header section is larger than the gateway takes.
    #[error("{0}")]
    HeadersTooLarge(Message),
    /// Too many requests; retry after the given number of seconds.
    #[error("{message}")]
    RateLimited {
        /// What was limited.
        message: Message,
        /// Seconds until a retry can succeed.
        retry_after_secs: u64,
    },
    /// No such route or object.
    #[error("{0}")]
    NotFound(Message),
    /// The backend failed.
    #[error("{0}")]
    Upstream(Message),
    /// The backend could not be reached.
    #[error("{0}")]
    UpstreamUnavailable(Message),
    /// The store is unreachable and the answer is not cached.
    #[error("{0}")]
    ServiceUnavailable(Message),
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> u16 {
        match self {
            Self::Authentication(_) => 401,
            Self::Permission(_) => 403,
            Self::InvalidRequest(_) => 400,
            Self::MethodNotAllowed(_) => 405,
            Self::HeadersTooLarge(_) => 431,
            Self::BudgetExceeded(_) => 402,
            Self::RateLimited { .. } => 429,
            Self::NotFound(_) => 404,
            Self::Upstream(_) => 502,
            Self::UpstreamUnavailable(_) => 503,
            Self::ServiceUnavailable(_) => 503,
        }
    }

    /// The `error.code` of the body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Authentication(_) => "authentication_error",
            Self::Permission(_) => "permission_error",
            Self::InvalidRequest(_) | Self::MethodNotAllowed(_) | Self::HeadersTooLarge(_) => {
                "invalid_request_error"
            }
            Self::BudgetExceeded(_) => "budget_exceeded",
            Self::RateLimited { .. } => "rate_limit_error",
            Self::NotFound(_) => "not_found",
            Self::Upstream(_) => "upstream_error",
            Self::UpstreamUnavailable(_) => "upstream_unavailable",
            Self::ServiceUnavailable(_) => "service_unavailable",
        }
    }

    /// Seconds for a `Retry-After` header, where one applies.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::RateLimited {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            Self::ServiceUnavailable(_) | Self::UpstreamUnavailable(_) => Some(1),
            _ => None,
        }
    }

    /// The `WWW-Authenticate` challenge a 401 carries (RFC 9110 §11.6.1, RFC 6750 §3).
    pub fn challenge(&self) -> Option<&'static str> {
        match self {
            Self::Authentication(_) => Some(r#"Bearer realm="svcgate""#),
            _ => None,
        }
    }

    /// The JSON body for this error. The message is cut wherever it repeats what may be a
    /// secret: a parser's message quotes the value it could not take, and a caller may have put
    /// a key or a webhook secret there.
    pub fn body(&self, request_id: &str) -> Vec<u8> {
        let message = self.to_string();
        let body = serde_json::json!({
            "error": {
                "code": self.code(),
                "message": without_secrets(&message),
                "request_id": request_id,
            }
        });
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// Shorthand for an [`ApiError::InvalidRequest`] naming the input.
    pub fn invalid(message: impl Into<Message>) -> Self {
        Self::InvalidRequest(message.into())
    }

    /// Shorthand for an [`ApiError::NotFound`].
    pub fn not_found(message: impl Into<Message>) -> Self {
        Self::NotFound(message.into())
    }
}

/// `text` with every key or token (see [`redact`]) and every webhook signing secret (`whsec_`)
/// in it cut to its prefix and last four characters.
fn without_secrets(text: &str) -> Cow<'_, str> {
    const SECRET: &str = "whsec_";
    let keys_cut = redact(text);
    match rewrite_words(&keys_cut, SECRET, |word, out| {
        out.push_str(SECRET);
        out.push('…');
        out.push_str(last4(&word[SECRET.len()..]));
    }) {
        Cow::Borrowed(_) => keys_cut,
        Cow::Owned(cut) => Cow::Owned(cut),
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) | StoreError::Reconnected => {
                ApiError::ServiceUnavailable("the store is unreachable; retry shortly".into())
            }
            StoreError::Conflict(what) => ApiError::invalid(what),
        }
    }
}

impl From<crate::keys::manage::KeyError> for ApiError {
    fn from(e: crate::keys::manage::KeyError) -> Self {
        match e {
            crate::keys::manage::KeyError::Invalid(why) => ApiError::invalid(why),
            crate::keys::manage::KeyError::Store(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_its_documented_status_and_code() {
        let cases = [
            (
                ApiError::Authentication("x".into()),
                401,
                "authentication_error",
            ),
            (ApiError::Permission("x".into()), 403, "permission_error"),
            (ApiError::invalid("x"), 400, "invalid_request_error"),
            (ApiError::BudgetExceeded("x".into()), 402, "budget_exceeded"),
            (
                ApiError::RateLimited {
                    message: "x".into(),
                    retry_after_secs: 3,
                },
                429,
                "rate_limit_error",
            ),
            (ApiError::not_found("x"), 404, "not_found"),
            (ApiError::Upstream("x".into()), 502, "upstream_error"),
            (
                ApiError::UpstreamUnavailable("x".into()),
                503,
                "upstream_unavailable",
            ),
            (
                ApiError::ServiceUnavailable("x".into()),
                503,
                "service_unavailable",
            ),
        ];
        for (err, status, code) in cases {
            assert_eq!((err.status(), err.code()), (status, code));
        }
    }

    #[test]
    fn body_has_the_documented_shape_and_escapes_messages() {
        let err = ApiError::invalid("bad \"project\"");
        let v: serde_json::Value = serde_json::from_slice(&err.body("req_1")).unwrap();
        assert_eq!(v["error"]["code"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "bad \"project\"");
        assert_eq!(v["error"]["request_id"], "req_1");
    }

    #[test]
    fn a_secret_quoted_in_a_message_is_cut_to_its_last_four() {
        let key = "svc_live_EaMgQ0w2n4Zc9XkLr7TdVb1Hs3yyYSv";
        let secret = "whsec_4fJk29dLqPz8XcVb7NmA1sD3gH5jK6lQ";
        let err = ApiError::invalid(format!(
            "invalid token request: invalid type: string \"{key}\", expected a sequence; \
             also \"{secret}\" and whsec_"
        ));
        let v: serde_json::Value = serde_json::from_slice(&err.body("req_1")).unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert_eq!(
            message,
            "invalid token request: invalid type: string \"svc_live_…yYSv\", expected a \
             sequence; also \"whsec_…K6lQ\" and whsec_…"
        );
    }
}
