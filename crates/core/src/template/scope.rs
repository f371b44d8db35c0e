//! The render context ([`Scope`]) and the root object templates read.

use super::*;

/// The render context: the runtime variables (docs/dsl.md) plus earlier step
/// results addressable by step name (`{{ fetch.rows }}`).
///
/// Builder methods convert each JSON value once; the scope is then cheap to
/// clone (two `Arc`s), so build a base scope per execution (`workload`,
/// `keychain`) and clone it to add per-message variables.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub(super) vars: Arc<BTreeMap<String, MjValue>>,
    pub(super) declared: Arc<BTreeSet<String>>,
}

impl Scope {
    /// An empty scope.
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds any top-level name (a step result, or a runtime variable).
    pub fn var(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        let value: Value = value.into();
        Arc::make_mut(&mut self.vars).insert(name.into(), MjValue::from(Serde(&value)));
        self
    }

    /// `workload`: the immutable merged inputs.
    pub fn workload(self, value: impl Into<Value>) -> Self {
        self.var("workload", value)
    }

    /// `keychain`: resolved credentials (read-only).
    pub fn keychain(self, value: impl Into<Value>) -> Self {
        self.var("keychain", value)
    }

    /// `ctx`: the execution context.
    pub fn ctx(self, value: impl Into<Value>) -> Self {
        self.var("ctx", value)
    }

    /// `iter`: the iteration context (may hold `parent` for nested loops);
    /// its `index` is also `_index`.
    pub fn iter(self, value: impl Into<Value>) -> Self {
        let value: Value = value.into();
        let index = value.get("index").cloned();
        let sc = self.var("iter", value);
        match index {
            Some(i) => sc.var("_index", i),
            None => sc,
        }
    }

    /// `args`: the token payload / arc inscription of the step-run.
    pub fn args(self, value: impl Into<Value>) -> Self {
        self.var("args", value)
    }

    /// `_task`: the current task label.
    pub fn task(self, name: impl Into<String>) -> Self {
        self.var("_task", name.into())
    }

    /// `_prev`: the previous task's `outcome.result`.
    pub fn prev(self, value: impl Into<Value>) -> Self {
        self.var("_prev", value)
    }

    /// `_attempt`: the 1-based attempt number of the current task.
    pub fn attempt(self, attempt: u32) -> Self {
        self.var("_attempt", attempt)
    }

    /// `outcome`: the current task's outcome envelope (policy evaluation);
    /// also `output`, with the result as `output.data` too (made when a
    /// template reads it).
    pub fn outcome(self, outcome: &Outcome) -> Self {
        let value = serde_json::to_value(outcome).unwrap_or(Value::Null);
        self.var("outcome", value)
    }

    /// `event`: the boundary event (server-side routing); also `output`,
    /// its result envelope (`status`, `data`, `error`; made when a template
    /// reads it).
    pub fn event(self, value: impl Into<Value>) -> Self {
        self.var("event", value)
    }

    /// `loop`: `{index, first, last, length}` where `index` is the 0-based
    /// position of the current iteration (as `iter.index`).
    pub fn loop_info(self, index: usize, length: usize) -> Self {
        self.var(
            "loop",
            serde_json::json!({
                "index": index,
                "first": index == 0,
                "last": index + 1 == length,
                "length": length,
            }),
        )
    }

    /// `execution_id`.
    pub fn execution_id(self, id: impl Into<String>) -> Self {
        self.var("execution_id", id.into())
    }

    /// The result of an earlier step, addressable as `{{ <name>.<field> }}`.
    pub fn step_result(self, name: impl Into<String>, result: impl Into<Value>) -> Self {
        self.var(name, result)
    }

