//! A real Google Cloud Storage for tests: `gcp-storage-emulator` (PyPI),
//! in memory on a free loopback port, stopped on drop.
//!
//! The emulator answers a download without the `Last-Modified` and `ETag`
//! headers real GCS always sends and object_store requires ("Last-Modified
//! Header missing from response"). Clients therefore reach it through a
//! pass-through proxy of this harness that forwards every request as is
//! and adds those two headers to answers lacking them (the ETag from the
//! emulator's own `X-Goog-Hash` md5); nothing else is changed.
//!
//! The binary is `$NOETL_GCS_EMULATOR`, else `gcp-storage-emulator` on
//! `PATH`, else `.venv/bin/gcp-storage-emulator` of the repository (where
//! `make setup` installs it).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running emulator.
pub struct GcsEmulator {
    child: Child,
    /// The proxy's port (what clients use).
    port: u16,
    proxy: tokio::task::JoinHandle<()>,
}

/// The date put in `Last-Modified` when the emulator sends none.
const LAST_MODIFIED: &str = "Thu, 01 Jan 2026 00:00:00 GMT";

/// Forward one request to the emulator at `upstream`, adding
/// `Last-Modified` and `ETag` to an answer without them.
async fn forward(
    client: reqwest::Client,
    upstream: String,
    req: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = req.into_parts();
    let url = format!(
        "{upstream}{}",
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let body = axum::body::to_bytes(body, 64 << 20)
        .await
        .unwrap_or_default();
    let mut call = client
        .request(parts.method.clone(), url)
        .body(body.to_vec());
    for (k, v) in &parts.headers {
        if k != axum::http::header::HOST {
            call = call.header(k, v);
        }
    }
    let Ok(resp) = call.send().await else {
        return axum::http::StatusCode::BAD_GATEWAY.into_response();
    };
    let status = resp.status();
    let mut headers = resp.headers().clone();
    headers
        .entry(axum::http::header::LAST_MODIFIED)
        .or_insert(axum::http::HeaderValue::from_static(LAST_MODIFIED));
    if !headers.contains_key(axum::http::header::ETAG) {
        let md5 = headers
            .get("x-goog-hash")
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.split(',').find_map(|p| p.trim().strip_prefix("md5=")))
            .unwrap_or("0")
            .to_string();
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!("\"{md5}\"")) {
            headers.insert(axum::http::header::ETAG, v);
        }
    }
    let bytes = resp.bytes().await.unwrap_or_default();
    (status, headers, bytes).into_response()
}

/// Where `gcp-storage-emulator` is, or why it is not.
pub fn find_gcs_emulator() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("NOETL_GCS_EMULATOR").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("gcp-storage-emulator");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    let venv =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/gcp-storage-emulator");
    if venv.is_file() {
        return Ok(venv);
    }
    Err(format!(
        "gcp-storage-emulator not found (NOETL_GCS_EMULATOR, PATH, {}); run `make setup` (installs it from PyPI)",
        venv.display()
    ))
}

impl GcsEmulator {
    /// Start an emulator; panics with the reason.
    pub fn start() -> Self {
        let bin = find_gcs_emulator().unwrap_or_else(|e| panic!("{e}"));
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let child = Command::new(&bin)
            .args(["start", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--in-memory")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "gcp-storage-emulator did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let proxy_port = listener.local_addr().expect("proxy address").port();
        listener.set_nonblocking(true).expect("non-blocking");
        let listener = tokio::net::TcpListener::from_std(listener)
            .expect("GcsEmulator::start runs inside a tokio runtime");
        let upstream = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            forward(client.clone(), upstream.clone(), req)
        });
        let proxy = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            child,
            port: proxy_port,
            proxy,
        }
    }

    /// `http://127.0.0.1:<port>` (through the proxy).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The keychain credential that reaches this emulator: a
    /// service-account key with its base URL and no OAuth.
    pub fn credential(&self) -> serde_json::Value {
        serde_json::json!({"gcs_base_url": self.endpoint(), "disable_oauth": true})
    }

    /// Create `bucket` and store `body` as `key` in it (the JSON API, as
    /// `gsutil` would); panics with the emulator's answer when refused.
    pub async fn put(&self, bucket: &str, key: &str, body: &str) {
        let client = reqwest::Client::new();
        let _ = client
            .post(format!("{}/storage/v1/b?project=test", self.endpoint()))
            .json(&serde_json::json!({"name": bucket}))
            .send()
            .await
            .expect("emulator answers");
        let resp = client
            .post(format!(
                "{}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={key}",
                self.endpoint()
            ))
            .body(body.to_string())
            .send()
            .await
            .expect("emulator answers");
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(
            status.is_success(),
            "upload {bucket}/{key}: {status} {text}"
        );
    }
}

impl Drop for GcsEmulator {
    fn drop(&mut self) {
        self.proxy.abort();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
