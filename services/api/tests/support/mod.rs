//! What the API's tests share: a private nats-server with the whole mesh
//! in process (`noetl_integration::Cluster`), the API served on a free
//! loopback port over real TCP, tokens of each role, and a plain HTTP
//! client that records every answer.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use noetl_api::auth::Role;
use noetl_api::tokens::Tokens;
use noetl_api::{ApiParams, ServeError};
use noetl_integration::Cluster;
use reqwest::Method;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A playbook that completes at once: a result kept by reference (the
/// payload limit is 64 bytes) and one inline.
pub const FLOW: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: api_flow
  path: tests/api_flow
executor:
  spec:
    limits: { max_payload_bytes: 64 }
workload:
  n: 3
workflow:
  - step: start
    tool:
      - name: make
        kind: noop
        result:
          rows: ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]
    next:
      arcs:
        - step: finish
  - step: finish
    tool:
      - name: done
        kind: noop
        result: "n={{ workload.n }}"
"#;

/// A playbook whose one step sleeps `{{ workload.seconds }}` seconds.
pub const SLOW: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: api_slow
  path: tests/api_slow
workload:
  seconds: 1
workflow:
  - step: nap
    tool:
      - name: sleep
        kind: python
        args: { seconds: "{{ workload.seconds }}" }
        code: |
          import time
          time.sleep(float(seconds))
          result = {"slept": seconds}
"#;

/// The tokens of each role.
pub struct Keys {
    /// admin
    pub admin: String,
    /// operator
    pub operator: String,
    /// viewer
    pub viewer: String,
}

/// A mesh with the API served over it.
pub struct Api {
    /// The mesh (server, services, a client handle).
    pub cluster: Cluster,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The HTTP client.
    pub http: reqwest::Client,
    /// Cancel to drain the API.
    pub shutdown: CancellationToken,
    /// The API's task.
    pub served: JoinHandle<Result<(), ServeError>>,
    /// Every answer's body, for the no-leak checks.
    pub seen: Mutex<Vec<String>>,
}

/// An answer: status, body as JSON (`Null` if it is not), body as text.
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The body as JSON.
    pub json: Value,
    /// The body.
    pub text: String,
}

impl Api {
    /// A mesh, tokens of each role, and the API requiring them.
    pub async fn start() -> (Api, Keys) {
        Self::start_with(noetl_api::Limits::default()).await
    }

    /// As [`Api::start`], with these timeouts and connection limit.
    pub async fn start_with(limits: noetl_api::Limits) -> (Api, Keys) {
        let cluster = Cluster::start().await;
        let tokens = Tokens::new(cluster.mesh.tokens_kv().clone());
        let keys = Keys {
            admin: tokens.create("alice", Role::Admin).await.unwrap(),
            operator: tokens.create("ops-bot", Role::Operator).await.unwrap(),
            viewer: tokens.create("dashboard", Role::Viewer).await.unwrap(),
        };
        (Self::serve_with(cluster, None, limits).await, keys)
    }

    /// The API over `cluster` on a free loopback port (TLS when given).
    pub async fn serve(
        cluster: Cluster,
        tls: Option<axum_server::tls_rustls::RustlsConfig>,
    ) -> Api {
        Self::serve_with(cluster, tls, noetl_api::Limits::default()).await
    }

    /// As [`Api::serve`], with these timeouts and connection limit.
    pub async fn serve_with(
        cluster: Cluster,
        tls: Option<axum_server::tls_rustls::RustlsConfig>,
        limits: noetl_api::Limits,
    ) -> Api {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shutdown = CancellationToken::new();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let served = tokio::spawn(noetl_api::serve(ApiParams {
            mesh: cluster.mesh.clone(),
            listener,
            tls,
            bootstrap_token: None,
            insecure_no_auth: false,
            extra: axum::Router::new(),
            shutdown: shutdown.clone(),
            limits,
        }));
        let api = Api {
            cluster,
            base: format!("{scheme}://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            shutdown,
            served,
            seen: Mutex::new(Vec::new()),
        };
        if scheme == "http" {
            api.wait_up().await;
        }
        api
    }

    /// Wait until `/health` answers.
    pub async fn wait_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = self.http.get(format!("{}/health", self.base)).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the API did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A request: `method path` with `token` and a JSON `body`.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        self.seen.lock().unwrap().push(text.clone());
        Answer {
            status,
            json: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.call(Method::GET, path, token, None).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> Answer {
        self.call(Method::POST, path, token, Some(body)).await
    }

    /// `POST path` with a raw body (and no content type).
    pub async fn post_raw(&self, path: &str, token: Option<&str>, body: &str) -> Answer {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .body(body.to_string());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        Answer {
            status,
            json: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// Register `yaml` as `admin`, asserting 200: the answer.
    pub async fn register(&self, admin: Option<&str>, yaml: &str) -> Value {
        let a = self
            .post(
                "/api/catalog/register",
                admin,
                &serde_json::json!({"content": yaml}),
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.text);
        a.json
    }

    /// Start `path` with `payload` as `token`, asserting 200: the id.
    pub async fn execute(&self, token: Option<&str>, path: &str, payload: Value) -> String {
        let a = self
            .post(
                "/api/execute",
                token,
                &serde_json::json!({"path": path, "payload": payload}),
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.text);
        a.json["execution_id"].as_str().unwrap().to_string()
    }

    /// Poll `/api/executions/{id}/status` until its status is `want`.
    pub async fn wait_status(&self, id: &str, token: Option<&str>, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let a = self
                .get(&format!("/api/executions/{id}/status"), token)
                .await;
            if a.status == 200 && a.json["status"] == want {
                return a.json;
            }
            assert!(
                Instant::now() < deadline,
                "execution {id} not {want}: {} {}",
                a.status,
                a.text
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Assert an error answer: `status`, NoETL's `{error, status}` body, and
/// an `error` that mentions `says`.
pub fn assert_error(a: &Answer, status: u16, says: &str) {
    assert_eq!(a.status, status, "{}", a.text);
    assert_eq!(a.json["status"], status, "{}", a.text);
    let error = a.json["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(says),
        "error {error:?} should mention {says:?}"
    );
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub struct Sse {
    /// `id:`, or, for an event sent without one (a `task.done` carried in
    /// its step's end, sent before it), the `seq` its data names.
    pub id: u64,
    /// It was sent with an `id:` (a client resumes after it).
    pub resumable: bool,
    /// `event:`.
    pub event: String,
    /// `data:` as JSON.
    pub data: Value,
}

/// Read a `text/event-stream` response to its end (or `timeout`): its
/// events, comments skipped.
pub async fn read_sse(mut r: reqwest::Response, timeout: Duration) -> Vec<Sse> {
    let deadline = Instant::now() + timeout;
    let mut buf = String::new();
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = match tokio::time::timeout(left, r.chunk()).await {
            Ok(Ok(Some(c))) => c,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => panic!("event stream failed: {e}"),
            Err(_) => panic!("event stream still open after {timeout:?}; got {out:?}"),
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            if let Some(seq) = id.or_else(|| data["seq"].as_u64()) {
                out.push(Sse {
                    id: seq,
                    resumable: id.is_some(),
                    event,
                    data,
                });
            }
        }
    }
    out
}
