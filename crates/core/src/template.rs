//! NoETL templating: one shared minijinja environment with NoETL semantics.
//!
//! * [`render_value`] renders every string of a JSON structure. A string that
//!   is exactly one `{{ expr }}` (surrounding whitespace allowed) yields the
//!   expression's *native* value (list, number, bool, object, null); any other
//!   string with template syntax renders to text; strings without template
//!   syntax are returned untouched without touching the engine.
//! * [`eval_condition`] evaluates a `when`. It is lenient: anything missing is
//!   undefined, undefined is falsy, `==`/`in` with undefined are false, and
//!   ordering comparisons (`<`, `<=`, `>`, `>=`) with an undefined or null
//!   operand are false (minijinja alone orders undefined before everything,
//!   so `when` expressions are rewritten to a lenient comparison function).
//! * Value templates are strict about unknown *top-level* names only (typos
//!   like `wrokload`): see [`TemplateError::UndefinedVariable`]. Missing nested
//!   attributes are undefined: `null` for an exact expression, empty text in
//!   mixed text, and `| default(x)` replaces them.
//!
//! Text rendering rules (mixed text): undefined and null render as the empty
//! string, booleans as `true`/`false`, lists and objects as compact JSON.
//!
//! Compiled templates are cached by source in a bounded cache shared by all
//! threads, so re-rendering the same template per message does not re-parse it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock, RwLock};

use minijinja::value::{Serde, ValueKind};
use minijinja::{AutoEscape, Environment, Error as MjError, ErrorKind, Value as MjValue};
use serde_json::Value;
use thiserror::Error;

use crate::limits::{MAX_TEMPLATE_FUEL, MAX_TEMPLATE_OUTPUT_BYTES};
use crate::outcome::Outcome;

/// A template failed to parse or render. Callers add the playbook location.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TemplateError {
    /// The template source does not parse.
    #[error("template syntax error: {message} (in template `{template}`)")]
    Syntax {
        /// The template source.
        template: String,
        /// What is wrong.
        message: String,
    },
    /// A value template references a top-level name the scope does not know.
    #[error("undefined variable `{name}` (in template `{template}`)")]
    UndefinedVariable {
        /// The unknown variable name.
        name: String,
        /// The template source.
        template: String,
    },
    /// Rendering failed (bad filter argument, type error, unknown filter...).
    #[error("template render error: {message} (in template `{template}`)")]
    Render {
        /// The template source.
        template: String,
        /// What went wrong.
        message: String,
    },
    /// The render went beyond a limit of [`crate::limits`] (output size).
    #[error("{error} (in template `{template}`)")]
    TooLarge {
        /// The template source.
        template: String,
        /// Which limit, the size reached and the maximum.
        error: Box<crate::limits::LimitError>,
    },
}

impl TemplateError {
    /// The source of the template that failed.
    pub fn template(&self) -> &str {
        match self {
            Self::Syntax { template, .. }
            | Self::UndefinedVariable { template, .. }
            | Self::Render { template, .. }
            | Self::TooLarge { template, .. } => template,
        }
    }
}

/// Runtime variable names the engine provides (docs/dsl.md "Runtime variables"). They are always
/// known to value templates: when one is not bound in a [`Scope`] it is
/// undefined (renders as `null`) rather than an error.
pub const RUNTIME_VARIABLES: &[&str] = &[
    "workload",
    "keychain",
    "ctx",
    "iter",
    "args",
    "_task",
    "_prev",
    "_attempt",
    "outcome",
    "event",
    "loop",
    "execution_id",
    "output",
    "_index",
];

/// Minijinja's global functions: never shadowed by a workload key read bare.
const GLOBALS: &[&str] = &["range", "dict", "debug", "namespace"];

// ---------------------------------------------------------------------------
// Scope
// ---------------------------------------------------------------------------

