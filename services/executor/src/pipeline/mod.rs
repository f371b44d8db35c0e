//! Running one task command: the pipeline of a step-run from task `pc`
//! (docs/dsl.md "The pipeline"), with task policy applied after every task.
//!
//! Tasks whose kind this replica serves run in place, one after another;
//! the first task of another kind, or a retry with a delay, ends the
//! command by publishing the next command. At the end of the pipeline the
//! step-run's boundary event is emitted (`step.done` / `step.failed`, or
//! `loop.iteration.done` / `loop.iteration.failed` inside a loop).
//!
//! Every id is deterministic (step-run, iteration, pc, attempt, task runs so
//! far), so a redelivered command republishes the same ids and JetStream
//! drops the duplicates.
//!
//! The driver here reads and applies; what follows a task is decided in
//! [`next`] (pure). Around it: the command in and out ([`command`]), the
//! template scopes ([`scope`]), a task's run ([`invoke`], [`conclude`]),
//! its `ctx` patches ([`context`]), what travels by reference
//! ([`reference`]), an iteration's checkpoint ([`checkpoint`]) and the
//! step-run's end ([`ending`]).

mod batch;
mod checkpoint;
mod command;
mod conclude;
mod context;
mod ending;
mod invoke;
mod next;
mod reference;
mod scope;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use noetl_core::lifecycle::Deadline;
use noetl_core::template::Scope;
use noetl_core::tool::Tool;
use noetl_core::{Outcome, Step};
use noetl_mesh::{
    effects::{self, Effect},
    events::now_ms,
    handled::HandledError,
    handler::{Handled, StepOf},
    payloads,
    plan::PlanRecord,
    Batch, Mesh, MeshError, PendingAck,
};
use noetl_wire::TaskCommand;
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::analysis::{NeedsCache, StepNeeds};
use next::{End, Handoff, Moved, NextInput, Then};

/// Task runs allowed in one step-run (retries and jumps included) before the
/// step-run fails: a jump loop without an exit.
pub const MAX_TASK_RUNS: u64 = 100_000;

/// Publishes awaited together before the batch is flushed mid-pipeline.
const FLUSH_EVERY: usize = 1024;

/// Why a command was not handled (the mesh's one handler error).
pub use checkpoint::{checkpoints_log, rebuild_checkpoint, CheckpointRebuilt};
pub use noetl_mesh::runtime::HandlerError;

/// The state one executor replica shares between its consumers.
pub struct Executor {
    pub(crate) mesh: Mesh,
    pub(crate) tools: HashMap<String, Arc<dyn Tool>>,
    needs: NeedsCache,
    /// The mesh's object store, as every tool call gets it.
    pub(crate) objects: Arc<dyn noetl_core::tool::Objects>,
    /// The replica's slots (`--concurrency`), one per message handled: the
    /// iterations of a batch beyond its first run in free ones.
    slots: Arc<tokio::sync::Semaphore>,
    /// Iterations of this replica's batches waiting for a slot.
    queued: std::sync::atomic::AtomicUsize,
    /// Reads of a log for a lost record (an iteration's checkpoint, a
    /// loop run's `ctx` claims), one at a time: after a purge every
    /// command in flight may want one, and each holds a chunk of the log.
    log_reads: tokio::sync::Semaphore,
}

