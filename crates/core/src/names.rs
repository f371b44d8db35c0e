//! The names a playbook declares (steps, tasks, workbook tasks, keychain
//! entries): what a template may read by name. A leaf, read by the
//! validator and `noetl migrate`.

use std::collections::BTreeSet;

use crate::yaml::{Node, NodeKind};

/// Every step and task name in the document (values of `step:` and
/// `name:` keys, and the keys of label-keyed tasks): the validator's
/// unknown-roots check (W106) and the template rewrite of `noetl migrate`.
pub fn collect_names(n: &Node, out: &mut BTreeSet<String>) {
    match &n.kind {
        NodeKind::Seq(items) => {
            for x in items {
                // `- fetch: { kind: http }`: the label names the task.
                if let NodeKind::Map(entries) = &x.kind {
                    if entries.len() == 1 && matches!(entries[0].1.kind, NodeKind::Map(_)) {
                        out.insert(entries[0].0.name.clone());
                    }
                }
                collect_names(x, out);
            }
        }
        NodeKind::Map(entries) => {
            for (k, v) in entries {
                if k.name == "step" || k.name == "name" {
                    if let Some(s) = v.as_str() {
                        out.insert(s.to_string());
                    }
                }
                collect_names(v, out);
            }
        }
        _ => {}
    }
}

/// The keys written bare (no `ctx.`/`iter.` path) by every `set` and
/// `set_ctx` mapping under `n`: tasks', steps', arcs' and policy rules'
/// (NoETL's variables, which its templates read bare: `ctx.<key>` here).
pub fn bare_set_keys(n: &Node) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![n];
    while let Some(n) = stack.pop() {
        match &n.kind {
            NodeKind::Map(entries) => {
                for (k, v) in entries {
                    if matches!(k.name.as_str(), "set" | "set_ctx") && v.is_map() {
                        out.extend(
                            (v.entries().iter())
                                .map(|(key, _)| key.name.as_str())
                                .filter(|key| !key.contains('.') && !key.is_empty())
                                .map(str::to_string),
                        );
                    }
                    stack.push(v);
                }
            }
            NodeKind::Seq(items) => stack.extend(items.iter()),
            _ => {}
        }
    }
    out
}
