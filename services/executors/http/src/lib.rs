//! noetl-tool-http: the `http` tool kind.
//!
//! Fields: `url` (required), `method` (default GET), `headers` (object),
//! `params` (object → query string; a list repeats the key), one of `json`
//! (any JSON value), `body` (text as is) or `form` (object, URL-encoded),
//! `follow_redirects` (default true, at most 10), `verify_ssl` (default
//! true; `false` accepts any server certificate), `auth` (a keychain entry
//! of kind `bearer`, `basic` or `api_key`). `spec.timeout` is seconds for
//! the whole request or `{connect, read}` (defaults 10 s and 60 s).
//!
//! Every completed response gives `outcome.result = {status, headers,
//! data}` (`data` is the parsed JSON body when the response is JSON, else
//! the text) and `outcome.http = {status, headers, url, elapsed_ms}`. A 2xx
//! status is `ok`; any other is an `http.status` error (retryable for 408,
//! 425, 429, 500, 502, 503, 504) that still carries the result and helper,
//! so policies test `outcome.http.status`. A `Retry-After` header (seconds
//! or HTTP date) becomes the floor of a retry's delay. Other errors:
//! `timeout` (retryable), `http.connect` (retryable: refused, DNS, TLS),
//! `http.body_too_large`, `http.config` (the task's fields). Messages name
//! the method and the URL without its query string (which may hold a key);
//! no credential value ever appears in an outcome.

pub mod request;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::{json, Map, Value};

pub use request::{Auth, Body, ConfigError, Spec};

/// Default largest response body.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024 * 1024;

/// Statuses worth retrying.
pub const RETRYABLE_STATUSES: &[u16] = &[408, 425, 429, 500, 502, 503, 504];

/// Replica-wide settings.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Largest response body read (bytes).
    pub max_body: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_body: DEFAULT_MAX_BODY,
        }
    }
}

/// What a pooled client is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ClientKey {
    follow: bool,
    connect: Duration,
    verify_tls: bool,
}

/// The `http` tool: pooled clients, one per (redirect policy, connect
/// timeout, certificate check) in use, shared by every task of the replica.
#[derive(Debug, Clone)]
pub struct HttpTool {
    clients: std::sync::Arc<std::sync::Mutex<HashMap<ClientKey, reqwest::Client>>>,
    limits: HttpLimits,
}

impl Default for HttpTool {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpTool {
    /// The tool with default limits.
    pub fn new() -> Self {
        Self::with_limits(HttpLimits::default())
    }

    /// The tool with explicit limits.
    pub fn with_limits(limits: HttpLimits) -> Self {
        Self {
            clients: Default::default(),
            limits,
        }
    }

