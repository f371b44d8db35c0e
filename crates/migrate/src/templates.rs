//! Pass 3: templates.

use std::collections::BTreeSet;

use noetl_core::yaml::{Node, NodeKind};

use crate::edits::*;
use crate::walk::*;

/// Where a template is, which decides what `output` means there.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place<'a> {
    /// Task policy (or a legacy task `set`): `output` is the outcome.
    Policy,
    /// A legacy step- or task-level `set`, which becomes a rule of the
    /// (last) task's policy: as in `Policy`, and the step's or task's own
    /// result, read by its name (`{{ fetch.rows }}` in step `fetch`), is the
    /// outcome's (`outcome.result.rows`): the rule runs before the step ends.
    OwnSet(&'a str),
    /// An arc: `output` is the boundary event.
    Arc,
    /// Anywhere else: `output` has no canonical meaning.
    Other,
}

/// What the template rewrite needs to know of the playbook.
#[derive(Clone)]
pub(crate) struct Names {
    /// Inside a loop step: its iterator's name (NoETL reads the element
    /// bare, `{{ item.id }}`; canonical `{{ iter.item.id }}`).
    pub(crate) iterator: Option<String>,
    /// Keys of the root `workload` (read bare in legacy templates).
    pub(crate) workload: BTreeSet<String>,
    /// Step and task names, and runtime variables: never rewritten.
    pub(crate) shadowing: BTreeSet<String>,
    /// Names a `set` or `set_ctx` of the workflow writes bare (NoETL's
    /// variables, read bare in its templates; canonical `ctx.<name>`).
    pub(crate) ctx_keys: BTreeSet<String>,
}

pub(crate) fn templates(root: &Node, e: &mut Edits) {
    let mut shadowing: BTreeSet<String> = noetl_core::template::RUNTIME_VARIABLES
        .iter()
        .map(|s| s.to_string())
        .collect();
    noetl_core::names::collect_names(root, &mut shadowing);
    let names = Names {
        iterator: None,
        workload: root
            .get("workload")
            .map(|w| w.entries().iter().map(|(k, _)| k.name.clone()).collect())
            .unwrap_or_default(),
        ctx_keys: (root.get("workflow"))
            .map(noetl_core::names::bare_set_keys)
            .unwrap_or_default(),
        shadowing,
    };
    for (step, step_name) in steps(root) {
        // In the step's tasks (and its `set`, which joins a task's policy)
        // the loop's element is `iter.<iterator>`.
        let in_loop = Names {
            iterator: step
                .get("loop")
                .and_then(|l| l.get("iterator"))
                .and_then(Node::as_str)
                .map(str::to_string),
            ..names.clone()
        };
        let python = step_kind(step) == Some("python");
        for (k, v) in step.entries() {
            let (place, names) = match k.name.as_str() {
                "next" => (Place::Arc, &names),
                // A step-level `set` becomes its last task's policy rule.
                "set" | "set_ctx" => (Place::OwnSet(step_name), &in_loop),
                // Rendered once for the step, before or after its
                // iterations.
                "step" | "desc" | "spec" | "loop" | "when" | "type" | "output" => {
                    (Place::Other, &names)
                }
                // Raw Python of a step that is its own task (`type: python`).
                "code" if python => continue,
                // The rest becomes its task's (`input` its `args`, a v1
                // step's tool fields the task's own): rendered per iteration.
                _ => (Place::Other, &in_loop),
            };
            if k.name == "tool" {
                continue; // tasks below, with their own places
            }
            walk_templates(v, place, names, e);
        }
        for (t, task_name) in step_tasks(step) {
            task_templates(t, &task_name, &in_loop, e);
        }
    }
    for (t, task_name) in workbook_task_nodes(root) {
        task_templates(t, &task_name, &names, e);
    }
}

pub(crate) fn task_templates(t: &Node, task_name: &str, names: &Names, e: &mut Edits) {
    let python = t.get("kind").and_then(Node::as_str) == Some("python");
    for (k, v) in t.entries() {
        if python && k.name == "code" {
            continue; // raw: Python, not a template
        }
        let place = match k.name.as_str() {
            "spec" => Place::Policy,
            "set" => Place::OwnSet(task_name),
            _ => Place::Other,
        };
        walk_templates(v, place, names, e);
    }
}