/// The render context: the runtime variables (docs/dsl.md) plus earlier step
/// results addressable by step name (`{{ fetch.rows }}`).
///
/// Builder methods convert each JSON value once; the scope is then cheap to
/// clone (two `Arc`s), so build a base scope per execution (`workload`,
/// `keychain`) and clone it to add per-message variables.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    vars: Arc<BTreeMap<String, MjValue>>,
    declared: Arc<BTreeSet<String>>,
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

    fn knows(&self, name: &str) -> bool {
        self.vars.contains_key(name)
            || self.declared.contains(name)
            || RUNTIME_VARIABLES.contains(&name)
            || workload_key(&self.vars, name).is_some()
    }

    fn context(&self) -> MjValue {
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
fn workload_key(vars: &BTreeMap<String, MjValue>, name: &str) -> Option<MjValue> {
    if GLOBALS.contains(&name) {
        return None;
    }
    let v = vars.get("workload")?.get_attr(name).ok()?;
    (!v.is_undefined()).then_some(v)
}

/// `output` as a render reads it: unless bound, the [`output_view`] of
/// `outcome` (task policy), else of `event` (arcs, admission).
fn derived_output(vars: &BTreeMap<String, MjValue>) -> Option<MjValue> {
    let source = vars.get("outcome").or_else(|| vars.get("event"))?;
    let json = serde_json::to_value(source).unwrap_or(Value::Null);
    Some(MjValue::from(Serde(&output_view(&json))))
}

/// The root of a render: the bound names first (and `output`, derived from
/// `outcome` or `event`); then, with the lowest precedence, the workload's
/// keys read bare, unless a runtime variable or a step or task name (bound
/// or only declared) has that name (docs/dsl.md, "Names read bare").
#[derive(Debug)]
struct Root {
    vars: Arc<BTreeMap<String, MjValue>>,
    declared: Arc<BTreeSet<String>>,
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

// ---------------------------------------------------------------------------
// Public functions
// ---------------------------------------------------------------------------

/// True when `s` contains template syntax (`{{`, `{%` or `{#`).
pub fn is_template(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

/// Checks that `src` (text that may contain `{{ }}` / `{% %}`) parses.
pub fn check_syntax(src: &str) -> Result<(), TemplateError> {
    if !is_template(src) {
        return Ok(());
    }
    engine()
        .entry(Kind::Text, src)
        .map(|_| ())
        .map_err(|e| map_error(src, e))
}

/// The top-level variable names `src` reads (sorted, without builtin
/// functions such as `range` or `now`). Empty when `src` has no template
/// syntax or does not parse (use [`check_syntax`] to report that).
pub fn referenced_roots(src: &str) -> Vec<String> {
    if !is_template(src) {
        return Vec::new();
    }
    engine()
        .entry(Kind::Text, src)
        .map(|e| e.roots.clone())
        .unwrap_or_default()
}

/// The dotted names a template reads (`workload.threshold` for
/// `{{ workload.threshold > 3 }}`; a root alone when nothing is read below
/// it), sorted: what `noetl validate` holds against the keys a scope can
/// have. Empty for a plain string or one that does not parse.
pub fn referenced_paths(src: &str) -> Vec<String> {
    if !is_template(src) {
        return Vec::new();
    }
    let name = format!("{}{src}", Kind::Text.prefix());
    let e = engine();
    let mut paths: Vec<String> = e
        .env
        .get_template(&name)
        .map(|t| t.undeclared_variables(true).into_iter().collect())
        .unwrap_or_default();
    paths.sort();
    paths
}

/// Recursively renders every string in `value` (object keys are not
/// rendered). See the module docs for exact-expression vs text rendering.
pub fn render_value(value: &Value, scope: &Scope) -> Result<Value, TemplateError> {
    match value {
        Value::String(s) => render_str(s, scope),
        Value::Array(items) => items
            .iter()
            .map(|v| render_value(v, scope))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        Value::Object(map) => {
            let mut out = serde_json::Map::with_capacity(map.len());
            for (k, v) in map {
                out.insert(k.clone(), render_value(v, scope)?);
            }
            Ok(Value::Object(out))
        }
        other => Ok(other.clone()),
    }
}

/// Renders one string: the native value of an exact `{{ expr }}`, else text.
/// A string without template syntax is returned as a JSON string.
pub fn render_str(src: &str, scope: &Scope) -> Result<Value, TemplateError> {
    if !is_template(src) {
        return Ok(Value::String(src.to_string()));
    }
    match exact_inner(src) {
        Some(expr) => eval_native(Kind::Expr, expr, src, scope, true),
        None => render_text_inner(src, scope, true).map(Value::String),
    }
}

/// Renders `src` to text (an exact expression is rendered as text too).
pub fn render_text(src: &str, scope: &Scope) -> Result<String, TemplateError> {
    if !is_template(src) {
        return Ok(src.to_string());
    }
    render_text_inner(src, scope, true)
}

/// Evaluates a `when` condition with Jinja truthiness, leniently.
///
/// * `"{{ expr }}"`: the expression's value decides (undefined/none/0/""/[]/{}
///   are false).
/// * no template syntax: `true`/`false` (any case) and `""` are literals;
///   anything else is evaluated as a bare expression (`ctx.ok == true`).
/// * other text (e.g. `{% if %}` blocks): rendered, then `""`, `false`, `0`,
///   `none`, `null` and `no` (any case, trimmed) are false, the rest true.
///
/// Missing variables/attributes never fail. In the expression forms, ordering
/// comparisons with an undefined or null operand, or between unrelated types
/// (number vs string), are false; inside `{% %}` blocks of the text form they
/// follow minijinja (undefined sorts first), so prefer the expression forms.
pub fn eval_condition(src: &str, scope: &Scope) -> Result<bool, TemplateError> {
    let trimmed = src.trim();
    if !is_template(trimmed) {
        if trimmed.eq_ignore_ascii_case("true") {
            return Ok(true);
        }
        if trimmed.is_empty() || trimmed.eq_ignore_ascii_case("false") {
            return Ok(false);
        }
        return eval_cond_expr(trimmed, src, scope);
    }
    match exact_inner(trimmed) {
        Some(expr) => eval_cond_expr(expr, src, scope),
        None => {
            let text = render_text_inner(src, scope, false)?;
            Ok(text_truthy(&text))
        }
    }
}

// ---------------------------------------------------------------------------
// Internals: evaluation
// ---------------------------------------------------------------------------

const RESULT_VAR: &str = "__noetl_value";
const CMP_FN: &str = "__noetl_cmp";
const MAX_CACHED: usize = 4096;

fn text_truthy(text: &str) -> bool {
    let t = text.trim();
    !(t.is_empty()
        || ["false", "0", "none", "null", "no"]
            .iter()
            .any(|f| t.eq_ignore_ascii_case(f)))
}

/// The expression of a string that is exactly one `{{ expr }}`.
fn exact_inner(src: &str) -> Option<&str> {
    let t = src.trim();
    let inner = t.strip_prefix("{{")?.strip_suffix("}}")?;
    let inner = inner.strip_prefix(['-', '+']).unwrap_or(inner);
    let inner = inner.strip_suffix('-').unwrap_or(inner);
    if inner.trim().is_empty()
        || ["{{", "}}", "{%", "%}", "{#", "#}"]
            .iter()
            .any(|p| inner.contains(p))
    {
        return None;
    }
    Some(inner)
}

fn eval_cond_expr(expr: &str, src: &str, scope: &Scope) -> Result<bool, TemplateError> {
    let value = eval_mj(Kind::Cond, expr, src, scope, false)?;
    Ok(value.is_true())
}

fn eval_native(
    kind: Kind,
    expr: &str,
    src: &str,
    scope: &Scope,
    strict: bool,
) -> Result<Value, TemplateError> {
    let value = eval_mj(kind, expr, src, scope, strict)?;
    // What an expression builds (`'x' * n`, `[0] * n`, `~`, `join`...) is
    // measured as it streams, before it is materialised as JSON. A plain
    // lookup (`{{ fetch.rows }}`) passes whatever it reads: step results
    // are data, not hostile templates, and never fail for size.
    if !is_lookup(expr) {
        let mut sink = BoundedText::with(false);
        let _ = serde_json::to_writer(&mut sink, &value);
        if let Some(size) = sink.over {
            return Err(too_large(src, size));
        }
    }
    let value = to_json(&value).map_err(|message| TemplateError::Render {
        template: src.to_string(),
        message,
    })?;
    Ok(value)
}

/// True when `expr` only reads a value (`a.b[0]['c']`), building nothing.
fn is_lookup(expr: &str) -> bool {
    let e = expr.trim();
    !e.is_empty()
        && e.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '[' | ']' | '\'' | '"'))
}

/// The error of a render whose output passed [`MAX_TEMPLATE_OUTPUT_BYTES`].
fn too_large(src: &str, size: usize) -> TemplateError {
    TemplateError::TooLarge {
        template: src.chars().take(200).collect(),
        error: Box::new(crate::limits::LimitError {
            limit: "max_template_output_bytes",
            what: "the rendered output".into(),
            actual: size,
            max: MAX_TEMPLATE_OUTPUT_BYTES,
            unit: "bytes (at least)",
            place: "one template render".into(),
            hint: "render less (keep large data in step results, which travel by reference)",
        }),
    }
}

/// A render sink that refuses output past [`MAX_TEMPLATE_OUTPUT_BYTES`]
/// (keeping the bytes, or only counting them).
struct BoundedText {
    out: Vec<u8>,
    len: usize,
    over: Option<usize>,
    keep: bool,
}

impl BoundedText {
    /// Keeps what is written.
    fn new() -> Self {
        Self::with(true)
    }

    fn with(keep: bool) -> Self {
        Self {
            out: Vec::new(),
            len: 0,
            over: None,
            keep,
        }
    }
}

impl std::io::Write for BoundedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let total = self.len.saturating_add(buf.len());
        if total > MAX_TEMPLATE_OUTPUT_BYTES {
            self.over = Some(total);
            return Err(std::io::Error::other("template output limit reached"));
        }
        self.len = total;
        if self.keep {
            self.out.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn eval_mj(
    kind: Kind,
    expr: &str,
    src: &str,
    scope: &Scope,
    strict: bool,
) -> Result<MjValue, TemplateError> {
    let engine = engine();
    let entry = match engine.entry(kind, expr) {
        Ok(e) => e,
        // The comparison rewrite is best-effort: fall back to the plain form.
        Err(_) if kind == Kind::Cond => engine
            .entry(Kind::Expr, expr)
            .map_err(|e| compile_error(&engine, src, e))?,
        Err(e) => return Err(compile_error(&engine, src, e)),
    };
    if strict {
        check_roots(&entry, src, scope)?;
    }
    let tmpl = engine
        .env
        .get_template(&entry.name)
        .map_err(|e| map_error(src, e))?;
    let captured = tmpl
        .render_captured(scope.context())
        .map_err(|e| map_error(src, e))?;
    Ok(captured
        .state()
        .lookup(RESULT_VAR)
        .unwrap_or(MjValue::UNDEFINED))
}

fn render_text_inner(src: &str, scope: &Scope, strict: bool) -> Result<String, TemplateError> {
    let engine = engine();
    let entry = engine
        .entry(Kind::Text, src)
        .map_err(|e| map_error(src, e))?;
    if strict {
        check_roots(&entry, src, scope)?;
    }
    let tmpl = engine
        .env
        .get_template(&entry.name)
        .map_err(|e| map_error(src, e))?;
    let mut sink = BoundedText::new();
    let rendered = tmpl.render_captured_to(scope.context(), &mut sink);
    if let Some(size) = sink.over {
        return Err(too_large(src, size));
    }
    rendered.map_err(|e| map_error(src, e))?;
    // minijinja writes whole UTF-8 strings, so the bytes are valid text.
    String::from_utf8(sink.out).map_err(|e| TemplateError::Render {
        template: src.to_string(),
        message: format!("output is not UTF-8: {e}"),
    })
}

/// A compile error of an expression, reported as the whole template's error
/// when that fails too (its message does not mention our internal wrapping).
fn compile_error(engine: &Arc<Engine>, src: &str, e: MjError) -> TemplateError {
    match engine.entry(Kind::Text, src) {
        Err(text_err) => map_error(src, text_err),
        Ok(_) => map_error(src, e),
    }
}

fn check_roots(entry: &Entry, src: &str, scope: &Scope) -> Result<(), TemplateError> {
    match entry.roots.iter().find(|r| !scope.knows(r)) {
        Some(name) => Err(TemplateError::UndefinedVariable {
            name: name.clone(),
            template: src.to_string(),
        }),
        None => Ok(()),
    }
}

fn to_json(value: &MjValue) -> Result<Value, String> {
    serde_json::to_value(value).map_err(|e| format!("result is not JSON: {e}"))
}

fn map_error(src: &str, e: MjError) -> TemplateError {
    let template = src.to_string();
    let mut message = match (e.kind(), e.detail()) {
        (ErrorKind::SyntaxError, Some(detail)) => detail.to_string(),
        (kind, Some(detail)) => format!("{kind}: {detail}"),
        (kind, None) => kind.to_string(),
    };
    if let Some(line) = e.line() {
        if src.contains('\n') {
            let _ = write!(message, " (line {line})");
        }
    }
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let _ = write!(message, ": {s}");
        source = s.source();
    }
    if e.kind() == ErrorKind::OutOfFuel {
        message = format!(
            "the render took more than {MAX_TEMPLATE_FUEL} steps, above the limit `max_template_fuel` (a loop over too large a range?)"
        );
    }
    match e.kind() {
        ErrorKind::SyntaxError => TemplateError::Syntax { template, message },
        _ => TemplateError::Render { template, message },
    }
}

// ---------------------------------------------------------------------------
// Internals: the shared engine and its bounded cache
// ---------------------------------------------------------------------------

/// How a source is compiled; also the loader-name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A whole template rendered to text.
    Text,
    /// One expression evaluated to a native value.
    Expr,
    /// One `when` expression, with lenient ordering comparisons.
    Cond,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Text => "\u{1}text:",
            Kind::Expr => "\u{1}expr:",
            Kind::Cond => "\u{1}cond:",
        }
    }
}