    fn client(&self, key: ClientKey) -> Result<reqwest::Client, reqwest::Error> {
        let mut g = self.clients.lock().expect("http clients lock");
        if let Some(c) = g.get(&key) {
            return Ok(c.clone());
        }
        let policy = if key.follow {
            reqwest::redirect::Policy::limited(10)
        } else {
            reqwest::redirect::Policy::none()
        };
        let c = reqwest::Client::builder()
            .redirect(policy)
            .connect_timeout(key.connect)
            .danger_accept_invalid_certs(!key.verify_tls)
            .user_agent(concat!("noetl/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        g.insert(key, c.clone());
        Ok(c)
    }
}

impl Tool for HttpTool {
    fn kind(&self) -> &'static str {
        "http"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        let tool = self.clone();
        Box::pin(async move { tool.run(call).await })
    }
}

/// `Retry-After` as a delay: seconds, or an HTTP date from now.
pub fn retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

impl HttpTool {
    // Over 80 lines on purpose: one HTTP call from request to outcome (build, send with
    // timeout, read the bounded body, map status and errors); the decisions are in request.rs
    // and tested there.
    async fn run(&self, call: ToolCall) -> ToolReturn {
        let spec = match request::parse(&call.config, &call.spec, call.auth.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                return ToolReturn::from(Outcome::error(
                    "http.config",
                    format!("http task {:?} of step {:?}: {e}", call.task, call.step),
                    false,
                ))
            }
        };
        let shown = format!("{} {}", spec.method, request::display_url(&spec.url));
        let client = match self.client(ClientKey {
            follow: spec.follow_redirects,
            connect: spec.connect,
            verify_tls: spec.verify_tls,
        }) {
            Ok(c) => c,
            Err(e) => return transport_error(&shown, &e, &spec),
        };
        let mut url = spec.url.clone();
        if let Some(Auth::ApiKeyQuery(name, key)) = &spec.auth {
            url.query_pairs_mut().append_pair(name, key);
        }
        let mut rb = client.request(spec.method.clone(), url).timeout(spec.read);
        for (k, v) in &spec.headers {
            rb = rb.header(k.as_str(), v.as_str());
        }
        // The task's trace context, so the server's spans join the
        // execution's trace (unless the task sets the header itself).
        for (name, value) in noetl_telemetry::propagation::current_headers() {
            if !spec
                .headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(name))
            {
                rb = rb.header(name, value);
            }
        }
        rb = match &spec.auth {
            Some(Auth::Bearer(t)) => rb.bearer_auth(t),
            Some(Auth::Basic(u, p)) => rb.basic_auth(u, p.as_ref()),
            Some(Auth::ApiKeyHeader(h, k)) => rb.header(h.as_str(), k.as_str()),
            Some(Auth::ApiKeyQuery(..)) | None => rb,
        };
        rb = match &spec.body {
            Body::None => rb,
            Body::Json(v) => rb.json(v),
            Body::Text(t) => rb.body(t.clone()),
            Body::Form(f) => rb.form(f),
        };
        let started = Instant::now();
        let sent = tokio::time::timeout(spec.read, rb.send()).await;
        let resp = match sent {
            Err(_) => return timeout_outcome(&shown, spec.read),
            Ok(Err(e)) => return transport_error(&shown, &e, &spec),
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        let final_url = request::display_url(resp.url());
        let mut headers = Map::new();
        for (k, v) in resp.headers() {
            let v = String::from_utf8_lossy(v.as_bytes()).to_string();
            match headers.get_mut(k.as_str()) {
                Some(Value::String(prev)) => {
                    prev.push_str(", ");
                    prev.push_str(&v);
                }
                _ => {
                    headers.insert(k.as_str().to_string(), Value::String(v));
                }
            }
        }
        let is_json = headers
            .get("content-type")
            .and_then(Value::as_str)
            .is_some_and(|c| c.to_ascii_lowercase().contains("json"));
        let wait_hint = headers
            .get("retry-after")
            .and_then(Value::as_str)
            .and_then(retry_after);
        if let Some(len) = resp.content_length() {
            if len as usize > self.limits.max_body {
                return too_large(&shown, self.limits.max_body);
            }
        }
        let mut resp = resp;
        let mut bytes: Vec<u8> = Vec::new();
        loop {
            let left = spec.read.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, resp.chunk()).await {
                Err(_) => return timeout_outcome(&shown, spec.read),
                Ok(Err(e)) => return transport_error(&shown, &e, &spec),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(chunk))) => {
                    if bytes.len() + chunk.len() > self.limits.max_body {
                        return too_large(&shown, self.limits.max_body);
                    }
                    bytes.extend_from_slice(&chunk);
                }
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let data = if is_json {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(text.to_string()))
        } else {
            Value::String(text.to_string())
        };
        let helper = json!({
            "status": status,
            "headers": headers,
            "url": final_url,
            "elapsed_ms": started.elapsed().as_millis() as u64,
        });
        let result = json!({"status": status, "headers": headers, "data": data});
        let mut outcome = if (200..300).contains(&status) {
            Outcome::ok(result)
        } else {
            let reason = reqwest::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("");
            let mut o = Outcome::error(
                "http.status",
                format!("{shown} returned {status} {reason}")
                    .trim_end()
                    .to_string(),
                RETRYABLE_STATUSES.contains(&status),
            );
            o.result = result;
            o
        };
        outcome = outcome.with_helper("http", helper);
        ToolReturn {
            outcome,
            retry_after: wait_hint,
        }
    }
}

fn timeout_outcome(shown: &str, read: Duration) -> ToolReturn {
    ToolReturn::from(Outcome::error(
        "timeout",
        format!("{shown} did not answer within {}s", read.as_secs_f64()),
        true,
    ))
}

fn too_large(shown: &str, max: usize) -> ToolReturn {
    ToolReturn::from(Outcome::error(
        "http.body_too_large",
        format!("{shown} returned a body larger than {max} bytes"),
        false,
    ))
}

fn transport_error(shown: &str, e: &reqwest::Error, spec: &Spec) -> ToolReturn {
    if e.is_timeout() && e.is_connect() {
        return ToolReturn::from(Outcome::error(
            "timeout",
            format!(
                "{shown} could not connect within {}s",
                spec.connect.as_secs_f64()
            ),
            true,
        ));
    }
    if e.is_timeout() {
        return timeout_outcome(shown, spec.read);
    }
    // reqwest's Display includes the URL (with its query): describe the
    // cause without it.
    let mut cause = String::new();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = src {
        cause = s.to_string();
        src = s.source();
    }
    let what = if e.is_connect() {
        "could not connect"
    } else if e.is_redirect() {
        "redirected too often"
    } else if e.is_body() || e.is_decode() {
        "broke off its response"
    } else {
        "failed"
    };
    let message = if cause.is_empty() {
        format!("{shown} {what}")
    } else {
        format!("{shown} {what}: {cause}")
    };
    ToolReturn::from(Outcome::error("http.connect", message, !e.is_redirect()))
}
