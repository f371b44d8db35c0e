//! What the CLI's end-to-end tests share: the `noetl` binary with a clean
//! environment, `admin init` and `serve` as an operator runs them, `exec
//! start` and `exec status --wait` as a client runs them, a guard that kills
//! the processes a test started however it ends, a free port, and a wait
//! for a condition.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `noetl` binary with `NOETL_HOME` set to `home` and no inherited
/// setting that would point it elsewhere (NATS URL, HTTP address).
pub fn noetl(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_noetl"));
    c.env("NOETL_HOME", home)
        .env_remove("NOETL_NATS_URL")
        .env_remove("NOETL_HTTP_ADDR");
    c
}

/// `noetl admin init --nats URL` run by `noetl` (a command from [`noetl`]
/// or a test's own variant), asserting it succeeds. Client commands never
/// create the mesh: a test makes it first, as an operator does, so a
/// client cannot race the services starting.
pub fn admin_init(mut noetl: Command, url: &str) {
    let init = noetl
        .args(["admin", "init", "--nats", url])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "noetl admin init: {}",
        String::from_utf8_lossy(&init.stderr)
    );
}

/// `noetl serve ARGS --nats URL` as a process, its output discarded.
pub fn serve(mut noetl: Command, url: &str, args: &[&str]) -> Child {
    noetl
        .arg("serve")
        .args(args)
        .args(["--nats", url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The router, scheduler and loop-supervisor, and one executor of each of
/// `kinds`, served against `url` by the `noetl` of `home`.
pub fn mesh_services(home: &Path, url: &str, kinds: &[&str]) -> Procs {
    let mut children: Vec<Child> = ["router", "scheduler", "loop-supervisor"]
        .iter()
        .map(|s| serve(noetl(home), url, &[s]))
        .collect();
    for kind in kinds {
        children.push(serve(noetl(home), url, &["executor", "--kind", kind]));
    }
    Procs(children)
}

/// `noetl exec start ARGS --json --nats URL` run by `noetl`, asserting it
/// succeeds: the execution id.
pub fn exec_start<S: AsRef<std::ffi::OsStr>>(mut noetl: Command, url: &str, args: &[S]) -> String {
    let out = noetl
        .args(["exec", "start"])
        .args(args)
        .args(["--json", "--nats", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "noetl exec start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    started["execution_id"].as_str().unwrap().to_string()
}

/// `noetl exec status ID --wait --json --timeout SECS --nats URL` run by
/// `noetl`, asserting it exits 0 (the execution completed): its summary.
pub fn exec_wait(mut noetl: Command, url: &str, id: &str, timeout_s: u64) -> serde_json::Value {
    let out = noetl
        .args(["exec", "status", id, "--wait", "--json", "--timeout"])
        .arg(timeout_s.to_string())
        .args(["--nats", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "noetl exec status --wait: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Processes killed (and reaped) when the test ends, however it ends.
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A TCP port free on the loopback interface now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Poll `done` every 20 ms until it holds; fail naming `what` after
/// `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Send `signal` (`TERM`, `INT`, …) to `child` as `kill -SIGNAL` does and
/// wait up to 30 s for it to exit, failing naming `what`: its status.
pub fn signal_and_wait(child: &mut Child, signal: &str, what: &str) -> ExitStatus {
    let sent = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {what}");
    let mut status = None;
    wait_until(what, Duration::from_secs(30), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.expect("exited")
}

/// A plain HTTP/1.1 GET of `path` on 127.0.0.1:`port`, its answer read
/// within `read_timeout`: (status, body), or the connection error.
pub fn http_get(port: u16, path: &str, read_timeout: Duration) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(read_timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {raw:?}"));
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((status, body.to_string()))
}
