//! The `noetl serve` processes of a chaos or fault run (shared by both
//! test binaries through `#[path]`): two replicas of router, scheduler,
//! loop-supervisor, executor and timer, each SIGKILLed and started again
//! on the schedule's word, restarted (and recorded) when one exits on its
//! own. Everything is killed when the set is dropped, however a run ends.

// Each test binary that includes this uses only part of it.
#![allow(dead_code)]

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The consumers' ack wait in these runs: a task whose executor was
/// killed comes back after this long.
pub const ACK_WAIT_MS: u64 = 2000;

/// The processes of a run: two replicas of router, scheduler,
/// loop-supervisor and timer, and two executors serving every kind.
pub fn service_names() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for service in [
        "router",
        "scheduler",
        "loop-supervisor",
        "executor",
        "timer",
    ] {
        for replica in 1..=2 {
            out.push((service, format!("{service}-{replica}")));
        }
    }
    out
}

/// A `noetl` command with the run's home and ack wait, nothing inherited
/// that would point it elsewhere, and `env` on top. `NOETL_CHAOS_BIN`
/// names another binary (a copy, so a long campaign is not changed under
/// it by a rebuild).
pub fn noetl(home: &Path, env: &[(String, String)]) -> Command {
    let bin =
        std::env::var_os("NOETL_CHAOS_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_noetl").into());
    let mut c = Command::new(bin);
    c.env("NOETL_HOME", home)
        .env_remove("NOETL_NATS_URL")
        .env_remove("NATS_URL")
        .env_remove("NOETL_HTTP_ADDR")
        .env("NOETL_ACK_WAIT_MS", ACK_WAIT_MS.to_string())
        .env("NOETL_PYTHON_WARM", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// `noetl admin init --nats <urls>`: the streams and buckets. Retried for
/// up to 60 s (a cluster's nodes can each be healthy before the meta
/// leader counts them all as peers: "no suitable peers for placement");
/// then panics with its stderr.
pub fn init(home: &Path, env: &[(String, String)], urls: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let init = noetl(home, env)
            .args(["admin", "init", "--nats", urls])
            .output()
            .expect("run noetl admin init");
        if init.status.success() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "noetl admin init: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// One service process.
struct Proc {
    service: &'static str,
    name: String,
    child: Option<Child>,
}

/// The service processes of a run, all given the same server URLs.
pub struct Services {
    home: PathBuf,
    logs: PathBuf,
    urls: String,
    env: Vec<(String, String)>,
    procs: Vec<Proc>,
    /// Processes that exited although nobody killed them (restarted).
    pub unexpected_exits: Vec<String>,
}

impl Services {
    /// Start every service of [`service_names`] against `urls`, logging to
    /// `<logs>/<name>.log`.
    pub fn start(home: &Path, logs: &Path, urls: &str, env: &[(String, String)]) -> Self {
        std::fs::create_dir_all(logs).expect("logs dir");
        let mut s = Self {
            home: home.to_path_buf(),
            logs: logs.to_path_buf(),
            urls: urls.to_string(),
            env: env.to_vec(),
            procs: service_names()
                .into_iter()
                .map(|(service, name)| Proc {
                    service,
                    name,
                    child: None,
                })
                .collect(),
            unexpected_exits: Vec::new(),
        };
        for i in 0..s.procs.len() {
            s.spawn(i);
        }
        s
    }

    /// The service kind of process `i` (`router`, `executor`, ...).
    pub fn service(&self, i: usize) -> &'static str {
        self.procs[i].service
    }

    /// How many service processes there are.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    fn spawn(&mut self, i: usize) {
        let p = &mut self.procs[i];
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{}.log", p.name)))
            .expect("open service log");
        let child = noetl(&self.home, &self.env)
            .args(["serve", p.service, "--nats", &self.urls])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", p.name));
        p.child = Some(child);
    }

    /// SIGKILL service `i` (no drain, no ack).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start service `i` again if it is down.
    pub fn restart(&mut self, i: usize) {
        if self.procs[i].child.is_none() {
            self.spawn(i);
        }
    }

    /// Start again, and record, every service that exited although
    /// nobody killed it.
    pub fn reap(&mut self) {
        for i in 0..self.procs.len() {
            let exited = match self.procs[i].child.as_mut() {
                Some(c) => c.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = exited {
                self.unexpected_exits
                    .push(format!("{} ({status})", self.procs[i].name));
                self.procs[i].child = None;
                self.spawn(i);
            }
        }
    }

    /// Start every service that is down.
    pub fn heal(&mut self) {
        self.reap();
        for i in 0..self.procs.len() {
            self.restart(i);
        }
    }

    /// Kill every service (also done on drop).
    pub fn stop(&mut self) {
        for i in 0..self.procs.len() {
            self.kill(i);
        }
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        self.stop();
    }
}
