//! The scopes the services' decisions render in, over a
//! [`StateSource`] (KV live, the fold of the events in a replay): a
//! boundary's arcs (router), a token's admission (scheduler), a loop's
//! `in` (loop-supervisor), a task's templates and policy (executor).
//! `noetl exec replay --playbook` builds them with the same functions
//! ([`crate::rejudge`]).

use std::collections::BTreeSet;

use noetl_core::template::{self, Scope};
use noetl_core::Step;
use serde_json::{Map, Value};

use crate::plan::PlanRecord;
use crate::scope::{event_scope, strings, StateSource};
use crate::MeshError;

/// The scope a step's arcs render in at boundary event `ev`: workload,
/// `ctx`, the step's `args`, `event` ([`event_scope`]), and the step
/// results `templates` read.
pub async fn arc_scope<S: StateSource>(
    source: &S,
    plan: &PlanRecord,
    ev: &noetl_wire::Event,
    (payload, args): (&Value, &Value),
    templates: &[&str],
) -> Result<Scope, MeshError> {
    let sc = plan
        .template_scope(source, templates.iter().copied(), args)
        .await?;
    Ok(sc.event(event_scope(ev, payload)))
}

/// `event` in an admission rule: the token asking to start the step.
#[derive(serde::Serialize)]
struct TokenView<'a> {
    /// Always `token`.
    name: &'static str,
    step: &'a str,
    args: &'a Value,
    token_id: &'a str,
}

/// The scope a step's admission rules render in for the token `srid`
/// with `args`: workload, `ctx`, `args`, the step results the rules read,
/// `event` (the token) and the execution id.
pub async fn admission_scope<S: StateSource>(
    source: &S,
    plan: &PlanRecord,
    (step, admit): (&Step, &noetl_core::model::Admit),
    args: &Value,
    srid: &str,
) -> Result<Scope, MeshError> {
    // The scope arcs and `loop.in` render in: workload, ctx, args and the
    // results of the steps the rules read by name; `event` is the token.
    let sc = plan
        .template_scope(
            source,
            admit.rules.iter().filter_map(|r| r.when.as_deref()),
            args,
        )
        .await?;
    Ok(sc.event(crate::payloads::to_value(&TokenView {
        name: "token",
        step: &step.step,
        args,
        token_id: srid,
    })))
}

/// The scope a loop's `in` and `max_in_flight` render in (with the
/// loop-supervisor's own `more` templates): workload, `ctx`, the step's
/// args, the step results they read, and in a child playbook the
/// parent's iteration as `iter.parent`.
pub async fn loop_scope<S: StateSource>(
    source: &S,
    plan: &PlanRecord,
    lp: &noetl_core::model::Loop,
    args: &Value,
    more: &[&str],
) -> Result<Scope, MeshError> {
    let mut all = strings(&lp.in_);
    if let Some(m) = &lp.spec.max_in_flight {
        all.extend(strings(m));
    }
    all.extend(more.iter().copied());
    let mut sc = plan.template_scope(source, all, args).await?;
    if !plan.parent_iter.is_null() {
        sc = sc.iter(serde_json::json!({"parent": plan.parent_iter}));
    }
    Ok(sc)
}

/// A step as it runs: its `kind: workbook` calls resolved to their
/// workbook task (an unresolvable call kept as written, with its error,
/// by pipeline index). The executor runs this step, and a replay re-takes
/// its tasks' policies on it.
pub fn as_it_runs(plan: &PlanRecord, step: &Step) -> (Step, Vec<Option<String>>) {
    let workbook = plan.playbook.workbook.as_ref();
    let (tasks, errors): (Vec<noetl_core::Task>, Vec<Option<String>>) = step
        .tool
        .iter()
        .map(|t| match noetl_core::workbook::resolve(workbook, t) {
            Ok(r) => (r, None),
            Err(e) => (t.clone(), Some(e.to_string())),
        })
        .unzip();
    (
        Step {
            tool: tasks,
            ..step.clone()
        },
        errors,
    )
}

