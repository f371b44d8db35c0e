//! `noetl migrate`, NoETL v2 shapes in pass 4 (structure): keychain
//! cloud secrets, task retries, step inputs, `set` moved under `spec`.

use super::shapes::ROOT_SECTIONS;
use crate::edits::{entry_end, line_start, next_line, replace_entry, value_text, Edits};
use crate::snippets::{fallback_rule, reindent};
use crate::walk::{steps, tasks};
use noetl_core::yaml::{Key, Node, NodeKind};

/// The structural rewrites of NoETL shapes.
pub(super) fn structure(root: &Node, e: &mut Edits) {
    for (t, name) in tasks(root) {
        task_retry(t, &name, e);
        if t.get("kind").and_then(Node::as_str) == Some("playbook") && t.get("name").is_some() {
            if let Some((k, _)) = t.entry("task") {
                let summary =
                    format!("task `{name}`: `task` removed (a label NoETL only logs; `name` labels the task)");
                replace_entry(e, k.span.offset, String::new(), k.span.line, summary);
            }
        }
    }
    for (t, name) in workbook_tasks(root) {
        if let Some((k, _)) = t.entry("assert") {
            comment_out(
                e,
                k,
                format!(
                    "workbook task `{name}`: `assert` commented out (no NoETL engine reads it)"
                ),
            );
        }
    }
    for entry in root.get("keychain").map(Node::items).unwrap_or_default() {
        cloud_secret(entry, e);
    }
    for (t, name) in tasks(root) {
        // A task's own `output` (NoETL's Rust worker): the same hint.
        let kind = t
            .get("kind")
            .and_then(Node::as_str)
            .and_then(noetl_core::tool::kind);
        if let (Some(kind), Some((k, v))) = (kind, t.entry("output")) {
            if !kind.fields.iter().any(|f| f.name == "output") && v.is_map() {
                comment_out(e, k, format!("task `{name}`: `output` (NoETL's result-storage hint: `store`, `inline_max_bytes`) commented out: a result above `max_payload_bytes` travels by reference"));
            }
        }
    }
    for (s, name) in steps(root) {
        step_input(s, name, e);
        if let Some((k, _)) = s.entry("output") {
            comment_out(e, k, format!("step `{name}`: `output` (NoETL's result-storage hint: `output_select`, `store`) commented out: a result above `max_payload_bytes` travels by reference, and templates read it whole"));
        }
    }
    for (k, _) in root.entries() {
        if !ROOT_SECTIONS.contains(&k.name.as_str()) {
            comment_out(
                e,
                k,
                format!(
                    "root `{}`: commented out (not a section NoETL's engines read)",
                    k.name
                ),
            );
        }
    }
}

/// The workbook's tasks with their names.
fn workbook_tasks(root: &Node) -> Vec<(&Node, String)> {
    let Some(wb) = root.get("workbook") else {
        return Vec::new();
    };
    let list = wb.get("tasks").unwrap_or(wb);
    match &list.kind {
        NodeKind::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, t)| (t, crate::walk::name_of(t, i)))
            .collect(),
        NodeKind::Map(entries) => entries.iter().map(|(k, t)| (t, k.name.clone())).collect(),
        _ => Vec::new(),
    }
}

