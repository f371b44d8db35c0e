//! What `/proc` says of a process: its CPU time so far and its peak
//! resident memory, for the bench and the heavy test to report per
//! process (services, nats-server). Zero where `/proc` cannot be read.

use std::time::Duration;

/// User + system CPU time of process `pid` so far.
pub fn cpu_time(pid: u32) -> Duration {
    cpu_time_of(&pid.to_string())
}

/// User + system CPU time of this process so far.
pub fn own_cpu_time() -> Duration {
    cpu_time_of("self")
}

/// Peak resident memory (`VmHWM`) of process `pid`, in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// User + system time of `/proc/<pid>/stat` (fields 14 and 15, clock
/// ticks).
fn cpu_time_of(pid: &str) -> Duration {
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
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / clock_ticks() as f64)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_spent_cpu_and_holds_memory() {
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(spin.elapsed());
        }
        assert!(own_cpu_time() > Duration::ZERO);
        assert!(cpu_time(std::process::id()) > Duration::ZERO);
        assert!(peak_rss_kib(std::process::id()) > 0);
        assert_eq!(peak_rss_kib(u32::MAX), 0, "no such process reads as zero");
    }
}
