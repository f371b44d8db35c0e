//! Typed payloads of the events one service writes and another reads back.
//!
//! Events carry their payload as JSON (readable by any client, field names
//! as in `docs/architecture.md`, "Event payloads"). A service that decides
//! on an event decodes it with [`decode`]: a field of the wrong type or a
//! missing required field is an [`crate::MeshError::Invalid`] naming the
//! event, its execution and the field, never a silent default. User data
//! (results, args, `iter`, reducer contributions, errors) stays free-form
//! JSON inside them.

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::{Map, Value};

use noetl_wire::Event;

use crate::event_type::EventType;
use crate::handled::HandledError;
use crate::MeshError;

mod batch;
pub use batch::{
    compact_end, counted_end, full_end, BatchAccepted, BatchCompleted, BatchEnd, BatchItem,
    CompactedEnd,
};
mod start;
pub use start::{PlanIdentity, PlaybookInitialized, Resumed};
mod task;
pub use task::{AttemptStart, LastTask, RetryAt, TaskDone, TaskStarted, TASK_START_DEFERRAL_MS};

/// `loop.iteration.started`, written by the loop-supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationStarted {
    /// The loop run (its step-run id).
    pub loop_run_id: String,
    /// The iteration.
    pub index: u64,
    /// A cursor loop's iteration: the claim (sequence number) whose rows
    /// it runs. With the index it places the claim's rows, which a loop
    /// run rebuilt from the log needs (docs/architecture.md "Loop runs from
    /// the log"). Absent for a loop over `in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<u64>,
}

/// The part every iteration event (`loop.iteration.started`, `.done`,
/// `.failed`) shares, naming the iteration: for readers that need no more
/// of it (which iterations ran, which ended).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IterationNamed {
    /// The loop run (its step-run id; empty in a batch's compact end).
    #[serde(default)]
    pub loop_run_id: String,
    /// The iteration.
    pub index: u64,
}

/// How a step or an iteration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// `step.done`, `loop.iteration.done`.
    Ok,
    /// `step.failed`, `loop.iteration.failed`.
    Error,
}

/// `step.done` / `step.failed`, written by the executor (and by the
/// scheduler, the loop-supervisor and the router's timers for steps that
/// end without a task), read by the router ([`BoundaryView`]) and clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEnded {
    /// How it ended.
    pub status: Status,
    /// The step's result (`step.done`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// A loop step's counters (a failed loop's `step.failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<LoopCounts>,
    /// The step's args.
    #[serde(default)]
    pub args: Value,
    /// Why it failed (`step.failed`: `{kind, message, ...}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// Task errors a policy rule handled in the step-run (it went on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handled: Vec<HandledError>,
    /// The step-run's last `task.done`, carried here instead of stored
    /// on its own ([`LastTask`]). Written, never read back through this
    /// type: readers of the log get it unfolded ([`crate::events::unfold`]),
    /// and the live consumers of the end skip it without building it.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub last_task: Option<Box<LastTask>>,
}

impl StepEnded {
    /// `step.done` with `result`.
    pub fn done(result: Value, args: Value) -> Self {
        Self {
            status: Status::Ok,
            result: Some(result),
            counts: None,
            args,
            error: None,
            handled: Vec::new(),
            last_task: None,
        }
    }
    /// `step.failed` with `error`.
    pub fn failed(error: Value, args: Value) -> Self {
        Self {
            status: Status::Error,
            result: None,
            counts: None,
            args,
            error: Some(error),
            handled: Vec::new(),
            last_task: None,
        }
    }
}