/// What a step's templates and conditions read, found once per step (as
/// it runs, [`as_it_runs`]): the executor loads and binds only this, and
/// a replay re-taking a task's policy builds its scope from the same
/// analysis ([`step_scope`], [`task_scope`], [`policy_scope`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepReads {
    /// Every top-level name the step's templates and conditions read: a
    /// runtime variable is bound only when it is read (binding converts
    /// the whole value).
    pub roots: BTreeSet<String>,
    /// Workflow steps read by name, whose last results are loaded (a task
    /// of the pipeline with the same name shadows the step).
    pub steps: Vec<String>,
    /// The pipeline's tasks read by name: their results are bound once
    /// they ran.
    pub task_results: BTreeSet<String>,
    /// The step reads `ctx` somewhere (templates, or raw fields such as
    /// Python code, which receives `ctx` too).
    pub load_ctx: bool,
}

impl StepReads {
    /// Analyse `step` (as it runs) of `plan`.
    pub fn of(plan: &PlanRecord, step: &Step) -> Self {
        let json = serde_json::to_value(step).unwrap_or_default();
        let mut templates: Vec<String> = strings(&json).into_iter().map(str::to_string).collect();
        // Conditions may be bare expressions (`iter.page < 3`).
        for task in &step.tool {
            let rules = task.spec.policy.iter().flat_map(|p| p.rules.iter());
            for when in rules.filter_map(|r| r.when.as_deref()) {
                if !template::is_template(when) {
                    templates.push(format!("{{{{ {when} }}}}"));
                }
            }
        }
        let mut roots = crate::scope::roots(templates.iter().map(String::as_str));
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
        // A patch key named `set_ctx` writes ctx; it does not read it.
        let load_ctx =
            roots.contains("ctx") || json.to_string().replace("set_ctx", "").contains("ctx");
        Self {
            roots,
            steps,
            task_results,
            load_ctx,
        }
    }

    /// True when the step reads the top-level name `name`.
    pub fn reads(&self, name: &str) -> bool {
        self.roots.contains(name)
    }
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

/// The step's template scope before any task, over `source` (KV live, the
/// fold in a replay): the workload, `args` (as templates see them) and the
/// results of the steps it reads, each only when read, with the tasks it
/// reads by name declared (undefined until they ran); and `ctx`, returned
/// apart (the executor carries it in its cursor), `{}` when not read.
pub async fn step_scope<S: StateSource>(
    source: &S,
    plan: &PlanRecord,
    reads: &StepReads,
    args: &Value,
) -> Result<(Scope, Value), MeshError> {
    let mut roots: BTreeSet<String> = reads.steps.iter().cloned().collect();
    if reads.load_ctx {
        roots.insert("ctx".into());
    }
    let loaded = if roots.is_empty() {
        crate::scope::Loaded {
            ctx: Value::Object(Map::new()),
            steps: Map::new(),
        }
    } else {
        let names: Vec<&str> = reads.steps.iter().map(String::as_str).collect();
        // Boxed: this read's future is most of this one's size, and a step
        // that reads nothing would carry it (docs/performance.md "Futures
        // that move").
        Box::pin(crate::scope::load_from(
            source,
            &plan.execution_id,
            &roots,
            &names,
        ))
        .await?
    };
    let mut base = Scope::new().execution_id(plan.execution_id.clone());
    if reads.reads("workload") {
        base = base.workload(plan.workload.clone());
    }
    if reads.reads("args") {
        base = base.args(args.clone());
    }
    for name in &reads.steps {
        base = match loaded.steps.get(name) {
            Some(v) => base.step_result(name.clone(), v.clone()),
            None => base.declare(name.clone()),
        };
    }
    for name in &reads.task_results {
        base = base.declare(name.clone());
    }
    Ok((base, loaded.ctx))
}

/// Where a step-run is when one of its tasks runs: what the task's
/// templates read beyond the step's scope.
pub struct TaskView<'a> {
    /// The task's name.
    pub task: &'a str,
    /// Its 1-based attempt.
    pub attempt: u32,
    /// `ctx` as the step-run sees it.
    pub ctx: &'a Value,
    /// The iteration's own `iter` keys.
    pub iter: &'a Map<String, Value>,
    /// The previous task's result.
    pub prev: &'a Value,
    /// `(index, total)` of the loop iteration, if in one.
    pub loop_info: Option<(usize, usize)>,
    /// The results of the pipeline's tasks read by name that ran.
    pub results: &'a Map<String, Value>,
}

