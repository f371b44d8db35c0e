//! Timers: `execution.deadline` and `step.deadline` events, handled when due.
//!
//! A timer is an event the router's own `router-timers` consumer receives at
//! once and NAKs with the time left, so JetStream redelivers it when it is
//! due (one redelivery; no handler sleeps, no in-memory timer matters, and
//! a router that restarts loses nothing). When due:
//! - `execution.deadline`: a still running execution fails with a `timeout`
//!   error naming `executor.spec.limits.timeout_s` (one compare-and-set on
//!   the header, as for any end), and its children are asked to cancel;
//! - `step.deadline`: a step-run whose token is still live gets a
//!   `step.failed` with a `timeout` error; the boundary handler then treats
//!   it as any failure (arcs may route it), and a child execution the
//!   step-run waits on is asked to cancel. Whichever boundary event of the
//!   step-run the router handles first wins; the other finds no live token.
//!
//! - `task.unserved`: a task command was published for a kind no executor
//!   served; when due, a step-run still live whose kind is still unserved
//!   gets a `step.failed` with an `executor.unavailable` error naming the
//!   kind, the wait and the subject ([`decide_unserved`]).
//!
//! Timers fire [`GRACE`] after the deadline: an executor running the
//! step-run enforces the same deadline itself and reports first, naming
//! the task; the timer is the backstop for work still waiting in a queue.

use std::sync::Arc;
use std::time::Duration;

use noetl_core::lifecycle::{self, Deadline, Due};
use noetl_mesh::{
    event_type::EventType,
    events::{now_ms, EventDraft},
    handler::{Handle, Handled, Job},
    kv::RevisionCache,
    payloads::{self, ExecutionDeadlineSet, StepDeadlineSet, StepEnded},
    runtime::{BoxFuture, HandlerError},
    served::TaskUnserved,
    signal::WaitTimeout,
    state::{ExecHeader, ExecStatus},
    Mesh, MeshError,
};
use noetl_wire::Event;
use serde_json::Value;

/// How long after its deadline a timer acts.
pub const GRACE: Duration = Duration::from_secs(2);

/// What a due timer leads to: a plain decision over the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerAction {
    /// Not yet: redeliver after this long.
    Wait(Duration),
    /// Nothing: the execution ended, or the step-run is no longer live.
    Nothing,
    /// Fail the execution with this error.
    FailExecution(String),
    /// Fail the step-run (emit `step.failed` with this error).
    FailStepRun(Value),
}

/// The timers the router acts on, one per timer event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// `execution.deadline`.
    Execution,
    /// `step.deadline`.
    Step,
    /// `task.unserved`.
    Unserved,
    /// `wait.timeout`.
    Wait,
}

/// The timer an event of type `kind` is, if any (every type named: a new
/// one does not compile until it is placed).
pub fn timer_of(kind: EventType) -> Option<Timer> {
    use EventType as T;
    match kind {
        T::ExecutionDeadline => Some(Timer::Execution),
        T::StepDeadline => Some(Timer::Step),
        T::TaskUnserved => Some(Timer::Unserved),
        T::WaitTimeout => Some(Timer::Wait),
        T::MessageDeadLettered
        | T::PlaybookInitialized
        | T::WorkflowInitialized
        | T::TokenCreated
        | T::StepScheduled
        | T::StepStarted
        | T::StepSkipped
        | T::TaskStarted
        | T::TaskDone
        | T::StepDone
        | T::StepFailed
        | T::NextSelected
        | T::LoopStarted
        | T::LoopIterationStarted
        | T::BatchAccepted
        | T::BatchCompleted
        | T::LoopIterationDone
        | T::LoopIterationFailed
        | T::LoopDone
        | T::LoopClaimed
        | T::ExecutionCompleted
        | T::ExecutionFailed
        | T::ExecutionCancelRequested
        | T::ExecutionCancelled
        | T::Audit
        | T::ExecutionPaused
        | T::WaitStarted
        | T::SignalReceived
        | T::ExecutionQueued
        | T::ExecutionUnpaused
        | T::ExecutionResumeRequested
        | T::ExecutionResumed
        | T::StepSuperseded => None,
    }
}

