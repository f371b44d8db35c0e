//! Pass 4: structure.

use noetl_core::yaml::{Node, NodeKind};

use crate::edits::*;
use crate::snippets::{fallback_rule, reindent, yaml_scalar};
use crate::walk::*;
use crate::{keychain, shape_structure, tool_fields};

pub(crate) fn structure(root: &Node, e: &mut Edits) {
    for rule in rules(root) {
        else_without_then(rule, e);
    }
    for (t, name) in tasks(root) {
        task_set(t, &name, e);
        python_libs(t, &name, e);
        workbook_call(t, &name, e);
    }
    tool_fields::structure(root, e);
    for (s, name) in steps(root) {
        step_when(s, name, e);
        step_set(s, name, e);
        step_as_task(s, name, e);
        legacy_next(s, name, e);
        for (k, _) in s.entries() {
            if let Some((_, hint)) = REFUSED_STEP_KEYS.iter().find(|(key, _)| *key == k.name) {
                e.refuse(k.span.line, format!("step `{name}`: {hint}"));
            }
        }
    }
    shape_structure::structure(root, e);
    keychain::registered_credentials(root, e);
    keychain::declarations(root, e);
}

/// `- else: {do: ...}` → `- else: {then: {do: ...}}`.
pub(crate) fn else_without_then(rule: &Node, e: &mut Edits) {
    let Some((k, v)) = rule.entry("else") else {
        return;
    };
    if !v.is_map() || v.get("then").is_some() || rule.get("then").is_some() {
        return;
    }
    let line = k.span.line;
    let summary = "`else` without `then` → `else: { then: ... }`".to_string();
    let text = e.text;
    if v.span.offset < next_line(text, k.span.offset) {
        // Flow: `else: { do: continue }`.
        let Some(end) = flow_end(text, v.span.offset) else {
            e.refuse(line, format!("{summary}: unbalanced braces"));
            return;
        };
        let inner = &text[v.span.offset..end];
        e.replace(
            (v.span.offset, end),
            format!("{{ then: {inner} }}"),
            line,
            summary,
        );
    } else {
        // Block: indent the children under a new `then:`.
        let from = next_line(text, k.span.offset);
        let to = entry_end(text, k.span.offset);
        let child_indent = indent_at(text, line_start(text, v.span.offset));
        let body = indent_lines(&text[from..to], 2);
        let with = format!("{}then:\n{body}", " ".repeat(child_indent));
        e.replace((from, to), with, line, summary);
    }
}

/// A task-level `set:` → a fallback rule of its policy that sets `ctx`.
pub(crate) fn task_set(t: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = t.entry("set") else { return };
    let line = k.span.line;
    if t.get("spec").is_some() {
        tool_fields::set_beside_spec(t, &format!("task `{name}`: `set`"), (k, v), e);
        return;
    }
    let indent = k.span.offset - line_start(e.text, k.span.offset);
    let (field, with) = fallback_rule(e.text, (k, v), indent);
    let summary = format!("task `{name}`: `set` → `{field}` in a `spec.policy` fallback rule");
    replace_entry(e, k.span.offset, with, line, summary);
}

/// A step's own keys: the canonical ones and the legacy ones migrate
/// rewrites in place. A NoETL v1 step's other keys are its task's, except
/// the refused ones ([`REFUSED_STEP_KEYS`]).
pub(crate) const STEP_KEYS: &[&str] = &[
    "step", "desc", "spec", "loop", "tool", "type", "next", "when", "set", "set_ctx", "input",
    "output",
];