/// One compiled source: its loader name and the top-level names it reads.
#[derive(Debug)]
struct Entry {
    name: String,
    roots: Vec<String>,
}

/// One generation of the cache: an environment whose loader maps our names
/// back to sources, and the per-source metadata. When the cache is full a
/// fresh generation replaces it (renders in flight keep the old one alive).
struct Engine {
    env: Environment<'static>,
    builtins: BTreeSet<String>,
    entries: RwLock<HashMap<String, Arc<Entry>>>,
}

static ENGINE: OnceLock<RwLock<Arc<Engine>>> = OnceLock::new();

fn engine() -> Arc<Engine> {
    let lock = ENGINE.get_or_init(|| RwLock::new(Arc::new(Engine::new())));
    lock.read().unwrap_or_else(|e| e.into_inner()).clone()
}

fn rotate(full: &Arc<Engine>) {
    if let Some(lock) = ENGINE.get() {
        let mut current = lock.write().unwrap_or_else(|e| e.into_inner());
        if Arc::ptr_eq(&current, full) {
            *current = Arc::new(Engine::new());
        }
    }
}

impl Engine {
    fn new() -> Self {
        let env = build_env();
        let builtins = env.globals().map(|(name, _)| name.to_string()).collect();
        Self {
            env,
            builtins,
            entries: RwLock::new(HashMap::new()),
        }
    }

