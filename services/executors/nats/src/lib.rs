//! noetl-tool-nats: the `nats` tool kind — publish, request/reply,
//! JetStream publish, KV and object-store operations, on the mesh's own
//! NATS server or another one.
//!
//! Fields: `operation` (`publish`, `js_publish`, `request`, `kv_get`,
//! `kv_put`, `kv_delete`, `kv_keys`, `object_get`, `object_put`,
//! `object_delete`), `subject`, `data`, `headers`, `stream` (messages);
//! `bucket`, `key`, `value` (KV); `bucket`, `object` (its name), `data`,
//! `encoding`, `description` (objects); `url` (another server; default the mesh's, or
//! the credential's `url`); `auth` (a keychain entry: `secret`, `basic` or
//! `bearer`, with user/password, token, `creds` text or `nkey_seed`).
//! `spec.timeout`: seconds, or `{connect, read}` (defaults 5 s and 30 s);
//! a `request` waits `read` for its reply.
//!
//! Tasks never reach the mesh's own subjects (`<prefix>.>`), streams and
//! buckets (`<prefix>_...`), nor `$JS`/`$KV`/`$O`/`$SYS` and `_INBOX`
//! subjects: such a task fails with `nats.protected` before connecting
//! ([`config::check_protected`]). Clients are pooled per server and
//! credential.
//!
//! Outcomes: `nats.config`, `nats.protected`, `nats.connect` (retryable),
//! `nats.not_found` (bucket or object missing), `nats.no_responders`
//! (retryable), `timeout` (retryable), `nats.error` (the server refused).

pub mod config;
mod ops;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::ConnectOptions;
use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use noetl_mesh::connect::{display_urls, server_list, NatsAuth};
use serde_json::Value;

pub use config::{ConfigError, CredAuth, Encoding, Op, Protected};

/// The mesh's own server: where tasks without `url` go, how the executor
/// authenticates there, and the prefix whose names tasks may not touch.
#[derive(Debug, Clone)]
pub struct MeshServer {
    /// Comma-separated server list (`NOETL_NATS_URL`).
    pub urls: String,
    /// The mesh's NATS credentials and TLS settings.
    pub auth: NatsAuth,
    /// Subject, stream and bucket prefix (`NOETL_PREFIX`).
    pub prefix: String,
    /// Replicas of buckets a task creates there (`NOETL_REPLICAS`).
    pub replicas: usize,
}

impl MeshServer {
    /// The mesh's server as `config` describes it.
    pub fn from_config(config: &noetl_mesh::MeshConfig) -> Self {
        Self {
            urls: config.nats_url.clone(),
            auth: config.auth.clone(),
            prefix: config.prefix.clone(),
            replicas: config.replicas,
        }
    }
}

/// The `nats` tool.
#[derive(Clone)]
pub struct NatsTool {
    mesh: Arc<MeshServer>,
    clients: Arc<Mutex<HashMap<String, async_nats::Client>>>,
}

impl std::fmt::Debug for NatsTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsTool")
            .field("mesh", &display_urls(&self.mesh.urls))
            .field("prefix", &self.mesh.prefix)
            .finish()
    }
}

impl NatsTool {
    /// The tool, defaulting to the mesh's own server.
    pub fn new(mesh: MeshServer) -> Self {
        Self {
            mesh: Arc::new(mesh),
            clients: Default::default(),
        }
    }

    /// Connections open right now (one per server and credential in use).
    pub fn connections(&self) -> usize {
        self.clients.lock().expect("nats clients lock").len()
    }
}

impl Tool for NatsTool {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        let tool = self.clone();
        Box::pin(async move { tool.run(call).await })
    }
}

/// A failed operation, as its outcome will say.
#[derive(Debug)]
struct Failure {
    kind: &'static str,
    message: String,
    retryable: bool,
}

fn failure(kind: &'static str, message: impl Into<String>, retryable: bool) -> Failure {
    Failure {
        kind,
        message: message.into(),
        retryable,
    }
}

/// An error with its causes, for a message.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s = format!("{s}: {t}");
        }
        src = x.source();
    }
    s
}

/// Where one task connects.
struct Target {
    urls: String,
    on_mesh: bool,
    cred: Option<CredAuth>,
    key: String,
}

