//! The `--http-addr` server of `noetl serve`: `/healthz`, `/readyz` and
//! `/metrics` over the process's [`noetl_mesh::health::Health`]. It stops
//! after the services have drained, so `/readyz` reports the drain.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use noetl_mesh::health::{liveness, METRICS_CONTENT_TYPE};
use noetl_mesh::Mesh;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a stop waits for open scrapes to finish.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Listen on `addr` (before joining the mesh, so a bad address fails fast).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on --http-addr / NOETL_HTTP_ADDR {addr}"))
}

/// A running health server.
pub struct HealthServer {
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
    addr: SocketAddr,
}

/// `/healthz`, `/readyz` and `/metrics` of `mesh`, as routes (served by
/// [`spawn`], and by `noetl serve api` beside its own).
pub fn routes(mesh: Mesh) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(mesh)
}

/// Serve the endpoints for `mesh` on `listener` until [`HealthServer::stop`].
pub fn spawn(listener: TcpListener, mesh: Mesh) -> anyhow::Result<HealthServer> {
    let addr = listener.local_addr().context("health server address")?;
    let app = routes(mesh);
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stopped.cancelled().await })
            .await
    });
    tracing::info!(%addr, "serving /healthz, /readyz, /metrics");
    Ok(HealthServer { stop, task, addr })
}

impl HealthServer {
    /// Stop accepting, let open requests finish (at most a few seconds).
    pub async fn stop(self) {
        self.stop.cancel();
        match tokio::time::timeout(STOP_GRACE, self.task).await {
            Ok(Ok(Ok(()))) => tracing::info!(addr = %self.addr, "health server stopped"),
            Ok(Ok(Err(e))) => {
                tracing::warn!(addr = %self.addr, error = %e, "health server failed")
            }
            Ok(Err(e)) => tracing::warn!(addr = %self.addr, error = %e, "health server panicked"),
            Err(_) => tracing::warn!(addr = %self.addr, "health server did not stop in time"),
        }
    }
}

fn verdict(result: Result<(), String>, ok: &str) -> Response {
    match result {
        Ok(()) => (StatusCode::OK, format!("{ok}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn healthz(State(mesh): State<Mesh>) -> Response {
    verdict(liveness(&mesh.client().connection_state()), "ok")
}

async fn readyz(State(mesh): State<Mesh>) -> Response {
    let state = mesh.client().connection_state();
    verdict(mesh.health().ready(&state), "ready")
}

async fn metrics(State(mesh): State<Mesh>) -> Response {
    let state = mesh.client().connection_state();
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        mesh.health().render_metrics(&state),
    )
        .into_response()
}
