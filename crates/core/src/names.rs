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
