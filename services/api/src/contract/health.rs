//! `GET /health` and `GET /api/health`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /health`: the process answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HealthCheckResponse {
    /// Always `ok`.
    pub status: String,
}

/// `GET /api/health`: the process and its NATS connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApiHealthResponse {
    /// `ok`, or `unhealthy` (with 503) while NATS is not connected.
    pub status: String,
    /// `connected` or `disconnected`.
    pub nats: String,
    /// Seconds since the API started.
    pub uptime_seconds: u64,
    /// The `noetl` version.
    pub version: String,
}
