//! Boundary events: evaluate `next.arcs` once per step-run and move tokens.
//!
//! One pass per event: the arcs are selected ([`arcs`]), the step's record
//! and the header are written in one compare-and-set ([`record`]), what
//! fired is published ([`fired`], a list of effects: tokens, or the
//! step-runs they start when their admission reads nothing), and the end
//! of the execution is emitted once ([`crate::ending`]).

mod arcs;
mod fired;
mod record;

use std::sync::Arc;

use noetl_mesh::{
    effects,
    event_type::EventType,
    events::{now_ms, now_rfc3339},
    handler::{self, Handle, Handled, Inbound, Job},
    kv::{RevisionCache, Revisions},
    payloads::{self, BoundaryView, CancelRequested, DeadLettered},
    runtime::{BoxFuture, HandlerError},
    state::{ExecHeader, ExecStatus, StepStatus},
    Mesh,
};
use noetl_wire::Event;

use crate::ending::{emit_terminal, end_running};
use arcs::*;
use fired::{fired, Fired};
use record::*;

/// Handles `step.done`, `step.failed`, `step.skipped` and boundary `loop.done`.
pub struct BoundaryHandler {
    mesh: Mesh,
    caches: Caches,
}

/// What a router process remembers of the KV entries it last wrote or read,
/// so the usual boundary writes without reading first.
#[derive(Clone)]
struct Caches {
    /// Execution headers (shared with the timers, which end executions).
    headers: Arc<RevisionCache<ExecHeader>>,
    /// Step records.
    records: Arc<Revisions>,
}

impl BoundaryHandler {
    /// A handler; keeps the last header revision it wrote per execution.
    pub fn new(mesh: Mesh) -> Self {
        Self::sharing(mesh, Arc::new(RevisionCache::new(4096)))
    }

    /// A handler sharing its header cache with the other writers of headers
    /// in this process (the timers), so its cached copy is never stale
    /// because of them.
    pub fn sharing(mesh: Mesh, headers: Arc<RevisionCache<ExecHeader>>) -> Self {
        Self {
            mesh,
            caches: Caches {
                headers,
                records: Arc::new(Revisions::new(4096)),
            },
        }
    }
}

impl Handle for BoundaryHandler {
    type In = Event;
    /// Only an ended step-run needs the plan ([`handler::plan_of`]).
    type Plan = ();
    const NAME: &'static str = "boundary";

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn handle(
        self: Arc<Self>,
        job: Job<Event, ()>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            on_boundary(&self.mesh, &self.caches, job.input).await?;
            Ok(Handled::Done)
        })
    }
}

/// What the router's boundary consumer does with an event of type `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handling {
    /// A step-run ended: route it, its record taking this status.
    Ended(StepStatus),
    /// A message of the execution was dead-lettered: fail the execution.
    DeadLetter,
    /// A client asked to cancel.
    Cancel,
    /// A client asked to resume a failed or cancelled execution.
    Resume,
    /// Not an event this consumer subscribes to.
    Foreign,
}

/// How the boundary consumer handles `kind` (every type named: a new one
/// does not compile until it is placed).
fn handling_of(kind: EventType) -> Handling {
    use EventType as T;
    match kind {
        T::StepDone | T::LoopDone => Handling::Ended(StepStatus::Done),
        T::StepFailed => Handling::Ended(StepStatus::Failed),
        T::StepSkipped => Handling::Ended(StepStatus::Skipped),
        T::MessageDeadLettered => Handling::DeadLetter,
        T::ExecutionCancelRequested => Handling::Cancel,
        T::ExecutionResumeRequested => Handling::Resume,
        T::PlaybookInitialized
        | T::WorkflowInitialized
        | T::TokenCreated
        | T::StepScheduled
        | T::StepStarted
        | T::TaskStarted
        | T::TaskDone
        | T::NextSelected
        | T::LoopStarted
        | T::LoopIterationStarted
        | T::BatchAccepted
        | T::BatchCompleted
        | T::LoopIterationDone
        | T::LoopIterationFailed
        | T::LoopClaimed
        | T::ExecutionCompleted
        | T::ExecutionFailed
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
        | T::ExecutionResumed
        | T::StepSuperseded => Handling::Foreign,
    }
}

/// The event types `router-events` subscribes to: exactly those
/// [`handling_of`] does not call foreign, so a type handled is always heard.
pub(crate) fn subscribed() -> impl Iterator<Item = EventType> {
    EventType::ALL
        .into_iter()
        .filter(|k| handling_of(*k) != Handling::Foreign)
}

