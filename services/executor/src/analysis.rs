//! What a step needs loaded before its tasks run, computed once per
//! (playbook, step) and cached: serialising a step and scanning its
//! templates costs far more than the cache lookup, and it runs per message.
//! It depends on the playbook alone (never on the workload or the
//! execution), so the executions of one playbook share it.

use std::sync::Arc;

use noetl_core::{merge, Step, Task};
use noetl_mesh::cache::Bounded;
use noetl_mesh::decision_scope::{self, StepReads};
use noetl_mesh::plan::PlanRecord;
use serde_json::Value;

/// Steps whose needs are kept (playbooks are immutable, so an evicted
/// entry is simply computed again).
const CAPACITY: usize = 4096;

/// What one step's tasks read from outside the command.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepNeeds {
    /// What its templates and conditions read: the analysis a replay of
    /// its tasks' policies shares ([`decision_scope::StepReads`]).
    pub reads: StepReads,
    /// The effective spec of each task (`merge::effective_task_spec` with
    /// kind defaults `{}`), by pipeline index.
    pub specs: Vec<Value>,
    /// Some task policy writes `iter` (the pagination pattern): loop
    /// iterations of this step checkpoint their cursor.
    pub sets_iter: bool,
    /// Some task names a credential in `auth`: the keychain is resolved.
    pub uses_auth: bool,
    /// The pipeline as it runs: `kind: workbook` calls resolved to their
    /// workbook task (an unresolvable call keeps its error, and fails the
    /// step when reached).
    pub tasks: Vec<Task>,
    /// Per task: why its workbook call cannot be resolved.
    pub task_errors: Vec<Option<String>>,
}

impl StepNeeds {
    /// Analyse `step` of `plan`.
    pub fn of(plan: &PlanRecord, step: &Step) -> Self {
        // Analyse the step as it runs (workbook tasks included).
        let (resolved, task_errors) = decision_scope::as_it_runs(plan, step);
        let step = &resolved;
        let reads = StepReads::of(plan, step);
        let no_defaults = Value::Object(Default::default());
        let specs = step
            .tool
            .iter()
            .map(|t| merge::effective_task_spec(&no_defaults, &plan.playbook, step, t))
            .collect();
        let sets_iter = step
            .tool
            .iter()
            .flat_map(|t| t.spec.policy.iter().flat_map(|p| p.rules.iter()))
            .any(|r| {
                r.then
                    .set_iter
                    .as_ref()
                    .map(|m| !m.is_empty())
                    .unwrap_or(false)
            });
        let uses_auth = step.tool.iter().any(names_a_credential);
        Self {
            reads,
            specs,
            sets_iter,
            uses_auth,
            tasks: resolved.tool.clone(),
            task_errors,
        }
    }

    /// True when the step reads the top-level name `name`.
    pub fn reads(&self, name: &str) -> bool {
        self.reads.reads(name)
    }
}

/// `auth` of the task, or inside one of its mapping fields (a transfer's
/// `source.auth`), or of its `script.source`: the keychain is resolved.
fn names_a_credential(t: &Task) -> bool {
    t.config.contains_key("auth")
        || t.config
            .values()
            .any(|v| v.as_object().is_some_and(|m| m.contains_key("auth")))
        || t.config
            .get("script")
            .and_then(|s| s.pointer("/source/auth"))
            .is_some()
}

/// A bounded cache of [`StepNeeds`] by playbook ([`PlanRecord::playbook_digest`])
/// and step (a resume that stores another playbook gets another digest).
pub struct NeedsCache {
    inner: Bounded<NeedsKey, Arc<StepNeeds>>,
}

impl Default for NeedsCache {
    fn default() -> Self {
        Self {
            inner: Bounded::new(CAPACITY),
        }
    }
}

/// The playbook's digest, the step's name.
type NeedsKey = ([u8; 32], String);

