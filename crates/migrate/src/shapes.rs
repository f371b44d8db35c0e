//! `noetl migrate`: the shapes NoETL's own engines accept (its `noetl.io/v2`
//! playbooks) that canonical v10 spells differently (docs/migrate.md,
//! "NoETL v2 shapes"). Each function edits one construct where it is, like
//! the rest of the rewrite; what has no faithful canonical form is refused
//! with what to write instead.

use crate::edits::{entry_end, line_start, next_line, rename, Edits, LineOrder};
use crate::snippets::reindent;
use crate::walk::{rules, steps, tasks};
use crate::Change;
use noetl_core::yaml::{Key, Node, NodeKind};

/// The root sections canonical v10 has (and `vars`, refused with its own
/// code); NoETL's parsers ignore any other.
pub(crate) const ROOT_SECTIONS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "keychain",
    "executor",
    "workload",
    "workflow",
    "workbook",
    "vars",
];

/// Scopes NoETL's `set` keys may name (`ctx.x`, `iter.x`, `step.x`): it
/// writes every one of them to the execution's variables as `x`.
const SET_SCOPES: &[&str] = &["ctx.", "iter.", "step.", "vars."];

// ---------------------------------------------------------------------------
// Pass 0: workbook tasks written `{name, tool: {kind, ...}}`
// ---------------------------------------------------------------------------

/// A NoETL workbook task keeps its tool under `tool:`
/// (`- name: t` / `tool: { kind: python, code: ... }`); canonical workbook
/// tasks are tasks (`- name: t` / `kind: python` / `code: ...`). The
/// fields move up one level and the `tool:` line goes (later passes map
/// their lines back through the [`LineOrder`] of each change).
pub(super) fn unwrap(root: &Node, e: &mut Edits) {
    let Some(wb) = root.get("workbook") else {
        return;
    };
    let list = wb.get("tasks").unwrap_or(wb);
    let named: Vec<(&Node, String)> = match &list.kind {
        NodeKind::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, t)| (t, crate::walk::name_of(t, i)))
            .collect(),
        NodeKind::Map(entries) => entries.iter().map(|(k, t)| (t, k.name.clone())).collect(),
        _ => Vec::new(),
    };
    for (t, name) in named {
        let Some((k, tool)) = t.entry("tool") else {
            continue;
        };
        if t.get("kind").is_some() || t.get("type").is_some() || !tool.is_map() {
            continue;
        }
        let text = e.text;
        let line = k.span.line;
        if !text[line_start(text, k.span.offset)..k.span.offset]
            .trim()
            .is_empty()
        {
            e.refuse(line, format!("workbook task `{name}`: `tool:` starts its item (`- tool:`): put `name` first, then run `noetl migrate` again"));
            continue;
        }
        if tool.span.offset < next_line(text, k.span.offset) {
            e.refuse(line, format!("workbook task `{name}`: its `tool:` is a flow mapping: write its fields (`kind`, ...) on the task itself, in block style"));
            continue;
        }
        if let Some((dup, _)) = tool
            .entries()
            .iter()
            .find(|(f, _)| t.get(&f.name).is_some())
        {
            e.refuse(line, format!("workbook task `{name}`: both the task and its `tool:` have `{}`: keep one, then move the `tool:` fields onto the task", dup.name));
            continue;
        }
        let kind = tool.get("kind").and_then(Node::as_str).unwrap_or("?");
        let summary =
            format!("workbook task `{name}`: its `tool:` fields → the task's own (`kind: {kind}`)");
        lift_children(e, k, tool, summary);
    }
}

/// Replace the block entry `k: value` by `value`'s lines one level up: the
/// key line goes, its children take the key's indentation (said to the
/// line map, [`LineOrder`]).
fn lift_children(e: &mut Edits, k: &Key, value: &Node, summary: String) {
    let text = e.text;
    let line = k.span.line;
    let key_indent = k.span.offset - line_start(text, k.span.offset);
    let child_indent = value.span.offset - line_start(text, value.span.offset);
    let start = line_start(text, k.span.offset);
    let from = next_line(text, k.span.offset);
    let to = entry_end(text, k.span.offset);
    let count = text[start..to].matches('\n').count();
    let order = LineOrder {
        first: line,
        count,
        order: (line + 1..line + count).collect(),
    };
    let with = reindent(&text[from..to], child_indent, key_indent);
    e.replace_lines((start, to), with, Change { line, summary }, order);
}

