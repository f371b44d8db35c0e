//! Serving the API: tokens set up (the bootstrap token stored hashed),
//! the auth mode decided for the address, plain HTTP or TLS (rustls with
//! the ring provider the rest of the mesh uses), and a drain on shutdown:
//! readiness given up, event streams ended, open requests finished.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum_server::accept::DefaultAcceptor;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use axum_server::Handle;
use futures::StreamExt;
use noetl_mesh::Mesh;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

use crate::auth::{startup_mode, AuthMode, ModeCell, Unprotected};
use crate::limits::{Limits, Slots};
use crate::state::{AppState, Shared};
use crate::tokens::{TokenError, Tokens};

/// How long a drain waits for open requests.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Why the API could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No token, and an address others can reach.
    #[error(transparent)]
    Unprotected(#[from] Unprotected),
    /// The tokens could not be read or the bootstrap token stored.
    #[error(transparent)]
    Tokens(#[from] TokenError),
    /// The certificate or key cannot be used.
    #[error("TLS: {file}: {message}")]
    Tls {
        /// The file (or `certificate and key`).
        file: String,
        /// Why.
        message: String,
    },
    /// Listening or serving failed.
    #[error("serving the API on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A certificate chain and its key, PEM files (`--tls-cert`, `--tls-key`).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

fn tls_err(file: &Path, e: impl std::fmt::Display) -> ServeError {
    ServeError::Tls {
        file: file.display().to_string(),
        message: e.to_string(),
    }
}

/// Read the certificate and key into a server configuration (before the
/// API joins the mesh, so a bad file stops it at once).
pub fn load_tls(files: &TlsFiles) -> Result<RustlsConfig, ServeError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| tls_err(&files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err(&files.cert, e))?;
    if certs.is_empty() {
        return Err(tls_err(&files.cert, "no PEM certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| tls_err(&files.key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(&files.cert, e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServeError::Tls {
            file: "certificate and key".into(),
            message: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(RustlsConfig::from_config(Arc::new(config)))
}

/// What [`serve`] needs.
pub struct ApiParams {
    /// The mesh (joined; its buckets exist).
    pub mesh: Mesh,
    /// Where to listen (bound before joining the mesh).
    pub listener: TcpListener,
    /// Serve HTTPS with this configuration ([`load_tls`]).
    pub tls: Option<RustlsConfig>,
    /// `NOETL_API_BOOTSTRAP_TOKEN`: stored hashed as the admin token
    /// `bootstrap`.
    pub bootstrap_token: Option<String>,
    /// Serve without tokens on a non-loopback address.
    pub insecure_no_auth: bool,
    /// Routes served alongside (the mesh's `/healthz`, `/readyz`, `/metrics`).
    pub extra: Router,
    /// Cancelled to drain and stop.
    pub shutdown: CancellationToken,
    /// Timeouts and the connection limit ([`crate::limits`]).
    pub limits: Limits,
}

/// Set up the tokens and decide the auth mode for `addr` at the start.
async fn auth_mode(p: &ApiParams, addr: SocketAddr) -> Result<ModeCell, ServeError> {
    let tokens = Tokens::new(p.mesh.tokens_kv().clone());
    if let Some(t) = p.bootstrap_token.as_deref().filter(|t| !t.is_empty()) {
        tokens.install_bootstrap(t).await?;
        tracing::info!("NOETL_API_BOOTSTRAP_TOKEN stored (hashed) as the admin token `bootstrap`");
    }
    let has_tokens = tokens.any().await?;
    let mode = startup_mode(addr, has_tokens, p.insecure_no_auth)?;
    match mode {
        AuthMode::Required => tracing::info!(%addr, "API requests need a bearer token"),
        AuthMode::Open if addr.ip().is_loopback() => tracing::warn!(
            %addr,
            "no API token is configured: the API runs WITHOUT AUTHENTICATION, on loopback only"
        ),
        AuthMode::Open => tracing::warn!(
            %addr,
            "--insecure-no-auth: the API runs WITHOUT AUTHENTICATION on an address others can reach"
        ),
    }
    Ok(ModeCell::new(addr, has_tokens, p.insecure_no_auth))
}

/// Follow the tokens bucket while the API runs: a token made (or the last
/// one revoked) changes the auth mode at once, without a restart.
fn follow_tokens(state: AppState, shutdown: CancellationToken) {
    tokio::spawn(async move {
        loop {
            let watched = state.mesh.tokens_kv().watch_all().await;
            // Read after the watch starts: no change falls in between.
            if let Ok(any) = state.tokens.any().await {
                changed(&state, any);
            }
            match watched {
                Ok(mut updates) => loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        next = updates.next() => match next {
                            Some(Ok(_)) => {
                                if let Ok(any) = state.tokens.any().await {
                                    changed(&state, any);
                                }
                            }
                            _ => break,
                        },
                    }
                },
                Err(e) => tracing::warn!(error = %e, "cannot follow the API tokens; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });
}

/// Log a change of the auth mode.
fn changed(state: &AppState, has_tokens: bool) {
    match state.mode.tokens_present(has_tokens) {
        Some(AuthMode::Required) => {
            tracing::warn!("an API token exists now: requests need a bearer token")
        }
        Some(AuthMode::Open) => {
            tracing::warn!("the last API token was revoked: the API runs WITHOUT AUTHENTICATION")
        }
        None => {}
    }
}

/// Serve the API until `p.shutdown`, then drain: `/readyz` says
/// `draining`, event streams end, open requests get [`DRAIN_GRACE`].
pub async fn serve(p: ApiParams) -> Result<(), ServeError> {
    let addr = p.listener.local_addr().map_err(|source| ServeError::Io {
        addr: "the listener".into(),
        source,
    })?;
    let mode = auth_mode(&p, addr).await?;
    let readiness = p.mesh.health().register("api");
    let state = AppState::new(Shared {
        mesh: p.mesh.clone(),
        tokens: Tokens::new(p.mesh.tokens_kv().clone()),
        mode,
        started: Instant::now(),
        draining: CancellationToken::new(),
        step_statuses: crate::state::StepStatusCache::new(4096),
        view: Default::default(),
        ctx_view: Default::default(),
        step_order: noetl_mesh::cache::Bounded::new(crate::view::CAPACITY),
        limits: p.limits,
        log_folds: tokio::sync::Semaphore::new(crate::state::LOG_FOLDS),
    });
    crate::view::follow(p.mesh.clone(), state.view.clone(), p.shutdown.clone());
    crate::view::follow_ctx(p.mesh.clone(), state.ctx_view.clone(), p.shutdown.clone());
    follow_tokens(state.clone(), p.shutdown.clone());
    let app = crate::routes::router(state.clone(), p.extra);
    let handle: Handle<SocketAddr> = Handle::new();
    let drain = handle.clone();
    let shutdown = p.shutdown.clone();
    let ready = readiness.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        ready.not_ready("draining");
        state.draining.cancel();
        drain.graceful_shutdown(Some(DRAIN_GRACE));
    });
    readiness.ready();
    let scheme = if p.tls.is_some() { "https" } else { "http" };
    tracing::info!(%addr, scheme, "serving the API");
    let io = |source| ServeError::Io {
        addr: addr.to_string(),
        source,
    };
    let limits = p.limits;
    let mut server = axum_server::from_tcp(p.listener)
        .map_err(io)?
        .handle(handle)
        .first_request_timeout(limits.header_timeout);
    server
        .http_builder()
        .http1()
        .header_read_timeout(limits.header_timeout);
    let slots = Slots::new(DefaultAcceptor::new(), limits.max_connections);
    let served = match p.tls {
        Some(tls) => {
            let tls = RustlsAcceptor::new(tls).acceptor(slots);
            server.acceptor(tls).serve(app.into_make_service()).await
        }
        None => server.acceptor(slots).serve(app.into_make_service()).await,
    };
    drop(readiness);
    served.map_err(io)?;
    tracing::info!(%addr, "API stopped");
    Ok(())
}
