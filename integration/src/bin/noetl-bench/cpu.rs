//! CPU time spent by the bench's own process (every mesh service runs in
//! it) and by its nats-server, read from `/proc/<pid>/stat` (user +
//! system, exited threads included), and the events stream's size: what
//! a step or a loop iteration costs the machine, beside how long it takes.

use std::time::Duration;

use noetl_mesh::Mesh;

/// CPU time of the engine (this process) and of nats-server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// This process: every service of the in-process mesh, and the bench.
    pub engine: Duration,
    /// The nats-server.
    pub nats: Duration,
}

impl Cpu {
    /// Now, for this process and the server `nats_pid`.
    pub fn now(nats_pid: Option<u32>) -> Self {
        Self {
            engine: of("self"),
            nats: nats_pid.map(|p| of(&p.to_string())).unwrap_or_default(),
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

/// User + system CPU time of process `pid` so far.
pub fn process(pid: u32) -> Duration {
    of(&pid.to_string())
}

/// User + system time of `/proc/<pid>/stat` (fields 14 and 15, clock
/// ticks); zero where `/proc` cannot be read.
fn of(pid: &str) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The command name (field 2) may hold spaces: count after its `)`.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let hz = clock_ticks();
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / hz as f64)
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as u64
    } else {
        100
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