/// Legacy step keys `noetl migrate` leaves as written, with what to write
/// instead.
pub(crate) const REFUSED_STEP_KEYS: &[(&str, &str)] = &[
    ("case", "step-level `case`: write its branches as task policy rules (`spec.policy.rules`) and routing as `next.arcs`"),
    ("eval", EVAL_HINT),
    ("expr", EVAL_HINT),
    ("vars", "step-level `vars`: write them with `set_ctx` (execution) or `set_iter` (iteration) in a task policy rule"),
    ("sink", "`sink`: add a storage task (postgres, duckdb, http) that writes the data and returns a reference"),
    ("save", "`save`: add a storage task (postgres, duckdb, http) that writes the data, or drop it (events already record every result)"),
    ("pipe", "`pipe`: list its tasks under `tool` (the ordered pipeline)"),
    ("command", WORK_HINT),
];
pub(crate) const EVAL_HINT: &str =
    "step-level `eval`/`expr`: write the conditions as task policy rules or arc `when`s";
pub(crate) const WORK_HINT: &str = "step `command`: move the work into a task of the step's `tool`";

/// A NoETL v1 step that is its own task (`tool: python` or `type: python`
/// with `code` beside it) → a pipeline of one task named after the step;
/// `tool: workbook` with `name: <task>` → a `kind: workbook` call;
/// `tool: router` / `type: end` (a step that only routes) → no `tool`.
pub(crate) fn step_as_task(s: &Node, name: &str, e: &mut Edits) {
    let kind_key = match s.get("tool") {
        Some(t) if t.as_str().is_none() => return, // a canonical pipeline
        Some(_) => "tool",
        None => "type",
    };
    let Some((tk, kind)) = s.entry(kind_key).and_then(|(k, v)| Some((k, v.as_str()?))) else {
        return;
    };
    let line = tk.span.line;
    let fields: Vec<&(noetl_core::yaml::Key, Node)> = s
        .entries()
        .iter()
        .filter(|(k, _)| {
            !STEP_KEYS.contains(&k.name.as_str())
                && !REFUSED_STEP_KEYS.iter().any(|(key, _)| *key == k.name)
        })
        .collect();
    let text = e.text;
    let key_indent = tk.span.offset - line_start(text, tk.span.offset);
    if fields
        .iter()
        .any(|(k, _)| k.span.offset - line_start(text, k.span.offset) != key_indent)
    {
        e.refuse(line, format!("step `{name}`: `tool: {kind}` with its fields in flow style: list the task under `tool` by hand"));
        return;
    }
    if matches!(kind, "router" | "end" | "start") {
        if let Some((k, _)) = fields.first() {
            e.refuse(k.span.line, format!("step `{name}`: `{kind_key}: {kind}` with task field `{}`: a routing step has no task", k.name));
            return;
        }
        let summary = format!(
            "step `{name}`: `{kind_key}: {kind}` removed (a step without tasks only routes)"
        );
        replace_entry(e, tk.span.offset, String::new(), line, summary);
        return;
    }
    let pad = " ".repeat(key_indent);
    let mut task = format!("{pad}tool:\n{pad}  - name: {}\n", yaml_scalar(name));
    if kind == "workbook" {
        let Some(target) = s.get("name").and_then(Node::as_str) else {
            e.refuse(line, format!("step `{name}`: `tool: workbook` without `name`: name the workbook task (`task:`) by hand"));
            return;
        };
        task.push_str(&format!(
            "{pad}    kind: workbook\n{pad}    task: {}\n",
            yaml_scalar(target)
        ));
    } else {
        task.push_str(&format!("{pad}    kind: {}\n", yaml_scalar(kind)));
    }
    for (k, _) in &fields {
        if kind == "workbook" && k.name == "name" {
            remove_entry(e, k.span.offset);
            continue;
        }
        let from = line_start(text, k.span.offset);
        let to = entry_end(text, k.span.offset);
        task.push_str(&reindent(&text[from..to], key_indent, key_indent + 4));
        remove_entry(e, k.span.offset);
    }
    let summary = format!(
        "step `{name}`: `{kind_key}: {kind}` with its fields → a pipeline of one task `{name}`"
    );
    replace_entry(e, tk.span.offset, task, line, summary);
}

