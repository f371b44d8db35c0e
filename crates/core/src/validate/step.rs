//! One step: its keys, its `spec` (admission, lifecycle, timeout, failure
//! mode) and its `loop`; its `tool` and `next` have modules of their own.

use std::collections::HashMap;

use super::next::Route;
use super::rules::misshapen_else;
use super::{allowed_list, closest, Validator, ACTIONS};
use crate::codes::Code;
use crate::reduce::{ReducerOp, OPS as REDUCER_OPS};
use crate::yaml::{escape, Node, NodeKind};

const STEP_KEYS: &[&str] = &["step", "desc", "spec", "loop", "tool", "next"];
const LOOP_KEYS: &[&str] = &["in", "cursor", "iterator", "spec"];

/// A step key of an older DSL: its code, the reason and the help line.
fn legacy_step_key(key: &str) -> Option<(Code, &'static str, &'static str)> {
    match key {
        "when" => Some((Code::E010, "`step.when` is not part of the v10 DSL", "gate the step with `spec.policy.admit.rules` (`- when: ... then: {allow: true}`); `noetl migrate` rewrites it")),
        "case" => Some((Code::E013, "step-level `case` is not part of the v10 DSL", "use task policy (`tool[].spec.policy.rules`) for outcomes and `next.arcs` for routing")),
        "pipe" => Some((Code::E014, "`pipe` is not part of the v10 DSL", "`step.tool` is always the ordered pipeline: list the tasks under `tool`")),
        "vars" => Some((Code::E017, "step-level `vars` is not part of the v10 DSL", "write execution state with `set_ctx` and iteration state with `set_iter` in a task policy")),
        "sink" => Some((Code::E016, "`sink` is not a special block in v10", "storage is just a tool task that writes and returns a reference")),
        "eval" => Some((Code::E011, "legacy `eval` is rejected", "use `task.spec.policy.rules` (`- when: ... then: {do: ...}`)")),
        "expr" => Some((Code::E012, "`expr` is not a condition keyword in v10", "use `when`")),
        _ => None,
    }
}

impl Validator {
    /// One step: its keys, `spec`, `loop`, `tool` and `next`, in that order.
    pub(super) fn step(&mut self, s: &Node, path: &str, names: &HashMap<String, usize>) {
        if !self.expect_map(s, path, "a step") {
            return;
        }
        let name = self
            .required_str(s, "step", path, "a step")
            .unwrap_or_else(|| "?".into());
        self.step_keys(s, path, &name);
        if let Some(spec) = s.get("spec") {
            self.step_spec(spec, path);
        }
        let lp = s.get("loop");
        let is_parallel = lp
            .and_then(|l| l.get("spec"))
            .and_then(|sp| sp.get("mode"))
            .and_then(Node::as_str)
            == Some("parallel");
        // ctx keys the loop aggregates through reducers: parallel writes to
        // them are the intended pattern, not a hazard.
        let reduced: Vec<String> = lp
            .and_then(|l| l.pointer("/spec/policy/reducers"))
            .map(|r| r.entries().iter().map(|(k, _)| k.name.clone()).collect())
            .unwrap_or_default();
        let parallel = is_parallel.then_some(reduced.as_slice());
        if let Some(l) = lp {
            self.loop_(l, &format!("{path}/loop"), &name);
            if let Some(t) = l.pointer("/spec/timeout") {
                self.task_timeout(t, &format!("{path}/loop/spec/timeout"));
            }
        }
        if let Some(tool) = s.get("tool") {
            self.tool(tool, &format!("{path}/tool"), &name, parallel);
        }
        if let Some(next) = s.get("next") {
            let route = Route {
                step: &name,
                names,
                is_loop: lp.is_some(),
            };
            self.next(next, &format!("{path}/next"), &route);
        }
    }

