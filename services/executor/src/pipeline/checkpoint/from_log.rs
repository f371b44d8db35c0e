//! An iteration's checkpoint as its events give it, for when the loop
//! bucket lost it: from the cursor a command carries, the iteration's
//! `task.done` events are followed in the order the pipeline ran them and
//! the live decisions are taken again over them ([`next::decide`],
//! [`Cursor::advance`], the reducer split and the handled-error note of
//! the live pipeline), so the checkpoint is the one the live pipeline
//! wrote after its last task that changed `iter`. Pure: the caller reads
//! the events (hydrated: a large `set_ctx` read back from the object
//! store) and writes what this returns.
//!
//! An event is tied to the iteration by its task run id, which the live
//! pipeline derives from the step-run, the iteration index and the
//! cursor ([`super::super::invoke::task_run_id`]): the fold derives the id
//! of the next task run from its own cursor and takes the `task.done` of
//! that id, so events of other iterations, other step-runs and other
//! executions are never mistaken for this one's.

use std::collections::{BTreeSet, HashMap};

use noetl_core::limits::Preview;
use noetl_core::policy::Decision;
use noetl_core::{Outcome, Step};
use noetl_mesh::{event_type::EventType, payloads, payloads::TaskDone};
use noetl_wire::Event;
use serde_json::Value;

use super::super::conclude::note_handled;
use super::super::context::split_patch;
use super::super::invoke::task_run_id;
use super::super::next::{self, At, NextInput, Ran, Then};
use super::super::Cursor;
use crate::analysis::StepNeeds;

/// Why the events cannot give an iteration's checkpoint: the iteration
/// starts over, as when no checkpoint was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotFolded {
    /// The execution was resumed after the step-run started: events of
    /// the run before the resume share the step-run's task run ids.
    #[error("its execution was resumed after the step-run started")]
    Resumed,
    /// The checkpoint holds a task's result, and its `task.done` carries
    /// only a preview of it (a result above the event's limit).
    #[error("task {task:?}'s result is only a preview in its task.done ({size} bytes)")]
    Preview {
        /// The task.
        task: String,
        /// Bytes of the whole result's JSON.
        size: usize,
    },
    /// Two `task.done` events of one task run took different turns (a
    /// redelivery outside the stream's deduplication window whose policy
    /// decided otherwise).
    #[error("task run {0} has two task.done events that decided differently")]
    Ambiguous(String),
    /// A `task.done` of the iteration is not what the plan's pipeline
    /// says at that point (another task, an action it cannot take).
    #[error("{0}")]
    Mismatch(String),
}

/// Which events of a log [`fold`] reads for the iterations `indices` of
/// step-run `srid`, taken as the log is read so that a rebuild holds them
/// and not the whole log: the step-run's first event (whatever its type:
/// where [`resumed_after_start`] starts looking), every
/// `execution.resumed` after it, and the step-run's `task.done` events of
/// those iterations (and those that name none: written before a
/// `task.done` recorded its iteration). [`fold`] over what it keeps gives
/// what it gives over the whole log.
pub(crate) struct Wanted<'a> {
    srid: &'a str,
    indices: &'a BTreeSet<u64>,
    run_seen: bool,
}

impl<'a> Wanted<'a> {
    /// Nothing of step-run `srid` seen yet.
    pub(crate) fn new(srid: &'a str, indices: &'a BTreeSet<u64>) -> Self {
        Self {
            srid,
            indices,
            run_seen: false,
        }
    }

    /// Whether [`fold`] reads `e` (the log's events given in stream order).
    pub(crate) fn keeps(&mut self, e: &Event) -> bool {
        let of_run = e.step_run_id == self.srid;
        if of_run && !self.run_seen {
            self.run_seen = true;
            return true;
        }
        match EventType::of(e) {
            Some(EventType::ExecutionResumed) => self.run_seen,
            Some(EventType::TaskDone) if of_run => {
                /// A `task.done`'s iteration, and nothing else of it.
                #[derive(serde::Deserialize)]
                struct Of {
                    #[serde(default)]
                    index: Option<u64>,
                }
                // One that does not decode is kept: the fold names it.
                payloads::decode::<Of>(e).map_or(true, |of| {
                    of.index.is_none_or(|i| self.indices.contains(&i))
                })
            }
            _ => false,
        }
    }
}

