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
        self, BatchAccepted, BatchItem, EventPayload, IterationEnded, IterationStarted, LoopDone,
        LoopStarted, Reduced, Status, StepEnded,
    },
};
use noetl_wire::{ClaimRef, LoopCommand, TaskCommand};
use serde_json::{json, Value};

use crate::state::{batches, batches::Sending, loop_end, LoopRun, RunAt};

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
            continues: run.continues.clone(),
            continued_events: run.continued_events,
        }),
    )
}

/// The messages that start iterations `items` (index and element, in
/// dispatch order) of `run`: for each, `loop.iteration.started`, then the
/// command of the step's first task carrying its `iter` (`{<iterator>:
/// element, index}`); a loop step without tasks has each iteration done at
/// once (`loop.iteration.done`). A step without a loop starts none.
///
/// Up to `batch` iterations go out together ([`batch_size`]): one
/// `batch.accepted` and one command for them all (docs/architecture.md
/// "Loop windows in batches"), in the batches the run recorded when they
/// entered the window, so a window published again publishes the same
/// messages.
pub(crate) fn iterations(
    at: RunAt<'_>,
    run: &LoopRun,
    items: &[(u64, Value)],
    batch: usize,
) -> Vec<Effect> {
    let Some(lp) = at.step.loop_.as_ref() else {
        return Vec::new();
    };
    let iters: Vec<(u64, Value)> = items
        .iter()
        .map(|(i, item)| (*i, json!({ lp.iterator.clone(): item, "index": i })))
        .collect();
    let Some(first) = at.step.tool.first() else {
        return iters
            .iter()
            .flat_map(|(i, _)| without_tasks(at, run, *i))
            .collect();
    };
    let kind = noetl_core::workbook::effective_kind(at.plan.playbook.workbook.as_ref(), first);
    let size = batch_size(run.max_in_flight, batch, at.step);
    let mut out = Vec::with_capacity(items.len() * 2);
    for group in groups(run, &iters, size) {
        let (started, cmd) = match group {
            [(i, iter)] => (
                one_started(at, run, *i),
                commands::first_task(first_task(at, run, Some((*i, iter)))),
            ),
            group => (
                batch_accepted(at, run, group),
                commands::first_batch(
                    first_task(at, run, None),
                    &group.iter().map(|(i, v)| (*i, v)).collect::<Vec<_>>(),
                ),
            ),
        };
        out.push(started);
        out.push(Effect::Task {
            kind: kind.clone(),
            task: first.name.clone(),
            cmd,
        });
    }
    out
}

/// Bytes of `iter` a batch carries at most: a larger element goes out in a
/// smaller batch (alone when it is larger itself).
const BATCH_BYTES: usize = 256 * 1024;

/// Iterations per batch of a loop step whose window is `max_in_flight`,
/// at most `batch`: a quarter of the window, so that several batches are
/// in flight at once (an executor each, and the next batch goes out while
/// the others run); 1 (no batches) for a step whose commands wait for a
/// concurrency slot or a rate token each (`spec.policy.concurrency`,
/// `rate`).
pub(crate) fn batch_size(max_in_flight: u64, batch: usize, step: &noetl_core::Step) -> usize {
    window_batch(max_in_flight, step_batch(batch, step))
}

/// Iterations per batch of loop step `step` at most: `batch`, or 1 when
/// its commands wait for a concurrency slot or a rate token each.
pub(crate) fn step_batch(batch: usize, step: &noetl_core::Step) -> usize {
    if step.is_gated() {
        1
    } else {
        batch
    }
}

/// Iterations per batch of a window of `max_in_flight`: a quarter of it,
/// at least 1 and at most `batch`.
pub(crate) fn window_batch(max_in_flight: u64, batch: usize) -> usize {
    let quarter = usize::try_from(max_in_flight / 4).unwrap_or(usize::MAX);
    quarter.clamp(1, batch.max(1))
}

/// `iters` (in dispatch order) in the batches `run` records for them
/// ([`batches`]), each split further where it would carry more than
/// [`BATCH_BYTES`] of `iter` (a function of its elements alone, so a
/// batch sent again splits the same); those it records none for (a run
/// of an older loop-supervisor) cut into groups of at most `size`. A
/// `size` of 1 asks for each iteration's own command.
fn groups<'i>(run: &LoopRun, iters: &'i [(u64, Value)], size: usize) -> Vec<&'i [(u64, Value)]> {
    if size <= 1 {
        return cut(iters, 1);
    }
    let mut out = Vec::new();
    let mut start = 0;
    while start < iters.len() {
        let of = batches::batch_of(run, iters[start].0);
        let len = iters[start..]
            .iter()
            .take_while(|(i, _)| batches::batch_of(run, *i) == of)
            .count();
        let part = &iters[start..start + len];
        out.extend(cut(part, if of.is_some() { len } else { size }));
        start += len;
    }
    out
}