    /// A step's keys: those of older DSLs with their own codes, any other
    /// unknown one E005.
    fn step_keys(&mut self, s: &Node, path: &str, name: &str) {
        for (k, _) in s.entries() {
            let kp = format!("{path}/{}", escape(&k.name));
            if let Some((code, msg, help)) = legacy_step_key(k.name.as_str()) {
                self.err(code, k.span, &kp, format!("{msg} (step `{name}`)"), help);
            } else if let Some((what, help)) = super::task::sugar(&k.name) {
                self.err(Code::E047, k.span, &kp, format!("step `{name}` uses the authoring sugar `{}` ({what}), which this engine does not compile: it belongs in `tool`, rewritten into canonical tasks", k.name), help);
            } else if !STEP_KEYS.contains(&k.name.as_str()) {
                let help = match closest(&k.name, STEP_KEYS) {
                    Some(c) => format!("did you mean `{c}`? allowed: {}", allowed_list(STEP_KEYS)),
                    None => format!("allowed: {}", allowed_list(STEP_KEYS)),
                };
                self.err(
                    Code::E005,
                    k.span,
                    &kp,
                    format!("unknown field `{}` in step `{name}`", k.name),
                    &help,
                );
            }
        }
    }

    /// `step.spec`: a mapping with no control actions, its admission rules,
    /// lifecycle time limits, timeout and failure mode.
    fn step_spec(&mut self, spec: &Node, path: &str) {
        if !self.expect_map(spec, &format!("{path}/spec"), "`step.spec`") {
            return;
        }
        self.no_control(spec, &format!("{path}/spec"), "the step spec");
        if let Some(admit) = spec.get("policy").and_then(|p| p.get("admit")) {
            self.admit(admit, &format!("{path}/spec/policy/admit"));
        }
        if let Some(c) = spec.get("policy").and_then(|p| p.get("concurrency")) {
            let cp = format!("{path}/spec/policy/concurrency");
            self.concurrency(c, &cp, super::gates::Level::Step);
        }
        if let Some(r) = spec.get("policy").and_then(|p| p.get("rate")) {
            self.rate(r, &format!("{path}/spec/policy/rate"));
        }
        self.lifecycles(spec, path);
        if let Some(t) = spec.get("timeout") {
            self.task_timeout(t, &format!("{path}/spec/timeout"));
        }
        self.failure_modes(spec, path);
    }

    /// `spec.lifecycle` and `spec.policy.lifecycle`: their `timeout_s` and
    /// `deadline_s` in seconds.
    fn lifecycles(&mut self, spec: &Node, path: &str) {
        for (lc, lp) in [
            (spec.get("lifecycle"), format!("{path}/spec/lifecycle")),
            (
                spec.get("policy").and_then(|p| p.get("lifecycle")),
                format!("{path}/spec/policy/lifecycle"),
            ),
        ] {
            let Some(lc) = lc else { continue };
            if !self.expect_map(lc, &lp, "`lifecycle`") {
                continue;
            }
            for key in ["timeout_s", "deadline_s"] {
                if let Some(v) = lc.get(key) {
                    self.seconds(v, &format!("{lp}/{key}"), &format!("`lifecycle.{key}`"));
                }
            }
        }
    }

    /// `spec.failure` and `spec.policy.failure`: a `mode` of `fail_fast` or
    /// `best_effort` (E004).
    fn failure_modes(&mut self, spec: &Node, path: &str) {
        for (failure, fp) in [
            (spec.get("failure"), format!("{path}/spec/failure")),
            (
                spec.get("policy").and_then(|p| p.get("failure")),
                format!("{path}/spec/policy/failure"),
            ),
        ] {
            let Some(failure) = failure else { continue };
            if !self.expect_map(failure, &fp, "`failure`") {
                continue;
            }
            if let Some(mode) = failure.get("mode") {
                if !matches!(mode.as_str(), Some("fail_fast" | "best_effort")) {
                    self.err(
                        Code::E004,
                        mode.span,
                        &format!("{fp}/mode"),
                        "`failure.mode` must be `fail_fast` or `best_effort`".into(),
                        "fail_fast (default) stops at the first failed iteration",
                    );
                }
            }
        }
    }