/// What [`fold`] reads.
pub(crate) struct FoldInput<'a> {
    /// The loop step.
    pub step: &'a Step,
    /// Its pipeline as it runs, and what its templates read.
    pub needs: &'a StepNeeds,
    /// The step-run (the loop run).
    pub srid: &'a str,
    /// The iteration index, as text.
    pub index: &'a str,
    /// The execution's events, in stream order.
    pub log: &'a [Event],
}

/// The checkpoint of iteration `index` of step-run `srid`, from the cursor
/// the command carries (`start`): `Ok(None)` when none of the iteration's
/// tasks after it changed `iter` (the live pipeline wrote no checkpoint
/// either).
pub(crate) fn fold(i: FoldInput<'_>, start: Cursor) -> Result<Option<Cursor>, NotFolded> {
    resumed_after_start(i.log, i.srid)?;
    let done = task_dones(i.log, i.srid)?;
    let serves = |_: &str| true;
    let mut cur = start;
    let mut last: Result<Option<Cursor>, NotFolded> = Ok(None);
    // The task whose result `_prev` is (none yet: the command's).
    let mut prev_of = String::new();
    while let Some(task) = i.needs.tasks.get(cur.pc) {
        let id = task_run_id(i.srid, i.index, &cur);
        let Some((name, td)) = done.get(id.as_str()) else {
            break; // the iteration has not gone further
        };
        if *name != task.name {
            return Err(NotFolded::Mismatch(format!(
                "task run {id} is of task {name:?}, where the pipeline has {:?}",
                task.name
            )));
        }
        let outcome = outcome_of(td);
        // What `conclude` and `run_next` did after the call.
        if i.needs.reads.task_results.contains(&task.name) {
            cur.results
                .insert(task.name.clone(), outcome.result.clone());
        }
        if let Some(patch) = td.set_ctx.as_ref().filter(|p| !p.is_empty()) {
            // Refused or not, the live split ran over the whole patch.
            let _ = split_patch(i.step, true, patch, &mut cur.reduce);
        }
        let iter_changed = td.set_iter.as_ref().is_some_and(|m| !m.is_empty());
        for (k, v) in td.set_iter.iter().flatten() {
            cur.iter.insert(k.clone(), v.clone());
        }
        let decision = decision_of(i.step, task, td)?;
        note_handled(&mut cur, task, &outcome, &decision);
        cur.steps_taken += 1;
        let next = next::decide(NextInput {
            step: i.step,
            tasks: &i.needs.tasks,
            task_errors: &i.needs.task_errors,
            serves: &serves,
            at: At {
                pc: cur.pc,
                attempt: cur.attempt,
            },
            steps_taken: cur.steps_taken,
            ran: Some(Ran {
                outcome,
                decision,
                policy_error: None,
            }),
            deadline: None,
            now_ms: 0,
            stopped: false,
        });
        if let Some(moved) = next.moved {
            if moved.prev.is_some() {
                prev_of = task.name.clone();
            }
            cur.advance(moved);
            if iter_changed {
                last = checkpoint_of(&prev_of, &cur).map(Some);
            }
        }
        match next.then {
            Then::Run => {}
            // Another command continued the step-run with this cursor (a
            // task of another kind), or a delayed retry at its attempt.
            Then::Command(h) => {
                cur.pc = h.at.pc;
                cur.attempt = h.at.attempt;
            }
            Then::Finished | Then::End(_) | Then::Stop => break,
        }
    }
    last
}

/// The cursor at a checkpoint, unless a value it holds is only a preview.
fn checkpoint_of(prev_of: &str, cur: &Cursor) -> Result<Cursor, NotFolded> {
    let held = std::iter::once((prev_of, &cur.prev))
        .chain(cur.results.iter().map(|(k, v)| (k.as_str(), v)));
    for (task, v) in held {
        if let Some(p) = preview(v) {
            return Err(NotFolded::Preview {
                task: task.to_string(),
                size: p.size,
            });
        }
    }
    Ok(cur.fork())
}

