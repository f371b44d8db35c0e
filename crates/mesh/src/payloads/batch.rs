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
    /// form ([`compact_end`]): without what the batch or its own fields
    /// say, and without the fields that hold their default.
    /// [`full_end`] restores the payload as it would have been stored on
    /// its own, [`counted_end`] what the loop-supervisor counts. (Batches
    /// written before the compact form hold that payload whole, which both
    /// read.)
    pub end: Box<RawValue>,
}

/// An iteration's end as a batch carries it: [`IterationEnded`] without
/// what the batch or the end's own fields already say, and without each
/// field that holds its default ([`compact_end`]).
#[derive(Serialize)]
struct CompactEnd<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    loop_run_id: Option<&'a str>,
    index: u64,
    #[serde(skip_serializing_if = "is_ok")]
    status: Status,
    #[serde(skip_serializing_if = "Value::is_null")]
    result: &'a Value,
    #[serde(skip_serializing_if = "Value::is_null")]
    iter: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    reduce: Option<&'a Map<String, Value>>,
    #[serde(skip_serializing_if = "Value::is_null")]
    error: &'a Value,
    #[serde(skip_serializing_if = "<[HandledError]>::is_empty")]
    handled: &'a [HandledError],
    #[serde(skip_serializing_if = "Option::is_none")]
    last_task: Option<CompactTask<'a>>,
}

/// A carried `task.done` in a batch: [`LastTask`] without the fields that
/// hold the default [`super::TaskDone`]'s reader restores (`ok`, first
/// attempt, no duration, `continue`, `null`), without its iteration, which
/// is the end's, and without its task run's id when that is derived from
/// its place ([`task_run_of`]).
#[derive(Serialize)]
struct CompactTask<'a> {
    task: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_run_id: Option<&'a str>,
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

/// The task run id a carried `task.done` of iteration `index` of loop run
/// `loop_run_id` has when it is the first attempt-path one (`steps_taken`
/// equal to its `pc`: no retry or jump before it), which a compact end
/// leaves out; `None` when its start (and so its `pc`) is not recorded.
fn task_run_of(loop_run_id: &str, index: u64, t: &LastTask) -> Option<String> {
    let pc = t.done.started.as_ref()?.pc;
    Some(crate::ids::task_run_id(
        loop_run_id,
        &index.to_string(),
        crate::ids::TaskRunAt {
            pc,
            attempt: t.done.attempt,
            steps_taken: pc as u64,
        },
    ))
}

/// An iteration's reducer contributions as its last task made them (its
/// `set_ctx` patch and the keys of it reduced): the `set_ctx` values of
/// the keys it reduced; empty when one is not there (its patch too large
/// to ride in the event), where [`is_reduced_by`] never left them out.
fn reduced_by(set_ctx: Option<&Map<String, Value>>, reduced: &[String]) -> Map<String, Value> {
    reduced
        .iter()
        .map(|k| Some((k.clone(), set_ctx?.get(k)?.clone())))
        .collect::<Option<_>>()
        .unwrap_or_default()
}

/// Whether `reduce` is what [`reduced_by`] reads back, key for key in order.
fn is_reduced_by(reduce: &Map<String, Value>, last: Option<&LastTask>) -> bool {
    let Some(t) = last else {
        return reduce.is_empty();
    };
    let set_ctx = t.done.set_ctx.as_ref();
    reduce.len() == t.done.reduced.len()
        && reduce
            .iter()
            .zip(&t.done.reduced)
            .all(|((k, v), r)| k == r && set_ctx.and_then(|p| p.get(r)) == Some(v))
}

/// The fields of a carried `task.done` its end's `reduce` may be read from.
#[derive(Deserialize)]
struct TaskFields {
    #[serde(default)]
    set_ctx: Option<Map<String, Value>>,
    #[serde(default)]
    reduced: Vec<String>,
}

