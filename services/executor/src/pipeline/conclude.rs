//! After a task's call: its policy decides, its `set_ctx` / `set_iter`
//! are applied, and `task.done` reports it.

use noetl_core::policy::{self, Decision, PolicyInput};
use noetl_core::template::Scope;
use noetl_core::Task;
use noetl_mesh::events::EventDraft;
use noetl_mesh::handled::{self, HandledError};
use noetl_mesh::payloads::{EventPayload, LastTask, TaskDone};

use super::invoke::{Called, TaskAt};
use super::{next, Cursor, HandlerError, Pending, StepRun, TaskRun};
use crate::task::{SettleInput, Settled, Who};

/// An error outcome the step-run goes on after (`continue`, `jump`,
/// `break`): kept in the cursor for the step-run's boundary event.
pub(super) fn note_handled(
    cur: &mut Cursor,
    task: &Task,
    outcome: &noetl_core::Outcome,
    decision: &Decision,
) {
    let action = crate::task::action_name(decision);
    if let Some(e) = outcome
        .error
        .as_ref()
        .filter(|_| handled::is_handled(action))
    {
        handled::note(
            &mut cur.handled,
            HandledError::new(&task.name, &e.kind, &e.message, action),
        );
    }
}

impl StepRun<'_> {
    /// After the call: the task's policy decides, its `set_ctx`/`set_iter`
    /// are applied, and `task.done` reports it.
    pub(super) async fn conclude(
        &self,
        cur: &mut Cursor,
        t: &TaskAt<'_>,
        scope: Scope,
        called: Called,
        pending: &mut Pending,
    ) -> Result<TaskRun, HandlerError> {
        let task = t.task;
        let mut outcome = called.outcome;
        let called_start = called.start;
        self.mesh().health().metrics().task_ended(
            &task.kind,
            outcome.is_ok(),
            outcome.meta.duration_ms,
        );
        // The task has run: later tasks (and its own policy) read its
        // result by its name.
        if self.needs.reads.task_results.contains(&task.name) {
            cur.results
                .insert(task.name.clone(), outcome.result.clone());
        }
        let policy_scope = match &task.spec.policy {
            Some(_) => noetl_mesh::decision_scope::policy_scope(
                scope,
                &self.needs.reads,
                &task.name,
                &outcome,
            ),
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
        let mut ctx_log = crate::task::CtxLog::default();
        if let Some(patch) = settled.set_ctx.clone().filter(|p| !p.is_empty()) {
            // Boxed: a large future that most tasks never run.
            let written = Box::pin(self.write_ctx(cur, task, &patch, &t.run_id)).await?;
            ctx_log.reduced = written.reduced;
            // What `ctx` holds, when an earlier delivery applied it.
            let mut patch = patch;
            if let Some(before) = written.applied_before {
                patch.extend(before);
                settled.set_ctx = Some(patch.clone());
            }
            if let Some((kind, message)) = written.error {
                ctx_log.refused = true;
                crate::task::fail_on_ctx_error(&mut outcome, &mut settled, kind, message);
            }
            // The log carries the patch whole: by reference when large.
            let id = format!("task-{}", t.run_id);
            ctx_log.set_ctx_ref =
                noetl_mesh::patches::carry(self.mesh().results(), self.eid(), &id, patch)
                    .await?
                    .reference();
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
        note_handled(cur, task, &outcome, &settled.decision);
        let mut payload = crate::task::done_payload(&outcome, cur.attempt, &settled, ctx_log);
        // The iteration names a parallel loop's `ctx` writer in its claims
        // rebuilt from the log (`noetl_mesh::ctx_owners`).
        payload.index = self.loop_run.as_ref().map(|(_, i)| *i);
        payload.started = called_start;
        pending
            .hold(self, self.held_done(&t.run_id, task, payload))
            .await?;
        Ok(TaskRun {
            iter_changed: settled.set_iter.as_ref().is_some_and(|m| !m.is_empty()),
            ran: next::Ran {
                outcome,
                decision: settled.decision,
                policy_error: settled.policy_error,
            },
        })
    }

    /// Task run `task_run_id`'s `task.done`, held back
    /// ([`super::Pending::hold`]).
    fn held_done(&self, task_run_id: &str, task: &Task, done: TaskDone) -> super::Held {
        super::Held {
            at_ms: noetl_mesh::events::now_ms(),
            last: LastTask {
                task: task.name.clone(),
                task_run_id: task_run_id.to_string(),
                done,
            },
        }
    }

    /// The `task.done` event of held task `last`, as of `at_ms` (when its
    /// task concluded).
    pub(super) fn held_event(&self, last: &LastTask, at_ms: u64) -> noetl_wire::Event {
        let mut event = self
            .task_draft(&last.task_run_id, &last.task)
            .build(&last.done);
        event.ts_ms = at_ms;
        event
    }

    /// Names for a task's messages.
    pub(super) fn who<'t>(&'t self, task: &'t Task) -> Who<'t> {
        Who {
            task: &task.name,
            step: &self.step.step,
        }
    }

    /// No resolved secret reaches an event or KV through a decision: a
    /// fail reason, a policy error (it quotes rendered values) or a patch
    /// that rendered `keychain` directly.
    fn redact_settled(&self, s: &mut Settled) {
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

    /// An event about task run `task_run_id` of `task`.
    pub(super) fn task_event(
        &self,
        task_run_id: &str,
        task: &Task,
        payload: &impl EventPayload,
    ) -> noetl_wire::Event {
        self.task_draft(task_run_id, &task.name).build(payload)
    }

    /// The envelope of an event about task run `task_run_id` of `task`.
    fn task_draft<'s>(&'s self, task_run_id: &'s str, task: &'s str) -> EventDraft<'s> {
        EventDraft {
            execution_id: self.eid(),
            step_run_id: &self.cmd.step_run_id,
            task_run_id,
            step: &self.step.step,
            task,
            trace_id: &self.cmd.trace_id,
            parent_id: &self.cmd.command_id,
            ..Default::default()
        }
    }
}