/// `v` when it is a preview of a larger value
/// ([`noetl_core::limits::compact`]).
fn preview(v: &Value) -> Option<Preview> {
    let m = v.as_object().filter(|m| m.len() == 3)?;
    serde_json::from_value::<Preview>(Value::Object(m.clone()))
        .ok()
        .filter(|p| p.truncated)
}

/// An error when the execution was resumed after the step-run's first
/// event.
fn resumed_after_start(log: &[Event], srid: &str) -> Result<(), NotFolded> {
    let Some(first) = log.iter().position(|e| e.step_run_id == srid) else {
        return Ok(());
    };
    if log[first..]
        .iter()
        .any(|e| EventType::of(e) == Some(EventType::ExecutionResumed))
    {
        return Err(NotFolded::Resumed);
    }
    Ok(())
}

/// The step-run's `task.done` events by task run id, with their task's
/// name; copies of one task run must take the same turn, and the last one
/// stands (the latest run of the task is what the cursor went on with).
fn task_dones<'e>(
    log: &'e [Event],
    srid: &str,
) -> Result<HashMap<&'e str, (&'e str, TaskDone)>, NotFolded> {
    let mut out: HashMap<&str, (&str, TaskDone)> = HashMap::new();
    let of_run = log
        .iter()
        .filter(|e| e.step_run_id == srid && EventType::of(e) == Some(EventType::TaskDone));
    for e in of_run {
        let td: TaskDone = payloads::decode(e).map_err(|err| {
            NotFolded::Mismatch(format!("task.done of task run {}: {err}", e.task_run_id))
        })?;
        match out.get(e.task_run_id.as_str()) {
            Some((_, seen)) if !same_turn(seen, &td) => {
                return Err(NotFolded::Ambiguous(e.task_run_id.clone()))
            }
            _ => {
                out.insert(&e.task_run_id, (&e.task, td));
            }
        }
    }
    Ok(out)
}

/// Two copies of one task run's `task.done` took the same turn: the same
/// decision and `iter` patch (their results may differ in what the
/// decision did not read, such as a response's `date` header).
fn same_turn(a: &TaskDone, b: &TaskDone) -> bool {
    (&a.action, &a.retry, &a.rule, &a.set_iter) == (&b.action, &b.retry, &b.rule, &b.set_iter)
}

/// The task's outcome as its `task.done` records it.
fn outcome_of(td: &TaskDone) -> Outcome {
    Outcome {
        status: td.status,
        result: td.result.clone(),
        error: td.error.clone(),
        meta: Default::default(),
        helpers: Default::default(),
    }
}

/// The policy's decision a `task.done` records (`action`, the retry's
/// schedule, a jump's target from the rule that matched).
fn decision_of(step: &Step, task: &noetl_core::Task, td: &TaskDone) -> Result<Decision, NotFolded> {
    let mismatch = |why: String| NotFolded::Mismatch(why);
    Ok(match td.action.as_str() {
        "continue" => Decision::Continue,
        "break" => Decision::Break,
        "fail" => Decision::Fail {
            reason: String::new(),
        },
        "retry" => {
            let r = td.retry.as_ref().ok_or_else(|| {
                mismatch(format!(
                    "task {:?}: a retry without its schedule",
                    task.name
                ))
            })?;
            Decision::Retry {
                delay: std::time::Duration::from_millis(r.delay_ms),
                next_attempt: r.next_attempt,
            }
        }
        "jump" => {
            let to = td
                .rule
                .and_then(|n| task.spec.policy.as_ref()?.rules.get(n))
                .and_then(|r| r.then.to.clone())
                .ok_or_else(|| {
                    mismatch(format!(
                        "task {:?} of step {:?}: a jump whose rule names no target",
                        task.name, step.step
                    ))
                })?;
            Decision::Jump { to }
        }
        other => return Err(mismatch(format!("task {:?}: action {other:?}", task.name))),
    })
}

#[cfg(test)]
mod tests;