/// A step-level `set:` / `set_ctx:` (applied when the step ends) → a
/// fallback rule of its last task's policy, after the error case (an
/// error fails the task, as before), so it runs when the step's last task
/// ends well.
pub(crate) fn step_set(s: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = s.entry("set_ctx").or_else(|| s.entry("set")) else {
        return;
    };
    let line = k.span.line;
    let last = match s.get("tool").map(|t| &t.kind) {
        Some(NodeKind::Seq(items)) => items.last().map(|t| match t.entries() {
            [(_, body)] if body.is_map() && t.get("kind").is_none() => body,
            _ => t,
        }),
        Some(NodeKind::Map(_)) => s.get("tool"),
        _ => None,
    };
    let Some(task) = last.filter(|t| t.is_map()) else {
        e.refuse(line, format!("step `{name}`: step-level `{}` on a step without tasks: set it with `set_ctx` in the policy of a task that runs before", k.name));
        return;
    };
    if task.get("spec").is_some() {
        let summary = format!(
            "step `{name}`: step-level `{}` → a fallback rule in its last task's `spec.policy`",
            k.name
        );
        if crate::shape_structure::set_into_spec(task, (k, v), e, summary) {
            remove_entry(e, k.span.offset);
            return;
        }
        // Into the fallback rule of the policy the last task has.
        let whose = format!(
            "step `{name}`: step-level `{}` (into its last task)",
            k.name
        );
        tool_fields::set_beside_spec(task, &whose, (k, v), e);
        return;
    }
    let Some((last_key, _)) = task.entries().last() else {
        return;
    };
    let text = e.text;
    let before = &text[line_start(text, last_key.span.offset)..last_key.span.offset];
    if !before.trim_start_matches([' ', '-']).is_empty() {
        e.refuse(line, format!("step `{name}`: step-level `{}` with a last task in flow style: move it into that task's `spec.policy` by hand", k.name));
        return;
    }
    let indent = last_key.span.offset - line_start(text, last_key.span.offset);
    let (field, with) = fallback_rule(text, (k, v), indent);
    let at = entry_end(text, last_key.span.offset);
    e.replace(
        (at, at),
        with,
        line,
        format!("step `{name}`: step-level `{}` → `{field}` in its last task's `spec.policy` fallback rule", k.name),
    );
    remove_entry(e, k.span.offset);
}

/// A python task's `libs: [a, b]` → `import a` / `import b` at the top of
/// its `code` block; a list that cannot become imports (package names, a
/// `code` that is not a block) is removed, as NoETL ignores it. (A mapping
/// `libs`, NoETL's shape, is canonical: the tool imports it.)
pub(crate) fn python_libs(t: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = t.entry("libs").filter(|(_, v)| !v.is_map()) else {
        return;
    };
    let line = k.span.line;
    let libs: Vec<&str> = v.items().iter().filter_map(Node::as_str).collect();
    if libs.len() != v.items().len() || libs.is_empty() {
        e.refuse(
            line,
            format!("task `{name}`: `libs` must be a list of module names to rewrite into imports"),
        );
        return;
    }
    let text = e.text;
    let Some((ck, code)) = t.entry("code") else {
        e.refuse(line, format!("task `{name}`: `libs` without `code`"));
        return;
    };
    let code_line_end = next_line(text, ck.span.offset);
    let after_key =
        text[ck.span.offset + ck.name.len()..code_line_end].trim_start_matches([':', ' ']);
    let modules = libs.iter().all(|l| {
        l.split('.').all(|p| {
            p.starts_with(|c: char| c == '_' || c.is_ascii_alphabetic())
                && p.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
        })
    });
    if !after_key.starts_with('|') || code.as_str().is_none() || !modules {
        // NoETL ignores a list (its `libs` is a mapping): the code imports
        // what it needs, or these are package names (`psycopg2-binary`).
        replace_entry(
            e,
            k.span.offset,
            String::new(),
            line,
            format!("task `{name}`: `libs` list removed (NoETL ignores a list; the code imports what it uses)"),
        );
        return;
    }
    let indent = indent_at(text, code_line_end);
    let imports: String = libs
        .iter()
        .map(|l| format!("{}import {l}\n", " ".repeat(indent)))
        .collect();
    e.replace(
        (code_line_end, code_line_end),
        imports,
        ck.span.line,
        format!("task `{name}`: `libs` → imports at the top of `code`"),
    );
    remove_entry(e, k.span.offset);
}

