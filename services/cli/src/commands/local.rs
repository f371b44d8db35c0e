//! The local, persistent mesh of `noetl run` and the other commands used
//! without `--nats`: a private nats-server whose JetStream store lives under
//! the data dir (`NOETL_HOME`), so credentials and state persist between runs.

use anyhow::Context;
use noetl_mesh::server::{NatsServerProcess, ServerOptions};
use noetl_mesh::MeshConfig;

/// What to do when the persistent store is held by another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Use a throw-away store (a run that needs nothing stored).
    Temporary,
    /// Fail with a clear message (a command whose point is the store).
    Refuse,
}

/// What keeps a private server's store ours while the run lasts.
#[expect(dead_code, reason = "the fields are held only for their Drop")]
pub enum StoreGuard {
    /// The persistent store under the data dir, held by an exclusive lock
    /// so a second concurrent `noetl run` never shares it.
    Locked(std::fs::File),
    /// A throw-away store, removed on drop.
    Temporary(tempfile::TempDir),
}

/// A private server whose JetStream store persists under the data dir
/// (`NOETL_HOME`); if that store is held by another `noetl run` (or cannot
/// be used), a temporary one. Two servers must never share a store
/// directory: JetStream does not arbitrate that itself.
pub fn start_private_server(
    config: &MeshConfig,
    fallback: Fallback,
) -> anyhow::Result<(NatsServerProcess, StoreGuard)> {
    let persistent = config.data_dir.join("nats");
    let lock = std::fs::create_dir_all(&config.data_dir)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(config.data_dir.join("nats.lock"))
        })
        .ok()
        .filter(|f| f.try_lock().is_ok());
    let first = match lock {
        Some(lock) => match NatsServerProcess::start(ServerOptions {
            store_dir: persistent.clone(),
            port: None,
            binary: None,
        }) {
            Ok(s) => return Ok((s, StoreGuard::Locked(lock))),
            Err(e @ noetl_mesh::server::ServerError::NotFound { .. }) => {
                return Err(anyhow::anyhow!(e))
            }
            Err(e) => format!("{} failed: {e}", persistent.display()),
        },
        None => format!("{} is in use by another run", persistent.display()),
    };
    if fallback == Fallback::Refuse {
        anyhow::bail!(
            "the local store cannot be used: {first}; wait for that run to end, or pass --nats URL"
        );
    }
    let tmp = tempfile::Builder::new().prefix("noetl-run-").tempdir()?;
    let s = NatsServerProcess::start(ServerOptions {
        store_dir: tmp.path().to_path_buf(),
        port: None,
        binary: None,
    })
    .with_context(|| format!("starting a private nats-server ({first})"))?;
    Ok((s, StoreGuard::Temporary(tmp)))
}
