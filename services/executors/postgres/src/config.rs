//! Task fields and credentials → what to run and where.

use std::time::Duration;

use noetl_core::tool::AuthCredential;
use serde_json::{Map, Value};

/// Default `spec.timeout` of a statement batch.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default connect timeout.
pub const DEFAULT_CONNECT: Duration = Duration::from_secs(10);

/// Why a task cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No `auth` and no `connection`.
    #[error("the task needs `auth: <keychain entry of kind postgres_credential>` (or `connection: postgresql://...`)")]
    NoTarget,
    /// The credential has another kind.
    #[error("credential `{name}` is of kind {kind}; postgres `auth` takes postgres_credential")]
    Kind {
        /// Credential name.
        name: String,
        /// Its kind.
        kind: String,
    },
    /// The credential lacks a field.
    #[error("credential `{name}` has no `{field}`")]
    Field {
        /// Credential name.
        name: String,
        /// Missing field.
        field: &'static str,
    },
    /// `connection` does not parse (the text is not repeated: it may hold a
    /// password).
    #[error("`connection` is not a valid postgresql:// URL or key=value string")]
    Connection,
    /// `sslmode` asks for TLS, which this tool does not speak.
    #[error(
        "sslmode {0:?} needs TLS, which the postgres tool does not support; use disable or prefer"
    )]
    Tls(String),
    /// `command` / `params` unusable.
    #[error(transparent)]
    Command(#[from] noetl_core::sql::CommandError),
    /// `spec.timeout` unusable.
    #[error("`spec.timeout` must be seconds or {{connect, read}}, got {0}")]
    Timeout(String),
}

/// Where to connect, and a label for messages (never the password).
#[derive(Clone)]
pub struct Target {
    /// Connection settings.
    pub config: tokio_postgres::Config,
    /// `<credential> (host:port/db)`.
    pub label: String,
    /// Identifies the pool: a digest of every setting the pool is built
    /// from — the credential or connection string (password included, so
    /// a rotated password gets a new pool) and the connect timeout (which
    /// bounds the pool's waits), so a task never inherits another task's
    /// timeouts.
    pub pool_key: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Target({})", self.label)
    }
}

fn field(c: &AuthCredential, names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| match c.data.get(*n) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

/// The connection target of a task.
pub fn target(
    config: &Map<String, Value>,
    auth: Option<&AuthCredential>,
    connect: Duration,
) -> Result<Target, ConfigError> {
    use sha2::Digest;
    let (mut pg, label, material) = match (auth, config.get("connection").and_then(Value::as_str)) {
        (Some(c), _) => {
            if c.kind != "postgres_credential" {
                return Err(ConfigError::Kind {
                    name: c.name.clone(),
                    kind: c.kind.clone(),
                });
            }
            let need = |names: &[&str], f: &'static str| {
                field(c, names).ok_or_else(|| ConfigError::Field {
                    name: c.name.clone(),
                    field: f,
                })
            };
            let host = field(c, &["host"]).unwrap_or_else(|| "127.0.0.1".into());
            let port: u16 = field(c, &["port"])
                .map(|p| {
                    p.parse().map_err(|_| ConfigError::Field {
                        name: c.name.clone(),
                        field: "port",
                    })
                })
                .transpose()?
                .unwrap_or(5432);
            let user = need(&["user", "username"], "user")?;
            let db = field(c, &["database", "dbname", "db"]).unwrap_or_else(|| user.clone());
            if let Some(mode) = field(c, &["sslmode"]) {
                if !matches!(mode.as_str(), "disable" | "prefer" | "allow") {
                    return Err(ConfigError::Tls(mode));
                }
            }
            let mut pg = tokio_postgres::Config::new();
            pg.host(&host).port(port).user(&user).dbname(&db);
            if let Some(pw) = field(c, &["password"]) {
                pg.password(pw);
            }
            let label = format!("`{}` ({host}:{port}/{db})", c.name);
            (pg, label, c.data.to_string())
        }
        (None, Some(url)) => {
            let pg: tokio_postgres::Config = url.parse().map_err(|_| ConfigError::Connection)?;
            if pg.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
                return Err(ConfigError::Tls("require".into()));
            }
            let host = pg
                .get_hosts()
                .first()
                .map(|h| match h {
                    tokio_postgres::config::Host::Tcp(s) => s.clone(),
                    #[cfg(unix)]
                    tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                })
                .unwrap_or_default();
            let label = format!(
                "connection ({host}/{})",
                pg.get_dbname().unwrap_or_default()
            );
            (pg, label, url.to_string())
        }
        (None, None) => return Err(ConfigError::NoTarget),
    };
    pg.connect_timeout(connect);
    pg.application_name("noetl");
    let mut digest = sha2::Sha256::new();
    digest.update(material.as_bytes());
    digest.update(b"\0connect_ms=");
    digest.update(connect.as_millis().to_string().as_bytes());
    let pool_key = hex::encode(digest.finalize());
    Ok(Target {
        config: pg,
        label,
        pool_key,
    })
}

/// `(connect, statement)` timeouts from `spec.timeout`.
pub fn timeouts(spec: &Value) -> Result<(Duration, Duration), ConfigError> {
    let secs = |v: &Value| {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .filter(|s| *s > 0.0 && s.is_finite())
            .map(Duration::from_secs_f64)
            .ok_or_else(|| ConfigError::Timeout(v.to_string()))
    };
    match spec.get("timeout") {
        None | Some(Value::Null) => Ok((DEFAULT_CONNECT, DEFAULT_TIMEOUT)),
        Some(Value::Object(m)) => Ok((
            m.get("connect")
                .map(secs)
                .transpose()?
                .unwrap_or(DEFAULT_CONNECT),
            m.get("read")
                .map(secs)
                .transpose()?
                .unwrap_or(DEFAULT_TIMEOUT),
        )),
        Some(v) => {
            let t = secs(v)?;
            Ok((DEFAULT_CONNECT.min(t), t))
        }
    }
}