/// A step-level `when:` → an admission rule.
pub(crate) fn step_when(s: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = s.entry("when") else {
        return;
    };
    let line = k.span.line;
    if s.get("spec").is_some() {
        e.refuse(line, format!("step `{name}`: `when` next to a `spec`: add it to `spec.policy.admit.rules` by hand"));
        return;
    }
    let text = e.text;
    let value = value_text(text, k.span.offset, v);
    if value.contains('\n') {
        e.refuse(
            line,
            format!(
                "step `{name}`: a multi-line `when`: move it to `spec.policy.admit.rules` by hand"
            ),
        );
        return;
    }
    let pad = " ".repeat(k.span.offset - line_start(text, k.span.offset));
    let with = format!(
        "{pad}spec:\n{pad}  policy:\n{pad}    admit:\n{pad}      rules:\n{pad}        - when: {value}\n{pad}          then: {{ allow: true }}\n{pad}        - else:\n{pad}            then: {{ allow: false }}\n"
    );
    let summary = format!("step `{name}`: `when` → an admission rule (`spec.policy.admit`)");
    replace_entry(e, k.span.offset, with, line, summary);
}

/// A task naming a workbook task (`task: lookup`) without a `kind` →
/// `kind: workbook` before its `task`.
pub(crate) fn workbook_call(t: &Node, name: &str, e: &mut Edits) {
    if t.get("kind").is_some() || t.get("type").is_some() {
        return;
    }
    let Some((k, target)) = t.entry("task").and_then(|(k, v)| Some((k, v.as_str()?))) else {
        return;
    };
    let text = e.text;
    let at = k.span.offset;
    let before = &text[line_start(text, at)..at];
    let (range, with) = if before.trim().is_empty() {
        // A line of its own, at the key's column.
        (
            (at - before.len(), at - before.len()),
            format!("{before}kind: workbook\n"),
        )
    } else if before.trim() == "-" {
        // `- task: lookup`: the new key takes the dash.
        let pad = " ".repeat(before.len());
        ((at, at), format!("kind: workbook\n{pad}"))
    } else {
        // A flow mapping.
        ((at, at), "kind: workbook, ".to_string())
    };
    let summary =
        format!("task `{name}`: `kind: workbook` added (it runs workbook task `{target}`)");
    e.replace(range, with, k.span.line, summary);
}

/// Keys an item of a legacy `next` list may have (all canonical arc keys).
pub(crate) const NEXT_ITEM_KEYS: &[&str] = &["step", "args", "when"];