impl NeedsCache {
    /// The needs of `step` in `plan`, computed on first use.
    pub fn get(&self, plan: &PlanRecord, step: &Step) -> Arc<StepNeeds> {
        let key = (plan.playbook_digest(), step.step.clone());
        if let Some(n) = self.inner.get(&key) {
            return n;
        }
        let needs = Arc::new(StepNeeds::of(plan, step));
        self.inner.insert(key, needs.clone());
        needs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(workflow: Value) -> PlanRecord {
        PlanRecord::new(
            "e".into(),
            "t.yaml".into(),
            serde_json::from_value(json!({
                "apiVersion": "noetl.io/v2", "kind": "Playbook",
                "metadata": {"name": "t"}, "workflow": workflow,
            }))
            .unwrap(),
            json!({}),
        )
    }

    #[test]
    fn finds_what_a_step_reads() {
        let p = plan(json!([
            {"step": "fetch", "tool": [{"name": "a", "kind": "noop"}]},
            {"step": "use", "tool": [
                {"name": "x", "kind": "noop", "result": "{{ fetch.rows }} {{ workload.n }}",
                 "spec": {"timeout": 3, "policy": {"rules": [
                    {"when": "iter.page < 3", "then": {"do": "continue", "set_ctx": {"k": 1}}}]}}},
            ]},
            {"step": "py", "tool": [{"name": "p", "kind": "python", "code": "result = ctx['k']"}]},
        ]));
        let use_ = StepNeeds::of(&p, p.playbook.step("use").unwrap());
        assert_eq!(use_.reads.steps, ["fetch"]);
        assert!(use_.reads("workload") && use_.reads("iter") && use_.reads("fetch"));
        assert!(!use_.reads("_prev") && !use_.reads("ctx"));
        assert!(!use_.reads.load_ctx, "writing ctx is not reading it");
        assert_eq!(use_.specs[0]["timeout"], 3);
        let py = StepNeeds::of(&p, p.playbook.step("py").unwrap());
        assert!(py.reads.load_ctx, "python code receives ctx");
        assert!(py.reads.steps.is_empty());
        assert!(!py.reads("workload"), "nothing reads it");
    }

    #[test]
    fn a_name_that_may_be_a_workload_key_read_bare_loads_the_workload() {
        let p = plan(json!([
            {"step": "fetch", "tool": [{"name": "a", "kind": "noop", "result": "{{ label }}"}]},
            {"step": "use", "tool": [{"name": "b", "kind": "noop", "result": "{{ fetch.rows }} {{ _index }}"}]},
        ]));
        assert!(StepNeeds::of(&p, p.playbook.step("fetch").unwrap()).reads("workload"));
        let use_ = StepNeeds::of(&p, p.playbook.step("use").unwrap());
        assert!(
            !use_.reads("workload"),
            "steps and runtime variables are no workload keys"
        );
    }

    #[test]
    fn a_task_read_by_name_is_kept_and_shadows_a_step_of_that_name() {
        let p = plan(json!([
            {"step": "fetch", "tool": [{"name": "a", "kind": "noop"}]},
            {"step": "use", "tool": [
                {"name": "fetch", "kind": "noop"},
                {"name": "b", "kind": "noop", "result": "{{ fetch.rows }}"},
                {"name": "c", "kind": "noop"},
            ]},
        ]));
        let n = StepNeeds::of(&p, p.playbook.step("use").unwrap());
        assert_eq!(n.reads.task_results.iter().collect::<Vec<_>>(), ["fetch"]);
        assert!(n.reads.steps.is_empty(), "the task shadows step `fetch`");
        assert!(!n.reads("workload"), "a task name is no workload key");
    }

    #[test]
    fn the_executions_of_one_playbook_share_a_step_s_needs() {
        let wf =
            json!([{"step": "a", "tool": [{"name": "t", "kind": "noop", "x": "{{ ctx.n }}"}]}]);
        let cache = NeedsCache::default();
        let first = plan(wf.clone());
        let mut second = plan(wf);
        second.execution_id = "e2".into();
        second.workload = json!({"other": 1});
        let step = first.playbook.workflow[0].clone();
        let a = cache.get(&first, &step);
        assert!(Arc::ptr_eq(&a, &cache.get(&second, &step)), "one analysis");
        assert!(a.reads("ctx"));
        let other = plan(
            json!([{"step": "a", "tool": [{"name": "t", "kind": "noop", "x": "{{ workload.m }}"}]}]),
        );
        let b = cache.get(&other, &other.playbook.workflow[0]);
        assert!(!Arc::ptr_eq(&a, &b), "another playbook, its own");
        assert!(b.reads("workload") && !b.reads("ctx"));
    }
}
