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

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use noetl_core::limits::compact;
use noetl_core::policy::{self, Decision, PolicyInput};
use noetl_core::template::Scope;
use noetl_core::tool::{Tool, ToolCall, ToolReturn};
use noetl_core::{Outcome, OutcomeMeta, Step, StepError, Task};
use noetl_mesh::{
    codec,
    events::{now_ms, now_rfc3339, types, EventDraft},
    ids::derive_id,
    keys::Keys,
    kv::{self, Cas},
    payloads::{self, IterationEnded, Status, StepEnded, TaskStarted},
    plan::PlanRecord,
    scope,
    state::{claim_ctx_keys, Checkpoint, CtxClaim, CtxOwners, ExecHeader, LoopProgress},
    Batch, Mesh, MeshError, PendingAck,
};
use noetl_wire::{IterationRef, TaskCommand};
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::analysis::{NeedsCache, StepNeeds};
pub(crate) use crate::call::{call_tool, call_tool_within, render_config};
use crate::task::{SettleInput, Who};

/// Task runs allowed in one step-run (retries and jumps included) before the
/// step-run fails: a jump loop without an exit.
pub const MAX_TASK_RUNS: u64 = 100_000;

/// Publishes awaited together before the batch is flushed mid-pipeline.
const FLUSH_EVERY: usize = 1024;

/// Why a command was not handled (the mesh's one handler error).
pub use noetl_mesh::runtime::HandlerError;

/// The state one executor replica shares between its consumers.
pub struct Executor {
    pub(crate) mesh: Mesh,
    pub(crate) tools: HashMap<String, Arc<dyn Tool>>,
    needs: NeedsCache,
    /// The mesh's object store, as every tool call gets it.
    pub(crate) objects: Arc<dyn noetl_core::tool::Objects>,
}

impl Executor {
    /// An executor serving `tools` (by kind) on `mesh`.
    pub fn new(mesh: Mesh, tools: HashMap<String, Arc<dyn Tool>>) -> Self {
        let objects = Arc::new(mesh.results().clone());
        Self {
            mesh,
            tools,
            needs: NeedsCache::default(),
            objects,
        }
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Handle one command (its `not_before_ms` has passed).
    /// Whether a redelivered command's work is already over (see
    /// [`command_ended`]): reads the header and, for an iteration, its loop
    /// run. First deliveries skip this read.
    pub async fn ended(&self, cmd: &TaskCommand) -> Result<Option<String>, MeshError> {
        let eid = cmd.execution_id.as_str();
        let header = self.mesh.exec_header(eid).await?;
        let loop_run = match (&cmd.claim, &cmd.iteration) {
            (Some(c), _) => Some(&c.loop_run_id),
            (None, Some(it)) if !it.loop_run_id.is_empty() => Some(&it.loop_run_id),
            _ => None,
        };
        let progress = match loop_run {
            Some(run) => {
                kv::get::<LoopProgress>(self.mesh.loop_kv(), &Keys::loop_run(eid, run)).await?
            }
            None => None,
        };
        Ok(command_ended(cmd, header.as_ref(), progress.as_ref()))
    }

    /// Run one task command.
    pub async fn execute(&self, cmd: TaskCommand) -> Result<(), HandlerError> {
        let eid = cmd.execution_id.as_str();
        let plan = self
            .mesh
            .plans()
            .get(&self.mesh, eid)
            .await
            .map_err(|e| match e {
                MeshError::NoPlan { .. } => HandlerError::Refused(format!(
                    "task command for unknown execution {eid} (step {:?})",
                    cmd.step
                )),
                e => HandlerError::Mesh(e),
            })?;
        let Some(step) = plan.step(&cmd.step) else {
            return Err(HandlerError::Refused(format!(
                "task command of execution {eid} names unknown step {:?}",
                cmd.step
            )));
        };
        let span = tracing::info_span!(
            "step_run",
            execution_id = %eid,
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
                plan: &plan,
                step,
                cmd: &cmd,
                claim,
            };
            return c.run().instrument(span).await;
        }
        self.run(&plan, step, &cmd).instrument(span).await
    }

