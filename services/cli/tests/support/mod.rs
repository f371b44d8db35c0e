//! What the CLI's end-to-end tests share: the `noetl` binary with a clean
//! environment, a guard that kills the processes a test started however
//! it ends, a free port, and a wait for a condition.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command};
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
