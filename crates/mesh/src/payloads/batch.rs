//! The payloads of a loop window sent in batches (docs/architecture.md
//! "Loop windows in batches"): `batch.accepted`, the loop-supervisor's
//! record of the iterations it sent as one command, and `batch.completed`,
//! an executor's report of the iterations that ended in it. Readers of the
//! log get each unfolded into the per-iteration events it stands for
//! ([`crate::events::unfold`]).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{IterationEnded, LastTask, Status};
use crate::handled::HandledError;

/// `batch.accepted`, written by the loop-supervisor before the batch's
/// command goes out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchAccepted {
    /// The loop run (its step-run id).
    pub loop_run_id: String,
    /// The iterations the command runs, each a `loop.iteration.started`.
    pub items: Vec<BatchItem>,
}

/// One iteration of a batch: what its `loop.iteration.started` says
/// besides the loop run ([`super::IterationStarted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItem {
    /// The iteration.
    pub index: u64,
    /// A cursor loop's iteration: the claim whose rows it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<u64>,
}

/// `batch.completed`, written by the executor that ran a batch: the ends
/// of its iterations that ended in it (an iteration handed off to another
/// kind, or waiting for a child execution, reports its end on its own
/// later), read live by the loop-supervisor.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchCompleted {
    /// The loop run (its step-run id).
    pub loop_run_id: String,
    /// Each iteration's end.
    pub ends: Vec<BatchEnd>,
}

/// One iteration's end inside a `batch.completed`.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchEnd {
    /// When it ended (Unix epoch ms): its `loop.iteration.done`'s time.
    pub at: u64,
    /// The payload of its `loop.iteration.done` / `.failed` in its compact
    /// form ([`compact_end`]): without the loop run, which the batch names
    /// once, and without the fields that hold their default. An
    /// [`IterationEnded`] reads it as it is; [`full_end`] restores the
    /// payload as it would have been stored on its own. (Batches written
    /// before the compact form hold that payload whole, which both read.)
    pub end: Box<RawValue>,
}

/// An iteration's end as a batch carries it: [`IterationEnded`] without
/// its loop run, and without each field that holds its default (`ok`,
/// `null`, empty), its last task's `task.done` likewise ([`CompactTask`]).
#[derive(Serialize)]
struct CompactEnd<'a> {
    index: u64,
    #[serde(skip_serializing_if = "is_ok")]
    status: Status,
    #[serde(skip_serializing_if = "Value::is_null")]
    result: &'a Value,
    #[serde(skip_serializing_if = "Value::is_null")]
    iter: &'a Value,
    #[serde(skip_serializing_if = "Map::is_empty")]
    reduce: &'a Map<String, Value>,
    #[serde(skip_serializing_if = "Value::is_null")]
    error: &'a Value,
    #[serde(skip_serializing_if = "<[HandledError]>::is_empty")]
    handled: &'a [HandledError],
    #[serde(skip_serializing_if = "Option::is_none")]
    last_task: Option<CompactTask<'a>>,
}

/// A carried `task.done` in a batch: [`LastTask`] without the fields that
/// hold the default [`super::TaskDone`]'s reader restores (`ok`, first attempt,
/// no duration, `continue`, `null`) and without its iteration, which is
/// the end's.
#[derive(Serialize)]
struct CompactTask<'a> {
    task: &'a str,
    task_run_id: &'a str,
    #[serde(skip_serializing_if = "is_outcome_ok")]
    status: noetl_core::OutcomeStatus,
    #[serde(skip_serializing_if = "is_first")]
    attempt: u32,
    #[serde(skip_serializing_if = "is_zero")]
    duration_ms: u64,
    #[serde(skip_serializing_if = "Value::is_null")]
    result: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: &'a Option<noetl_core::OutcomeError>,
    #[serde(skip_serializing_if = "is_continue")]
    action: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: &'a Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    set_ctx: &'a Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    set_iter: &'a Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: &'a Option<super::RetryAt>,
    #[serde(skip_serializing_if = "Option::is_none")]
    set_ctx_ref: &'a Option<Value>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    reduced: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ctx_refused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    started: &'a Option<super::AttemptStart>,
}

fn is_ok(s: &Status) -> bool {
    *s == Status::Ok
}
fn is_outcome_ok(s: &noetl_core::OutcomeStatus) -> bool {
    *s == noetl_core::OutcomeStatus::Ok
}
fn is_first(n: &u32) -> bool {
    *n == 1
}
fn is_zero(n: &u64) -> bool {
    *n == 0
}
fn is_continue(s: &&str) -> bool {
    *s == super::task::DEFAULT_ACTION
}

/// `ended` in the compact form a `batch.completed` carries it in
/// ([`BatchEnd::end`]).
pub fn compact_end(ended: &IterationEnded) -> Vec<u8> {
    let last_task = ended.last_task.as_deref().map(|t| CompactTask {
        task: &t.task,
        task_run_id: &t.task_run_id,
        status: t.done.status,
        attempt: t.done.attempt,
        duration_ms: t.done.duration_ms,
        result: &t.done.result,
        error: &t.done.error,
        action: &t.done.action,
        rule: &t.done.rule,
        set_ctx: &t.done.set_ctx,
        set_iter: &t.done.set_iter,
        retry: &t.done.retry,
        set_ctx_ref: &t.done.set_ctx_ref,
        reduced: &t.done.reduced,
        ctx_refused: t.done.ctx_refused,
        started: &t.done.started,
    });
    serde_json::to_vec(&CompactEnd {
        index: ended.index,
        status: ended.status,
        result: &ended.result,
        iter: &ended.iter,
        reduce: &ended.reduce,
        error: &ended.error,
        handled: &ended.handled,
        last_task,
    })
    .expect("payload types serialise to JSON")
}

/// An end as a batch carries it, read whole: [`IterationEnded`] with the
/// `task.done` it carries.
#[derive(Deserialize)]
struct Carried {
    #[serde(flatten)]
    end: IterationEnded,
    #[serde(default)]
    last_task: Option<LastTask>,
}

/// The payload an end of a batch of loop run `loop_run_id` ([`BatchEnd::end`],
/// compact or whole) would have had stored on its own: every field
/// restored, its last task's `task.done` (with its iteration) inside it.
pub fn full_end(loop_run_id: &str, end: &RawValue) -> Result<IterationEnded, serde_json::Error> {
    let Carried { mut end, last_task } = serde_json::from_str(end.get())?;
    if end.loop_run_id.is_empty() {
        end.loop_run_id = loop_run_id.to_string();
    }
    end.last_task = last_task.map(|mut t| {
        t.done.index.get_or_insert(end.index);
        Box::new(t)
    });
    Ok(end)
}

super::payload_of! {
    BatchAccepted => BatchAccepted,
    BatchCompleted => BatchCompleted,
}
