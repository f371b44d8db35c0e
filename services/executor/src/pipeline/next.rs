//! What a step-run does next (docs/dsl.md, "The pipeline"), as a pure
//! decision: from the outcome of the task that just ran and its policy's
//! decision, the step's tasks, the cursor's counters and the deadline,
//! [`decide`] says where the cursor goes and what follows: run the next
//! task here, continue in another command, or end the step-run (or
//! iteration) done or failed. The driver (`StepRun::run_pipeline`) reads,
//! calls it, and applies what it says.

use noetl_core::lifecycle::{self, Deadline, Due};
use noetl_core::policy::Decision;
use noetl_core::{Outcome, Step, StepError, Task};
use serde_json::Value;

use super::MAX_TASK_RUNS;

/// A task and the attempt at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct At {
    /// The task's index in the pipeline.
    pub pc: usize,
    /// 1-based attempt.
    pub attempt: u32,
}

/// What the task that just ran gave.
#[derive(Debug)]
pub(super) struct Ran {
    /// Its outcome (secrets redacted, `set_ctx` errors applied).
    pub outcome: Outcome,
    /// Its policy's decision.
    pub decision: Decision,
    /// Set when the policy itself failed to evaluate.
    pub policy_error: Option<String>,
}

/// What [`decide`] reads.
pub(super) struct NextInput<'a> {
    /// The step (its name, and its tasks by name for jumps).
    pub step: &'a Step,
    /// The pipeline as it runs (workbook calls resolved).
    pub tasks: &'a [Task],
    /// Per task: why its workbook call cannot be resolved.
    pub task_errors: &'a [Option<String>],
    /// Whether this replica serves a tool kind.
    pub serves: &'a dyn Fn(&str) -> bool,
    /// Where the cursor is: the task that just ran, or the command's first.
    pub at: At,
    /// Task runs in the step-run so far (the one that just ran included).
    pub steps_taken: u64,
    /// The task that just ran; `None` at the start of a command.
    pub ran: Option<Ran>,
    /// The step-run's deadline, if it has one.
    pub deadline: Option<&'a Deadline>,
    /// The time, epoch ms.
    pub now_ms: u64,
    /// The execution was cancelled or failed meanwhile.
    pub stopped: bool,
}

/// How a step-run (or iteration) ends.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum End {
    /// Finished successfully with this result.
    Done(Value),
    /// Failed with `{kind, message, task}`.
    Failed(Value),
}

/// Where the task's policy moved the cursor, in this command.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Moved {
    /// The task to run next, and the attempt.
    pub at: At,
    /// The new `_prev` (continue, jump); `None`: unchanged (a retry).
    pub prev: Option<Value>,
}

/// The command that continues the step-run elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Handoff {
    /// The tool kind whose executors take it.
    pub kind: String,
    /// The task's name (for the unserved timer).
    pub task: String,
    /// The task it starts at, and the attempt.
    pub at: At,
    /// Not before this time (epoch ms; 0: at once).
    pub not_before_ms: u64,
    /// A delayed retry of the task that just ran (its kind is served
    /// here), rather than a task of another kind.
    pub retry: bool,
}

/// What follows, once the cursor moved.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Then {
    /// Run the cursor's task here: this replica serves its kind.
    Run,
    /// Publish the command that continues the step-run (another kind, or
    /// a delayed retry).
    Command(Handoff),
    /// The pipeline ran past its last task: done, its result `_prev`.
    Finished,
    /// The step-run ends here.
    End(End),
    /// The execution was stopped: stop between tasks, report nothing.
    Stop,
}

/// What [`decide`] says.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Next {
    /// Where the policy moved the cursor (continue, jump, a retry at
    /// once); `None` when nothing ran yet or the policy ended the command.
    pub moved: Option<Moved>,
    /// What follows.
    pub then: Then,
}

/// What a step-run does next: the task's policy decision moves the cursor
/// (or ends the command), then the task the cursor is at runs here, is
/// handed to its kind's executors, or cannot start.
pub(super) fn decide(mut i: NextInput<'_>) -> Next {
    let moved = match i.ran.take() {
        None => None,
        Some(ran) => match follow(&i, ran) {
            Ok(moved) => Some(moved),
            Err(then) => return Next { moved: None, then },
        },
    };
    let at = moved.as_ref().map(|m| m.at).unwrap_or(i.at);
    Next {
        moved,
        then: at_task(&i, at),
    }
}

