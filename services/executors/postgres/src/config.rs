//! Task fields and credentials → what to run and where.

use noetl_core::timeout::{task_timeouts, TaskTimeouts};
use std::time::Duration;

use noetl_core::tool::AuthCredential;
use serde_json::{Map, Value};

use crate::tls::{RootCert, SslMode, TlsSettings};

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
    /// `sslmode` is not a libpq mode.
    #[error("{at}: sslmode {value:?} is not one of {}", crate::tls::SSL_MODES)]
    SslMode {
        /// `credential `<name>`` or `connection`.
        at: String,
        /// The value given.
        value: String,
    },
    /// `command` / `params` unusable.
    #[error(transparent)]
    Command(#[from] noetl_core::sql::CommandError),
    /// `spec.timeout` unusable.
    #[error(transparent)]
    Timeout(#[from] noetl_core::timeout::TimeoutError),
}

/// Where to connect, and a label for messages (never the password).
#[derive(Clone)]
pub struct Target {
    /// Connection settings.
    pub config: tokio_postgres::Config,
    /// `<credential> (host:port/db)`.
    pub label: String,
    /// `sslmode` and `sslrootcert`.
    pub tls: TlsSettings,
    /// Identifies the pool: a digest of every setting the pool is built
    /// from — the credential or connection string (password included, so
    /// a rotated password gets a new pool), the TLS settings (so tasks with
    /// different `sslmode` or `sslrootcert` never share connections) and
    /// the connect timeout (which bounds the pool's waits), so a task never
    /// inherits another task's timeouts.
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

// Over 80 lines on purpose: one block per connection setting (auth, DSN, host, port, TLS
// mode), each with its own error.
/// The connection target of a task.
pub fn target(
    config: &Map<String, Value>,
    auth: Option<&AuthCredential>,
    connect: Duration,
) -> Result<Target, ConfigError> {
    use sha2::Digest;
    let (mut pg, label, tls, material) =
        match (auth, config.get("connection").and_then(Value::as_str)) {
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
                let tls = tls_settings(field(c, &["sslmode"]), field(c, &["sslrootcert"]), || {
                    format!("credential `{}`", c.name)
                })?;
                let mut pg = tokio_postgres::Config::new();
                pg.host(&host).port(port).user(&user).dbname(&db);
                if let Some(pw) = field(c, &["password"]) {
                    pg.password(pw);
                }
                let label = format!("`{}` ({host}:{port}/{db})", c.name);
                (pg, label, tls, c.data.to_string())
            }
            (None, Some(url)) => {
                let split = split_tls_params(url)?;
                let pg: tokio_postgres::Config =
                    split.rest.parse().map_err(|_| ConfigError::Connection)?;
                let tls = tls_settings(split.sslmode, split.sslrootcert, || "`connection`".into())?;
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
                (pg, label, tls, url.to_string())
            }
            (None, None) => return Err(ConfigError::NoTarget),
        };
    pg.connect_timeout(connect);
    pg.application_name("noetl");
    pg.ssl_mode(tls.mode.negotiation());
    let mut digest = sha2::Sha256::new();
    digest.update(material.as_bytes());
    digest.update(b"\0sslmode=");
    digest.update(tls.mode.as_str().as_bytes());
    digest.update(b"\0sslrootcert=");
    digest.update(format!("{:?}", tls.root_cert).as_bytes());
    digest.update(b"\0connect_ms=");
    digest.update(connect.as_millis().to_string().as_bytes());
    let pool_key = hex::encode(digest.finalize());
    Ok(Target {
        config: pg,
        label,
        tls,
        pool_key,
    })
}

/// `sslmode` (default `prefer`, as libpq) and `sslrootcert`; `at` names
/// where they came from for the error.
fn tls_settings(
    mode: Option<String>,
    root_cert: Option<String>,
    at: impl FnOnce() -> String,
) -> Result<TlsSettings, ConfigError> {
    let mode = match mode {
        None => SslMode::default(),
        Some(m) => {
            SslMode::parse(m.trim()).ok_or_else(|| ConfigError::SslMode { at: at(), value: m })?
        }
    };
    Ok(TlsSettings {
        mode,
        root_cert: root_cert
            .filter(|r| !r.trim().is_empty())
            .map(|r| RootCert::parse(&r)),
    })
}

/// A `connection` string with `sslmode` and `sslrootcert` taken out:
/// tokio-postgres parses neither `verify-ca`/`verify-full` nor
/// `sslrootcert`, so the tool reads them itself.
#[derive(Debug, PartialEq, Eq)]
struct SplitConnection {
    /// The rest, for tokio-postgres.
    rest: String,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// Take `sslmode` and `sslrootcert` out of a `postgresql://` URL (query
/// parameters, percent-decoded) or a libpq `key=value` string.
fn split_tls_params(s: &str) -> Result<SplitConnection, ConfigError> {
    let mut out = SplitConnection {
        rest: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    let scheme = ["postgresql://", "postgres://"]
        .into_iter()
        .find(|p| s.starts_with(p));
    if let Some(scheme) = scheme {
        // As tokio-postgres: the user info runs to the first `@`, and the
        // query starts at the first `?` after it.
        let after = s[scheme.len()..]
            .find('@')
            .map_or(scheme.len(), |i| scheme.len() + i);
        let Some(q) = s[after..].find('?').map(|i| after + i) else {
            out.rest = s.to_string();
            return Ok(out);
        };
        let decode = |t: &str| {
            percent_encoding::percent_decode_str(t)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| ConfigError::Connection)
        };
        let mut keep = Vec::new();
        for pair in s[q + 1..].split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match decode(k)?.as_str() {
                "sslmode" => out.sslmode = Some(decode(v)?),
                "sslrootcert" => out.sslrootcert = Some(decode(v)?),
                _ => keep.push(pair),
            }
        }
        out.rest = if keep.is_empty() {
            s[..q].to_string()
        } else {
            format!("{}?{}", &s[..q], keep.join("&"))
        };
        return Ok(out);
    }
    let mut keep = Vec::new();
    for (k, v) in key_values(s)? {
        match k.as_str() {
            "sslmode" => out.sslmode = Some(v),
            "sslrootcert" => out.sslrootcert = Some(v),
            _ => keep.push(format!(
                "{k}='{}'",
                v.replace('\\', "\\\\").replace('\'', "\\'")
            )),
        }
    }
    out.rest = keep.join(" ");
    Ok(out)
}

/// The pairs of a libpq `key = value` string (values bare or in single
/// quotes, `\` escaping the next character), as tokio-postgres reads them.
fn key_values(s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    let skip_ws = |it: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while it.peek().is_some_and(|c| c.is_whitespace()) {
            it.next();
        }
    };
    loop {
        skip_ws(&mut it);
        let mut key = String::new();
        while let Some(&c) = it.peek() {
            if c.is_whitespace() || c == '=' {
                break;
            }
            key.push(c);
            it.next();
        }
        if key.is_empty() {
            if it.peek().is_some() {
                return Err(ConfigError::Connection);
            }
            return Ok(out);
        }
        skip_ws(&mut it);
        if it.next() != Some('=') {
            return Err(ConfigError::Connection);
        }
        skip_ws(&mut it);
        let mut value = String::new();
        if it.peek() == Some(&'\'') {
            it.next();
            loop {
                match it.next() {
                    None => return Err(ConfigError::Connection),
                    Some('\'') => break,
                    Some('\\') => value.extend(it.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(&c) = it.peek() {
                if c.is_whitespace() {
                    break;
                }
                it.next();
                if c == '\\' {
                    value.extend(it.next());
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err(ConfigError::Connection);
            }
        }
        out.push((key, value));
    }
}

/// `(connect, statement)` timeouts from `spec.timeout` (docs/tools.md).
pub fn timeouts(spec: &Value) -> Result<(Duration, Duration), ConfigError> {
    let defaults = TaskTimeouts {
        connect: DEFAULT_CONNECT,
        read: DEFAULT_TIMEOUT,
    };
    let t = task_timeouts(spec, defaults)?;
    Ok((t.connect, t.read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn url_target(url: &str) -> Result<Target, ConfigError> {
        let config = json!({ "connection": url });
        target(config.as_object().unwrap(), None, DEFAULT_CONNECT)
    }

    #[test]
    fn url_tls_parameters_are_read_and_the_rest_kept() {
        let t = url_target(
            "postgresql://app:p%3Fw@db.example:6432/main?sslmode=verify-full&sslrootcert=%2Fetc%2Fpg%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(t.tls.mode, SslMode::VerifyFull);
        assert_eq!(
            t.tls.root_cert,
            Some(RootCert::File("/etc/pg/ca.pem".into()))
        );
        assert_eq!(t.config.get_password(), Some(&b"p?w"[..]));
        assert_eq!(t.config.get_ports(), &[6432]);
        assert_eq!(
            t.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }

    #[test]
    fn a_question_mark_in_the_user_info_is_not_the_query() {
        let s = split_tls_params("postgresql://u:a?b@h/db?sslmode=require").unwrap();
        assert_eq!(s.rest, "postgresql://u:a?b@h/db");
        assert_eq!(s.sslmode.as_deref(), Some("require"));
    }

    #[test]
    fn key_value_tls_parameters_are_read_and_quoting_survives() {
        let s = split_tls_params(
            r"host=h port = 5 password='a b\'c\\' sslmode=verify-ca sslrootcert='/x y/ca.pem'",
        )
        .unwrap();
        assert_eq!(s.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(s.sslrootcert.as_deref(), Some("/x y/ca.pem"));
        let pg: tokio_postgres::Config = s.rest.parse().unwrap();
        assert_eq!(pg.get_password(), Some(&br"a b'c\"[..]));
        assert_eq!(pg.get_ports(), &[5]);
    }

    #[test]
    fn an_unknown_sslmode_names_where_it_came_from() {
        let cred = AuthCredential {
            name: "pg_main".into(),
            kind: "postgres_credential".into(),
            data: json!({"user": "u", "password": "secret-pw", "sslmode": "verify"}),
        };
        let e = target(&Map::new(), Some(&cred), DEFAULT_CONNECT).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("credential `pg_main`"), "{text}");
        assert!(text.contains("verify-full"), "{text}");
        assert!(!text.contains("secret-pw"), "{text}");
        let e = url_target("host=h sslmode=strict").unwrap_err().to_string();
        assert!(
            e.contains("`connection`") && e.contains("\"strict\""),
            "{e}"
        );
    }

    #[test]
    fn tls_settings_key_the_pool() {
        let a = url_target("postgresql://u@h/db?sslmode=require").unwrap();
        let b = url_target("postgresql://u@h/db?sslmode=verify-full").unwrap();
        let c = url_target("postgresql://u@h/db?sslmode=verify-full&sslrootcert=/ca").unwrap();
        assert_ne!(a.pool_key, b.pool_key);
        assert_ne!(b.pool_key, c.pool_key);
        let d = url_target("postgresql://u@h/db").unwrap();
        assert_eq!(d.tls.mode, SslMode::Prefer);
    }
}
