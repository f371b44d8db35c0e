//! The task command, in and out: its JSON fields decoded, whether a late
//! copy's work is already over, and the command that continues the
//! step-run elsewhere.

use noetl_mesh::{
    codec,
    ids::derive_id,
    keys::Keys,
    kv,
    state::{ExecHeader, LoopProgress},
    MeshError,
};
use noetl_wire::{IterationRef, TaskCommand};
use serde_json::{Map, Value};

use super::next::At;
use super::{Cursor, Executor, HandlerError, StepRun};

impl Executor {
    /// Whether a redelivered command's work is already over (see
    /// [`command_ended`]): reads the header (the one its events give when
    /// it was removed) and, for an iteration or a
    /// claim, its loop run; for a claim [`claim_log_decides`] names, whether
    /// its `loop.claimed` is stored; for an iteration whose loop run is
    /// missing, whether its end is. `came_again`: a redelivery, or a claim
    /// the loop-supervisor sent again. First deliveries skip this read,
    /// except a claim sent again.
    pub async fn ended(
        &self,
        cmd: &TaskCommand,
        came_again: bool,
    ) -> Result<Option<String>, MeshError> {
        let eid = cmd.execution_id.as_str();
        // A header compacted or purged since the first delivery: the
        // events say whether the execution still runs (and which step-runs).
        let header = self.mesh.header_or_logged(eid).await?;
        let loop_run = match (&cmd.claim, &cmd.iteration) {
            (Some(c), _) => Some(&c.loop_run_id),
            (None, Some(it)) if !it.loop_run_id.is_empty() => Some(&it.loop_run_id),
            _ => None,
        };
        let progress = match loop_run {
            Some(run) => {
                kv::get::<LoopProgress>(self.mesh.loop_kv(), &Keys::loop_run(eid, run)).await?
            }
            None => None,
        };
        if let Some(why) = command_ended(cmd, header.as_ref(), progress.as_ref()) {
            return Ok(Some(why));
        }
        match (&cmd.claim, &cmd.iteration) {
            (Some(c), _)
                if claim_log_decides(progress.as_ref(), came_again)
                    && self.mesh.claim_reported(eid, &c.loop_run_id, c.seq).await? =>
            {
                Ok(Some(format!(
                    "claim {} of loop run {} was reported",
                    c.seq, c.loop_run_id
                )))
            }
            // The loop run is missing (a purge): the log says whether the
            // iteration ended.
            (None, Some(it)) if progress.is_none() && !it.loop_run_id.is_empty() => {
                let (run, index) = (&it.loop_run_id, it.index);
                let ended = self.mesh.iterations_ended(eid, run).await?;
                Ok(ended.contains(&index).then(|| {
                    format!("iteration {index} of loop run {run} ended (its end is stored)")
                }))
            }
            _ => Ok(None),
        }
    }
}

/// Whether a claim that [`command_ended`] lets run, and that came again
/// (`came_again`: a redelivery, or sent again by the loop-supervisor),
/// must first look for its `loop.claimed` in the log: when its loop run is
/// missing (purged, being rebuilt from the events), or when it came again
/// (its executor may have stored the report and died before the ack, and
/// the loop-supervisor not applied it yet). Run again after its report, a
/// claim's SQL can take other rows under the same claim, and their report,
/// a duplicate of the stored one, is dropped: those rows would stay
/// claimed. A claim's first send is not checked at all: the reads would sit
/// on the loop's critical path (a claim's latency stalls a cursor loop
/// whose window drained), and one log read per claim would grow with the
/// log.
pub(super) fn claim_log_decides(progress: Option<&LoopProgress>, came_again: bool) -> bool {
    progress.is_none() || came_again
}

/// The JSON fields of a task command, decoded.
#[derive(Debug)]
pub(super) struct DecodedCommand {
    /// The step's args as the command carries them (large ones are
    /// references).
    pub args: Value,
    /// Loop run id and iteration index, for an iteration's command.
    pub loop_run: Option<(String, u64)>,
    /// Items of the loop's collection (0: unknown or not a loop).
    pub loop_total: u64,
    /// Where the pipeline starts: the command's task, attempt and task
    /// runs so far, its `_prev`, `iter`, reducer contributions, task
    /// results read by name (large ones by reference), the child outcome
    /// it resumes after and the task errors handled so far; its `ctx` is
    /// the reader's to fill.
    pub cursor: Cursor,
}

