//! The timer's loop: every pass reads every schedule, decides what is due
//! ([`policy::decide`]), publishes the execution requests (and
//! cancellations) it implies, then advances the schedule's firing state
//! by compare-and-set. Any number of replicas run it: a tick's execution
//! id is derived from the schedule and the tick, so replicas that fire
//! the same tick request the same execution, and the router starts it
//! once; the compare-and-set lets one replica's state win, and the others
//! decide again from it. A crash between the publish and the write only
//! means the same request is published again.

use std::time::Duration;

use chrono::{DateTime, Utc};
use noetl_mesh::state::ExecStatus;
use noetl_mesh::Mesh;

use crate::policy::{self, Action, Previous, Situation};
use crate::start::{request_tick, TickRequest};
use crate::store::{Read, Schedules};
use crate::TimerError;

/// How the loop runs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Longest sleep between passes (a new or changed schedule is seen
    /// within it).
    pub poll: Duration,
    /// How late a tick may be and still fire as on time; older unfired
    /// ticks are missed and follow the schedule's catch-up policy.
    pub grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(1),
            grace: Duration::from_secs(5),
        }
    }
}

impl Settings {
    /// The defaults, overridden by `NOETL_TIMER_POLL_MS` and
    /// `NOETL_TIMER_GRACE_MS`; a value that is not a whole number of
    /// milliseconds is a configuration error naming the setting.
    pub fn from_env() -> Result<Self, noetl_mesh::MeshError> {
        let ms = |name: &str| match std::env::var(name) {
            Err(_) => Ok(None),
            Ok(v) => v
                .trim()
                .parse::<u64>()
                .map(|n| Some(Duration::from_millis(n)))
                .map_err(|_| {
                    noetl_mesh::MeshError::Config(format!(
                        "{name}={v:?}: expected a whole number of milliseconds"
                    ))
                }),
        };
        let d = Self::default();
        Ok(Self {
            poll: ms("NOETL_TIMER_POLL_MS")?
                .unwrap_or(d.poll)
                .max(Duration::from_millis(10)),
            grace: ms("NOETL_TIMER_GRACE_MS")?.unwrap_or(d.grace),
        })
    }
}

/// What one pass needs.
pub struct Pass<'a> {
    /// The mesh.
    pub mesh: &'a Mesh,
    /// The schedules.
    pub schedules: &'a Schedules,
    /// Settings.
    pub settings: Settings,
}

/// One pass over every schedule; returns when the next one is due (at
/// most `settings.poll` from now).
pub async fn pass(p: &Pass<'_>) -> Result<Duration, TimerError> {
    let mut wake = p.settings.poll;
    for read in p.schedules.list().await? {
        let name = read.record.name.clone();
        match fire_one(p, &read).await {
            Ok(Some(next)) => {
                let left = (next - Utc::now()).to_std().unwrap_or_default();
                wake = wake.min(left);
            }
            Ok(None) => {}
            // One schedule's trouble (a bad record, an outage) does not
            // stop the others; it is tried again next pass.
            Err(e) => tracing::warn!(schedule = %name, error = %e, "schedule not fired"),
        }
    }
    Ok(wake)
}

/// Decide and act for one schedule; returns its next wake-up.
async fn fire_one(p: &Pass<'_>, read: &Read) -> Result<Option<DateTime<Utc>>, TimerError> {
    let r = &read.record;
    let spec = r.spec().map_err(crate::record::RecordError::from)?;
    let now = Utc::now();
    let previous = previous(p.mesh, r, now).await?;
    let plan = policy::decide(&Situation {
        record: r,
        spec: &spec,
        now,
        grace: p.settings.grace,
        previous,
    });
    if plan.state == r.state {
        return Ok(policy::next_wake(r, &spec, now));
    }
    for action in &plan.actions {
        match action {
            Action::Cancel { execution_id } => {
                let why = format!("superseded by the next run of schedule {}", r.name);
                p.mesh.request_cancel(execution_id, &why).await?;
                tracing::info!(schedule = %r.name, execution_id = %execution_id, "previous run cancelled");
            }
            Action::Start { tick } => {
                let eid = request_tick(TickRequest {
                    mesh: p.mesh,
                    record: r,
                    tick,
                })
                .await?;
                tracing::info!(schedule = %r.name, tick = %tick, execution_id = %eid, "tick fired");
            }
        }
    }
    if !p.schedules.write_state(read, plan.state.clone()).await? {
        tracing::debug!(schedule = %r.name, "another writer advanced the schedule first");
        return Ok(None);
    }
    let mut after = r.clone();
    after.state = plan.state;
    Ok(policy::next_wake(&after, &spec, now))
}

/// The schedule's previous run, read from its execution header.
async fn previous(
    mesh: &Mesh,
    r: &crate::record::ScheduleRecord,
    now: DateTime<Utc>,
) -> Result<Previous, TimerError> {
    let Some(eid) = r.state.last_execution_id.as_deref() else {
        return Ok(Previous::Idle);
    };
    let running = mesh
        .exec_header(eid)
        .await?
        .map(|h| h.status == ExecStatus::Running);
    let requested = r.state.last_started_at.as_deref().and_then(policy::instant);
    Ok(policy::previous_of(running, requested, now))
}
