//! The mesh of one chaos run as real processes: a nats-server on a fixed
//! port and store directory (so a killed one comes back with its data), and
//! `noetl serve` processes, each killed with SIGKILL and started again on
//! the schedule's word. Everything is killed when the run ends, however it
//! ends.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use noetl_mesh::server::{NatsServerProcess, ServerOptions};

/// The consumers' ack wait in chaos runs: a task whose executor was killed
/// comes back after this long.
pub const ACK_WAIT_MS: u64 = 2000;

/// The `noetl serve` processes of a run: two replicas of router,
/// scheduler, loop-supervisor and timer, and two executors serving every
/// kind.
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
/// that would point it elsewhere. `NOETL_CHAOS_BIN` names another binary
/// (a copy, so a long campaign is not changed under it by a rebuild).
pub fn noetl(home: &Path) -> Command {
    let bin =
        std::env::var_os("NOETL_CHAOS_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_noetl").into());
    let mut c = Command::new(bin);
    c.env("NOETL_HOME", home)
        .env_remove("NOETL_NATS_URL")
        .env_remove("NATS_URL")
        .env_remove("NOETL_HTTP_ADDR")
        .env("NOETL_ACK_WAIT_MS", ACK_WAIT_MS.to_string())
        .env("NOETL_PYTHON_WARM", "1");
    c
}

/// One service process.
struct Proc {
    service: &'static str,
    name: String,
    child: Option<Child>,
}

/// The processes of a run.
pub struct Procs {
    home: PathBuf,
    logs: PathBuf,
    url: String,
    nats_opts: ServerOptions,
    nats: Option<NatsServerProcess>,
    procs: Vec<Proc>,
    /// Processes that exited although nobody killed them (restarted).
    pub unexpected_exits: Vec<String>,
}

impl Procs {
    /// Start a nats-server in `dir`, create the mesh's streams and buckets,
    /// and start every service.
    pub fn start(dir: &Path) -> Self {
        let home = dir.join("home");
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).expect("logs dir");
        let store = dir.join("nats");
        let first = NatsServerProcess::start(ServerOptions {
            store_dir: store.clone(),
            port: None,
            binary: None,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let nats_opts = ServerOptions {
            store_dir: store,
            port: Some(first.port()),
            binary: None,
        };
        let url = first.url();
        let init = noetl(&home)
            .args(["admin", "init", "--nats", &url])
            .output()
            .expect("run noetl admin init");
        assert!(
            init.status.success(),
            "noetl admin init: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let mut procs = Self {
            home,
            logs,
            url,
            nats_opts,
            nats: Some(first),
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
        for i in 0..procs.procs.len() {
            procs.spawn(i);
        }
        procs
    }

    /// The nats-server's URL (the same across its restarts).
    pub fn url(&self) -> &str {
        &self.url
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
        let child = noetl(&self.home)
            .args(["serve", p.service, "--nats", &self.url])
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

    /// SIGKILL the nats-server.
    pub fn kill_nats(&mut self) {
        if let Some(mut s) = self.nats.take() {
            s.stop();
        }
    }

    /// Start the nats-server again on its port with its store.
    pub fn restart_nats(&mut self) {
        if self.nats.is_none() {
            let opts = ServerOptions {
                store_dir: self.nats_opts.store_dir.clone(),
                port: self.nats_opts.port,
                binary: None,
            };
            self.nats = Some(NatsServerProcess::start(opts).unwrap_or_else(|e| panic!("{e}")));
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

    /// Start whatever is down: the nats-server, then every service.
    pub fn heal(&mut self) {
        self.restart_nats();
        self.reap();
        for i in 0..self.procs.len() {
            self.restart(i);
        }
    }

    /// Stop everything (also done on drop).
    pub fn stop(&mut self) {
        for i in 0..self.procs.len() {
            self.kill(i);
        }
        self.kill_nats();
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop();
    }
}
