//! The loop-supervisor's two handlers, run by the mesh's typed adapter
//! (`noetl_mesh::handler`): [`LoopCommands`] starts loop runs,
//! [`IterationReports`] takes what the executors report about them. They
//! share this process's caches ([`Shared`]).

use std::sync::Arc;

use noetl_mesh::{
    event_type::EventType,
    handler::{Handle, Handled, Job, StepOf},
    runtime::{BoxFuture, HandlerError},
    Mesh,
};
use noetl_wire::{Event, LoopCommand};

use crate::collection::ChunkCache;
use crate::commit::Counter;
use crate::dispatch::Window;
use crate::reports::{self, Reported};
use crate::start;
use crate::state::RunAt;

/// What the handlers of one mesh share in this process.
#[derive(Default)]
pub struct Shared {
    /// Collection chunks read lately.
    chunks: ChunkCache,
    /// Iteration reports waiting for their loop run's write.
    counter: Counter,
}

/// Handles loop commands (`<p>.loop.<eid>`): starts a loop run.
pub struct LoopCommands {
    mesh: Mesh,
    shared: Arc<Shared>,
}

impl LoopCommands {
    /// A handler on `mesh`, sharing `shared` with the reports' handler.
    pub fn new(mesh: Mesh, shared: Arc<Shared>) -> Self {
        Self { mesh, shared }
    }
}

impl Handle for LoopCommands {
    type In = LoopCommand;
    type Plan = StepOf;
    const NAME: &'static str = "loop_start";

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn handle(
        self: Arc<Self>,
        job: Job<LoopCommand, StepOf>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            let (cmd, at) = (&job.input, &job.plan);
            let window = Window {
                mesh: &self.mesh,
                chunks: &self.shared.chunks,
                at: RunAt {
                    plan: &at.plan,
                    step: at.step(),
                    srid: &cmd.step_run_id,
                },
            };
            start::on_start(&window, cmd).await?;
            Ok(Handled::Done)
        })
    }
}

/// Handles the reports about loop runs (`loop.iteration.done|failed`,
/// `batch.completed`, `loop.claimed`).
pub struct IterationReports {
    mesh: Mesh,
    shared: Arc<Shared>,
}

impl IterationReports {
    /// A handler on `mesh`, sharing `shared` with the commands' handler.
    pub fn new(mesh: Mesh, shared: Arc<Shared>) -> Self {
        Self { mesh, shared }
    }
}

impl Handle for IterationReports {
    type In = Event;
    type Plan = StepOf;
    const NAME: &'static str = "iteration";

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn handle(
        self: Arc<Self>,
        job: Job<Event, StepOf>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            let ev = &job.input;
            let r = Reported {
                mesh: &self.mesh,
                chunks: &self.shared.chunks,
                counter: &self.shared.counter,
                at: &job.plan,
                ev,
            };
            match EventType::of(ev).and_then(report_of) {
                Some(Report::Claimed) => reports::on_claimed(&r).await?,
                Some(Report::Iteration { failed }) => reports::on_iteration(&r, failed).await?,
                Some(Report::Batch) => reports::on_batch(&r).await?,
                None => {
                    return Err(HandlerError::Refused(format!(
                        "{} of execution {} is not an iteration report",
                        ev.event_type, ev.execution_id
                    )))
                }
            }
            Ok(Handled::Done)
        })
    }
}

/// What the loop-supervisor hears from the executors about a loop run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    /// An iteration ended (`loop.iteration.done` / `.failed`).
    Iteration {
        /// It failed.
        failed: bool,
    },
    /// A cursor loop's claim ran (`loop.claimed`).
    Claimed,
    /// Iterations of a batch ended (`batch.completed`).
    Batch,
}

/// The report an event of type `kind` is, if any (every type named: a new
/// one does not compile until it is placed).
fn report_of(kind: EventType) -> Option<Report> {
    use EventType as T;
    match kind {
        T::LoopIterationDone => Some(Report::Iteration { failed: false }),
        T::LoopIterationFailed => Some(Report::Iteration { failed: true }),
        T::LoopClaimed => Some(Report::Claimed),
        T::BatchCompleted => Some(Report::Batch),
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
        | T::LoopDone
        | T::ExecutionCompleted
        | T::ExecutionFailed
        | T::ExecutionCancelRequested
        | T::ExecutionCancelled
        | T::ExecutionDeadline
        | T::StepDeadline
        | T::TaskUnserved
        | T::Audit
        | T::ExecutionPaused
        | T::ExecutionUnpaused
        | T::WaitStarted
        | T::WaitTimeout
        | T::SignalReceived
        | T::ExecutionQueued
        | T::ExecutionResumeRequested
        | T::ExecutionResumed
        | T::StepSuperseded => None,
    }
}

/// The event types `loop-events` subscribes to: exactly those
/// [`report_of`] makes a report of, so a type handled is always heard.
pub(crate) fn subscribed() -> impl Iterator<Item = EventType> {
    EventType::ALL
        .into_iter()
        .filter(|k| report_of(*k).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_reports_and_claims_are_told_apart_and_nothing_else_is_one() {
        assert_eq!(
            report_of(EventType::LoopIterationFailed),
            Some(Report::Iteration { failed: true })
        );
        assert_eq!(
            report_of(EventType::LoopIterationDone),
            Some(Report::Iteration { failed: false })
        );
        assert_eq!(report_of(EventType::LoopClaimed), Some(Report::Claimed));
        assert_eq!(report_of(EventType::StepDone), None);
    }

    #[test]
    fn loop_events_subscribes_to_iteration_ends_and_claims_only() {
        assert_eq!(
            subscribed().collect::<Vec<_>>(),
            [
                EventType::LoopIterationDone,
                EventType::LoopIterationFailed,
                EventType::LoopClaimed,
                EventType::BatchCompleted
            ]
        );
    }
}
