//! The document's top level: its sections (apiVersion, kind, metadata,
//! workload, executor, keychain, workflow), one method each, in document
//! order, and which steps the entry step reaches.

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::{allowed_list, closest, Validator};
use crate::codes::Code;
use crate::yaml::{escape, Node};

const ROOT_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "keychain",
    "executor",
    "workload",
    "workflow",
    "workbook",
];

impl Validator {
    /// The checks of the document's top level, one section at a time.
    pub(super) fn root(&mut self, root: &Node) {
        if !self.expect_map(root, "", "the playbook document") {
            return;
        }
        self.root_sections(root);
        for key in ["apiVersion", "kind"] {
            self.required_str(root, key, "", "the playbook");
        }
        self.metadata(root);
        if let Some(w) = root.get("workload") {
            if !w.is_null() {
                self.expect_map(w, "/workload", "`workload`");
            }
        }
        self.executor(root);
        self.keychain(root);
        self.workflow(root);
    }

    /// E002: a root key that is not a section of the v10 DSL (`vars` is
    /// named as such).
    fn root_sections(&mut self, root: &Node) {
        for (k, _) in root.entries() {
            if ROOT_KEYS.contains(&k.name.as_str()) {
                continue;
            }
            let path = format!("/{}", escape(&k.name));
            if k.name == "vars" {
                self.err(
                    Code::E002,
                    k.span,
                    &path,
                    "root-level `vars` is not part of the v10 DSL".into(),
                    "keep inputs in `workload`; mutable state goes to `ctx`/`iter` via set_ctx/set_iter",
                );
            } else {
                let help = match closest(&k.name, ROOT_KEYS) {
                    Some(s) => format!(
                        "did you mean `{s}`? root sections: {}",
                        allowed_list(ROOT_KEYS)
                    ),
                    None => format!("root sections: {}", allowed_list(ROOT_KEYS)),
                };
                self.err(
                    Code::E002,
                    k.span,
                    &path,
                    format!("unknown root section `{}`", k.name),
                    &help,
                );
            }
        }
    }

    /// `metadata`: present (E003), a mapping with a `name`.
    fn metadata(&mut self, root: &Node) {
        match root.get("metadata") {
            None => self.err(
                Code::E003,
                root.span,
                "",
                "the playbook has no `metadata`".into(),
                "add `metadata: { name: ..., path: ... }`",
            ),
            Some(m) => {
                if self.expect_map(m, "/metadata", "`metadata`") {
                    self.required_str(m, "name", "/metadata", "`metadata`");
                }
            }
        }
    }

    /// `executor`: a mapping with no control actions, valid time limits
    /// and a valid `spec`.
    fn executor(&mut self, root: &Node) {
        let Some(e) = root.get("executor") else {
            return;
        };
        if e.is_null() || !self.expect_map(e, "/executor", "`executor`") {
            return;
        }
        // `executor.spec.policy` holds global, non-control defaults.
        self.no_control(e, "/executor", "the executor spec");
        if let Some(t) = e.pointer("/spec/limits/timeout_s") {
            self.seconds(
                t,
                "/executor/spec/limits/timeout_s",
                "`executor.spec.limits.timeout_s` (the execution's deadline)",
            );
        }
        if let Some(t) = e.pointer("/spec/timeout") {
            self.task_timeout(t, "/executor/spec/timeout");
        }
        if let Some(spec) = e.get("spec").filter(|s| s.is_map()) {
            self.executor_spec(spec);
        }
    }