/// Task fields NoETL accepts under a task's `spec` (besides the kind's own
/// fields): its names of them, which the later passes rewrite.
const NESTED_FIELDS: &[&str] = &["input", "inputs", "with", "args", "set", "result"];

/// Whether `field` under the `spec` of a `kind` task is a task field:
/// one the kind reads or NoETL's name of one. `policy` and `timeout` are
/// the spec's own.
fn nested_field(kind: &noetl_core::tool::Kind, field: &str) -> bool {
    !matches!(field, "policy" | "timeout")
        && (kind.fields.iter().any(|f| f.name == field)
            || NESTED_FIELDS.contains(&field)
            || noetl_core::noetl_fields::tool_field_hint(kind.name, field).is_some())
}

/// NoETL playbooks that call themselves v10 (its `examples/`) write the
/// tool's fields under the task's `spec`, beside `policy`
/// (`kind: http` / `spec: {method, url, policy}`); canonical tasks carry
/// their fields themselves and keep `spec` for runtime knobs. The fields
/// move up one level, above `spec:` (deleted when nothing is left in it).
fn spec_fields(root: &Node, e: &mut Edits) {
    for (t, name) in tasks(root) {
        let Some(kind) = t
            .get("kind")
            .and_then(Node::as_str)
            .and_then(noetl_core::tool::kind)
        else {
            continue;
        };
        let Some((sk, spec)) = t.entry("spec") else {
            continue;
        };
        let NodeKind::Map(entries) = &spec.kind else {
            continue;
        };
        let nested: Vec<bool> = entries
            .iter()
            .map(|(k, _)| nested_field(kind, &k.name))
            .collect();
        if !nested.contains(&true) {
            continue;
        }
        let text = e.text;
        let line = sk.span.line;
        if spec.span.offset < next_line(text, sk.span.offset) {
            e.refuse(line, format!("task `{name}`: its `spec` is a flow mapping holding tool fields: write them on the task itself, in block style"));
            continue;
        }
        if let Some((dup, _)) = entries
            .iter()
            .zip(&nested)
            .find(|((k, _), n)| **n && t.get(&k.name).is_some())
            .map(|(entry, _)| entry)
        {
            e.refuse(
                line,
                format!(
                    "task `{name}`: both the task and its `spec` have `{}`: keep the task's",
                    dup.name
                ),
            );
            continue;
        }
        let key_indent = sk.span.offset - line_start(text, sk.span.offset);
        let child_indent = entries[0].0.span.offset - line_start(text, entries[0].0.span.offset);
        let from = line_start(text, sk.span.offset);
        let to = entry_end(text, sk.span.offset);
        let head_end = line_start(text, entries[0].0.span.offset);
        let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
        let lines = |a: usize, b: usize| line_of(a)..line_of(a) + text[a..b].matches('\n').count();
        let (mut up, mut down) = (String::new(), String::new());
        let (mut up_lines, mut down_lines) = (Vec::new(), Vec::new());
        let mut moved = Vec::new();
        for (i, ((k, _), n)) in entries.iter().zip(&nested).enumerate() {
            let a = line_start(text, k.span.offset);
            let b = entries
                .get(i + 1)
                .map_or(to, |(next, _)| line_start(text, next.span.offset));
            if *n {
                up.push_str(&reindent(&text[a..b], child_indent, key_indent));
                up_lines.extend(lines(a, b));
                moved.push(format!("`{}`", k.name));
            } else {
                down.push_str(&text[a..b]);
                down_lines.extend(lines(a, b));
            }
        }
        let mut order = up_lines;
        let with = if down.is_empty() {
            up
        } else {
            order.extend(lines(from, head_end));
            order.extend(down_lines);
            format!("{up}{}{down}", &text[from..head_end])
        };
        let summary = format!(
            "task `{name}`: {} from `spec` → the task's own fields",
            moved.join(", ")
        );
        let order = LineOrder {
            first: line_of(from),
            count: text[from..to].matches('\n').count(),
            order,
        };
        e.replace_lines((from, to), with, Change { line, summary }, order);
    }
}