/// The event types `router-timers` subscribes to: exactly those
/// [`timer_of`] makes a timer of, so a timer handled is always heard.
pub fn subscribed() -> impl Iterator<Item = EventType> {
    EventType::ALL
        .into_iter()
        .filter(|k| timer_of(*k).is_some())
}

/// What [`decide`] reads.
pub struct TimerInput<'a> {
    /// The deadline's timer: [`Timer::Execution`] or [`Timer::Step`].
    pub timer: Timer,
    /// The deadline the timer carries.
    pub deadline: &'a Deadline,
    /// The step (step timers).
    pub step: &'a str,
    /// The step-run (step timers).
    pub step_run_id: &'a str,
    /// The execution's header now (`None`: unknown execution).
    pub header: Option<&'a ExecHeader>,
    /// The execution's deadline as its plan now sets it, for a resumed
    /// execution (`None`: never resumed, or no deadline): an execution
    /// timer set before the resume is older and does nothing.
    pub current_deadline_ms: Option<u64>,
    /// Now (epoch ms).
    pub now_ms: u64,
}

/// Decide what a timer does now.
pub fn decide(i: &TimerInput<'_>) -> TimerAction {
    let at = i.deadline.at_ms.saturating_add(GRACE.as_millis() as u64);
    if let Due::In(left) = lifecycle::due(at, i.now_ms) {
        return TimerAction::Wait(left);
    }
    let Some(h) = i.header else {
        return TimerAction::Nothing;
    };
    if h.status != ExecStatus::Running {
        return match ended_by_it_unannounced(i, h) {
            true => TimerAction::FailExecution(lifecycle::execution_timeout_message(i.deadline)),
            false => TimerAction::Nothing,
        };
    }
    match i.timer {
        Timer::Execution if i.current_deadline_ms.is_some_and(|c| i.deadline.at_ms < c) => {
            TimerAction::Nothing
        }
        Timer::Execution => {
            TimerAction::FailExecution(lifecycle::execution_timeout_message(i.deadline))
        }
        Timer::Step if h.is_live(i.step_run_id) => {
            TimerAction::FailStepRun(lifecycle::timeout_error(i.deadline, i.step, None).to_value())
        }
        Timer::Step => TimerAction::Nothing,
        // Decided by `on_unserved` and `on_wait`.
        Timer::Unserved | Timer::Wait => TimerAction::Nothing,
    }
}

/// Whether the execution timer `i` ended `h` itself and its end has not
/// gone out yet: a delivery that stopped (or whose publish failed) between
/// the header's end and the terminal event. Its redelivery finishes the
/// end: the header says the deadline's failure, the event is owed.
fn ended_by_it_unannounced(i: &TimerInput<'_>, h: &ExecHeader) -> bool {
    i.timer == Timer::Execution
        && h.status.is_terminal()
        && !h.terminal_emitted
        && h.error.as_deref() == Some(lifecycle::execution_timeout_message(i.deadline).as_str())
}

/// Handles `execution.deadline` and `step.deadline`.
pub struct TimerHandler {
    mesh: Mesh,
    headers: Arc<RevisionCache<ExecHeader>>,
}

impl TimerHandler {
    /// A handler writing headers through `headers`, the cache the boundary
    /// handler of this process reads them from.
    pub fn new(mesh: Mesh, headers: Arc<RevisionCache<ExecHeader>>) -> Self {
        Self { mesh, headers }
    }
}