/// `iters` cut in order into groups of at most `size`, each carrying at
/// most [`BATCH_BYTES`] of `iter`.
fn cut(iters: &[(u64, Value)], size: usize) -> Vec<&[(u64, Value)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (k, (_, iter)) in iters.iter().enumerate() {
        let b = if size > 1 { approx_bytes(iter) } else { 0 };
        if k > start && (k - start >= size || bytes + b > BATCH_BYTES) {
            out.push(&iters[start..k]);
            (start, bytes) = (k, 0);
        }
        bytes += b;
    }
    if start < iters.len() {
        out.push(&iters[start..]);
    }
    out
}

/// About how many bytes `v` is as JSON (strings and numbers counted as
/// written, without escapes).
fn approx_bytes(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 20,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(approx_bytes).sum::<usize>() + a.len() + 2,
        Value::Object(o) => {
            o.iter()
                .map(|(k, v)| k.len() + 4 + approx_bytes(v))
                .sum::<usize>()
                + 2
        }
    }
}

/// What the first command of an iteration (or, `None`, of a batch) of
/// `run` carries.
fn first_task<'a>(
    at: RunAt<'a>,
    run: &'a LoopRun,
    iteration: Option<(u64, &'a Value)>,
) -> FirstTask<'a> {
    FirstTask {
        execution_id: &at.plan.execution_id,
        step: &at.step.step,
        step_run_id: at.srid,
        args: &run.args,
        trace_id: &run.trace_id,
        deadline: (run.deadline_ms, &run.deadline_of),
        iteration,
        total: run.total,
    }
}

/// `loop.iteration.started` of iteration `i`.
fn one_started(at: RunAt<'_>, run: &LoopRun, i: u64) -> Effect {
    let started = IterationStarted {
        loop_run_id: at.srid.to_string(),
        index: i,
        claim: run.cursor.as_ref().and_then(|c| c.claim_of(i)),
    };
    run_event(at, run, &i.to_string(), &started)
}

/// `batch.accepted` of the iterations of `group`.
fn batch_accepted(at: RunAt<'_>, run: &LoopRun, group: &[(u64, Value)]) -> Effect {
    let items = group
        .iter()
        .map(|(i, _)| BatchItem {
            index: *i,
            claim: run.cursor.as_ref().and_then(|c| c.claim_of(*i)),
        })
        .collect();
    let key = commands::batch_key(group.iter().map(|(i, _)| *i));
    let accepted = BatchAccepted {
        loop_run_id: at.srid.to_string(),
        items,
    };
    run_event(at, run, &key, &accepted)
}

/// A loop without tasks: iteration `i` is done at once.
fn without_tasks(at: RunAt<'_>, run: &LoopRun, i: u64) -> [Effect; 2] {
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
    [
        one_started(at, run, i),
        run_event(at, run, &i.to_string(), &done),
    ]
}

/// The commands of claims `seqs` of a cursor loop run, with the kind whose
/// executors run them (marked `again` when `how` is [`Sending::Again`]);
/// `None` for a loop without a cursor.
pub(crate) fn claims<'a>(
    at: RunAt<'a>,
    run: &LoopRun,
    seqs: &[u64],
    how: Sending,
) -> Option<(&'a str, Vec<TaskCommand>)> {
    let c = run.cursor.as_ref()?;
    let cursor = at.step.loop_.as_ref().and_then(|l| l.cursor.as_ref())?;
    let cmds = seqs
        .iter()
        .map(|&seq| claim_command(at, run, seq, c.max_rows, how))
        .collect();
    Some((&cursor.kind, cmds))
}

/// The command of claim `seq` (its id derived from the loop run and the
/// sequence number), marked `again` when sent again.
fn claim_command(
    at: RunAt<'_>,
    run: &LoopRun,
    seq: u64,
    max_rows: u64,
    how: Sending,
) -> TaskCommand {
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
            again: how == Sending::Again,
            identity: (run.cursor.iter().flat_map(|c| &c.claims))
                .find(|s| s.seq == seq)
                .map(|s| s.identity.clone())
                .unwrap_or_default(),
        }),
        batch: Vec::new(),
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
