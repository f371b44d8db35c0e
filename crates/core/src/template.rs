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
//!   like `wrokload`): see [`TemplateError::UndefinedVariable`], unless the
//!   template tests the name for being defined (`x is defined`,
//!   `x | default(...)`: [`guarded_roots`]). Missing nested
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

mod base64;
mod cmp_rewrite;
mod engine;
mod eval;
mod funcs;
mod guards;
mod names;
mod scope;
mod text;

pub use names::{NameKind, UnknownName};
pub use scope::{output_view, Scope};

/// True when `s` contains template syntax (`{{`, `{%` or `{#`).
pub fn is_template(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

/// Checks that `src` (text that may contain `{{ }}` / `{% %}`) parses.
pub fn check_syntax(src: &str) -> Result<(), TemplateError> {
    if !is_template(src) {
        return Ok(());
    }
    engine::engine()
        .entry(engine::Kind::Text, src)
        .map(|_| ())
        .map_err(|e| eval::map_error(src, e))
}

/// The filters and tests `src` applies that the engine does not have
/// (sorted, each once): a render fails on each when it reaches it. Empty
/// when `src` has no template syntax or does not parse.
pub fn unknown_names(src: &str) -> Vec<UnknownName> {
    if !is_template(src) {
        return Vec::new();
    }
    names::unknown_in(engine::Kind::Text, src)
}

/// Checks condition `src` (a `when`) as [`eval_condition`] compiles it: a
/// bare expression (`a == 1`) or one `{{ expr }}` as an expression, other
/// text as a template. `Ok` holds the filters and tests it applies that
/// the engine lacks ([`unknown_names`]).
pub fn check_condition(src: &str) -> Result<Vec<UnknownName>, TemplateError> {
    let trimmed = src.trim();
    let (kind, compiled) = if !is_template(trimmed) {
        if trimmed.is_empty()
            || trimmed.eq_ignore_ascii_case("true")
            || trimmed.eq_ignore_ascii_case("false")
        {
            return Ok(Vec::new());
        }
        (engine::Kind::Cond, trimmed)
    } else {
        match eval::exact_inner(trimmed) {
            Some(expr) => (engine::Kind::Cond, expr),
            None => (engine::Kind::Text, src),
        }
    };
    engine::engine()
        .entry(kind, compiled)
        .map_err(|e| eval::map_error(src, e))?;
    Ok(names::unknown_in(kind, compiled))
}

/// The top-level variable names `src` reads (sorted, without builtin
/// functions such as `range` or `now`). Empty when `src` has no template
/// syntax or does not parse (use [`check_syntax`] to report that).
pub fn referenced_roots(src: &str) -> Vec<String> {
    of_entry(src, |e| e.roots.clone())
}

/// Of [`referenced_roots`], the names `src` tests for being defined
/// (`x is defined`, `x is undefined`, `x | default(...)`, each maybe
/// after attributes of `x`): a value template reads them without the
/// unknown-name check, as undefined when missing.
pub fn guarded_roots(src: &str) -> Vec<String> {
    of_entry(src, |e| e.guarded.clone())
}

/// `read` of the compiled entry of `src` as text; empty when `src` is no
/// template or does not parse.
fn of_entry(src: &str, read: impl FnOnce(&engine::Entry) -> Vec<String>) -> Vec<String> {
    if !is_template(src) {
        return Vec::new();
    }
    engine::engine()
        .entry(engine::Kind::Text, src)
        .map(|e| read(&e))
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
    let name = format!("{}{src}", engine::Kind::Text.prefix());
    let e = engine::engine();
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
    match eval::exact_inner(src) {
        Some(expr) => eval::eval_native(engine::Kind::Expr, expr, src, scope, true),
        None => eval::render_text_inner(src, scope, true).map(Value::String),
    }
}

/// Renders `src` to text (an exact expression is rendered as text too).
pub fn render_text(src: &str, scope: &Scope) -> Result<String, TemplateError> {
    if !is_template(src) {
        return Ok(src.to_string());
    }
    eval::render_text_inner(src, scope, true)
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
        return eval::eval_cond_expr(trimmed, src, scope);
    }
    match eval::exact_inner(trimmed) {
        Some(expr) => eval::eval_cond_expr(expr, src, scope),
        None => {
            let text = eval::render_text_inner(src, scope, false)?;
            Ok(eval::text_truthy(&text))
        }
    }
}
