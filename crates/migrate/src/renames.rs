//! Pass 2: key renames.

use noetl_core::yaml::Node;

use crate::edits::{rename, Edits};
use crate::walk::*;

pub(crate) fn renames(root: &Node, e: &mut Edits) {
    for (t, name) in tasks(root) {
        let kind = t.get("kind").and_then(Node::as_str);
        for (k, _) in t.entries() {
            match k.name.as_str() {
                "input" | "inputs" => {
                    let takes_args = kind
                        .and_then(noetl_core::tool::kind)
                        .is_some_and(|k| k.fields.iter().any(|f| f.name == "args"));
                    if takes_args || kind.is_none() || kind == Some("workbook") {
                        rename(
                            e,
                            k,
                            "args",
                            format!("task `{name}`: `{}` → `args`", k.name),
                        );
                    } else {
                        e.refuse(k.span.line, format!("task `{name}`: `{}` on a {} task has no canonical field; move its values into the fields of docs/tools.md", k.name, kind.unwrap_or("?")));
                    }
                }
                "type" if t.get("kind").is_none() => {
                    rename(e, k, "kind", format!("task `{name}`: `type` → `kind`"));
                }
                // NoETL v1 names a workbook task's kind `tool: python`.
                "tool"
                    if t.get("kind").is_none()
                        && t.get("type").is_none()
                        && t.get("tool").and_then(Node::as_str).is_some() =>
                {
                    rename(e, k, "kind", format!("task `{name}`: `tool` → `kind`"));
                }
                _ => {}
            }
        }
    }
    for rule in rules(root) {
        if let Some((k, _)) = rule.entry("expr") {
            rename(e, k, "when", "rule: `expr` → `when`".into());
        }
    }
    crate::shapes::renames(root, e);
    crate::tool_fields::renames(root, e);
    for arc in arcs(root) {
        for old in ["expr", "cond", "condition"] {
            if let Some((k, _)) = arc.entry(old) {
                if arc.get("when").is_none() {
                    rename(e, k, "when", format!("arc: `{old}` → `when`"));
                }
            }
        }
    }
}