/// `loop.iteration.done` / `loop.iteration.failed`, written by the executor
/// (or the loop-supervisor for a loop without tasks), read by the
/// loop-supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationEnded {
    /// The loop run (its step-run id; absent in a batch's compact end,
    /// which the batch names once: [`BatchEnd::end`]).
    #[serde(default)]
    pub loop_run_id: String,
    /// The iteration.
    pub index: u64,
    /// How it ended (absent: `ok`).
    #[serde(default = "ok")]
    pub status: Status,
    /// Its last result (compact).
    #[serde(default)]
    pub result: Value,
    /// Its `iter` at the end (compact).
    #[serde(default)]
    pub iter: Value,
    /// Its reducer contributions (ctx key -> partial aggregate).
    #[serde(default)]
    pub reduce: Map<String, Value>,
    /// Why it failed (`null` when it did not).
    #[serde(default)]
    pub error: Value,
    /// Task errors a policy rule handled in the iteration (it went on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handled: Vec<HandledError>,
    /// The iteration's last `task.done`, carried here instead of stored
    /// on its own ([`LastTask`]). Written, never read back through this
    /// type: readers of the log get it unfolded ([`crate::events::unfold`]),
    /// and the live consumers of the end skip it without building it.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub last_task: Option<Box<LastTask>>,
}

fn ok() -> Status {
    Status::Ok
}

/// `loop.claimed`, written by the executor that ran a cursor loop's
/// claim, read by the loop-supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimEnded {
    /// The loop run (its step-run id).
    pub loop_run_id: String,
    /// The claim's sequence number in the loop run.
    pub seq: u64,
    /// How the claim ended (absent: `ok`).
    #[serde(default = "ok")]
    pub status: Status,
    /// The claimed rows: a list, or a reference to one when it is larger
    /// than the payload limit.
    #[serde(default)]
    pub rows: Value,
    /// How many rows were claimed.
    #[serde(default)]
    pub count: u64,
    /// Why it failed (`null` when it did not).
    #[serde(default)]
    pub error: Value,
}

/// How a loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopStatus {
    /// Every iteration succeeded.
    Ok,
    /// Some failed (`best_effort`).
    Partial,
    /// The loop failed (`fail_fast` with a failure, or a reducer error).
    Failed,
}

/// A loop's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoopCounts {
    /// Iterations in the collection.
    pub total: u64,
    /// Succeeded.
    pub done: u64,
    /// Failed.
    pub failed: u64,
}

/// `loop.done`, written by the loop-supervisor, read by the router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopDone {
    /// True when this event is the step-run's boundary (its arcs are
    /// evaluated on it); false when the loop failed and its boundary is the
    /// `step.failed` that follows.
    pub boundary: bool,
    /// How the loop ended.
    pub status: LoopStatus,
    /// Counters.
    pub counts: LoopCounts,
    /// The step's result: the counters.
    pub result: LoopCounts,
    /// The step's args.
    #[serde(default)]
    pub args: Value,
    /// Why the loop failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// The reducer results this loop folded into `ctx`, in the order they
    /// were applied (docs/architecture.md "The event log"): each combines
    /// with the key's value at that point, as the loop-supervisor did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reduce: Vec<Reduced>,
    /// [`Self::reduce`] stored whole in the object store, when it is too
    /// large to ride in the event (a reference; `reduce` is then empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_ref: Option<Value>,
    /// Task errors a policy rule handled in its iterations (they went on),
    /// for the loop step's record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handled: Vec<HandledError>,
}

/// One reducer result of a loop: `ctx.<key>` becomes
/// `combine(op, ctx.<key>, value)` (`noetl_core::reduce::combine`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reduced {
    /// The `ctx` key.
    pub key: String,
    /// The reducer (`sum`, `append`...).
    pub op: noetl_core::reduce::ReducerOp,
    /// The loop's aggregate.
    pub value: Value,
}

/// `message.dead_lettered`, written by any consumer, read by the router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLettered {
    /// The consumer that gave up.
    pub consumer: String,
    /// The message's subject.
    pub subject: String,
    /// Why.
    pub reason: String,
}

/// `execution.cancel_requested`, read by the router.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CancelRequested {
    /// Why (may be empty).
    #[serde(default)]
    pub reason: String,
}

/// `execution.completed` / `execution.failed` / `execution.cancelled`,
/// written by the router, read by clients (`noetl run`, `exec status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionEnded {
    /// `completed`, `failed` or `cancelled`.
    pub status: crate::status::ExecStatus,
    /// Why it failed or was cancelled.
    #[serde(default)]
    pub error: Option<String>,
    /// Where the playbook came from (an execution refused before it
    /// started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The tokens that were live when it failed or was cancelled (the
    /// header's `stopped`: what a resume runs again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped: Vec<crate::token::TokenRecord>,
}