    /// `spec.policy.admit`: a list of admission rules that allow or refuse
    /// the step, with no control actions (E021).
    fn admit(&mut self, admit: &Node, path: &str) {
        if !self.expect_map(admit, path, "`admit`") {
            return;
        }
        let Some(rules) = admit.get("rules") else {
            return;
        };
        if !rules.is_seq() {
            self.err(Code::E004, rules.span, &format!("{path}/rules"), format!("`admit.rules` must be a list, found {}", rules.type_name()), "write `rules: [ {when: ..., then: {allow: true}}, {else: {then: {allow: false}}} ]`");
            return;
        }
        for (i, r) in rules.items().iter().enumerate() {
            let rp = format!("{path}/rules/{i}");
            if !self.expect_map(r, &rp, "an admission rule") {
                continue;
            }
            self.rule_shape(r, &rp, "an admission rule");
            if r.get("when").is_none()
                && r.get("else").is_none()
                && r.get("expr").is_none()
                && r.get("eval").is_none()
            {
                self.err(
                    Code::E003,
                    r.span,
                    &rp,
                    format!("admission rule {i} has neither `when` nor `else`"),
                    "add `when: \"{{ ... }}\"`, or make it the `else` rule",
                );
            }
            match r.get("then") {
                None if misshapen_else(r) => {} // E004 shows the whole form
                None => self.err(
                    Code::E003,
                    r.span,
                    &rp,
                    "admission rule has no `then`".into(),
                    "add `then: { allow: true }`",
                ),
                Some(t) => {
                    if self.expect_map(t, &format!("{rp}/then"), "`then`") {
                        for (k, _) in t.entries() {
                            let kp = format!("{rp}/then/{}", escape(&k.name));
                            if ACTIONS.contains(&k.name.as_str()) {
                                self.err(Code::E021, k.span, &kp, format!("control action `{}` in an admission rule", k.name), "admission only allows or refuses (`then: { allow: true }`); retry/jump/break/continue/fail live in `tool[].spec.policy.rules`");
                            } else if !matches!(k.name.as_str(), "allow" | "do") {
                                self.err(
                                    Code::E005,
                                    k.span,
                                    &kp,
                                    format!("unknown field `{}` in an admission `then`", k.name),
                                    "the only field here is `allow: true|false`",
                                );
                            }
                        }
                        match t.get("allow") {
                            Some(a) if matches!(a.kind, NodeKind::Bool(_)) => {}
                            Some(a) => self.err(
                                Code::E004,
                                a.span,
                                &format!("{rp}/then/allow"),
                                "`allow` must be true or false".into(),
                                "write `allow: true`",
                            ),
                            None if t.get("do").is_none() => self.err(
                                Code::E003,
                                t.span,
                                &format!("{rp}/then"),
                                "admission `then` has no `allow`".into(),
                                "write `then: { allow: true }`",
                            ),
                            None => {}
                        }
                    }
                }
            }
        }
    }

