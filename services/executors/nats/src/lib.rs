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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::{ConnectOptions, HeaderMap};
use futures::StreamExt;
use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use noetl_mesh::connect::{display_urls, server_list, NatsAuth};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

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
        match tokio::time::timeout(read, execute(&client, op, read, replicas)).await {
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

fn header_map(headers: &[(String, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.insert(k.as_str(), v.as_str());
    }
    h
}

fn headers_json(h: Option<&HeaderMap>) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(h) = h {
        for (k, vs) in h.iter() {
            let v: Vec<String> = vs.iter().map(|v| v.to_string()).collect();
            out.insert(k.to_string(), Value::String(v.join(", ")));
        }
    }
    Value::Object(out)
}

fn rfc3339(t: time::OffsetDateTime) -> Value {
    t.format(&time::format_description::well_known::Rfc3339)
        .map(Value::String)
        .unwrap_or(Value::Null)
}

fn server_error(e: &dyn std::error::Error) -> Failure {
    let text = chain(e);
    if text.contains("timed out") {
        return failure("timeout", text, true);
    }
    failure("nats.error", text, false)
}

async fn kv_store(
    js: &jetstream::Context,
    bucket: &str,
    create: Option<usize>,
) -> Result<jetstream::kv::Store, Failure> {
    use jetstream::context::KeyValueErrorKind;
    match js.get_key_value(bucket).await {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == KeyValueErrorKind::GetBucket => match create {
            Some(replicas) => js
                .create_key_value(jetstream::kv::Config {
                    bucket: bucket.to_string(),
                    history: 1,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| server_error(&e)),
            None => Err(failure(
                "nats.not_found",
                format!("KV bucket {bucket:?} does not exist"),
                false,
            )),
        },
        Err(e) => Err(server_error(&e)),
    }
}

async fn object_store(
    js: &jetstream::Context,
    bucket: &str,
    create: Option<usize>,
) -> Result<jetstream::object_store::ObjectStore, Failure> {
    use jetstream::context::ObjectStoreErrorKind;
    match js.get_object_store(bucket).await {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == ObjectStoreErrorKind::GetStore => match create {
            Some(replicas) => js
                .create_object_store(jetstream::object_store::Config {
                    bucket: bucket.to_string(),
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| server_error(&e)),
            None => Err(failure(
                "nats.not_found",
                format!("object store {bucket:?} does not exist"),
                false,
            )),
        },
        Err(e) => Err(server_error(&e)),
    }
}

// Over 80 lines on purpose: one arm per operation, each a few calls of the
// client and the shape of its result.
async fn execute(
    client: &async_nats::Client,
    op: Op,
    read: Duration,
    replicas: usize,
) -> Result<Value, Failure> {
    let js = || jetstream::new(client.clone());
    match op {
        Op::Publish {
            subject,
            payload,
            headers,
        } => {
            let n = payload.len();
            let sent = if headers.is_empty() {
                client.publish(subject.clone(), payload).await
            } else {
                client
                    .publish_with_headers(subject.clone(), header_map(&headers), payload)
                    .await
            };
            sent.map_err(|e| server_error(&e))?;
            client.flush().await.map_err(|e| server_error(&e))?;
            Ok(json!({"subject": subject, "bytes": n}))
        }
        Op::JsPublish {
            subject,
            payload,
            headers,
            stream,
        } => {
            let mut h = header_map(&headers);
            if let Some(s) = &stream {
                h.insert("Nats-Expected-Stream", s.as_str());
            }
            let ack = js()
                .publish_with_headers(subject.clone(), h, payload)
                .await
                .map_err(|e| server_error(&e))?
                .await
                .map_err(|e| server_error(&e))?;
            Ok(json!({
                "subject": subject,
                "stream": ack.stream,
                "seq": ack.sequence,
                "duplicate": ack.duplicate,
            }))
        }
        Op::Request {
            subject,
            payload,
            headers,
        } => {
            use async_nats::RequestErrorKind;
            let mut req = async_nats::Request::new()
                .payload(payload)
                .timeout(Some(read));
            if !headers.is_empty() {
                req = req.headers(header_map(&headers));
            }
            let reply = client
                .send_request(subject.clone(), req)
                .await
                .map_err(|e| match e.kind() {
                    RequestErrorKind::NoResponders => failure(
                        "nats.no_responders",
                        format!("no one answers on {subject:?}"),
                        true,
                    ),
                    RequestErrorKind::TimedOut => failure(
                        "timeout",
                        format!("no reply on {subject:?} within {}s", read.as_secs_f64()),
                        true,
                    ),
                    _ => server_error(&e),
                })?;
            Ok(json!({
                "subject": subject,
                "data": config::from_bytes(&reply.payload),
                "headers": headers_json(reply.headers.as_ref()),
            }))
        }
        Op::KvGet { bucket, key } => {
            let kv = kv_store(&js(), &bucket, None).await?;
            let entry = kv.entry(key.clone()).await.map_err(|e| server_error(&e))?;
            // A deleted or purged key reads as a marker entry: not found.
            let entry = entry.filter(|e| e.operation == jetstream::kv::Operation::Put);
            Ok(match entry {
                Some(e) => json!({
                    "bucket": bucket, "key": key, "found": true,
                    "value": config::from_bytes(&e.value),
                    "revision": e.revision, "created": rfc3339(e.created),
                }),
                None => json!({
                    "bucket": bucket, "key": key, "found": false, "value": null,
                    "revision": null, "created": null,
                }),
            })
        }
        Op::KvPut { bucket, key, value } => {
            let kv = kv_store(&js(), &bucket, Some(replicas)).await?;
            let revision = kv.put(&key, value).await.map_err(|e| server_error(&e))?;
            Ok(json!({"bucket": bucket, "key": key, "revision": revision}))
        }
        Op::KvDelete { bucket, key } => {
            let kv = kv_store(&js(), &bucket, None).await?;
            kv.delete(&key).await.map_err(|e| server_error(&e))?;
            Ok(json!({"bucket": bucket, "key": key}))
        }
        Op::KvKeys { bucket } => {
            let kv = kv_store(&js(), &bucket, None).await?;
            let mut keys = kv.keys().await.map_err(|e| server_error(&e))?;
            let mut out = Vec::new();
            while let Some(k) = keys.next().await {
                out.push(Value::String(k.map_err(|e| server_error(&e))?));
            }
            let n = out.len();
            Ok(json!({"bucket": bucket, "keys": out, "count": n}))
        }
        Op::ObjectGet {
            bucket,
            name,
            encoding,
        } => {
            use jetstream::object_store::GetErrorKind;
            let store = object_store(&js(), &bucket, None).await?;
            let mut obj = store.get(&name).await.map_err(|e| match e.kind() {
                GetErrorKind::NotFound => failure(
                    "nats.not_found",
                    format!("object {name:?} is not in {bucket:?}"),
                    false,
                ),
                _ => server_error(&e),
            })?;
            let mut bytes = Vec::new();
            obj.read_to_end(&mut bytes)
                .await
                .map_err(|e| server_error(&e))?;
            let data = match encoding {
                Encoding::Base64 => {
                    use base64::Engine as _;
                    Value::String(base64::engine::general_purpose::STANDARD.encode(&bytes))
                }
                Encoding::Text => match String::from_utf8(bytes.clone()) {
                    Ok(s) => Value::String(s),
                    Err(_) => {
                        return Err(failure(
                            "nats.error",
                            format!(
                            "object {name:?} is not UTF-8 text; read it with `encoding: base64`"
                        ),
                            false,
                        ))
                    }
                },
            };
            Ok(json!({
                "bucket": bucket, "name": name, "data": data, "size": bytes.len(),
                "digest": obj.info().digest,
            }))
        }
        Op::ObjectPut {
            bucket,
            name,
            data,
            description,
        } => {
            let store = object_store(&js(), &bucket, Some(replicas)).await?;
            let meta = jetstream::object_store::ObjectMetadata {
                name: name.clone(),
                description,
                ..Default::default()
            };
            let mut reader: &[u8] = data.as_ref();
            let info = store
                .put(meta, &mut reader)
                .await
                .map_err(|e| server_error(&e))?;
            Ok(json!({"bucket": bucket, "name": name, "size": info.size, "digest": info.digest}))
        }
        Op::ObjectDelete { bucket, name } => {
            let store = object_store(&js(), &bucket, None).await?;
            store.delete(&name).await.map_err(|e| server_error(&e))?;
            Ok(json!({"bucket": bucket, "name": name}))
        }
    }
}
