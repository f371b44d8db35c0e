//! The payloads of a task attempt's events: `task.started` and
//! `task.done` (docs/architecture.md "Events as stored").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `task.started`, written by the executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStarted {
    /// 1-based attempt.
    pub attempt: u32,
    /// The task's index in the step's pipeline.
    pub pc: usize,
    /// Its tool kind.
    pub kind: String,
}

/// A delayed retry's schedule in `task.done`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryAt {
    /// Delay before the next attempt.
    pub delay_ms: u64,
    /// Its number.
    pub next_attempt: u32,
}

/// What a task's `action` is when its record leaves it out (the compact
/// form a batch of iterations carries, `crate::payloads::compact_end`).
pub(crate) const DEFAULT_ACTION: &str = "continue";

/// `task.done`, written by the executor (whole: the fields read back with
/// a default here are left out only in the compact form a batch of loop
/// iterations carries, `crate::payloads::compact_end`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDone {
    /// `ok` or `error` (absent: `ok`).
    #[serde(default = "outcome_ok")]
    pub status: noetl_core::OutcomeStatus,
    /// 1-based attempt (absent: 1).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// How long the tool call took (absent: 0).
    #[serde(default)]
    pub duration_ms: u64,
    /// Its result (compact; absent: `null`).
    #[serde(default)]
    pub result: Value,
    /// Its error.
    pub error: Option<noetl_core::OutcomeError>,
    /// What the step-run does next: continue, retry, jump, break, fail
    /// (absent: continue).
    #[serde(default = "default_action")]
    pub action: String,
    /// The policy rule that matched.
    pub rule: Option<usize>,
    /// The `set_ctx` patch.
    pub set_ctx: Option<Map<String, Value>>,
    /// The `set_iter` patch.
    pub set_iter: Option<Map<String, Value>>,
    /// A delayed retry's schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryAt>,
    /// The `set_ctx` patch stored whole in the object store, when it is
    /// too large to ride in the event ([`crate::patches`]; `set_ctx` is
    /// then absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_ctx_ref: Option<Value>,
    /// Keys of `set_ctx` that went to the loop's reducers (they reach
    /// `ctx` with the loop's `loop.done`), not into `ctx`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reduced: Vec<String>,
    /// `set_ctx` was refused (`ctx.conflict`): nothing was written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ctx_refused: bool,
    /// The loop iteration the task ran in (absent outside loops, and in
    /// events written before it was recorded): names the writer of a
    /// parallel loop's `ctx` key when its claims are rebuilt from the log
    /// ([`crate::ctx_owners`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// The attempt's start, when no `task.started` was written for it: a
    /// task that ends within [`TASK_START_DEFERRAL_MS`] of its start has
    /// its start recorded with its end (one stored event, not two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<AttemptStart>,
}

fn outcome_ok() -> noetl_core::OutcomeStatus {
    noetl_core::OutcomeStatus::Ok
}

fn first_attempt() -> u32 {
    1
}

fn default_action() -> String {
    DEFAULT_ACTION.to_string()
}

impl TaskDone {
    /// An `ok` first attempt's end that returned `result` and did
    /// `action`, with nothing else (no patch, rule, retry or start).
    pub fn ok(result: Value, action: &str) -> Self {
        Self {
            status: noetl_core::OutcomeStatus::Ok,
            attempt: 1,
            duration_ms: 0,
            result,
            error: None,
            action: action.to_string(),
            rule: None,
            set_ctx: None,
            set_iter: None,
            retry: None,
            set_ctx_ref: None,
            reduced: Vec::new(),
            ctx_refused: false,
            index: None,
            started: None,
        }
    }
}

/// A step-run's (or a loop iteration's) last `task.done`, carried inside
/// the event that ends it (`step.done`, `step.failed`,
/// `loop.iteration.done`, `loop.iteration.failed`: `last_task`) instead
/// of stored on its own: one stored event, not two, and no wait between
/// them. Readers of the log see it unfolded, as the `task.done` it
/// stands for ([`crate::events::unfold`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastTask {
    /// The task's name.
    pub task: String,
    /// Its task run (absent in a batch's compact end when it is derived
    /// from its place: `crate::payloads::full_end`).
    #[serde(default)]
    pub task_run_id: String,
    /// What its `task.done` says.
    #[serde(flatten)]
    pub done: TaskDone,
}

/// How long a task runs before its `task.started` is written: one that
/// ends sooner records its start in its `task.done` (`started`), so a
/// quick task is one stored event. A `playbook` or `wait` task, which
/// hands its step-run off, has its `task.started` written at once.
pub const TASK_START_DEFERRAL_MS: u64 = 100;

/// An attempt's start as its `task.done` records it when no `task.started`
/// was written: what `task.started` would have said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptStart {
    /// The task's index in the step's pipeline.
    pub pc: usize,
    /// Its tool kind.
    pub kind: String,
    /// When it started, ms since the Unix epoch (absent in a batch's
    /// compact end when it is the end's time: `crate::payloads::full_end`).
    #[serde(default)]
    pub at_ms: u64,
}
