//! Normalisation: every accepted authoring shape becomes the canonical form
//! the engine runs, on the positioned tree (so positions survive).
//!
//! - task lists (docs/dsl.md "The pipeline"): `{name, kind, ...}` kept; unnamed tasks get
//!   `task_<i>`; a single tool object becomes `[{name: "<step>_task", ...}]`;
//!   the label-keyed `- fetch: {kind: http, ...}` becomes `{name: fetch, ...}`;
//! - rules: `{else: {then: X}}` / `{else: null, then: X}` → `{else: true, then: X}`;
//! - `then.set: {"ctx.a": 1, "iter.b": 2}` (or `set: {ctx: {...}, iter: {...}}`)
//!   → `set_ctx` / `set_iter`, with warning W101;
//! - the same rule and `set` rewrites in the task bodies of the root
//!   `workbook`;
//! - the seed spellings of `loop.spec.policy.mode` / `max_in_flight` and
//!   `executor.spec.policy.limits` / `defaults.timeouts` (`crate::spellings`);
//! - a boolean `when` (rules, arcs) becomes the string `"true"`/`"false"`;
//!   empty (`null`) optional sections are dropped.
//!
//! Normalising a normalised tree changes nothing.

use crate::codes::Code;
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::yaml::{Key, Node, NodeKind, Span};

fn key(name: &str, span: Span) -> Key {
    Key {
        name: name.to_string(),
        span,
    }
}

fn str_node(s: &str, span: Span) -> Node {
    Node {
        kind: NodeKind::Str(s.to_string()),
        span,
    }
}

fn map_mut(n: &mut Node) -> Option<&mut Vec<(Key, Node)>> {
    match &mut n.kind {
        NodeKind::Map(e) => Some(e),
        _ => None,
    }
}

fn get_mut<'a>(n: &'a mut Node, name: &str) -> Option<&'a mut Node> {
    map_mut(n)?
        .iter_mut()
        .find(|(k, _)| k.name == name)
        .map(|(_, v)| v)
}

/// Normalise a whole document; warnings (W101) go to `diags`.
pub fn normalize(root: &Node, diags: &mut Diagnostics) -> Node {
    let mut root = root.clone();
    // Empty optional sections (`workload:` with nothing under it) are absent.
    drop_nulls(&mut root, &["workload", "keychain", "executor", "workbook"]);
    crate::spellings::executor_spec(&mut root, diags);
    if let Some(workbook) = get_mut(&mut root, "workbook") {
        for (path, task) in workbook_tasks_mut(workbook) {
            normalize_task_policy(task, &path, diags);
        }
    }
    if let Some(workflow) = get_mut(&mut root, "workflow") {
        if let NodeKind::Seq(steps) = &mut workflow.kind {
            for (si, step) in steps.iter_mut().enumerate() {
                normalize_step(step, &format!("/workflow/{si}"), diags);
            }
        }
    }
    root
}

/// Normalise a JSON document (e.g. one sent over the wire); positions are
/// all 1:1. Returns the canonical JSON and the normalisation warnings.
pub fn normalize_value(doc: &serde_json::Value) -> (serde_json::Value, Diagnostics) {
    let span = Span {
        line: 1,
        col: 1,
        offset: 0,
    };
    let mut diags = Diagnostics::default();
    let out = normalize(&Node::from_json(doc, span), &mut diags).to_json();
    (out, diags)
}

/// Remove `key: null` entries for the given keys.
fn drop_nulls(n: &mut Node, keys: &[&str]) {
    if let Some(e) = map_mut(n) {
        e.retain(|(k, v)| !(v.is_null() && keys.contains(&k.name.as_str())));
    }
}

/// A boolean `when` becomes the equivalent condition string.
fn when_to_string(n: &mut Node) {
    if let Some(w) = get_mut(n, "when") {
        if let NodeKind::Bool(b) = w.kind {
            w.kind = NodeKind::Str(b.to_string());
        }
    }
}

/// True for the label-keyed task form `{label: {kind: ..., ...}}`.
fn label_keyed(n: &Node) -> Option<(Key, Node)> {
    match &n.kind {
        NodeKind::Map(e)
            if e.len() == 1
                && e[0].1.is_map()
                && e[0].1.get("kind").is_some()
                && !matches!(e[0].0.name.as_str(), "name" | "kind" | "spec") =>
        {
            Some((e[0].0.clone(), e[0].1.clone()))
        }
        _ => None,
    }
}

