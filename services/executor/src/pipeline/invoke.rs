//! Running one task: its `task.started` event (held back while the task
//! is quick), its config rendered, its tool called within the step-run's
//! deadline (or its child execution started), then [`StepRun::conclude`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use noetl_core::lifecycle::{self, Due};
use noetl_core::template::Scope;
use noetl_core::tool::{AuthCredential, Tool, ToolCall, ToolReturn};
use noetl_core::{Outcome, OutcomeMeta, Task};
use noetl_mesh::{
    codec,
    events::{now_ms, now_rfc3339},
    ids::{self, TaskRunAt},
    payloads::{AttemptStart, TaskStarted, TASK_START_DEFERRAL_MS},
};
use serde_json::{Map, Value};
use tracing::Instrument;

use super::{Cursor, HandlerError, Pending, StepRun, TaskRun};
use crate::call::{call_tool, call_tool_within, render_config};

/// The task being run, with its run id and tracing span.
pub(super) struct TaskAt<'a> {
    pub task: &'a Task,
    pub run_id: String,
    pub span: tracing::Span,
}

/// What calling a task's tool (or its child execution) produced.
pub(super) struct Called {
    pub outcome: Outcome,
    /// When the tool asks for a retry no sooner than this.
    pub retry_after: Option<Duration>,
    /// Set when the step-run's deadline cut the tool call short.
    pub out_of_time: Option<String>,
    /// The attempt's start, when no `task.started` was written for it
    /// (its `task.done` records it).
    pub start: Option<AttemptStart>,
}

impl Called {
    /// An outcome known without calling the tool: a child execution's,
    /// or the error of a task that could not be called.
    fn known(outcome: Outcome) -> Self {
        Called {
            outcome,
            retry_after: None,
            out_of_time: None,
            start: None,
        }
    }
}

/// An attempt's `task.started`: written, or held back until the task has
/// run for [`TASK_START_DEFERRAL_MS`]. A held-back start is only its
/// payload and time: most attempts end before the deferral, and their
/// `task.done` records the start, so the event is built only when it is
/// written.
enum Start {
    Written,
    Deferred { at_ms: u64, payload: TaskStarted },
}

/// Whether a task of `kind` hands its step-run off (a child execution, a
/// wait for a signal): its `task.started` is how what it started is found
/// (`noetl_router::children`), so it is written at once.
fn hands_off(kind: &str) -> bool {
    kind == "playbook" || kind == noetl_mesh::signal::WAIT_KIND
}

/// The id of the task run at `cur` (its task, attempt and the task runs
/// before it) of iteration `index` (`""` outside loops) of step-run `srid`:
/// deterministic, so a redelivered command republishes the same events,
/// and an iteration's events can be followed from a cursor
/// ([`super::checkpoint`]).
pub(super) fn task_run_id(srid: &str, index: &str, cur: &Cursor) -> String {
    ids::task_run_id(
        srid,
        index,
        TaskRunAt {
            pc: cur.pc,
            attempt: cur.attempt,
            steps_taken: cur.steps_taken,
        },
    )
}

