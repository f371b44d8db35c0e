//! Typed model of a *normalised* canonical v10 playbook.
//!
//! The loader (`load`) reads YAML into a positioned tree, validates it,
//! normalises every accepted shape (task-list forms, `else` rules, `set`
//! aliases) into the canonical JSON form, and only then deserialises into
//! these types. Services never see any other shape.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A JSON object.
pub type Object = Map<String, Value>;

/// A whole playbook document (root sections only; root `vars` is refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Playbook {
    /// API version, e.g. `noetl.io/v2`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Document kind, `Playbook`.
    pub kind: String,
    /// Name, catalog path, version and description.
    pub metadata: Metadata,
    /// Credentials the playbook needs, resolved by name before it runs.
    #[serde(default)]
    pub keychain: Vec<KeychainEntry>,
    /// Runtime and backend knobs (`executor.spec` is the outermost spec layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<Executor>,
    /// Default inputs; merged with the execution request into `workload`.
    #[serde(default)]
    pub workload: Object,
    /// The steps (Petri-net transitions).
    pub workflow: Vec<Step>,
    /// Reusable named tasks for `kind: workbook`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workbook: Option<Value>,
}

/// `metadata` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Metadata {
    /// Human name of the playbook.
    pub name: String,
    /// Catalog path (e.g. `examples/hello`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Author-given version string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<Value>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Any other metadata (labels, owners...).
    #[serde(flatten)]
    pub extra: Object,
}

/// One `keychain` declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KeychainEntry {
    /// Name used by `auth:` and `{{ keychain.<name> }}`.
    pub name: String,
    /// Credential kind, e.g. `postgres_credential`, `bearer`, `secret`.
    pub kind: String,
    /// Kind-specific resolution hints.
    #[serde(flatten)]
    pub extra: Object,
}

/// `executor` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Executor {
    /// e.g. `distributed` or `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Outermost spec layer (`limits.max_payload_bytes`, `policy.results`,
    /// `policy.concurrency`...); kept as an object, its documented shape
    /// is [`ExecutorSpecShape`].
    #[serde(default)]
    #[schemars(with = "ExecutorSpecShape")]
    pub spec: Object,
}

impl Executor {
    /// `spec.policy.concurrency`: how many executions may run at once per
    /// key (`None` when absent or not of its shape; validation refuses a
    /// bad shape before a playbook runs).
    pub fn concurrency(&self) -> Option<ExecutionConcurrency> {
        let v = self.spec.get("policy")?.get("concurrency")?;
        serde_json::from_value(v.clone()).ok()
    }
}

/// The documented shape of `executor.spec` (what `noetl schema` shows; at
/// run time the section is kept as an object).
#[derive(JsonSchema)]
#[allow(dead_code)]
struct ExecutorSpecShape {
    /// Per-execution limits: `max_payload_bytes`, `max_loop_items`, `timeout_s`.
    #[serde(default)]
    limits: Option<Object>,
    /// The default task timeout (seconds, or `{connect, read}`).
    #[serde(default)]
    timeout: Option<Value>,
    /// Global, non-control policy.
    #[serde(default)]
    policy: Option<ExecutorPolicyShape>,
    /// Other knobs, inherited by every task (spec layering).
    #[serde(flatten)]
    extra: Object,
}

/// The documented shape of `executor.spec.policy`.
#[derive(JsonSchema)]
#[allow(dead_code)]
#[serde(deny_unknown_fields)]
struct ExecutorPolicyShape {
    /// How many executions of this playbook run at once per key.
    #[serde(default)]
    concurrency: Option<ExecutionConcurrency>,
    /// The same knobs as `executor.spec.limits` (moved there when loading).
    #[serde(default)]
    limits: Option<Object>,
    /// `timeouts`: the default task timeout (moved to `executor.spec.timeout`).
    #[serde(default)]
    defaults: Option<Object>,
    /// `reference_first: true` (what the engine always does).
    #[serde(default)]
    results: Option<Object>,
}