/// `token.created`, written by the router for an execution's entry token
/// and a resume's tokens; the tokens a boundary's arcs fire ride in its
/// `next.selected` instead ([`SelectedArc::token_id`]). Read both through
/// [`tokens_created`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenCreated {
    /// The token (the step-run it starts).
    pub token_id: String,
    /// Its step.
    pub step: String,
    /// The arc that fired it (absent for the entry token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arc: Option<usize>,
    /// Its args as the header records them (large values by reference).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub args: Value,
    /// The step-run that fired it, when that is not the event's own
    /// step-run (a resumed execution's tokens).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
    /// The entry step-run's `step.started` when the router started it (as
    /// [`SelectedArc::started`]; absent for a token sent to the scheduler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<StepStarted>,
}

/// One arc a `next.selected` names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectedArc {
    /// Index in the step's `next.arcs`.
    pub arc: usize,
    /// Its target step.
    pub step: String,
    /// The token it fired (the step-run it starts). Logs written before
    /// tokens rode in `next.selected` have none here and a `token.created`
    /// per token instead.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token_id: String,
    /// The token's args as the header records them (large values by
    /// reference).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub args: Value,
    /// The `step.started` of the token's step-run when the router started
    /// it itself (no admission to read): stored here, not on its own, and
    /// read back as its own event ([`crate::events::unfold`]). Absent for a
    /// token sent to the scheduler, and in logs before 2026-12-01.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<StepStarted>,
}

/// The tokens `ev` creates, in order: a `token.created`'s one, or those a
/// `next.selected` fired (its arcs that name a token), each with its
/// `parent` resolved: the step-run that fired it (the event's own, unless
/// a resumed token's payload names another). Every reader of "which
/// tokens exist" reads them here, so both shapes of the log read alike.
pub fn tokens_created(ev: &Event) -> Result<Vec<TokenCreated>, MeshError> {
    let mut tokens = match EventType::of(ev) {
        Some(EventType::TokenCreated) => vec![decode_typed::<TokenCreated>(ev)?],
        Some(EventType::NextSelected) => decode_typed::<NextSelected>(ev)?
            .arcs
            .into_iter()
            .filter(|a| !a.token_id.is_empty())
            .map(|a| TokenCreated {
                token_id: a.token_id,
                step: a.step,
                arc: Some(a.arc),
                args: a.args,
                parent: String::new(),
                started: None,
            })
            .collect(),
        _ => Vec::new(),
    };
    for t in tokens.iter_mut().filter(|t| t.parent.is_empty()) {
        t.parent = ev.step_run_id.clone();
    }
    Ok(tokens)
}

/// `next.selected`, written by the router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NextSelected {
    /// The boundary event the arcs were evaluated on.
    pub on: String,
    /// The step's routing mode.
    pub mode: noetl_core::RouteMode,
    /// The arcs that fired.
    pub arcs: Vec<SelectedArc>,
    /// Why routing failed, if it did.
    #[serde(default)]
    pub error: Option<String>,
    /// The `ctx` writes of the arcs that fired (their `set_ctx`, in arc
    /// order), applied before their tokens were placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_ctx: Option<Map<String, Value>>,
    /// The same writes stored whole in the object store, when they are too
    /// large to ride in the event ([`crate::patches`]; `set_ctx` is then
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_ctx_ref: Option<Value>,
}

