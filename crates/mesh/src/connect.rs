//! Connecting to NATS: a list of servers the client fails over between, and
//! the credentials and TLS settings of a secured deployment.
//!
//! Settings come from [`crate::MeshConfig`] (`NOETL_NATS_*`, else the `nats`
//! CLI's conventional `NATS_*` variables, then flags). See
//! `docs/deploy.md` for how the Helm chart mounts them from a Secret.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use async_nats::{ConnectOptions, ServerAddr};

use crate::MeshError;

/// How a client proves who it is to NATS, and how it checks the server.
/// `Debug` never prints a password or token.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NatsAuth {
    /// A `.creds` file (JWT + nkey seed), as `nats` CLI's `--creds`.
    pub creds_file: Option<PathBuf>,
    /// A file holding an nkey seed (`SU...`).
    pub nkey_seed_file: Option<PathBuf>,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<String>,
    /// A bearer token.
    pub token: Option<String>,
    /// CA certificate(s) (PEM) the server's certificate must chain to.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), with `tls_key`, for mutual TLS.
    pub tls_cert: Option<PathBuf>,
    /// Client private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Refuse a connection that is not TLS (implied by any TLS file and by
    /// `tls://` URLs).
    pub require_tls: bool,
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "[redacted]");
        f.debug_struct("NatsAuth")
            .field("creds_file", &self.creds_file)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("token", &hidden(&self.token))
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("require_tls", &self.require_tls)
            .finish()
    }
}

impl NatsAuth {
    /// The conflicts and gaps that make these settings unusable, named by
    /// their environment variables.
    pub fn check(&self) -> Result<(), String> {
        let methods = [
            self.creds_file.is_some(),
            self.nkey_seed_file.is_some(),
            self.user.is_some() || self.password.is_some(),
            self.token.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            return Err("choose one NATS authentication: a creds file (NOETL_NATS_CREDS), an nkey seed (NOETL_NATS_NKEY), user/password (NOETL_NATS_USER, NOETL_NATS_PASSWORD) or a token (NOETL_NATS_TOKEN)".into());
        }
        if self.user.is_some() != self.password.is_some() {
            return Err("NOETL_NATS_USER and NOETL_NATS_PASSWORD must be given together".into());
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err("NOETL_NATS_CERT and NOETL_NATS_KEY (the client certificate and its key) must be given together".into());
        }
        Ok(())
    }

    /// True when any TLS setting is given.
    pub fn wants_tls(&self) -> bool {
        self.require_tls || self.tls_ca.is_some() || self.tls_cert.is_some()
    }
}

/// Parse a comma-separated list of NATS servers (`nats://a:4222,nats://b:4222`;
/// a bare `host:port` is accepted as the `nats` CLI does).
pub fn server_list(urls: &str) -> Result<Vec<ServerAddr>, MeshError> {
    let mut out = Vec::new();
    for (i, raw) in urls.split(',').enumerate() {
        let url = raw.trim();
        if url.is_empty() {
            return Err(MeshError::Config(format!(
                "NATS server list {urls:?}: entry {} is empty",
                i + 1
            )));
        }
        let addr = ServerAddr::from_str(url).map_err(|e| {
            MeshError::Config(format!(
                "NATS server list {urls:?}: {url:?} is not a server URL: {e}"
            ))
        })?;
        out.push(addr);
    }
    Ok(out)
}

