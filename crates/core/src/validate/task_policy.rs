//! A task's `spec.policy`: its rules, each rule's `then` and the settings
//! of its action, one method per family of checks.

use super::rules::misshapen_else;
use super::{allowed_list, closest, Validator, ACTIONS};
use crate::codes::Code;
use crate::yaml::{Node, NodeKind};

const THEN_KEYS: &[&str] = &[
    "do", "attempts", "backoff", "delay", "to", "set_iter", "set_ctx",
];
const BACKOFFS: &[&str] = &["none", "linear", "exponential"];

/// The task a policy belongs to, as its checks see it.
pub(super) struct PolicyScope<'a> {
    /// The task's name, for messages.
    pub(super) task: &'a str,
    /// The task's tool kind, if written.
    pub(super) kind: Option<&'a str>,
    /// The tasks a `jump` may target: `None` for a workbook task, whose
    /// targets are checked at each call site.
    pub(super) labels: Option<&'a [&'a str]>,
    /// `Some(reduced ctx keys)` inside a parallel loop.
    pub(super) parallel: Option<&'a [String]>,
}

impl Validator {
    /// A task's `spec.policy`: a mapping with a `rules` list (E020), its
    /// `on_unmatched`, and each rule.
    pub(super) fn task_policy(&mut self, policy: &Node, path: &str, scope: &PolicyScope) {
        let task = scope.task;
        let rules = match (&policy.kind, policy.get("rules")) {
            (NodeKind::Map(_), Some(r)) if r.is_seq() => r,
            _ => {
                self.err(Code::E020, policy.span, path, format!("`spec.policy` of task `{task}` must be a mapping with a `rules` list"), "write `policy: { rules: [ {when: ..., then: {do: ...}}, {else: {then: {do: continue}}} ] }`");
                return;
            }
        };
        self.on_unmatched(policy, path, task);
        for (i, r) in rules.items().iter().enumerate() {
            self.policy_rule(r, i, &format!("{path}/rules/{i}"), scope);
        }
        if let Some(i) = else_goes_on_over_errors(rules.items(), scope.kind) {
            let r = &rules.items()[i];
            self.warn(
                Code::W109,
                r.span,
                &format!("{path}/rules/{i}"),
                format!("the `else` rule of task `{task}` goes on whatever the outcome, and no rule reads `outcome.status`: an error of the task is swallowed (the step is `done`, its `set_ctx` values null)"),
                "add `- when: \"{{ outcome.status == 'error' }}\"` with `then: { do: fail }` before it; to go on after errors on purpose, say so with the same rule and `then: { do: continue }`",
            );
        }
    }

    /// Rule `i` of a task policy: the rule shape, a `when` or an `else`
    /// (E003), and a `then` (E003) that is a valid mapping.
    fn policy_rule(&mut self, r: &Node, i: usize, rp: &str, scope: &PolicyScope) {
        let task = scope.task;
        if !self.expect_map(r, rp, "a policy rule") {
            return;
        }
        self.rule_shape(r, rp, "a policy rule");
        if r.get("when").is_none()
            && r.get("else").is_none()
            && r.get("expr").is_none()
            && r.get("eval").is_none()
        {
            self.err(
                Code::E003,
                r.span,
                rp,
                format!("rule {i} of task `{task}` has neither `when` nor `else`"),
                "add `when: \"{{ ... }}\"`, or make it the `else` rule",
            );
        }
        let Some(then) = r.get("then") else {
            if misshapen_else(r) {
                return; // E004 shows the whole form
            }
            self.err(
                Code::E003,
                r.span,
                rp,
                format!("rule {i} of task `{task}` has no `then`"),
                "add `then: { do: continue }`",
            );
            return;
        };
        let tp = format!("{rp}/then");
        if !self.expect_map(then, &tp, "`then`") {
            return;
        }
        self.policy_then(then, &tp, scope);
    }

    /// A rule's `then`: its keys, its action and the action's settings.
    fn policy_then(&mut self, then: &Node, tp: &str, scope: &PolicyScope) {
        self.unknown_keys(then, tp, "`then`", THEN_KEYS);
        let action = then.get("do");
        if let Some(a) = action {
            self.action(a, tp, scope.task);
        }
        if action.and_then(Node::as_str) == Some("jump") {
            self.jump(then, tp, scope);
        }
        self.attempts_and_backoff(then, tp);
        self.state_writes(then, tp);
        if let (Some(reduced), Some(set)) = (scope.parallel, then.get("set_ctx")) {
            self.parallel_ctx_writes(set, tp, scope.task, reduced);
        }
    }

    /// `then.do`: one of the actions (E025).
    fn action(&mut self, a: &Node, tp: &str, task: &str) {
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

    /// `do: jump`: a `to` (E026) naming a task of the pipeline (E022).
    fn jump(&mut self, then: &Node, tp: &str, scope: &PolicyScope) {
        let task = scope.task;
        match then.get("to") {
            None => self.err(
                Code::E026,
                then.span,
                tp,
                format!("`jump` in task `{task}` has no `to`"),
                "add `to: <task name>` naming a task of this pipeline",
            ),
            Some(to) => match (to.as_str(), scope.labels) {
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

    /// `then.attempts`: an integer >= 1 (E023); `then.backoff`: one of the
    /// backoffs (E024).
    fn attempts_and_backoff(&mut self, then: &Node, tp: &str) {
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
    }

    /// `then.set_ctx` and `then.set_iter`: mappings (E004).
    fn state_writes(&mut self, then: &Node, tp: &str) {
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
    }

    /// W104: `set_ctx` of a key no reducer aggregates, in a task of a
    /// parallel loop (`reduced`: the keys its reducers aggregate).
    fn parallel_ctx_writes(&mut self, set: &Node, tp: &str, task: &str, reduced: &[String]) {
        for (k, _) in set.entries() {
            if !reduced.contains(&k.name) {
                self.warn(Code::W104, k.span, &format!("{tp}/set_ctx/{}", k.name), format!("`set_ctx.{}` in task `{task}` of a parallel loop", k.name), "each ctx key may be written once (a different second write fails the iteration with ctx.conflict); prefer `set_iter`, or declare a reducer in `loop.spec.policy.reducers`");
            }
        }
    }
}

/// W109: the index of an `else` rule that goes on (`continue`, `jump`,
/// `break`, or no `do`) when no rule's `when` reads `outcome.status` or
/// `outcome.error`: an error outcome then falls to it and is swallowed.
/// A `noop` task never errs. Writing the error case as its own rule (even
/// `then: { do: continue }`) says the catch-all is meant.
pub(super) fn else_goes_on_over_errors(rules: &[Node], kind: Option<&str>) -> Option<usize> {
    if kind == Some("noop") {
        return None;
    }
    if reads_outcome_status(rules) {
        return None;
    }
    rules.iter().position(|r| {
        if r.get("else").is_none() {
            return false;
        }
        let then = r
            .get("then")
            .or_else(|| r.get("else").and_then(|e| e.get("then")));
        let action = then.and_then(|t| t.get("do")).and_then(Node::as_str);
        !matches!(action, Some("fail" | "retry"))
    })
}

/// Whether some rule's `when` reads the outcome's status
/// ([`crate::outcome::reads_status`]).
fn reads_outcome_status(rules: &[Node]) -> bool {
    rules.iter().any(|r| {
        r.get("when")
            .and_then(Node::as_str)
            .is_some_and(crate::outcome::reads_status)
    })
}
