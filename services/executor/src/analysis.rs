//! What a step needs loaded before its tasks run, computed once per
//! (execution, step) and cached: serialising a step and scanning its
//! templates costs far more than the cache lookup, and it runs per message.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use noetl_core::{merge, template, Step, Task};
use noetl_mesh::{plan::PlanRecord, scope};
use serde_json::Value;

/// Entries kept before the cache is cleared (plans are immutable, so a
/// cleared entry is simply computed again).
const CAPACITY: usize = 4096;

/// What one step's tasks read from outside the command.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepNeeds {
    /// The step reads `ctx` somewhere (templates, or raw fields such as
    /// Python code, which receives `ctx` too), so `ctx` must be loaded.
    pub load_ctx: bool,
    /// Names of workflow steps the step's templates reference at top level;
    /// their last results are read from the execution bucket. A task of
    /// this pipeline with the same name shadows the step.
    pub steps: Vec<String>,
    /// Names of this pipeline's tasks its templates read at top level
    /// (`{{ fetch.rows }}` after task `fetch`): their results are kept in
    /// the cursor once they ran and travel with the pipeline.
    pub task_results: BTreeSet<String>,
    /// Every top-level name the step's templates and conditions read: a
    /// runtime variable is bound in the scope only when it is read (binding
    /// converts the whole value).
    pub roots: BTreeSet<String>,
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
        let workbook = plan.playbook.workbook.as_ref();
        let (tasks, task_errors): (Vec<Task>, Vec<Option<String>>) = step
            .tool
            .iter()
            .map(|t| match noetl_core::workbook::resolve(workbook, t) {
                Ok(r) => (r, None),
                Err(e) => (t.clone(), Some(e.to_string())),
            })
            .unzip();
        // Analyse the step as it runs (workbook tasks included).
        let resolved = Step {
            tool: tasks.clone(),
            ..step.clone()
        };
        let step = &resolved;
        let json = serde_json::to_value(step).unwrap_or_default();
        let mut templates: Vec<String> = scope::strings(&json)
            .into_iter()
            .map(str::to_string)
            .collect();
        // Conditions may be bare expressions (`iter.page < 3`).
        for task in &step.tool {
            let rules = task.spec.policy.iter().flat_map(|p| p.rules.iter());
            for when in rules.filter_map(|r| r.when.as_deref()) {
                if !template::is_template(when) {
                    templates.push(format!("{{{{ {when} }}}}"));
                }
            }
        }
        let mut roots = scope::roots(templates.iter().map(String::as_str));
        // Runtime variables shadow task names; task names shadow steps and
        // workload keys (docs/dsl.md, "Runtime variables").
        let task_results: BTreeSet<String> = step
            .tool
            .iter()
            .map(|t| t.name.clone())
            .filter(|n| roots.contains(n) && !template::RUNTIME_VARIABLES.contains(&n.as_str()))
            .collect();
        // A name that is no runtime variable, step or task may be a
        // workload key read bare (docs/dsl.md, "Names read bare"): load
        // the workload.
        let bare = roots.iter().any(|r| {
            !template::RUNTIME_VARIABLES.contains(&r.as_str())
                && plan.step(r).is_none()
                && !task_results.contains(r)
        });
        if bare {
            roots.insert("workload".to_string());
        }
        let steps = roots
            .iter()
            .filter(|name| {
                plan.step(name).is_some() && !is_builtin(name) && !task_results.contains(*name)
            })
            .cloned()
            .collect();
        let no_defaults = Value::Object(Default::default());
        let specs = step
            .tool
            .iter()
            .map(|t| merge::effective_task_spec(&no_defaults, &plan.playbook, step, t))
            .collect();
        // A patch key named `set_ctx` writes ctx; it does not read it.
        let load_ctx =
            roots.contains("ctx") || json.to_string().replace("set_ctx", "").contains("ctx");
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
            load_ctx,
            steps,
            task_results,
            roots,
            specs,
            sets_iter,
            uses_auth,
            tasks,
            task_errors,
        }
    }

    /// True when the step reads the top-level name `name`.
    pub fn reads(&self, name: &str) -> bool {
        self.roots.contains(name)
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

/// Names the pipeline scope defines itself (a step with such a name is
/// shadowed, never loaded).
fn is_builtin(name: &str) -> bool {
    matches!(
        name,
        "workload"
            | "keychain"
            | "ctx"
            | "iter"
            | "args"
            | "_task"
            | "_prev"
            | "_attempt"
            | "outcome"
    )
}

/// A bounded cache of [`StepNeeds`] by execution, step and plan (a
/// resume may store another plan: its start time differs).
#[derive(Default)]
pub struct NeedsCache {
    inner: Mutex<HashMap<NeedsKey, Arc<StepNeeds>>>,
}

/// Execution id, step name, the plan's `started_ms`.
type NeedsKey = (String, String, u64);

impl NeedsCache {
    /// The needs of `step` in `plan`, computed on first use.
    pub fn get(&self, plan: &PlanRecord, step: &Step) -> Arc<StepNeeds> {
        let key = (
            plan.execution_id.clone(),
            step.step.clone(),
            plan.started_ms,
        );
        if let Some(n) = self.lock().get(&key) {
            return n.clone();
        }
        let needs = Arc::new(StepNeeds::of(plan, step));
        let mut map = self.lock();
        if map.len() >= CAPACITY {
            map.clear();
        }
        map.insert(key, needs.clone());
        needs
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NeedsKey, Arc<StepNeeds>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
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
        assert_eq!(use_.steps, ["fetch"]);
        assert!(use_.reads("workload") && use_.reads("iter") && use_.reads("fetch"));
        assert!(!use_.reads("_prev") && !use_.reads("ctx"));
        assert!(!use_.load_ctx, "writing ctx is not reading it");
        assert_eq!(use_.specs[0]["timeout"], 3);
        let py = StepNeeds::of(&p, p.playbook.step("py").unwrap());
        assert!(py.load_ctx, "python code receives ctx");
        assert!(py.steps.is_empty());
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
        assert_eq!(n.task_results.iter().collect::<Vec<_>>(), ["fetch"]);
        assert!(n.steps.is_empty(), "the task shadows step `fetch`");
        assert!(!n.reads("workload"), "a task name is no workload key");
    }
}
