//! What a loop run publishes, built as values: `loop.started`, the
//! messages of a window of iterations, the commands of a cursor loop's
//! claims, the terminal `loop.done` (and `step.failed`), and the
//! `step.failed` of a loop that cannot start. Pure: the handlers apply
//! them (`noetl_mesh::effects::apply`) after the state they follow is
//! written. Every id is deterministic, so building and publishing them
//! again (a redelivery) publishes nothing new.

use noetl_core::FailureMode;
use noetl_mesh::{
    codec,
    commands::{self, FirstTask},
    effects::Effect,
    events::EventDraft,
    ids::derive_id,
    patches::Carried,
    payloads::{
        self, EventPayload, IterationEnded, IterationStarted, LoopDone, LoopStarted, Reduced,
        Status, StepEnded,
    },
};
use noetl_wire::{ClaimRef, LoopCommand, TaskCommand};
use serde_json::{json, Value};

use crate::state::{loop_end, LoopRun, RunAt};

/// `loop.started` of `run`, with its `collection` (the list of its stored
/// chunks, or a reference to it; null for a cursor loop).
pub(crate) fn loop_started(at: RunAt<'_>, run: &LoopRun, collection: Value) -> Effect {
    let mode = at.step.loop_.as_ref().map(|l| l.spec.mode);
    Effect::Emit(
        EventDraft {
            execution_id: at.eid(),
            step_run_id: at.srid,
            step: &at.step.step,
            trace_id: &run.trace_id,
            ..Default::default()
        }
        .build(&LoopStarted {
            total: run.total,
            max_in_flight: run.max_in_flight,
            mode,
            deadline_ms: run.deadline_ms,
            deadline_of: run.deadline_of.clone(),
            collection,
            max_rows: run.cursor.as_ref().map_or(0, |c| c.max_rows),
        }),
    )
}

/// The messages that start iterations `items` (index and element, in
/// dispatch order) of `run`: for each, `loop.iteration.started`, then the
/// command of the step's first task carrying its `iter` (`{<iterator>:
/// element, index}`); a loop step without tasks has each iteration done at
/// once (`loop.iteration.done`). A step without a loop starts none.
pub(crate) fn iterations(at: RunAt<'_>, run: &LoopRun, items: &[(u64, Value)]) -> Vec<Effect> {
    let Some(lp) = at.step.loop_.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(items.len() * 2);
    for (i, item) in items {
        let i = *i;
        let started = IterationStarted {
            loop_run_id: at.srid.to_string(),
            index: i,
            claim: run.cursor.as_ref().and_then(|c| c.claim_of(i)),
        };
        out.push(run_event(at, run, &i.to_string(), &started));
        let Some(first) = at.step.tool.first() else {
            // A loop without tasks: every iteration is done at once.
            let done = IterationEnded {
                loop_run_id: at.srid.to_string(),
                index: i,
                status: Status::Ok,
                result: Value::Null,
                iter: Value::Null,
                reduce: Default::default(),
                error: Value::Null,
                handled: Vec::new(),
                last_task: None,
            };
            out.push(run_event(at, run, &i.to_string(), &done));
            continue;
        };
        let iter = json!({ lp.iterator.clone(): item, "index": i });
        let cmd = commands::first_task(FirstTask {
            execution_id: at.eid(),
            step: &at.step.step,
            step_run_id: at.srid,
            args: &run.args,
            trace_id: &run.trace_id,
            deadline: (run.deadline_ms, &run.deadline_of),
            iteration: Some((i, &iter)),
            total: run.total,
        });
        out.push(Effect::Task {
            kind: noetl_core::workbook::effective_kind(at.plan.playbook.workbook.as_ref(), first),
            task: first.name.clone(),
            cmd,
        });
    }
    out
}

