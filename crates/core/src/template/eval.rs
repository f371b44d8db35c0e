//! Evaluation: native values, lenient conditions and bounded text.

use super::engine::{engine, Engine, Entry, Kind, RESULT_VAR};
use super::scope::Scope;
use super::text::BoundedText;
use super::*;

pub(super) fn text_truthy(text: &str) -> bool {
    let t = text.trim();
    !(t.is_empty()
        || ["false", "0", "none", "null", "no"]
            .iter()
            .any(|f| t.eq_ignore_ascii_case(f)))
}

/// The expression of a string that is exactly one `{{ expr }}`.
pub(super) fn exact_inner(src: &str) -> Option<&str> {
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

pub(super) fn eval_cond_expr(expr: &str, src: &str, scope: &Scope) -> Result<bool, TemplateError> {
    let value = eval_mj(Kind::Cond, expr, src, scope, false)?;
    Ok(value.is_true())
}

pub(super) fn eval_native(
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
pub(super) fn is_lookup(expr: &str) -> bool {
    let e = expr.trim();
    !e.is_empty()
        && e.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '[' | ']' | '\'' | '"'))
}

/// The error of a render whose output passed [`MAX_TEMPLATE_OUTPUT_BYTES`].
pub(super) fn too_large(src: &str, size: usize) -> TemplateError {
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

pub(super) fn eval_mj(
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

pub(super) fn render_text_inner(
    src: &str,
    scope: &Scope,
    strict: bool,
) -> Result<String, TemplateError> {
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
pub(super) fn compile_error(engine: &Arc<Engine>, src: &str, e: MjError) -> TemplateError {
    match engine.entry(Kind::Text, src) {
        Err(text_err) => map_error(src, text_err),
        Ok(_) => map_error(src, e),
    }
}

pub(super) fn check_roots(entry: &Entry, src: &str, scope: &Scope) -> Result<(), TemplateError> {
    let unknown = (entry.roots.iter()).find(|r| !scope.knows(r) && !entry.guarded.contains(r));
    match unknown {
        Some(name) => Err(TemplateError::UndefinedVariable {
            name: name.clone(),
            template: src.to_string(),
        }),
        None => Ok(()),
    }
}

pub(super) fn to_json(value: &MjValue) -> Result<Value, String> {
    serde_json::to_value(value).map_err(|e| format!("result is not JSON: {e}"))
}

pub(super) fn map_error(src: &str, e: MjError) -> TemplateError {
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