/// `loop.started`, written by the loop-supervisor, read by `noetl run`'s
/// progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopStarted {
    /// Iterations.
    pub total: u64,
    /// Iterations in flight at most.
    pub max_in_flight: u64,
    /// `sequential`, `parallel` or `cursor` (whose `total` grows as it
    /// claims: 0 at the start).
    #[serde(default)]
    pub mode: Option<noetl_core::LoopMode>,
    /// The step-run's deadline (epoch ms; 0: none), every iteration's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deadline_ms: u64,
    /// The setting that set `deadline_ms`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub deadline_of: String,
    /// A loop over `in`'s stored chunks (each inline or a reference), by
    /// reference when large: what rebuilds lost chunks. Null for a cursor
    /// loop (its rows are in its `loop.claimed` events).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub collection: Value,
    /// A cursor loop's rows per claim (`frame.max_rows` as rendered; 0: a
    /// loop over `in`), which a loop run rebuilt from the log needs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_rows: u64,
    /// The stopped run a resumed execution's run continues (a fold of
    /// this run starts from its fold); absent when it continues none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub continues: String,
    /// How many of the continued run's own events (after its
    /// `loop.started`, in stream order) the new run's start folded it
    /// from: a fold of this run folds the continued one from those alone,
    /// as the start did (an end of it stored after the start read the log
    /// is the new run's to run again). Absent in logs written before: the
    /// continued run is folded from all its events before this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_events: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `workflow.initialized` (router).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowInitialized {
    /// The step the entry token starts.
    pub entry_step: String,
    /// Steps in the workflow.
    pub steps: usize,
}

/// A timer the router acts on when due (`router::timers`): the fields of
/// `execution.deadline` ([`ExecutionDeadlineSet`]) and `step.deadline`
/// ([`StepDeadlineSet`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadlineSet {
    /// When (epoch ms).
    pub at_ms: u64,
    /// The setting that set it.
    pub what: String,
    /// The step's args (`step.deadline`: carried into its `step.failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// `execution.deadline` (router): the execution's [`DeadlineSet`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExecutionDeadlineSet(pub DeadlineSet);

/// `step.deadline` (scheduler): a step-run's [`DeadlineSet`], with its args.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StepDeadlineSet(pub DeadlineSet);

/// `step.scheduled` (scheduler, logs written before 2026-11-29): the
/// step-run was admitted. A step-run is now admitted and started in one
/// [`StepStarted`], with the same fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepScheduled {
    /// The admission rule that matched, if any.
    pub rule: Option<usize>,
    /// A loop step (the loop-supervisor runs it).
    #[serde(rename = "loop")]
    pub is_loop: bool,
}

/// `step.skipped` (scheduler): admission denied, or a token a join
/// absorbed while it waits for its other inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSkipped {
    /// `admission denied` or `join.waiting`.
    pub reason: String,
    /// The admission rule that denied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<usize>,
    /// The step's args (admission denied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    /// Inputs arrived so far (join).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrived: Option<usize>,
    /// Inputs the join waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<usize>,
    /// True for a token a join absorbed ([`BoundaryView::join`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub join: bool,
}

/// The `{kind, message}` error the engine itself reports (a step's
/// `error` when no tool's outcome says more: `admission`, `loop.in`,
/// `loop.items`, `loop.failed`, `reducer`, `keychain`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable kind.
    pub kind: String,
    /// What went wrong.
    pub message: String,
}

/// An [`ErrorBody`] as JSON.
pub fn error_body(kind: &str, message: impl Into<String>) -> Value {
    to_value(&ErrorBody {
        kind: kind.to_string(),
        message: message.into(),
    })
}

/// What the router reads of a step-run's boundary event (`step.done`,
/// `step.failed`, `step.skipped`, `loop.done`); the rest of the payload
/// is passed to arc conditions as `event` untouched.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct BoundaryView {
    /// The step's args (its token's inscription).
    #[serde(default)]
    pub args: Option<Value>,
    /// Why the step failed.
    #[serde(default)]
    pub error: Option<Value>,
    /// A `step.skipped` for a token a join absorbed: says nothing about the
    /// step's status.
    #[serde(default)]
    pub join: bool,
    /// `loop.done`: whether it is the boundary.
    #[serde(default)]
    pub boundary: Option<bool>,
    /// `loop.done`: the counters.
    #[serde(default)]
    pub counts: Option<LoopCounts>,
    /// Task errors a policy rule handled in the step-run.
    #[serde(default)]
    pub handled: Vec<HandledError>,
}

