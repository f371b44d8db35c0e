//! CPU time spent by the bench's own process (every mesh service runs in
//! it) and by its nats-server, read from `/proc/<pid>/stat` (user +
//! system, exited threads included), and the events stream's size: what
//! a step or a loop iteration costs the machine, beside how long it takes.

use std::time::Duration;

use noetl_integration::procstat;
use noetl_mesh::Mesh;

/// CPU time of the engine (this process) and of nats-server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// This process: every service of the in-process mesh, and the bench.
    pub engine: Duration,
    /// The nats-server (all of them, on a cluster).
    pub nats: Duration,
}

impl Cpu {
    /// Now, for this process and the servers `nats_pids`.
    pub fn now(nats_pids: &[u32]) -> Self {
        Self {
            engine: procstat::own_cpu_time(),
            nats: nats_pids.iter().map(|p| procstat::cpu_time(*p)).sum(),
        }
    }

    /// What was spent since `before`.
    pub fn since(self, before: Cpu) -> Cpu {
        Cpu {
            engine: self.engine.saturating_sub(before.engine),
            nats: self.nats.saturating_sub(before.nats),
        }
    }

    /// Both together.
    pub fn total(self) -> Duration {
        self.engine + self.nats
    }
}

/// Bytes and messages of the events stream now.
pub async fn event_bytes(mesh: &Mesh) -> (u64, u64) {
    match mesh.js().get_stream(mesh.subjects().events_stream()).await {
        Ok(mut s) => match s.info().await {
            Ok(info) => (info.state.bytes, info.state.messages),
            Err(_) => (0, 0),
        },
        Err(_) => (0, 0),
    }
}