/// The commands of claims `seqs` of a cursor loop run, with the kind whose
/// executors run them; `None` for a loop without a cursor.
pub(crate) fn claims<'a>(
    at: RunAt<'a>,
    run: &LoopRun,
    seqs: &[u64],
) -> Option<(&'a str, Vec<TaskCommand>)> {
    let c = run.cursor.as_ref()?;
    let cursor = at.step.loop_.as_ref().and_then(|l| l.cursor.as_ref())?;
    let cmds = seqs
        .iter()
        .map(|&seq| claim_command(at, run, seq, c.max_rows))
        .collect();
    Some((&cursor.kind, cmds))
}

/// The command of claim `seq` (its id derived from the loop run and the
/// sequence number).
fn claim_command(at: RunAt<'_>, run: &LoopRun, seq: u64, max_rows: u64) -> TaskCommand {
    TaskCommand {
        command_id: derive_id(&[at.srid, "claim", &seq.to_string()]),
        execution_id: at.eid().to_string(),
        step: at.step.step.clone(),
        step_run_id: at.srid.to_string(),
        pc: 0,
        attempt: 1,
        args_json: codec::json_bytes(&run.args),
        prev_json: Vec::new(),
        iteration: None,
        not_before_ms: 0,
        trace_id: run.trace_id.clone(),
        steps_taken: 0,
        resume_outcome_json: Vec::new(),
        deadline_ms: run.deadline_ms,
        deadline_of: run.deadline_of.clone(),
        results_json: Vec::new(),
        handled_json: Vec::new(),
        claim: Some(ClaimRef {
            loop_run_id: at.srid.to_string(),
            seq,
            max_rows,
        }),
    }
}

/// The terminal events of a finished `run` (its error, if any, already
/// recorded): `loop.done`, and `step.failed` when the loop fails its step
/// (then `loop.done` is not the step-run's boundary; [`loop_end`]).
pub(crate) fn loop_done(
    at: RunAt<'_>,
    run: &LoopRun,
    reduced: Carried<Vec<Reduced>>,
) -> Vec<Effect> {
    let fail_fast = at.step.failure_mode() == FailureMode::FailFast;
    let (status, failure) = loop_end(run, fail_fast);
    let done = LoopDone {
        boundary: failure.is_none(),
        status,
        counts: run.counts(),
        result: run.counts(),
        args: run.args.clone(),
        error: run.error.clone(),
        reduce_ref: reduced.reference(),
        reduce: reduced.inline().unwrap_or_default(),
        handled: run.handled.clone(),
    };
    let mut out = vec![run_event(at, run, "", &done)];
    if let Some(error) = failure {
        let failed = StepEnded {
            counts: Some(run.counts()),
            ..StepEnded::failed(error, run.args.clone())
        };
        out.push(run_event(at, run, "", &failed));
    }
    out
}

/// An event of loop run `run` the loop-supervisor writes itself (an
/// iteration's discriminated by its index).
fn run_event(
    at: RunAt<'_>,
    run: &LoopRun,
    discriminator: &str,
    payload: &impl EventPayload,
) -> Effect {
    Effect::Emit(
        EventDraft {
            execution_id: at.eid(),
            step_run_id: at.srid,
            step: &at.step.step,
            trace_id: &run.trace_id,
            discriminator,
            ..Default::default()
        }
        .build(payload),
    )
}

/// The `step.failed` of a loop that could not even start (`message` says
/// why; the error's kind is `loop.in`).
pub(crate) fn start_failed(cmd: &LoopCommand, message: String) -> Effect {
    // Only reached after the start decoded them (`on_start` refuses bad ones).
    let args = codec::args(&cmd.args_json).unwrap_or_default();
    Effect::Emit(
        EventDraft {
            execution_id: &cmd.execution_id,
            step_run_id: &cmd.step_run_id,
            step: &cmd.step,
            trace_id: &cmd.trace_id,
            ..Default::default()
        }
        .build(&StepEnded::failed(
            payloads::error_body("loop.in", message),
            args,
        )),
    )
}

#[cfg(test)]
mod tests;
