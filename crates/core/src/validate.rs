//! Validation of a normalised playbook tree. Every rule reports with the
//! position of the offending node, a one-line reason and a help line; all
//! findings are returned at once. Codes are documented in `docs/errors.md`.

use crate::codes::Code;
use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::limits::{MAX_ARCS, MAX_STEPS};
use crate::template::RUNTIME_VARIABLES;
use crate::yaml::{escape, Node, NodeKind};

#[path = "validate_seeds.rs"]
mod seeds;
pub use seeds::{CREDENTIAL_KINDS, ON_UNMATCHED};

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
const STEP_KEYS: &[&str] = &["step", "desc", "spec", "loop", "tool", "next"];
const NEXT_KEYS: &[&str] = &["spec", "arcs"];
const ARC_KEYS: &[&str] = &["step", "when", "args", "set_ctx", "spec"];
const LOOP_KEYS: &[&str] = &["in", "cursor", "iterator", "spec"];
const THEN_KEYS: &[&str] = &[
    "do", "attempts", "backoff", "delay", "to", "set_iter", "set_ctx",
];
const ACTIONS: &[&str] = &["continue", "retry", "jump", "break", "fail"];
const RULE_KEYS: &[&str] = &["when", "else", "then"];
const BACKOFFS: &[&str] = &["none", "linear", "exponential"];

#[path = "validate_cursor.rs"]
mod cursor;

/// Validate a normalised tree.
pub fn validate(root: &Node) -> Diagnostics {
    let mut v = Validator {
        d: Diagnostics::default(),
    };
    // A workflow beyond the step or arc limit is refused before any other
    // rule runs (some rules look at every pair of steps).
    if v.sizes(root) {
        return v.d;
    }
    v.root(root);
    v.workbook_calls(root);
    v.templates(root);
    v.d.sort();
    v.d
}

struct Validator {
    d: Diagnostics,
}

impl Validator {
    /// E043 / E044: too many steps or arcs. True when a limit is exceeded.
    fn sizes(&mut self, root: &Node) -> bool {
        let Some(wf) = root.get("workflow").filter(|w| w.is_seq()) else {
            return false;
        };
        let steps = wf.items();
        if steps.len() > MAX_STEPS {
            self.d.push(
                Diagnostic::error(
                    Code::E043,
                    steps[MAX_STEPS].span,
                    &format!("/workflow/{MAX_STEPS}"),
                    format!(
                        "the workflow has {} steps, above the limit `max_steps` of {MAX_STEPS}",
                        steps.len()
                    ),
                )
                .help("split the workflow into child playbooks (docs/errors.md#e043)"),
            );
            return true;
        }
        let mut arcs = 0usize;
        for (i, step) in steps.iter().enumerate() {
            let Some(list) = step
                .get("next")
                .and_then(|n| n.get("arcs"))
                .filter(|a| a.is_seq())
            else {
                continue;
            };
            arcs += list.items().len();
            if arcs > MAX_ARCS {
                self.d.push(
                    Diagnostic::error(
                        Code::E044,
                        list.span,
                        &format!("/workflow/{i}/next/arcs"),
                        format!(
                            "the workflow has more than {MAX_ARCS} arcs (at least {arcs} by step {i}), above the limit `max_arcs`"
                        ),
                    )
                    .help("route with fewer arcs: conditions on one arc, a loop, or child playbooks (docs/errors.md#e044)"),
                );
                return true;
            }
        }
        false
    }
}

/// Task keys of older DSLs, refused with their own codes (E011-E016).
const LEGACY_TASK_KEYS: &[&str] = &["eval", "expr", "sink", "case"];

/// Levenshtein distance, for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = if ca == *cb { 0 } else { 1 };
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn closest<'a>(name: &str, options: &[&'a str]) -> Option<&'a str> {
    options
        .iter()
        .map(|o| (distance(name, o), *o))
        .filter(|(d, o)| *d <= 2.max(o.len() / 3))
        .min()
        .map(|(_, o)| o)
}

/// Names people write for a tool kind, and the kind they mean.
const KIND_ALIASES: &[(&str, &str)] = &[
    ("pg", "postgres"),
    ("postgresql", "postgres"),
    ("psql", "postgres"),
    ("py", "python"),
    ("python3", "python"),
    ("sh", "shell"),
    ("bash", "shell"),
    ("https", "http"),
    ("rest", "http"),
    ("duck", "duckdb"),
];

/// The known kind an unknown `kind` most likely means: a common alias,
/// the closest name, or the one it begins.
fn kind_suggestion<'a>(kind: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = kind.to_ascii_lowercase();
    KIND_ALIASES
        .iter()
        .find(|(alias, _)| *alias == lower)
        .and_then(|(_, k)| known.iter().find(|x| *x == k).copied())
        .or_else(|| closest(&lower, known))
        .or_else(|| {
            known
                .iter()
                .find(|k| lower.len() >= 2 && (k.starts_with(&lower) || lower.starts_with(**k)))
                .copied()
        })
}