/// `iter` as templates and tools see it: the iteration's own keys, and in
/// a child execution the parent task's `iter` as `parent`.
pub fn iter_view(plan: &PlanRecord, iter: &Map<String, Value>) -> Value {
    let mut m = iter.clone();
    if !plan.parent_iter.is_null() {
        m.insert("parent".into(), plan.parent_iter.clone());
    }
    Value::Object(m)
}

/// The template scope of a task: the step's (`base`), with what the
/// step reads of `view`.
pub fn task_scope(base: &Scope, plan: &PlanRecord, reads: &StepReads, view: TaskView<'_>) -> Scope {
    let mut scope = base
        .clone()
        .task(view.task.to_string())
        .attempt(view.attempt);
    if reads.reads("ctx") {
        scope = scope.ctx(view.ctx.clone());
    }
    if reads.reads("iter") {
        scope = scope.iter(iter_view(plan, view.iter));
    }
    if reads.reads("_prev") {
        scope = scope.prev(view.prev.clone());
    }
    if reads.reads("loop") {
        if let Some((index, total)) = view.loop_info.filter(|(_, total)| *total > 0) {
            scope = scope.loop_info(index, total);
        }
    }
    for (name, result) in view.results {
        scope = scope.step_result(name.clone(), result.clone());
    }
    scope
}

/// The scope a task's policy decides in: the task's, with its own result
/// under its name and `outcome` (each when the step reads it: `outcome`
/// also when it reads `output`, which is made from it).
pub fn policy_scope(
    task: Scope,
    reads: &StepReads,
    name: &str,
    outcome: &noetl_core::Outcome,
) -> Scope {
    let scope = if reads.task_results.contains(name) {
        task.step_result(name.to_string(), outcome.result.clone())
    } else {
        task
    };
    if reads.reads("outcome") || reads.reads("output") {
        scope.outcome(outcome)
    } else {
        scope
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads_of(policy_when: &str) -> StepReads {
        let yaml = format!(
            "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{ name: p }}\nworkflow:\n  - step: start\n    tool:\n      - name: t\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - when: \"{policy_when}\"\n                then: {{ set_ctx: {{ a: 1 }} }}\n"
        );
        let playbook = noetl_core::load::load_playbook(&yaml, "p.yaml")
            .unwrap()
            .playbook;
        let plan = PlanRecord::new("e1".into(), "p.yaml".into(), playbook, Value::Null);
        let step = plan.step("start").expect("start").clone();
        StepReads::of(&plan, &step)
    }

    #[test]
    fn the_policy_scope_holds_the_outcome_only_for_a_step_that_reads_it() {
        let outcome = noetl_core::Outcome::ok(serde_json::json!({"n": 1}));
        for (when, bound) in [
            ("{{ outcome.status == 'ok' }}", true),
            ("{{ output.data.n == 1 }}", true),
            ("{{ true }}", false),
        ] {
            let reads = reads_of(when);
            let scope = policy_scope(Scope::new(), &reads, "t", &outcome);
            assert_eq!(scope.contains("outcome"), bound, "{when}");
            if bound {
                let rendered = noetl_core::template::render_str(when, &scope).unwrap();
                assert_eq!(rendered, Value::Bool(true), "{when} reads the outcome");
            }
        }
    }
}