/// NoETL's artifact tool reads its fields from the task's `input`
/// (`kind: artifact` / `input: {result_ref: ...}`); canonical artifact
/// tasks carry them (docs/tools.md). The `input:` line goes and its fields
/// move up one level.
fn artifact_input(root: &Node, e: &mut Edits) {
    let Some(kind) = noetl_core::tool::kind("artifact") else {
        return;
    };
    for (t, name) in tasks(root) {
        if t.get("kind").and_then(Node::as_str) != Some("artifact") {
            continue;
        }
        let Some((k, input)) = t.entry("input") else {
            continue;
        };
        let text = e.text;
        let line = k.span.line;
        let NodeKind::Map(entries) = &input.kind else {
            continue;
        };
        if entries.is_empty() || input.span.offset < next_line(text, k.span.offset) {
            e.refuse(line, format!("task `{name}`: an artifact task's `input` is a flow mapping: write its fields (`result_ref`, `uri`...) on the task itself"));
            continue;
        }
        if let Some((f, _)) = entries
            .iter()
            .find(|(f, _)| !kind.fields.iter().any(|x| x.name == f.name))
        {
            e.refuse(line, format!("task `{name}`: `input.{}` is not a field of an artifact task (action, data, uri, result_ref)", f.name));
            continue;
        }
        if let Some((f, _)) = entries.iter().find(|(f, _)| t.get(&f.name).is_some()) {
            e.refuse(
                line,
                format!(
                    "task `{name}`: both the task and its `input` have `{}`: keep the task's",
                    f.name
                ),
            );
            continue;
        }
        let summary = format!("task `{name}`: artifact `input` fields → the task's own");
        lift_children(e, k, input, summary);
    }
}

/// Pass 1: NoETL's nesting of task fields undone (tool fields under a
/// task's `spec`, an artifact task's `input`); with pass 0 ([`unwrap`]),
/// the passes that move and delete lines.
pub(super) fn unnest(root: &Node, e: &mut Edits) {
    spec_fields(root, e);
    artifact_input(root, e);
}

// ---------------------------------------------------------------------------
// Pass 2: renames (the line count stays)
// ---------------------------------------------------------------------------

/// Renames of NoETL fields: a playbook task's `payload` (→ `args`) and
/// `task` (→ `name` when it has none); a workbook call's `name` (→ `task`);
/// a keychain entry's `type` (→ `kind`); a retry `backoff: fixed`
/// (→ `none`); an arc's `set` (→ `set_ctx`, its keys without scope).
pub(super) fn renames(root: &Node, e: &mut Edits) {
    let workbook_names = workbook_task_names(root);
    for (t, name) in tasks(root) {
        match t.get("kind").and_then(Node::as_str) {
            Some("playbook") => playbook_task_renames(t, &name, e),
            Some("workbook") if t.get("task").is_none() => {
                if let Some((k, v)) = t.entry("name") {
                    let target = v.as_str().unwrap_or_default();
                    if workbook_names.iter().any(|n| n == target) {
                        rename(e, k, "task", format!("task `{name}`: `name` → `task` (NoETL names the workbook task it runs with `name`)"));
                    }
                }
            }
            _ => {}
        }
    }
    for entry in root.get("keychain").map(Node::items).unwrap_or_default() {
        if entry.get("kind").is_none() {
            if let Some((k, _)) = entry.entry("type").filter(|(_, v)| v.as_str().is_some()) {
                let name = entry.get("name").and_then(Node::as_str).unwrap_or("?");
                rename(e, k, "kind", format!("keychain `{name}`: `type` → `kind`"));
            }
        }
    }
    for rule in rules(root) {
        if let Some(then) = rule.get("then") {
            backoff_value(then, e);
        }
    }
    for (s, step) in steps(root) {
        for arc in s
            .get("next")
            .and_then(|n| n.get("arcs"))
            .map(Node::items)
            .unwrap_or_default()
        {
            arc_set(arc, step, e);
        }
    }
}

/// Names of the root `workbook`'s tasks.
fn workbook_task_names(root: &Node) -> Vec<String> {
    let Some(wb) = root.get("workbook") else {
        return Vec::new();
    };
    let list = wb.get("tasks").unwrap_or(wb);
    match &list.kind {
        NodeKind::Seq(items) => items
            .iter()
            .filter_map(|t| t.get("name").and_then(Node::as_str).map(str::to_string))
            .collect(),
        NodeKind::Map(entries) => entries.iter().map(|(k, _)| k.name.clone()).collect(),
        _ => Vec::new(),
    }
}

