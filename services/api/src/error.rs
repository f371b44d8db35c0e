//! Errors of the API and their HTTP answers: NoETL's
//! `{"error": ..., "status": ...}` body. What the caller sent wrong is a
//! 4xx naming it; a mesh that does not answer is 503 (try again); only a
//! corrupt record or this server's own configuration is a 500. No message
//! carries a secret: the mesh's errors name keys and subjects, never values.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use noetl_mesh::catalog::CatalogError;
use noetl_mesh::credentials::CredentialError;
use noetl_mesh::error::ErrorKind;
use noetl_mesh::objects::ObjectError;
use noetl_mesh::MeshError;

use crate::auth::Denied;
use crate::contract::ErrorBody;
use crate::tokens::TokenError;

/// An error answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request cannot be read.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no token, or an unknown one.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403: not allowed.
    #[error("{0}")]
    Forbidden(String),
    /// 404: what the request names is not there.
    #[error("{0}")]
    NotFound(String),
    /// 422: the request is well-formed but cannot be done (NoETL's
    /// validation errors), with a playbook's diagnostics when it has them.
    #[error("{message}")]
    Validation {
        /// What is wrong.
        message: String,
        /// A playbook's findings, as `noetl validate --format json`.
        diagnostics: Option<serde_json::Value>,
    },
    /// 501: NoETL has it, this engine does not.
    #[error("{0}")]
    NotImplemented(String),
    /// 503: the mesh did not answer; try again.
    #[error("{0}")]
    Unavailable(String),
    /// 500: a stored record is corrupt, or this server is set up wrongly.
    #[error("{0}")]
    Internal(String),
    /// Another 4xx the HTTP layer decided (a body too large, a wrong
    /// content type).
    #[error("{message}")]
    Http {
        /// Its status.
        status: StatusCode,
        /// Why.
        message: String,
    },
}

impl ApiError {
    /// A 422 without diagnostics.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Validation {
            message: message.into(),
            diagnostics: None,
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Validation { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Http { status, .. } => *status,
        }
    }

    /// The error a mesh failure of `kind` is, saying `message`.
    pub fn of_kind(kind: ErrorKind, message: String) -> Self {
        match kind {
            ErrorKind::Transient | ErrorKind::Conflict => Self::Unavailable(message),
            ErrorKind::NotFound => Self::NotFound(message),
            ErrorKind::Invalid => Self::invalid(message),
            ErrorKind::Corrupt | ErrorKind::Config => Self::Internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            let error = self.to_string();
            tracing::error!(status = status.as_u16(), error = %crate::logged::field(&error), "request failed");
        }
        let unauthenticated = matches!(self, Self::Unauthenticated(_));
        let (error, diagnostics) = match self {
            Self::Validation {
                message,
                diagnostics,
            } => (message, diagnostics),
            other => (other.to_string(), None),
        };
        let body = Json(ErrorBody {
            message: error.clone(),
            error,
            status: status.as_u16(),
            diagnostics,
        });
        let mut response = (status, body).into_response();
        if unauthenticated {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<MeshError> for ApiError {
    fn from(e: MeshError) -> Self {
        Self::of_kind(e.kind(), e.to_string())
    }
}

impl From<CatalogError> for ApiError {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::NotFound { .. } => Self::NotFound(e.to_string()),
            CatalogError::BadPath { .. } => Self::invalid(e.to_string()),
            CatalogError::Mesh(m) => m.into(),
        }
    }
}

impl From<CredentialError> for ApiError {
    fn from(e: CredentialError) -> Self {
        Self::of_kind(e.kind(), e.to_string())
    }
}

impl From<ObjectError> for ApiError {
    fn from(e: ObjectError) -> Self {
        Self::of_kind(e.kind(), e.to_string())
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Mesh(m) => m.into(),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<Denied> for ApiError {
    fn from(d: Denied) -> Self {
        match d {
            Denied::Unauthenticated(m) => Self::Unauthenticated(m),
            forbidden @ Denied::Forbidden { .. } => Self::Forbidden(forbidden.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_failures_map_to_statuses_by_kind() {
        let table = [
            (ErrorKind::Transient, 503),
            (ErrorKind::Conflict, 503),
            (ErrorKind::NotFound, 404),
            (ErrorKind::Invalid, 422),
            (ErrorKind::Corrupt, 500),
            (ErrorKind::Config, 500),
        ];
        for (kind, status) in table {
            assert_eq!(
                ApiError::of_kind(kind, "x".into()).status().as_u16(),
                status,
                "{kind:?}"
            );
        }
    }

    #[test]
    fn a_catalog_miss_is_404_and_a_bad_path_422() {
        let miss = CatalogError::NotFound {
            path: "a/b".into(),
            version: Some(2),
        };
        assert_eq!(ApiError::from(miss).status(), StatusCode::NOT_FOUND);
        let bad = CatalogError::BadPath {
            path: "a//b".into(),
        };
        assert_eq!(
            ApiError::from(bad).status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
    }

    #[test]
    fn a_401_asks_for_a_bearer_token() {
        let r = ApiError::Unauthenticated("no token".into()).into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
