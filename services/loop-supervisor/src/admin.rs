//! What `noetl admin rebuild` asks of the loop-supervisor
//! (docs/operations.md "Rebuild"): an execution's open loop runs written
//! back from its events where the loop bucket lost them, as the
//! loop-supervisor itself does when a report finds one missing
//! (`rebuild.rs`), and the first command of each iteration in
//! flight, built as the dispatch builds it, from which the executor folds
//! the iteration's checkpoint (`noetl_executor::rebuild_checkpoint`).

use std::collections::BTreeMap;

use noetl_mesh::{
    effects::Effect, event_type::EventType, kv, plan::PlanRecord, runtime::HandlerError, Mesh,
};
use noetl_wire::{Event, TaskCommand};

use crate::collection::ChunkCache;
use crate::dispatch::{self, Read, Window};
use crate::messages;
use crate::rebuild::Streamed;
use crate::state::from_log::RunLog;
use crate::state::{LoopRun, RunAt};

/// An open loop run (started, not done), as [`rebuild_open_runs`] left it.
#[derive(Debug, Clone)]
pub struct OpenRun {
    /// The loop step.
    pub step: String,
    /// The loop run (its step-run) id.
    pub step_run_id: String,
    /// Its record was missing and was written back (its claims and a
    /// cursor loop's frames with it, each where missing).
    pub written: bool,
    /// The first command of each iteration in flight and not held by a
    /// pause, as the dispatch publishes it.
    pub in_flight: Vec<TaskCommand>,
    /// Why something of the run could not be rebuilt, if anything.
    pub notes: Vec<String>,
}

/// The runs `log` (the execution's events, in stream order) started and
/// did not end: step-run id and step.
pub fn open_runs(log: &[Event]) -> BTreeMap<&str, &str> {
    let mut open = BTreeMap::new();
    for ev in log {
        match EventType::of(ev) {
            Some(EventType::LoopStarted) => {
                open.insert(ev.step_run_id.as_str(), ev.step.as_str());
            }
            Some(EventType::LoopDone) => {
                open.remove(ev.step_run_id.as_str());
            }
            _ => {}
        }
    }
    open
}

/// Write back each open loop run of the execution of `plan` the loop
/// bucket lost (create-only: a record written meanwhile stands), and
/// return every open run with the first commands of its iterations in
/// flight. A run its events cannot rebuild is a note, not an error. The
/// log is read as the loop-supervisor reads it for a lost run
/// ([`crate::rebuild::Streamed`]): the events that say which runs are open
/// held, each run's own read again a chunk at a time.
pub async fn rebuild_open_runs(
    mesh: &Mesh,
    plan: &PlanRecord,
) -> Result<Vec<OpenRun>, HandlerError> {
    let log = Streamed::read(mesh, &plan.execution_id).await?;
    let open: Vec<(String, String)> = open_runs(log.events().0)
        .into_iter()
        .map(|(srid, name)| (srid.to_string(), name.to_string()))
        .collect();
    let chunks = ChunkCache::default();
    let mut out = Vec::new();
    for (srid, name) in &open {
        let mut open = OpenRun {
            step: name.to_string(),
            step_run_id: srid.to_string(),
            written: false,
            in_flight: Vec::new(),
            notes: Vec::new(),
        };
        let Some(step) = plan.step(name) else {
            open.notes
                .push(format!("loop run {srid}: the plan has no step {name:?}"));
            out.push(open);
            continue;
        };
        let at = RunAt { plan, step, srid };
        let stored = kv::get::<LoopRun>(mesh.loop_kv(), &at.key()).await?;
        let run = match stored {
            Some(run) => run,
            None => match crate::rebuild::restore_from(mesh, at, log.clone()).await {
                Ok(Some((run, written))) => {
                    open.written = written;
                    run
                }
                Ok(None) => continue,
                Err(HandlerError::Refused(why)) => {
                    open.notes.push(why);
                    out.push(open);
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        let w = Window {
            mesh,
            chunks: &chunks,
            at,
        };
        open.in_flight = first_commands(&w, &run, &mut open.notes).await?;
        out.push(open);
    }
    Ok(out)
}

/// The first commands of `run`'s iterations in flight (those a pause
/// holds are not out), as [`messages::iterations`] builds them.
async fn first_commands(
    w: &Window<'_>,
    run: &LoopRun,
    notes: &mut Vec<String>,
) -> Result<Vec<TaskCommand>, HandlerError> {
    let indices: Vec<u64> = run
        .in_flight
        .iter()
        .copied()
        .filter(|i| !run.held.contains(i))
        .collect();
    let Read { items, gone } = dispatch::read(w, run, &indices).await?;
    notes.extend(gone.into_iter().map(|(i, why)| {
        format!(
            "loop run {}: iteration {i}'s element cannot be read: {why}",
            w.at.srid
        )
    }));
    // One command per iteration (no batches): each is where the executor
    // folds that iteration's checkpoint from.
    Ok(messages::iterations(w.at, run, &items, 1)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Task { cmd, .. } => Some(cmd),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventType, step: &str, srid: &str) -> Event {
        Event {
            event_type: kind.wire_name().into(),
            step: step.into(),
            step_run_id: srid.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_run_is_open_from_its_start_to_its_end() {
        let log = [
            ev(EventType::LoopStarted, "a", "r1"),
            ev(EventType::LoopStarted, "b", "r2"),
            ev(EventType::LoopIterationDone, "a", "r1"),
            ev(EventType::LoopDone, "a", "r1"),
        ];
        assert_eq!(open_runs(&log), BTreeMap::from([("r2", "b")]));
        assert!(open_runs(&log[..0]).is_empty());
    }
}