/// A playbook task's `payload` (the child's workload) → `args`; its `task`
/// (a label NoETL only logs) → `name` when it has none.
fn playbook_task_renames(t: &Node, name: &str, e: &mut Edits) {
    if let Some((k, _)) = t.entry("payload") {
        if ["args", "input", "inputs"]
            .iter()
            .any(|f| t.get(f).is_some())
        {
            e.refuse(k.span.line, format!("task `{name}`: both `payload` and `args`/`input`: merge them into `args` (the child's workload) by hand"));
        } else {
            rename(
                e,
                k,
                "args",
                format!("task `{name}`: `payload` → `args` (the child's workload)"),
            );
        }
    }
    if t.get("name").is_none() {
        if let Some((k, _)) = t.entry("task") {
            rename(
                e,
                k,
                "name",
                format!("task `{name}`: `task` → `name` (the task's label)"),
            );
        }
    }
}

/// `backoff: fixed` (NoETL's worker waits `delay` every time for any
/// backoff it does not know) → `backoff: none`, the constant delay.
fn backoff_value(then: &Node, e: &mut Edits) {
    let Some((k, v)) = then.entry("backoff") else {
        return;
    };
    let Some(value) = v.as_str() else { return };
    if !matches!(value, "fixed" | "constant") {
        return;
    }
    let text = e.text;
    let at = v.span.offset;
    let len = if text[at..].starts_with(value) {
        value.len()
    } else if text[at + 1..].starts_with(value) && matches!(text.as_bytes()[at], b'"' | b'\'') {
        value.len() + 2
    } else {
        e.refuse(
            k.span.line,
            format!("`backoff: {value}` is written with escapes: write `backoff: none`"),
        );
        return;
    };
    e.replace(
        (at, at + len),
        "none".into(),
        v.span.line,
        format!("`backoff: {value}` → `backoff: none` (a constant `delay`)"),
    );
}