impl StepRun<'_> {
    /// Run task `cur.pc` once: events, tool call, policy, patches. `None`
    /// when the task started a child execution and the step-run waits.
    pub(super) async fn run_task(
        &self,
        cur: &mut Cursor,
        task: &Task,
        tool: &Arc<dyn Tool>,
        pending: &mut Pending,
    ) -> Result<Option<TaskRun>, HandlerError> {
        let t = TaskAt {
            task,
            run_id: task_run_id(&self.cmd.step_run_id, &self.index, cur),
            span: tracing::info_span!(
                "task",
                execution_id = %self.eid(),
                step = %self.step.step,
                task = %task.name,
                attempt = cur.attempt,
            ),
        };
        let resumed = cur.resume.take();
        // The attempt's start: a task that hands its step-run off (a child
        // execution, a wait) announces it at once, since what it started
        // is found from it; any other writes `task.started` only when it
        // is still running after the deferral, else its `task.done` says
        // when it started (one stored event for a quick task).
        let mut start = match resumed {
            Some(_) => Start::Written, // when the child was started
            None => {
                let payload = TaskStarted {
                    attempt: cur.attempt,
                    pc: cur.pc,
                    kind: task.kind.clone(),
                };
                // A redelivered command writes its starts at once: the
                // first delivery may have written them (the same ids).
                if hands_off(&task.kind) || self.redelivered {
                    let ev = self.task_event(&t.run_id, task, &payload);
                    pending.push(Box::pin(self.mesh().emit(&ev)).await?);
                    Start::Written
                } else {
                    Start::Deferred {
                        at_ms: now_ms(),
                        payload,
                    }
                }
            }
        };
        let scope = self.task_scope(cur, task);
        let started_at = now_rfc3339();
        let clock = Instant::now();
        let mut called = match resumed {
            // A child execution ended: its outcome is this task's.
            Some(outcome) => Called::known(outcome),
            None => {
                // Pinned here and lent: a future moved into another is
                // kept twice in its caller's (docs/performance.md
                // "Futures that move").
                let (called, announced) = {
                    let invoked = std::pin::pin!(self.invoke(cur, &t, tool, &scope, pending));
                    self.announcing(invoked, &t, &mut start).await?
                };
                if let Some(ack) = announced {
                    pending.push(ack);
                }
                match called {
                    Some(called) => called,
                    None => return Ok(None),
                }
            }
        };
        called.start = match start {
            Start::Deferred { at_ms, payload } => Some(AttemptStart {
                pc: payload.pc,
                kind: payload.kind,
                at_ms,
            }),
            Start::Written => None,
        };
        called.outcome.meta = OutcomeMeta {
            attempt: cur.attempt,
            duration_ms: clock.elapsed().as_millis() as u64,
            started_at,
            trace_id: self.trace_id(),
        };
        crate::secrets::redact_outcome(&mut called.outcome, &self.secrets);
        self.conclude(cur, &t, scope, called, pending)
            .await
            .map(Some)
    }

    /// Await a task's call; if it is still running after
    /// [`TASK_START_DEFERRAL_MS`], publish its deferred `task.started` (its
    /// time the attempt's start) and go on waiting. Returns the call's
    /// result and the ack of the start, when it was published.
    async fn announcing<T>(
        &self,
        mut call: std::pin::Pin<&mut impl std::future::Future<Output = Result<T, HandlerError>>>,
        t: &TaskAt<'_>,
        start: &mut Start,
    ) -> Result<(T, Option<noetl_mesh::PendingAck>), HandlerError> {
        let Start::Deferred { at_ms, payload } = &*start else {
            return Ok((call.await?, None));
        };
        let deferral = Duration::from_millis(TASK_START_DEFERRAL_MS);
        tokio::select! {
            biased;
            done = &mut call => return Ok((done?, None)),
            () = tokio::time::sleep(deferral) => {}
        }
        let mut ev = self.task_event(&t.run_id, t.task, payload);
        ev.ts_ms = *at_ms;
        let ack = Box::pin(self.mesh().emit(&ev)).await?;
        *start = Start::Written;
        Ok((call.await?, Some(ack)))
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
        let failed = |outcome| Ok(Some(Called::known(outcome)));
        let config = match render_config(task, tool.raw_fields(), scope) {
            Ok(config) => config,
            Err(message) => return failed(who.error("template", &message)),
        };
        let config = match crate::script::load_into(&task.kind, config, &self.credentials).await {
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
        if task.kind == noetl_mesh::signal::WAIT_KIND {
            return match self.start_wait(cur, t, &config).await? {
                Ok(()) => Ok(None),
                Err(message) => failed(who.error("wait.config", &message)),
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
            start: None,
        }))
    }

    /// A task's tool call, its config rendered.
    fn tool_call(
        &self,
        cur: &Cursor,
        task: &Task,
        config: Map<String, Value>,
        auth: Option<AuthCredential>,
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
        let Some(d) = &self.deadline else {
            return (call_tool(tool, call).instrument(span.clone()).await, None);
        };
        let left = match lifecycle::due(d.at_ms, now_ms()) {
            Due::In(left) => left,
            Due::Now => Duration::ZERO,
        };
        match call_tool_within(tool, call, left)
            .instrument(span.clone())
            .await
        {
            Some(r) => (r, None),
            None => {
                let message =
                    lifecycle::timeout_error(d, &self.step.step, Some(&task.name)).message;
                let r =
                    ToolReturn::from(Outcome::error(lifecycle::TIMEOUT, message.clone(), false));
                (r, Some(message))
            }
        }
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
        let child_id = noetl_mesh::ids::child_execution_id(task_run_id);
        let here = super::next::At {
            pc: cur.pc,
            attempt: cur.attempt,
        };
        let req = match crate::child::request(crate::child::ChildParams {
            raw: &task.config,
            config,
            secrets: &self.secrets,
            child_id: child_id.clone(),
            parent_id: self.eid(),
            trace_id: &self.cmd.trace_id,
            resume: self.command(cur, here, 0),
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

    /// Store the waiter of a `wait` task; the step-run waits until a
    /// signal or the timeout continues it at this task. `Err` names a
    /// field problem.
    async fn start_wait(
        &self,
        cur: &mut Cursor,
        t: &TaskAt<'_>,
        config: &Map<String, Value>,
    ) -> Result<Result<(), String>, HandlerError> {
        let wait = match crate::wait::config(config) {
            Ok(w) => w,
            Err(e) => return Ok(Err(e)),
        };
        self.spill_prev(cur).await?;
        let here = super::next::At {
            pc: cur.pc,
            attempt: cur.attempt,
        };
        let now = noetl_mesh::events::now_ms();
        let waiter = noetl_mesh::signal::Waiter {
            signal: wait.signal,
            step: self.step.step.clone(),
            step_run_id: self.cmd.step_run_id.clone(),
            task: t.task.name.clone(),
            task_run_id: t.run_id.clone(),
            since: now_rfc3339(),
            timeout_at_ms: wait
                .timeout_s
                .map(|s| now.saturating_add((s * 1000.0) as u64)),
            schema: wait.schema,
            command: noetl_mesh::commands::park_command(&self.command(cur, here, 0)),
            delivered: None,
        };
        tracing::info!(
            execution_id = %self.eid(),
            step = %self.step.step,
            signal = %waiter.signal,
            "waiting for a signal"
        );
        self.mesh().wait_for(self.eid(), &waiter).await?;
        Ok(Ok(()))
    }
}
