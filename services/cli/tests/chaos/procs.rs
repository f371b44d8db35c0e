//! The mesh of one chaos run as real processes: a nats-server on a fixed
//! port and store directory (so a killed one comes back with its data), and
//! the `noetl serve` processes of [`serve`](crate::serve). Everything is
//! killed when the run ends, however it ends.

use std::path::Path;

use noetl_mesh::server::{NatsServerProcess, ServerOptions};

use crate::serve::{self, Services};

/// The processes of a run.
pub struct Procs {
    url: String,
    nats_opts: ServerOptions,
    nats: Option<NatsServerProcess>,
    services: Services,
}

impl Procs {
    /// Start a nats-server in `dir`, create the mesh's streams and buckets,
    /// and start every service.
    pub fn start(dir: &Path) -> Self {
        let home = dir.join("home");
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
        serve::init(&home, &[], &url);
        let services = Services::start(&home, &dir.join("logs"), &url, &[]);
        Self {
            url,
            nats_opts,
            nats: Some(first),
            services,
        }
    }

    /// The nats-server's URL (the same across its restarts).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The service kind of process `i` (`router`, `executor`, ...).
    pub fn service(&self, i: usize) -> &'static str {
        self.services.service(i)
    }

    /// How many service processes there are.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// SIGKILL service `i` (no drain, no ack).
    pub fn kill(&mut self, i: usize) {
        self.services.kill(i)
    }

    /// Start service `i` again if it is down.
    pub fn restart(&mut self, i: usize) {
        self.services.restart(i)
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

    /// Start again, and record, every service that exited on its own.
    pub fn reap(&mut self) {
        self.services.reap()
    }

    /// Services that exited although nobody killed them.
    pub fn unexpected_exits(&mut self) -> Vec<String> {
        std::mem::take(&mut self.services.unexpected_exits)
    }

    /// Start whatever is down: the nats-server, then every service.
    pub fn heal(&mut self) {
        self.restart_nats();
        self.services.heal();
    }

    /// Stop everything (also done on drop).
    pub fn stop(&mut self) {
        self.services.stop();
        self.kill_nats();
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop();
    }
}
