//! Policy: what an authenticated key may do with this request. Scopes and project attribution
//! now; rate limits and budgets hook in here.

use http::HeaderValue;

use super::auth::Authenticated;
use super::routes::Route;
use crate::error::ApiError;

/// Longest `Service-Project` value.
pub const MAX_PROJECT_LEN: usize = 64;

/// Refuses a key that lacks the route's scope.
#[inline]
pub fn check_scope(caller: &Authenticated, route: &Route) -> Result<(), ApiError> {
    if caller.allows(&route.scope) {
        Ok(())
    } else {
        Err(ApiError::Permission(
            format!("this key lacks the scope '{}'", route.scope).into(),
        ))
    }
}

/// Validates an optional `Service-Project` header: 1–64 characters of `[A-Za-z0-9._-]`.
pub fn check_project(header: Option<&HeaderValue>) -> Result<Option<&str>, ApiError> {
    let Some(value) = header else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= MAX_PROJECT_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(value.to_str().ok())
    } else {
        Err(ApiError::invalid(
            "Service-Project must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' or '-'",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_values_are_validated() {
        assert!(check_project(None).is_ok());
        for ok in ["p", "team-a.prod_1", &"x".repeat(64)] {
            assert!(
                check_project(Some(&HeaderValue::from_str(ok).unwrap())).is_ok(),
                "{ok}"
            );
        }
        for bad in ["", "a b", "a/b", "ünï", &"x".repeat(65)] {
            let hv = HeaderValue::from_bytes(bad.as_bytes()).unwrap();
            assert_eq!(check_project(Some(&hv)).unwrap_err().status(), 400, "{bad}");
        }
    }
}