/// Turn the entry whose key is `k` into comments (`# ` after each line's
/// indentation), keeping what it said.
/// A keychain entry NoETL fetches from a cloud secret manager
/// (`kind: secrets` / `secret_manager`, `provider`, `map` of the fields and
/// their secret paths): with a `provider` this engine reaches (`aws`,
/// `gcp`) and a `map`, it stays a `secret_manager` entry (`secrets`
/// renamed); otherwise it becomes a `secret` of the local encrypted store,
/// which the user fills (`noetl credential put`). `{{ keychain.name.field
/// }}` reads the same fields either way.
fn cloud_secret(entry: &Node, e: &mut Edits) {
    let Some((_, kind)) = entry
        .entry("kind")
        .filter(|(_, v)| matches!(v.as_str(), Some("secrets" | "secret_manager")))
    else {
        return;
    };
    let name = entry.get("name").and_then(Node::as_str).unwrap_or("?");
    let reached = entry
        .get("provider")
        .and_then(Node::as_str)
        .is_some_and(|p| noetl_core::validate::SECRET_PROVIDERS_REACHED.contains(&p));
    if reached && entry.get("map").is_some_and(Node::is_map) {
        if kind.as_str() == Some("secrets") {
            let quoted = e.text[kind.span.offset..].starts_with(['"', '\'']);
            let end = kind.span.offset + "secrets".len() + if quoted { 2 } else { 0 };
            e.replace(
                (kind.span.offset, end),
                "secret_manager".into(),
                kind.span.line,
                format!("keychain `{name}`: `kind: secrets` → `kind: secret_manager` (its `map` is read from the secret manager of `provider` when used)"),
            );
        }
        return;
    }
    let fields: Vec<&str> = entry
        .get("map")
        .map(Node::entries)
        .unwrap_or_default()
        .iter()
        .map(|(k, _)| k.name.as_str())
        .collect();
    let fields = if fields.is_empty() {
        String::new()
    } else {
        format!(" with the fields {}", fields.join(", "))
    };
    let was = kind.as_str().unwrap_or_default();
    let quoted = e.text[kind.span.offset..].starts_with(['"', '\'']);
    let end = kind.span.offset + was.len() + if quoted { 2 } else { 0 };
    e.replace(
        (kind.span.offset, end),
        "secret".into(),
        kind.span.line,
        format!("keychain `{name}`: `kind: {was}` (a cloud secret manager, not reached here) → `kind: secret`: store its value with `noetl credential put {name} --kind secret`{fields}"),
    );
    for key in ["provider", "auth", "map"] {
        if let Some((k, _)) = entry.entry(key) {
            comment_out(
                e,
                k,
                format!(
                    "keychain `{name}`: `{key}` (where the secret manager keeps it) commented out"
                ),
            );
        }
    }
}

fn comment_out(e: &mut Edits, k: &Key, summary: String) {
    let text = e.text;
    let from = line_start(text, k.span.offset);
    if !text[from..k.span.offset].trim().is_empty() {
        // `- output: ...` or a flow mapping: the line holds more than it.
        e.refuse(
            k.span.line,
            format!("{summary}: it shares its line with other keys; delete it by hand"),
        );
        return;
    }
    let to = entry_end(text, k.span.offset);
    let indent = k.span.offset - from;
    let with: String = text[from..to]
        .split_inclusive('\n')
        .map(|l| {
            let body = l.trim_start_matches(' ');
            if body.trim().is_empty() {
                l.to_string()
            } else {
                let have = l.len() - body.len();
                let at = have.min(indent);
                format!("{}# {}", &l[..at], &l[at..])
            }
        })
        .collect();
    e.replace((from, to), with, k.span.line, summary);
}

/// NoETL's task `retry` (`true`, a number of attempts, or
/// `{max_attempts, delay | initial_delay, backoff, backoff_multiplier,
/// max_delay, jitter, retry_on}`) → a retry rule of the task's policy.
/// `retry_on` names error kinds: other errors fail at once, as before.
fn task_retry(t: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = t.entry("retry") else {
        return;
    };
    let line = k.span.line;
    let refuse = |e: &mut Edits, why: &str| {
        e.refuse(line, format!("task `{name}`: `retry` {why}: write a retry rule in `spec.policy.rules` (`- when: \"{{{{ outcome.status == 'error' }}}}\"` / `then: {{ do: retry, attempts: N, delay: S }}`)"));
    };
    if t.get("spec").is_some() {
        refuse(e, "next to a `spec`");
        return;
    }
    let spec = match retry_of(v) {
        Ok(Some(r)) => r,
        Ok(None) => {
            let summary =
                format!("task `{name}`: `retry: false` removed (no retry is the default)");
            replace_entry(e, k.span.offset, String::new(), line, summary);
            return;
        }
        Err(why) => {
            refuse(e, &why);
            return;
        }
    };
    let text = e.text;
    let pad = " ".repeat(k.span.offset - line_start(text, k.span.offset));
    let mut then = format!("do: retry, attempts: {}", spec.attempts);
    if let Some(b) = spec.backoff {
        then.push_str(&format!(", backoff: {b}"));
    }
    if let Some(d) = spec.delay {
        then.push_str(&format!(", delay: {d}"));
    }
    let when = match &spec.on {
        Some(on) => format!("{{{{ outcome.status == 'error' and {on} }}}}"),
        None => "{{ outcome.status == 'error' }}".to_string(),
    };
    let mut with = format!(
        "{pad}spec:\n{pad}  policy:\n{pad}    rules:\n{pad}      - when: \"{when}\"\n{pad}        then: {{ {then} }}\n"
    );
    if spec.on.is_some() {
        with.push_str(&format!(
            "{pad}      - when: \"{{{{ outcome.status == 'error' }}}}\"\n{pad}        then: {{ do: fail }}\n"
        ));
    }
    let summary = format!(
        "task `{name}`: `retry` → a retry rule of its `spec.policy` (attempts: {})",
        spec.attempts
    );
    replace_entry(e, k.span.offset, with, line, summary);
}