/// `step.started` (scheduler): admission let the step-run in and it
/// began, in one event. Older logs have a `step.scheduled` with these
/// fields followed by an empty `step.started`: [`is_admission`] tells the
/// two apart.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStarted {
    /// The admission rule that matched, if any.
    #[serde(default)]
    pub rule: Option<usize>,
    /// A loop step (the loop-supervisor runs it); `None` in an older
    /// log's empty `step.started`, whose `step.scheduled` was the
    /// admission.
    #[serde(default, rename = "loop", skip_serializing_if = "Option::is_none")]
    pub is_loop: Option<bool>,
}

impl StepStarted {
    /// The start of an admitted step-run: `rule` matched, `is_loop` a
    /// loop step.
    pub fn admitted(rule: Option<usize>, is_loop: bool) -> Self {
        Self {
            rule,
            is_loop: Some(is_loop),
        }
    }
}

/// Whether `ev` is the scheduler's admission of its step-run: a
/// `step.scheduled` (older logs), or a `step.started` that carries the
/// admission (`loop` set), not the empty one that followed a
/// `step.scheduled` before the two were one event.
pub fn is_admission(ev: &Event) -> bool {
    match EventType::of(ev) {
        Some(EventType::StepScheduled) => true,
        Some(EventType::StepStarted) => {
            decode::<StepStarted>(ev).is_ok_and(|s| s.is_loop.is_some())
        }
        _ => false,
    }
}

/// A payload struct and the event types it is the payload of (Restate's
/// commands bound to a `KIND` are the model). An event is built from its
/// payload ([`crate::events::EventDraft::build`]), which names its type
/// ([`EventPayload::kind`]); services read payloads with [`decode_typed`],
/// which refuses an event of another type.
pub trait EventPayload: Serialize + DeserializeOwned {
    /// The event types whose payload this is.
    const KINDS: &'static [EventType];
    /// The type of the event this value is the payload of (one of
    /// [`Self::KINDS`]): a struct of several types tells them apart by a
    /// field of its own (`status`).
    fn kind(&self) -> EventType;
}

/// `impl EventPayload` for structs that are the payload of one type each.
macro_rules! payload_of {
    ($($t:ty => $k:ident),+ $(,)?) => {
        $(impl $crate::payloads::EventPayload for $t {
            const KINDS: &'static [$crate::event_type::EventType] =
                &[$crate::event_type::EventType::$k];
            fn kind(&self) -> $crate::event_type::EventType {
                $crate::event_type::EventType::$k
            }
        })+
    };
}
pub(crate) use payload_of;

payload_of! {
    IterationStarted => LoopIterationStarted,
    ClaimEnded => LoopClaimed,
    LoopDone => LoopDone,
    DeadLettered => MessageDeadLettered,
    CancelRequested => ExecutionCancelRequested,
    TokenCreated => TokenCreated,
    NextSelected => NextSelected,
    LoopStarted => LoopStarted,
    TaskStarted => TaskStarted,
    TaskDone => TaskDone,
    PlaybookInitialized => PlaybookInitialized,
    WorkflowInitialized => WorkflowInitialized,
    ExecutionDeadlineSet => ExecutionDeadline,
    StepDeadlineSet => StepDeadline,
    StepScheduled => StepScheduled,
    StepSkipped => StepSkipped,
    StepStarted => StepStarted,
    Resumed => ExecutionResumed,
}

impl EventPayload for StepEnded {
    const KINDS: &'static [EventType] = &[EventType::StepDone, EventType::StepFailed];
    fn kind(&self) -> EventType {
        match self.status {
            Status::Ok => EventType::StepDone,
            Status::Error => EventType::StepFailed,
        }
    }
}

impl EventPayload for IterationEnded {
    const KINDS: &'static [EventType] =
        &[EventType::LoopIterationDone, EventType::LoopIterationFailed];
    fn kind(&self) -> EventType {
        match self.status {
            Status::Ok => EventType::LoopIterationDone,
            Status::Error => EventType::LoopIterationFailed,
        }
    }
}

