//! A real S3-compatible server for tests: `s3s-fs` serving a temporary
//! directory on a free loopback port, stopped and removed on drop.
//!
//! The binary is `$NOETL_S3S_FS`, else `s3s-fs` on `PATH`, else
//! `~/.cache/noetl/tools/bin/s3s-fs` (where `make setup` installs it).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Access key of every test server.
pub const ACCESS_KEY: &str = "noetl-test";
/// Secret key of every test server (not a secret: tests only).
pub const SECRET_KEY: &str = "noetl-test-secret-key";

/// A running `s3s-fs` with one bucket.
pub struct S3Server {
    child: Child,
    port: u16,
    bucket: String,
    dir: tempfile::TempDir,
}

/// Where `s3s-fs` is, or why it is not.
pub fn find_s3s_fs() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("NOETL_S3S_FS").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("s3s-fs");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cached = home.join(".cache/noetl/tools/bin/s3s-fs");
    if cached.is_file() {
        return Ok(cached);
    }
    Err(format!(
        "s3s-fs not found (NOETL_S3S_FS, PATH, {}); run `make setup`",
        cached.display()
    ))
}

impl S3Server {
    /// Start a server with bucket `bucket`; panics with the reason.
    pub fn start(bucket: &str) -> Self {
        let bin = find_s3s_fs().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new()
            .prefix("noetl-test-s3-")
            .tempdir()
            .expect("s3 dir");
        std::fs::create_dir_all(dir.path().join(bucket)).expect("bucket dir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s3s-fs did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            port,
            bucket: bucket.to_string(),
            dir,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The directory served (objects are files under `<dir>/<bucket>/`).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
