//! Extractors that turn malformed input into a 400 with the gateway's error body.

use axum::extract::{FromRequest, FromRequestParts, Request};
use http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON object body; any problem with it is a 400 `invalid_request_error`.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let axum::Json(value) = axum::Json::<serde_json::Value>::from_request(req, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        from_object(value).map(JsonBody)
    }
}

/// A JSON array body of `T` objects; any problem is a 400 `invalid_request_error`.
pub struct JsonArray<T>(pub Vec<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonArray<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let axum::Json(value) = axum::Json::<serde_json::Value>::from_request(req, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        let serde_json::Value::Array(items) = value else {
            return Err(ApiError::invalid("the request body must be a JSON array"));
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                from_object(item).map_err(|e| ApiError::invalid(format!("item {i}: {e}")))
            })
            .collect::<Result<Vec<T>, ApiError>>()
            .map(JsonArray)
    }
}

/// Reads `T` from a JSON object. serde would also accept an array for a struct (`[1]` as the
/// first field); an API body is an object or it is wrong.
pub fn from_object<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    }
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("invalid body: {e}")))
}

/// Query parameters; any problem with them is a 400 `invalid_request_error`.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| QueryParams(v))
            .map_err(|e| ApiError::invalid(e.body_text()))
    }
}

/// Path parameters; one that cannot be read (not UTF-8, say) is a 400 `invalid_request_error`.
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| PathParams(v))
            .map_err(|e| ApiError::invalid(e.body_text()))
    }
}

/// For `#[serde(default, deserialize_with = "present")]`: tells a field set to `null`
/// (`Some(None)`) from an absent one (`None`).
pub fn present<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    <Option<T> as serde::Deserialize>::deserialize(d).map(Some)
}

/// Items per page of a listing when the request names no `limit`.
pub(super) const DEFAULT_PAGE: usize = 100;

/// Most items per page of a listing.
pub(super) const MAX_PAGE: usize = 1_000;

/// A listing's `limit`: [`DEFAULT_PAGE`] if absent, else 1 to [`MAX_PAGE`].
pub(super) fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    match (1..=MAX_PAGE).contains(&limit) {
        true => Ok(limit),
        false => Err(ApiError::invalid(format!("limit must be 1 to {MAX_PAGE}"))),
    }
}
