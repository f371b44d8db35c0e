//! Extractors whose failures are JSON errors naming what was wrong (axum's
//! own answer in plain text): a JSON body (read whatever the content type,
//! so `curl -d` works), an optional one, query parameters, path segments.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON request body.
pub struct Body<T>(pub T);

/// A JSON request body that may be empty (then `T::default()`).
pub struct OptionalBody<T>(pub T);

/// Query parameters.
pub struct Params<T>(pub T);

/// Path parameters.
pub struct Segments<T>(pub T);

/// Parse a JSON body: 400 when it is not JSON, 422 when it is JSON of the
/// wrong shape (the message names the field, line and column).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data if at != "." => {
                ApiError::invalid(format!("request body: {at}: {inner}"))
            }
            serde_json::error::Category::Data => {
                ApiError::invalid(format!("request body: {inner}"))
            }
            _ => ApiError::BadRequest(format!("request body is not JSON: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::BadRequest(format!("request body is not JSON: {e}")))?;
    Ok(value)
}

async fn bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state)
        .await
        .map_err(|e| ApiError::Http {
            status: e.status(),
            message: e.body_text(),
        })
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let raw = bytes(req, state).await?;
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::BadRequest(
                "this needs a JSON request body".into(),
            ));
        }
        parse(&raw).map(Body)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let raw = bytes(req, state).await?;
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalBody(T::default()));
        }
        parse(&raw).map(OptionalBody)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Params(v))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Segments<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| Segments(v))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Thing {
        #[allow(dead_code)]
        n: u32,
    }

    #[test]
    fn not_json_is_400_and_the_wrong_shape_422_naming_the_field() {
        let e = parse::<Thing>(b"{n: 1").unwrap_err();
        assert_eq!(e.status().as_u16(), 400, "{e}");
        let e = parse::<Thing>(br#"{"m": 1}"#).unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
        assert!(e.to_string().contains("missing field `n`"), "{e}");
        let e = parse::<Thing>(br#"{"n": "one"}"#).unwrap_err();
        assert!(e.to_string().contains("n: invalid type"), "{e}");
        let e = parse::<Thing>(br#"{"n": 1} x"#).unwrap_err();
        assert_eq!(e.status().as_u16(), 400, "trailing bytes: {e}");
        assert!(parse::<Thing>(br#"{"n": 1}"#).is_ok());
    }
}