fn normalize_step(step: &mut Node, path: &str, diags: &mut Diagnostics) {
    let step_name = step
        .get("step")
        .and_then(Node::as_str)
        .unwrap_or("step")
        .to_string();
    drop_nulls(step, &["spec", "desc", "next", "loop"]);
    if let Some(spec) = get_mut(step, "spec") {
        if let Some(policy) = get_mut(spec, "policy") {
            if let Some(admit) = get_mut(policy, "admit") {
                if let Some(rules) = get_mut(admit, "rules") {
                    normalize_rules(
                        rules,
                        &format!("{path}/spec/policy/admit/rules"),
                        false,
                        diags,
                    );
                }
            }
        }
    }
    if let Some(loop_) = get_mut(step, "loop") {
        drop_nulls(loop_, &["spec"]);
        crate::spellings::loop_spec(loop_, &format!("{path}/loop"), diags);
    }
    if let Some(next) = get_mut(step, "next") {
        drop_nulls(next, &["spec", "arcs"]);
        if let Some(arcs) = get_mut(next, "arcs") {
            if let NodeKind::Seq(items) = &mut arcs.kind {
                for arc in items.iter_mut() {
                    when_to_string(arc);
                    drop_nulls(arc, &["args", "spec", "when"]);
                }
            }
        }
    }
    let Some(tool) = get_mut(step, "tool") else {
        return;
    };
    // Single tool object → one-element list.
    if tool.is_map() {
        let mut task = tool.clone();
        if label_keyed(&task).is_none() && task.get("name").is_none() {
            let span = task.span;
            if let Some(e) = map_mut(&mut task) {
                e.insert(
                    0,
                    (
                        key("name", span),
                        str_node(&format!("{step_name}_task"), span),
                    ),
                );
            }
        }
        *tool = Node {
            span: tool.span,
            kind: NodeKind::Seq(vec![task]),
        };
    }
    let NodeKind::Seq(tasks) = &mut tool.kind else {
        return;
    };
    for (i, task) in tasks.iter_mut().enumerate() {
        // Label-keyed: a one-key mapping whose value is a mapping with `kind`.
        if let Some((k, mut inner)) = label_keyed(task) {
            if let Some(e) = map_mut(&mut inner) {
                e.retain(|(kk, _)| kk.name != "name");
                e.insert(0, (key("name", k.span), str_node(&k.name, k.span)));
            }
            *task = inner;
        } else if task.is_map() && task.get("name").is_none() {
            let span = task.span;
            if let Some(e) = map_mut(task) {
                e.insert(0, (key("name", span), str_node(&format!("task_{i}"), span)));
            }
        }
        normalize_task_policy(task, &format!("{path}/tool/{i}"), diags);
    }
}

/// The task bodies of a root `workbook` (`tasks:` mapping or list, or a bare
/// list), with their JSON pointers.
fn workbook_tasks_mut(workbook: &mut Node) -> Vec<(String, &mut Node)> {
    let (base, tasks) = if workbook.is_map() {
        ("/workbook/tasks", get_mut(workbook, "tasks"))
    } else {
        ("/workbook", Some(workbook))
    };
    match tasks.map(|t| &mut t.kind) {
        Some(NodeKind::Map(named)) => named
            .iter_mut()
            .map(|(k, v)| (format!("{base}/{}", crate::yaml::escape(&k.name)), v))
            .collect(),
        Some(NodeKind::Seq(items)) => items
            .iter_mut()
            .enumerate()
            .map(|(i, v)| (format!("{base}/{i}"), v))
            .collect(),
        _ => Vec::new(),
    }
}

/// A task's empty `spec` is dropped and its policy rules normalised.
fn normalize_task_policy(task: &mut Node, tpath: &str, diags: &mut Diagnostics) {
    drop_nulls(task, &["spec"]);
    if let Some(spec) = get_mut(task, "spec") {
        if let Some(policy) = get_mut(spec, "policy") {
            if let Some(rules) = get_mut(policy, "rules") {
                normalize_rules(rules, &format!("{tpath}/spec/policy/rules"), true, diags);
            }
        }
    }
}

fn normalize_rules(rules: &mut Node, path: &str, task: bool, diags: &mut Diagnostics) {
    let NodeKind::Seq(items) = &mut rules.kind else {
        return;
    };
    for (ri, rule) in items.iter_mut().enumerate() {
        when_to_string(rule);
        let Some(entries) = map_mut(rule) else {
            continue;
        };
        let found = entries.iter().find(|(k, _)| k.name == "else").cloned();
        if let Some((ek, ev)) = found {
            // Only the accepted fallback shapes are rewritten; anything else
            // (`else: false`, a string, a list, `else: {do: ...}`) is left as
            // written for the validator to report (E004).
            let canonical = match &ev.kind {
                NodeKind::Map(inner) if inner.iter().all(|(k, _)| k.name == "then") => {
                    // else: { then: X } → else: true, then: X
                    if let Some((tk, tv)) = inner.first() {
                        entries.retain(|(k, _)| k.name != "then");
                        entries.push((tk.clone(), tv.clone()));
                    }
                    true
                }
                NodeKind::Null => true,
                _ => false,
            };
            if canonical {
                if let Some(pos) = entries.iter().position(|(k, _)| k.name == "else") {
                    entries[pos] = (
                        ek,
                        Node {
                            kind: NodeKind::Bool(true),
                            span: ev.span,
                        },
                    );
                }
            }
        }
        if task {
            if let Some((_, then)) = entries.iter_mut().find(|(k, _)| k.name == "then") {
                normalize_set(then, &format!("{path}/{ri}/then"), diags);
            }
        }
    }
}

