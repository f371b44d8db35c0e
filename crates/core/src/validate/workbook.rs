//! The root `workbook` (named task bodies) and the `kind: workbook` tasks
//! that call them.

use super::{allowed_list, closest, Validator};
use crate::codes::Code;
use crate::yaml::{escape, Node, NodeKind};

impl Validator {
    // Over 80 lines on purpose: the checks of the workbook list (names, kinds, duplicates,
    // references), in document order.
    /// The root `workbook`: its shape, and every task body validated like a
    /// pipeline task. Returns the defined tasks by name, in document order.
    fn workbook<'a>(&mut self, root: &'a Node) -> Vec<(String, &'a Node)> {
        let Some(wb) = root.get("workbook") else {
            return Vec::new();
        };
        let (base, list) = match &wb.kind {
            NodeKind::Map(_) => {
                self.unknown_keys(wb, "/workbook", "`workbook`", &["tasks"]);
                match wb.get("tasks") {
                    None => {
                        self.err(
                            Code::E003,
                            wb.span,
                            "/workbook",
                            "`workbook` has no `tasks`".into(),
                            "write `workbook: { tasks: { name: {kind: ..., ...} } }`",
                        );
                        return Vec::new();
                    }
                    Some(t) => ("/workbook/tasks", t),
                }
            }
            _ => ("/workbook", wb),
        };
        let mut defined: Vec<(String, &Node)> = Vec::new();
        match &list.kind {
            NodeKind::Map(named) => {
                defined.extend(named.iter().map(|(k, v)| (k.name.clone(), v)));
            }
            NodeKind::Seq(items) => {
                for (i, t) in items.iter().enumerate() {
                    let tp = format!("{base}/{i}");
                    if !t.is_map() {
                        continue; // reported by `task`
                    }
                    let Some(name) = self.required_str(t, "name", &tp, "a workbook task") else {
                        continue;
                    };
                    if let Some((_, first)) = defined.iter().find(|(n, _)| *n == name) {
                        let line = first.span.line;
                        self.err(
                            Code::E034,
                            t.get("name").map(|x| x.span).unwrap_or(t.span),
                            &format!("{tp}/name"),
                            format!("duplicate workbook task name `{name}` (first at line {line})"),
                            "workbook task names are what `task:` calls: make them unique",
                        );
                        continue;
                    }
                    defined.push((name, t));
                }
            }
            _ => {
                self.err(
                    Code::E004,
                    list.span,
                    base,
                    format!(
                        "`{}` must be a mapping or a list of tasks, found {}",
                        &base[1..],
                        list.type_name()
                    ),
                    "write `workbook: { tasks: { name: {kind: ..., ...} } }`",
                );
                return Vec::new();
            }
        }
        match &list.kind {
            NodeKind::Map(named) => {
                for (k, v) in named {
                    let tp = format!("{base}/{}", escape(&k.name));
                    let whose = format!("workbook task `{}`", k.name);
                    self.task(v, &tp, &k.name, &whose, None, None);
                }
            }
            _ => {
                for (i, t) in list.items().iter().enumerate() {
                    let name = t.get("name").and_then(Node::as_str).unwrap_or("?");
                    let whose = format!("workbook task `{name}`");
                    self.task(t, &format!("{base}/{i}"), name, &whose, None, None);
                }
            }
        }
        defined
    }

    /// Every `kind: workbook` task names a task the `workbook` defines, and
    /// the jump targets of a workbook task's policy (when the call site has
    /// no policy of its own) are tasks of the calling pipeline.
    pub(super) fn workbook_calls(&mut self, root: &Node) {
        let defined = self.workbook(root);
        let names: Vec<&str> = defined.iter().map(|(n, _)| n.as_str()).collect();
        let Some(steps) = root
            .get("workflow")
            .filter(|w| matches!(w.kind, NodeKind::Seq(_)))
        else {
            return;
        };
        for (si, s) in steps.items().iter().enumerate() {
            let Some(tool) = s.get("tool").filter(|t| matches!(t.kind, NodeKind::Seq(_))) else {
                continue;
            };
            let pipeline: Vec<&str> = tool
                .items()
                .iter()
                .filter_map(|t| t.get("name").and_then(Node::as_str))
                .collect();
            let step = s.get("step").and_then(Node::as_str).unwrap_or("?");
            for (ti, t) in tool.items().iter().enumerate() {
                if t.get("kind").and_then(Node::as_str) != Some("workbook") {
                    continue;
                }
                let path = format!("/workflow/{si}/tool/{ti}");
                let label = t.get("name").and_then(Node::as_str).unwrap_or("?");
                let known = if names.is_empty() {
                    "the playbook has no `workbook` tasks".to_string()
                } else {
                    format!("workbook tasks: {}", allowed_list(&names))
                };
                match t.get("task") {
                    None => self.err(
                        Code::E038,
                        t.span,
                        &path,
                        format!("task `{label}` has kind `workbook` but no `task`"),
                        &format!("add `task: <name>`; {known}"),
                    ),
                    Some(n) => match n.as_str() {
                        Some(name) => match defined.iter().find(|(d, _)| d == name) {
                            Some((_, def)) => {
                                if t.pointer("/spec/policy").is_none() {
                                    self.workbook_jumps(def, name, n, &path, step, &pipeline);
                                }
                            }
                            None => {
                                let help = match closest(name, &names) {
                                    Some(c) => format!("did you mean `{c}`? {known}"),
                                    None => known.clone(),
                                };
                                self.err(
                                    Code::E038,
                                    n.span,
                                    &format!("{path}/task"),
                                    format!("task `{label}` calls workbook task `{name}`, which is not defined"),
                                    &help,
                                )
                            }
                        },
                        None => self.err(
                            Code::E038,
                            n.span,
                            &format!("{path}/task"),
                            format!("`task` of workbook call `{label}` must be a string"),
                            &known,
                        ),
                    },
                }
            }
        }
    }

    /// E022 for each `jump` of workbook task `name`'s own policy whose target
    /// is not a task of the calling pipeline (reported at the call's `task`).
    fn workbook_jumps(
        &mut self,
        def: &Node,
        name: &str,
        call: &Node,
        path: &str,
        step: &str,
        pipeline: &[&str],
    ) {
        let Some(rules) = def.pointer("/spec/policy/rules") else {
            return;
        };
        for r in rules.items() {
            let Some(then) = r.get("then") else { continue };
            if then.get("do").and_then(Node::as_str) != Some("jump") {
                continue;
            }
            let Some(to) = then.get("to").and_then(Node::as_str) else {
                continue; // E026 at the workbook task
            };
            if pipeline.contains(&to) {
                continue;
            }
            self.err(
                Code::E022,
                call.span,
                &format!("{path}/task"),
                format!("workbook task `{name}` jumps to `{to}`, which is not a task of the pipeline of step `{step}` that calls it"),
                &format!("tasks of this pipeline: {}; or give the call its own `spec.policy`", allowed_list(pipeline)),
            );
        }
    }
}