/// A NoETL `retry`, read.
struct Retry {
    attempts: u64,
    delay: Option<f64>,
    backoff: Option<&'static str>,
    /// Only errors this condition holds for (`outcome.error.kind in [...]`,
    /// `outcome.http.status in [...]`).
    on: Option<String>,
}

/// The retry `v` asks for (`None`: no retry), or why it cannot be read.
fn retry_of(v: &Node) -> Result<Option<Retry>, String> {
    let number = |n: &Node| match &n.kind {
        NodeKind::Int(i) => Some(*i as f64),
        NodeKind::Float(f) => Some(*f),
        _ => None,
    };
    let plain = |attempts| Retry {
        attempts,
        delay: None,
        backoff: None,
        on: None,
    };
    match &v.kind {
        NodeKind::Bool(false) => return Ok(None),
        NodeKind::Bool(true) => return Ok(Some(plain(3))),
        NodeKind::Int(n) if *n >= 1 => return Ok(Some(plain(*n as u64))),
        NodeKind::Map(_) => {}
        NodeKind::Seq(_) => {
            return Err("is a list of `when`/`then` policies".into());
        }
        _ => return Err(format!("is a {}", v.type_name())),
    }
    let mut r = plain(3);
    for (k, x) in v.entries() {
        match k.name.as_str() {
            "max_attempts" | "attempts" => match &x.kind {
                NodeKind::Int(n) if *n >= 1 => r.attempts = *n as u64,
                _ => return Err(format!("`{}` is not a whole number ≥ 1", k.name)),
            },
            "delay" | "initial_delay" | "backoff_seconds" => {
                r.delay = Some(number(x).ok_or_else(|| format!("`{}` is not a number", k.name))?)
            }
            "backoff" => match (number(x), x.as_str()) {
                (Some(d), _) => {
                    r.delay.get_or_insert(d);
                }
                (_, Some(b @ ("none" | "linear" | "exponential"))) => {
                    r.backoff = Some(match b {
                        "none" => "none",
                        "linear" => "linear",
                        _ => "exponential",
                    })
                }
                (_, Some("fixed" | "constant")) => r.backoff = Some("none"),
                _ => return Err("`backoff` is neither seconds nor none/linear/exponential".into()),
            },
            "backoff_multiplier" => match number(x) {
                Some(m) if m > 1.0 => r.backoff = Some("exponential"),
                Some(_) => r.backoff = Some("none"),
                None => return Err("`backoff_multiplier` is not a number".into()),
            },
            // The canonical delay is capped at 300 s; jitter is not modelled.
            "max_delay" | "jitter" => {}
            "retry_on" | "retry_on_status" => {
                let values: Vec<String> = x
                    .items()
                    .iter()
                    .filter_map(|i| match &i.kind {
                        NodeKind::Str(s) if k.name == "retry_on" => Some(format!("'{s}'")),
                        NodeKind::Int(n) if k.name == "retry_on_status" => Some(n.to_string()),
                        _ => None,
                    })
                    .collect();
                if values.is_empty() || values.len() != x.items().len() {
                    return Err(format!(
                        "`{}` is not a list of {}",
                        k.name,
                        if k.name == "retry_on" {
                            "error kinds"
                        } else {
                            "HTTP statuses"
                        }
                    ));
                }
                let field = if k.name == "retry_on" {
                    "outcome.error.kind"
                } else {
                    "outcome.http.status"
                };
                let cond = format!("{field} in [{}]", values.join(", "));
                r.on = Some(match r.on.take() {
                    Some(other) => format!("({other} or {cond})"),
                    None => cond,
                });
            }
            other => return Err(format!("has `{other}`")),
        }
    }
    Ok(Some(r))
}