    /// `loop`: known keys, an `in` (or a cursor), an `iterator`, a valid
    /// `spec`, and the cursor settings.
    fn loop_(&mut self, l: &Node, path: &str, step: &str) {
        if !self.expect_map(l, path, "`loop`") {
            return;
        }
        self.no_control(l, path, "the loop");
        let plain: Vec<_> = l
            .entries()
            .iter()
            .filter(|(k, _)| k.name != "do")
            .cloned()
            .collect();
        self.unknown_keys(
            &Node {
                kind: NodeKind::Map(plain),
                span: l.span,
            },
            path,
            "`loop`",
            LOOP_KEYS,
        );
        if let Some(i) = l.get("in").filter(|i| !collection_or_template(i)) {
            self.err(
                Code::E004,
                i.span,
                &format!("{path}/in"),
                format!(
                    "`loop.in` of step `{step}` must be a list, or a template giving one; found {}",
                    i.type_name()
                ),
                "write `in: [1, 2, 3]` or `in: \"{{ workload.items }}\"`",
            );
        }
        if l.get("in").is_none() && l.get("cursor").is_none() {
            self.err(
                Code::E032,
                l.span,
                path,
                format!("loop of step `{step}` has no `in`"),
                "add `in: \"{{ workload.items }}\"` (a list or a template giving one)",
            );
        }
        match l.get("iterator") {
            None => self.err(
                Code::E033,
                l.span,
                path,
                format!("loop of step `{step}` has no `iterator`"),
                "add `iterator: item` (the name bound in `iter`)",
            ),
            Some(it) if it.as_str().map(|s| s.is_empty()).unwrap_or(true) => self.err(
                Code::E004,
                it.span,
                &format!("{path}/iterator"),
                "`iterator` must be a name".into(),
                "write `iterator: item`",
            ),
            _ => {}
        }
        if let Some(spec) = l.get("spec") {
            if self.expect_map(spec, &format!("{path}/spec"), "`loop.spec`") {
                if let Some(mode) = spec.get("mode") {
                    if !matches!(mode.as_str(), Some("sequential" | "parallel" | "cursor")) {
                        self.err(
                            Code::E004,
                            mode.span,
                            &format!("{path}/spec/mode"),
                            "`loop.spec.mode` must be `sequential`, `parallel` or `cursor`".into(),
                            "sequential is the default; cursor goes with `loop.cursor`",
                        );
                    }
                }
                self.loop_exec(spec, path);
                self.reducers(spec, path, step);
                if let Some(m) = spec.get("max_in_flight") {
                    if !super::cursor::positive_or_template(m) {
                        self.err(
                            Code::E004,
                            m.span,
                            &format!("{path}/spec/max_in_flight"),
                            format!("`max_in_flight` of the loop of step `{step}` must be an integer >= 1"),
                            "e.g. `max_in_flight: 4`, or a template giving one",
                        );
                    }
                }
            }
        }
        self.cursor_loop(l, path, step);
    }

    /// `loop.spec.policy.reducers`: each names an op the loop-supervisor
    /// folds with (E045). The names are [`ReducerOp::parse`]'s, the same
    /// function the loop-supervisor refuses a loop with at run time.
    fn reducers(&mut self, spec: &Node, path: &str, step: &str) {
        let Some(r) = spec.pointer("/policy/reducers") else {
            return;
        };
        let rp = format!("{path}/spec/policy/reducers");
        if !self.expect_map(r, &rp, "`loop.spec.policy.reducers`") {
            return;
        }
        for (k, v) in r.entries() {
            let op = v.as_str().or_else(|| v.get("op").and_then(Node::as_str));
            if op.is_some_and(|o| ReducerOp::parse(o).is_ok()) {
                continue;
            }
            let shown = op.unwrap_or("").to_string();
            let help = match op.and_then(|o| closest(o, REDUCER_OPS)) {
                Some(c) => format!(
                    "did you mean `{c}`? reducers: {}",
                    allowed_list(REDUCER_OPS)
                ),
                None => format!("reducers: {}", allowed_list(REDUCER_OPS)),
            };
            self.err(
                Code::E045,
                v.span,
                &format!("{rp}/{}", escape(&k.name)),
                format!(
                    "unknown reducer `{shown}` for ctx key `{}` in the loop of step `{step}`",
                    k.name
                ),
                &help,
            );
        }
    }
}

/// A `loop.in` that can give a list: a list, or a template (what it gives
/// is known only at run time, where the loop-supervisor checks it).
fn collection_or_template(n: &Node) -> bool {
    match n.as_str() {
        Some(s) => crate::template::is_template(s),
        None => n.is_seq(),
    }
}
