//! The one shape of a message handler (docs/architecture.md, "One handler
//! shape"). A service's handler implements [`Handle`] for one message
//! kind; [`Typed`] turns it into the consumer loop's [`Handler`] and does
//! what every handler needs, in one place and one order:
//!
//! 1. decode the message, or refuse it naming its subject ([`Inbound`]);
//! 2. ack a message of a stopped execution unhandled, when the handler
//!    says so ([`Handle::WHEN_STOPPED`]);
//! 3. open the handler's span with the standard fields ([`Meta`]);
//! 4. look up the execution's plan (and the message's step), or refuse
//!    ([`PlanNeed`]);
//! 5. run the handler, telling JetStream it is in progress meanwhile when
//!    the work is long ([`Handle::HEARTBEAT`]);
//! 6. map the result to ack / retry / dead-letter ([`disposition`]).
//!
//! What is left to the handler is its own work: read the state it needs,
//! decide, write.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::Message;
use noetl_wire::{Event, ExecutionRequest, LoopCommand, TaskCommand, Token};
use tracing::Instrument;

use crate::plan::PlanRecord;
use crate::runtime::{self, BoxFuture, Disposition, Handler, HandlerError};
use crate::{Mesh, MeshError};

/// What a message says about itself: the fields of its handler's span and
/// of the refusals worded here.
#[derive(Debug, Clone, Copy)]
pub struct Meta<'a> {
    /// What the message is, for errors: `token`, `task command`, an
    /// event's type.
    pub what: &'a str,
    /// The execution it belongs to (empty for a request without one).
    pub execution_id: &'a str,
    /// The step it is about (empty when none).
    pub step: &'a str,
    /// The step-run it is about (empty when none).
    pub step_run_id: &'a str,
    /// The execution's trace id.
    pub trace_id: &'a str,
}

/// A message kind a handler takes: how it is decoded, and what it says
/// about itself.
pub trait Inbound: Sized + Send + 'static {
    /// Decode `msg`; an undecodable message is refused, naming its subject.
    fn decode(msg: &Message) -> Result<Self, HandlerError>;
    /// The message's standard fields.
    fn meta(&self) -> Meta<'_>;
}

impl Inbound for Token {
    fn decode(msg: &Message) -> Result<Self, HandlerError> {
        runtime::decode("token", msg)
    }
    fn meta(&self) -> Meta<'_> {
        Meta {
            what: "token",
            execution_id: &self.execution_id,
            step: &self.step,
            step_run_id: &self.token_id,
            trace_id: &self.trace_id,
        }
    }
}

impl Inbound for TaskCommand {
    fn decode(msg: &Message) -> Result<Self, HandlerError> {
        runtime::decode("task command", msg)
    }
    fn meta(&self) -> Meta<'_> {
        Meta {
            what: "task command",
            execution_id: &self.execution_id,
            step: &self.step,
            step_run_id: &self.step_run_id,
            trace_id: &self.trace_id,
        }
    }
}

impl Inbound for LoopCommand {
    fn decode(msg: &Message) -> Result<Self, HandlerError> {
        runtime::decode("loop command", msg)
    }
    fn meta(&self) -> Meta<'_> {
        Meta {
            what: "loop command",
            execution_id: &self.execution_id,
            step: &self.step,
            step_run_id: &self.step_run_id,
            trace_id: &self.trace_id,
        }
    }
}

impl Inbound for Event {
    fn decode(msg: &Message) -> Result<Self, HandlerError> {
        runtime::decode_event(msg)
    }
    fn meta(&self) -> Meta<'_> {
        Meta {
            what: &self.event_type,
            execution_id: &self.execution_id,
            step: &self.step,
            step_run_id: &self.step_run_id,
            trace_id: &self.trace_id,
        }
    }
}

impl Inbound for ExecutionRequest {
    fn decode(msg: &Message) -> Result<Self, HandlerError> {
        crate::codec::decode_execution_request(&msg.payload).map_err(|e| {
            HandlerError::Refused(format!(
                "{e} (subject {}; send JSON like {{\"playbook\": \"<yaml>\", \"workload\": {{}}}})",
                msg.subject
            ))
        })
    }
    fn meta(&self) -> Meta<'_> {
        Meta {
            what: "execution request",
            execution_id: &self.execution_id,
            step: "",
            step_run_id: "",
            trace_id: &self.trace_id,
        }
    }
}

/// What a handler needs of its execution's plan, looked up before it runs.
pub trait PlanNeed: Sized + Send + 'static {
    /// Look it up for the message `meta` describes, or refuse the message.
    fn lookup<'a>(mesh: &'a Mesh, meta: Meta<'a>) -> BoxFuture<'a, Result<Self, HandlerError>>;
}

