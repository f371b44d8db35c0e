//! `noetl serve SERVICE`: run one service against a shared NATS until
//! SIGINT/SIGTERM, then drain in-flight messages and exit. With
//! `--http-addr` it also serves `/healthz`, `/readyz` and `/metrics`
//! (`noetl serve api` serves its REST API there too: `serve_api`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use noetl_core::tool::Tool;
use noetl_mesh::{connect::display_urls, runtime::ServiceParams};

use super::common::{all_tools, init_tracing, known_kinds, tool, MeshArgs};
use super::join::{join_waiting, on_signal};
use super::serve_api::{ApiArgs, ApiRun};

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
    /// NoETL's REST API over the mesh (docs/api.md).
    Api,
    /// Cron schedules: starts each tick's execution once (docs/operations.md).
    Timer,
}

impl Service {
    /// The `service.name` its spans report (`OTEL_SERVICE_NAME` overrides).
    pub fn otel_name(self) -> &'static str {
        match self {
            Self::Router => "noetl-router",
            Self::Scheduler => "noetl-scheduler",
            Self::LoopSupervisor => "noetl-loop-supervisor",
            Self::Executor => "noetl-executor",
            Self::Api => "noetl-api",
            Self::Timer => "noetl-timer",
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
    /// (e.g. `0.0.0.0:9090`); off unless given. `api`: where it serves
    /// (default 127.0.0.1:8082).
    #[arg(long, env = "NOETL_HTTP_ADDR", value_name = "ADDR")]
    pub http_addr: Option<SocketAddr>,
    #[command(flatten)]
    pub api: ApiArgs,
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
    if let Service::Api = args.service {
        return super::serve_api::run(ApiRun {
            http_addr: args.http_addr,
            api: args.api,
            mesh: args.mesh,
        })
        .await;
    }
    if let Some(flag) = args.api.given() {
        bail!("{flag} is an option of `noetl serve api` only");
    }
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
    let shutdown = on_signal();
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
        Service::Timer => noetl_timer::serve(params).await,
        Service::Executor => {
            let tools = tools(params.mesh.config());
            noetl_executor::serve(noetl_executor::ExecutorParams {
                service: params,
                tools,
            })
            .await
        }
        Service::Api => unreachable!("served above"),
    };
    // Drained (or failed): only now stop answering probes.
    if let Some(h) = health {
        h.stop().await;
    }
    served?;
    Ok(ExitCode::SUCCESS)
}