/// `executor.spec.policy.concurrency`: at most `limit` executions of the
/// playbook run at once per rendered `key` (docs/dsl.md, "Concurrency and
/// rate limits").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionConcurrency {
    /// A template over `workload` (e.g. `{{ workload.customer }}`);
    /// absent: the playbook's path (or name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Executions that may run at once per key (>= 1).
    #[schemars(range(min = 1))]
    pub limit: u32,
    /// What a new execution does when the key is at its limit.
    #[serde(default)]
    pub on_limit: OnLimit,
}

/// What an execution does when its concurrency key is at its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OnLimit {
    /// Wait in line; start, in request order, when a slot frees.
    #[default]
    Queue,
    /// Fail at once, naming the key, the limit and the executions holding it.
    Reject,
    /// Cancel the oldest running execution of the key, then wait in line.
    CancelOldest,
}

/// `step.spec.policy.concurrency`: at most `limit` task calls of the step
/// run at once per rendered `key`, across every execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Concurrency {
    /// A template over the task's scope (`workload`, `ctx`, `iter`,
    /// `args`); absent: the playbook's path and the step's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Task calls that may run at once per key (>= 1).
    #[schemars(range(min = 1))]
    pub limit: u32,
}

/// `step.spec.policy.rate`: at most `per_second` task calls of the step
/// start per second per rendered `key` (a token bucket holding `burst`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// As [`Concurrency::key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Task calls started per second (> 0; may be a fraction).
    pub per_second: f64,
    /// Calls that may start at once after a quiet time (>= 1; default 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub burst: u32,
}

fn one() -> u32 {
    1
}

/// One workflow step: admission policy + tool pipeline + router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Step name, unique in the workflow.
    pub step: String,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    /// Step knobs: `policy.admit`, `lifecycle`, `failure`...
    #[serde(default)]
    pub spec: StepSpec,
    /// Optional loop modifier.
    #[serde(default, rename = "loop", skip_serializing_if = "Option::is_none")]
    pub loop_: Option<Loop>,
    /// The ordered pipeline, normalised (never empty for runnable steps).
    /// An empty one is left out when written, as a step without `tool`
    /// is written, so a normalised playbook loads again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool: Vec<Task>,
    /// The router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Next>,
}

/// `step.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StepSpec {
    /// Admission and lifecycle policy (non-control).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<StepPolicy>,
    /// Lifecycle hints (`timeout_s`, `deadline_s`); also accepted under `policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Value>,
    /// Failure handling; also accepted under `policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// Any other implementation-defined knobs (inherited by tasks via layering).
    #[serde(flatten)]
    pub extra: Object,
}

/// `step.spec.policy`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StepPolicy {
    /// Server-side admission gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admit: Option<Admit>,
    /// Lifecycle hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Value>,
    /// Failure handling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// At most `limit` task calls of the step at once per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// At most `per_second` task calls of the step start per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// Other non-control placeholders (tracing, quotas...).
    #[serde(flatten)]
    pub extra: Object,
}

/// Failure mode of a step (mostly meaningful for loops).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Failure {
    /// `fail_fast` (default) or `best_effort`.
    #[serde(default)]
    pub mode: FailureMode,
}

/// See [`Failure`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Stop at the first failure.
    #[default]
    FailFast,
    /// Run everything, report counts.
    BestEffort,
}

/// `step.spec.policy.admit`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Admit {
    /// Reserved; v10 treats admission as a boolean gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Rules, first match wins.
    #[serde(default)]
    pub rules: Vec<Rule<AdmitThen>>,
}

/// The `then` of an admission rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AdmitThen {
    /// Whether the token may run the step.
    pub allow: bool,
}

