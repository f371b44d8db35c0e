//! noetl-timer: cron schedules that start playbook executions, each tick
//! exactly once.
//!
//! Schedules live in the `<p>_schedules` KV bucket (one record per name:
//! the playbook, the cron expression and time zone, workload overrides,
//! the overlap and catch-up policies, and the firing state). `noetl serve
//! timer` runs [`serve`]: a loop ([`fire`]) that any number of replicas
//! run side by side. A tick's execution id is derived from the schedule's
//! name and the tick, so however many replicas, retries or backfills
//! request it, the router starts one execution; the firing state moves on
//! by compare-and-set after the request was published.
//!
//! The decisions are plain functions: ticks in a time zone ([`cron`]),
//! which ticks are due, caught up, skipped, held or start, and what is
//! stored afterwards ([`policy`]).

pub mod cron;
mod error;
pub mod fire;
pub mod modes;
pub mod policy;
pub mod record;
pub mod start;
pub mod store;

pub use error::TimerError;
pub use fire::Settings;
pub use record::ScheduleRecord;
pub use store::Schedules;

use noetl_mesh::runtime::ServiceParams;
use noetl_mesh::MeshError;

/// What [`serve_with`] runs.
pub struct TimerParams {
    /// The mesh, shutdown token (`concurrency` is not used: a replica
    /// fires one schedule at a time).
    pub service: ServiceParams,
    /// Poll interval and grace.
    pub settings: Settings,
}

/// How long one pass over the schedules may take before it is abandoned.
pub const PASS_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Run the timer with settings from the environment ([`Settings::from_env`])
/// until `params.shutdown` is cancelled.
pub async fn serve(params: ServiceParams) -> Result<(), MeshError> {
    serve_with(TimerParams {
        service: params,
        settings: Settings::from_env()?,
    })
    .await
}

/// Run the timer until shut down. Ready (`/readyz`) once a pass has read
/// the schedules; not ready while passes fail (it keeps trying).
pub async fn serve_with(p: TimerParams) -> Result<(), MeshError> {
    let mesh = p.service.mesh.clone();
    let schedules = Schedules::new(mesh.schedules_kv().clone());
    let health = mesh.health().register("timer");
    let pass = fire::Pass {
        mesh: &mesh,
        schedules: &schedules,
        settings: p.settings,
    };
    tracing::info!(
        poll_ms = p.settings.poll.as_millis() as u64,
        grace_ms = p.settings.grace.as_millis() as u64,
        "timer running"
    );
    while !p.service.shutdown.is_cancelled() {
        // A pass that hangs (a JetStream read that never answers) must not
        // stop every schedule: it is abandoned and the next one starts.
        let passed = tokio::time::timeout(PASS_LIMIT, fire::pass(&pass))
            .await
            .unwrap_or(Err(TimerError::Stalled(PASS_LIMIT)));
        let wait = match passed {
            Ok(wait) => {
                health.ready();
                wait
            }
            Err(e) => {
                tracing::warn!(error = %e, "timer pass failed; trying again");
                health.not_ready(&format!("pass failed: {e}"));
                p.settings.poll
            }
        };
        // A tick is fired just after it is due, not before.
        let wait = wait.max(std::time::Duration::from_millis(10));
        tokio::select! {
            _ = p.service.shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    Ok(())
}