pub(crate) fn walk_templates(n: &Node, place: Place<'_>, names: &Names, e: &mut Edits) {
    match &n.kind {
        NodeKind::Str(s) if noetl_core::template::is_template(s) => {
            rewrite_scalar(n, s, place, names, e)
        }
        NodeKind::Seq(items) => items
            .iter()
            .for_each(|x| walk_templates(x, place, names, e)),
        NodeKind::Map(entries) => {
            for (_, v) in entries {
                walk_templates(v, place, names, e);
            }
        }
        _ => {}
    }
}

/// Rewrite the templates of the string `s` at node `n`, segment by segment,
/// where each segment appears in the text.
pub(crate) fn rewrite_scalar(n: &Node, s: &str, place: Place<'_>, names: &Names, e: &mut Edits) {
    let mut search_from = n.span.offset;
    for (seg_start, seg_end) in segments(s) {
        let old = &s[seg_start..seg_end];
        let (new, what, refused) = rewrite_expression(old, place, names);
        if let Some(why) = refused {
            e.refuse(n.span.line, why);
        }
        if new == old {
            continue;
        }
        let Some(found) = e.text[search_from..].find(old).map(|i| i + search_from) else {
            e.refuse(
                n.span.line,
                format!(
                    "{}: the template is written with escapes; rewrite it by hand",
                    what.join(", ")
                ),
            );
            continue;
        };
        let line = line_of(e.text, found);
        e.replace((found, found + old.len()), new, line, what.join(", "));
        search_from = found + old.len();
    }
}

/// Byte ranges of the `{{ ... }}` and `{% ... %}` blocks of `s`.
pub(crate) fn segments(s: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = s[at..].find(['{']) {
        let start = at + i;
        let close = match s[start..].get(..2) {
            Some("{{") => "}}",
            Some("{%") => "%}",
            _ => {
                at = start + 1;
                continue;
            }
        };
        match s[start + 2..].find(close) {
            Some(j) => {
                let end = start + 2 + j + 2;
                out.push((start, end));
                at = end;
            }
            None => break,
        }
    }
    out
}

/// Words of an expression that are never variable roots.
pub(crate) const NOT_ROOTS: &[&str] = &[
    "and",
    "or",
    "not",
    "in",
    "is",
    "if",
    "else",
    "elif",
    "endif",
    "for",
    "endfor",
    "true",
    "false",
    "none",
    "True",
    "False",
    "None",
    "set",
    "endset",
    "with",
    "endwith",
    "recursive",
];

/// The expression `expr` with its legacy roots rewritten; what was
/// rewritten; and why something was left (an `output` outside policy and
/// arcs).
pub(crate) fn rewrite_expression(
    expr: &str,
    place: Place<'_>,
    names: &Names,
) -> (String, Vec<String>, Option<String>) {
    let bytes = expr.as_bytes();
    let locals = loop_locals(expr);
    let mut out = String::with_capacity(expr.len() + 16);
    let mut what: Vec<String> = Vec::new();
    let mut refused = None;
    let mut i = 0;
    let mut prev_sig: Option<u8> = None; // last non-space byte outside words
    let mut prev_word: Option<&str> = None;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'"' || b == b'\'' {
            let end = expr[i + 1..]
                .find(b as char)
                .map_or(bytes.len(), |j| i + 1 + j + 1);
            out.push_str(&expr[i..end]);
            i = end;
            prev_sig = Some(b);
            prev_word = None;
            continue;
        }
        if b.is_ascii_alphabetic() || b == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &expr[start..i];
            let next = expr[i..].trim_start();
            // `name=value` in a call is a keyword argument, not a variable.
            let kwarg = next.starts_with('=') && !next.starts_with("==");
            let is_root = prev_sig != Some(b'.')
                && prev_sig != Some(b'|')
                && prev_word != Some("is")
                && !NOT_ROOTS.contains(&word)
                && !locals.contains(word)
                && !kwarg
                && !next.starts_with('(');
            let replaced = if is_root {
                root_rewrite(word, next, place, names, &mut what, &mut refused)
            } else {
                None
            };
            match replaced {
                Some((text, consumed)) => {
                    out.push_str(&text);
                    // `output.data` → `<o>.result`: skip the `.data` consumed.
                    let skip = expr[i..].len() - expr[i..].trim_start().len();
                    if consumed > 0 {
                        i += skip + consumed;
                    }
                }
                None => out.push_str(word),
            }
            prev_word = Some(word);
            prev_sig = None;
            continue;
        }
        if !b.is_ascii_whitespace() {
            prev_sig = Some(b);
            prev_word = None;
        }
        out.push(b as char);
        i += 1;
    }
    (out, what, refused)
}