/// A `when`/`then` rule, or an `else` rule. Normalised form:
/// `{when: "...", then: ...}` or `{else: true, then: ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Rule<T> {
    /// Condition template; absent on `else` rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// True for the fallback rule.
    /// `else: false` is refused when deserialising: it is not a rule, and
    /// read as `false` it would make a rule without `when` (which always
    /// matches) out of it.
    #[serde(
        default,
        rename = "else",
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "else_flag"
    )]
    pub is_else: bool,
    /// What to do when the rule matches.
    pub then: T,
}

/// `else` of a normalised rule: only `true` (or `null`, the authoring
/// shorthand) is a fallback rule.
fn else_flag<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Option::<bool>::deserialize(d)? {
        Some(true) | None => Ok(true),
        Some(false) => Err(serde::de::Error::custom(
            "`else: false` is not a rule; the fallback rule is `else: true` (or `else: {then: ...}`)",
        )),
    }
}

/// `step.loop`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Loop {
    /// The collection: a template string or a literal list (`null` in a
    /// cursor loop, which has `cursor` instead).
    #[serde(rename = "in", default, skip_serializing_if = "Value::is_null")]
    pub in_: Value,
    /// The claim of a cursor loop (`spec.mode: cursor`), instead of `in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<LoopCursor>,
    /// Name the element is bound to in `iter`.
    pub iterator: String,
    /// Scheduling knobs.
    #[serde(default)]
    pub spec: LoopSpec,
}

/// `loop.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoopSpec {
    /// sequential (default), parallel or cursor.
    #[serde(default)]
    pub mode: LoopMode,
    /// Bound on iterations in flight (integer or template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<Value>,
    /// `exec` intent, reducers...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
    /// How a cursor loop claims its rows (`mode: cursor` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<FrameSpec>,
    /// Other knobs (inherited by tasks via layering).
    #[serde(flatten)]
    pub extra: Object,
}

/// See [`LoopSpec`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoopMode {
    /// One iteration at a time, in order.
    #[default]
    Sequential,
    /// Up to `max_in_flight` iterations at once.
    Parallel,
    /// Iterations are the rows `loop.cursor.claim` returns, claimed again
    /// while the window has room, until a claim returns none.
    Cursor,
}

/// `loop.cursor`: the SQL statement that claims work rows and returns them
/// (docs/dsl.md, "Cursor loops").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoopCursor {
    /// The tool kind that runs the claim: `postgres`.
    #[serde(default = "postgres_kind")]
    pub kind: String,
    /// The keychain entry the claim connects with (a name or a template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Value>,
    /// The claim: one statement that claims rows and returns them
    /// (`UPDATE ... RETURNING`); a template that may read
    /// `__frame_max_rows`.
    pub claim: String,
}

fn postgres_kind() -> String {
    "postgres".to_string()
}

/// `loop.spec.frame`: how a cursor loop claims.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FrameSpec {
    /// Rows one claim asks for (`__frame_max_rows`; default 1): an integer
    /// or a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<Value>,
    /// Iterations per claim worker (default 1): the window is
    /// `max_in_flight × row_concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_concurrency: Option<Value>,
    /// `row` (default): one iteration per row; `frame`: one iteration per
    /// claim, its element the list of rows.
    #[serde(default)]
    pub process: FrameProcess,
    /// NoETL's lease and sizing hints (`max_seconds`, `max_bytes`,
    /// `lease_seconds`, `heartbeat_seconds`): accepted and ignored.
    #[serde(flatten)]
    pub hints: Object,
}

/// See [`FrameSpec::process`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FrameProcess {
    /// One iteration per claimed row.
    #[default]
    Row,
    /// One iteration per claim; the element is the list of its rows.
    Frame,
}

/// One task of a pipeline, in the canonical `{name, kind, ...}` form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Task {
    /// Stable label: jump target and event correlation.
    pub name: String,
    /// Tool kind (`noop`, `python`, `http`, `postgres`...).
    pub kind: String,
    /// Runtime knobs and the outcome policy.
    #[serde(default)]
    pub spec: TaskSpec,
    /// Kind-specific fields (`url`, `code`, `command`, `args`, `auth`...).
    #[serde(flatten)]
    pub config: Object,
}

