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
    /// The iterations the command runs, each a `loop.iteration.started`;
    /// stored as runs ([`items`]).
    #[serde(with = "items")]
    pub items: Vec<BatchItem>,
}

/// A batch's items as stored: each run of two or more consecutive
/// iterations of one claim (or of none) as `[first, count]` or `[first,
/// count, claim]`, any other item as its object. (Batches written before
/// hold every item as its object, which reads the same.)
mod items {
    use super::BatchItem;
    use serde::{ser::SerializeSeq, Deserialize, Deserializer, Serializer};

    /// An item or a run of them, as stored. (The runs first: serde would
    /// read `[first, count]` as a `BatchItem` too, its fields in order.)
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stored {
        RunOfClaim(u64, u64, u64),
        Run(u64, u64),
        One(BatchItem),
    }

    /// `items` cut into runs: each `(first, count, claim)`.
    fn runs(items: &[BatchItem]) -> Vec<(u64, u64, Option<u64>)> {
        let mut out: Vec<(u64, u64, Option<u64>)> = Vec::new();
        for item in items {
            match out.last_mut() {
                Some((first, count, claim))
                    if *claim == item.claim && item.index.checked_sub(*count) == Some(*first) =>
                {
                    *count += 1
                }
                _ => out.push((item.index, 1, item.claim)),
            }
        }
        out
    }

    pub(super) fn serialize<S: Serializer>(items: &[BatchItem], s: S) -> Result<S::Ok, S::Error> {
        let runs = runs(items);
        let mut seq = s.serialize_seq(Some(runs.len()))?;
        for (first, count, claim) in runs {
            match (count, claim) {
                (1, claim) => seq.serialize_element(&BatchItem {
                    index: first,
                    claim,
                })?,
                (_, None) => seq.serialize_element(&(first, count))?,
                (_, Some(claim)) => seq.serialize_element(&(first, count, claim))?,
            }
        }
        seq.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<BatchItem>, D::Error> {
        let stored = Vec::<Stored>::deserialize(d)?;
        let mut items = Vec::with_capacity(stored.len());
        for s in stored {
            let (first, count, claim) = match s {
                Stored::One(item) => (item.index, 1, item.claim),
                Stored::Run(first, count) => (first, count, None),
                Stored::RunOfClaim(first, count, claim) => (first, count, Some(claim)),
            };
            // More iterations than a batch can hold are refused, not
            // expanded: a few bytes of runs must not make a reader
            // allocate millions of items.
            let most = crate::config::MAX_LOOP_BATCH as u64;
            if count.saturating_add(items.len() as u64) > most {
                return Err(serde::de::Error::custom(format!(
                    "a run of {count} iterations from {first} after {} (a batch holds at most {most})",
                    items.len()
                )));
            }
            items.extend(
                (first..first.saturating_add(count)).map(|index| BatchItem { index, claim }),
            );
        }
        Ok(items)
    }
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
    /// The time its first iteration ended (Unix epoch ms): each end's
    /// time is written after it ([`BatchEnd::after`]). (Batches written
    /// before hold each end's whole time in [`BatchEnd::at`].)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    /// The last tasks its ends carry, each written once however many ends
    /// carry it ([`compact_end`]); an end names its own by its place here
    /// ([`BatchEnd::task`]). (Batches written before hold each end's last
    /// task inside the end.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<Box<RawValue>>,
    /// Each iteration's end.
    pub ends: Vec<BatchEnd>,
}

/// One iteration's end inside a `batch.completed`.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchEnd {
    /// When it ended (Unix epoch ms), in a batch written before the ends'
    /// times were written after the batch's ([`BatchCompleted::at`]);
    /// read through [`BatchEnd::at_ms`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub at: u64,
    /// How long after the batch's [`BatchCompleted::at`] it ended (ms; left
    /// out when 0).
    #[serde(default, rename = "d", skip_serializing_if = "is_zero")]
    pub after: u64,
    /// Its last task's place in the batch's [`BatchCompleted::tasks`].
    #[serde(default, rename = "t", skip_serializing_if = "Option::is_none")]
    pub task: Option<usize>,
    /// The payload of its `loop.iteration.done` / `.failed` in its compact
    /// form ([`compact_end`]): without what the batch or its own fields
    /// say, and without the fields that hold their default.
    /// [`full_end`] restores the payload as it would have been stored on
    /// its own, [`counted_end`] what the loop-supervisor counts. (Batches
    /// written before the compact form hold that payload whole, which both
    /// read.)
    pub end: Box<RawValue>,
}