/// A legacy `next` (a step name, or a list of names and `{step, args,
/// when}` maps) → the router object `next: { spec, arcs }`. Without `when`s
/// every listed step was scheduled, so several arcs get `mode: inclusive`;
/// with `when`s the first that holds fires (`exclusive`, the default).
pub(crate) fn legacy_next(s: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = s.entry("next") else {
        return;
    };
    let line = k.span.line;
    let items: Vec<&Node> = match &v.kind {
        NodeKind::Str(_) => vec![v],
        NodeKind::Seq(items) if !items.is_empty() => items.iter().collect(),
        NodeKind::Map(_) if ["when", "then", "else"].iter().any(|x| v.get(x).is_some()) => {
            e.refuse(line, format!("step `{name}`: `next` with `when`/`then`/`else`: write one arc per branch, `next: {{ arcs: [ {{ step: target, when: \"{{{{ ... }}}}\" }} ] }}`"));
            return;
        }
        _ => return, // canonical (or not a `next` migrate knows)
    };
    for item in &items {
        let odd = item
            .entries()
            .iter()
            .find(|(k, _)| !NEXT_ITEM_KEYS.contains(&k.name.as_str()));
        let bad = match (&item.kind, odd) {
            (NodeKind::Str(_), _) => None,
            (NodeKind::Map(_), Some((k, _))) => Some(format!("its `{}`", k.name)),
            (NodeKind::Map(_), None) if item.get("step").is_none() => {
                Some("an item without `step`".into())
            }
            (NodeKind::Map(_), None) => None,
            _ => Some(format!("an item that is a {}", item.type_name())),
        };
        if let Some(bad) = bad {
            e.refuse(line, format!("step `{name}`: legacy `next` list with {bad}: write it as `next: {{ arcs: [...] }}` by hand (arcs take `step`, `when`, `args`)"));
            return;
        }
    }
    let guarded = items.iter().any(|i| i.get("when").is_some());
    let mode = (items.len() > 1 && !guarded).then_some("inclusive");
    let text = e.text;
    let key_indent = k.span.offset - line_start(text, k.span.offset);
    let pad = " ".repeat(key_indent);
    let spec = mode.map_or(String::new(), |m| format!("{pad}  spec: {{ mode: {m} }}\n"));
    let mut arcs = String::new();
    if v.span.offset < next_line(text, k.span.offset) {
        // On the key's line: a name, or a flow list.
        for item in &items {
            arcs.push_str(&format!("{pad}    - {}\n", flow_arc(text, item)));
        }
    } else {
        let dash_indent = indent_at(text, line_start(text, items[0].span.offset));
        if dash_indent <= key_indent {
            e.refuse(line, format!("step `{name}`: legacy `next` list indented no deeper than `next`: indent it, then run `noetl migrate` again"));
            return;
        }
        let end = entry_end(text, k.span.offset);
        for (i, item) in items.iter().enumerate() {
            let dash_line = line_start(text, item.span.offset);
            // Comments above the first item stay above it.
            let from = if i == 0 {
                next_line(text, k.span.offset)
            } else {
                dash_line
            };
            let to = items
                .get(i + 1)
                .map_or(end, |n| line_start(text, n.span.offset));
            if !text[dash_line..item.span.offset].trim_end().ends_with('-') {
                e.refuse(line, format!("step `{name}`: legacy `next` list whose items do not start on their `-` line: write it as `next: {{ arcs: [...] }}` by hand"));
                return;
            }
            match &item.kind {
                NodeKind::Map(_) => {
                    arcs.push_str(&reindent(&text[from..to], dash_indent, key_indent + 4))
                }
                _ => arcs.push_str(&format!("{pad}    - {}\n", flow_arc(text, item))),
            }
        }
    }
    let with = format!("{pad}next:\n{spec}{pad}  arcs:\n{arcs}");
    let how = match mode {
        Some(_) => " (`mode: inclusive`: every listed step starts, as before)",
        None if guarded && items.len() > 1 => {
            " (`exclusive`: the first arc whose `when` holds fires)"
        }
        None => "",
    };
    let summary = format!("step `{name}`: legacy `next` → `next.arcs`{how}");
    replace_entry(e, k.span.offset, with, line, summary);
}

/// One item of a legacy `next` as a flow arc: `step: name` for a name,
/// the item's own text for a flow map.
pub(crate) fn flow_arc(text: &str, item: &Node) -> String {
    match &item.kind {
        NodeKind::Str(s) => format!("step: {}", yaml_scalar(s)),
        _ => {
            let end = flow_end(text, item.span.offset).unwrap_or(item.span.offset);
            text[item.span.offset..end].to_string()
        }
    }
}