/// `task.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TaskSpec {
    /// Outcome policy: the only place control actions live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<TaskPolicy>,
    /// Other runtime knobs (`timeout`...).
    #[serde(flatten)]
    pub extra: Object,
}

/// `task.spec.policy`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TaskPolicy {
    /// Rules, first match wins; no match and no `else` means continue.
    pub rules: Vec<Rule<TaskThen>>,
    /// Placeholders (`mode`, `on_unmatched`, hooks).
    #[serde(flatten)]
    pub extra: Object,
}

/// The `then` of a task policy rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskThen {
    /// The control action; `continue` when omitted.
    #[serde(default, rename = "do")]
    pub action: Action,
    /// Retry bound (total attempts, >= 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Retry backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Backoff>,
    /// Base retry delay in seconds (number or template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<Value>,
    /// Jump target (task name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Iteration-scope patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_iter: Option<Object>,
    /// Execution-scope patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_ctx: Option<Object>,
}

/// Control actions of task policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Advance to the next task.
    #[default]
    Continue,
    /// Rerun the current task.
    Retry,
    /// Move the program counter to `to`.
    Jump,
    /// Stop the pipeline successfully.
    Break,
    /// Stop the pipeline as a failure.
    Fail,
}

/// Retry backoff shapes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    /// Constant delay.
    #[default]
    None,
    /// delay * attempt.
    Linear,
    /// delay * 2^(attempt-1).
    Exponential,
}

/// `step.next`, the router object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Next {
    /// Routing mode.
    #[serde(default)]
    pub spec: NextSpec,
    /// Outgoing arcs, in YAML order.
    #[serde(default)]
    pub arcs: Vec<Arc>,
}

/// `next.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NextSpec {
    /// exclusive (default) or inclusive.
    #[serde(default)]
    pub mode: RouteMode,
    /// Reserved routing hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
}

/// See [`NextSpec`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// First matching arc fires.
    #[default]
    Exclusive,
    /// All matching arcs fire.
    Inclusive,
}

/// One routing arc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Arc {
    /// Target step.
    pub step: String,
    /// Guard (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Inscription: becomes `args` of the target step (values are templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Object>,
    /// `ctx` writes made when the arc fires, before its token is placed
    /// (values are templates rendered like `args`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_ctx: Option<Object>,
    /// Reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
}

impl Playbook {
    /// The entry step: the step named `start` if there is one, else the first.
    pub fn entry_step(&self) -> Option<&Step> {
        self.workflow
            .iter()
            .find(|s| s.step == "start")
            .or_else(|| self.workflow.first())
    }

    /// Look a step up by name.
    pub fn step(&self, name: &str) -> Option<&Step> {
        self.workflow.iter().find(|s| s.step == name)
    }
}

impl Step {
    /// Index of the task labelled `name` in this step's pipeline.
    pub fn task_index(&self, name: &str) -> Option<usize> {
        self.tool.iter().position(|t| t.name == name)
    }

    /// The admission policy, wherever it was written.
    pub fn admit(&self) -> Option<&Admit> {
        self.spec.policy.as_ref().and_then(|p| p.admit.as_ref())
    }

    /// The effective failure mode (`spec.failure` or `spec.policy.failure`).
    pub fn failure_mode(&self) -> FailureMode {
        self.spec
            .failure
            .as_ref()
            .or_else(|| self.spec.policy.as_ref().and_then(|p| p.failure.as_ref()))
            .map(|f| f.mode)
            .unwrap_or_default()
    }

    /// True when the step limits its task calls (`spec.policy.concurrency`
    /// or `spec.policy.rate`): each command waits for its slot and token.
    pub fn is_gated(&self) -> bool {
        self.spec
            .policy
            .as_ref()
            .is_some_and(|p| p.concurrency.is_some() || p.rate.is_some())
    }
}