/// `urls` with any `user:password@` removed, for messages and logs.
pub fn display_urls(urls: &str) -> String {
    urls.split(',')
        .map(|u| {
            let u = u.trim();
            match (u.find("://"), u.rfind('@')) {
                (Some(s), Some(at)) if at > s => format!("{}[redacted]{}", &u[..s + 3], &u[at..]),
                (None, Some(at)) => format!("[redacted]{}", &u[at..]),
                _ => u.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What [`connect`] needs.
pub struct ConnectParams<'a> {
    /// Comma-separated server list.
    pub urls: &'a str,
    /// Credentials and TLS.
    pub auth: &'a NatsAuth,
    /// Client name shown by the server (`nats server report connections`).
    pub name: &'a str,
}

/// Connect to the first reachable server of the list; once connected the
/// client reconnects (to any server of the list or of the cluster the
/// server announces) for as long as the process lives.
pub async fn connect(p: ConnectParams<'_>) -> Result<async_nats::Client, MeshError> {
    let servers = server_list(p.urls)?;
    p.auth.check().map_err(MeshError::Config)?;
    let config_err = |what: &str, path: &PathBuf, e: std::io::Error| {
        MeshError::Config(format!("{what} {}: {e}", path.display()))
    };
    let mut opts = ConnectOptions::new()
        .name(p.name)
        .connection_timeout(Duration::from_secs(5))
        .max_reconnects(None);
    let a = p.auth;
    if let Some(path) = &a.creds_file {
        opts = opts
            .credentials_file(path)
            .await
            .map_err(|e| config_err("NATS creds file", path, e))?;
    }
    if let Some(path) = &a.nkey_seed_file {
        let seed = std::fs::read_to_string(path)
            .map_err(|e| config_err("NATS nkey seed file", path, e))?;
        let seed = seed
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("SU"))
            .ok_or_else(|| {
                MeshError::Config(format!(
                    "NATS nkey seed file {}: no user seed (a line starting with SU)",
                    path.display()
                ))
            })?;
        opts = opts.nkey(seed.to_string());
    }
    if let (Some(user), Some(password)) = (&a.user, &a.password) {
        opts = opts.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &a.token {
        opts = opts.token(token.clone());
    }
    for (what, path) in [
        ("NATS CA", &a.tls_ca),
        ("NATS client certificate", &a.tls_cert),
        ("NATS client key", &a.tls_key),
    ] {
        if let Some(path) = path {
            std::fs::metadata(path).map_err(|e| config_err(what, path, e))?;
        }
    }
    if let Some(ca) = &a.tls_ca {
        opts = opts.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        opts = opts.add_client_certificate(cert.clone(), key.clone());
    }
    if a.wants_tls() || servers.iter().any(|s| s.tls_required()) {
        opts = opts.require_tls(true);
    }
    opts.connect(servers)
        .await
        .map_err(|source| MeshError::Connect {
            url: display_urls(p.urls),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_separated_list_gives_every_server() {
        let s = server_list("nats://a:4222, nats://b:4223,c:4224").unwrap();
        let hosts: Vec<(String, u16)> =
            s.iter().map(|a| (a.host().to_string(), a.port())).collect();
        assert_eq!(
            hosts,
            vec![
                ("a".to_string(), 4222),
                ("b".to_string(), 4223),
                ("c".to_string(), 4224)
            ]
        );
        assert!(server_list("tls://a:4222").unwrap()[0].tls_required());
    }

    #[test]
    fn a_bad_entry_is_named() {
        let e = server_list("nats://a:4222,nats://b:notaport")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"nats://b:notaport\""), "{e}");
        let e = server_list("nats://a:4222,").unwrap_err().to_string();
        assert!(e.contains("entry 2 is empty"), "{e}");
    }

    #[test]
    fn urls_are_shown_without_their_credentials() {
        assert_eq!(
            display_urls("nats://svc:s3cret@a:4222, nats://b:4222"),
            "nats://[redacted]@a:4222,nats://b:4222"
        );
        assert_eq!(display_urls("tok@a:4222"), "[redacted]@a:4222");
    }

    #[test]
    fn conflicting_or_half_given_credentials_are_refused() {
        let both = NatsAuth {
            token: Some("t".into()),
            user: Some("u".into()),
            password: Some("p".into()),
            ..Default::default()
        };
        assert!(both.check().unwrap_err().contains("choose one"));
        let half = NatsAuth {
            user: Some("u".into()),
            ..Default::default()
        };
        assert!(half.check().unwrap_err().contains("NOETL_NATS_PASSWORD"));
        let cert = NatsAuth {
            tls_cert: Some("c.pem".into()),
            ..Default::default()
        };
        assert!(cert.check().unwrap_err().contains("NOETL_NATS_KEY"));
        assert!(NatsAuth::default().check().is_ok());
    }

    #[test]
    fn debug_never_shows_a_password_or_token() {
        let a = NatsAuth {
            user: Some("svc".into()),
            password: Some("hunter22-secret".into()),
            token: Some("tok-secret-value".into()),
            ..Default::default()
        };
        let d = format!("{a:?}");
        assert!(d.contains("svc") && d.contains("[redacted]"), "{d}");
        assert!(!d.contains("hunter22") && !d.contains("tok-secret"), "{d}");
    }
}