impl Executor {
    /// An executor serving `tools` (by kind) on `mesh`, whose consumers
    /// share `slots`.
    pub fn new(
        mesh: Mesh,
        tools: HashMap<String, Arc<dyn Tool>>,
        slots: Arc<tokio::sync::Semaphore>,
    ) -> Self {
        let objects = Arc::new(mesh.results().clone());
        Self {
            mesh,
            tools,
            needs: NeedsCache::default(),
            objects,
            slots,
            queued: Default::default(),
            log_reads: tokio::sync::Semaphore::new(1),
        }
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Run one task command (its `not_before_ms` has passed) of the step
    /// `at` names, in the `step_run` span; not yet when the step's
    /// concurrency or rate limit makes it wait. `redelivered`: this is not
    /// the command's first delivery (an iteration's missing checkpoint is
    /// then looked for in the log).
    pub async fn execute(
        &self,
        cmd: TaskCommand,
        at: &StepOf,
        redelivered: bool,
    ) -> Result<Handled, HandlerError> {
        let (plan, step) = (&at.plan, at.step());
        let span = tracing::info_span!(
            "step_run",
            execution_id = %cmd.execution_id,
            step = %step.step,
            step_run_id = %cmd.step_run_id,
            trace_id = %cmd.trace_id,
        );
        if let Some(claim) = &cmd.claim {
            let c = crate::claim::ClaimRun {
                exec: crate::claim::Env {
                    mesh: &self.mesh,
                    tools: &self.tools,
                    objects: &self.objects,
                },
                plan,
                step,
                cmd: &cmd,
                claim,
            };
            c.run().instrument(span).await?;
            return Ok(Handled::Done);
        }
        if !cmd.batch.is_empty() {
            return self.run_batch(cmd, at, redelivered).instrument(span).await;
        }
        self.run(plan, step, &cmd, redelivered, None)
            .instrument(span)
            .await
    }

    /// Read what the step-run needs (args, scope, credentials), then drive
    /// its pipeline; a credential that cannot be used fails it at once.
    /// `batch`: the command is an iteration of a batch, whose end is kept
    /// there instead of published.
    async fn run(
        &self,
        plan: &PlanRecord,
        step: &Step,
        cmd: &TaskCommand,
        redelivered: bool,
        batch: Option<&batch::Shared>,
    ) -> Result<Handled, HandlerError> {
        let d = command::decode_command(cmd, &step.step)?;
        // Arguments larger than the payload limit came by reference: tools
        // and templates read them whole, events keep the references.
        let args = noetl_mesh::scope::hydrate_args(&self.mesh, &d.args).await?;
        let needs = self.needs.get(plan, step);
        let (mut base, ctx) = self.base_scope(plan, &needs, &args).await?;
        // Credentials are decrypted here, where they are used, and only when
        // a template of the step reads `keychain` or a task has `auth`.
        let mut credentials = crate::secrets::Resolved::default();
        let mut keychain_error = None;
        if needs.reads("keychain") || needs.uses_auth {
            match crate::secrets::resolve(&self.mesh, plan).await {
                Ok(r) => {
                    if needs.reads("keychain") {
                        base = base.keychain(Value::Object(r.scope.clone()));
                    }
                    credentials = r;
                }
                // A KV outage is retried (the whole command, later); a
                // missing or undecryptable credential fails the step.
                Err(e) if e.kind().is_retryable() => return Err(HandlerError::Mesh(e.into())),
                Err(e) => keychain_error = Some(e.to_string()),
            }
        }
        let index = d
            .loop_run
            .as_ref()
            .map(|(_, i)| i.to_string())
            .unwrap_or_default();
        let sr = StepRun {
            exec: self,
            plan,
            step,
            needs: &needs,
            cmd,
            args,
            event_args: d.args,
            base,
            loop_run: d.loop_run,
            loop_total: d.loop_total,
            index,
            deadline: (cmd.deadline_ms > 0).then(|| Deadline {
                at_ms: cmd.deadline_ms,
                what: cmd.deadline_of.clone(),
            }),
            secrets: credentials.secrets.clone(),
            credentials,
            redelivered,
            batch,
        };
        let cur = Cursor { ctx, ..d.cursor };
        if let Some(message) = keychain_error {
            let error = payloads::error_body("keychain", message);
            sr.finish(&cur, End::Failed(error), None).await?;
            return Ok(Handled::Done);
        }
        sr.admit_and_drive(cur).await
    }
}

/// Where the pipeline is.
#[derive(Debug)]
struct Cursor {
    pc: usize,
    attempt: u32,
    prev: Value,
    iter: Map<String, Value>,
    ctx: Value,
    steps_taken: u64,
    /// Reducer contributions of this iteration so far.
    reduce: Map<String, Value>,
    /// The known outcome of task `pc` (a child execution ended): used
    /// instead of invoking the task, once.
    resume: Option<Outcome>,
    /// Results of this pipeline's tasks read by name, once they ran
    /// ([`StepNeeds::task_results`]).
    results: Map<String, Value>,
    /// Task errors a policy rule handled so far ([`noetl_mesh::handled`]).
    handled: Vec<HandledError>,
}

impl Cursor {
    /// A copy of the cursor without its `ctx` and a child's outcome (what
    /// an iteration's checkpoint keeps).
    fn fork(&self) -> Self {
        Self {
            pc: self.pc,
            attempt: self.attempt,
            prev: self.prev.clone(),
            iter: self.iter.clone(),
            ctx: Value::Null,
            steps_taken: self.steps_taken,
            reduce: self.reduce.clone(),
            resume: None,
            results: self.results.clone(),
            handled: self.handled.clone(),
        }
    }