impl EventPayload for ExecutionEnded {
    const KINDS: &'static [EventType] = &[
        EventType::ExecutionCompleted,
        EventType::ExecutionFailed,
        EventType::ExecutionCancelled,
    ];
    fn kind(&self) -> EventType {
        use crate::status::ExecStatus as S;
        match self.status {
            S::Completed => EventType::ExecutionCompleted,
            S::Cancelled => EventType::ExecutionCancelled,
            // An execution that ends is never `running`: the router
            // writes an end with one of the three statuses above.
            S::Failed | S::Running => EventType::ExecutionFailed,
        }
    }
}

/// Decode `event`'s payload as `T`, which must be its type's payload
/// struct: another type is [`MeshError::Invalid`], naming both.
pub fn decode_typed<T: EventPayload>(event: &Event) -> Result<T, MeshError> {
    match EventType::of(event) {
        Some(kind) if T::KINDS.contains(&kind) => decode(event),
        _ => Err(MeshError::Invalid(format!(
            "{} of execution {} (step {:?}) is not an event {} is the payload of",
            event.event_type,
            event.execution_id,
            event.step,
            std::any::type_name::<T>()
        ))),
    }
}

/// A payload as JSON for an [`crate::events::EventDraft`].
pub fn to_value<T: Serialize>(payload: &T) -> Value {
    serde_json::to_value(payload).expect("payload types serialise to JSON")
}

