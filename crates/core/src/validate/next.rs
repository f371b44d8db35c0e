//! A step's router, `next: {spec, arcs}`: its form, its mode and each arc,
//! one method per part.

use std::collections::HashMap;

use super::{allowed_list, closest, Validator};
use crate::codes::Code;
use crate::yaml::{escape, Node, NodeKind};

const NEXT_KEYS: &[&str] = &["spec", "arcs"];
const ARC_KEYS: &[&str] = &["step", "when", "args", "set_ctx", "spec"];

fn is_unconditional(arc: &Node) -> bool {
    match arc.get("when") {
        None => true,
        Some(w) => match &w.kind {
            NodeKind::Bool(b) => *b,
            NodeKind::Str(s) => {
                let t = s.trim();
                t == "true" || t == "{{ true }}" || t == "{{true}}"
            }
            _ => false,
        },
    }
}

/// The step a `next` belongs to, as its checks see it.
pub(super) struct Route<'a> {
    /// The step's name, for messages.
    pub(super) step: &'a str,
    /// Every step name of the workflow, with its index.
    pub(super) names: &'a HashMap<String, usize>,
    /// The step has a `loop` (its arcs should test `loop.done`).
    pub(super) is_loop: bool,
}

impl Route<'_> {
    /// The step names in workflow order (the help lists them).
    fn step_names(&self) -> Vec<&str> {
        let mut ordered: Vec<(&str, usize)> =
            self.names.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        ordered.sort_by_key(|(_, i)| *i);
        ordered.into_iter().map(|(k, _)| k).collect()
    }
}

impl Validator {
    /// A step's `next`: the v10 form, its keys, its `spec` and its arcs.
    pub(super) fn next(&mut self, next: &Node, path: &str, route: &Route) {
        if !self.next_form(next, path, route.step) {
            return;
        }
        self.next_keys(next, path);
        self.next_spec(next, path);
        let inclusive = next
            .get("spec")
            .and_then(|s| s.get("mode"))
            .and_then(Node::as_str)
            == Some("inclusive");
        let Some(arcs) = next.get("arcs") else { return };
        if !arcs.is_seq() {
            self.err(
                Code::E004,
                arcs.span,
                &format!("{path}/arcs"),
                format!("`next.arcs` must be a list, found {}", arcs.type_name()),
                "write `arcs: [ {step: target} ]`",
            );
            return;
        }
        self.arcs(arcs, path, route, inclusive);
    }

    /// `next` is a mapping: the list and string forms of older DSLs are
    /// E015, anything else E004. False when it is not.
    fn next_form(&mut self, next: &Node, path: &str, step: &str) -> bool {
        match &next.kind {
            NodeKind::Seq(_) | NodeKind::Str(_) => {
                self.err(
                    Code::E015,
                    next.span,
                    path,
                    format!(
                        "`next` of step `{step}` is a {}; v10 routes with `next: {{spec, arcs}}`",
                        if next.is_seq() { "list" } else { "string" }
                    ),
                    "write `next: { arcs: [ {step: target, when: \"{{ ... }}\"} ] }`; `noetl migrate` rewrites it",
                );
                false
            }
            NodeKind::Map(_) => true,
            _ => {
                self.expect_map(next, path, "`next`");
                false
            }
        }
    }

    /// The keys of `next`: the legacy conditional form (E015), or else
    /// unknown keys (E005); and no control actions (E021).
    fn next_keys(&mut self, next: &Node, path: &str) {
        let mut legacy = false;
        for (k, _) in next.entries() {
            if matches!(k.name.as_str(), "when" | "then" | "else") {
                legacy = true;
                self.err(Code::E015, k.span, &format!("{path}/{}", k.name), format!("`next.{}` is the legacy conditional form", k.name), "put each condition on an arc: `next: { arcs: [ {step: x, when: \"{{ ... }}\"} ] }`");
            }
        }
        if !legacy {
            self.unknown_keys(next, path, "`next`", NEXT_KEYS);
        }
        self.no_control(next, path, "the router (`next`)");
    }

    /// `next.spec`: a mapping whose `mode` is `exclusive` or `inclusive`.
    fn next_spec(&mut self, next: &Node, path: &str) {
        let Some(spec) = next.get("spec") else {
            return;
        };
        if !self.expect_map(spec, &format!("{path}/spec"), "`next.spec`") {
            return;
        }
        if let Some(mode) = spec.get("mode") {
            if !matches!(mode.as_str(), Some("exclusive" | "inclusive")) {
                self.err(
                    Code::E004,
                    mode.span,
                    &format!("{path}/spec/mode"),
                    "`next.spec.mode` must be `exclusive` or `inclusive`".into(),
                    "exclusive (default): first matching arc; inclusive: all matching arcs",
                );
            }
        }
    }

