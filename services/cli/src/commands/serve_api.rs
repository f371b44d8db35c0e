//! `noetl serve api`: NoETL's REST API over the mesh (`noetl-api`,
//! docs/api.md), with the mesh's `/healthz`, `/readyz` and `/metrics` on
//! the same address. It listens before it joins the mesh (a bad address
//! or certificate stops it at once), and drains on SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use noetl_api::{ApiParams, TlsFiles};

use super::common::MeshArgs;
use super::join::{join_waiting, on_signal};

/// Where the API listens without `--http-addr` / `NOETL_HTTP_ADDR`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8082";

/// The environment variable of the bootstrap token (never a flag: a
/// command line is readable by every user of the host).
pub const BOOTSTRAP_ENV: &str = "NOETL_API_BOOTSTRAP_TOKEN";

/// Options of `noetl serve api` only.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ApiArgs {
    /// `api`: serve HTTPS with this certificate chain (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// `api`: the certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// `api`: serve without tokens on an address others can reach (only
    /// when no token is configured; never in production).
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// `api`: open connections at most (default 512); one more takes the
    /// slot of the oldest one that has sent nothing, or is closed at once.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
}

impl ApiArgs {
    /// The first `api`-only flag given, if any (other services refuse it).
    pub fn given(&self) -> Option<&'static str> {
        if self.tls_cert.is_some() {
            Some("--tls-cert")
        } else if self.tls_key.is_some() {
            Some("--tls-key")
        } else if self.insecure_no_auth {
            Some("--insecure-no-auth")
        } else if self.max_connections.is_some() {
            Some("--max-connections")
        } else {
            None
        }
    }
}

/// What `noetl serve api` was given.
pub struct ApiRun {
    /// `--http-addr` / `NOETL_HTTP_ADDR` (default [`DEFAULT_ADDR`]).
    pub http_addr: Option<SocketAddr>,
    /// The `api`-only options.
    pub api: ApiArgs,
    /// The mesh to join.
    pub mesh: MeshArgs,
}

/// Serve the API until a signal, then drain.
pub async fn run(args: ApiRun) -> anyhow::Result<ExitCode> {
    let addr: SocketAddr = match args.http_addr {
        Some(a) => a,
        None => DEFAULT_ADDR.parse().expect("a valid default address"),
    };
    let tls = match (&args.api.tls_cert, &args.api.tls_key) {
        (Some(cert), Some(key)) => Some(noetl_api::load_tls(&TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        })?),
        _ => None,
    };
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("cannot listen on --http-addr / NOETL_HTTP_ADDR {addr}"))?;
    let shutdown = on_signal();
    let Some(mesh) = join_waiting(&args.mesh, &shutdown).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    tracing::info!(nats = %noetl_mesh::connect::display_urls(&mesh.config().nats_url), "joined the mesh");
    noetl_api::serve(ApiParams {
        extra: super::health_http::routes(mesh.clone()),
        mesh,
        listener,
        tls,
        bootstrap_token: std::env::var(BOOTSTRAP_ENV).ok(),
        insecure_no_auth: args.api.insecure_no_auth,
        shutdown,
        limits: noetl_api::Limits {
            max_connections: args
                .api
                .max_connections
                .unwrap_or(noetl_api::limits::MAX_CONNECTIONS),
            ..Default::default()
        },
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// The API (and the web console at `/`) that `noetl run --ui` serves for
/// its embedded mesh: on loopback, port 8082 or any free one when that is
/// taken, without tokens (the API runs open only on loopback).
pub struct LocalConsole {
    /// Where it answers, e.g. `http://127.0.0.1:8082/`.
    pub url: String,
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), noetl_api::ServeError>>,
}

impl LocalConsole {
    /// Serve the API for `mesh` on loopback.
    pub fn start(mesh: noetl_mesh::Mesh) -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind(DEFAULT_ADDR)
            .or_else(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .context("cannot listen on loopback for the console")?;
        let addr = listener.local_addr().context("the console's address")?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(noetl_api::serve(ApiParams {
            extra: super::health_http::routes(mesh.clone()),
            mesh,
            listener,
            tls: None,
            bootstrap_token: None,
            insecure_no_auth: false,
            shutdown: shutdown.clone(),
            limits: Default::default(),
        }));
        Ok(Self {
            url: format!("http://{addr}/"),
            shutdown,
            task,
        })
    }

    /// Drain and stop.
    pub async fn stop(self) {
        self.shutdown.cancel();
        match self.task.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "the console did not stop cleanly"),
            Err(e) => tracing::warn!(error = %e, "the console task failed"),
            Ok(Ok(())) => {}
        }
    }
}