    /// Move where the task's policy says.
    fn advance(&mut self, moved: Moved) {
        self.pc = moved.at.pc;
        self.attempt = moved.at.attempt;
        if let Some(prev) = moved.prev {
            self.prev = prev;
        }
    }
}

/// Publish `held` as a `task.done` of its own.
async fn publish_held(run: &StepRun<'_>, held: Held) -> Result<PendingAck, MeshError> {
    let event = run.held_event(&held.last, held.at_ms);
    run.mesh().emit(&event).await
}

/// Publishes in flight, awaited together, and the last task's `task.done`
/// held back: published when the pipeline goes on, carried inside the
/// step-run's end when it ends there ([`payloads::LastTask`]).
#[derive(Default)]
struct Pending {
    batch: Batch,
    n: usize,
    held: Option<Held>,
}

/// A `task.done` not yet published: what it says, and when. Its event is
/// built only when it is published on its own ([`StepRun::held_event`]);
/// most ride inside their step-run's end.
struct Held {
    at_ms: u64,
    last: payloads::LastTask,
}

impl Pending {
    fn push(&mut self, ack: PendingAck) {
        self.batch.push(ack);
        self.n += 1;
    }

    /// Hold `held` back, publishing what was held before it.
    async fn hold(&mut self, run: &StepRun<'_>, held: Held) -> Result<(), MeshError> {
        self.release(run).await?;
        self.held = Some(held);
        Ok(())
    }

    /// Publish the held `task.done` of `run`, if any (the pipeline goes on).
    ///
    /// The publish is boxed: most calls hold nothing, and every future
    /// that awaits this one would carry the publish's state otherwise
    /// (docs/performance.md "Futures that move").
    async fn release(&mut self, run: &StepRun<'_>) -> Result<(), MeshError> {
        if let Some(held) = self.held.take() {
            self.push(Box::pin(publish_held(run, held)).await?);
        }
        Ok(())
    }

    /// Publish what is held and wait for every publish.
    async fn settle(&mut self, run: &StepRun<'_>) -> Result<(), MeshError> {
        self.release(run).await?;
        self.n = 0;
        std::mem::take(&mut self.batch).wait().await
    }

    async fn flush_if_full(&mut self) -> Result<(), MeshError> {
        if self.n >= FLUSH_EVERY {
            std::mem::take(&mut self.batch).wait().await?;
            self.n = 0;
        }
        Ok(())
    }
}

/// One command's view of its step-run.
struct StepRun<'a> {
    exec: &'a Executor,
    plan: &'a PlanRecord,
    step: &'a Step,
    needs: &'a StepNeeds,
    cmd: &'a TaskCommand,
    args: Value,
    /// `args` as they came on the wire (large values by reference), for events.
    event_args: Value,
    /// `execution_id`, plus `workload`, `args` and earlier step results
    /// when the step reads them.
    base: Scope,
    /// `(loop_run_id, index)` for a loop iteration.
    loop_run: Option<(String, u64)>,
    /// Items of the loop's collection, for `loop.length` (0: unknown).
    loop_total: u64,
    /// The iteration index as text (`""` outside loops), for ids.
    index: String,
    /// The step-run's deadline, if it has one.
    deadline: Option<Deadline>,
    /// Resolved secret values to redact from everything this step emits.
    secrets: Vec<String>,
    /// Credentials for tasks' `auth` fields (empty unless some task has one).
    credentials: crate::secrets::Resolved,
    /// Not the command's first delivery.
    redelivered: bool,
    /// An iteration of a batch: its end is kept there, reported with the
    /// others', and a lost checkpoint is rebuilt from one read of the log
    /// for all ([`batch::Shared`]).
    batch: Option<&'a batch::Shared>,
}