impl NatsTool {
    fn target(&self, call: &ToolCall) -> Result<Target, ConfigError> {
        use sha2::Digest;
        let cred = call.auth.as_ref().map(config::cred_auth).transpose()?;
        let url = match call.config.get("url") {
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_string()),
            None | Some(Value::Null) | Some(Value::String(_)) => None,
            Some(v) => {
                return Err(ConfigError::Field {
                    field: "url",
                    problem: format!("must be a string, got {}", noetl_core::json_type(v)),
                })
            }
        };
        let urls = url
            .or_else(|| cred.as_ref().and_then(|c| c.urls.clone()))
            .unwrap_or_else(|| self.mesh.urls.clone());
        server_list(&urls).map_err(|e| ConfigError::Field {
            field: "url",
            problem: e.to_string(),
        })?;
        let on_mesh = urls == self.mesh.urls;
        let mut d = sha2::Sha256::new();
        d.update(urls.as_bytes());
        d.update([on_mesh as u8]);
        if let Some(a) = &call.auth {
            d.update(a.data.to_string().as_bytes());
        }
        Ok(Target {
            urls,
            on_mesh,
            cred,
            key: hex::encode(d.finalize()),
        })
    }

    async fn client(&self, t: &Target, connect: Duration) -> Result<async_nats::Client, Failure> {
        if let Some(c) = self.clients.lock().expect("nats clients lock").get(&t.key) {
            return Ok(c.clone());
        }
        let shown = display_urls(&t.urls);
        let refused = |e: String| {
            failure(
                "nats.connect",
                format!("cannot connect to {shown}: {e}"),
                true,
            )
        };
        let client = match (&t.cred, t.on_mesh) {
            // The mesh's own server, as the executor itself joins it.
            (None, true) => noetl_mesh::connect::connect(noetl_mesh::connect::ConnectParams {
                urls: &t.urls,
                auth: &self.mesh.auth,
                name: "noetl-tool-nats",
            })
            .await
            .map_err(|e| refused(chain(&e)))?,
            (cred, on_mesh) => {
                let mut opts = ConnectOptions::new()
                    .name("noetl-tool-nats")
                    .connection_timeout(connect);
                if on_mesh {
                    // The mesh's TLS settings still hold on its server.
                    let a = &self.mesh.auth;
                    if let Some(ca) = &a.tls_ca {
                        opts = opts.add_root_certificates(ca.clone());
                    }
                    if let (Some(c), Some(k)) = (&a.tls_cert, &a.tls_key) {
                        opts = opts.add_client_certificate(c.clone(), k.clone());
                    }
                    if a.wants_tls() {
                        opts = opts.require_tls(true);
                    }
                }
                if let Some(c) = cred {
                    if let Some((u, p)) = &c.user_password {
                        opts = opts.user_and_password(u.clone(), p.clone());
                    }
                    if let Some(tok) = &c.token {
                        opts = opts.token(tok.clone());
                    }
                    if let Some(seed) = &c.nkey_seed {
                        opts = opts.nkey(seed.clone());
                    }
                    if let Some(creds) = &c.creds {
                        opts = opts.credentials(creds).map_err(|_| {
                            failure(
                                "nats.config",
                                "the credential's `creds` is not the text of a .creds file",
                                false,
                            )
                        })?;
                    }
                }
                let servers = server_list(&t.urls).map_err(|e| refused(e.to_string()))?;
                let connecting = opts.connect(servers);
                match tokio::time::timeout(connect + Duration::from_secs(1), connecting).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return Err(refused(chain(&e))),
                    Err(_) => {
                        return Err(refused(format!(
                            "no connection within {}s",
                            connect.as_secs_f64()
                        )))
                    }
                }
            }
        };
        let mut g = self.clients.lock().expect("nats clients lock");
        Ok(g.entry(t.key.clone()).or_insert(client).clone())
    }

    async fn run(&self, call: ToolCall) -> ToolReturn {
        let who = format!("nats task {:?} of step {:?}", call.task, call.step);
        let fail = |f: Failure| {
            ToolReturn::from(Outcome::error(
                f.kind,
                format!("{who}: {}", f.message),
                f.retryable,
            ))
        };
        let config_error =
            |e: &dyn std::fmt::Display| fail(failure("nats.config", e.to_string(), false));
        let (connect, read) = match config::timeouts(&call.spec) {
            Ok(t) => t,
            Err(e) => return config_error(&e),
        };
        let op = match config::operation(&call.config) {
            Ok(o) => o,
            Err(e) => return config_error(&e),
        };
        if let Err(e) = config::check_protected(&self.mesh.prefix, &op) {
            return fail(failure("nats.protected", e.to_string(), false));
        }
        let target = match self.target(&call) {
            Ok(t) => t,
            Err(e) => return config_error(&e),
        };
        let client = match self.client(&target, connect).await {
            Ok(c) => c,
            Err(f) => return fail(f),
        };
        let name = op.name();
        let replicas = if target.on_mesh {
            self.mesh.replicas
        } else {
            1
        };
        let session = ops::Session {
            client: &client,
            read,
            replicas,
        };
        match tokio::time::timeout(read, session.execute(op)).await {
            Ok(Ok(result)) => ToolReturn::from(Outcome::ok(result)),
            Ok(Err(f)) => fail(Failure {
                message: format!("{name} on {}: {}", display_urls(&target.urls), f.message),
                ..f
            }),
            Err(_) => fail(failure(
                "timeout",
                format!("{name} did not finish within {}s", read.as_secs_f64()),
                true,
            )),
        }
    }
}
