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
    /// One HTTP call from request to outcome; the decisions are plain
    /// functions (here and in request.rs) tested on their own.
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
        let rb = build_request(&client, &spec);
        let started = Instant::now();
        let sent = tokio::time::timeout(spec.read, rb.send()).await;
        let resp = match sent {
            Err(_) => return timeout_outcome(&shown, spec.read),
            Ok(Err(e)) => return transport_error(&shown, &e, &spec),
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        let final_url = request::display_url(resp.url());
        let headers = response_headers(resp.headers());
        let is_json = headers
            .get("content-type")
            .and_then(Value::as_str)
            .is_some_and(|c| c.to_ascii_lowercase().contains("json"));
        let wait_hint = headers
            .get("retry-after")
            .and_then(Value::as_str)
            .and_then(retry_after);
        let limit = BodyLimit {
            max: self.limits.max_body,
            read: spec.read,
            started,
        };
        let bytes = match read_body(resp, limit).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => return too_large(&shown, self.limits.max_body),
            Err(BodyError::Timeout) => return timeout_outcome(&shown, spec.read),
            Err(BodyError::Transport(e)) => return transport_error(&shown, &e, &spec),
        };
        let outcome = response_outcome(Response {
            shown: &shown,
            status,
            data: body_data(&bytes, is_json),
            headers,
            url: final_url,
            elapsed_ms: started.elapsed().as_millis() as u64,
        });
        ToolReturn {
            outcome,
            retry_after: wait_hint,
        }
    }
}

/// The request of a checked task: URL (with an API key in the query),
/// headers, trace context, credential and body.
fn build_request(client: &reqwest::Client, spec: &Spec) -> reqwest::RequestBuilder {
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
    match &spec.body {
        Body::None => rb,
        Body::Json(v) => rb.json(v),
        Body::Text(t) => rb.body(t.clone()),
        Body::Form(f) => rb.form(f),
    }
}

/// A response's headers as an object; a repeated header's values are
/// joined with `, `.
fn response_headers(h: &reqwest::header::HeaderMap) -> Map<String, Value> {
    let mut headers = Map::new();
    for (k, v) in h {
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
    headers
}

/// How much of a body is read, and until when.
struct BodyLimit {
    /// Largest body (bytes).
    max: usize,
    /// The whole request's timeout...
    read: Duration,
    /// ...counted from when it was sent.
    started: Instant,
}

/// Why a body was not read.
#[derive(Debug)]
enum BodyError {
    /// Larger than the limit.
    TooLarge,
    /// Not complete within the read timeout.
    Timeout,
    /// The connection broke off.
    Transport(reqwest::Error),
}

/// Read a response's body, bounded in size and time.
async fn read_body(mut resp: reqwest::Response, limit: BodyLimit) -> Result<Vec<u8>, BodyError> {
    if let Some(len) = resp.content_length() {
        if len as usize > limit.max {
            return Err(BodyError::TooLarge);
        }
    }
    let mut bytes: Vec<u8> = Vec::new();
    loop {
        let left = limit.read.saturating_sub(limit.started.elapsed());
        match tokio::time::timeout(left, resp.chunk()).await {
            Err(_) => return Err(BodyError::Timeout),
            Ok(Err(e)) => return Err(BodyError::Transport(e)),
            Ok(Ok(None)) => break,
            Ok(Ok(Some(chunk))) => {
                if bytes.len() + chunk.len() > limit.max {
                    return Err(BodyError::TooLarge);
                }
                bytes.extend_from_slice(&chunk);
            }
        }
    }
    Ok(bytes)
}

/// A body as `data`: its JSON when the response says JSON and it parses,
/// else its text.
fn body_data(bytes: &[u8], is_json: bool) -> Value {
    let text = String::from_utf8_lossy(bytes);
    if is_json {
        serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(text.to_string()))
    } else {
        Value::String(text.to_string())
    }
}

/// A completed response, as its outcome needs it.
struct Response<'a> {
    /// Method and URL, for messages.
    shown: &'a str,
    status: u16,
    headers: Map<String, Value>,
    data: Value,
    /// The final URL (after redirects), without its query.
    url: String,
    elapsed_ms: u64,
}

/// A completed response's outcome: `ok` for 2xx, else an `http.status`
/// error that still carries the result; both with the `http` helper.
fn response_outcome(r: Response<'_>) -> Outcome {
    let Response {
        shown,
        status,
        headers,
        data,
        url,
        elapsed_ms,
    } = r;
    let helper = json!({
        "status": status,
        "headers": headers,
        "url": url,
        "elapsed_ms": elapsed_ms,
    });
    let result = json!({"status": status, "headers": headers, "data": data});
    let outcome = if (200..300).contains(&status) {
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
    outcome.with_helper("http", helper)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, data: Value) -> Response<'static> {
        Response {
            shown: "GET http://h/p",
            status,
            headers: json!({"content-type": "application/json"})
                .as_object()
                .cloned()
                .unwrap(),
            data,
            url: "http://h/p".into(),
            elapsed_ms: 7,
        }
    }

    #[test]
    fn a_2xx_is_ok_and_any_other_status_an_error_with_the_result() {
        let o = response_outcome(response(200, json!({"a": 1})));
        assert!(o.is_ok());
        assert_eq!(o.result["data"], json!({"a": 1}));
        assert_eq!(o.helpers["http"]["elapsed_ms"], json!(7));
        let o = response_outcome(response(503, Value::Null));
        let e = o.error.as_ref().unwrap();
        assert_eq!(e.kind, "http.status");
        assert_eq!(e.message, "GET http://h/p returned 503 Service Unavailable");
        assert!(e.retryable);
        assert_eq!(o.result["status"], json!(503));
        assert_eq!(o.helpers["http"]["url"], json!("http://h/p"));
        let e = response_outcome(response(404, Value::Null)).error.unwrap();
        assert!(!e.retryable);
        let e = response_outcome(response(599, Value::Null)).error.unwrap();
        assert_eq!(e.message, "GET http://h/p returned 599");
    }

    #[test]
    fn bodies_are_json_when_they_say_so_and_parse() {
        assert_eq!(body_data(br#"{"a":1}"#, true), json!({"a": 1}));
        assert_eq!(body_data(br#"{"a":1}"#, false), json!(r#"{"a":1}"#));
        assert_eq!(body_data(b"not json", true), json!("not json"));
    }

    #[test]
    fn repeated_headers_are_joined() {
        let mut h = reqwest::header::HeaderMap::new();
        h.append("set-cookie", "a=1".parse().unwrap());
        h.append("set-cookie", "b=2".parse().unwrap());
        h.insert("content-type", "text/plain".parse().unwrap());
        let m = response_headers(&h);
        assert_eq!(m["set-cookie"], json!("a=1, b=2"));
        assert_eq!(m["content-type"], json!("text/plain"));
    }
}
