//! Extractors whose failures are JSON errors naming what was wrong (axum's
//! own answer in plain text): a JSON body (read whatever the content type,
//! so `curl -d` works, and within the body timeout), an optional one, query
//! parameters, path segments, and the path parameters every route checks
//! before it touches storage (an execution id, a step name, a signal name,
//! a credential name).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::shape::params;

/// How long a request body may take to arrive when no [`BodyTimeout`] is
/// set on the request.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long this request's body may take to arrive (a request extension
/// the API's layers set from its limits).
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeout(pub Duration);

/// An execution id from the path (`{id}`), checked: 400 naming it
/// otherwise.
pub struct ExecutionId(pub String);

/// An execution id and a step name from the path (`{id}` and `{step}`),
/// both checked.
pub struct ExecutionAndName(pub String, pub String);

/// An execution id and a signal name from the path (`{id}` and `{name}`),
/// both checked by their format.
pub struct ExecutionAndSignal(pub String, pub String);

/// A credential name from the path (`{name}`), checked.
pub struct CredentialName(pub String);

/// A JSON request body.
pub struct Body<T>(pub T);

/// A JSON request body that may be empty (then `T::default()`).
pub struct OptionalBody<T>(pub T);

/// A request body of any JSON value (an object, an array, a number...)
/// that may be empty (then `null`).
pub struct AnyJson(pub serde_json::Value);

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

/// Parse a body that must be a JSON object (every body of this API but a
/// signal's): an array or another value is 422, though serde would read an
/// array as a struct's fields in order.
pub fn parse_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        parse::<serde_json::Value>(bytes)?;
        return Err(ApiError::invalid("request body: must be a JSON object"));
    }
    parse(bytes)
}

async fn bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let within = req
        .extensions()
        .get::<BodyTimeout>()
        .map_or(BODY_TIMEOUT, |t| t.0);
    match tokio::time::timeout(within, Bytes::from_request(req, state)).await {
        Ok(read) => read.map_err(|e| ApiError::Http {
            status: e.status(),
            message: e.body_text(),
        }),
        Err(_) => Err(ApiError::Http {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "the request body did not arrive within {} s",
                within.as_secs_f64()
            ),
        }),
    }
}

/// The path parameters of a request, in route order: 400 when they do not
/// decode (e.g. percent-encoded bytes that are not UTF-8).
async fn path_params<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
) -> Result<Vec<(String, String)>, ApiError> {
    Path::<Vec<(String, String)>>::from_request_parts(parts, state)
        .await
        .map(|Path(v)| v)
        .map_err(|e| ApiError::BadRequest(e.body_text()))
}

/// The value of the one path parameter `want`.
fn param(found: &[(String, String)], want: &str) -> Result<String, ApiError> {
    found
        .iter()
        .find(|(k, _)| k == want)
        .map(|(_, v)| v.clone())
        .ok_or_else(|| ApiError::Internal(format!("the route has no path parameter `{want}`")))
}

impl<S: Send + Sync> FromRequestParts<S> for ExecutionId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let id = param(&path_params(parts, state).await?, "id")?;
        params::execution_id(&id).map_err(ApiError::BadRequest)?;
        Ok(Self(id))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ExecutionAndName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let found = path_params(parts, state).await?;
        let id = param(&found, "id")?;
        params::execution_id(&id).map_err(ApiError::BadRequest)?;
        let (key, value) = found
            .iter()
            .find(|(k, _)| k != "id")
            .cloned()
            .ok_or_else(|| ApiError::Internal("the route has no name parameter".into()))?;
        params::name(&key, &value, params::MAX_NAME).map_err(ApiError::BadRequest)?;
        Ok(Self(id, value))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ExecutionAndSignal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let found = path_params(parts, state).await?;
        let id = param(&found, "id")?;
        params::execution_id(&id).map_err(ApiError::BadRequest)?;
        let name = param(&found, "name")?;
        params::signal_name(&name).map_err(ApiError::BadRequest)?;
        Ok(Self(id, name))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for CredentialName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let name = param(&path_params(parts, state).await?, "name")?;
        params::name("name", &name, crate::shape::credentials::MAX_NAME)
            .map_err(ApiError::BadRequest)?;
        Ok(Self(name))
    }
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
        parse_object(&raw).map(Body)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let raw = bytes(req, state).await?;
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalBody(T::default()));
        }
        parse_object(&raw).map(OptionalBody)
    }
}

impl<S: Send + Sync> FromRequest<S> for AnyJson {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let raw = bytes(req, state).await?;
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(AnyJson(serde_json::Value::Null));
        }
        parse(&raw).map(AnyJson)
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

    #[test]
    fn a_body_that_must_be_an_object_refuses_an_array_in_its_place() {
        // serde alone reads `[1]` as the struct's fields in order.
        assert!(parse::<Thing>(b"[1]").is_ok());
        let e = parse_object::<Thing>(b" [1]").unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
        assert!(e.to_string().contains("JSON object"), "{e}");
        assert_eq!(
            parse_object::<Thing>(b"[1").unwrap_err().status().as_u16(),
            400
        );
        assert!(parse_object::<Thing>(br#" {"n": 1}"#).is_ok());
        let batch = parse_object::<crate::contract::execute::BatchExecuteRequest>(
            br#"{"executions": [[null, null]]}"#,
        )
        .unwrap_err();
        assert_eq!(batch.status().as_u16(), 422, "{batch}");
    }
}
