//! `GET /health` and `GET /api/health` (NoETL's probes; `/healthz`,
//! `/readyz` and `/metrics` are the mesh's, served alongside).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use noetl_mesh::health::liveness;

use crate::contract::health::{ApiHealthResponse, HealthCheckResponse};
use crate::state::AppState;

/// The process answers.
#[utoipa::path(get, path = "/health", tag = "health",
    responses((status = 200, description = "The API answers", body = HealthCheckResponse)))]
pub async fn health() -> Json<HealthCheckResponse> {
    Json(HealthCheckResponse {
        status: "ok".into(),
    })
}

/// The process and its NATS connection: 503 while NATS is not connected.
#[utoipa::path(get, path = "/api/health", tag = "health",
    responses(
        (status = 200, description = "Connected to NATS", body = ApiHealthResponse),
        (status = 503, description = "NATS not connected", body = ApiHealthResponse)))]
pub async fn api_health(State(state): State<AppState>) -> (StatusCode, Json<ApiHealthResponse>) {
    let up = liveness(&state.mesh.client().connection_state()).is_ok();
    let body = ApiHealthResponse {
        status: if up { "ok" } else { "unhealthy" }.into(),
        nats: if up { "connected" } else { "disconnected" }.into(),
        uptime_seconds: state.started.elapsed().as_secs(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let code = if up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body))
}