impl StepRun<'_> {
    fn mesh(&self) -> &Mesh {
        &self.exec.mesh
    }

    fn eid(&self) -> &str {
        &self.cmd.execution_id
    }

    /// The execution's trace id (`outcome.meta.trace_id`): the command's,
    /// as every service derives it ([`noetl_mesh::ids::trace_id_for`]).
    fn trace_id(&self) -> String {
        noetl_mesh::ids::trace_id_for(&self.cmd.trace_id, self.eid())
    }

    /// Drive the pipeline within the step's concurrency and rate limits
    /// ([`crate::gate`]): when a slot and a token are free, holding the
    /// slot until the command ends; else not yet. A command that continues
    /// a child's known outcome runs no tool and is not held back.
    ///
    /// The pipeline's future is built in one place and boxed when a gate
    /// holds it: an async fn keeps each call's future in a slot of its
    /// own, and three of them made this future 48 KiB, copied whole each
    /// time it moved (docs/performance.md "Futures that move").
    async fn admit_and_drive(&self, cur: Cursor) -> Result<Handled, HandlerError> {
        use crate::gate::{self, Admission};
        match self.admit(&cur).await? {
            Admission::Go(None) => self.drive(cur).await?,
            Admission::Go(Some(held)) => {
                gate::hold(self.mesh(), held, Box::pin(self.drive(cur))).await?
            }
            Admission::Wait(wait) => return Ok(Handled::NotYet(wait)),
            Admission::Broken(message) => {
                let error = payloads::error_body("concurrency", message);
                self.finish(&cur, End::Failed(error), None).await?;
            }
        }
        Ok(Handled::Done)
    }

    /// What the step's gate says of the command at `cur` (no gate, or a
    /// command that runs no tool: go, holding nothing).
    async fn admit(&self, cur: &Cursor) -> Result<crate::gate::Admission, HandlerError> {
        use crate::gate::{self, Admission};
        let Some(task) = self.needs.tasks.get(cur.pc) else {
            return Ok(Admission::Go(None));
        };
        if cur.resume.is_some() || !self.step.is_gated() {
            return Ok(Admission::Go(None));
        }
        let scope = self.task_scope(cur, task);
        let entering = gate::Entering {
            mesh: self.mesh(),
            plan: self.plan,
            step: self.step,
            cmd: self.cmd,
            scope: &scope,
        };
        Ok(gate::enter(entering).await?)
    }

    /// Resume, read back what came by reference, run the pipeline, and
    /// publish the step-run's end when it ends in this command.
    ///
    /// The tasks' events are stored before the end is published (and
    /// before a hand-off, [`Self::run_pipeline`]): a redelivered copy of a
    /// command whose end was stored is acked without running
    /// ([`command::command_ended`]), so an event lost behind it (a
    /// nats-server restart drops what was on the wire, and the client
    /// sends the end after reconnecting) would be lost for good. The last
    /// task's `task.done` rides inside the end, so a one-task step has
    /// nothing to wait for.
    async fn drive(&self, mut cur: Cursor) -> Result<(), HandlerError> {
        self.resume(&mut cur).await?;
        let mut pending = Pending::default();
        let end = match self.hydrate_prev(&mut cur).await? {
            Some(failed) => Some(failed),
            None => self.run_pipeline(&mut cur, &mut pending).await?,
        };
        let last = match end {
            Some(_) => pending.held.take(),
            None => None,
        };
        pending.settle(self).await?;
        if let Some(end) = end {
            self.finish(&cur, end, last).await?;
        }
        Ok(())
    }

    /// Run the tasks of this kind from `cur.pc` until the step-run ends
    /// (`Some`) or continues elsewhere (`None`: another command, a child
    /// execution, or nowhere when the execution was stopped): after each
    /// task, [`next::decide`] says what follows, and it is applied here.
    async fn run_pipeline(
        &self,
        cur: &mut Cursor,
        pending: &mut Pending,
    ) -> Result<Option<End>, HandlerError> {
        let serves = |kind: &str| self.exec.tools.contains_key(kind);
        let mut ran: Option<TaskRun> = None;
        loop {
            let iter_changed = ran.as_ref().is_some_and(|r| r.iter_changed);
            let stopped = self.mesh().still_stopped(self.eid()).await?;
            let next = next::decide(NextInput {
                step: self.step,
                tasks: &self.needs.tasks,
                task_errors: &self.needs.task_errors,
                serves: &serves,
                at: next::At {
                    pc: cur.pc,
                    attempt: cur.attempt,
                },
                steps_taken: cur.steps_taken,
                ran: ran.take().map(|r| r.ran),
                deadline: self.deadline.as_ref(),
                now_ms: now_ms(),
                stopped,
            });
            if !matches!(next.then, Then::Finished | Then::End(_)) {
                // The pipeline goes on: the last task's end is published
                // now, not carried in the step-run's end.
                pending.release(self).await?;
            }
            if let Some(moved) = next.moved {
                cur.advance(moved);
                if iter_changed && self.loop_run.is_some() {
                    // Events first, then the cursor: a crash after this
                    // point resumes here, not from the iteration's first
                    // task.
                    pending.settle(self).await?;
                    self.checkpoint(cur).await?;
                }
                pending.flush_if_full().await?;
            }
            match next.then {
                Then::Run => match self.run_next(cur, pending).await? {
                    Some(run) => ran = Some(run),
                    // A child execution runs; the router continues this
                    // pipeline when it ends.
                    None => return Ok(None),
                },
                Then::Command(handoff) => {
                    // Events first, then the command that continues the
                    // step-run elsewhere (see [`Self::drive`]).
                    pending.settle(self).await?;
                    self.hand_off(cur, handoff).await?;
                    return Ok(None);
                }
                Then::Finished => return Ok(Some(End::Done(std::mem::take(&mut cur.prev)))),
                Then::End(end) => return Ok(Some(end)),
                // Cancelled or failed mid-pipeline: stop between tasks,
                // report nothing.
                Then::Stop => return Ok(None),
            }
        }
    }

    /// Run task `cur.pc`, whose kind this replica serves; `None` when it
    /// started a child execution and the step-run waits.
    async fn run_next(
        &self,
        cur: &mut Cursor,
        pending: &mut Pending,
    ) -> Result<Option<TaskRun>, HandlerError> {
        let task = &self.needs.tasks[cur.pc];
        let tool = self
            .exec
            .tools
            .get(&task.kind)
            .expect("next::decide runs here only tasks of served kinds");
        let run = self.run_task(cur, task, tool, pending).await?;
        if run.is_some() {
            cur.steps_taken += 1;
        }
        Ok(run)
    }

    /// Publish the command that continues the step-run: on another kind's
    /// subject (its executors continue the pipeline or, when none serves
    /// it, a timer fails the step-run), or a delayed retry on this kind's.
    async fn hand_off(&self, cur: &mut Cursor, h: Handoff) -> Result<(), HandlerError> {
        self.spill_prev(cur).await?;
        let cmd = self.command(cur, h.at, h.not_before_ms);
        tracing::debug!(
            execution_id = %self.eid(),
            step = %self.step.step,
            kind = %h.kind,
            pc = cmd.pc,
            attempt = cmd.attempt,
            not_before_ms = cmd.not_before_ms,
            "task command handed off"
        );
        let effect = if h.retry {
            // This replica serves the kind: no `task.unserved` timer.
            Effect::Command { kind: h.kind, cmd }
        } else {
            Effect::Task {
                kind: h.kind,
                task: h.task,
                cmd,
            }
        };
        // Boxed: the pipeline's future would carry the publish's state for
        // every task that does not hand off.
        Box::pin(effects::apply(self.mesh(), vec![effect])).await?;
        Ok(())
    }
}

/// What one task run gave.
struct TaskRun {
    /// What [`next::decide`] reads of it.
    ran: next::Ran,
    /// The policy wrote `iter`.
    iter_changed: bool,
}

/// The delay still to wait before `not_before_ms`, if it is in the future.
pub fn remaining(not_before_ms: u64) -> Option<Duration> {
    let now = now_ms();
    (not_before_ms > now).then(|| Duration::from_millis(not_before_ms - now))
}

#[cfg(test)]
mod tests;