/// Decode a task command's JSON fields; a field that is not the JSON it
/// should be refuses the command, naming the field, step and execution.
pub(super) fn decode_command(
    cmd: &TaskCommand,
    step: &str,
) -> Result<DecodedCommand, HandlerError> {
    let eid = cmd.execution_id.as_str();
    let refuse = |what: &str, e: &dyn std::fmt::Display| {
        HandlerError::Refused(format!(
            "task command of execution {eid} step {step:?}: {what}: {e}"
        ))
    };
    let args = codec::args(&cmd.args_json).map_err(|e| refuse("args", &e))?;
    let prev = codec::json_value(&cmd.prev_json).map_err(|e| refuse("_prev", &e))?;
    let (loop_run, iter, reduce) = match &cmd.iteration {
        None => (None, Map::new(), Map::new()),
        Some(it) => {
            let iter = codec::json_object(&it.iter_json).map_err(|e| refuse("iter", &e))?;
            let reduce = codec::json_object(&it.reduce_json).map_err(|e| refuse("reduce", &e))?;
            let lr = (!it.loop_run_id.is_empty()).then(|| (it.loop_run_id.clone(), it.index));
            (lr, iter, reduce)
        }
    };
    let loop_total = cmd.iteration.as_ref().map(|it| it.total).unwrap_or(0);
    let results = codec::json_object(&cmd.results_json).map_err(|e| refuse("task results", &e))?;
    let resume = if cmd.resume_outcome_json.is_empty() {
        None
    } else {
        let v = codec::json_value(&cmd.resume_outcome_json)
            .map_err(|e| refuse("resume outcome", &e))?;
        Some(serde_json::from_value(v).map_err(|e| refuse("resume outcome", &e))?)
    };
    let handled = if cmd.handled_json.is_empty() {
        Vec::new()
    } else {
        serde_json::from_slice(&cmd.handled_json).map_err(|e| refuse("handled errors", &e))?
    };
    Ok(DecodedCommand {
        args,
        loop_run,
        loop_total,
        cursor: Cursor {
            pc: cmd.pc as usize,
            attempt: cmd.attempt.max(1),
            prev,
            iter,
            ctx: Value::Null,
            steps_taken: cmd.steps_taken,
            reduce,
            resume,
            results,
            handled,
        },
    })
}

/// Why a command's work is already over, or `None` while it may run: the
/// execution has ended, the step-run's token is no longer
/// live (the router applied its boundary, e.g. a timeout or an earlier
/// copy of this command), or the loop iteration was already counted. A
/// late copy of such a command (a redelivery after its work was reported)
/// is acked without running: running it again would repeat its tool calls
/// and rewrite a checkpoint that nothing will read.
pub fn command_ended(
    cmd: &TaskCommand,
    header: Option<&ExecHeader>,
    progress: Option<&LoopProgress>,
) -> Option<String> {
    // No header: nothing says the work is over (an executor driven without
    // a router, or a header not yet readable); the plan read decides.
    let h = header?;
    if h.status.is_terminal() {
        return Some(format!("its execution is {:?}", h.status));
    }
    if !h.is_live(&cmd.step_run_id) {
        return Some(format!("step-run {} has ended", cmd.step_run_id));
    }
    // A loop run's record stays when the run finishes, so a missing one was
    // lost (a purge): the log decides (`Executor::ended`), and the
    // loop-supervisor rebuilds the run from its events when a report comes.
    if let Some(c) = &cmd.claim {
        return match progress {
            None => None,
            Some(p) if p.claim_applied(c.seq) => Some(format!(
                "claim {} of loop run {} was applied",
                c.seq, c.loop_run_id
            )),
            Some(_) => None,
        };
    }
    match (&cmd.iteration, progress) {
        (Some(it), _) if it.loop_run_id.is_empty() => None,
        (Some(_), None) => None,
        (Some(it), Some(p)) if p.counted(it.index) => Some(format!(
            "iteration {} of loop run {} was counted",
            it.index, it.loop_run_id
        )),
        _ => None,
    }
}

impl StepRun<'_> {
    /// The command that continues this step-run at task `at`, not before
    /// `not_before_ms` (0: at once), carrying the cursor.
    pub(super) fn command(&self, cur: &Cursor, at: At, not_before_ms: u64) -> TaskCommand {
        let command_id = derive_id(&[
            "task",
            &self.cmd.step_run_id,
            &self.index,
            &at.pc.to_string(),
            &at.attempt.to_string(),
            &cur.steps_taken.to_string(),
        ]);
        TaskCommand {
            command_id,
            execution_id: self.cmd.execution_id.clone(),
            step: self.step.step.clone(),
            step_run_id: self.cmd.step_run_id.clone(),
            pc: at.pc as u32,
            attempt: at.attempt,
            args_json: self.cmd.args_json.clone(),
            prev_json: codec::json_bytes(&cur.prev),
            iteration: self.iteration_ref(cur),
            not_before_ms,
            trace_id: self.cmd.trace_id.clone(),
            steps_taken: cur.steps_taken,
            resume_outcome_json: Vec::new(),
            deadline_ms: self.cmd.deadline_ms,
            deadline_of: self.cmd.deadline_of.clone(),
            results_json: if cur.results.is_empty() {
                Vec::new()
            } else {
                codec::json_bytes(&Value::Object(cur.results.clone()))
            },
            claim: None,
            handled_json: if cur.handled.is_empty() {
                Vec::new()
            } else {
                codec::json_bytes(&serde_json::to_value(&cur.handled).unwrap_or_default())
            },
            batch: Vec::new(),
        }
    }

    /// The iteration a continuing command carries: the loop's, or outside
    /// loops `iter` as pipeline-local scratch space (with an empty
    /// `loop_run_id`), when it holds anything.
    fn iteration_ref(&self, cur: &Cursor) -> Option<IterationRef> {
        let iter_json = || codec::json_bytes(&Value::Object(cur.iter.clone()));
        match &self.loop_run {
            Some((loop_run_id, index)) => Some(IterationRef {
                loop_run_id: loop_run_id.clone(),
                index: *index,
                iter_json: iter_json(),
                reduce_json: if cur.reduce.is_empty() {
                    Vec::new()
                } else {
                    codec::json_bytes(&Value::Object(cur.reduce.clone()))
                },
                total: self.loop_total,
            }),
            None if !cur.iter.is_empty() => Some(IterationRef {
                loop_run_id: String::new(),
                index: 0,
                iter_json: iter_json(),
                reduce_json: Vec::new(),
                total: 0,
            }),
            None => None,
        }
    }
}