fn allowed_list(options: &[&str]) -> String {
    options
        .iter()
        .map(|o| format!("`{o}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A short YAML flow rendering of a node, for help lines
/// (`{ do: break, attempts: 3 }`).
fn flow(n: &Node) -> String {
    fn value(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::String(s) => {
                let plain = !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
                if plain {
                    s.clone()
                } else {
                    serde_json::Value::String(s.clone()).to_string()
                }
            }
            serde_json::Value::Array(a) => {
                format!("[{}]", a.iter().map(value).collect::<Vec<_>>().join(", "))
            }
            serde_json::Value::Object(m) if m.is_empty() => "{}".into(),
            serde_json::Value::Object(m) => format!(
                "{{ {} }}",
                m.iter()
                    .map(|(k, v)| format!("{k}: {}", value(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            other => other.to_string(),
        }
    }
    value(&n.to_json())
}

/// An `else` that normalisation left as written: not a rule (E004).
fn misshapen_else(rule: &Node) -> bool {
    rule.get("else")
        .is_some_and(|e| !matches!(e.kind, NodeKind::Bool(true)))
}

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

impl Validator {
    fn err(
        &mut self,
        code: Code,
        node_span: crate::yaml::Span,
        path: &str,
        msg: String,
        help: &str,
    ) {
        self.d
            .push(Diagnostic::error(code, node_span, path, msg).help(help.to_string()));
    }

    fn warn(
        &mut self,
        code: Code,
        node_span: crate::yaml::Span,
        path: &str,
        msg: String,
        help: &str,
    ) {
        self.d
            .push(Diagnostic::warning(code, node_span, path, msg).help(help.to_string()));
    }

    /// A time limit: a positive number of seconds (E004).
    fn seconds(&mut self, n: &Node, path: &str, what: &str) -> bool {
        match crate::lifecycle::seconds(&n.to_json()) {
            Ok(_) => true,
            Err(why) => {
                self.err(
                    Code::E004,
                    n.span,
                    path,
                    format!("{what} {why}"),
                    "write seconds as a number greater than 0, e.g. `30` or `0.5`",
                );
                false
            }
        }
    }

    /// `spec.timeout`: seconds, or `{connect, read}` in seconds (E004).
    fn task_timeout(&mut self, n: &Node, path: &str) {
        if n.is_map() {
            for (k, v) in n.entries() {
                self.seconds(
                    v,
                    &format!("{path}/{}", k.name),
                    &format!("`spec.timeout.{}`", k.name),
                );
            }
        } else {
            self.seconds(n, path, "`spec.timeout`");
        }
    }

    fn expect_map(&mut self, n: &Node, path: &str, what: &str) -> bool {
        if n.is_map() {
            return true;
        }
        self.err(
            Code::E004,
            n.span,
            path,
            format!("{what} must be a mapping, found {}", n.type_name()),
            "see docs/errors.md#e004 (or `noetl schema`) for the expected shape",
        );
        false
    }

    fn unknown_keys(&mut self, n: &Node, path: &str, what: &str, allowed: &[&str]) {
        for (k, _) in n.entries() {
            if allowed.contains(&k.name.as_str()) {
                continue;
            }
            let help = match closest(&k.name, allowed) {
                None if k.name == "set" && allowed.contains(&"set_ctx") => {
                    "write `set_ctx: { key: value }` / `set_iter: { key: value }`".to_string()
                }
                Some(s) => format!(
                    "did you mean `{s}`? allowed here: {}",
                    allowed_list(allowed)
                ),
                None => format!("allowed here: {}", allowed_list(allowed)),
            };
            self.err(
                Code::E005,
                k.span,
                &format!("{path}/{}", escape(&k.name)),
                format!("unknown field `{}` in {what}", k.name),
                &help,
            );
        }
    }

    /// Closed rule shape `{when, else, then}` (legacy `expr`/`eval` named as
    /// such) and a string `when`.
    fn rule_shape(&mut self, r: &Node, path: &str, what: &str) {
        for (k, _) in r.entries() {
            let kp = format!("{path}/{}", escape(&k.name));
            match k.name.as_str() {
                "expr" => self.err(
                    Code::E012,
                    k.span,
                    &kp,
                    format!("`expr` in {what} is not a condition keyword in v10"),
                    "use `when` (`noetl migrate` renames it)",
                ),
                "eval" => self.err(
                    Code::E011,
                    k.span,
                    &kp,
                    format!("legacy `eval` in {what} is rejected"),
                    "write the condition as `when: \"{{ ... }}\"`",
                ),
                _ => {}
            }
        }
        let extra: Vec<_> = r
            .entries()
            .iter()
            .filter(|(k, _)| !matches!(k.name.as_str(), "expr" | "eval" | "do"))
            .cloned()
            .collect();
        let filtered = Node {
            kind: NodeKind::Map(extra),
            span: r.span,
        };
        self.unknown_keys(&filtered, path, what, RULE_KEYS);
        self.when_is_string(r, path);
        self.else_shape(r, path, what);
    }

    // Over 80 lines on purpose: one match over every shape an `else` can take, each with its
    // own message.
    /// After normalisation a fallback rule is `{else: true, then: ...}`; any
    /// other `else` (`false`, a string, a list, `{do: ...}`) is not a rule and
    /// must not silently become an always-matching one (E004). A rule with
    /// both `when` and `else` is refused too.
    fn else_shape(&mut self, r: &Node, path: &str, what: &str) {
        let Some((ek, ev)) = r.entry("else") else {
            return;
        };
        let ep = format!("{path}/else");
        let admission = what.contains("admission");
        let default_then = if admission {
            "{ allow: false }"
        } else {
            "{ do: continue }"
        };
        let canonical =
            |then: &str| format!("the fallback rule is written `- else: {{ then: {then} }}`");
        match &ev.kind {
            NodeKind::Bool(true) => {
                if let Some(w) = r.get("when") {
                    let then = r.get("then").map(flow).unwrap_or(default_then.into());
                    self.err(
                        Code::E004,
                        ek.span,
                        &ep,
                        format!("{what} has both `when` and `else`; an `else` is a rule of its own"),
                        &format!(
                            "split it: `- when: {}` with its `then`, then a separate `- else: {{ then: {then} }}`",
                            flow(w)
                        ),
                    );
                }
            }
            NodeKind::Bool(false) => self.err(
                Code::E004,
                ev.span,
                &ep,
                format!("`else: false` in {what} is not a rule (an `else` rule always matches)"),
                &format!(
                    "delete the rule to have no fallback, or give a rule a `when`; {}",
                    canonical(default_then)
                ),
            ),
            NodeKind::Map(inner) => {
                let stray: Vec<&str> = inner
                    .iter()
                    .map(|(k, _)| k.name.as_str())
                    .filter(|k| *k != "then")
                    .collect();
                let then = match ev.get("then") {
                    Some(t) => flow(t),
                    None => flow(ev),
                };
                self.err(
                    Code::E004,
                    ev.span,
                    &ep,
                    format!(
                        "`else` in {what} holds only `then`, found {} directly under `else`",
                        allowed_list(&stray)
                    ),
                    &canonical(&then),
                );
            }
            NodeKind::Seq(items) => {
                let then = match items.as_slice() {
                    [one] => one.get("then").map(flow).unwrap_or_else(|| flow(one)),
                    _ => default_then.to_string(),
                };
                self.err(
                    Code::E004,
                    ev.span,
                    &ep,
                    format!("`else` in {what} is a list; it takes a mapping with `then`"),
                    &canonical(&then),
                );
            }
            _ => self.err(
                Code::E004,
                ev.span,
                &ep,
                format!(
                    "`else` in {what} must be a mapping with `then`, found {}",
                    ev.type_name()
                ),
                &canonical(default_then),
            ),
        }
    }

    /// `when` must be a template string (booleans were normalised already).
    fn when_is_string(&mut self, n: &Node, path: &str) {
        if let Some(w) = n.get("when") {
            if w.as_str().is_none() {
                self.err(
                    Code::E004,
                    w.span,
                    &format!("{path}/when"),
                    format!("`when` must be a template string, found {}", w.type_name()),
                    "write `when: \"{{ ... }}\"`",
                );
            }
        }
    }

    fn required_str(&mut self, n: &Node, key: &str, path: &str, what: &str) -> Option<String> {
        match n.get(key) {
            None => {
                self.err(
                    Code::E003,
                    n.span,
                    path,
                    format!("{what} has no `{key}`"),
                    &format!("add `{key}:`"),
                );
                None
            }
            Some(v) => match &v.kind {
                NodeKind::Str(s) if !s.is_empty() => Some(s.clone()),
                _ => {
                    self.err(
                        Code::E004,
                        v.span,
                        &format!("{path}/{key}"),
                        format!(
                            "`{key}` of {what} must be a non-empty string, found {}",
                            v.type_name()
                        ),
                        "quote it if needed",
                    );
                    None
                }
            },
        }
    }

    // Over 80 lines on purpose: the checks of the document's top level (apiVersion, kind,
    // metadata, workload, keychain, executor, workbook, workflow), one short block per key in
    // document order.
    fn root(&mut self, root: &Node) {
        if !self.expect_map(root, "", "the playbook document") {
            return;
        }
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
        for key in ["apiVersion", "kind"] {
            self.required_str(root, key, "", "the playbook");
        }
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
        if let Some(w) = root.get("workload") {
            if !w.is_null() {
                self.expect_map(w, "/workload", "`workload`");
            }
        }
        if let Some(e) = root.get("executor") {
            if !e.is_null() && self.expect_map(e, "/executor", "`executor`") {
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
        }
        if let Some(kc) = root.get("keychain") {
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
        for (i, s) in steps.iter().enumerate() {
            self.step(s, &format!("/workflow/{i}"), &names);
        }
        self.reachability(steps, &names);
    }

    // Over 80 lines on purpose: the checks of one step's keys (spec, loop, tool, next), one
    // short block per key in document order.
    fn step(&mut self, s: &Node, path: &str, names: &HashMap<String, usize>) {
        if !self.expect_map(s, path, "a step") {
            return;
        }
        let name = self
            .required_str(s, "step", path, "a step")
            .unwrap_or_else(|| "?".into());
        for (k, _) in s.entries() {
            let kp = format!("{path}/{}", escape(&k.name));
            let legacy = match k.name.as_str() {
                "when" => Some((Code::E010, "`step.when` is not part of the v10 DSL", "gate the step with `spec.policy.admit.rules` (`- when: ... then: {allow: true}`); `noetl migrate` rewrites it")),
                "case" => Some((Code::E013, "step-level `case` is not part of the v10 DSL", "use task policy (`tool[].spec.policy.rules`) for outcomes and `next.arcs` for routing")),
                "pipe" => Some((Code::E014, "`pipe` is not part of the v10 DSL", "`step.tool` is always the ordered pipeline: list the tasks under `tool`")),
                "vars" => Some((Code::E017, "step-level `vars` is not part of the v10 DSL", "write execution state with `set_ctx` and iteration state with `set_iter` in a task policy")),
                "sink" => Some((Code::E016, "`sink` is not a special block in v10", "storage is just a tool task that writes and returns a reference")),
                "eval" => Some((Code::E011, "legacy `eval` is rejected", "use `task.spec.policy.rules` (`- when: ... then: {do: ...}`)")),
                "expr" => Some((Code::E012, "`expr` is not a condition keyword in v10", "use `when`")),
                _ => None,
            };
            if let Some((code, msg, help)) = legacy {
                self.err(code, k.span, &kp, format!("{msg} (step `{name}`)"), help);
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
        if let Some(spec) = s.get("spec") {
            if self.expect_map(spec, &format!("{path}/spec"), "`step.spec`") {
                self.no_control(spec, &format!("{path}/spec"), "the step spec");
                if let Some(admit) = spec.get("policy").and_then(|p| p.get("admit")) {
                    self.admit(admit, &format!("{path}/spec/policy/admit"));
                }
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
                if let Some(t) = spec.get("timeout") {
                    self.task_timeout(t, &format!("{path}/spec/timeout"));
                }
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
            self.next(next, &format!("{path}/next"), &name, names, lp.is_some());
        }
    }

    /// Control actions belong to task policy only (E021).
    fn no_control(&mut self, n: &Node, path: &str, what: &str) {
        let mut found = Vec::new();
        n.walk(path, &mut |p, node| {
            // Arc inscriptions and ctx writes are data, not policy.
            if p.contains("/args") || p.contains("/set_ctx") {
                return;
            }
            for (k, _) in node.entries() {
                if k.name == "do" {
                    found.push((k.span, format!("{p}/do")));
                }
            }
        });
        for (span, p) in found {
            let place = if p.contains("/policy/admit/") {
                "an admission rule"
            } else if p.contains("/arcs/") {
                "an arc"
            } else {
                what
            };
            self.err(
                Code::E021,
                span,
                &p,
                format!("control action (`do:`) in {place}"),
                "retry/jump/break/continue/fail live only in `tool[].spec.policy.rules`",
            );
        }
    }

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
            }
        }
        self.cursor_loop(l, path, step);
    }

    /// `parallel`: `Some(reduced ctx keys)` inside a parallel loop.
    fn tool(&mut self, tool: &Node, path: &str, step: &str, parallel: Option<&[String]>) {
        let tasks = match &tool.kind {
            NodeKind::Seq(t) => t,
            NodeKind::Null => {
                self.err(
                    Code::E037,
                    tool.span,
                    path,
                    format!("step `{step}` has an empty `tool`"),
                    "add a task, or remove `tool` for a routing-only step",
                );
                return;
            }
            _ => {
                self.err(Code::E004, tool.span, path, format!("`tool` of step `{step}` must be a list of tasks or one task with `kind`, found {}", tool.type_name()), "write `tool: [ {name: t, kind: noop} ]`");
                return;
            }
        };
        if tasks.is_empty() {
            self.err(
                Code::E037,
                tool.span,
                path,
                format!("step `{step}` has an empty `tool` list"),
                "add a task, or remove `tool` for a routing-only step",
            );
            return;
        }
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, t) in tasks.iter().enumerate() {
            if let Some(n) = t.get("name").and_then(Node::as_str) {
                if let Some(first) = names.get(n) {
                    let line = tasks[*first].span.line;
                    self.err(
                        Code::E034,
                        t.get("name").map(|x| x.span).unwrap_or(t.span),
                        &format!("{path}/{i}/name"),
                        format!(
                            "duplicate task name `{n}` in step `{step}` (first at line {line})"
                        ),
                        "task names are jump targets: make them unique in the pipeline",
                    );
                } else {
                    names.insert(n.to_string(), i);
                }
            }
        }
        // In pipeline order (the help lists them).
        let mut ordered: Vec<(&str, usize)> = names.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        ordered.sort_by_key(|(_, i)| *i);
        let labels: Vec<&str> = ordered.into_iter().map(|(k, _)| k).collect();
        for (i, t) in tasks.iter().enumerate() {
            let tp = format!("{path}/{i}");
            let tname = t.get("name").and_then(Node::as_str).unwrap_or("?");
            self.task(
                t,
                &tp,
                tname,
                &format!("task `{tname}` of step `{step}`"),
                Some(&labels),
                parallel,
            );
        }
    }

    /// One task body (a pipeline task or a root `workbook` task): a mapping
    /// with a tool `kind`, no legacy keys, a valid policy. `name` is its
    /// name when the body has no `name:` (a workbook `tasks:` key), `whose`
    /// names it in messages; `labels` are the jump targets (`None` for
    /// workbook tasks, whose targets are checked at each call site).
    fn task(
        &mut self,
        t: &Node,
        tp: &str,
        name: &str,
        whose: &str,
        labels: Option<&[&str]>,
        parallel: Option<&[String]>,
    ) {
        if !self.expect_map(t, tp, "a task") {
            return;
        }
        let tname = t.get("name").and_then(Node::as_str).unwrap_or(name);
        let workbook_task = labels.is_none();
        match t.get("kind") {
            None => self.err(Code::E003, t.span, tp, format!("{whose} has no `kind`"), "add `kind: noop` (or python, http, postgres...)"),
            Some(k) => match k.as_str() {
                Some("sink") => self.err(Code::E016, k.span, &format!("{tp}/kind"), "`sink` is not a tool kind in v10".into(), "storage is just a tool (postgres, http...) that writes and returns a reference"),
                Some("workbook") if workbook_task => self.err(Code::E004, k.span, &format!("{tp}/kind"), format!("{whose} has kind `workbook`: a workbook task cannot call another"), "give it the tool kind that does the work, e.g. `kind: python`"),
                Some(s) if !s.is_empty() => self.tool_kind(s, k.span, &format!("{tp}/kind"), whose),
                _ => self.err(Code::E004, k.span, &format!("{tp}/kind"), "`kind` must be a tool kind name".into(), "e.g. `kind: python`"),
            },
        }
        for (k, _) in t.entries() {
            let kp = format!("{tp}/{}", escape(&k.name));
            match k.name.as_str() {
                "eval" => self.err(
                    Code::E011,
                    k.span,
                    &kp,
                    format!("legacy `eval` in {whose}"),
                    "use `spec.policy.rules` (`- when: ... then: {do: ...}`)",
                ),
                "expr" => self.err(
                    Code::E012,
                    k.span,
                    &kp,
                    format!("`expr` in {whose}"),
                    "use `when` inside `spec.policy.rules`",
                ),
                "sink" => self.err(
                    Code::E016,
                    k.span,
                    &kp,
                    format!("`sink` in {whose} is not a special block in v10"),
                    "add a storage tool task that writes and returns a reference",
                ),
                "case" => self.err(
                    Code::E013,
                    k.span,
                    &kp,
                    format!("`case` in {whose}"),
                    "use `spec.policy.rules`",
                ),
                _ => {}
            }
        }
        if let Some(k) = t
            .get("kind")
            .and_then(Node::as_str)
            .and_then(crate::tool::kind)
        {
            self.tool_fields(t, tp, whose, k);
        }
        if let Some(spec) = t.get("spec") {
            if self.expect_map(spec, &format!("{tp}/spec"), "`task.spec`") {
                if let Some(timeout) = spec.get("timeout") {
                    self.task_timeout(timeout, &format!("{tp}/spec/timeout"));
                }
                if let Some(policy) = spec.get("policy") {
                    self.task_policy(
                        policy,
                        &format!("{tp}/spec/policy"),
                        tname,
                        labels,
                        parallel,
                    );
                }
            }
        }
    }

    /// A task's `kind` names a kind this engine runs: one NoETL has that
    /// needs a cloud service is refused saying so (E007), any other
    /// unknown name with the closest known kind (E006). Either would
    /// otherwise wait at run time for an executor that never comes.
    fn tool_kind(&mut self, kind: &str, span: crate::yaml::Span, path: &str, whose: &str) {
        if crate::tool::task_kinds().any(|k| k == kind) {
            return;
        }
        if let Some(u) = crate::tool::unavailable(kind) {
            self.err(
                Code::E007,
                span,
                path,
                format!(
                    "tool kind `{kind}` of {whose} is not available in this engine: it needs {}",
                    u.needs
                ),
                u.instead,
            );
            return;
        }
        let known: Vec<&str> = crate::tool::task_kinds().collect();
        let kinds = allowed_list(&known);
        let help = match kind_suggestion(kind, &known) {
            Some(k) => format!("did you mean `{k}`? tool kinds: {kinds} (docs/tools.md)"),
            None => format!("tool kinds: {kinds} (docs/tools.md)"),
        };
        self.err(
            Code::E006,
            span,
            path,
            format!("unknown tool kind `{kind}` in {whose}"),
            &help,
        );
    }

    /// The fields of a task of the built-in kind `k` (docs/tools.md): none
    /// the tool does not read (E005), each of its type (E004, a template
    /// passes for any type), and the required ones present (E003).
    fn tool_fields(&mut self, t: &Node, tp: &str, whose: &str, k: &crate::tool::Kind) {
        use crate::tool::{fits, TASK_FIELDS};
        let known: Vec<&str> = TASK_FIELDS
            .iter()
            .copied()
            .chain(k.fields.iter().map(|f| f.name))
            .collect();
        for (key, value) in t.entries() {
            let name = key.name.as_str();
            let kp = format!("{tp}/{}", escape(name));
            if name == "auth" && value.is_map() {
                let service = seeds::cloud_auth(&value.to_json());
                let (code, message, help) = match service {
                    Some(service) => (Code::E007, format!("`auth` of {whose} resolves from {service}, which this engine does not reach"), "store the credential with `noetl credential put NAME` and name it: `auth: NAME` (declared in `keychain`)"),
                    None => (Code::E004, format!("`auth` of {whose} must be the name of a keychain entry, found a mapping"), "declare the credential in the root `keychain` and name it: `auth: NAME`"),
                };
                self.err(code, value.span, &kp, message, help);
                continue;
            }
            if let Some(f) = k.fields.iter().find(|f| f.name == name) {
                let v = value.to_json();
                if !v.is_null() && !fits(f.ty, &v) {
                    self.err(
                        Code::E004,
                        value.span,
                        &kp,
                        format!(
                            "`{name}` of {whose} must be {}, found {}",
                            f.ty.describe(),
                            value.type_name()
                        ),
                        &format!("`{name}` of a {} task: {}", k.name, f.about),
                    );
                }
                continue;
            }
            // Task keys of other DSLs are reported above with their own codes.
            if TASK_FIELDS.contains(&name) || LEGACY_TASK_KEYS.contains(&name) {
                continue;
            }
            let fields = allowed_list(&known);
            let help = match (name, closest(name, &known)) {
                _ if crate::migrate::tool_field_hint(k.name, name).is_some() => {
                    let hint = crate::migrate::tool_field_hint(k.name, name).unwrap_or_default();
                    format!("{hint}; fields of a {} task: {fields}", k.name)
                }
                ("input" | "inputs" | "with", _) if known.contains(&"args") => {
                    format!(
                        "a {} task takes its inputs as `args` (`noetl migrate` rewrites `{name}`)",
                        k.name
                    )
                }
                (_, Some(c)) => {
                    format!("did you mean `{c}`? fields of a {} task: {fields}", k.name)
                }
                (_, None) => format!("fields of a {} task: {fields} (docs/tools.md)", k.name),
            };
            self.err(
                Code::E005,
                key.span,
                &kp,
                format!("unknown field `{name}` in {whose} (a {} task)", k.name),
                &help,
            );
        }
        let target = crate::script::script_target(k.name);
        if let Some((sk, script)) = t.entry("script").filter(|_| target.is_some()) {
            self.task_script(script, &format!("{tp}/script"), whose, k.name);
            if let Some(field) = target.filter(|f| t.get(f).is_some()) {
                self.err(
                    Code::E004,
                    sk.span,
                    &format!("{tp}/script"),
                    format!("{whose} has both `{field}` and `script`"),
                    &format!("keep one: `script` loads the `{field}` when the task runs"),
                );
            }
        }
        for f in k.fields.iter().filter(|f| f.required) {
            let by_script = target == Some(f.name) && t.get("script").is_some();
            if t.get(f.name).is_none() && !by_script {
                self.err(
                    Code::E003,
                    t.span,
                    tp,
                    format!("{whose} (a {} task) has no `{}`", k.name, f.name),
                    &format!("add `{}`: {}", f.name, f.about),
                );
            }
        }
    }

    /// A task's `script` (docs/tools.md, "Scripts"): a source this engine
    /// loads (E004), not one in a cloud store (E007).
    fn task_script(&mut self, script: &Node, path: &str, whose: &str, kind: &str) {
        let Err(e) = crate::script::script_kind(&script.to_json()) else {
            return;
        };
        let code = match e {
            crate::script::ScriptError::Cloud { .. } => Code::E007,
            crate::script::ScriptError::Shape(_) => Code::E004,
        };
        self.err(
            code,
            script.span,
            path,
            format!("{e} ({whose}, a {kind} task)"),
            e.hint(),
        );
    }

    // Over 80 lines on purpose: one pass over a task's policy block (rules, `when`, `then` and
    // each action), mirroring its YAML shape so each code's checks sit together.
    fn task_policy(
        &mut self,
        policy: &Node,
        path: &str,
        task: &str,
        labels: Option<&[&str]>,
        parallel: Option<&[String]>,
    ) {
        let rules = match (&policy.kind, policy.get("rules")) {
            (NodeKind::Map(_), Some(r)) if r.is_seq() => r,
            _ => {
                self.err(Code::E020, policy.span, path, format!("`spec.policy` of task `{task}` must be a mapping with a `rules` list"), "write `policy: { rules: [ {when: ..., then: {do: ...}}, {else: {then: {do: continue}}} ] }`");
                return;
            }
        };
        self.on_unmatched(policy, path, task);
        for (i, r) in rules.items().iter().enumerate() {
            let rp = format!("{path}/rules/{i}");
            if !self.expect_map(r, &rp, "a policy rule") {
                continue;
            }
            self.rule_shape(r, &rp, "a policy rule");
            if r.get("when").is_none()
                && r.get("else").is_none()
                && r.get("expr").is_none()
                && r.get("eval").is_none()
            {
                self.err(
                    Code::E003,
                    r.span,
                    &rp,
                    format!("rule {i} of task `{task}` has neither `when` nor `else`"),
                    "add `when: \"{{ ... }}\"`, or make it the `else` rule",
                );
            }
            let Some(then) = r.get("then") else {
                if misshapen_else(r) {
                    continue; // E004 shows the whole form
                }
                self.err(
                    Code::E003,
                    r.span,
                    &rp,
                    format!("rule {i} of task `{task}` has no `then`"),
                    "add `then: { do: continue }`",
                );
                continue;
            };
            let tp = format!("{rp}/then");
            if !self.expect_map(then, &tp, "`then`") {
                continue;
            }
            self.unknown_keys(then, &tp, "`then`", THEN_KEYS);
            let action = then.get("do");
            if let Some(a) = action {
                match a.as_str() {
                    Some(s) if ACTIONS.contains(&s) => {}
                    _ => {
                        let shown = a
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| a.type_name().to_string());
                        let help = match a.as_str().and_then(|s| closest(s, ACTIONS)) {
                            Some(c) => {
                                format!("did you mean `{c}`? actions: {}", allowed_list(ACTIONS))
                            }
                            None => format!("actions: {}", allowed_list(ACTIONS)),
                        };
                        self.err(
                            Code::E025,
                            a.span,
                            &format!("{tp}/do"),
                            format!("unknown action `{shown}` in task `{task}`"),
                            &help,
                        );
                    }
                }
            }
            if action.and_then(Node::as_str) == Some("jump") {
                match then.get("to") {
                    None => self.err(
                        Code::E026,
                        then.span,
                        &tp,
                        format!("`jump` in task `{task}` has no `to`"),
                        "add `to: <task name>` naming a task of this pipeline",
                    ),
                    Some(to) => match (to.as_str(), labels) {
                        (Some(_), None) => {} // workbook task: checked per call site
                        (Some(t), Some(labels)) if labels.contains(&t) => {}
                        (other, labels) => {
                            let labels = labels.unwrap_or_default();
                            let help = match other.and_then(|s| closest(s, labels)) {
                                Some(c) => format!(
                                    "did you mean `{c}`? tasks of this pipeline: {}",
                                    allowed_list(labels)
                                ),
                                None => format!("tasks of this pipeline: {}", allowed_list(labels)),
                            };
                            self.err(
                                Code::E022,
                                to.span,
                                &format!("{tp}/to"),
                                format!(
                                    "jump target `{}` is not a task of this pipeline",
                                    other.unwrap_or("?")
                                ),
                                &help,
                            );
                        }
                    },
                }
            }
            if let Some(att) = then.get("attempts") {
                match att.kind {
                    NodeKind::Int(n) if n >= 1 && n <= i64::from(u32::MAX) => {}
                    _ => self.err(
                        Code::E023,
                        att.span,
                        &format!("{tp}/attempts"),
                        "`attempts` must be an integer >= 1 (total attempts, the first included)"
                            .into(),
                        "e.g. `attempts: 3`",
                    ),
                }
            }
            if let Some(b) = then.get("backoff") {
                if !b.as_str().map(|s| BACKOFFS.contains(&s)).unwrap_or(false) {
                    self.err(
                        Code::E024,
                        b.span,
                        &format!("{tp}/backoff"),
                        format!("`backoff` must be one of {}", allowed_list(BACKOFFS)),
                        "e.g. `backoff: exponential`",
                    );
                }
            }
            for key in ["set_ctx", "set_iter"] {
                if let Some(s) = then.get(key) {
                    if !s.is_map() {
                        self.err(
                            Code::E004,
                            s.span,
                            &format!("{tp}/{key}"),
                            format!("`{key}` must be a mapping, found {}", s.type_name()),
                            "write `{key}: { name: value }`",
                        );
                    }
                }
            }
            if let (Some(reduced), Some(set)) = (parallel, then.get("set_ctx")) {
                for (k, _) in set.entries() {
                    if !reduced.contains(&k.name) {
                        self.warn(Code::W104, k.span, &format!("{tp}/set_ctx/{}", k.name), format!("`set_ctx.{}` in task `{task}` of a parallel loop", k.name), "each ctx key may be written once (a different second write fails the iteration with ctx.conflict); prefer `set_iter`, or declare a reducer in `loop.spec.policy.reducers`");
                    }
                }
            }
        }
    }

    // Over 80 lines on purpose: one pass over a step's `next` block (spec, mode, arcs and
    // their rules), so every diagnostic about it is found in one place.
    fn next(
        &mut self,
        next: &Node,
        path: &str,
        step: &str,
        names: &HashMap<String, usize>,
        is_loop: bool,
    ) {
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
                return;
            }
            NodeKind::Map(_) => {}
            _ => {
                self.expect_map(next, path, "`next`");
                return;
            }
        }
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
        if let Some(spec) = next.get("spec") {
            if self.expect_map(spec, &format!("{path}/spec"), "`next.spec`") {
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
        }
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
        let mut unconditional_seen: Option<usize> = None;
        let mut tests_loop_done = false;
        let mut ordered: Vec<(&str, usize)> = names.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        ordered.sort_by_key(|(_, i)| *i);
        let step_names: Vec<&str> = ordered.into_iter().map(|(k, _)| k).collect();
        for (i, a) in arcs.items().iter().enumerate() {
            let ap = format!("{path}/arcs/{i}");
            if !self.expect_map(a, &ap, "an arc") {
                continue;
            }
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
                &ap,
                "an arc",
                ARC_KEYS,
            );
            self.when_is_string(a, &ap);
            if let Some(target) = self.required_str(a, "step", &ap, "an arc") {
                if !names.contains_key(&target) {
                    let help = match closest(&target, &step_names) {
                        Some(c) => format!("did you mean `{c}`?"),
                        None => format!("steps: {}", allowed_list(&step_names)),
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
        if is_loop && !arcs.items().is_empty() && !tests_loop_done {
            self.warn(Code::W105, arcs.span, &format!("{path}/arcs"), format!("loop step `{step}` has arcs but none tests `loop.done`"), "a loop's boundary event is `loop.done` (or `step.failed`): guard arcs with `event.name == 'loop.done'`");
        }
    }

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
    fn workbook_calls(&mut self, root: &Node) {
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

    /// Every string with `{{`, `{%` or `{#` must parse (a python task's own
    /// `code` excepted: it is not rendered, see `is_raw_field`).
    fn templates(&mut self, root: &Node) {
        let mut bad = Vec::new();
        collect_templates(root, "", &mut |path, node, s| {
            if let Err(e) = crate::template::check_syntax(s) {
                let msg = match e {
                    crate::template::TemplateError::Syntax { message, .. } => message,
                    other => other.to_string(),
                };
                bad.push((node.span, path.to_string(), msg));
            }
        });
        for (span, path, msg) in bad {
            let one_line: String = msg.lines().next().unwrap_or("").to_string();
            self.err(
                Code::E036,
                span,
                &path,
                format!("template does not parse: {one_line}"),
                "check the `{{ }}` / `{% %}` / `{# #}` syntax (Jinja)",
            );
        }
        self.unknown_roots(root);
    }

    /// W106: a template reads a top-level name that is neither a runtime
    /// variable nor the name of a step, nor, inside a step's pipeline, of
    /// one of its tasks (`{{ api_url }}` for `{{ workload.api_url }}`). At
    /// run time a value template fails on it and a condition reads it as
    /// undefined (false), so say so now. W108: a task reads the result of
    /// a task that cannot have run before it (docs/dsl.md "Runtime
    /// variables").
    fn unknown_roots(&mut self, root: &Node) {
        let mut known: BTreeSet<String> = RUNTIME_VARIABLES.iter().map(|v| v.to_string()).collect();
        let steps: &[Node] = root.get("workflow").map(Node::items).unwrap_or_default();
        known.extend(
            steps
                .iter()
                .filter_map(|s| s.get("step").and_then(Node::as_str))
                .map(str::to_string),
        );
        let pipelines: Vec<Pipeline> = steps.iter().map(Pipeline::of).collect();
        // A workbook task runs inside whichever pipeline calls it.
        let mut everywhere = known.clone();
        crate::names::collect_names(root, &mut everywhere);
        let mut unknown = Vec::new();
        collect_templates(root, "", &mut |path, node, s| {
            for name in crate::template::referenced_roots(s) {
                let at = pipeline_position(path);
                if let Some((si, ti, in_policy)) = at {
                    if let Some(p) = pipelines.get(si) {
                        if let Some(k) = p.tasks.iter().position(|t| *t == name) {
                            // Itself in its own policy: the outcome just
                            // produced; an earlier task, or any task when a
                            // jump may run it first: a result that may be set.
                            if !(k < ti || (k == ti && in_policy) || p.jumps) {
                                unknown.push((node.span, path.to_string(), name, Some(ti)));
                            }
                            continue;
                        }
                    }
                }
                let seen = if path.starts_with("/workbook") {
                    &everywhere
                } else {
                    &known
                };
                if !seen.contains(&name) && !cursor::binds(path, &name) {
                    unknown.push((node.span, path.to_string(), name, None));
                }
            }
        });
        let options: Vec<&str> = known.iter().map(String::as_str).collect();
        let workload: BTreeSet<&str> = root
            .get("workload")
            .map(|w| w.entries().iter().map(|(k, _)| k.name.as_str()).collect())
            .unwrap_or_default();
        for (span, path, name, reader) in unknown {
            if let Some(ti) = reader {
                let (si, _, _) = pipeline_position(&path).unwrap_or_default();
                let p = &pipelines[si];
                let reader = p.tasks.get(ti).map(String::as_str).unwrap_or("?");
                let what = if reader == name {
                    "its own result"
                } else {
                    "the result of a later task"
                };
                self.warn(
                    Code::W108,
                    span,
                    &path,
                    format!("task `{reader}` of step `{}` reads `{name}`, {what}: no task of the pipeline jumps, so it has not run yet and is undefined (null)", p.step),
                    "read an earlier task of the pipeline by name, `_prev` for the previous one, or `outcome.result` in the task's own policy",
                );
                continue;
            }
            if workload.contains(name.as_str()) {
                // It resolves (workload keys are readable bare, lowest
                // precedence), but the canonical spelling says where from.
                self.warn(
                    Code::W107,
                    span,
                    &path,
                    format!("template reads the workload value `{name}` bare"),
                    &format!("write `workload.{name}`: a step, task or runtime variable of that name would shadow it (`noetl migrate` rewrites it)"),
                );
                continue;
            }
            let owner = pipelines.iter().find(|p| p.tasks.contains(&name));
            let help = match (owner, closest(&name, &options)) {
                (Some(p), _) => format!("`{name}` is a task of step `{}`: a task's result is read by name only inside its own pipeline; elsewhere read the step's result (`{}`)", p.step, p.step),
                (None, Some(c)) => format!("did you mean `{c}`? runtime variables: {}; or a step name", allowed_list(RUNTIME_VARIABLES)),
                (None, None) => format!("runtime variables: {}; or a step name (e.g. `workload.{name}` for a workload value)", allowed_list(RUNTIME_VARIABLES)),
            };
            self.warn(
                Code::W106,
                span,
                &path,
                format!("template reads `{name}`, which is not a runtime variable, step or task"),
                &help,
            );
        }
    }
}

/// One step's pipeline as the name checks see it.
struct Pipeline {
    step: String,
    /// Task names, in pipeline order.
    tasks: Vec<String>,
    /// Some task policy of the pipeline jumps (a task may then run again,
    /// or after a later one).
    jumps: bool,
}

impl Pipeline {
    fn of(step: &Node) -> Self {
        let tasks: &[Node] = step.get("tool").map(Node::items).unwrap_or_default();
        let jumps = tasks.iter().any(|t| {
            t.pointer("/spec/policy/rules")
                .map(Node::items)
                .unwrap_or_default()
                .iter()
                .any(|r| r.pointer("/then/do").and_then(Node::as_str) == Some("jump"))
        });
        Self {
            step: step
                .get("step")
                .and_then(Node::as_str)
                .unwrap_or("?")
                .to_string(),
            tasks: tasks
                .iter()
                .map(|t| {
                    t.get("name")
                        .and_then(Node::as_str)
                        .unwrap_or("")
                        .to_string()
                })
                .collect(),
            jumps,
        }
    }
}

/// `(step index, task index, inside the task's spec.policy)` of a JSON
/// pointer inside a pipeline task (`/workflow/<i>/tool/<j>/...`).
fn pipeline_position(path: &str) -> Option<(usize, usize, bool)> {
    let mut parts = path.strip_prefix("/workflow/")?.split('/');
    let si = parts.next()?.parse().ok()?;
    if parts.next()? != "tool" {
        return None;
    }
    let ti = parts.next()?.parse().ok()?;
    let in_policy = parts.next() == Some("spec") && parts.next() == Some("policy");
    Some((si, ti, in_policy))
}

/// True when `key` of the mapping `n` is a raw field of the task `n` is
/// ([`crate::tool::KINDS`]: python `code`, an inline child `playbook`):
/// its text is passed on unrendered, so braces in it are not templates of
/// this playbook. Every other string with `{{`, `{%` or `{#` is.
fn is_raw_field(n: &Node, key: &str) -> bool {
    let Some(kind) = n.get("kind").and_then(Node::as_str) else {
        return false;
    };
    crate::tool::raw_fields(kind).contains(&key)
}

fn collect_templates<'a>(n: &'a Node, path: &str, f: &mut dyn FnMut(&str, &'a Node, &str)) {
    match &n.kind {
        NodeKind::Str(s) if crate::template::is_template(s) => f(path, n, s),
        NodeKind::Seq(items) => {
            for (i, x) in items.iter().enumerate() {
                collect_templates(x, &format!("{path}/{i}"), f);
            }
        }
        NodeKind::Map(entries) => {
            for (k, v) in entries {
                if is_raw_field(n, &k.name) {
                    continue;
                }
                collect_templates(v, &format!("{path}/{}", escape(&k.name)), f);
            }
        }
        _ => {}
    }
}