impl BatchEnd {
    /// When it ended (Unix epoch ms), its `loop.iteration.done`'s time:
    /// the batch's time and how long after it, or its own whole time in a
    /// batch written before.
    pub fn at_ms(&self, batch: &BatchCompleted) -> u64 {
        match batch.at {
            Some(first) => first.saturating_add(self.after),
            None => self.at,
        }
    }
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
    started: Option<CompactStart<'a>>,
}

/// A carried `task.done`'s attempt start in a batch: [`super::AttemptStart`]
/// without its time when that is its end's ([`BatchEnd::at`]), as it is
/// for a task that ends within the millisecond it started.
#[derive(Serialize)]
struct CompactStart<'a> {
    pc: usize,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    at_ms: Option<u64>,
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

/// An iteration's end in the compact form a `batch.completed` carries it
/// in ([`compact_end`]): the end without its last task, and that task
/// apart, which the batch writes once for all the ends that carry the same
/// ([`BatchCompleted::tasks`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CompactedEnd {
    /// The end ([`BatchEnd::end`]) without its last task.
    pub end: Vec<u8>,
    /// Its last task, compact, if it carries one.
    pub task: Option<Vec<u8>>,
}

impl CompactedEnd {
    /// The bytes it takes in a batch at most (its task not shared).
    pub fn len(&self) -> usize {
        self.end.len() + self.task.as_ref().map_or(0, Vec::len)
    }