/// Handle boundary event `ev`.
async fn on_boundary(mesh: &Mesh, caches: &Caches, ev: Event) -> Result<(), HandlerError> {
    let headers = caches.headers.as_ref();
    let kind = EventType::of(&ev);
    let status = match kind.map(handling_of) {
        Some(Handling::DeadLetter) => return on_dead_letter(mesh, headers, &ev).await,
        Some(Handling::Cancel) => return on_cancel(mesh, headers, &ev).await,
        Some(Handling::Resume) => return crate::resume::on_resume(mesh, headers, &ev).await,
        Some(Handling::Ended(status)) => status,
        Some(Handling::Foreign) | None => {
            return Err(HandlerError::Refused(format!(
                "{} of execution {} is not a boundary event",
                ev.event_type, ev.execution_id
            )))
        }
    };
    let loop_done = kind == Some(EventType::LoopDone);
    let view: BoundaryView = payloads::decode(&ev)?;
    if loop_done && view.boundary != Some(true) {
        return Ok(()); // informational: the failing loop's boundary is step.failed
    }
    let srid = ev.step_run_id.as_str();
    let plan = handler::plan_of(mesh, ev.meta()).await?;
    let step = &plan.playbook.workflow[handler::step_index(&plan, ev.meta())?];

    // 1. The decision (pure: arcs over event, ctx, workload, args, results).
    let mut decision = decide(mesh, &plan, step, (&ev, kind), &view).await?;
    // Past the execution's deadline no arc fires: the execution fails,
    // naming the deadline (its timer would end it a moment later).
    if let Some(error) =
        crate::deadline::stops_routing(&plan, !decision.tokens.is_empty(), now_ms())
    {
        decision.tokens.clear();
        decision.unhandled_failure = true;
        decision.error = Some(error);
    }

    // 2. One compare-and-set: applied only while this step-run's token is
    //    live, so a redelivered event changes nothing the second time.
    let failure = decision
        .unhandled_failure
        .then(|| failure_message(&ev, view.error.as_ref(), decision.error.as_deref()));
    let now = now_rfc3339();
    let boundary = Boundary {
        step_run_id: srid,
        tokens: &decision.tokens,
        failure: failure.as_deref(),
        now: &now,
        status,
    };
    let (header, applied) = record_and_apply(mesh, caches, (&ev, kind), &view, &boundary).await?;

    // 3. Publish the tokens this step-run fired that are still live (on a
    //    redelivery: the same ones, same ids), and the events; the arcs'
    //    `ctx` writes ride whole (by reference when large).
    let set_ctx = match decision.set_ctx.clone() {
        Some(patch) => Some(
            noetl_mesh::patches::carry(
                mesh.results(),
                &ev.execution_id,
                &format!("arcs-{srid}"),
                patch,
            )
            .await?,
        ),
        None => None,
    };
    let unanswered = !applied
        && !header.live.iter().any(|t| t.parent == srid)
        && !mesh.boundary_answered(&ev.execution_id, srid).await?;
    // A paused execution's tokens go to the scheduler, which holds them;
    // the others whose admission reads nothing start here.
    let paused = mesh.pauses().await?.is_paused(&ev.execution_id);
    let effects = fired(Fired {
        ev: &ev,
        step,
        header: &header,
        applied,
        error: decision.error.clone(),
        set_ctx,
        unanswered,
        start_here: (!paused).then_some((plan.as_ref(), now_ms())),
    });
    effects::apply(mesh, effects).await?;

    // 4. The terminal event, exactly once (flag set after publishing).
    emit_terminal(mesh, headers, &header, &ev.trace_id).await?;
    Ok(())
}

/// One of the execution's messages was dead-lettered: nothing will ever
/// finish that work, so the execution fails now, naming the message, instead
/// of waiting forever.
async fn on_dead_letter(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    ev: &Event,
) -> Result<(), HandlerError> {
    let eid = ev.execution_id.as_str();
    let dl: DeadLettered = payloads::decode_typed(ev)?;
    let error = format!(
        "internal: message on {} was dead-lettered by {}: {}",
        dl.subject, dl.consumer, dl.reason
    );
    let header = end_running(mesh, headers, eid, ExecStatus::Failed, &error).await?;
    match header {
        Some(h) => Ok(emit_terminal(mesh, headers, &h, &ev.trace_id).await?),
        None => Ok(()), // no such execution: the DLQ copy is all there is
    }
}

/// A client asked to cancel: the execution ends `cancelled` (no new step
/// starts; boundary events of step-runs already running are ignored), and
/// the cancellation goes on to its child executions.
async fn on_cancel(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    ev: &Event,
) -> Result<(), HandlerError> {
    let eid = ev.execution_id.as_str();
    let request: CancelRequested = payloads::decode_typed(ev)?;
    let reason = request.reason.trim().to_string();
    let error = if reason.is_empty() {
        "cancelled".to_string()
    } else {
        format!("cancelled: {reason}")
    };
    let header = end_running(mesh, headers, eid, ExecStatus::Cancelled, &error).await?;
    let Some(h) = header else {
        return Ok(()); // no such execution
    };
    if h.status == ExecStatus::Cancelled {
        emit_terminal(mesh, headers, &h, &ev.trace_id).await?;
        crate::children::cancel_children(mesh, eid).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