/// The rewrite of root `word` (followed by `next`): its new text and how
/// many bytes of `next` it replaces too.
pub(crate) fn root_rewrite(
    word: &str,
    next: &str,
    place: Place<'_>,
    names: &Names,
    what: &mut Vec<String>,
    refused: &mut Option<String>,
) -> Option<(String, usize)> {
    match word {
        own if place == Place::OwnSet(own) && !next.starts_with('(') => {
            what.push(format!("`{own}` (its own result) → `outcome.result`"));
            Some(("outcome.result".into(), 0))
        }
        "output" => {
            let base = match place {
                Place::Policy | Place::OwnSet(_) => "outcome",
                Place::Arc => "event",
                Place::Other => {
                    *refused = Some("`output` outside a task policy or an arc has no canonical equivalent; left as written (the engine reads it as the current result envelope)".into());
                    return None;
                }
            };
            if next.starts_with(".data")
                && !next[5..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            {
                what.push(format!("`output.data` → `{base}.result`"));
                Some((format!("{base}.result"), ".data".len()))
            } else {
                what.push(format!("`output` → `{base}`"));
                Some((base.to_string(), 0))
            }
        }
        // NoETL v1 arcs read the step's result as `result`.
        "result"
            if place == Place::Arc
                && !names.shadowing.contains("result")
                && !names.workload.contains("result") =>
        {
            what.push("`result` → `event.result`".into());
            Some(("event.result".into(), 0))
        }
        "_index" => {
            what.push("`_index` → `iter.index`".into());
            Some(("iter.index".into(), 0))
        }
        // NoETL's job: the running execution.
        "job" if !names.shadowing.contains("job") && !names.workload.contains("job") => {
            let field = [".uuid", ".execution_id", ".id"].into_iter().find(|f| {
                next.starts_with(f)
                    && !next[f.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })?;
            what.push(format!("`job{field}` → `execution_id`"));
            Some(("execution_id".into(), field.len()))
        }
        // NoETL binds the iteration's index bare in a loop step's tasks.
        "loop_index"
            if names.iterator.is_some()
                && !names.shadowing.contains("loop_index")
                && !names.workload.contains("loop_index") =>
        {
            what.push("`loop_index` (the iteration's index) → `iter.index`".into());
            Some(("iter.index".into(), 0))
        }
        w if names.iterator.as_deref() == Some(w)
            && !names.shadowing.contains(w)
            && !names.workload.contains(w) =>
        {
            what.push(format!("`{w}` (the loop's element) → `iter.{w}`"));
            Some((format!("iter.{w}"), 0))
        }
        w if names.workload.contains(w) && !names.shadowing.contains(w) => {
            what.push(format!("`{w}` → `workload.{w}`"));
            Some((format!("workload.{w}"), 0))
        }
        // NoETL reads its variables bare: a name some `set` writes.
        w if names.ctx_keys.contains(w) && !names.shadowing.contains(w) => {
            what.push(format!("`{w}` (written by a `set`) → `ctx.{w}`"));
            Some((format!("ctx.{w}"), 0))
        }
        _ => None,
    }
}

/// Names a `{% for x in ... %}` or `{% set x = ... %}` binds in `expr`.
pub(crate) fn loop_locals(expr: &str) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    let words: Vec<&str> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ','))
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        if *w == "for" || *w == "set" {
            if let Some(bound) = words.get(i + 1) {
                out.extend(bound.split(',').filter(|x| !x.is_empty()));
            }
        }
    }
    out
}