    /// Whether it is empty (never: an end names its index).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `ended`, an iteration's end of a batch of loop run `loop_run_id` that
/// ended at `at_ms` ([`BatchEnd::at`]), in the compact form the batch's
/// `batch.completed` carries it in ([`CompactedEnd`]): its loop run left
/// out when it is the batch's, its `reduce` when it is what its last task
/// reduced, its last task's run id when it is derived from its place, its
/// last task's start time when it is the end's, and every field at its
/// default.
pub fn compact_end(loop_run_id: &str, at_ms: u64, ended: &IterationEnded) -> CompactedEnd {
    let last = ended.last_task.as_deref();
    let task = last.map(|t| {
        serde_json::to_vec(&CompactTask {
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
            started: t.done.started.as_ref().map(|s| CompactStart {
                pc: s.pc,
                kind: &s.kind,
                at_ms: (s.at_ms != at_ms).then_some(s.at_ms),
            }),
        })
        .expect("payload types serialise to JSON")
    });
    // Left out only when reading it back gives the same map, in order.
    let derived = is_reduced_by(&ended.reduce, last);
    let end = serde_json::to_vec(&CompactEnd {
        loop_run_id: (ended.loop_run_id != loop_run_id).then_some(&ended.loop_run_id),
        index: ended.index,
        status: ended.status,
        result: &ended.result,
        iter: &ended.iter,
        reduce: (!derived).then_some(&ended.reduce),
        error: &ended.error,
        handled: &ended.handled,
    })
    .expect("payload types serialise to JSON");
    CompactedEnd { end, task }
}

/// An end as a batch carries it, read whole: [`IterationEnded`] with the
/// `task.done` it carries (a batch written before the shared tasks) and
/// whether it names its `reduce`.
#[derive(Deserialize)]
struct Carried {
    #[serde(flatten)]
    end: IterationEnded,
    #[serde(default)]
    reduce: Option<Map<String, Value>>,
    #[serde(default)]
    last_task: Option<LastTask>,
}

/// The last task an end of `batch` carries, read as `T`: the one inside
/// the end (`inline`, a batch written before the shared tasks), else the
/// batch's task the end names, else none; an error names a place the
/// batch does not hold.
fn last_task_of<T: serde::de::DeserializeOwned>(
    inline: Option<T>,
    batch: &BatchCompleted,
    end: &BatchEnd,
) -> Result<Option<T>, serde_json::Error> {
    let (None, Some(k)) = (&inline, end.task) else {
        return Ok(inline);
    };
    match batch.tasks.get(k) {
        Some(t) => serde_json::from_str(t.get()).map(Some),
        None => Err(serde::de::Error::custom(format!(
            "its last task is the batch's task {k}, of {}",
            batch.tasks.len()
        ))),
    }
}

/// The payload an end of `batch` ([`BatchEnd`], compact or whole) would
/// have had stored on its own: every field restored, its last task's
/// `task.done` (with its iteration, run id and start) inside it.
pub fn full_end(
    batch: &BatchCompleted,
    end: &BatchEnd,
) -> Result<IterationEnded, serde_json::Error> {
    let Carried {
        end: mut ended,
        reduce,
        last_task,
    } = serde_json::from_str(end.end.get())?;
    let last_task = last_task_of(last_task, batch, end)?;
    if ended.loop_run_id.is_empty() {
        ended.loop_run_id = batch.loop_run_id.clone();
    }
    ended.reduce = match reduce {
        Some(r) => r,
        None => last_task.as_ref().map_or_else(Map::new, |t| {
            reduced_by(t.done.set_ctx.as_ref(), &t.done.reduced)
        }),
    };
    ended.last_task = last_task.map(|mut t| {
        t.done.index.get_or_insert(ended.index);
        if let Some(started) = t.done.started.as_mut().filter(|s| s.at_ms == 0) {
            started.at_ms = end.at_ms(batch);
        }
        if t.task_run_id.is_empty() {
            t.task_run_id = task_run_of(&ended.loop_run_id, ended.index, &t).unwrap_or_default();
        }
        Box::new(t)
    });
    Ok(ended)
}

/// What the loop-supervisor counts of an end of `batch` ([`BatchEnd`],
/// compact or whole): its index, status, reducer contributions and handled
/// errors, read without building the rest (`result`, `iter` and `error`
/// are left at their defaults).
pub fn counted_end(
    batch: &BatchCompleted,
    end: &BatchEnd,
) -> Result<IterationEnded, serde_json::Error> {
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
    let c: Counted = serde_json::from_str(end.end.get())?;
    let reduce = match c.reduce {
        Some(r) => r,
        None => last_task_of(c.last_task, batch, end)?
            .map_or_else(Map::new, |t| reduced_by(t.set_ctx.as_ref(), &t.reduced)),
    };
    Ok(IterationEnded {
        loop_run_id: batch.loop_run_id.clone(),
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

    /// A batch of loop run `loop_run` holding `ends` (each ended at its
    /// time), as [`crate::events::batch_completed`] writes it.
    fn batch(loop_run: &str, ends: &[(u64, &CompactedEnd)]) -> BatchCompleted {
        let ends: Vec<crate::events::BatchedEnd> = ends
            .iter()
            .enumerate()
            .map(|(index, (at_ms, end))| crate::events::BatchedEnd {
                index: index as u64,
                at_ms: *at_ms,
                end: (*end).clone(),
            })
            .collect();
        let draft = crate::events::EventDraft {
            execution_id: "e1",
            step_run_id: loop_run,
            step: "lp",
            ..Default::default()
        };
        let stored = crate::events::batch_completed(draft, &ends);
        assert_eq!(stored.len(), 1);
        serde_json::from_slice(&stored[0].payload_json).unwrap()
    }

    /// An end of a batch of loop run `loop_run` alone, ended at `at`, read
    /// back whole and as counted.
    fn read_back(loop_run: &str, at: u64, c: &CompactedEnd) -> (IterationEnded, IterationEnded) {
        let b = batch(loop_run, &[(at, c)]);
        (
            full_end(&b, &b.ends[0]).unwrap(),
            counted_end(&b, &b.ends[0]).unwrap(),
        )
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn what_the_end_or_the_batch_already_says_is_left_out_and_read_back() {
        let e = end(json!({"total": 1}), 0, 0);
        // It ended in the millisecond its last task started (5).
        let c = compact_end("r1", 5, &e);
        let all = text(&c.end) + &text(c.task.as_deref().unwrap());
        for absent in [
            "loop_run_id",
            "task_run_id",
            "\"reduce\"",
            "null",
            "attempt",
            "at_ms",
            "last_task",
        ] {
            assert!(!all.contains(absent), "{absent} in {all}");
        }
        let (full, counted) = read_back("r1", 5, &c);
        assert_eq!(full, e);
        assert_eq!((counted.index, &counted.reduce), (7, &e.reduce));
        assert_eq!(counted.loop_run_id, "r1");
    }

    #[test]
    fn what_cannot_be_read_back_the_same_is_written() {
        // Two tasks contributed (2, not the last task's 1); the last task
        // ran after a retry (its run id is not its first place's) and
        // started before the end's millisecond; the end is another loop
        // run's than the batch's.
        let e = end(json!({"total": 2}), 1, 3);
        let c = compact_end("r0", 9, &e);
        let all = text(&c.end) + &text(c.task.as_deref().unwrap());
        for present in [
            "\"loop_run_id\":\"r1\"",
            "\"task_run_id\"",
            "\"reduce\":{\"total\":2}",
            "\"at_ms\":5",
        ] {
            assert!(all.contains(present), "{present} not in {all}");
        }
        let (full, counted) = read_back("r0", 9, &c);
        assert_eq!(full, e);
        assert_eq!(counted.reduce, e.reduce);
        // An empty reduce where the last task reduced something is named.
        let e = end(json!({}), 0, 0);
        let c = compact_end("r1", 5, &e);
        assert!(text(&c.end).contains("\"reduce\":{}"), "{}", text(&c.end));
        assert_eq!(read_back("r1", 5, &c).0, e);
    }

    #[test]
    fn ends_that_carry_the_same_last_task_share_it_once() {
        // Three ends whose last tasks differ only in the start time, which
        // is each end's own: one task written; a fourth that started
        // earlier than its end carries its own.
        let ends: Vec<(u64, IterationEnded)> = [5, 5, 5, 2]
            .into_iter()
            .enumerate()
            .map(|(k, started)| {
                let mut e = end(json!({"total": 1}), 0, 0);
                e.index = k as u64;
                let t = e.last_task.as_mut().unwrap();
                t.done.index = Some(k as u64);
                t.task_run_id = task_run_of("r1", k as u64, t).unwrap();
                t.done.started.as_mut().unwrap().at_ms = started;
                (5 + k as u64, e)
            })
            .collect();
        let ends: Vec<(IterationEnded, u64, CompactedEnd)> = ends
            .into_iter()
            .map(|(at, mut e)| {
                // The first three started at their end's time.
                let t = e.last_task.as_mut().unwrap();
                let started = t.done.started.as_mut().unwrap();
                if started.at_ms == 5 {
                    started.at_ms = at;
                }
                let c = compact_end("r1", at, &e);
                (e, at, c)
            })
            .collect();
        let b = batch(
            "r1",
            &ends.iter().map(|(_, at, c)| (*at, c)).collect::<Vec<_>>(),
        );
        assert_eq!(b.tasks.len(), 2, "{:?}", b.tasks);
        let places: Vec<_> = b.ends.iter().map(|e| e.task).collect();
        assert_eq!(places, [Some(0), Some(0), Some(0), Some(1)]);
        for ((e, _, _), stored) in ends.iter().zip(&b.ends) {
            assert_eq!(&full_end(&b, stored).unwrap(), e);
            assert_eq!(counted_end(&b, stored).unwrap().reduce, e.reduce);
        }
        // A place the batch does not hold is refused, naming it.
        let mut wrong = b;
        wrong.ends[0].task = Some(7);
        let err = full_end(&wrong, &wrong.ends[0]).unwrap_err().to_string();
        assert!(err.contains("task 7, of 2"), "{err}");
    }

    #[test]
    fn a_batch_s_items_are_stored_as_runs_and_read_back_the_same() {
        let item = |index, claim| BatchItem { index, claim };
        let items = vec![
            item(0, None),
            item(1, None),
            item(2, None),
            item(5, None),
            item(6, Some(3)),
            item(7, Some(3)),
            item(8, Some(4)),
            item(10, Some(4)),
        ];
        let accepted = BatchAccepted {
            loop_run_id: "r1".into(),
            items,
        };
        let text = serde_json::to_string(&accepted).unwrap();
        assert_eq!(
            text,
            r#"{"loop_run_id":"r1","items":[[0,3],{"index":5},[6,2,3],{"index":8,"claim":4},{"index":10,"claim":4}]}"#
        );
        let back: BatchAccepted = serde_json::from_str(&text).unwrap();
        assert_eq!(back, accepted);
        // Written before the runs: every item its object.
        let old = r#"{"loop_run_id":"r1","items":[{"index":0},{"index":1,"claim":2}]}"#;
        let back: BatchAccepted = serde_json::from_str(old).unwrap();
        assert_eq!(back.items, [item(0, None), item(1, Some(2))]);
        // More than a batch can hold is refused, not expanded: one huge
        // run, or many that pass the bound together.
        let huge = r#"{"loop_run_id":"r1","items":[[0,1000000000000]]}"#;
        let err = serde_json::from_str::<BatchAccepted>(huge)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a run of 1000000000000 iterations from 0"),
            "{err}"
        );
        let most = crate::config::MAX_LOOP_BATCH;
        let runs: Vec<String> = (0..3).map(|k| format!("[{},{most}]", k * most)).collect();
        let many = format!(r#"{{"loop_run_id":"r1","items":[{}]}}"#, runs.join(","));
        let err = serde_json::from_str::<BatchAccepted>(&many)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("after {most}")), "{err}");
        let full = format!(r#"{{"loop_run_id":"r1","items":[[0,{most}]]}}"#);
        let back: BatchAccepted = serde_json::from_str(&full).unwrap();
        assert_eq!(back.items.len(), most);
    }

    #[test]
    fn an_end_stored_whole_reads_back_the_same() {
        let e = end(json!({"total": 1}), 0, 0);
        let whole = serde_json::to_vec(&e).unwrap();
        let b = BatchCompleted {
            loop_run_id: "r1".into(),
            at: None,
            tasks: Vec::new(),
            ends: vec![BatchEnd {
                at: 9,
                after: 0,
                task: None,
                end: raw(&whole),
            }],
        };
        assert_eq!(full_end(&b, &b.ends[0]).unwrap(), e);
        assert_eq!(counted_end(&b, &b.ends[0]).unwrap().reduce, e.reduce);
    }
}