    async fn run(
        &self,
        plan: &PlanRecord,
        step: &Step,
        cmd: &TaskCommand,
    ) -> Result<(), HandlerError> {
        let eid = cmd.execution_id.as_str();
        let d = decode_command(cmd, &step.step)?;
        // Arguments larger than the payload limit came by reference: tools
        // and templates read them whole, events keep the references.
        let args = scope::hydrate_args(&self.mesh, &d.args).await?;
        let needs = self.needs.get(plan, step);
        let (mut base, ctx) = self.base_scope(plan, &needs, eid, &args).await?;
        // Credentials are decrypted here, where they are used, and only when
        // a template of the step reads `keychain` or a task has `auth`.
        let mut credentials = crate::secrets::Resolved::default();
        let mut keychain_error = None;
        if needs.reads("keychain") || needs.uses_auth {
            match crate::secrets::resolve(&self.mesh, &plan.playbook).await {
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
            secrets: credentials.secrets.clone(),
            credentials,
        };
        let cur = Cursor {
            pc: cmd.pc as usize,
            attempt: cmd.attempt.max(1),
            prev: d.prev,
            iter: d.iter,
            ctx,
            steps_taken: cmd.steps_taken,
            reduce: d.reduce,
            resume: d.resume,
            results: d.results,
        };
        if let Some(message) = keychain_error {
            let mut pending = Pending::default();
            let error = payloads::error_body("keychain", message);
            sr.finish(&cur, End::Failed(error), &mut pending).await?;
            pending.batch.wait().await?;
            return Ok(());
        }
        sr.drive(cur).await
    }

    /// The step's template scope before any task (workload, args, the
    /// results of the steps its templates read) and `ctx` when they read
    /// it; only what the templates read is loaded.
    async fn base_scope(
        &self,
        plan: &PlanRecord,
        needs: &StepNeeds,
        eid: &str,
        args: &Value,
    ) -> Result<(Scope, Value), MeshError> {
        let mut roots: BTreeSet<String> = needs.steps.iter().cloned().collect();
        if needs.load_ctx {
            roots.insert("ctx".into());
        }
        let loaded = if roots.is_empty() {
            scope::Loaded {
                ctx: Value::Object(Map::new()),
                steps: Map::new(),
            }
        } else {
            let names: Vec<&str> = needs.steps.iter().map(String::as_str).collect();
            scope::load(&self.mesh, eid, &roots, &names).await?
        };
        let mut base = Scope::new().execution_id(eid.to_string());
        if needs.reads("workload") {
            base = base.workload(plan.workload.clone());
        }
        if needs.reads("args") {
            base = base.args(args.clone());
        }
        for name in &needs.steps {
            base = match loaded.steps.get(name) {
                Some(v) => base.step_result(name.clone(), v.clone()),
                None => base.declare(name.clone()),
            };
        }
        // A task read by name is undefined until it has run in this
        // step-run (then bound per task, `StepRun::task_scope`).
        for name in &needs.task_results {
            base = base.declare(name.clone());
        }
        Ok((base, loaded.ctx))
    }
}

/// The JSON fields of a task command, decoded.
#[derive(Debug)]
struct DecodedCommand {
    /// The step's args as the command carries them (large ones are
    /// references).
    args: Value,
    prev: Value,
    /// Loop run id and iteration index, for an iteration's command.
    loop_run: Option<(String, u64)>,
    /// Items of the loop's collection (0: unknown or not a loop).
    loop_total: u64,
    iter: Map<String, Value>,
    /// Results of the tasks read by name that ran so far (large ones by
    /// reference).
    results: Map<String, Value>,
    reduce: Map<String, Value>,
    /// The outcome of the child execution this command resumes after.
    resume: Option<Outcome>,
}

/// Decode a task command's JSON fields; a field that is not the JSON it
/// should be refuses the command, naming the field, step and execution.
fn decode_command(cmd: &TaskCommand, step: &str) -> Result<DecodedCommand, HandlerError> {
    let eid = cmd.execution_id.as_str();
    let refuse = |what: &str, e: &dyn std::fmt::Display| {
        HandlerError::Refused(format!(
            "task command of execution {eid} step {step:?}: {what}: {e}"
        ))
    };
    let args = codec::args(&cmd.args_json).map_err(|e| refuse("args", &e))?;
    let prev = codec::json_value(&cmd.prev_json).map_err(|e| refuse("_prev", &e))?;
    let (loop_run, iter, reduce) = match &cmd.iteration {
        None => (None, Map::new(), Map::new()),
        Some(it) => {
            let iter = codec::json_object(&it.iter_json).map_err(|e| refuse("iter", &e))?;
            let reduce = codec::json_object(&it.reduce_json).map_err(|e| refuse("reduce", &e))?;
            let lr = (!it.loop_run_id.is_empty()).then(|| (it.loop_run_id.clone(), it.index));
            (lr, iter, reduce)
        }
    };
    let loop_total = cmd.iteration.as_ref().map(|it| it.total).unwrap_or(0);
    let results = codec::json_object(&cmd.results_json).map_err(|e| refuse("task results", &e))?;
    let resume = if cmd.resume_outcome_json.is_empty() {
        None
    } else {
        let v = codec::json_value(&cmd.resume_outcome_json)
            .map_err(|e| refuse("resume outcome", &e))?;
        Some(serde_json::from_value(v).map_err(|e| refuse("resume outcome", &e))?)
    };
    Ok(DecodedCommand {
        args,
        prev,
        loop_run,
        loop_total,
        iter,
        results,
        reduce,
        resume,
    })
}

/// Why a command's work is already over, or `None` while it may run: the
/// execution has ended, the step-run's token is no longer
/// live (the router applied its boundary, e.g. a timeout or an earlier
/// copy of this command), or the loop iteration was already counted. A
/// late copy of such a command (a redelivery after its work was reported)
/// is acked without running: running it again would repeat its tool calls
/// and rewrite a checkpoint that nothing will read.
pub fn command_ended(
    cmd: &TaskCommand,
    header: Option<&ExecHeader>,
    progress: Option<&LoopProgress>,
) -> Option<String> {
    // No header: nothing says the work is over (an executor driven without
    // a router, or a header not yet readable); the plan read decides.
    let h = header?;
    if h.status.is_terminal() {
        return Some(format!("its execution is {:?}", h.status));
    }
    if !h.is_live(&cmd.step_run_id) {
        return Some(format!("step-run {} has ended", cmd.step_run_id));
    }
    if let Some(c) = &cmd.claim {
        return match progress {
            None => Some(format!("loop run {} has no record", c.loop_run_id)),
            Some(p) if p.claim_applied(c.seq) => Some(format!(
                "claim {} of loop run {} was applied",
                c.seq, c.loop_run_id
            )),
            Some(_) => None,
        };
    }
    match (&cmd.iteration, progress) {
        (Some(it), _) if it.loop_run_id.is_empty() => None,
        (Some(it), None) => Some(format!("loop run {} has no record", it.loop_run_id)),
        (Some(it), Some(p)) if p.counted(it.index) => Some(format!(
            "iteration {} of loop run {} was counted",
            it.index, it.loop_run_id
        )),
        _ => None,
    }
}

/// Where the pipeline is.
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
}

/// How the pipeline stopped in this command.
enum End {
    /// Finished successfully with this result.
    Done(Value),
    /// Failed with `{kind, message, task}`.
    Failed(Value),
    /// Continues in another command (another kind or a delayed retry).
    Handoff,
}

/// Publishes in flight, awaited together.
#[derive(Default)]
struct Pending {
    batch: Batch,
    n: usize,
}

impl Pending {
    fn push(&mut self, ack: PendingAck) {
        self.batch.push(ack);
        self.n += 1;
    }

    async fn flush_if_full(&mut self) -> Result<(), MeshError> {
        if self.n >= FLUSH_EVERY {
            std::mem::take(&mut self.batch).wait().await?;
            self.n = 0;
        }
        Ok(())
    }
}

/// What one task run gave.
struct TaskRun {
    outcome: Outcome,
    decision: Decision,
    /// The policy wrote `iter`.
    iter_changed: bool,
    /// The policy itself failed to evaluate.
    policy_error: Option<String>,
}

/// The task being run, with its run id and tracing span.
struct TaskAt<'a> {
    task: &'a Task,
    run_id: String,
    span: tracing::Span,
}

/// What calling a task's tool (or its child execution) produced.
struct Called {
    outcome: Outcome,
    /// When the tool asks for a retry no sooner than this.
    retry_after: Option<Duration>,
    /// Set when the step-run's deadline cut the tool call short.
    out_of_time: Option<String>,
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
    /// Resolved secret values to redact from everything this step emits.
    secrets: Vec<String>,
    /// Credentials for tasks' `auth` fields (empty unless some task has one).
    credentials: crate::secrets::Resolved,
}