    /// `keychain`: a list (E004) of entries with a `name` and a `kind` this
    /// engine resolves.
    fn keychain(&mut self, root: &Node) {
        let Some(kc) = root.get("keychain") else {
            return;
        };
        if !kc.is_seq() && !kc.is_null() {
            self.err(
                Code::E004,
                kc.span,
                "/keychain",
                format!("`keychain` must be a list, found {}", kc.type_name()),
                "write `keychain: [{name: ..., kind: ...}]`",
            );
        }
        for (i, e) in kc.items().iter().enumerate() {
            let p = format!("/keychain/{i}");
            if self.expect_map(e, &p, "a keychain entry") {
                self.required_str(e, "name", &p, "a keychain entry");
                self.required_str(e, "kind", &p, "a keychain entry");
                self.keychain_kind(e, &p);
            }
        }
    }

    /// `workflow`: a non-empty list (E003, E004, E031) of uniquely named
    /// steps, each valid and reachable from the entry step.
    fn workflow(&mut self, root: &Node) {
        let Some(workflow) = root.get("workflow") else {
            self.err(
                Code::E003,
                root.span,
                "",
                "the playbook has no `workflow`".into(),
                "add `workflow:` with a list of steps",
            );
            return;
        };
        if !workflow.is_seq() {
            self.err(
                Code::E004,
                workflow.span,
                "/workflow",
                format!(
                    "`workflow` must be a list of steps, found {}",
                    workflow.type_name()
                ),
                "write `workflow:` followed by `- step: name` items",
            );
            return;
        }
        let steps = workflow.items();
        if steps.is_empty() {
            self.err(
                Code::E031,
                workflow.span,
                "/workflow",
                "`workflow` has no steps, so there is no entry step".into(),
                "add a step (named `start`, or the first step is the entry)",
            );
            return;
        }
        let names = self.step_names(steps);
        for (i, s) in steps.iter().enumerate() {
            self.step(s, &format!("/workflow/{i}"), &names);
        }
        self.reachability(steps, &names);
    }

    /// Each step name with the index of the first step that has it; E035
    /// for every later step of the same name.
    fn step_names(&mut self, steps: &[Node]) -> HashMap<String, usize> {
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, s) in steps.iter().enumerate() {
            if let Some(name) = s.get("step").and_then(Node::as_str) {
                if let Some(first) = names.get(name) {
                    let first_line = steps[*first].span.line;
                    self.err(
                        Code::E035,
                        s.get("step").map(|n| n.span).unwrap_or(s.span),
                        &format!("/workflow/{i}/step"),
                        format!("duplicate step name `{name}` (first at line {first_line})"),
                        "step names must be unique in a workflow",
                    );
                } else {
                    names.insert(name.to_string(), i);
                }
            }
        }
        names
    }

    /// W102: a step the entry step (`start`, or the first) cannot reach
    /// through the arcs.
    fn reachability(&mut self, steps: &[Node], names: &HashMap<String, usize>) {
        let entry = names.get("start").copied().unwrap_or(0);
        let mut seen = BTreeSet::from([entry]);
        let mut queue = VecDeque::from([entry]);
        while let Some(i) = queue.pop_front() {
            let arcs = steps[i].get("next").and_then(|n| n.get("arcs"));
            for a in arcs.map(Node::items).unwrap_or(&[]) {
                if let Some(j) = a
                    .get("step")
                    .and_then(Node::as_str)
                    .and_then(|t| names.get(t))
                {
                    if seen.insert(*j) {
                        queue.push_back(*j);
                    }
                }
            }
        }
        for (i, s) in steps.iter().enumerate() {
            if seen.contains(&i) {
                continue;
            }
            if let Some(name) = s.get("step").and_then(Node::as_str) {
                if names.get(name) != Some(&i) {
                    continue; // a duplicate (E035)
                }
                let entry_name = steps[entry]
                    .get("step")
                    .and_then(Node::as_str)
                    .unwrap_or("?");
                self.warn(
                    Code::W102,
                    s.get("step").map(|n| n.span).unwrap_or(s.span),
                    &format!("/workflow/{i}"),
                    format!("step `{name}` cannot be reached from the entry step `{entry_name}`"),
                    "add an arc to it, or remove it",
                );
            }
        }
    }
}