/// Move the cursor as the task's decision says; `Err` when the step-run
/// ends here or continues in another command (a delayed retry).
fn follow(i: &NextInput<'_>, ran: Ran) -> Result<Moved, Then> {
    let task = &i.tasks[i.at.pc];
    let failed = |error: StepError| Then::End(End::Failed(error.to_value()));
    match ran.decision {
        Decision::Continue => Ok(Moved {
            at: At {
                pc: i.at.pc + 1,
                attempt: 1,
            },
            prev: Some(ran.outcome.result),
        }),
        Decision::Retry {
            delay,
            next_attempt,
        } => {
            let not_before_ms = i.now_ms.saturating_add(delay.as_millis() as u64);
            let late = i
                .deadline
                .filter(|d| !lifecycle::retry_fits(not_before_ms, d.at_ms));
            if let Some(d) = late {
                // The retry would start after the deadline: the step-run
                // is out of time now.
                return Err(failed(late_retry(i, d, &ran.outcome, delay)));
            }
            let at = At {
                pc: i.at.pc,
                attempt: next_attempt,
            };
            if delay.is_zero() {
                return Ok(Moved { at, prev: None });
            }
            Err(Then::Command(Handoff {
                kind: task.kind.clone(),
                task: task.name.clone(),
                at,
                not_before_ms,
                retry: true,
            }))
        }
        Decision::Jump { to } => match i.step.task_index(&to) {
            Some(pc) => Ok(Moved {
                at: At { pc, attempt: 1 },
                prev: Some(ran.outcome.result),
            }),
            None => {
                let message = format!(
                    "task {:?} of step {:?} jumps to {to:?}, which is not a task of the step",
                    task.name, i.step.step
                );
                Err(failed(StepError::new("policy", message, Some(&task.name))))
            }
        },
        Decision::Break => Err(Then::End(End::Done(ran.outcome.result))),
        Decision::Fail { reason } => Err(Then::End(End::Failed(crate::task::failure(
            task,
            &ran.outcome,
            &reason,
            ran.policy_error,
        )))),
    }
}

/// The timeout of a retry that would start after the deadline `d`,
/// naming the delay and the last error.
fn late_retry(
    i: &NextInput<'_>,
    d: &Deadline,
    outcome: &Outcome,
    delay: std::time::Duration,
) -> StepError {
    let task = &i.tasks[i.at.pc];
    let mut error = lifecycle::timeout_error(d, &i.step.step, Some(&task.name));
    if let Some(e) = &outcome.error {
        error.message = format!(
            "{}; a retry in {} ms would start after it (last error: {}: {})",
            error.message,
            delay.as_millis(),
            e.kind,
            e.message
        );
    }
    error
}

/// What follows with the cursor at `at`: the pipeline is finished, the
/// execution stopped, the task cannot start, runs here, or is handed to
/// the executors of its kind (or, when none serves it, a timer fails the
/// step-run).
fn at_task(i: &NextInput<'_>, at: At) -> Then {
    let Some(task) = i.tasks.get(at.pc) else {
        return Then::Finished;
    };
    if i.stopped {
        return Then::Stop;
    }
    if let Some(error) = cannot_start(i, at.pc, task) {
        return Then::End(End::Failed(error.to_value()));
    }
    if (i.serves)(&task.kind) {
        return Then::Run;
    }
    Then::Command(Handoff {
        kind: task.kind.clone(),
        task: task.name.clone(),
        at,
        not_before_ms: 0,
        retry: false,
    })
}

/// Why task `pc` may not start: the step-run is out of time (the command
/// waited in a queue, or an earlier task used the time up), the task's
/// workbook reference is broken, or the step-run ran [`MAX_TASK_RUNS`]
/// tasks already.
fn cannot_start(i: &NextInput<'_>, pc: usize, task: &Task) -> Option<StepError> {
    let due = |d: &&Deadline| matches!(lifecycle::due(d.at_ms, i.now_ms), Due::Now);
    if let Some(d) = i.deadline.filter(due) {
        return Some(lifecycle::timeout_error(d, &i.step.step, Some(&task.name)));
    }
    if let Some(Some(why)) = i.task_errors.get(pc) {
        return Some(StepError::new("workbook", why, Some(&task.name)));
    }
    if i.steps_taken >= MAX_TASK_RUNS {
        let message = format!(
            "step {:?} ran {MAX_TASK_RUNS} tasks in one step-run (a jump loop without exit?)",
            i.step.step
        );
        return Some(StepError::new("pipeline.limit", message, Some(&task.name)));
    }
    None
}

#[cfg(test)]
mod tests;