    fn entry(self: &Arc<Self>, kind: Kind, src: &str) -> Result<Arc<Entry>, MjError> {
        let name = format!("{}{src}", kind.prefix());
        if let Some(e) = self
            .entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
        {
            return Ok(e.clone());
        }
        let tmpl = self.env.get_template(&name)?;
        let mut roots: Vec<String> = tmpl
            .undeclared_variables(false)
            .into_iter()
            .filter(|r| !self.builtins.contains(r))
            .collect();
        roots.sort();
        let entry = Arc::new(Entry {
            name: name.clone(),
            roots,
        });
        let len = {
            let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
            entries.insert(name, entry.clone());
            entries.len()
        };
        if len >= MAX_CACHED {
            rotate(self);
        }
        Ok(entry)
    }
}

fn loader(name: &str) -> Result<Option<String>, MjError> {
    if let Some(src) = name.strip_prefix(Kind::Text.prefix()) {
        return Ok(Some(src.to_string()));
    }
    if let Some(expr) = name.strip_prefix(Kind::Expr.prefix()) {
        return Ok(Some(wrap_expr(expr)));
    }
    if let Some(expr) = name.strip_prefix(Kind::Cond.prefix()) {
        let rewritten = cmp_rewrite::rewrite(expr, CMP_FN).unwrap_or_else(|| expr.to_string());
        return Ok(Some(wrap_expr(&rewritten)));
    }
    // `{% include %}` and friends: NoETL templates are self-contained.
    Ok(None)
}