/// `then.set` → `set_ctx` / `set_iter`.
fn normalize_set(then: &mut Node, path: &str, diags: &mut Diagnostics) {
    let Some(entries) = map_mut(then) else {
        return;
    };
    let Some(pos) = entries.iter().position(|(k, _)| k.name == "set") else {
        return;
    };
    let (set_key, set_val) = entries[pos].clone();
    if !set_val.is_map() {
        return; // the validator reports the shape
    }
    let mut ctx: Vec<(Key, Node)> = Vec::new();
    let mut iter: Vec<(Key, Node)> = Vec::new();
    let mut leftover = false;
    for (k, v) in set_val.entries() {
        if let Some(rest) = k.name.strip_prefix("ctx.") {
            ctx.push((key(rest, k.span), v.clone()));
        } else if let Some(rest) = k.name.strip_prefix("iter.") {
            iter.push((key(rest, k.span), v.clone()));
        } else if k.name == "ctx" && v.is_map() {
            ctx.extend(v.entries().iter().cloned());
        } else if k.name == "iter" && v.is_map() {
            iter.extend(v.entries().iter().cloned());
        } else {
            leftover = true;
        }
    }
    if leftover {
        return; // not the alias form: leave it for the validator (E005)
    }
    entries.remove(pos);
    let canonical: Vec<&str> = [("set_ctx", &ctx), ("set_iter", &iter)]
        .iter()
        .filter(|(_, items)| !items.is_empty())
        .map(|(name, _)| *name)
        .collect();
    let canonical = match canonical.as_slice() {
        [] => "set_ctx`/`set_iter".to_string(),
        names => names.join("` and `"),
    };
    for (target, items) in [("set_ctx", ctx), ("set_iter", iter)] {
        if items.is_empty() {
            continue;
        }
        match entries.iter_mut().find(|(k, _)| k.name == target) {
            Some((_, existing)) => {
                if let Some(e) = map_mut(existing) {
                    for (k, v) in items {
                        e.retain(|(kk, _)| kk.name != k.name);
                        e.push((k, v));
                    }
                }
            }
            None => entries.push((
                key(target, set_key.span),
                Node {
                    kind: NodeKind::Map(items),
                    span: set_val.span,
                },
            )),
        }
    }
    diags.push(
        Diagnostic::warning(
            Code::W101,
            set_key.span,
            &format!("{path}/set"),
            format!("`then.set` with `ctx.`/`iter.` keys is an alias of `{canonical}`"),
        )
        .help(format!(
            "write `{canonical}` directly: `set_ctx: {{key: value}}` writes ctx, `set_iter: {{key: value}}` writes iter"
        )),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::parse;
    use serde_json::json;

    fn norm(src: &str) -> serde_json::Value {
        let mut d = Diagnostics::default();
        normalize(&parse(src).unwrap(), &mut d).to_json()
    }

    #[test]
    fn task_shapes_become_canonical_and_stay_so() {
        let src = "workflow:\n  - step: a\n    tool:\n      - fetch: { kind: http, url: x }\n      - kind: noop\n      - name: n\n        kind: noop\n  - step: b\n    tool: { kind: noop }\n";
        let j = norm(src);
        assert_eq!(
            j["workflow"][0]["tool"][0],
            json!({"name": "fetch", "kind": "http", "url": "x"})
        );
        assert_eq!(
            j["workflow"][0]["tool"][1],
            json!({"name": "task_1", "kind": "noop"})
        );
        assert_eq!(j["workflow"][0]["tool"][2]["name"], "n");
        assert_eq!(
            j["workflow"][1]["tool"],
            json!([{"name": "b_task", "kind": "noop"}])
        );
        let mut d = Diagnostics::default();
        let once = normalize(&parse(src).unwrap(), &mut d);
        let twice = normalize(&once, &mut d);
        assert_eq!(once.to_json(), twice.to_json());
    }

    #[test]
    fn else_rules_and_set_alias() {
        let src = "workflow:\n  - step: a\n    tool:\n      - name: t\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - else:\n                  then: { do: continue, set: { ctx.a: 1, iter.b: 2 } }\n";
        let mut d = Diagnostics::default();
        let j = normalize(&parse(src).unwrap(), &mut d).to_json();
        let rule = &j["workflow"][0]["tool"][0]["spec"]["policy"]["rules"][0];
        assert_eq!(rule["else"], true);
        assert_eq!(rule["then"]["set_ctx"], json!({"a": 1}));
        assert_eq!(rule["then"]["set_iter"], json!({"b": 2}));
        assert!(rule["then"].get("set").is_none());
        assert_eq!(d.0[0].code, Code::W101);
        assert_eq!(d.0[0].span.unwrap().line, 10);
    }
}
