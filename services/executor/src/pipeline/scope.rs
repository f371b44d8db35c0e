//! The template scopes of a step-run: the step's, loaded once per
//! command with only what its templates read, and each task's, with what
//! the task's templates read of the cursor.

use std::collections::BTreeSet;

use noetl_core::template::Scope;
use noetl_core::Task;
use noetl_mesh::{plan::PlanRecord, scope, MeshError};
use serde_json::{Map, Value};

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

impl StepRun<'_> {
    /// The template scope of a task: the step's, with what the task's
    /// templates read of the cursor.
    pub(super) fn task_scope(&self, cur: &Cursor, task: &Task) -> Scope {
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

    /// `iter` as templates and tools see it: the iteration's own keys, and
    /// in a child execution the parent task's `iter` as `parent`.
    pub(super) fn iter_view(&self, cur: &Cursor) -> Value {
        let mut m = cur.iter.clone();
        if !self.plan.parent_iter.is_null() {
            m.insert("parent".into(), self.plan.parent_iter.clone());
        }
        Value::Object(m)
    }
}