/// A step's `input` (NoETL: values rendered for the step's tool, which
/// reads them as its inputs) → `args` of its one task.
fn step_input(s: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = s.entry("input") else {
        return;
    };
    let line = k.span.line;
    let refuse = |e: &mut Edits, why: String| {
        e.refuse(line, format!("step `{name}`: `input` {why}: pass the values as `args` of the task that reads them"));
    };
    let task = match s.get("tool").map(|t| (&t.kind, t)) {
        Some((NodeKind::Map(_), t)) => t,
        Some((NodeKind::Seq(items), _)) if items.len() == 1 => match items[0].entries() {
            [(_, body)] if body.is_map() && items[0].get("kind").is_none() => body,
            _ => &items[0],
        },
        Some((NodeKind::Seq(items), _)) => {
            return refuse(e, format!("on a pipeline of {} tasks", items.len()));
        }
        _ => return refuse(e, "on a step without a task list".into()),
    };
    if !v.is_map() {
        return refuse(e, format!("is a {}", v.type_name()));
    }
    let kind = task.get("kind").and_then(Node::as_str).unwrap_or("?");
    let takes_args = kind == "workbook"
        || noetl_core::tool::kind(kind).is_some_and(|k| k.fields.iter().any(|f| f.name == "args"));
    if !takes_args {
        return refuse(e, format!("on a {kind} task, which has no `args`"));
    }
    let text = e.text;
    let value = value_text(text, k.span.offset, v);
    if let Some((ak, av)) = task.entry("args") {
        if !av.entries().is_empty() || !av.is_map() {
            return refuse(e, "next to the task's own `args`".into());
        }
        // `args: {}`: the step's values take its place.
        let ak_indent = ak.span.offset - line_start(text, ak.span.offset);
        let with = args_text(text, (k, v), value, ak_indent);
        let summary =
            format!("step `{name}`: `input` → `args` of its task (rendered when the task runs)");
        replace_entry(e, ak.span.offset, with, line, summary);
        crate::edits::remove_entry(e, k.span.offset);
        return;
    }
    let Some((last_key, _)) = task.entries().last() else {
        return;
    };
    let before = &text[line_start(text, last_key.span.offset)..last_key.span.offset];
    if !before.trim_start_matches([' ', '-']).is_empty() {
        return refuse(e, "with a task in flow style".into());
    }
    let indent = last_key.span.offset - line_start(text, last_key.span.offset);
    let at = entry_end(text, last_key.span.offset);
    let with = args_text(text, (k, v), value, indent);
    let summary =
        format!("step `{name}`: `input` → `args` of its task (rendered when the task runs)");
    e.replace((at, at), with, line, summary);
    crate::edits::remove_entry(e, k.span.offset);
}

/// `args:` at column `indent` holding the value of the entry `(k, v)`
/// (whose text is `value`).
fn args_text(text: &str, (k, v): (&Key, &Node), value: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    if v.span.offset < next_line(text, k.span.offset) {
        format!("{pad}args: {value}\n")
    } else {
        let block_indent = v.span.offset - line_start(text, v.span.offset);
        format!("{pad}args:\n{}", reindent(value, block_indent, indent + 2))
    }
}

/// A step-level `set` whose last task has a `spec` without `policy`: the
/// fallback rule goes into that `spec` (`task` is the task, `entry` the
/// step's `set`). `false` when the spec cannot take it.
pub(super) fn set_into_spec(
    task: &Node,
    entry: (&Key, &Node),
    e: &mut Edits,
    summary: String,
) -> bool {
    let Some((sk, spec)) = task.entry("spec") else {
        return false;
    };
    let text = e.text;
    if !spec.is_map()
        || spec.get("policy").is_some()
        || spec.span.offset < next_line(text, sk.span.offset)
    {
        return false;
    }
    let child = spec.span.offset - line_start(text, spec.span.offset);
    let (_, rule) = fallback_rule(text, entry, child.saturating_sub(2));
    // Drop its `spec:` line: the rest sits at the spec's children's column.
    let policy = &rule[next_line(&rule, 0)..];
    let at = entry_end(text, sk.span.offset);
    e.replace((at, at), policy.to_string(), entry.0.span.line, summary);
    true
}