/// An arc's `set` (NoETL: variables written when the arc fires, keys
/// `ctx.x` / `iter.x` / `step.x` all naming the execution's `x`) →
/// `set_ctx` with the bare keys.
fn arc_set(arc: &Node, step: &str, e: &mut Edits) {
    let Some((k, v)) = arc.entry("set") else {
        return;
    };
    let target = arc.get("step").and_then(Node::as_str).unwrap_or("?");
    let what = format!("arc `{step}` → `{target}`");
    if arc.get("set_ctx").is_some() {
        e.refuse(
            k.span.line,
            format!("{what}: both `set` and `set_ctx`: merge `set` into `set_ctx` by hand"),
        );
        return;
    }
    if !v.is_map() {
        e.refuse(
            k.span.line,
            format!("{what}: `set` is not a mapping: write `set_ctx: {{ key: value }}`"),
        );
        return;
    }
    let bare: Vec<(&Key, &str)> = v
        .entries()
        .iter()
        .map(|(key, _)| {
            let stripped = SET_SCOPES
                .iter()
                .find_map(|p| key.name.strip_prefix(p))
                .unwrap_or(&key.name);
            (key, stripped)
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    if let Some((key, b)) = bare.iter().find(|(_, b)| !seen.insert(*b)) {
        e.refuse(
            key.span.line,
            format!("{what}: `set` writes `{b}` twice: keep one, then write `set_ctx`"),
        );
        return;
    }
    let text = e.text;
    let mut edits = Vec::new();
    for (key, b) in &bare {
        let prefix = key.name.len() - b.len();
        if prefix == 0 {
            continue;
        }
        let at = key.span.offset;
        let start = if text[at..].starts_with(&key.name) {
            at
        } else if text[at + 1..].starts_with(&key.name) {
            at + 1 // quoted
        } else {
            e.refuse(
                key.span.line,
                format!(
                    "{what}: `set` key `{}` is written with escapes: write it as `set_ctx` by hand",
                    key.name
                ),
            );
            return;
        };
        edits.push((start, start + prefix));
    }
    let keys: Vec<&str> = bare.iter().map(|(_, b)| *b).collect();
    rename(
        e,
        k,
        "set_ctx",
        format!(
            "{what}: `set` → `set_ctx` (written when the arc fires: `{}`)",
            keys.join("`, `")
        ),
    );
    for range in edits {
        e.replace_quietly(range, String::new());
    }
}

// ---------------------------------------------------------------------------
// Pass 4: structure
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use crate::migrate;

    fn playbook(rest: &str) -> String {
        format!("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{ name: t }}\n{rest}")
    }

    #[test]
    fn lines_map_back_through_deletions_and_moves() {
        use super::LineOrder;
        // Line 5 deleted: 1-4 stay, 6.. move up one.
        let gone = LineOrder {
            first: 5,
            count: 3,
            order: vec![6, 7],
        };
        assert_eq!(LineOrder::origin(9, &[gone]), vec![1, 2, 3, 4, 6, 7, 8, 9]);
        // Lines 2-3 moved above line 1's spec header at 1; line 6 deleted.
        let moved = LineOrder {
            first: 1,
            count: 3,
            order: vec![2, 3, 1],
        };
        let gone = LineOrder {
            first: 6,
            count: 2,
            order: vec![7],
        };
        assert_eq!(
            LineOrder::origin(8, &[gone, moved]),
            vec![2, 3, 1, 4, 5, 7, 8]
        );
    }

    #[test]
    fn a_cloud_secret_of_a_provider_reached_stays_a_secret_manager_entry() {
        let m = migrate(&playbook(
            "keychain:\n  - name: openai_token\n    kind: secrets\n    provider: gcp\n    scope: global\n    auth: \"{{ gcp_auth }}\"\n    map:\n      api_key: \"{{ openai_secret_path }}\"\nworkflow:\n  - step: start\n    tool: { kind: noop }\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("  - name: openai_token\n    kind: secret_manager\n    provider: gcp\n    scope: global\n    auth: \"{{ gcp_auth }}\"\n    map:\n      api_key: \"{{ openai_secret_path }}\"\n"),
            "{}",
            m.text
        );
        assert!(
            m.report()
                .iter()
                .any(|(_, r)| r.contains("`kind: secrets` → `kind: secret_manager`")),
            "{:?}",
            m.report()
        );
        assert!(
            noetl_core::load::load_playbook(&m.text, "t.yaml").is_ok(),
            "{}",
            m.text
        );
        assert_eq!(
            migrate(&m.text).unwrap().text,
            m.text,
            "a second run changes nothing"
        );
    }

    #[test]
    fn a_cloud_secret_of_another_provider_becomes_a_local_secret_with_the_same_fields() {
        let m = migrate(&playbook(
            "keychain:\n  - name: openai_token\n    kind: secrets\n    provider: azure\n    scope: global\n    auth: \"{{ gcp_auth }}\"\n    map:\n      api_key: \"{{ openai_secret_path }}\"\nworkflow:\n  - step: start\n    tool: { kind: noop }\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("  - name: openai_token\n    kind: secret\n    # provider: azure\n    scope: global\n    # auth: \"{{ gcp_auth }}\"\n    # map:\n    #   api_key: \"{{ openai_secret_path }}\"\n"),
            "{}",
            m.text
        );
        assert!(m.report().iter().any(|(_, r)| r.contains("store its value with `noetl credential put openai_token --kind secret` with the fields api_key")), "{:?}", m.report());
        assert!(
            noetl_core::load::load_playbook(&m.text, "t.yaml").is_ok(),
            "{}",
            m.text
        );
    }

    #[test]
    fn a_task_s_own_output_hint_is_commented_out() {
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      kind: postgres\n      connection: x\n      command: select 1\n      output:\n        store: { kind: kv }\n        inline_max_bytes: 0\n",
        ))
        .unwrap();
        assert!(
            m.text.contains(
                "      # output:\n      #   store: { kind: kv }\n      #   inline_max_bytes: 0\n"
            ),
            "{}",
            m.text
        );
        assert!(
            m.report()[0]
                .1
                .contains("`output` (NoETL's result-storage hint"),
            "{:?}",
            m.report()
        );
    }

    #[test]
    fn a_step_set_joins_the_else_rule_of_its_last_task_s_policy() {
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      kind: noop\n      spec:\n        policy:\n          rules:\n            - when: \"{{ outcome.status == 'error' }}\"\n              then:\n                do: retry\n            - else:\n                then:\n                  do: continue\n    set:\n      ctx.n: 1\n",
        ))
        .unwrap();
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
        assert!(
            m.text.ends_with("            - else:\n                then:\n                  do: continue\n                  set:\n                    ctx.n: 1\n"),
            "{}",
            m.text
        );
        assert!(
            noetl_core::load::load_playbook(&m.text, "t.yaml").is_ok(),
            "{}",
            m.text
        );
    }

    #[test]
    fn an_artifact_task_s_input_fields_become_its_own() {
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      - name: load\n        kind: artifact\n        action: get\n        input:\n          result_ref: '{{ fetch.x }}'\n",
        ))
        .unwrap();
        assert_eq!(
            m.text,
            playbook("workflow:\n  - step: start\n    tool:\n      - name: load\n        kind: artifact\n        action: get\n        result_ref: '{{ fetch.x }}'\n")
        );
        assert_eq!(
            m.report(),
            vec![(
                10,
                "task `load`: artifact `input` fields → the task's own".to_string()
            )]
        );
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      - name: load\n        kind: artifact\n        input:\n          path: x\n",
        ))
        .unwrap();
        assert!(
            m.refusals[0].why.contains("`input.path` is not a field"),
            "{:?}",
            m.refusals
        );
    }

    #[test]
    fn tool_fields_under_spec_become_the_task_s_own() {
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      kind: http\n      spec:\n        # the call\n        method: GET\n        endpoint: '{{ workload.api }}'\n        policy:\n          rules:\n            - else:\n                then: { do: continue }\n        input:\n          x: 1\n",
        ))
        .unwrap();
        assert_eq!(
            m.text,
            playbook("workflow:\n  - step: start\n    tool:\n      kind: http\n      method: GET\n      url: '{{ workload.api }}'\n      input:\n        x: 1\n      spec:\n        # the call\n        policy:\n          rules:\n            - else:\n                then: { do: continue }\n")
        );
        let report = m.report();
        // Each change at its line of the original file.
        assert!(
            report.contains(&(
                8,
                "task `#1`: `method`, `endpoint`, `input` from `spec` → the task's own fields"
                    .into()
            )),
            "{report:?}"
        );
        assert!(
            report
                .iter()
                .any(|(l, s)| *l == 11 && s.contains("`endpoint` → `url`")),
            "{report:?}"
        );
        // What has no canonical field is refused where it was written.
        assert!(
            report
                .iter()
                .any(|(l, s)| *l == 16 && s.contains("refused: task `#1`: `input` on a http task")),
            "{report:?}"
        );
        // Only tool fields: the `spec:` line goes.
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      kind: python\n      spec:\n        code: result = 1\n",
        ))
        .unwrap();
        assert_eq!(
            m.text,
            playbook("workflow:\n  - step: start\n    tool:\n      kind: python\n      code: result = 1\n")
        );
        // A field on both levels is left as written, saying why.
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      kind: python\n      code: result = 2\n      spec:\n        code: result = 1\n",
        ))
        .unwrap();
        assert!(
            m.refusals[0]
                .why
                .contains("both the task and its `spec` have `code`"),
            "{:?}",
            m.refusals
        );
    }

    #[test]
    fn a_workbook_task_s_tool_fields_become_its_own() {
        let m = migrate(&playbook(
            "workbook:\n  - name: f\n    tool:\n      kind: python\n      # why\n      input:\n        x: 1\n      code: |\n        result = x\n    assert: { expects: [x] }\nworkflow:\n  - step: start\n    tool:\n      kind: workbook\n      name: f\n      input: { x: 2 }\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("  - name: f\n    kind: python\n    # why\n    args:\n      x: 1\n    code: |\n      result = x\n    # assert: { expects: [x] }\n"),
            "{}",
            m.text
        );
        assert!(
            m.text
                .contains("    tool:\n      kind: workbook\n      task: f\n      args: { x: 2 }\n"),
            "{}",
            m.text
        );
        let lines: Vec<usize> = m.changes.iter().map(|c| c.line).collect();
        assert_eq!(lines, [6, 9, 13, 18, 19], "{:?}", m.changes);
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
        noetl_core::load::load_playbook(&m.text, "t.yaml").unwrap();
        assert!(migrate(&m.text).unwrap().changes.is_empty());
    }

    #[test]
    fn arc_set_becomes_set_ctx_with_bare_keys() {
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    next:\n      arcs:\n        - step: b\n          set:\n            ctx.city: \"{{ event.name }}\"\n            'iter.n': 2\n            plain: 3\n  - step: b\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("          set_ctx:\n            city: \"{{ event.name }}\"\n            'n': 2\n            plain: 3\n"),
            "{}",
            m.text
        );
        assert_eq!(m.changes.len(), 1, "{:?}", m.changes);
        noetl_core::load::load_playbook(&m.text, "t.yaml").unwrap();
    }

    #[test]
    fn retry_becomes_a_policy_rule() {
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      - name: a\n        kind: noop\n        retry:\n          max_attempts: 2\n          retry_on: [timeout]\n          backoff: 5\n      - name: b\n        kind: noop\n        retry: 4\n      - name: s\n        kind: noop\n        retry: { max_attempts: 3, retry_on_status: [429, 503], backoff_seconds: 2 }\n      - name: c\n        kind: noop\n        retry: [ { when: x, then: {} } ]\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("        spec:\n          policy:\n            rules:\n              - when: \"{{ outcome.status == 'error' and outcome.error.kind in ['timeout'] }}\"\n                then: { do: retry, attempts: 2, delay: 5 }\n              - when: \"{{ outcome.status == 'error' }}\"\n                then: { do: fail }\n"),
            "{}",
            m.text
        );
        assert!(
            m.text
                .contains("                then: { do: retry, attempts: 4 }\n"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("              - when: \"{{ outcome.status == 'error' and outcome.http.status in [429, 503] }}\"\n                then: { do: retry, attempts: 3, delay: 2 }\n"),
            "{}",
            m.text
        );
        assert_eq!(m.refusals.len(), 1, "{:?}", m.refusals);
        assert!(m.refusals[0].why.contains("list of `when`/`then`"));
    }

    #[test]
    fn step_input_becomes_its_task_s_args() {
        let m = migrate(&playbook(
            "workflow:\n  - step: start\n    tool:\n      kind: python\n      input: {}\n      code: \"result = a\"\n    input:\n      a: \"{{ execution_id }}\"\n    next:\n      arcs:\n        - step: b\n  - step: b\n    tool:\n      - name: t\n        kind: python\n        code: \"result = a\"\n    input: { a: 1 }\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("      kind: python\n      args:\n        a: \"{{ execution_id }}\"\n      code: \"result = a\"\n    next:"),
            "{}",
            m.text
        );
        assert!(
            m.text
                .contains("        code: \"result = a\"\n        args: { a: 1 }\n"),
            "{}",
            m.text
        );
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
        noetl_core::load::load_playbook(&m.text, "t.yaml").unwrap();
        assert!(migrate(&m.text).unwrap().changes.is_empty());
    }

    #[test]
    fn what_noetl_ignores_is_commented_out() {
        let m = migrate(&playbook(
            "tracing:\n  enabled: true\nworkflow:\n  - step: start\n    output:\n      output_select: [a]\n    tool:\n      kind: noop\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("# tracing:\n#   enabled: true\n"),
            "{}",
            m.text
        );
        assert!(
            m.text
                .contains("    # output:\n    #   output_select: [a]\n"),
            "{}",
            m.text
        );
        noetl_core::load::load_playbook(&m.text, "t.yaml").unwrap();
        // Not on a line of its own: left, and said so.
        let m = migrate(&playbook(
            "workflow:\n  - { step: start, output: { store: x } }\n",
        ))
        .unwrap();
        assert!(m.changes.is_empty(), "{:?}", m.changes);
        assert!(
            m.refusals[0].why.contains("delete it by hand"),
            "{:?}",
            m.refusals
        );
    }

    #[test]
    fn playbook_task_fields_and_keychain_type_are_renamed() {
        let m = migrate(&playbook(
            "keychain:\n  - name: k\n    type: bearer\nworkflow:\n  - step: start\n    tool:\n      - kind: playbook\n        task: run\n        path: a/b\n        return_step: end\n        timeout: 30\n        payload: { x: 1 }\n      - name: two\n        kind: playbook\n        task: label\n        path: a/c\n    next:\n      arcs:\n        - step: end\n  - step: end\n    tool:\n      - kind: noop\n        spec: { policy: { rules: [ { when: \"{{ true }}\", then: { do: retry, backoff: fixed } } ] } }\n",
        ))
        .unwrap();
        for want in [
            "    kind: bearer\n",
            "      - kind: playbook\n        name: run\n",
            "        args: { x: 1 }\n",
            "      - name: two\n        kind: playbook\n        path: a/c\n",
            "do: retry, backoff: none }",
        ] {
            assert!(m.text.contains(want), "{want:?} in\n{}", m.text);
        }
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
        assert!(migrate(&m.text).unwrap().changes.is_empty());
    }
}