/// No plan: the handler needs none, or reads it only for some messages
/// (with [`plan_of`]).
impl PlanNeed for () {
    fn lookup<'a>(_: &'a Mesh, _: Meta<'a>) -> BoxFuture<'a, Result<Self, HandlerError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The execution's plan.
impl PlanNeed for Arc<PlanRecord> {
    fn lookup<'a>(mesh: &'a Mesh, meta: Meta<'a>) -> BoxFuture<'a, Result<Self, HandlerError>> {
        Box::pin(plan_of(mesh, meta))
    }
}

/// The execution's plan and the message's step in it.
#[derive(Clone)]
pub struct StepOf {
    /// The plan.
    pub plan: Arc<PlanRecord>,
    /// The step's index in `plan.playbook.workflow`.
    pub index: usize,
}

impl StepOf {
    /// The message's step.
    pub fn step(&self) -> &noetl_core::Step {
        &self.plan.playbook.workflow[self.index]
    }
}

impl PlanNeed for StepOf {
    fn lookup<'a>(mesh: &'a Mesh, meta: Meta<'a>) -> BoxFuture<'a, Result<Self, HandlerError>> {
        Box::pin(async move {
            let plan = plan_of(mesh, meta).await?;
            let index = step_index(&plan, meta)?;
            Ok(StepOf { plan, index })
        })
    }
}

/// The plan of the execution `meta` belongs to; a message of an execution
/// without a plan is refused, in one wording for every service.
pub async fn plan_of(mesh: &Mesh, meta: Meta<'_>) -> Result<Arc<PlanRecord>, HandlerError> {
    match mesh.plans().get(mesh, meta.execution_id).await {
        Ok(plan) => Ok(plan),
        Err(MeshError::NoPlan { .. }) => {
            // Lost from KV (a purge, a storage fault) while the execution
            // runs: its events name it, so it is written back from them.
            match crate::rebuild::restore_plan(mesh, meta.execution_id).await? {
                Some(plan) => Ok(plan),
                // Compacted after its end: a late copy, nothing owed.
                None if mesh.ended_in_log(meta.execution_id).await? => {
                    Err(HandlerError::Over(format!(
                        "{} of execution {} (step {:?}): the execution ended and its state was removed",
                        meta.what, meta.execution_id, meta.step
                    )))
                }
                // Retried while the message is young: a stream leader that
                // changed right after the writes can answer before them.
                None => Err(HandlerError::Unknown(format!(
                    "{} for unknown execution {} (step {:?})",
                    meta.what, meta.execution_id, meta.step
                ))),
            }
        }
        Err(e) => Err(HandlerError::Mesh(e)),
    }
}

/// Where `meta`'s step is in `plan`; a message naming a step the
/// execution does not have is refused.
pub fn step_index(plan: &PlanRecord, meta: Meta<'_>) -> Result<usize, HandlerError> {
    plan.step_position(meta.step).ok_or_else(|| {
        HandlerError::Refused(format!(
            "{} of execution {} names unknown step {:?}",
            meta.what, meta.execution_id, meta.step
        ))
    })
}

/// What a message of a stopped (cancelled or ended) execution gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenStopped {
    /// Handled as any other (whoever ends executions must see it).
    Handle,
    /// Acked unhandled: a stopped execution starts nothing more.
    Ack,
}

/// How a handler's work ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Done: the message is acked.
    Done,
    /// Not due yet: the message comes back after this long.
    NotYet(Duration),
}

/// One decoded message, with what its handler asked to be looked up.
pub struct Job<M, P> {
    /// The message as delivered (headers, delivery info).
    pub msg: Arc<Message>,
    /// Its decoded content.
    pub input: M,
    /// The plan it needs ([`PlanNeed`]).
    pub plan: P,
}

/// A typed message handler; [`Typed`] runs it.
pub trait Handle: Send + Sync + 'static {
    /// The message kind it takes.
    type In: Inbound;
    /// What it needs of the plan: `()`, `Arc<PlanRecord>` or [`StepOf`].
    type Plan: PlanNeed;
    /// Its span's name (`otel.name`).
    const NAME: &'static str;
    /// What a message of a stopped execution gets.
    const WHEN_STOPPED: WhenStopped = WhenStopped::Handle;
    /// Whether JetStream is told, every half ack-wait, that the message is
    /// still being worked on (work that can outlast the ack-wait).
    const HEARTBEAT: bool = false;

    /// The mesh it works on.
    fn mesh(&self) -> &Mesh;

    /// The span it runs in: the standard fields of the message, unless a
    /// handler has more to say (a request starting a trace).
    fn span(&self, msg: &Message, input: &Self::In) -> tracing::Span {
        let _ = msg;
        standard_span(Self::NAME, input.meta())
    }

    /// Handle one message. Must be idempotent: messages can be
    /// redelivered.
    fn handle(
        self: Arc<Self>,
        job: Job<Self::In, Self::Plan>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>>;
}