impl Handle for TimerHandler {
    type In = Event;
    type Plan = ();
    const NAME: &'static str = "timer";

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn handle(
        self: Arc<Self>,
        job: Job<Event, ()>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            let ev = job.input;
            let Some(timer) = EventType::of(&ev).and_then(timer_of) else {
                return Err(MeshError::Invalid(format!(
                    "{} of execution {} is not a timer",
                    ev.event_type, ev.execution_id
                ))
                .into());
            };
            let wait = if timer == Timer::Unserved {
                let t: TaskUnserved = payloads::decode_typed(&ev)?;
                on_unserved(&self.mesh, &ev, &t).await?
            } else if timer == Timer::Wait {
                let t: WaitTimeout = payloads::decode_typed(&ev)?;
                on_wait(&self.mesh, &ev, &t).await?
            } else {
                let set = if timer == Timer::Step {
                    payloads::decode_typed::<StepDeadlineSet>(&ev)?.0
                } else {
                    payloads::decode_typed::<ExecutionDeadlineSet>(&ev)?.0
                };
                let deadline = Deadline {
                    at_ms: set.at_ms,
                    what: set.what,
                };
                on_timer(&self.mesh, &self.headers, &ev, (timer, &deadline), set.args).await?
            };
            Ok(wait.map_or(Handled::Done, Handled::NotYet))
        })
    }
}

// Over 80 lines on purpose: read, decide, write for one timer; the decision is `decide`,
// tested.
/// Act on a timer; `Some(wait)` when it is not due yet.
async fn on_timer(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    ev: &Event,
    (timer, deadline): (Timer, &Deadline),
    args: Option<Value>,
) -> Result<Option<Duration>, MeshError> {
    let eid = ev.execution_id.as_str();
    // Not due: no read at all.
    let early = decide(&TimerInput {
        timer,
        deadline,
        step: &ev.step,
        step_run_id: &ev.step_run_id,
        header: None,
        current_deadline_ms: None,
        now_ms: now_ms(),
    });
    if let TimerAction::Wait(left) = early {
        return Ok(Some(left));
    }
    // A header purged while the execution runs is written back from its
    // events: a purge must not cancel a deadline.
    let header = noetl_mesh::rebuild::running_header(mesh, eid).await?;
    let current_deadline_ms = match &header {
        Some(h) if h.resumes > 0 && timer == Timer::Execution => {
            let plan = mesh.plans().get(mesh, eid).await?;
            lifecycle::execution_deadline(&plan.playbook, plan.started_ms).map(|d| d.at_ms)
        }
        _ => None,
    };
    let action = decide(&TimerInput {
        timer,
        deadline,
        step: &ev.step,
        step_run_id: &ev.step_run_id,
        header: header.as_ref(),
        current_deadline_ms,
        now_ms: now_ms(),
    });
    match action {
        TimerAction::Wait(left) => return Ok(Some(left)),
        TimerAction::Nothing => {}
        TimerAction::FailExecution(error) => {
            tracing::info!(execution_id = %eid, %error, "execution deadline passed");
            let ended =
                crate::ending::end_running(mesh, headers, eid, ExecStatus::Failed, &error).await?;
            if let Some(h) = ended.filter(|h| h.status.is_terminal()) {
                // The children first: the terminal event's flag is what a
                // redelivery reads to know whether this is left to do.
                crate::children::cancel_children_where(
                    mesh,
                    eid,
                    None,
                    &format!("parent execution {eid} ran out of time"),
                )
                .await?;
                crate::ending::emit_terminal(mesh, headers, &h, &ev.trace_id).await?;
            }
        }
        TimerAction::FailStepRun(error) => {
            tracing::info!(execution_id = %eid, step = %ev.step, "step deadline passed");
            // A child the step-run waits on is of no use any more (asked
            // first: a redelivered timer repeats both while the step-run
            // is live).
            crate::children::cancel_children_where(
                mesh,
                eid,
                Some(&ev.step_run_id),
                &format!(
                    "step {:?} of parent execution {eid} ran out of time",
                    ev.step
                ),
            )
            .await?;
            let failed = EventDraft {
                execution_id: eid,
                step_run_id: &ev.step_run_id,
                step: &ev.step,
                trace_id: &ev.trace_id,
                parent_id: &ev.event_id,
                discriminator: "deadline",
                ..Default::default()
            }
            .build(&StepEnded::failed(
                error,
                args.unwrap_or_else(|| Value::Object(Default::default())),
            ));
            mesh.emit(&failed).await?.wait().await?;
        }
    }
    Ok(None)
}