/// Decode `event`'s payload as `T`, naming the event, its execution and
/// step, and the field that is wrong.
pub fn decode<T: DeserializeOwned>(event: &Event) -> Result<T, MeshError> {
    let bytes: &[u8] = if event.payload_json.is_empty() {
        b"{}"
    } else {
        &event.payload_json
    };
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        MeshError::Invalid(format!(
            "{} of execution {} (step {:?}) has a payload that does not decode{}: {}",
            event.event_type,
            event.execution_id,
            event.step,
            if path == "." {
                String::new()
            } else {
                format!(" at `{path}`")
            },
            e.inner()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(event_type: &str, payload: Value) -> Event {
        Event {
            event_type: event_type.into(),
            execution_id: "e1".into(),
            step: "lp".into(),
            payload_json: serde_json::to_vec(&payload).unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn a_typed_decode_refuses_an_event_of_another_type() {
        let claim = json!({"loop_run_id": "lr", "seq": 1, "status": "ok"});
        let dl = json!({"consumer": "executor-python", "subject": "noetl.task.python", "reason": "boom"});
        let e = decode_typed::<DeadLettered>(&event("loop.claimed", claim)).unwrap_err();
        assert!(
            matches!(&e, MeshError::Invalid(m) if m.contains("loop.claimed of execution e1")),
            "{e}"
        );
        assert!(decode_typed::<DeadLettered>(&event("message.dead_lettered", dl)).is_ok());
        // Every payload struct names at least one type, each type exactly
        // one struct.
        let mut owner = std::collections::BTreeMap::new();
        for kinds in [
            IterationStarted::KINDS,
            StepEnded::KINDS,
            IterationEnded::KINDS,
            ClaimEnded::KINDS,
            LoopDone::KINDS,
            DeadLettered::KINDS,
            CancelRequested::KINDS,
            ExecutionEnded::KINDS,
            TokenCreated::KINDS,
            NextSelected::KINDS,
            LoopStarted::KINDS,
            TaskStarted::KINDS,
            TaskDone::KINDS,
            PlaybookInitialized::KINDS,
            WorkflowInitialized::KINDS,
            ExecutionDeadlineSet::KINDS,
            StepDeadlineSet::KINDS,
            StepScheduled::KINDS,
            StepSkipped::KINDS,
            StepStarted::KINDS,
            crate::served::TaskUnserved::KINDS,
            crate::audit::Audit::KINDS,
            crate::pause::Paused::KINDS,
            crate::pause::Unpaused::KINDS,
            crate::resume::ResumeRequested::KINDS,
            crate::resume::Superseded::KINDS,
            Resumed::KINDS,
            crate::waiter::WaitStarted::KINDS,
            crate::waiter::WaitTimeout::KINDS,
            crate::waiter::SignalReceived::KINDS,
            crate::gate::ExecutionQueued::KINDS,
            BatchAccepted::KINDS,
            BatchCompleted::KINDS,
        ] {
            assert!(!kinds.is_empty());
            for k in kinds {
                assert!(
                    owner.insert(*k, ()).is_none(),
                    "{k} has two payload structs"
                );
            }
        }
        let missing: Vec<_> = EventType::ALL
            .into_iter()
            .filter(|k| !owner.contains_key(k))
            .collect();
        assert!(missing.is_empty(), "no payload struct for {missing:?}");
    }

    #[test]
    fn execution_ends_and_tokens_keep_their_wire_shape() {
        let done = ExecutionEnded {
            status: crate::status::ExecStatus::Completed,
            error: None,
            source: None,
            stopped: Vec::new(),
        };
        assert_eq!(
            to_value(&done),
            json!({"status": "completed", "error": null})
        );
        let refused = ExecutionEnded {
            status: crate::status::ExecStatus::Failed,
            error: Some("E010".into()),
            source: Some("bad.yaml".into()),
            stopped: Vec::new(),
        };
        assert_eq!(
            to_value(&refused),
            json!({"status": "failed", "error": "E010", "source": "bad.yaml"})
        );
        let entry = TokenCreated {
            token_id: "t0".into(),
            step: "start".into(),
            arc: None,
            args: Value::Null,
            parent: String::new(),
            started: None,
        };
        assert_eq!(to_value(&entry), json!({"token_id": "t0", "step": "start"}));
        let task_done = TaskDone {
            duration_ms: 3,
            ..TaskDone::ok(json!("x"), "continue")
        };
        assert_eq!(
            to_value(&task_done),
            json!({"status": "ok", "attempt": 1, "duration_ms": 3, "result": "x", "error": null,
                   "action": "continue", "rule": null, "set_ctx": null, "set_iter": null})
        );
        // A quick attempt's start rides in its end.
        let quick = TaskDone {
            started: Some(AttemptStart {
                pc: 2,
                kind: "noop".into(),
                at_ms: 1_000,
            }),
            ..task_done
        };
        assert_eq!(
            to_value(&quick)["started"],
            json!({"pc": 2, "kind": "noop", "at_ms": 1_000})
        );
    }

    #[test]
    fn step_ends_keep_their_wire_shape() {
        assert_eq!(
            to_value(&StepEnded::done(json!(42), json!({"a": 1}))),
            json!({"status": "ok", "result": 42, "args": {"a": 1}})
        );
        assert_eq!(
            to_value(&StepEnded::done(Value::Null, json!({}))),
            json!({"status": "ok", "result": null, "args": {}})
        );
        let failed = StepEnded::failed(json!({"kind": "timeout"}), json!({}));
        assert_eq!(
            to_value(&failed),
            json!({"status": "error", "error": {"kind": "timeout"}, "args": {}})
        );
        let ev = event("step.failed", to_value(&failed));
        assert_eq!(decode::<StepEnded>(&ev).unwrap(), failed);
        assert_eq!(
            decode::<BoundaryView>(&ev).unwrap().error,
            Some(json!({"kind": "timeout"}))
        );
    }

    #[test]
    fn iteration_reports_round_trip_with_their_documented_fields() {
        let p = IterationEnded {
            loop_run_id: "sr1".into(),
            index: 3,
            status: Status::Error,
            result: Value::Null,
            iter: json!({"page": 2}),
            reduce: Map::new(),
            error: json!({"kind": "python.exception"}),
            handled: Vec::new(),
            last_task: None,
        };
        let v = to_value(&p);
        assert_eq!(
            v,
            json!({"loop_run_id": "sr1", "index": 3, "status": "error", "result": null,
                   "iter": {"page": 2}, "reduce": {}, "error": {"kind": "python.exception"}})
        );
        assert_eq!(decode::<IterationEnded>(&event("x", v)).unwrap(), p);
        // The loop-supervisor's own report of a loop without tasks.
        let bare = decode::<IterationEnded>(&event(
            "loop.iteration.done",
            json!({"loop_run_id": "sr1", "index": 0, "result": null}),
        ))
        .unwrap();
        assert_eq!((bare.status, bare.reduce.len()), (Status::Ok, 0));
    }

    #[test]
    fn a_bad_field_is_an_invalid_error_naming_event_execution_and_field() {
        let e = decode::<IterationEnded>(&event(
            "loop.iteration.done",
            json!({"loop_run_id": "sr1", "index": "three"}),
        ))
        .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Invalid);
        let m = e.to_string();
        assert!(m.contains("loop.iteration.done of execution e1"), "{m}");
        assert!(m.contains("at `index`"), "{m}");
        let missing = decode::<IterationEnded>(&event("loop.iteration.done", json!({})));
        assert!(missing.unwrap_err().to_string().contains("index"));
    }

    #[test]
    fn loop_done_and_the_router_s_view_of_it_agree() {
        let done = LoopDone {
            boundary: true,
            status: LoopStatus::Partial,
            counts: LoopCounts {
                total: 3,
                done: 2,
                failed: 1,
            },
            result: LoopCounts {
                total: 3,
                done: 2,
                failed: 1,
            },
            args: json!({"a": 1}),
            error: None,
            reduce: vec![Reduced {
                key: "total".into(),
                op: noetl_core::reduce::ReducerOp::Sum,
                value: json!(6),
            }],
            reduce_ref: None,
            handled: vec![HandledError::new(
                "risky",
                "python.exception",
                "ZeroDivisionError",
                "continue",
            )],
        };
        assert_eq!(
            to_value(&done)["reduce"],
            json!([{"key": "total", "op": "sum", "value": 6}])
        );
        let ev = event("loop.done", to_value(&done));
        assert_eq!(decode::<LoopDone>(&ev).unwrap(), done);
        let view = decode::<BoundaryView>(&ev).unwrap();
        assert_eq!(view.boundary, Some(true));
        assert_eq!(view.counts, Some(done.counts));
        assert_eq!(view.args, Some(json!({"a": 1})));
        assert!(!view.join && view.error.is_none());
        assert_eq!(
            view.handled, done.handled,
            "the loop step's record keeps them"
        );
    }

    #[test]
    fn the_admission_is_the_start_that_carries_it_or_an_older_log_s_scheduled() {
        let started = |p: &StepStarted| event("step.started", to_value(p));
        let new = started(&StepStarted::admitted(Some(1), true));
        assert!(is_admission(&new));
        assert_eq!(
            decode::<StepStarted>(&new).unwrap(),
            StepStarted::admitted(Some(1), true)
        );
        // An older log: the admission in `step.scheduled`, then an empty
        // `step.started` that is not a second admission.
        let old = event("step.scheduled", json!({"rule": null, "loop": false}));
        assert!(is_admission(&old));
        let empty = event("step.started", json!({}));
        assert!(!is_admission(&empty));
        assert_eq!(
            decode::<StepStarted>(&empty).unwrap(),
            StepStarted::default()
        );
        assert!(!is_admission(&event(
            "step.skipped",
            json!({"loop": false})
        )));
    }

    #[test]
    fn boundary_views_of_step_events_and_other_payloads_decode() {
        let failed = decode::<BoundaryView>(&event(
            "step.failed",
            json!({"status": "error", "error": {"kind": "x"}, "args": {}}),
        ))
        .unwrap();
        assert_eq!(failed.error, Some(json!({"kind": "x"})));
        let absorbed =
            decode::<BoundaryView>(&event("step.skipped", json!({"join": true}))).unwrap();
        assert!(absorbed.join);
        let bad = decode::<BoundaryView>(&event("step.skipped", json!({"join": "yes"})));
        assert!(bad.unwrap_err().to_string().contains("at `join`"));
        let empty = Event {
            event_type: "execution.cancel_requested".into(),
            ..Default::default()
        };
        assert_eq!(
            decode::<CancelRequested>(&empty).unwrap(),
            CancelRequested::default()
        );
        let dl = DeadLettered {
            consumer: "scheduler".into(),
            subject: "noetl.token.e1".into(),
            reason: "cannot decode token".into(),
        };
        assert_eq!(
            decode::<DeadLettered>(&event("message.dead_lettered", to_value(&dl))).unwrap(),
            dl
        );
    }
}