impl StepRun<'_> {
    fn mesh(&self) -> &Mesh {
        &self.exec.mesh
    }

    fn eid(&self) -> &str {
        &self.cmd.execution_id
    }

    async fn drive(&self, mut cur: Cursor) -> Result<(), HandlerError> {
        self.resume(&mut cur).await?;
        let mut pending = Pending::default();
        let end = match self.hydrate_prev(&mut cur).await? {
            Some(failed) => failed,
            None => self.run_pipeline(&mut cur, &mut pending).await?,
        };
        self.finish(&cur, end, &mut pending).await?;
        pending.batch.wait().await?;
        Ok(())
    }

    /// `_prev` and task results handed over by reference are read back
    /// once, here. `Some` (the step-run fails; its arcs may handle that)
    /// when one is gone for good.
    async fn hydrate_prev(&self, cur: &mut Cursor) -> Result<Option<End>, HandlerError> {
        let names: Vec<String> = cur.results.keys().cloned().collect();
        for name in std::iter::once(None).chain(names.into_iter().map(Some)) {
            let slot = match &name {
                None => &mut cur.prev,
                Some(n) => match cur.results.get_mut(n) {
                    Some(v) => v,
                    None => continue,
                },
            };
            match self.mesh().results().hydrate(std::mem::take(slot)).await {
                Ok(v) => *slot = v,
                Err(e) if e.is_permanent() => {
                    let task = self.needs.tasks.get(cur.pc).map(|t| t.name.as_str());
                    let error = StepError::new("result.unavailable", e.to_string(), task);
                    return Ok(Some(End::Failed(error.to_value())));
                }
                Err(e) => return Err(MeshError::from(e).into()),
            }
        }
        Ok(None)
    }

    /// Run the tasks of this kind from `cur.pc` until the step-run ends or
    /// continues in another command.
    async fn run_pipeline(
        &self,
        cur: &mut Cursor,
        pending: &mut Pending,
    ) -> Result<End, HandlerError> {
        let tasks = &self.needs.tasks;
        loop {
            if cur.pc >= tasks.len() {
                return Ok(End::Done(std::mem::take(&mut cur.prev)));
            }
            if self.mesh().cancellations().is_stopped(self.eid()) {
                // Cancelled or failed mid-pipeline: stop between tasks, report nothing.
                return Ok(End::Handoff);
            }
            let task = &tasks[cur.pc];
            if let Some(end) = self.cannot_start(cur, task) {
                return Ok(end);
            }
            let Some(tool) = self.exec.tools.get(&task.kind) else {
                // Another kind: its executors continue the pipeline (or,
                // when none serves it, a timer fails the step-run).
                self.spill_prev(cur).await?;
                let cmd = self.command(cur, cur.attempt, 0);
                pending.push(self.publish(&task.kind, &cmd).await?);
                let watch = self.mesh().watch_dispatch(&task.kind, &task.name, &cmd);
                if let Some(timer) = watch.await? {
                    pending.push(timer);
                }
                return Ok(End::Handoff);
            };
            let Some(run) = self.run_task(cur, task, tool, pending).await? else {
                // A child execution runs; the router continues this
                // pipeline when it ends.
                return Ok(End::Handoff);
            };
            cur.steps_taken += 1;
            let iter_changed = run.iter_changed;
            if let Some(end) = self.follow(cur, task, run, pending).await? {
                return Ok(end);
            }
            if iter_changed && self.loop_run.is_some() {
                // Events first, then the cursor: a crash after this point
                // resumes here, not from the iteration's first task.
                std::mem::take(pending).batch.wait().await?;
                self.checkpoint(cur).await?;
            }
            pending.flush_if_full().await?;
        }
    }

    /// Why `task` may not start: the step-run is out of time (the command
    /// waited in a queue, or an earlier task used the time up), the task's
    /// workbook reference is broken, or the step-run ran
    /// [`MAX_TASK_RUNS`] tasks already.
    fn cannot_start(&self, cur: &Cursor, task: &Task) -> Option<End> {
        let due = |d: &noetl_core::lifecycle::Deadline| {
            matches!(
                noetl_core::lifecycle::due(d.at_ms, now_ms()),
                noetl_core::lifecycle::Due::Now
            )
        };
        let error = if let Some(d) = self.deadline().filter(due) {
            noetl_core::lifecycle::timeout_error(&d, &self.step.step, Some(&task.name))
        } else if let Some(Some(why)) = self.needs.task_errors.get(cur.pc) {
            StepError::new("workbook", why, Some(&task.name))
        } else if cur.steps_taken >= MAX_TASK_RUNS {
            let message = format!(
                "step {:?} ran {MAX_TASK_RUNS} tasks in one step-run (a jump loop without exit?)",
                self.step.step
            );
            StepError::new("pipeline.limit", message, Some(&task.name))
        } else {
            return None;
        };
        Some(End::Failed(error.to_value()))
    }

    /// Move the cursor as the task's decision says; `Some` when the
    /// step-run ends here or continues in another command (a delayed
    /// retry).
    async fn follow(
        &self,
        cur: &mut Cursor,
        task: &Task,
        run: TaskRun,
        pending: &mut Pending,
    ) -> Result<Option<End>, HandlerError> {
        match run.decision {
            Decision::Continue => {
                cur.prev = run.outcome.result;
                cur.pc += 1;
                cur.attempt = 1;
            }
            Decision::Retry {
                delay,
                next_attempt,
            } => {
                let not_before = now_ms().saturating_add(delay.as_millis() as u64);
                if !noetl_core::lifecycle::retry_fits(not_before, self.cmd.deadline_ms) {
                    // The retry would start after the deadline: the
                    // step-run is out of time now.
                    let d = self.deadline().expect("a deadline is set");
                    let mut error =
                        noetl_core::lifecycle::timeout_error(&d, &self.step.step, Some(&task.name));
                    if let Some(e) = &run.outcome.error {
                        error.message = format!(
                            "{}; a retry in {} ms would start after it (last error: {}: {})",
                            error.message,
                            delay.as_millis(),
                            e.kind,
                            e.message
                        );
                    }
                    return Ok(Some(End::Failed(error.to_value())));
                }
                if delay.is_zero() {
                    cur.attempt = next_attempt;
                } else {
                    self.spill_prev(cur).await?;
                    let cmd = self.command(cur, next_attempt, not_before);
                    pending.push(self.publish(&task.kind, &cmd).await?);
                    return Ok(Some(End::Handoff));
                }
            }
            Decision::Jump { to } => {
                let Some(i) = self.step.task_index(&to) else {
                    let message = format!(
                        "task {:?} of step {:?} jumps to {to:?}, which is not a task of the step",
                        task.name, self.step.step
                    );
                    let error = StepError::new("policy", message, Some(&task.name));
                    return Ok(Some(End::Failed(error.to_value())));
                };
                cur.prev = run.outcome.result;
                cur.pc = i;
                cur.attempt = 1;
            }
            Decision::Break => return Ok(Some(End::Done(run.outcome.result))),
            Decision::Fail { reason } => {
                let error = crate::task::failure(task, &run.outcome, &reason, run.policy_error);
                return Ok(Some(End::Failed(error)));
            }
        }
        Ok(None)
    }

    /// Run task `cur.pc` once: events, tool call, policy, patches. `None`
    /// when the task started a child execution and the step-run waits.
    async fn run_task(
        &self,
        cur: &mut Cursor,
        task: &Task,
        tool: &Arc<dyn Tool>,
        pending: &mut Pending,
    ) -> Result<Option<TaskRun>, HandlerError> {
        let t = TaskAt {
            task,
            run_id: derive_id(&[
                &self.cmd.step_run_id,
                &self.index,
                &cur.pc.to_string(),
                &cur.attempt.to_string(),
                &cur.steps_taken.to_string(),
            ]),
            span: tracing::info_span!(
                "task",
                execution_id = %self.eid(),
                step = %self.step.step,
                task = %task.name,
                attempt = cur.attempt,
            ),
        };
        let resumed = cur.resume.take();
        if resumed.is_none() {
            let started = TaskStarted {
                attempt: cur.attempt,
                pc: cur.pc,
                kind: task.kind.clone(),
            };
            let ev = self.task_event(
                types::TASK_STARTED,
                &t.run_id,
                task,
                payloads::to_value(&started),
            );
            pending.push(self.mesh().emit(&ev).await?);
        }
        let scope = self.task_scope(cur, task);
        let started_at = now_rfc3339();
        let clock = Instant::now();
        let mut called = match resumed {
            // A child execution ended: its outcome is this task's.
            Some(outcome) => Called {
                outcome,
                retry_after: None,
                out_of_time: None,
            },
            None => match self.invoke(cur, &t, tool, &scope, pending).await? {
                Some(called) => called,
                None => return Ok(None),
            },
        };
        called.outcome.meta = OutcomeMeta {
            attempt: cur.attempt,
            duration_ms: clock.elapsed().as_millis() as u64,
            started_at,
        };
        crate::secrets::redact_outcome(&mut called.outcome, &self.secrets);
        self.conclude(cur, &t, scope, called, pending)
            .await
            .map(Some)
    }

    /// The template scope of a task: the step's, with what the task's
    /// templates read of the cursor.
    fn task_scope(&self, cur: &Cursor, task: &Task) -> Scope {
        let mut scope = self
            .base
            .clone()
            .task(task.name.clone())
            .attempt(cur.attempt);
        if self.needs.reads("ctx") {
            scope = scope.ctx(cur.ctx.clone());
        }
        if self.needs.reads("iter") {
            scope = scope.iter(self.iter_view(cur));
        }
        if self.needs.reads("_prev") {
            scope = scope.prev(cur.prev.clone());
        }
        if self.needs.reads("loop") && self.loop_total > 0 {
            if let Some((_, index)) = &self.loop_run {
                scope = scope.loop_info(*index as usize, self.loop_total as usize);
            }
        }
        for (name, result) in &cur.results {
            scope = scope.step_result(name.clone(), result.clone());
        }
        scope
    }

    /// Render the task's config and call its tool (or start its child
    /// execution: `None`, the step-run waits). A config that does not
    /// render, or an `auth` that names no credential, is the task's error
    /// outcome.
    async fn invoke(
        &self,
        cur: &mut Cursor,
        t: &TaskAt<'_>,
        tool: &Arc<dyn Tool>,
        scope: &Scope,
        pending: &mut Pending,
    ) -> Result<Option<Called>, HandlerError> {
        let task = t.task;
        let who = self.who(task);
        let failed = |outcome| {
            Ok(Some(Called {
                outcome,
                retry_after: None,
                out_of_time: None,
            }))
        };
        let config = match render_config(task, tool.raw_fields(), scope) {
            Ok(config) => config,
            Err(message) => return failed(who.error("template", &message)),
        };
        let config = match crate::script::load_into(&task.kind, config).await {
            Ok(config) => config,
            Err(message) => return failed(who.error("script", &message)),
        };
        if task.kind == "playbook" {
            return match self
                .start_child(cur, task, &config, &t.run_id, pending)
                .await?
            {
                Ok(()) => Ok(None),
                Err(message) => failed(who.error("playbook.config", &message)),
            };
        }
        if task.kind == "artifact" {
            // What an artifact stores, any execution sharing the store reads.
            if let Err(message) = crate::child::no_keychain(&task.config, &config, &self.secrets) {
                return failed(who.error("artifact.config", &message));
            }
        }
        let auth = match crate::task::auth(&config, &self.credentials) {
            Ok(auth) => auth,
            Err(why) => return failed(who.error("auth", &why)),
        };
        let nested_auth = match crate::task::nested_auth(&config, &self.credentials) {
            Ok(nested) => nested,
            Err(why) => return failed(who.error("auth", &why)),
        };
        let mut call = self.tool_call(cur, task, config, auth);
        call.nested_auth = nested_auth;
        let (r, out_of_time) = self.call(tool, call, task, &t.span).await;
        Ok(Some(Called {
            outcome: r.outcome,
            retry_after: r.retry_after,
            out_of_time,
        }))
    }

    /// After the call: the task's policy decides, its `set_ctx`/`set_iter`
    /// are applied, and `task.done` reports it.
    async fn conclude(
        &self,
        cur: &mut Cursor,
        t: &TaskAt<'_>,
        scope: Scope,
        called: Called,
        pending: &mut Pending,
    ) -> Result<TaskRun, HandlerError> {
        let task = t.task;
        let mut outcome = called.outcome;
        self.mesh().health().metrics().task_ended(
            &task.kind,
            outcome.is_ok(),
            outcome.meta.duration_ms,
        );
        // The task has run: later tasks (and its own policy) read its
        // result by its name.
        if self.needs.task_results.contains(&task.name) {
            cur.results
                .insert(task.name.clone(), outcome.result.clone());
        }
        let policy_scope = match &task.spec.policy {
            Some(_) => {
                let scope = match cur.results.get(&task.name) {
                    Some(r) => scope.step_result(task.name.clone(), r.clone()),
                    None => scope,
                };
                scope.outcome(&outcome)
            }
            None => scope, // no rules: nothing reads the scope
        };
        let decided = policy::decide(&PolicyInput {
            policy: task.spec.policy.as_ref(),
            outcome: &outcome,
            attempt: cur.attempt,
            scope: &policy_scope,
            retry_after: called.retry_after,
        });
        let mut settled = crate::task::settle(SettleInput {
            decided,
            out_of_time: called.out_of_time.as_deref(),
            who: self.who(task),
            source: &self.plan.source_name,
        });
        self.redact_settled(&mut settled);
        if let Some(patch) = settled.set_ctx.clone().filter(|p| !p.is_empty()) {
            if let Some((kind, message)) = self.write_ctx(cur, task, &patch, &t.run_id).await? {
                crate::task::fail_on_ctx_error(&mut outcome, &mut settled, kind, message);
            }
        }
        if let Some(patch) = &settled.set_iter {
            for (k, v) in patch {
                cur.iter.insert(k.clone(), v.clone());
            }
        }
        t.span.in_scope(|| {
            tracing::debug!(
                status = ?outcome.status,
                action = crate::task::action_name(&settled.decision),
                duration_ms = outcome.meta.duration_ms,
                "task finished"
            )
        });
        let payload = crate::task::done_payload(&outcome, cur.attempt, &settled);
        let ev = self.task_event(types::TASK_DONE, &t.run_id, task, payload);
        pending.push(self.mesh().emit(&ev).await?);
        Ok(TaskRun {
            outcome,
            iter_changed: settled.set_iter.as_ref().is_some_and(|m| !m.is_empty()),
            decision: settled.decision,
            policy_error: settled.policy_error,
        })
    }

    /// Names for a task's messages.
    fn who<'t>(&'t self, task: &'t Task) -> Who<'t> {
        Who {
            task: &task.name,
            step: &self.step.step,
        }
    }

    /// A task's tool call, its config rendered.
    fn tool_call(
        &self,
        cur: &Cursor,
        task: &Task,
        config: Map<String, Value>,
        auth: Option<noetl_core::tool::AuthCredential>,
    ) -> ToolCall {
        let in_loop = self.loop_run.is_some() || !cur.iter.is_empty();
        ToolCall {
            execution_id: self.eid().to_string(),
            step: self.step.step.clone(),
            task: task.name.clone(),
            kind: task.kind.clone(),
            config,
            spec: self.needs.specs.get(cur.pc).cloned().unwrap_or_default(),
            args: self.args.clone(),
            prev: cur.prev.clone(),
            iter: in_loop.then(|| self.iter_view(cur)),
            ctx: cur.ctx.clone(),
            workload: self.plan.workload.clone(),
            attempt: cur.attempt,
            auth,
            nested_auth: Default::default(),
            objects: Some(self.exec.objects.clone()),
        }
    }

    /// Call the tool, within the step-run's deadline if it has one; the
    /// second value is set (the timeout message) when the deadline cut the
    /// call short.
    async fn call(
        &self,
        tool: &Arc<dyn Tool>,
        call: ToolCall,
        task: &Task,
        span: &tracing::Span,
    ) -> (ToolReturn, Option<String>) {
        let Some(d) = self.deadline() else {
            return (call_tool(tool, call).instrument(span.clone()).await, None);
        };
        let left = match noetl_core::lifecycle::due(d.at_ms, now_ms()) {
            noetl_core::lifecycle::Due::In(left) => left,
            noetl_core::lifecycle::Due::Now => Duration::ZERO,
        };
        match call_tool_within(tool, call, left)
            .instrument(span.clone())
            .await
        {
            Some(r) => (r, None),
            None => {
                let message =
                    noetl_core::lifecycle::timeout_error(&d, &self.step.step, Some(&task.name))
                        .message;
                let r = ToolReturn::from(Outcome::error(
                    noetl_core::lifecycle::TIMEOUT,
                    message.clone(),
                    false,
                ));
                (r, Some(message))
            }
        }
    }

    /// No resolved secret reaches an event or KV through a decision: a
    /// fail reason, a policy error (it quotes rendered values) or a patch
    /// that rendered `keychain` directly.
    fn redact_settled(&self, s: &mut crate::task::Settled) {
        if let Decision::Fail { reason } = &mut s.decision {
            crate::secrets::redact_str(reason, &self.secrets);
        }
        if let Some(message) = &mut s.policy_error {
            crate::secrets::redact_str(message, &self.secrets);
        }
        for patch in [s.set_iter.as_mut(), s.set_ctx.as_mut()]
            .into_iter()
            .flatten()
        {
            patch
                .values_mut()
                .for_each(|v| crate::secrets::redact_value(v, &self.secrets));
        }
    }

    /// Write a task's `set_ctx` patch: reducer contributions stay in the
    /// iteration, the rest is claimed (parallel loops) and merged. Returns
    /// the error kind and message when a key conflicts or a reducer fails.
    async fn write_ctx(
        &self,
        cur: &mut Cursor,
        task: &Task,
        patch: &Map<String, Value>,
        task_run_id: &str,
    ) -> Result<Option<(&'static str, String)>, MeshError> {
        let rest = match self.split_ctx_patch(patch, &mut cur.reduce) {
            Err(e) => return Ok(Some(e)),
            Ok(rest) if rest.is_empty() => return Ok(None),
            Ok(rest) => rest,
        };
        let writer = format!(
            "step {:?} iteration {} task {:?}",
            self.step.step, self.index, task.name
        );
        match self.claim_ctx_keys(&rest, &writer, task_run_id).await? {
            Err(e) => Ok(Some(e)),
            Ok(()) => {
                cur.ctx = self.apply_ctx(&rest, task_run_id).await?;
                Ok(None)
            }
        }
    }

    /// `iter` as templates and tools see it: the iteration's own keys, and
    /// in a child execution the parent task's `iter` as `parent`.
    fn iter_view(&self, cur: &Cursor) -> Value {
        let mut m = cur.iter.clone();
        if !self.plan.parent_iter.is_null() {
            m.insert("parent".into(), self.plan.parent_iter.clone());
        }
        Value::Object(m)
    }

    /// Start the child execution of a `playbook` task; the parent resumes
    /// at this task when the child ends. `Err` names a field problem.
    async fn start_child(
        &self,
        cur: &mut Cursor,
        task: &Task,
        config: &Map<String, Value>,
        task_run_id: &str,
        pending: &mut Pending,
    ) -> Result<Result<(), String>, HandlerError> {
        self.spill_prev(cur).await?;
        let child_id = derive_id(&["child", task_run_id]);
        let req = match crate::child::request(crate::child::ChildParams {
            raw: &task.config,
            config,
            secrets: &self.secrets,
            child_id: child_id.clone(),
            parent_id: self.eid(),
            trace_id: &self.cmd.trace_id,
            resume: self.command(cur, cur.attempt, 0),
            parent_iter: self.iter_view(cur),
        }) {
            Ok(r) => r,
            Err(e) => return Ok(Err(e.to_string())),
        };
        tracing::info!(
            execution_id = %self.eid(),
            step = %self.step.step,
            child = %child_id,
            "starting child execution"
        );
        pending.push(
            self.mesh()
                .publish(
                    self.mesh().subjects().exec_request(),
                    &child_id,
                    codec::encode(&req),
                )
                .await?,
        );
        Ok(Ok(()))
    }

    /// Inside a loop iteration, take the keys that have a declared reducer
    /// out of `patch` and fold them into the iteration's contributions;
    /// return the rest.
    fn split_ctx_patch(
        &self,
        patch: &Map<String, Value>,
        contributions: &mut Map<String, Value>,
    ) -> Result<Map<String, Value>, (&'static str, String)> {
        let Some(lp) = self.step.loop_.as_ref().filter(|_| self.loop_run.is_some()) else {
            return Ok(patch.clone());
        };
        let reducers = noetl_core::reduce::declared(lp.spec.policy.as_ref())
            .map_err(|e| ("reducer", format!("step {:?}: {e}", self.step.step)))?;
        let mut rest = Map::new();
        for (k, v) in patch {
            match reducers.iter().find(|(name, _)| name == k) {
                Some((_, op)) => {
                    let folded = noetl_core::reduce::fold(*op, k, contributions.get(k), v)
                        .map_err(|e| ("reducer", format!("step {:?}: {e}", self.step.step)))?;
                    contributions.insert(k.clone(), folded);
                }
                None => {
                    rest.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(rest)
    }

    /// In a parallel loop, `ctx` keys are write-once per loop run
    /// ([`noetl_mesh::state::claim_ctx_keys`]); the claims live under
    /// `<eid>.owners.<loop_run>`, so the same loop step entered again (e.g.
    /// through a back-arc) starts with none.
    async fn claim_ctx_keys(
        &self,
        patch: &Map<String, Value>,
        writer: &str,
        task_run_id: &str,
    ) -> Result<Result<(), (&'static str, String)>, MeshError> {
        let parallel = self
            .step
            .loop_
            .as_ref()
            .map(|l| l.spec.mode == noetl_core::LoopMode::Parallel)
            .unwrap_or(false);
        let Some((loop_run_id, _)) = self.loop_run.as_ref().filter(|_| parallel) else {
            return Ok(Ok(()));
        };
        let hashes: Vec<(String, String)> = patch
            .iter()
            .map(|(k, v)| (k.clone(), derive_id(&[&v.to_string()])))
            .collect();
        let mut conflict = None;
        kv::update(
            self.mesh().ctx_kv(),
            &Keys::owners(self.eid(), loop_run_id),
            |cur: Option<&CtxOwners>| {
                conflict = None;
                match claim_ctx_keys(cur, &hashes, writer, task_run_id) {
                    CtxClaim::Held => Cas::Keep,
                    CtxClaim::Write(owners) => Cas::Write(owners),
                    CtxClaim::Conflict(m) => {
                        conflict = Some(m);
                        Cas::Keep
                    }
                }
            },
        )
        .await?;
        Ok(match conflict {
            Some(m) => Err(("ctx.conflict", m)),
            None => Ok(()),
        })
    }

    /// Merge the `set_ctx` patch of task run `task_run_id` into the
    /// execution's `ctx` (compare-and-set) and return the `ctx` now stored,
    /// as users see it. The task run's id is recorded in the same write, so
    /// a redelivered command (whose patch may render differently, e.g.
    /// `ctx.n + 1`) does not apply it again.
    async fn apply_ctx(
        &self,
        patch: &Map<String, Value>,
        task_run_id: &str,
    ) -> Result<Value, MeshError> {
        use noetl_mesh::state::{ctx_applied, mark_ctx_applied, user_ctx};
        let stored = kv::update(
            self.mesh().ctx_kv(),
            self.eid(),
            |current: Option<&Value>| {
                let mut obj = match current {
                    Some(Value::Object(m)) => m.clone(),
                    _ => Map::new(),
                };
                if ctx_applied(&obj, task_run_id) {
                    return Cas::Keep; // already applied (redelivery)
                }
                for (k, v) in patch {
                    obj.insert(k.clone(), v.clone());
                }
                mark_ctx_applied(&mut obj, task_run_id);
                Cas::Write(Value::Object(obj))
            },
        )
        .await?;
        Ok(user_ctx(
            stored.unwrap_or_else(|| Value::Object(patch.clone())),
        ))
    }

    // Over 80 lines on purpose: one arm per boundary (step done or failed, iteration done or
    // failed), each writing its own payload.
    /// The boundary of the step-run (or iteration).
    async fn finish(
        &self,
        cur: &Cursor,
        end: End,
        pending: &mut Pending,
    ) -> Result<(), HandlerError> {
        let (event_type, payload, discriminator) = match (&self.loop_run, end) {
            (_, End::Handoff) => return Ok(()),
            (None, End::Done(result)) => {
                // Reference-first: a result above the limit is stored in
                // object storage and travels (event, KV) as its reference.
                let result = self.offload(&self.cmd.step_run_id, &result).await?;
                if self.plan.is_result_referenced(&self.step.step) {
                    kv::put(
                        self.mesh().exec_kv(),
                        &Keys::result(self.eid(), &self.step.step),
                        &result,
                    )
                    .await?;
                }
                (
                    types::STEP_DONE,
                    payloads::to_value(&StepEnded::done(result, self.event_args.clone())),
                    "",
                )
            }
            (None, End::Failed(error)) => {
                tracing::info!(
                    execution_id = %self.eid(),
                    step = %self.step.step,
                    task = %error["task"].as_str().unwrap_or(""),
                    kind = %error["kind"].as_str().unwrap_or(""),
                    "step failed"
                );
                (
                    types::STEP_FAILED,
                    payloads::to_value(&StepEnded::failed(error, self.event_args.clone())),
                    "",
                )
            }
            (Some((loop_run_id, index)), end) => {
                let (t, status, result, error) = match end {
                    End::Done(r) => (types::LOOP_ITERATION_DONE, Status::Ok, r, Value::Null),
                    End::Failed(e) => (types::LOOP_ITERATION_FAILED, Status::Error, Value::Null, e),
                    End::Handoff => unreachable!("handled above"),
                };
                let limit = self.mesh().config().inline_limit;
                let ended = IterationEnded {
                    loop_run_id: loop_run_id.clone(),
                    index: *index,
                    status,
                    result: compact(&result, limit),
                    iter: compact(&Value::Object(cur.iter.clone()), limit),
                    reduce: cur.reduce.clone(),
                    error,
                };
                (t, payloads::to_value(&ended), self.index.as_str())
            }
        };
        let ev = EventDraft {
            event_type,
            execution_id: self.eid(),
            step_run_id: &self.cmd.step_run_id,
            step: &self.step.step,
            trace_id: &self.cmd.trace_id,
            parent_id: &self.cmd.command_id,
            discriminator,
            payload,
            ..Default::default()
        }
        .build();
        pending.push(self.mesh().emit(&ev).await?);
        Ok(())
    }

    fn task_event(
        &self,
        event_type: &'static str,
        task_run_id: &str,
        task: &Task,
        payload: Value,
    ) -> noetl_wire::Event {
        EventDraft {
            event_type,
            execution_id: self.eid(),
            step_run_id: &self.cmd.step_run_id,
            task_run_id,
            step: &self.step.step,
            task: &task.name,
            trace_id: &self.cmd.trace_id,
            parent_id: &self.cmd.command_id,
            payload,
            ..Default::default()
        }
        .build()
    }

    /// The step-run's deadline, if it has one.
    fn deadline(&self) -> Option<noetl_core::lifecycle::Deadline> {
        (self.cmd.deadline_ms > 0).then(|| noetl_core::lifecycle::Deadline {
            at_ms: self.cmd.deadline_ms,
            what: self.cmd.deadline_of.clone(),
        })
    }

    /// Results above this many bytes travel by reference.
    fn payload_limit(&self) -> usize {
        self.plan
            .max_payload_bytes(self.mesh().config().inline_limit)
    }

    /// Move a large `_prev` (and large task results) to object storage
    /// before it rides in a command or a checkpoint (the next command
    /// hydrates it).
    async fn spill_prev(&self, cur: &mut Cursor) -> Result<(), MeshError> {
        cur.prev = self.prev_by_reference(cur).await?;
        cur.results = self.results_by_reference(cur).await?;
        Ok(())
    }

    /// `cur.results`, each one above the limit as its reference.
    async fn results_by_reference(&self, cur: &Cursor) -> Result<Map<String, Value>, MeshError> {
        let mut out = Map::with_capacity(cur.results.len());
        for (name, v) in &cur.results {
            let v = if noetl_mesh::objects::is_small(v, self.payload_limit()) {
                v.clone()
            } else {
                let id = derive_id(&[
                    &self.cmd.step_run_id,
                    &self.index,
                    "task",
                    name,
                    &cur.steps_taken.to_string(),
                ]);
                self.offload(&id, v).await?
            };
            out.insert(name.clone(), v);
        }
        Ok(out)
    }

    /// `cur.prev`, or its reference when it is above the limit.
    async fn prev_by_reference(&self, cur: &Cursor) -> Result<Value, MeshError> {
        if noetl_mesh::objects::is_small(&cur.prev, self.payload_limit()) {
            return Ok(cur.prev.clone());
        }
        let id = format!(
            "{}.{}.prev.{}",
            self.cmd.step_run_id, self.index, cur.steps_taken
        );
        self.offload(&id, &cur.prev).await
    }

    /// `value`, or its reference under `id` in object storage when it is
    /// above the payload limit (reference-first).
    async fn offload(&self, id: &str, value: &Value) -> Result<Value, MeshError> {
        let put = noetl_mesh::objects::PutParams {
            execution_id: self.eid(),
            step: &self.step.step,
            id,
            value,
        };
        Ok(self
            .mesh()
            .results()
            .offload(put, self.payload_limit())
            .await?)
    }

    /// Key of this iteration's checkpoint.
    fn checkpoint_key(&self) -> String {
        Keys::checkpoint(self.eid(), &self.cmd.step_run_id, &self.index)
    }

    /// Record where this iteration is (after a task that wrote `iter`).
    async fn checkpoint(&self, cur: &Cursor) -> Result<(), MeshError> {
        let ck = Checkpoint {
            steps_taken: cur.steps_taken,
            pc: cur.pc,
            attempt: cur.attempt,
            prev: self.prev_by_reference(cur).await?,
            iter: cur.iter.clone(),
            reduce: cur.reduce.clone(),
            results: self.results_by_reference(cur).await?,
        };
        kv::put(self.mesh().loop_kv(), &self.checkpoint_key(), &ck).await?;
        Ok(())
    }

    /// Resume from this iteration's checkpoint when it is ahead of the
    /// command (the command was redelivered after a crash).
    async fn resume(&self, cur: &mut Cursor) -> Result<(), MeshError> {
        if self.loop_run.is_none() || !self.needs.sets_iter {
            return Ok(());
        }
        // A checkpoint that does not decode is Corrupt (dead-lettered,
        // failing the execution naming its key), never "start from task 0".
        let Some(ck) = kv::get::<Checkpoint>(self.mesh().loop_kv(), &self.checkpoint_key()).await?
        else {
            return Ok(());
        };
        let taken = ck.steps_taken;
        if taken <= cur.steps_taken {
            return Ok(());
        }
        tracing::info!(
            execution_id = %self.eid(),
            step = %self.step.step,
            iteration = %self.index,
            from = cur.steps_taken,
            to = taken,
            "resuming iteration from its checkpoint"
        );
        cur.steps_taken = taken;
        cur.pc = ck.pc;
        cur.attempt = ck.attempt;
        cur.prev = ck.prev;
        cur.iter = ck.iter;
        cur.reduce = ck.reduce;
        cur.results = ck.results;
        Ok(())
    }

    /// The command that continues this step-run at `cur.pc`.
    fn command(&self, cur: &Cursor, attempt: u32, not_before_ms: u64) -> TaskCommand {
        let command_id = derive_id(&[
            "task",
            &self.cmd.step_run_id,
            &self.index,
            &cur.pc.to_string(),
            &attempt.to_string(),
            &cur.steps_taken.to_string(),
        ]);
        let iter_json = || codec::json_bytes(&Value::Object(cur.iter.clone()));
        let iteration = match &self.loop_run {
            Some((loop_run_id, index)) => Some(IterationRef {
                loop_run_id: loop_run_id.clone(),
                index: *index,
                iter_json: iter_json(),
                reduce_json: if cur.reduce.is_empty() {
                    Vec::new()
                } else {
                    codec::json_bytes(&Value::Object(cur.reduce.clone()))
                },
                total: self.loop_total,
            }),
            // Outside loops `iter` is pipeline-local scratch space; it rides
            // along with an empty loop_run_id.
            None if !cur.iter.is_empty() => Some(IterationRef {
                loop_run_id: String::new(),
                index: 0,
                iter_json: iter_json(),
                reduce_json: Vec::new(),
                total: 0,
            }),
            None => None,
        };
        TaskCommand {
            command_id,
            execution_id: self.cmd.execution_id.clone(),
            step: self.step.step.clone(),
            step_run_id: self.cmd.step_run_id.clone(),
            pc: cur.pc as u32,
            attempt,
            args_json: self.cmd.args_json.clone(),
            prev_json: codec::json_bytes(&cur.prev),
            iteration,
            not_before_ms,
            trace_id: self.cmd.trace_id.clone(),
            steps_taken: cur.steps_taken,
            resume_outcome_json: Vec::new(),
            deadline_ms: self.cmd.deadline_ms,
            deadline_of: self.cmd.deadline_of.clone(),
            results_json: if cur.results.is_empty() {
                Vec::new()
            } else {
                codec::json_bytes(&Value::Object(cur.results.clone()))
            },
            claim: None,
        }
    }

    async fn publish(&self, kind: &str, cmd: &TaskCommand) -> Result<PendingAck, MeshError> {
        tracing::debug!(
            execution_id = %self.eid(),
            step = %self.step.step,
            kind,
            pc = cmd.pc,
            attempt = cmd.attempt,
            not_before_ms = cmd.not_before_ms,
            "task command handed off"
        );
        self.mesh()
            .publish_for_execution(
                self.mesh().subjects().task(kind),
                &cmd.command_id,
                self.eid(),
                codec::encode(cmd),
            )
            .await
    }
}

/// The delay still to wait before `not_before_ms`, if it is in the future.
pub fn remaining(not_before_ms: u64) -> Option<Duration> {
    let now = now_ms();
    (not_before_ms > now).then(|| Duration::from_millis(not_before_ms - now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_mesh::state::{ExecStatus, TokenRecord};
    use serde_json::json;

    fn header(status: ExecStatus, live: &[&str]) -> ExecHeader {
        ExecHeader {
            status,
            ..ExecHeader::running(
                "e1",
                live.iter().map(|t| TokenRecord::new(*t, "s")).collect(),
            )
        }
    }

    fn command(iteration: Option<u64>) -> TaskCommand {
        TaskCommand {
            execution_id: "e1".into(),
            step: "s".into(),
            step_run_id: "sr1".into(),
            iteration: iteration.map(|index| IterationRef {
                loop_run_id: "sr1".into(),
                index,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn progress(next: u64, in_flight: &[u64]) -> LoopProgress {
        LoopProgress {
            next,
            in_flight: in_flight.to_vec(),
            cursor: None,
        }
    }

    #[test]
    fn a_command_decodes_its_json_fields() {
        let mut cmd = command(Some(3));
        cmd.args_json = br#"{"n": 1}"#.to_vec();
        cmd.prev_json = b"7".to_vec();
        let it = cmd.iteration.as_mut().unwrap();
        it.iter_json = br#"{"row": {"id": 2}}"#.to_vec();
        it.reduce_json = br#"{"total": 5}"#.to_vec();
        cmd.resume_outcome_json = br#"{"status": "ok", "result": 4}"#.to_vec();
        let d = decode_command(&cmd, "s").unwrap();
        assert_eq!(d.args, json!({"n": 1}));
        assert_eq!(d.prev, json!(7));
        assert_eq!(d.loop_run, Some(("sr1".to_string(), 3)));
        assert_eq!(d.iter["row"], json!({"id": 2}));
        assert_eq!(d.reduce["total"], json!(5));
        assert_eq!(d.resume.unwrap().result, json!(4));
        let plain = decode_command(&command(None), "s").unwrap();
        assert_eq!(plain.args, json!({}));
        assert!(plain.loop_run.is_none() && plain.resume.is_none());
    }

    #[test]
    fn a_command_with_bad_json_is_refused_naming_the_field() {
        let refused = |cmd: &TaskCommand| match decode_command(cmd, "s") {
            Err(HandlerError::Refused(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let mut cmd = command(None);
        cmd.args_json = b"{not json".to_vec();
        let m = refused(&cmd);
        assert!(m.contains("execution e1") && m.contains("\"s\"") && m.contains("args"));
        let mut cmd = command(Some(0));
        cmd.iteration.as_mut().unwrap().iter_json = b"[1]".to_vec();
        assert!(refused(&cmd).contains("iter"));
        let mut cmd = command(None);
        cmd.resume_outcome_json = br#"{"status": "maybe"}"#.to_vec();
        assert!(refused(&cmd).contains("resume outcome"));
    }

    #[test]
    fn raw_fields_pass_unrendered_and_other_fields_render() {
        let task: Task = serde_json::from_value(json!({
            "name": "t", "kind": "python",
            "code": "x = {{ not rendered }}",
            "args": {"n": "{{ workload.n }}"},
        }))
        .unwrap();
        let scope = Scope::new().workload(json!({"n": 3}));
        let out = render_config(&task, &["code"], &scope).unwrap();
        assert_eq!(out["code"], "x = {{ not rendered }}");
        assert_eq!(out["args"], json!({"n": 3}));
    }

    #[test]
    fn a_field_that_does_not_render_is_named() {
        let task: Task = serde_json::from_value(json!({
            "name": "t", "kind": "noop", "result": "{{ nonesuch }}",
        }))
        .unwrap();
        let e = render_config(&task, &[], &Scope::new().workload(json!({}))).unwrap_err();
        assert!(e.starts_with("field `result`: "), "{e}");
    }

    #[test]
    fn a_command_due_later_waits_the_rest() {
        assert_eq!(remaining(0), None);
        let later = remaining(now_ms() + 60_000).expect("in the future");
        assert!(later > Duration::from_secs(50) && later <= Duration::from_secs(60));
    }

    #[test]
    fn a_command_of_a_live_step_run_may_run() {
        let h = header(ExecStatus::Running, &["sr1"]);
        assert_eq!(command_ended(&command(None), Some(&h), None), None);
    }

    #[test]
    fn a_command_whose_step_run_or_execution_ended_is_stale() {
        let gone = header(ExecStatus::Running, &["sr2"]);
        let why = command_ended(&command(None), Some(&gone), None).unwrap();
        assert!(why.contains("step-run sr1 has ended"), "{why}");
        for status in [
            ExecStatus::Completed,
            ExecStatus::Failed,
            ExecStatus::Cancelled,
        ] {
            let h = header(status, &["sr1"]);
            assert!(command_ended(&command(None), Some(&h), None).is_some());
        }
    }

    #[test]
    fn a_command_without_a_header_may_run() {
        // Nothing says its work is over: running it is the safe side.
        assert_eq!(command_ended(&command(None), None, None), None);
    }

    #[test]
    fn an_iteration_runs_until_it_is_counted() {
        let h = header(ExecStatus::Running, &["sr1"]);
        let cmd = command(Some(3));
        assert_eq!(
            command_ended(&cmd, Some(&h), Some(&progress(5, &[3, 4]))),
            None
        );
        // Not dispatched yet by the record's view (a record behind): runs.
        assert_eq!(command_ended(&cmd, Some(&h), Some(&progress(3, &[]))), None);
        let why = command_ended(&cmd, Some(&h), Some(&progress(5, &[4]))).unwrap();
        assert!(
            why.contains("iteration 3 of loop run sr1 was counted"),
            "{why}"
        );
        assert!(command_ended(&cmd, Some(&h), None).is_some());
    }
}
