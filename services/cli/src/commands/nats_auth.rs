//! The NATS credential and TLS flags every mesh-joining command takes (a
//! leaf: `common` and `local` both use it).

use std::path::PathBuf;

use noetl_mesh::MeshConfig;

/// NATS credentials and TLS as flags; each overrides its environment
/// variable (`NOETL_NATS_*`, else the `nats` CLI's `NATS_*`). Passwords and
/// tokens are read from the environment only (`NOETL_NATS_PASSWORD`,
/// `NOETL_NATS_TOKEN`), never from a command line others can list.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct NatsAuthArgs {
    /// A NATS `.creds` file (JWT and nkey seed) [env: NOETL_NATS_CREDS, NATS_CREDS].
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// A file holding an nkey user seed [env: NOETL_NATS_NKEY, NATS_NKEY].
    #[arg(long, value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,
    /// User name; the password comes from NOETL_NATS_PASSWORD [env: NOETL_NATS_USER, NATS_USER].
    #[arg(long, value_name = "USER")]
    pub nats_user: Option<String>,
    /// CA certificate (PEM) the server must present a chain to [env: NOETL_NATS_CA, NATS_CA].
    #[arg(long, value_name = "FILE")]
    pub nats_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS [env: NOETL_NATS_CERT, NATS_CERT].
    #[arg(long, value_name = "FILE", requires = "nats_key")]
    pub nats_cert: Option<PathBuf>,
    /// Client key (PEM) [env: NOETL_NATS_KEY, NATS_KEY].
    #[arg(long, value_name = "FILE", requires = "nats_cert")]
    pub nats_key: Option<PathBuf>,
    /// Refuse a connection that is not TLS.
    #[arg(long)]
    pub nats_tls: bool,
}

impl NatsAuthArgs {
    /// Overlay the flags that were given on `config`.
    pub fn apply(&self, config: &mut MeshConfig) {
        let a = &mut config.auth;
        if let Some(v) = &self.nats_creds {
            a.creds_file = Some(v.clone());
        }
        if let Some(v) = &self.nats_nkey {
            a.nkey_seed_file = Some(v.clone());
        }
        if let Some(v) = &self.nats_user {
            a.user = Some(v.clone());
        }
        if let Some(v) = &self.nats_ca {
            a.tls_ca = Some(v.clone());
        }
        if let Some(v) = &self.nats_cert {
            a.tls_cert = Some(v.clone());
        }
        if let Some(v) = &self.nats_key {
            a.tls_key = Some(v.clone());
        }
        a.require_tls |= self.nats_tls;
    }
}
