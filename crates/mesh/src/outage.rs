//! When this process last saw the cluster unavailable: a pull request that
//! failed, or one left unanswered while the connection was down
//! ([`crate::runtime`]), or a consumer lookup that failed.
//!
//! A verdict drawn from the cluster's state right after an outage can be
//! wrong: an executor that sat out the outage (reconnecting, retrying its
//! setup, waiting out its pull backoff) shows no waiting pull request, so
//! its kind looks unserved although it is about to serve it. The router
//! asks how long the cluster has been calm before it fails a task as
//! unserved (docs/architecture.md, "A kind no executor serves"). A process
//! that just started has seen nothing: it counts as calm only since it
//! started.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The last outage this process saw.
#[derive(Debug)]
pub struct Outages {
    started: Instant,
    last: Mutex<Option<Instant>>,
}

impl Default for Outages {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            last: Mutex::new(None),
        }
    }
}

impl Outages {
    /// The cluster was unavailable just now.
    pub fn note(&self) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        *last = Some(Instant::now());
    }

    /// How long the cluster has looked available to this process: since
    /// its last outage, or since it started if it saw none.
    pub fn calm_for(&self) -> Duration {
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.unwrap_or(self.started).elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calm_counts_from_the_start_then_from_the_last_outage() {
        let o = Outages::default();
        std::thread::sleep(Duration::from_millis(30));
        assert!(o.calm_for() >= Duration::from_millis(30));
        o.note();
        assert!(o.calm_for() < Duration::from_millis(30));
    }
}