    /// Declares a top-level name as known without binding it (e.g. a step
    /// that has not run yet): value templates then see it as undefined
    /// instead of failing with [`TemplateError::UndefinedVariable`].
    pub fn declare(mut self, name: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.declared).insert(name.into());
        self
    }

    /// Declares every name of `names` ([`Scope::declare`]) at once; a
    /// scope that declared nothing yet shares the set instead of copying it.
    pub fn declare_all(mut self, names: Arc<BTreeSet<String>>) -> Self {
        if self.declared.is_empty() {
            self.declared = names;
        } else {
            Arc::make_mut(&mut self.declared).extend(names.iter().cloned());
        }
        self
    }

    /// True when `name` is bound.
    pub fn contains(&self, name: &str) -> bool {
        self.vars.contains_key(name)
    }

    /// The JSON value bound to `name`, if any.
    pub fn get(&self, name: &str) -> Option<Value> {
        self.vars
            .get(name)
            .and_then(|v| serde_json::to_value(v).ok())
    }

    pub(super) fn knows(&self, name: &str) -> bool {
        self.vars.contains_key(name)
            || self.declared.contains(name)
            || RUNTIME_VARIABLES.contains(&name)
            || workload_key(&self.vars, name).is_some()
    }

    pub(super) fn context(&self) -> MjValue {
        MjValue::from_object(Root {
            vars: self.vars.clone(),
            declared: self.declared.clone(),
        })
    }
}

/// `output`, the result envelope of the engine-internals scope, from an
/// outcome or a boundary event: its `status` (`ok`/`error`; an event
/// without one is `error` when it is a failure), its result as `data` (and
/// `result`), and its `error`.
pub fn output_view(v: &Value) -> Value {
    let status = match v.get("status").and_then(Value::as_str) {
        Some(s) => s.to_string(),
        None => {
            let failed = v
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.ends_with(".failed"));
            if failed { "error" } else { "ok" }.to_string()
        }
    };
    let result = v.get("result").cloned().unwrap_or(Value::Null);
    let mut out = serde_json::Map::new();
    out.insert("status".into(), Value::String(status));
    out.insert("data".into(), result.clone());
    out.insert("result".into(), result);
    out.insert(
        "error".into(),
        v.get("error").cloned().unwrap_or(Value::Null),
    );
    Value::Object(out)
}

/// The workload value `name` names when read bare (`{{ numbers }}` for
/// `{{ workload.numbers }}`), if the workload has that key.
pub(super) fn workload_key(vars: &BTreeMap<String, MjValue>, name: &str) -> Option<MjValue> {
    if GLOBALS.contains(&name) {
        return None;
    }
    let v = vars.get("workload")?.get_attr(name).ok()?;
    (!v.is_undefined()).then_some(v)
}

/// `output` as a render reads it: unless bound, the [`output_view`] of
/// `outcome` (task policy), else of `event` (arcs, admission).
pub(super) fn derived_output(vars: &BTreeMap<String, MjValue>) -> Option<MjValue> {
    let source = vars.get("outcome").or_else(|| vars.get("event"))?;
    let json = serde_json::to_value(source).unwrap_or(Value::Null);
    Some(MjValue::from(Serde(&output_view(&json))))
}

/// The root of a render: the bound names first (and `output`, derived from
/// `outcome` or `event`); then, with the lowest precedence, the workload's
/// keys read bare, unless a runtime variable or a step or task name (bound
/// or only declared) has that name (docs/dsl.md, "Names read bare").
#[derive(Debug)]
pub(super) struct Root {
    pub(super) vars: Arc<BTreeMap<String, MjValue>>,
    pub(super) declared: Arc<BTreeSet<String>>,
}

impl minijinja::value::Object for Root {
    fn get_value(self: &Arc<Self>, key: &MjValue) -> Option<MjValue> {
        let name = key.as_str()?;
        if let Some(v) = self.vars.get(name) {
            return Some(v.clone());
        }
        if name == "output" {
            return derived_output(&self.vars);
        }
        if self.declared.contains(name) || RUNTIME_VARIABLES.contains(&name) {
            return None;
        }
        workload_key(&self.vars, name)
    }

    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        let derived = (!self.vars.contains_key("output")
            && (self.vars.contains_key("outcome") || self.vars.contains_key("event")))
        .then_some("output");
        let mut names: Vec<&str> = self.vars.keys().map(String::as_str).collect();
        names.extend(derived);
        names.sort_unstable();
        minijinja::value::Enumerator::Values(names.into_iter().map(MjValue::from).collect())
    }
}