/// The span a message with `meta` is handled in, named `name`.
pub fn standard_span(name: &'static str, meta: Meta<'_>) -> tracing::Span {
    tracing::debug_span!(
        "handle",
        otel.name = name,
        what = %meta.what,
        execution_id = %meta.execution_id,
        step = %meta.step,
        step_run_id = %meta.step_run_id,
        trace_id = %meta.trace_id,
    )
}

/// The consumer loop's [`Handler`] for a typed handler.
pub struct Typed<H>(pub Arc<H>);

impl<H> Typed<H> {
    /// Wrap `handler`.
    pub fn new(handler: H) -> Self {
        Self(Arc::new(handler))
    }
}

impl<H: Handle> Handler for Typed<H> {
    fn handle(&self, msg: Arc<Message>) -> BoxFuture<'static, Disposition> {
        let handler = self.0.clone();
        Box::pin(async move {
            let result = run(handler, msg.clone()).await;
            // Only an unknown execution's message is decided by its age.
            let age = match &result {
                Err(HandlerError::Unknown(_)) => runtime::age(&msg),
                _ => None,
            };
            disposition(result, age)
        })
    }
}

/// Steps 1 to 5 of the module's list.
async fn run<H: Handle>(handler: Arc<H>, msg: Arc<Message>) -> Result<Handled, HandlerError> {
    let input = H::In::decode(&msg)?;
    let mesh = handler.mesh().clone();
    if H::WHEN_STOPPED == WhenStopped::Ack && mesh.still_stopped(input.meta().execution_id).await? {
        return Ok(Handled::Done);
    }
    let span = handler.span(&msg, &input);
    let work = async {
        let plan = H::Plan::lookup(&mesh, input.meta()).await?;
        let job = Job {
            msg: msg.clone(),
            input,
            plan,
        };
        handler.clone().handle(job).await
    };
    if H::HEARTBEAT {
        let period = mesh.config().ack_wait / 2;
        runtime::heartbeat(&msg, period, work)
            .instrument(span)
            .await
    } else {
        work.instrument(span).await
    }
}

/// What to do with a message first stored `age` ago once its handler
/// returned `result`.
pub fn disposition(result: Result<Handled, HandlerError>, age: Option<Duration>) -> Disposition {
    match result {
        Ok(Handled::Done) => Disposition::Ack,
        Ok(Handled::NotYet(wait)) => Disposition::Retry(Some(wait)),
        Err(e) => runtime::disposition(Err(e), age),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handled_message_is_acked_and_one_not_due_comes_back() {
        assert!(matches!(
            disposition(Ok(Handled::Done), None),
            Disposition::Ack
        ));
        let wait = Duration::from_millis(1500);
        assert!(matches!(
            disposition(Ok(Handled::NotYet(wait)), None),
            Disposition::Retry(Some(w)) if w == wait
        ));
        assert!(matches!(
            disposition(Err(HandlerError::Refused("bad".into())), None),
            Disposition::DeadLetter(r) if r == "bad"
        ));
    }

    #[test]
    fn a_message_naming_a_step_the_plan_lacks_is_refused_naming_both() {
        let playbook = serde_json::json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "t"},
            "workflow": [{"step": "start"}, {"step": "end"}],
        });
        let plan = PlanRecord::new(
            "e1".into(),
            "t.yaml".into(),
            serde_json::from_value(playbook).unwrap(),
            serde_json::json!({}),
        );
        let meta = |step| Meta {
            what: "token",
            execution_id: "e1",
            step,
            step_run_id: "t1",
            trace_id: "",
        };
        assert_eq!(step_index(&plan, meta("end")).unwrap(), 1);
        let Err(HandlerError::Refused(why)) = step_index(&plan, meta("nope")) else {
            panic!("an unknown step must be refused");
        };
        assert_eq!(why, "token of execution e1 names unknown step \"nope\"");
    }

    #[test]
    fn every_inbound_kind_names_itself_and_its_execution() {
        let token = Token {
            execution_id: "e1".into(),
            step: "s".into(),
            token_id: "t1".into(),
            trace_id: "tr".into(),
            ..Default::default()
        };
        let m = token.meta();
        assert_eq!(
            (m.what, m.execution_id, m.step, m.step_run_id, m.trace_id),
            ("token", "e1", "s", "t1", "tr")
        );
        let ev = Event {
            event_type: "step.done".into(),
            execution_id: "e2".into(),
            step: "x".into(),
            step_run_id: "r".into(),
            ..Default::default()
        };
        let m = ev.meta();
        assert_eq!((m.what, m.execution_id, m.step), ("step.done", "e2", "x"));
        let req = ExecutionRequest::default();
        assert_eq!(req.meta().what, "execution request");
        assert_eq!(TaskCommand::default().meta().what, "task command");
        assert_eq!(LoopCommand::default().meta().what, "loop command");
    }
}
