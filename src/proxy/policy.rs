//! Policy: what an authenticated key may do with this request. Scopes and project attribution
//! now; rate limits and budgets hook in here.

use http::header::GetAll;
use http::HeaderValue;

use super::auth::Authenticated;
use super::routes::Route;
use crate::error::ApiError;

use crate::shared::project::is_valid_project;

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

/// Validates the optional `Service-Project` header: a valid project name, sent once (with two,
/// the backend would see one the gateway did not check or charge).
pub fn check_project(values: GetAll<'_, HeaderValue>) -> Result<Option<&str>, ApiError> {
    let mut values = values.iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::invalid(
            "Service-Project must be sent at most once",
        ));
    }
    match value.to_str() {
        Ok(name) if is_valid_project(name) => Ok(Some(name)),
        _ => Err(ApiError::invalid(
            "Service-Project must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' or '-'",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(values: &[&[u8]]) -> Result<Option<String>, u16> {
        let mut headers = http::HeaderMap::new();
        for v in values {
            headers.append("service-project", HeaderValue::from_bytes(v).unwrap());
        }
        check_project(headers.get_all("service-project"))
            .map(|p| p.map(str::to_owned))
            .map_err(|e| e.status())
    }

    #[test]
    fn project_values_are_validated() {
        assert_eq!(project(&[]), Ok(None));
        for ok in ["p", "team-a.prod_1", &"x".repeat(64)] {
            assert_eq!(project(&[ok.as_bytes()]), Ok(Some(ok.to_string())), "{ok}");
        }
        for bad in ["", "a b", "a/b", "ünï", &"x".repeat(65)] {
            assert_eq!(project(&[bad.as_bytes()]), Err(400), "{bad}");
        }
    }

    #[test]
    fn a_second_project_header_is_refused_even_when_both_are_valid() {
        assert_eq!(project(&[b"p1", b"p2"]), Err(400));
        assert_eq!(project(&[b"p1", b"not valid!"]), Err(400));
        assert_eq!(project(&[b"p1", b"p1"]), Err(400));
    }
}
