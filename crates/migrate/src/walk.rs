//! Walking the playbook: its steps, tasks, rules and arcs, with their
//! names for messages.

use noetl_core::yaml::{Node, NodeKind};

/// Every task mapping of the playbook (pipeline tasks, label-keyed ones,
/// workbook tasks), with its name for messages.
/// The tasks of a step's `tool` (a task, or a list of tasks, each maybe
/// written `- label: {kind: ...}`), with their names.
pub(crate) fn step_tasks(step: &Node) -> Vec<(&Node, String)> {
    let Some(tool) = step.get("tool") else {
        return Vec::new();
    };
    let list: Vec<&Node> = match &tool.kind {
        NodeKind::Seq(items) => items.iter().collect(),
        NodeKind::Map(_) => vec![tool],
        _ => Vec::new(),
    };
    list.into_iter()
        .enumerate()
        .map(|(i, t)| match t.entries() {
            [(label, body)] if body.is_map() => (body, label.name.clone()),
            _ => (t, name_of(t, i)),
        })
        .collect()
}

/// Workbook tasks by name.
pub(crate) fn workbook_task_nodes(root: &Node) -> Vec<(&Node, String)> {
    let mut out = Vec::new();
    if let Some(wb) = root.get("workbook") {
        let list = wb.get("tasks").unwrap_or(wb);
        match &list.kind {
            NodeKind::Seq(items) => {
                for (i, t) in items.iter().enumerate() {
                    out.push((t, name_of(t, i)));
                }
            }
            NodeKind::Map(entries) => {
                for (k, t) in entries {
                    out.push((t, k.name.clone()));
                }
            }
            _ => {}
        }
    }
    out
}

/// Every task: the steps' tasks, then the workbook's.
pub(crate) fn tasks(root: &Node) -> Vec<(&Node, String)> {
    let mut out: Vec<(&Node, String)> = root
        .get("workflow")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .flat_map(step_tasks)
        .collect();
    out.extend(workbook_task_nodes(root));
    out
}

pub(crate) fn name_of(t: &Node, i: usize) -> String {
    t.get("name")
        .and_then(Node::as_str)
        .map_or_else(|| format!("#{}", i + 1), str::to_string)
}

pub(crate) fn steps(root: &Node) -> impl Iterator<Item = (&Node, &str)> {
    root.get("workflow")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .map(|s| (s, s.get("step").and_then(Node::as_str).unwrap_or("?")))
}

/// Every rule of the playbook (task policy rules and admission rules).
pub(crate) fn rules(root: &Node) -> Vec<&Node> {
    let mut out = Vec::new();
    for (t, _) in tasks(root) {
        if let Some(r) = t.pointer("/spec/policy/rules") {
            out.extend(r.items());
        }
    }
    for (s, _) in steps(root) {
        if let Some(r) = s.pointer("/spec/policy/admit/rules") {
            out.extend(r.items());
        }
    }
    out
}

/// The arcs of every step.
pub(crate) fn arcs(root: &Node) -> Vec<&Node> {
    steps(root)
        .filter_map(|(s, _)| s.get("next"))
        .filter_map(|n| n.get("arcs"))
        .flat_map(Node::items)
        .collect()
}

/// The kind of a NoETL v1 step that is its own task (`tool: python`, or
/// `type: python`), if the step is one.
pub(crate) fn step_kind(step: &Node) -> Option<&str> {
    step.get("tool")
        .or_else(|| step.get("type"))
        .and_then(Node::as_str)
}