fn wrap_expr(expr: &str) -> String {
    format!("{{% set {RESULT_VAR} = ({expr}\n) %}}")
}

fn build_env() -> Environment<'static> {
    let mut env = Environment::new();
    // Bounds the work of one render (nested loops over large ranges).
    env.set_fuel(Some(MAX_TEMPLATE_FUEL));
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_debug(false);
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_loader(loader);
    env.set_formatter(|out, state, value| match text_form(value)? {
        Some(text) => out.write_str(&text).map_err(MjError::from),
        None => minijinja::escape_formatter(out, state, value),
    });
    funcs::register(&mut env);
    env
}

/// The text of `value` in mixed templates when it differs from minijinja's
/// default display (`None` = use the default).
fn text_form(value: &MjValue) -> Result<Option<String>, MjError> {
    Ok(Some(match value.kind() {
        ValueKind::Undefined | ValueKind::None => String::new(),
        ValueKind::Bool => value.is_true().to_string(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
            // Streamed into a bounded buffer: `{{ [0] * n }}` in text never
            // materialises more than the output limit.
            let mut sink = BoundedText::new();
            if let Err(e) = serde_json::to_writer(&mut sink, value) {
                let message = match sink.over {
                    Some(size) => format!(
                        "output of at least {size} bytes, above the limit `max_template_output_bytes` of {MAX_TEMPLATE_OUTPUT_BYTES} bytes"
                    ),
                    None => format!("not JSON: {e}"),
                };
                return Err(MjError::new(ErrorKind::BadSerialization, message));
            }
            String::from_utf8(sink.out)
                .map_err(|e| MjError::new(ErrorKind::BadSerialization, format!("not UTF-8: {e}")))?
        }
        _ => return Ok(None),
    }))
}

/// Filters, tests and functions added to minijinja's builtins.
mod funcs {
    use super::*;

    pub(super) fn register(env: &mut Environment<'static>) {
        env.add_filter("fromjson", fromjson);
        env.add_filter("keys", keys);
        env.add_filter("values", values);
        env.add_filter("string", string);
        env.add_filter("b64encode", b64encode);
        env.add_filter("b64decode", b64decode);
        env.add_function("now", now);
        env.add_function(CMP_FN, lenient_cmp);
    }

    /// `s | fromjson`: parse a JSON string.
    fn fromjson(s: &str) -> Result<MjValue, MjError> {
        let v: Value = serde_json::from_str(s)
            .map_err(|e| MjError::new(ErrorKind::InvalidOperation, format!("fromjson: {e}")))?;
        Ok(MjValue::from(Serde(&v)))
    }

