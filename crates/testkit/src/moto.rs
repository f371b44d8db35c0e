//! A real AWS Secrets Manager for tests: moto's server mode (`moto_server`,
//! PyPI `moto[server]`) on a free loopback port, stopped on drop.
//!
//! The binary is `$NOETL_MOTO_SERVER`, else `moto_server` on `PATH`, else
//! `.venv/bin/moto_server` of the repository (where `make setup` installs
//! it).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The region every test secret lives in.
pub const REGION: &str = "us-east-1";

/// A running moto server.
pub struct MotoServer {
    child: Child,
    port: u16,
}

/// Where `moto_server` is, or why it is not.
pub fn find_moto_server() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("NOETL_MOTO_SERVER").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("moto_server");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/moto_server");
    if venv.is_file() {
        return Ok(venv);
    }
    Err(format!(
        "moto_server not found (NOETL_MOTO_SERVER, PATH, {}); run `make setup` (installs moto[server] from PyPI)",
        venv.display()
    ))
}

impl MotoServer {
    /// Start a server; panics with the reason.
    pub fn start() -> Self {
        let bin = find_moto_server().unwrap_or_else(|e| panic!("{e}"));
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "moto_server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Store a secret (Secrets Manager's `CreateSecret`), as a user would
    /// with the AWS CLI; panics with moto's answer when refused.
    pub async fn create_secret(&self, name: &str, value: &str) {
        let resp = reqwest::Client::new()
            .post(format!("{}/", self.endpoint()))
            .header("content-type", "application/x-amz-json-1.1")
            .header("x-amz-target", "secretsmanager.CreateSecret")
            .header(
                "authorization",
                format!("AWS4-HMAC-SHA256 Credential=test/20260101/{REGION}/secretsmanager/aws4_request, SignedHeaders=host, Signature=0"),
            )
            .body(serde_json::json!({"Name": name, "SecretString": value}).to_string())
            .send()
            .await
            .expect("moto answers");
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "CreateSecret {name}: {status} {body}");
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
