//! A step's result kept under its name (`<eid>.result.<step>`, bucket
//! exec) for the templates that read it, as the event log keeps it: the
//! result is written before the step's boundary event, and the step's
//! record after the router took that event, so a result missing while the
//! record says the step is done was lost, and is written back from the
//! events ([`restore`]) by the reader that misses it
//! (docs/architecture.md "The event log").

use serde_json::Value;

use crate::keys::Keys;
use crate::replay::{fold_log, Until};
use crate::state::{StepRecord, StepStatus};
use crate::{kv, Mesh, MeshError};

/// Whether a result of the step is owed when none is stored: its record
/// says it is done, or the execution's header is gone with its records
/// (a purge: only the events can tell).
pub fn owed(record: Option<&StepRecord>, header_missing: bool) -> bool {
    match record {
        Some(r) => r.status == StepStatus::Done,
        None => header_missing,
    }
}

/// The result of `step` of running execution `eid`, missing from KV,
/// written back from its events (create-only: one written meanwhile
/// wins) and returned; `None` when none is owed (the step has not run, or
/// did not end done) or the events do not say the execution runs.
pub async fn restore(mesh: &Mesh, eid: &str, step: &str) -> Result<Option<Value>, MeshError> {
    let record: Option<StepRecord> = kv::get(mesh.exec_kv(), &Keys::step(eid, step)).await?;
    let header_missing = record.is_none() && mesh.exec_header(eid).await?.is_none();
    if !owed(record.as_ref(), header_missing) {
        return Ok(None);
    }
    let folded = fold_log(mesh, eid, Until::End).await?;
    let Some(result) = folded.results.get(step).filter(|_| folded.is_running()) else {
        return Ok(None);
    };
    let key = Keys::result(eid, step);
    if kv::create(mesh.exec_kv(), &key, result).await? {
        tracing::warn!(execution_id = %eid, step, events = folded.events,
            "a step's result was missing: rebuilt from the events");
    }
    // Written meanwhile: that one, unless purged again since (then the
    // one the events give, not none).
    Ok(Some(
        kv::get(mesh.exec_kv(), &key)
            .await?
            .unwrap_or_else(|| result.clone()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: StepStatus) -> StepRecord {
        StepRecord {
            status,
            last_step_run_id: "r".into(),
            loop_counts: None,
            error: None,
            handled: Vec::new(),
        }
    }

    #[test]
    fn a_result_is_owed_by_a_done_step_or_when_the_header_went_too() {
        assert!(owed(Some(&record(StepStatus::Done)), false));
        assert!(!owed(Some(&record(StepStatus::Failed)), false));
        assert!(!owed(Some(&record(StepStatus::Skipped)), true));
        // Not run yet, the header there: nothing is owed, the log is not read.
        assert!(!owed(None, false));
        assert!(owed(None, true));
    }
}
