//! `noetl serve SERVICE`: run one service against a shared NATS until
//! SIGINT/SIGTERM, then drain in-flight messages and exit. With
//! `--http-addr` it also serves `/healthz`, `/readyz` and `/metrics`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use noetl_core::tool::Tool;
use noetl_mesh::{connect::display_urls, runtime::ServiceParams, Mesh};
use tokio_util::sync::CancellationToken;

use super::common::{all_tools, init_tracing, known_kinds, tool, MeshArgs};

/// Which service.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Service {
    /// Execution requests, arcs, completion.
    Router,
    /// Admission and dispatch of step-runs.
    Scheduler,
    /// Loop runs.
    LoopSupervisor,
    /// Tool executors (`--kind` selects the kinds; default all).
    Executor,
}

impl Service {
    /// The `service.name` its spans report (`OTEL_SERVICE_NAME` overrides).
    pub fn otel_name(self) -> &'static str {
        match self {
            Self::Router => "noetl-router",
            Self::Scheduler => "noetl-scheduler",
            Self::LoopSupervisor => "noetl-loop-supervisor",
            Self::Executor => "noetl-executor",
        }
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Arguments of `noetl serve`.
#[derive(clap::Args)]
pub struct Args {
    /// The service to run.
    #[arg(value_enum)]
    pub service: Service,
    /// Tool kinds an executor serves (repeatable; default: all known).
    #[arg(long = "kind")]
    pub kinds: Vec<String>,
    /// Messages handled at once by this replica.
    #[arg(long, default_value_t = super::common::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Serve `/healthz`, `/readyz` and `/metrics` on this address
    /// (e.g. `0.0.0.0:9090`); off unless given.
    #[arg(long, env = "NOETL_HTTP_ADDR", value_name = "ADDR")]
    pub http_addr: Option<SocketAddr>,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Serve until a signal.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let _spans = init_tracing(
        matches!(args.log_format, LogFormat::Json),
        "info",
        args.service.otel_name(),
    )?;
    for k in &args.kinds {
        if !known_kinds().any(|known| known == k) {
            bail!(
                "unknown tool kind {k:?}; known kinds: {}",
                known_kinds().collect::<Vec<_>>().join(", ")
            );
        }
    }
    // Only an executor makes tools, and only those of its kinds.
    let tools = |mesh: &noetl_mesh::MeshConfig| -> Vec<Arc<dyn Tool>> {
        if args.kinds.is_empty() {
            all_tools(mesh)
        } else {
            args.kinds.iter().filter_map(|k| tool(k, mesh)).collect()
        }
    };
    let listener = match args.http_addr {
        Some(addr) => Some(super::health_http::bind(addr).await?),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received: draining");
        signal.cancel();
    });
    let Some(mesh) = join_waiting(&args.mesh, &shutdown).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    let health = match listener {
        Some(l) => Some(super::health_http::spawn(l, mesh.clone())?),
        None => None,
    };
    let params = ServiceParams {
        mesh,
        concurrency: args.concurrency,
        shutdown,
    };
    tracing::info!(service = ?args.service, nats = %display_urls(&params.mesh.config().nats_url),
        replicas = params.mesh.config().replicas, "serving");
    let served = match args.service {
        Service::Router => noetl_router::serve(params).await,
        Service::Scheduler => noetl_scheduler::serve(params).await,
        Service::LoopSupervisor => noetl_loop_supervisor::serve(params).await,
        Service::Executor => {
            let tools = tools(params.mesh.config());
            noetl_executor::serve(noetl_executor::ExecutorParams {
                service: params,
                tools,
            })
            .await
        }
    };
    // Drained (or failed): only now stop answering probes.
    if let Some(h) = health {
        h.stop().await;
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Join the mesh, waiting for NATS: a service started before its server,
/// or while it restarts, retries with backoff (logging each failure)
/// instead of exiting; a configuration error ends it at once. `None`
/// when a signal came first.
async fn join_waiting(
    args: &MeshArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Mesh>> {
    let config = args.config();
    let url = display_urls(&config.nats_url);
    let mut attempt = 0u32;
    loop {
        match Mesh::connect(config.clone()).await {
            Ok(mesh) => return Ok(Some(mesh)),
            // Only what trying again can mend is retried (a credentials
            // outage, NATS restarting): a configuration error ends it.
            Err(e) if e.kind() == noetl_mesh::error::ErrorKind::Config => {
                return Err(anyhow::Error::new(e).context(format!("joining the mesh at {url}")))
            }
            Err(e) => {
                let wait = join_backoff(attempt);
                tracing::warn!(nats = %url, attempt = attempt + 1, retry_in_ms = wait.as_millis() as u64,
                    error = %e, "cannot join the mesh yet; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(wait) => {}
                }
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

/// Delay before the next attempt to join: 250 ms doubling to 5 s.
fn join_backoff(attempt: u32) -> Duration {
    noetl_mesh::backoff::Backoff {
        first: Duration::from_millis(250),
        max: Duration::from_secs(5),
    }
    .delay(attempt.saturating_add(1))
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joining_backs_off_from_a_quarter_second_to_five_seconds() {
        let waits: Vec<u64> = (0..8).map(|a| join_backoff(a).as_millis() as u64).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
        assert_eq!(join_backoff(u32::MAX), Duration::from_secs(5));
    }
}