/// `ended`, an iteration's end of a batch of loop run `loop_run_id`, in
/// the compact form the batch's `batch.completed` carries it in
/// ([`BatchEnd::end`]): its loop run left out when it is the batch's, its
/// `reduce` when it is what its last task reduced, its last task's run id
/// when it is derived from its place, and every field at its default.
pub fn compact_end(loop_run_id: &str, ended: &IterationEnded) -> Vec<u8> {
    let last = ended.last_task.as_deref();
    let last_task = last.map(|t| CompactTask {
        task: &t.task,
        task_run_id: match task_run_of(&ended.loop_run_id, ended.index, t) {
            Some(id) if id == t.task_run_id => None,
            _ => Some(&t.task_run_id),
        },
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
    // Left out only when reading it back gives the same map, in order.
    let derived = is_reduced_by(&ended.reduce, last);
    serde_json::to_vec(&CompactEnd {
        loop_run_id: (ended.loop_run_id != loop_run_id).then_some(&ended.loop_run_id),
        index: ended.index,
        status: ended.status,
        result: &ended.result,
        iter: &ended.iter,
        reduce: (!derived).then_some(&ended.reduce),
        error: &ended.error,
        handled: &ended.handled,
        last_task,
    })
    .expect("payload types serialise to JSON")
}

/// An end as a batch carries it, read whole: [`IterationEnded`] with the
/// `task.done` it carries and whether it names its `reduce`.
#[derive(Deserialize)]
struct Carried {
    #[serde(flatten)]
    end: IterationEnded,
    #[serde(default)]
    reduce: Option<Map<String, Value>>,
    #[serde(default)]
    last_task: Option<LastTask>,
}

/// The payload an end of a batch of loop run `loop_run_id` ([`BatchEnd::end`],
/// compact or whole) would have had stored on its own: every field
/// restored, its last task's `task.done` (with its iteration and run id)
/// inside it.
pub fn full_end(loop_run_id: &str, end: &RawValue) -> Result<IterationEnded, serde_json::Error> {
    let Carried {
        mut end,
        reduce,
        last_task,
    } = serde_json::from_str(end.get())?;
    if end.loop_run_id.is_empty() {
        end.loop_run_id = loop_run_id.to_string();
    }
    end.reduce = match reduce {
        Some(r) => r,
        None => last_task.as_ref().map_or_else(Map::new, |t| {
            reduced_by(t.done.set_ctx.as_ref(), &t.done.reduced)
        }),
    };
    end.last_task = last_task.map(|mut t| {
        t.done.index.get_or_insert(end.index);
        if t.task_run_id.is_empty() {
            t.task_run_id = task_run_of(&end.loop_run_id, end.index, &t).unwrap_or_default();
        }
        Box::new(t)
    });
    Ok(end)
}

/// What the loop-supervisor counts of an end of a batch of loop run
/// `loop_run_id` ([`BatchEnd::end`], compact or whole): its index, status,
/// reducer contributions and handled errors, read without building the
/// rest (`result`, `iter` and `error` are left at their defaults).
pub fn counted_end(loop_run_id: &str, end: &RawValue) -> Result<IterationEnded, serde_json::Error> {
    #[derive(Deserialize)]
    struct Counted {
        index: u64,
        #[serde(default = "super::ok")]
        status: Status,
        #[serde(default)]
        reduce: Option<Map<String, Value>>,
        #[serde(default)]
        handled: Vec<HandledError>,
        #[serde(default)]
        last_task: Option<TaskFields>,
    }
    let c: Counted = serde_json::from_str(end.get())?;
    let reduce = match c.reduce {
        Some(r) => r,
        None => c
            .last_task
            .as_ref()
            .map_or_else(Map::new, |t| reduced_by(t.set_ctx.as_ref(), &t.reduced)),
    };
    Ok(IterationEnded {
        loop_run_id: loop_run_id.to_string(),
        index: c.index,
        status: c.status,
        result: Value::Null,
        iter: Value::Null,
        reduce,
        error: Value::Null,
        handled: c.handled,
        last_task: None,
    })
}

super::payload_of! {
    BatchAccepted => BatchAccepted,
    BatchCompleted => BatchCompleted,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payloads::{AttemptStart, TaskDone};
    use serde_json::json;

    /// An iteration's end of loop run `r1` whose last task (started at
    /// `pc`, run `steps_taken`-th) set and reduced `total`.
    fn end(reduce: Value, pc: usize, steps_taken: u64) -> IterationEnded {
        let run = crate::ids::task_run_id(
            "r1",
            "7",
            crate::ids::TaskRunAt {
                pc,
                attempt: 1,
                steps_taken,
            },
        );
        IterationEnded {
            loop_run_id: "r1".into(),
            index: 7,
            status: Status::Ok,
            result: Value::Null,
            iter: json!({"i": 7}),
            reduce: serde_json::from_value(reduce).unwrap(),
            error: Value::Null,
            handled: Vec::new(),
            last_task: Some(Box::new(LastTask {
                task: "touch".into(),
                task_run_id: run,
                done: TaskDone {
                    rule: Some(0),
                    set_ctx: Some(serde_json::from_value(json!({"total": 1, "seen": 7})).unwrap()),
                    reduced: vec!["total".into()],
                    index: Some(7),
                    started: Some(AttemptStart {
                        pc,
                        kind: "noop".into(),
                        at_ms: 5,
                    }),
                    ..TaskDone::ok(Value::Null, "continue")
                },
            })),
        }
    }

    fn raw(bytes: &[u8]) -> Box<RawValue> {
        RawValue::from_string(String::from_utf8(bytes.to_vec()).unwrap()).unwrap()
    }

    #[test]
    fn what_the_end_or_the_batch_already_says_is_left_out_and_read_back() {
        let e = end(json!({"total": 1}), 0, 0);
        let text = String::from_utf8(compact_end("r1", &e)).unwrap();
        for absent in [
            "loop_run_id",
            "task_run_id",
            "\"reduce\"",
            "null",
            "attempt",
        ] {
            assert!(!text.contains(absent), "{absent} in {text}");
        }
        assert_eq!(full_end("r1", &raw(text.as_bytes())).unwrap(), e);
        let counted = counted_end("r1", &raw(text.as_bytes())).unwrap();
        assert_eq!((counted.index, &counted.reduce), (7, &e.reduce));
        assert_eq!(counted.loop_run_id, "r1");
    }

    #[test]
    fn what_cannot_be_read_back_the_same_is_written() {
        // Two tasks contributed (2, not the last task's 1); the last task
        // ran after a retry (its run id is not its first place's); the end
        // is another loop run's than the batch's.
        let e = end(json!({"total": 2}), 1, 3);
        let text = String::from_utf8(compact_end("r0", &e)).unwrap();
        for present in [
            "\"loop_run_id\":\"r1\"",
            "\"task_run_id\"",
            "\"reduce\":{\"total\":2}",
        ] {
            assert!(text.contains(present), "{present} not in {text}");
        }
        assert_eq!(full_end("r0", &raw(text.as_bytes())).unwrap(), e);
        assert_eq!(
            counted_end("r0", &raw(text.as_bytes())).unwrap().reduce,
            e.reduce
        );
        // An empty reduce where the last task reduced something is named.
        let e = end(json!({}), 0, 0);
        let text = String::from_utf8(compact_end("r1", &e)).unwrap();
        assert!(text.contains("\"reduce\":{}"), "{text}");
        assert_eq!(full_end("r1", &raw(text.as_bytes())).unwrap(), e);
    }

    #[test]
    fn an_end_stored_whole_reads_back_the_same() {
        let e = end(json!({"total": 1}), 0, 0);
        let whole = serde_json::to_vec(&e).unwrap();
        assert_eq!(full_end("r1", &raw(&whole)).unwrap(), e);
        assert_eq!(counted_end("r1", &raw(&whole)).unwrap().reduce, e.reduce);
    }
}
