//! Requesting the run of one tick, and backfills: an execution request
//! on `<p>.exec.request` under the tick's execution id (also its
//! JetStream message id), so a tick requested again, by any replica or
//! any backfill, starts nothing new.

use chrono::{DateTime, Utc};
use noetl_mesh::{codec, Mesh};
use noetl_wire::ExecutionRequest;

use crate::cron::tick_text;
use crate::record::ScheduleRecord;
use crate::TimerError;

/// What [`request_tick`] needs.
pub struct TickRequest<'a> {
    /// The mesh.
    pub mesh: &'a Mesh,
    /// The schedule.
    pub record: &'a ScheduleRecord,
    /// The tick (canonical text, [`tick_text`]).
    pub tick: &'a str,
}

/// Publish the execution request of one tick and wait for its ack;
/// returns the execution id.
pub async fn request_tick(p: TickRequest<'_>) -> Result<String, TimerError> {
    let eid = p.record.execution_id(p.tick);
    let req = ExecutionRequest {
        execution_id: eid.clone(),
        path: p.record.playbook.clone(),
        version: p.record.version.unwrap_or(0),
        workload_json: codec::json_bytes(&p.record.run_workload(p.tick)),
        ..Default::default()
    };
    p.mesh
        .publish(p.mesh.subjects().exec_request(), &eid, codec::encode(&req))
        .await?
        .wait()
        .await?;
    Ok(eid)
}

/// Most ticks one backfill starts.
pub const MAX_BACKFILL: usize = 10_000;

/// What [`backfill`] needs.
pub struct Backfill<'a> {
    /// The mesh.
    pub mesh: &'a Mesh,
    /// The schedule.
    pub record: &'a ScheduleRecord,
    /// First instant (included).
    pub from: DateTime<Utc>,
    /// Last instant (included).
    pub to: DateTime<Utc>,
}

/// One tick of a backfill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backfilled {
    /// The tick.
    pub tick: String,
    /// Its execution.
    pub execution_id: String,
    /// It had started before (by the timer or an earlier backfill):
    /// nothing was requested.
    pub existed: bool,
}

/// Request the run of every tick of the schedule in `[from, to]`, whatever
/// the overlap policy and whether paused; ticks whose execution exists
/// already are left alone. At most [`MAX_BACKFILL`] ticks.
pub async fn backfill(p: Backfill<'_>) -> Result<Vec<Backfilled>, TimerError> {
    let range = |why: String| TimerError::Range {
        name: p.record.name.clone(),
        why,
    };
    if p.from > p.to {
        return Err(range("--from is after --to".into()));
    }
    let spec = p.record.spec().map_err(crate::record::RecordError::from)?;
    let ticks = spec
        .ticks_in(p.from, p.to, MAX_BACKFILL)
        .map_err(|_| range(format!("more than {MAX_BACKFILL} ticks in the range")))?;
    let mut out = Vec::with_capacity(ticks.len());
    for t in ticks {
        let tick = tick_text(t);
        let eid = p.record.execution_id(&tick);
        let existed = p.mesh.exec_header(&eid).await?.is_some();
        if !existed {
            request_tick(TickRequest {
                mesh: p.mesh,
                record: p.record,
                tick: &tick,
            })
            .await?;
        }
        out.push(Backfilled {
            tick,
            execution_id: eid,
            existed,
        });
    }
    Ok(out)
}
