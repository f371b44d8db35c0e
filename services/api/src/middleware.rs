//! The layers every request passes: [`identify`] reads the bearer token
//! (one KV get of its hash) and logs the request with its principal once
//! answered; [`require`] lets a request through a route only with the
//! role the route needs ([`crate::auth::authorize`]).

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth::{authorize, bearer, Caller, Role};
use crate::error::ApiError;
use crate::extract::BodyTimeout;
use crate::limits::{body_too_large, MAX_BODY};
use crate::logged::field;
use crate::state::AppState;

/// Who the `Authorization` header names (none: [`Caller::Nobody`]).
async fn caller_of(state: &AppState, header: Option<String>) -> Result<Caller, ApiError> {
    let token = match bearer(header.as_deref()) {
        Ok(None) => return Ok(Caller::Nobody),
        Ok(Some(t)) => t,
        Err(why) => return Ok(Caller::Refused(why)),
    };
    Ok(match state.tokens.lookup(token).await? {
        Some(record) => Caller::Known(record.principal()),
        None => Caller::Refused("the bearer token is not known (revoked, or never made)".into()),
    })
}

/// Identify the caller, answer, and log the request: method, path,
/// status, principal (a token's name, never the token) and duration.
pub async fn identify(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("\u{fffd}").to_string());
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    req.extensions_mut()
        .insert(BodyTimeout(state.limits.body_timeout));
    let checked = match body_too_large(declared, MAX_BODY) {
        Some(why) => Err(ApiError::Http {
            status: axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            message: why,
        }),
        None => caller_of(&state, authorization).await,
    };
    let (response, principal) = match checked {
        Ok(caller) => {
            let name = caller.log_name().to_string();
            req.extensions_mut().insert(caller);
            (next.run(req).await, name)
        }
        Err(e) => (e.into_response(), "-".to_string()),
    };
    let line = Access {
        method: method.as_str(),
        path: &path,
        status: response.status().as_u16(),
        principal: &principal,
        ms: started.elapsed().as_millis() as u64,
    };
    line.log();
    response
}

/// Paths that probes and scrapers call every few seconds: logged at
/// debug level, not info.
pub const PROBES: &[&str] = &["/healthz", "/readyz", "/metrics", "/health", "/api/health"];

/// One access log line.
struct Access<'a> {
    method: &'a str,
    path: &'a str,
    status: u16,
    principal: &'a str,
    ms: u64,
}

impl Access<'_> {
    fn log(&self) {
        let (method, status, ms) = (self.method, self.status, self.ms);
        let (path, principal) = (field(self.path), field(self.principal));
        let path: &str = &path;
        if PROBES.contains(&path) && status < 400 {
            tracing::debug!(target: "noetl_api::access", method = %method, path = %path, status, principal = %principal, ms, "request");
        } else {
            tracing::info!(target: "noetl_api::access", method = %method, path = %path, status, principal = %principal, ms, "request");
        }
    }
}

/// The state of a [`require`] layer: the API's state and the role needed.
#[derive(Clone)]
pub struct Needs {
    /// The API's state (its auth mode).
    pub state: AppState,
    /// The role the routes under the layer need.
    pub role: Role,
}

/// Let the request through with the [`crate::auth::Principal`] it acts as
/// (an extension for the handler), or answer 401 / 403.
pub async fn require(State(needs): State<Needs>, mut req: Request, next: Next) -> Response {
    let caller = req
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or(Caller::Nobody);
    match authorize(needs.state.mode.current(), &caller, needs.role) {
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        Err(denied) => ApiError::from(denied).into_response(),
    }
}