/// A `wait` task's timeout: when due, the waiter it is for (if a signal
/// has not continued it first) continues with a `timeout` error.
async fn on_wait(mesh: &Mesh, ev: &Event, t: &WaitTimeout) -> Result<Option<Duration>, MeshError> {
    if let Due::In(left) = lifecycle::due(t.at_ms, now_ms()) {
        return Ok(Some(left));
    }
    if mesh.expire_wait(&ev.execution_id, t).await? {
        tracing::info!(execution_id = %ev.execution_id, signal = %t.signal, "wait timed out");
    }
    Ok(None)
}

/// What a due `task.unserved` timer reads.
pub struct UnservedInput<'a> {
    /// The timer.
    pub timer: &'a TaskUnserved,
    /// The step-run it is for.
    pub step_run_id: &'a str,
    /// The task that waits.
    pub task: &'a str,
    /// The execution's header now (`None`: unknown execution).
    pub header: Option<&'a ExecHeader>,
    /// Whether an executor serves the kind now (`None`: not asked yet).
    pub served: Option<bool>,
    /// How long the cluster has looked available to this process
    /// ([`noetl_mesh::outage`]).
    pub calm_for: Duration,
    /// Now (epoch ms).
    pub now_ms: u64,
}

/// What a `task.unserved` timer does now: wait until due; nothing when the
/// execution ended, the step-run is over or an executor now serves the
/// kind; wait again while the cluster has not been calm for the timer's
/// whole wait (an outage hides the executors that sat it out); else fail
/// the step-run with `executor.unavailable`.
/// [`TimerAction::Wait`] with a zero wait asks for the kind to be checked.
pub fn decide_unserved(i: &UnservedInput<'_>) -> TimerAction {
    if let Due::In(left) = lifecycle::due(i.timer.at_ms, i.now_ms) {
        return TimerAction::Wait(left);
    }
    let Some(h) = i.header.filter(|h| h.status == ExecStatus::Running) else {
        return TimerAction::Nothing;
    };
    if !h.is_live(i.step_run_id) {
        return TimerAction::Nothing;
    }
    match i.served {
        None => TimerAction::Wait(Duration::ZERO),
        Some(true) => TimerAction::Nothing,
        Some(false) if i.calm_for < Duration::from_millis(i.timer.wait_ms) => {
            TimerAction::Wait(Duration::from_millis(i.timer.wait_ms) - i.calm_for)
        }
        Some(false) => {
            TimerAction::FailStepRun(noetl_mesh::served::unavailable_error(i.timer, i.task))
        }
    }
}