    fn map_keys(v: &MjValue, filter: &str) -> Result<Vec<MjValue>, MjError> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => Ok(Vec::new()),
            ValueKind::Map => Ok(v.try_iter()?.collect()),
            kind => Err(MjError::new(
                ErrorKind::InvalidOperation,
                format!("{filter}: expected a mapping, got {kind}"),
            )),
        }
    }

    /// `m | keys`: the keys of a mapping as a list.
    fn keys(v: &MjValue) -> Result<MjValue, MjError> {
        Ok(MjValue::from(map_keys(v, "keys")?))
    }

    /// `m | values`: the values of a mapping as a list.
    fn values(v: &MjValue) -> Result<MjValue, MjError> {
        map_keys(v, "values")?
            .iter()
            .map(|k| v.get_item(k))
            .collect::<Result<Vec<_>, _>>()
            .map(MjValue::from)
    }

    /// `x | string`: the same text a mixed template would render.
    fn string(v: &MjValue) -> Result<String, MjError> {
        Ok(match text_form(v)? {
            Some(text) => text,
            None => v.to_string(),
        })
    }

    /// `s | b64encode`: standard base64 (with padding) of the UTF-8 bytes.
    fn b64encode(v: &MjValue) -> Result<String, MjError> {
        let bytes: Vec<u8> = match v.as_bytes() {
            Some(b) => b.to_vec(),
            None => string(v)?.into_bytes(),
        };
        Ok(base64::encode(&bytes))
    }

    /// `s | b64decode`: decode standard or URL-safe base64 to UTF-8 text.
    fn b64decode(s: &str) -> Result<String, MjError> {
        let bytes = base64::decode(s).ok_or_else(|| {
            MjError::new(ErrorKind::InvalidOperation, "b64decode: invalid base64")
        })?;
        String::from_utf8(bytes).map_err(|_| {
            MjError::new(
                ErrorKind::InvalidOperation,
                "b64decode: decoded bytes are not UTF-8",
            )
        })
    }

    /// `now()`: the current UTC time, RFC 3339.
    fn now() -> Result<String, MjError> {
        time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|e| MjError::new(ErrorKind::InvalidOperation, format!("now(): {e}")))
    }

    /// The ordering comparison used by conditions: false when an operand is
    /// undefined or null, or when the operands are not comparable.
    fn lenient_cmp(a: MjValue, op: &str, b: MjValue) -> bool {
        let numeric = |v: &MjValue| matches!(v.kind(), ValueKind::Number | ValueKind::Bool);
        let comparable = if numeric(&a) || numeric(&b) {
            numeric(&a) && numeric(&b)
        } else {
            a.kind() == b.kind() && !matches!(a.kind(), ValueKind::Undefined | ValueKind::None)
        };
        if !comparable {
            return false;
        }
        let ord = a.cmp(&b);
        match op {
            "<" => ord.is_lt(),
            "<=" => ord.is_le(),
            ">" => ord.is_gt(),
            ">=" => ord.is_ge(),
            _ => false,
        }
    }
}

/// The two base64 filters' codec: the `base64` crate, decoding standard or
/// URL-safe text with or without padding.
mod base64 {
    use ::base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
    use ::base64::engine::DecodePaddingMode;
    use ::base64::{alphabet, Engine as _};

    const LENIENT: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
    const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

    /// Standard base64 with padding.
    pub(super) fn encode(input: &[u8]) -> String {
        STANDARD.encode(input)
    }

    /// Decodes standard or URL-safe base64; padding optional, whitespace ignored.
    pub(super) fn decode(input: &str) -> Option<Vec<u8>> {
        let clean: String = input.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let engine = if clean.contains(['-', '_']) {
            &URL_SAFE_LENIENT
        } else {
            &STANDARD_LENIENT
        };
        engine.decode(clean).ok()
    }
}

/// Rewrites ordering comparisons of a Jinja expression into calls of a
/// lenient comparison function: `a < b` becomes `f(a, "<", b)`, chains
/// `a < b <= c` become `(f(a, "<", b) and f(b, "<=", c))`.
///
/// A small lexer groups brackets; comparison operands are delimited by the
/// tokens that bind looser than comparisons (`and`, `or`, `not`, `if`,
/// `else`, `,`, `:`, `=`). Returns `None` when the source does not lex
/// cleanly; callers then use the expression unchanged.
///
/// Why a lexer of our own: minijinja exposes its tokenizer and parser only
/// behind the `unstable_machinery` feature, whose API changes between
/// minor releases (1.0.16 changed `tokenize`'s arguments), and a source
/// rewrite needs byte spans of brackets and operators, not an AST. This one
/// reads expressions only (never `{% %}` statements), and whatever it does
/// not lex is left to minijinja unchanged.
mod cmp_rewrite {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Tk {
        Str,
        Num,
        Name,
        Op,
        Open,
        Close,
        Other,
    }

    #[derive(Debug, Clone, Copy)]
    struct Tok {
        kind: Tk,
        start: usize,
        end: usize,
    }

    #[derive(Debug)]
    enum Node {
        Tok(Tok),
        Group {
            open: Tok,
            children: Vec<Node>,
            close: Tok,
        },
    }

