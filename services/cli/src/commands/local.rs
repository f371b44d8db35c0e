//! The local, persistent mesh of `noetl run` and the other commands used
//! without `--nats`: a private nats-server whose JetStream store lives under
//! the data dir (`NOETL_HOME`), so credentials and state persist between runs.

use anyhow::Context;
use clap::Args as ClapArgs;
use noetl_mesh::server::{NatsServerProcess, ServerOptions, SyncPolicy};
use noetl_mesh::{Mesh, MeshConfig};

/// Where a store command (`credential`, `playbook`) works.
#[derive(ClapArgs, Debug, Clone)]
pub struct Target {
    /// NATS servers (comma-separated) of an existing mesh; without it, and
    /// without `NOETL_NATS_URL` (read as this flag), the local store of
    /// `noetl run`.
    #[arg(long, env = "NOETL_NATS_URL", value_name = "URL[,URL...]")]
    pub nats: Option<String>,
    /// Subject / stream / bucket prefix.
    #[arg(long, env = "NOETL_PREFIX", default_value = noetl_mesh::config::DEFAULT_PREFIX)]
    pub prefix: String,
    #[command(flatten)]
    pub auth: super::nats_auth::NatsAuthArgs,
}

/// A mesh joined for a store command, and the private server (if any)
/// that must outlive it.
pub struct Joined {
    /// The mesh.
    pub mesh: Mesh,
    // Field order matters: the connection closes, then the server stops,
    // then the store is released.
    _server: Option<NatsServerProcess>,
    _store: Option<StoreGuard>,
}

impl Target {
    /// Join the existing mesh at `--nats` (creating nothing there), or
    /// start a private server on the persistent local store (refusing a
    /// temporary one: the point is the store).
    pub async fn join(&self) -> anyhow::Result<Joined> {
        let mut config = MeshConfig {
            prefix: self.prefix.clone(),
            ..MeshConfig::from_env()
        };
        self.auth.apply(&mut config);
        let (server, store) = match &self.nats {
            Some(url) => {
                config.nats_url = url.clone();
                (None, None)
            }
            None => {
                let (server, store) = start_private_server(PrivateServer {
                    config: &config,
                    fallback: Fallback::Refuse,
                    sync: SyncPolicy::Interval,
                })?;
                config.nats_url = server.url();
                // A private single server: no credentials, one replica,
                // whatever the shell has set up for a cluster.
                config.auth = Default::default();
                config.replicas = 1;
                (Some(server), Some(store))
            }
        };
        let joined = if server.is_some() {
            Mesh::connect(config.clone()).await
        } else {
            Mesh::attach(config.clone()).await
        };
        let mesh = joined.with_context(|| {
            format!(
                "joining the mesh at {}",
                noetl_mesh::connect::display_urls(&config.nats_url)
            )
        })?;
        Ok(Joined {
            mesh,
            _server: server,
            _store: store,
        })
    }
}

/// The private servers (and their stores) that client commands started
/// with `--local`, held until [`release`] (at the end of `main`), so the
/// command's mesh outlives every use of it.
static HELD: std::sync::Mutex<Vec<(NatsServerProcess, StoreGuard)>> =
    std::sync::Mutex::new(Vec::new());

/// Join the mesh kept in the local store of `noetl run` (`NOETL_HOME`):
/// what `--local` on a client command does, so an execution `noetl run`
/// ran can be looked at (`exec show`, `why`, `resume`) after it ended.
/// Creates nothing: a store where no run ever ran is an error naming it.
pub async fn attach_local(mut config: MeshConfig) -> anyhow::Result<Mesh> {
    let (server, store) = start_private_server(PrivateServer {
        config: &config,
        fallback: Fallback::Refuse,
        sync: SyncPolicy::Interval,
    })?;
    let dir = config.data_dir.join("nats");
    config.nats_url = server.url();
    config.auth = Default::default();
    config.replicas = 1;
    let mesh = Mesh::attach(config).await.with_context(|| {
        format!(
            "joining the local store of noetl run ({}); has a run been made with this NOETL_HOME?",
            dir.display()
        )
    });
    HELD.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((server, store));
    mesh
}

/// Stop what [`attach_local`] started (the connections closed first, by
/// the commands that ended).
pub fn release() {
    let held = std::mem::take(
        &mut *HELD
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    drop(held);
}

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

/// What [`start_private_server`] needs.
pub struct PrivateServer<'a> {
    /// Settings (the data dir).
    pub config: &'a MeshConfig,
    /// What to do when the persistent store is taken.
    pub fallback: Fallback,
    /// How JetStream writes to disk (`noetl run --sync`).
    pub sync: SyncPolicy,
}

/// A private server whose JetStream store persists under the data dir
/// (`NOETL_HOME`); if that store is held by another `noetl run` (or cannot
/// be used), a temporary one. Two servers must never share a store
/// directory: JetStream does not arbitrate that itself.
pub fn start_private_server(
    p: PrivateServer<'_>,
) -> anyhow::Result<(NatsServerProcess, StoreGuard)> {
    let PrivateServer {
        config,
        fallback,
        sync,
    } = p;
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
        Some(lock) => match NatsServerProcess::start_owned(
            ServerOptions {
                store_dir: persistent.clone(),
                port: None,
                binary: None,
            },
            sync,
        ) {
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
    // Said once, on stderr: a keychain or catalog lookup failing later in
    // this run is then not a mystery.
    eprintln!(
        "note: {first}; this run uses a temporary store, without the credentials and playbooks stored locally"
    );
    let tmp = tempfile::Builder::new().prefix("noetl-run-").tempdir()?;
    let s = NatsServerProcess::start_owned(
        ServerOptions {
            store_dir: tmp.path().to_path_buf(),
            port: None,
            binary: None,
        },
        sync,
    )
    .with_context(|| format!("starting a private nats-server ({first})"))?;
    Ok((s, StoreGuard::Temporary(tmp)))
}