/// Act on a `task.unserved` timer; `Some(wait)` when it is not due yet.
async fn on_unserved(
    mesh: &Mesh,
    ev: &Event,
    t: &TaskUnserved,
) -> Result<Option<Duration>, MeshError> {
    let mut input = UnservedInput {
        timer: t,
        step_run_id: &ev.step_run_id,
        task: &ev.task,
        header: None,
        served: None,
        calm_for: mesh.outages().calm_for(),
        now_ms: now_ms(),
    };
    if let TimerAction::Wait(left) = decide_unserved(&input) {
        return Ok(Some(left));
    }
    let header = noetl_mesh::rebuild::running_header(mesh, &ev.execution_id).await?;
    input.header = header.as_ref();
    if decide_unserved(&input) == TimerAction::Nothing {
        return Ok(None);
    }
    input.served = Some(mesh.kind_served(&t.kind, false).await?);
    input.calm_for = mesh.outages().calm_for();
    let error = match decide_unserved(&input) {
        TimerAction::FailStepRun(error) => error,
        TimerAction::Wait(left) => {
            tracing::info!(execution_id = %ev.execution_id, step = %ev.step, kind = %t.kind,
                calm_for_ms = input.calm_for.as_millis() as u64,
                "no executor serves this kind, but the cluster was unavailable within the wait: waiting again");
            return Ok(Some(left));
        }
        _ => return Ok(None),
    };
    tracing::info!(execution_id = %ev.execution_id, step = %ev.step, kind = %t.kind,
        "no executor took the task in time");
    let failed = EventDraft {
        execution_id: &ev.execution_id,
        step_run_id: &ev.step_run_id,
        step: &ev.step,
        trace_id: &ev.trace_id,
        parent_id: &ev.event_id,
        discriminator: "unserved",
        ..Default::default()
    }
    .build(&StepEnded::failed(
        error,
        t.args
            .clone()
            .unwrap_or_else(|| Value::Object(Default::default())),
    ));
    mesh.emit(&failed).await?.wait().await?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_mesh::state::TokenRecord;

    #[test]
    fn router_timers_subscribes_to_the_four_timers_only() {
        use EventType as T;
        assert_eq!(
            subscribed().collect::<Vec<_>>(),
            [
                T::ExecutionDeadline,
                T::StepDeadline,
                T::TaskUnserved,
                T::WaitTimeout
            ]
        );
    }

    fn header(status: ExecStatus, live: &[&str]) -> ExecHeader {
        ExecHeader {
            status,
            ..ExecHeader::running(
                "e1",
                live.iter().map(|t| TokenRecord::new(*t, "s")).collect(),
            )
        }
    }

    #[test]
    fn timers_wait_then_fail_only_what_still_runs() {
        let d = Deadline {
            at_ms: 10_000,
            what: "step \"s\" lifecycle.timeout_s: 1".into(),
        };
        let running = header(ExecStatus::Running, &["sr1"]);
        let input = |timer, now_ms, header| TimerInput {
            timer,
            deadline: &d,
            step: "s",
            step_run_id: "sr1",
            header,
            current_deadline_ms: None,
            now_ms,
        };
        // Before deadline + grace: wait the rest.
        assert_eq!(
            decide(&input(Timer::Step, 9_000, Some(&running))),
            TimerAction::Wait(Duration::from_millis(3_000))
        );
        match decide(&input(Timer::Step, 12_000, Some(&running))) {
            TimerAction::FailStepRun(e) => {
                assert_eq!(e["kind"], "timeout");
                assert!(e["message"]
                    .as_str()
                    .unwrap()
                    .contains("lifecycle.timeout_s: 1"));
            }
            other => panic!("{other:?}"),
        }
        // The step-run already ended: nothing.
        let moved_on = header(ExecStatus::Running, &["sr2"]);
        assert_eq!(
            decide(&input(Timer::Step, 12_000, Some(&moved_on))),
            TimerAction::Nothing
        );
        // The execution ended: nothing, for either timer.
        let done = header(ExecStatus::Completed, &[]);
        assert_eq!(
            decide(&input(Timer::Execution, 12_000, Some(&done))),
            TimerAction::Nothing
        );
        assert_eq!(
            decide(&input(Timer::Step, 12_000, None)),
            TimerAction::Nothing
        );
        match decide(&input(Timer::Execution, 12_000, Some(&running))) {
            TimerAction::FailExecution(m) => assert!(m.starts_with("timeout: "), "{m}"),
            other => panic!("{other:?}"),
        }
        // Set before a resume that moved the deadline on: nothing.
        let resumed = TimerInput {
            current_deadline_ms: Some(20_000),
            ..input(Timer::Execution, 12_000, Some(&running))
        };
        assert_eq!(decide(&resumed), TimerAction::Nothing);
    }

    #[test]
    fn a_deadline_redelivered_after_its_end_was_written_finishes_that_end() {
        let d = Deadline {
            at_ms: 10_000,
            what: "execution lifecycle.timeout_s: 1".into(),
        };
        let input = |timer, header| TimerInput {
            timer,
            deadline: &d,
            step: "s",
            step_run_id: "sr1",
            header: Some(header),
            current_deadline_ms: None,
            now_ms: 12_000,
        };
        let mut ended = header(ExecStatus::Running, &["sr1"]);
        ended.end(
            ExecStatus::Failed,
            &lifecycle::execution_timeout_message(&d),
            "2026-12-03T00:00:00Z",
        );
        // Its terminal event not out yet: the deadline's failure again.
        match decide(&input(Timer::Execution, &ended)) {
            TimerAction::FailExecution(m) => {
                assert_eq!(m, lifecycle::execution_timeout_message(&d))
            }
            other => panic!("{other:?}"),
        }
        // A step timer never finishes an execution's end.
        assert_eq!(decide(&input(Timer::Step, &ended)), TimerAction::Nothing);
        // Out already: nothing.
        let announced = ExecHeader {
            terminal_emitted: true,
            ..ended.clone()
        };
        assert_eq!(
            decide(&input(Timer::Execution, &announced)),
            TimerAction::Nothing
        );
        // Ended by something else (a failed step), its end not out yet:
        // that end is its own to announce.
        let mut failed = header(ExecStatus::Running, &["sr1"]);
        failed.end(ExecStatus::Failed, "step s failed", "2026-12-03T00:00:00Z");
        assert_eq!(
            decide(&input(Timer::Execution, &failed)),
            TimerAction::Nothing
        );
    }

    #[test]
    fn an_unserved_task_fails_its_step_run_only_when_still_unserved_and_live() {
        let t = TaskUnserved {
            at_ms: 1_000,
            kind: "duckdb".into(),
            subject: "noetl.task.duckdb".into(),
            wait_ms: 30_000,
            args: None,
        };
        let live = header(ExecStatus::Running, &["sr1"]);
        let calm = |now_ms, header: Option<&ExecHeader>, served, calm_for| {
            decide_unserved(&UnservedInput {
                timer: &t,
                step_run_id: "sr1",
                task: "load",
                header,
                served,
                calm_for,
                now_ms,
            })
        };
        let at = |now_ms, header, served| calm(now_ms, header, served, Duration::from_secs(60));
        assert_eq!(
            at(400, None, None),
            TimerAction::Wait(Duration::from_millis(600))
        );
        assert_eq!(
            at(1_000, Some(&live), None),
            TimerAction::Wait(Duration::ZERO),
            "due: ask whether the kind is served"
        );
        assert_eq!(at(1_000, Some(&live), Some(true)), TimerAction::Nothing);
        match at(1_000, Some(&live), Some(false)) {
            TimerAction::FailStepRun(e) => {
                assert_eq!(e["kind"], "executor.unavailable");
                assert_eq!(e["task"], "load");
            }
            other => panic!("{other:?}"),
        }
        // An outage 12 s ago may hide executors that sat it out: the
        // timer waits until the cluster has been calm for its whole wait.
        assert_eq!(
            calm(1_000, Some(&live), Some(false), Duration::from_secs(12)),
            TimerAction::Wait(Duration::from_secs(18))
        );
        assert_eq!(
            calm(1_000, Some(&live), Some(true), Duration::from_secs(12)),
            TimerAction::Nothing
        );
        let over = header(ExecStatus::Running, &["sr2"]);
        assert_eq!(at(1_000, Some(&over), Some(false)), TimerAction::Nothing);
        let ended = header(ExecStatus::Failed, &["sr1"]);
        assert_eq!(at(1_000, Some(&ended), Some(false)), TimerAction::Nothing);
    }
}