    impl Node {
        fn start(&self) -> usize {
            match self {
                Node::Tok(t) => t.start,
                Node::Group { open, .. } => open.start,
            }
        }
        fn end(&self) -> usize {
            match self {
                Node::Tok(t) => t.end,
                Node::Group { close, .. } => close.end,
            }
        }
    }

    fn lex(src: &str) -> Option<Vec<Tok>> {
        let b = src.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            let start = i;
            let kind = if c.is_ascii_whitespace() {
                i += 1;
                continue;
            } else if c == b'\'' || c == b'"' {
                i += 1;
                loop {
                    match b.get(i) {
                        None => return None,
                        Some(b'\\') => i += 2,
                        Some(&q) if q == c => {
                            i += 1;
                            break;
                        }
                        Some(_) => i += 1,
                    }
                }
                Tk::Str
            } else if c.is_ascii_digit() {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.')
                {
                    i += 1;
                }
                Tk::Num
            } else if c.is_ascii_alphabetic() || c == b'_' || !c.is_ascii() {
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || !b[i].is_ascii())
                {
                    i += 1;
                }
                Tk::Name
            } else if matches!(c, b'(' | b'[' | b'{') {
                i += 1;
                Tk::Open
            } else if matches!(c, b')' | b']' | b'}') {
                i += 1;
                Tk::Close
            } else {
                let two = src.get(i..i + 2).unwrap_or("");
                if ["==", "!=", "<=", ">=", "//", "**"].contains(&two) {
                    i += 2;
                } else {
                    i += 1;
                }
                if b"<>+-*/%~|.,:=!".contains(&c) {
                    Tk::Op
                } else {
                    Tk::Other
                }
            };
            out.push(Tok {
                kind,
                start,
                end: i,
            });
        }
        Some(out)
    }

    fn tree(toks: &[Tok], src: &str) -> Option<Vec<Node>> {
        let mut stack: Vec<(Option<Tok>, Vec<Node>)> = vec![(None, Vec::new())];
        for &t in toks {
            match t.kind {
                Tk::Open => stack.push((Some(t), Vec::new())),
                Tk::Close => {
                    let (open, children) = stack.pop()?;
                    let open = open?;
                    let pair = (&src[open.start..open.end], &src[t.start..t.end]);
                    if !matches!(pair, ("(", ")") | ("[", "]") | ("{", "}")) {
                        return None;
                    }
                    stack.last_mut()?.1.push(Node::Group {
                        open,
                        children,
                        close: t,
                    });
                }
                _ => stack.last_mut()?.1.push(Node::Tok(t)),
            }
        }
        if stack.len() != 1 {
            return None;
        }
        stack.pop().map(|(_, nodes)| nodes)
    }

    /// Rewrites `src`; `None` when it does not lex or nothing changes.
    pub(super) fn rewrite(src: &str, func: &str) -> Option<String> {
        let toks = lex(src)?;
        let nodes = tree(&toks, src)?;
        let out = Rewriter { src, func }.seq(&nodes);
        (out != src.trim()).then_some(out)
    }

    struct Rewriter<'a> {
        src: &'a str,
        func: &'a str,
    }

    /// A comparison operator at one nesting level, spanning `len` nodes.
    struct CmpOp {
        at: usize,
        len: usize,
        text: &'static str,
    }

    impl Rewriter<'_> {
        fn text(&self, t: &Tok) -> &str {
            &self.src[t.start..t.end]
        }

        fn name_at(&self, nodes: &[Node], i: usize) -> Option<&str> {
            match nodes.get(i) {
                Some(Node::Tok(t)) if t.kind == Tk::Name => Some(self.text(t)),
                _ => None,
            }
        }

        /// Emits a node, rewriting inside groups.
        fn node(&self, n: &Node) -> String {
            match n {
                Node::Tok(t) => self.text(t).to_string(),
                Node::Group {
                    open,
                    children,
                    close,
                } => {
                    let mut s = self.text(open).to_string();
                    s.push_str(&self.seq(children));
                    s.push_str(self.text(close));
                    s
                }
            }
        }

        /// Emits consecutive nodes, keeping the original gaps.
        fn plain(&self, nodes: &[Node]) -> String {
            let mut s = String::new();
            for (i, n) in nodes.iter().enumerate() {
                if i > 0 {
                    s.push_str(&self.src[nodes[i - 1].end()..n.start()]);
                }
                s.push_str(&self.node(n));
            }
            s
        }

        fn is_boundary(&self, nodes: &[Node], i: usize) -> bool {
            match &nodes[i] {
                Node::Tok(t) if t.kind == Tk::Op => {
                    matches!(self.text(t), "," | ":" | "=")
                }
                Node::Tok(t) if t.kind == Tk::Name => match self.text(t) {
                    "and" | "or" | "if" | "else" => true,
                    // `not in` is a comparison; `is not x` a test.
                    "not" => {
                        self.name_at(nodes, i + 1) != Some("in")
                            && (i == 0 || self.name_at(nodes, i - 1) != Some("is"))
                    }
                    _ => false,
                },
                _ => false,
            }
        }

        fn cmp_ops(&self, nodes: &[Node]) -> Vec<CmpOp> {
            let mut ops = Vec::new();
            let mut i = 0;
            while i < nodes.len() {
                let op = match &nodes[i] {
                    Node::Tok(t) if t.kind == Tk::Op => match self.text(t) {
                        "<" => Some(("<", 1)),
                        "<=" => Some(("<=", 1)),
                        ">" => Some((">", 1)),
                        ">=" => Some((">=", 1)),
                        "==" => Some(("==", 1)),
                        "!=" => Some(("!=", 1)),
                        _ => None,
                    },
                    Node::Tok(t) if t.kind == Tk::Name => {
                        let after_is = i > 0 && self.name_at(nodes, i - 1) == Some("is");
                        match self.text(t) {
                            "in" if !after_is => Some(("in", 1)),
                            "not" if !after_is && self.name_at(nodes, i + 1) == Some("in") => {
                                Some(("not in", 2))
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                };
                match op {
                    Some((text, len)) => {
                        ops.push(CmpOp { at: i, len, text });
                        i += len;
                    }
                    None => i += 1,
                }
            }
            ops
        }

        /// One segment between boundaries: a comparison chain or an operand.
        fn segment(&self, nodes: &[Node]) -> String {
            let ops = self.cmp_ops(nodes);
            let ordering = |o: &CmpOp| matches!(o.text, "<" | "<=" | ">" | ">=");
            if !ops.iter().any(ordering) {
                return self.plain(nodes);
            }
            let mut operands = Vec::new();
            let mut from = 0;
            for o in &ops {
                operands.push(self.plain(&nodes[from..o.at]));
                from = o.at + o.len;
            }
            operands.push(self.plain(&nodes[from..]));
            if operands.iter().any(|o| o.trim().is_empty()) {
                return self.plain(nodes);
            }
            let parts: Vec<String> = ops
                .iter()
                .enumerate()
                .map(|(k, o)| {
                    let (l, r) = (&operands[k], &operands[k + 1]);
                    if ordering(o) {
                        format!("{}({l}, \"{}\", {r})", self.func, o.text)
                    } else {
                        format!("(({l}) {} ({r}))", o.text)
                    }
                })
                .collect();
            if parts.len() == 1 {
                parts.into_iter().next().unwrap_or_default()
            } else {
                format!("({})", parts.join(" and "))
            }
        }

        /// Rewrites a node sequence at one nesting level.
        fn seq(&self, nodes: &[Node]) -> String {
            let mut out = String::new();
            let mut seg_start = 0;
            let mut last_end: Option<usize> = None;
            let mut push = |out: &mut String, text: String, start: usize, end: usize| {
                if let Some(prev) = last_end {
                    out.push_str(&self.src[prev..start]);
                }
                out.push_str(&text);
                last_end = Some(end);
            };
            for i in 0..=nodes.len() {
                let boundary = i == nodes.len() || self.is_boundary(nodes, i);
                if !boundary {
                    continue;
                }
                if seg_start < i {
                    let seg = &nodes[seg_start..i];
                    let text = self.segment(seg);
                    push(&mut out, text, seg[0].start(), seg[seg.len() - 1].end());
                }
                if i < nodes.len() {
                    let text = self.node(&nodes[i]);
                    push(&mut out, text, nodes[i].start(), nodes[i].end());
                }
                seg_start = i + 1;
            }
            out
        }
    }

    #[cfg(test)]
    mod tests {
        use super::rewrite;

        #[test]
        fn rewrites_ordering_comparisons_only() {
            assert_eq!(rewrite("a == 1", "f"), None);
            assert_eq!(rewrite("a < 3", "f").as_deref(), Some("f(a, \"<\", 3)"));
            assert_eq!(
                rewrite("not a.b >= 2 and c", "f").as_deref(),
                Some("not f(a.b, \">=\", 2) and c")
            );
            assert_eq!(
                rewrite("(x | int) + 1 > y * 2", "f").as_deref(),
                Some("f((x | int) + 1, \">\", y * 2)")
            );
            assert_eq!(
                rewrite("1 < a <= 3", "f").as_deref(),
                Some("(f(1, \"<\", a) and f(a, \"<=\", 3))")
            );
            assert_eq!(
                rewrite("x if a < '<' else y", "f").as_deref(),
                Some("x if f(a, \"<\", '<') else y")
            );
            assert_eq!(
                rewrite("[a < 1, b]", "f").as_deref(),
                Some("[f(a, \"<\", 1), b]")
            );
            assert_eq!(rewrite("'unterminated < 1", "f"), None);
        }
    }
}