    /// Each arc of `next.arcs`; W103 for an arc after an unconditional one
    /// in exclusive mode, W105 for a loop step none of whose arcs tests
    /// `loop.done`.
    fn arcs(&mut self, arcs: &Node, path: &str, route: &Route, inclusive: bool) {
        let step = route.step;
        let mut unconditional_seen: Option<usize> = None;
        let mut tests_loop_done = false;
        let step_names = route.step_names();
        for (i, a) in arcs.items().iter().enumerate() {
            let ap = format!("{path}/arcs/{i}");
            if !self.expect_map(a, &ap, "an arc") {
                continue;
            }
            self.arc(a, &ap, route, &step_names);
            if let Some(w) = a.get("when").and_then(Node::as_str) {
                if w.contains("loop.done") {
                    tests_loop_done = true;
                }
            }
            if !inclusive {
                if let Some(first) = unconditional_seen {
                    self.warn(Code::W103, a.span, &ap, format!("arc {i} of step `{step}` can never fire: arc {first} before it has no condition (exclusive mode)"), "reorder the arcs, add a `when` to the earlier one, or use `spec.mode: inclusive`");
                } else if is_unconditional(a) {
                    unconditional_seen = Some(i);
                }
            }
        }
        if route.is_loop && !arcs.items().is_empty() && !tests_loop_done {
            self.warn(Code::W105, arcs.span, &format!("{path}/arcs"), format!("loop step `{step}` has arcs but none tests `loop.done`"), "a loop's boundary event is `loop.done` (or `step.failed`): guard arcs with `event.name == 'loop.done'`");
        }
    }

    /// One arc: its keys, a string `when`, a target that is a step (E030),
    /// and `args` / `set_ctx` mappings (E004).
    fn arc(&mut self, a: &Node, ap: &str, route: &Route, step_names: &[&str]) {
        let step = route.step;
        self.arc_keys(a, ap, step);
        self.when_is_string(a, ap);
        if let Some(target) = self.required_str(a, "step", ap, "an arc") {
            if !route.names.contains_key(&target) {
                let help = match closest(&target, step_names) {
                    Some(c) => format!("did you mean `{c}`?"),
                    None => format!("steps: {}", allowed_list(step_names)),
                };
                self.err(
                    Code::E030,
                    a.get("step").map(|n| n.span).unwrap_or(a.span),
                    &format!("{ap}/step"),
                    format!("arc of step `{step}` targets `{target}`, which is not a step"),
                    &help,
                );
            }
        }
        for field in ["args", "set_ctx"] {
            if let Some(v) = a.get(field).filter(|v| !v.is_map()) {
                self.err(
                    Code::E004,
                    v.span,
                    &format!("{ap}/{field}"),
                    format!("arc `{field}` must be a mapping"),
                    &format!("write `{field}: {{ name: value }}`"),
                );
            }
        }
    }

    /// An arc's keys: the legacy condition keys `expr` (E012) and `eval`
    /// (E011), any other unknown one E005 (`do` is E021, reported by
    /// `no_control`).
    fn arc_keys(&mut self, a: &Node, ap: &str, step: &str) {
        for (k, _) in a.entries() {
            let kp = format!("{ap}/{}", escape(&k.name));
            match k.name.as_str() {
                "expr" => self.err(
                    Code::E012,
                    k.span,
                    &kp,
                    format!("`expr` on an arc of step `{step}` is not a condition keyword in v10"),
                    "rename it to `when`: `- step: target` / `when: \"{{ ... }}\"` (`noetl migrate` renames it)",
                ),
                "eval" => self.err(
                    Code::E011,
                    k.span,
                    &kp,
                    format!("legacy `eval` on an arc of step `{step}` is rejected"),
                    "write the arc condition as `when: \"{{ ... }}\"`; outcome handling goes to `tool[].spec.policy.rules`",
                ),
                _ => {}
            }
        }
        let plain: Vec<_> = a
            .entries()
            .iter()
            .filter(|(k, _)| !matches!(k.name.as_str(), "do" | "expr" | "eval"))
            .cloned()
            .collect();
        self.unknown_keys(
            &Node {
                kind: NodeKind::Map(plain),
                span: a.span,
            },
            ap,
            "an arc",
            ARC_KEYS,
        );
    }
}
