//! The template scopes of a step-run, built by the functions a replay
//! re-taking its tasks' policies uses ([`decision_scope`]): the step's,
//! loaded once per command with only what its templates read, and each
//! task's, with what the task's templates read of the cursor.

use noetl_core::template::Scope;
use noetl_core::Task;
use noetl_mesh::{decision_scope, plan::PlanRecord, MeshError};
use serde_json::Value;

use super::{Cursor, Executor, StepRun};
use crate::analysis::StepNeeds;

impl Executor {
    /// The step's template scope before any task (workload, args, the
    /// results of the steps its templates read) and `ctx` when they read
    /// it; only what the templates read is loaded.
    pub(super) async fn base_scope(
        &self,
        plan: &PlanRecord,
        needs: &StepNeeds,
        args: &Value,
    ) -> Result<(Scope, Value), MeshError> {
        decision_scope::step_scope(&self.mesh, plan, &needs.reads, args).await
    }
}

impl StepRun<'_> {
    /// The template scope of a task: the step's, with what the task's
    /// templates read of the cursor.
    pub(super) fn task_scope(&self, cur: &Cursor, task: &Task) -> Scope {
        decision_scope::task_scope(
            &self.base,
            self.plan,
            &self.needs.reads,
            decision_scope::TaskView {
                task: &task.name,
                attempt: cur.attempt,
                ctx: &cur.ctx,
                iter: &cur.iter,
                prev: &cur.prev,
                loop_info: self
                    .loop_run
                    .as_ref()
                    .map(|(_, index)| (*index as usize, self.loop_total as usize)),
                results: &cur.results,
            },
        )
    }

    /// `iter` as templates and tools see it: the iteration's own keys, and
    /// in a child execution the parent task's `iter` as `parent`.
    pub(super) fn iter_view(&self, cur: &Cursor) -> Value {
        decision_scope::iter_view(self.plan, &cur.iter)
    }
}
