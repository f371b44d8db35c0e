//! Concurrency and rate limits by key (docs/dsl.md, "Concurrency and rate
//! limits"): `executor.spec.policy.concurrency` for whole executions,
//! `step.spec.policy.concurrency` and `step.spec.policy.rate` for a step's
//! task calls. Each is a mapping of known fields with values of their
//! type; anything else is refused naming the field.

use super::{allowed_list, Validator};
use crate::codes::Code;
use crate::yaml::Node;

/// `on_limit` values of an execution's concurrency.
pub const ON_LIMIT: &[&str] = &["queue", "reject", "cancel-oldest"];

/// Fields of `executor.spec.policy.concurrency`.
const EXECUTION_FIELDS: &[&str] = &["key", "limit", "on_limit"];
/// Fields of `step.spec.policy.concurrency`.
const STEP_FIELDS: &[&str] = &["key", "limit"];
/// Fields of `step.spec.policy.rate`.
const RATE_FIELDS: &[&str] = &["key", "per_second", "burst"];

/// Which concurrency a node is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    /// `executor.spec.policy.concurrency`.
    Execution,
    /// `step.spec.policy.concurrency`.
    Step,
}

impl Validator {
    /// A `concurrency` mapping: `key` a string, `limit` an integer >= 1,
    /// and (executions) `on_limit` one of [`ON_LIMIT`].
    pub(super) fn concurrency(&mut self, n: &Node, path: &str, level: Level) {
        let (name, fields) = match level {
            Level::Execution => ("executor.spec.policy.concurrency", EXECUTION_FIELDS),
            Level::Step => ("spec.policy.concurrency", STEP_FIELDS),
        };
        let what = &format!("`{name}`");
        if !self.expect_map(n, path, what) {
            return;
        }
        if level == Level::Step && n.get("on_limit").is_some() {
            let k = n.entries().iter().find(|(k, _)| k.name == "on_limit");
            let span = k.map(|(k, _)| k.span).unwrap_or(n.span);
            self.err(
                Code::E005,
                span,
                &format!("{path}/on_limit"),
                format!("unknown field `on_limit` in {what}"),
                "a step's task calls always wait for a free slot; `on_limit` belongs to `executor.spec.policy.concurrency` (whole executions)",
            );
        } else {
            self.unknown_keys(n, path, what, fields);
        }
        self.gate_key(n, path, name);
        match n.get("limit") {
            None => self.err(
                Code::E003,
                n.span,
                path,
                format!("{what} has no `limit`"),
                "add `limit: N` (how many at once per key, >= 1)",
            ),
            Some(l) => self.at_least_one(l, &format!("{path}/limit"), &format!("`{name}.limit`")),
        }
        if let Some(v) = n.get("on_limit").filter(|_| level == Level::Execution) {
            if !v.as_str().is_some_and(|s| ON_LIMIT.contains(&s)) {
                self.err(
                    Code::E004,
                    v.span,
                    &format!("{path}/on_limit"),
                    format!(
                        "`{name}.on_limit` must be one of {}, found {}",
                        allowed_list(ON_LIMIT),
                        shown(v)
                    ),
                    "`queue` (the default) waits in line, `reject` fails the new execution, `cancel-oldest` cancels the oldest running one",
                );
            }
        }
    }

    /// A `rate` mapping: `key` a string, `per_second` a number > 0,
    /// `burst` an integer >= 1.
    pub(super) fn rate(&mut self, n: &Node, path: &str) {
        let (name, what) = ("spec.policy.rate", "`spec.policy.rate`");
        if !self.expect_map(n, path, what) {
            return;
        }
        self.unknown_keys(n, path, what, RATE_FIELDS);
        self.gate_key(n, path, name);
        match n.get("per_second") {
            None => self.err(
                Code::E003,
                n.span,
                path,
                format!("{what} has no `per_second`"),
                "add `per_second: N` (task calls started per second, > 0)",
            ),
            Some(v) => {
                if !v
                    .to_json()
                    .as_f64()
                    .is_some_and(|x| x > 0.0 && x.is_finite())
                {
                    self.err(
                        Code::E004,
                        v.span,
                        &format!("{path}/per_second"),
                        format!(
                            "`{name}.per_second` must be a number > 0, found {}",
                            shown(v)
                        ),
                        "e.g. `per_second: 20` or `per_second: 0.5` (one call every 2 s)",
                    );
                }
            }
        }
        if let Some(b) = n.get("burst") {
            self.at_least_one(b, &format!("{path}/burst"), &format!("`{name}.burst`"));
        }
    }

    /// `key`, when present, is a string (a template or plain text).
    fn gate_key(&mut self, n: &Node, path: &str, name: &str) {
        let Some(k) = n.get("key") else {
            return;
        };
        if k.as_str().is_none() {
            self.err(
                Code::E004,
                k.span,
                &format!("{path}/key"),
                format!("`{name}.key` must be a string, found {}", k.type_name()),
                "e.g. `key: \"{{ workload.customer }}\"`; leave it out for one key per step (or playbook)",
            );
        }
    }

    /// An integer >= 1.
    fn at_least_one(&mut self, v: &Node, path: &str, what: &str) {
        if !matches!(v.to_json().as_u64(), Some(x) if x >= 1 && x <= u64::from(u32::MAX)) {
            self.err(
                Code::E004,
                v.span,
                path,
                format!("{what} must be an integer >= 1, found {}", shown(v)),
                "e.g. `limit: 2`",
            );
        }
    }
}

/// A scalar as written, else its type.
fn shown(v: &Node) -> String {
    match v.to_json() {
        serde_json::Value::String(s) => format!("`{s}`"),
        j @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => format!("`{j}`"),
        _ => v.type_name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use crate::diagnostic::Diagnostics;

    fn check(executor: &str, policy: &str) -> Diagnostics {
        let src = format!(
            "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{name: g}}\n{executor}workflow:\n  - step: start\n    spec:\n      policy: {policy}\n    tool: [{{name: t, kind: noop}}]\n"
        );
        match crate::load::load_playbook(&src, "g.yaml") {
            Ok(_) => Diagnostics::default(),
            Err(e) => e.diagnostics,
        }
    }

    fn errors(d: &Diagnostics) -> Vec<(String, String)> {
        d.errors()
            .map(|x| (x.path.clone(), x.message.clone()))
            .collect()
    }

    #[test]
    fn good_shapes_load_and_reach_the_model() {
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: g, path: t/g}\nexecutor:\n  spec:\n    policy:\n      concurrency: {key: \"{{ workload.customer }}\", limit: 2, on_limit: cancel-oldest}\nworkflow:\n  - step: start\n    spec:\n      policy:\n        concurrency: {limit: 4}\n        rate: {key: api, per_second: 0.5}\n    tool: [{name: t, kind: noop}]\n";
        let p = crate::load::load_playbook(src, "g.yaml")
            .expect("loads")
            .playbook;
        let c = p.executor.as_ref().unwrap().concurrency().expect("typed");
        assert_eq!(c.limit, 2);
        assert_eq!(c.on_limit, crate::model::OnLimit::CancelOldest);
        let policy = p.workflow[0].spec.policy.as_ref().unwrap();
        assert_eq!(policy.concurrency.as_ref().unwrap().limit, 4);
        let rate = policy.rate.as_ref().unwrap();
        assert_eq!((rate.per_second, rate.burst), (0.5, 1));
        assert!(policy.extra.is_empty(), "{:?}", policy.extra);
    }

    #[test]
    fn bad_shapes_are_refused_naming_the_field() {
        let cases = [
            (
                "",
                "{concurrency: {limit: 0}}",
                "/workflow/0/spec/policy/concurrency/limit",
                "must be an integer >= 1",
            ),
            (
                "",
                "{concurrency: {limit: 2.5}}",
                "/workflow/0/spec/policy/concurrency/limit",
                "must be an integer >= 1",
            ),
            (
                "",
                "{concurrency: {key: 3, limit: 1}}",
                "/workflow/0/spec/policy/concurrency/key",
                "must be a string",
            ),
            (
                "",
                "{concurrency: {key: a}}",
                "/workflow/0/spec/policy/concurrency",
                "has no `limit`",
            ),
            (
                "",
                "{concurrency: {limit: 1, on_limit: queue}}",
                "/workflow/0/spec/policy/concurrency/on_limit",
                "unknown field `on_limit`",
            ),
            (
                "",
                "{concurrency: {limit: 1, size: 3}}",
                "/workflow/0/spec/policy/concurrency/size",
                "unknown field `size`",
            ),
            (
                "",
                "{concurrency: 3}",
                "/workflow/0/spec/policy/concurrency",
                "must be a mapping",
            ),
            (
                "",
                "{rate: {per_second: 0}}",
                "/workflow/0/spec/policy/rate/per_second",
                "must be a number > 0",
            ),
            (
                "",
                "{rate: {per_second: fast}}",
                "/workflow/0/spec/policy/rate/per_second",
                "must be a number > 0",
            ),
            (
                "",
                "{rate: {per_second: 5, burst: 0}}",
                "/workflow/0/spec/policy/rate/burst",
                "must be an integer >= 1",
            ),
            (
                "",
                "{rate: {burst: 2}}",
                "/workflow/0/spec/policy/rate",
                "has no `per_second`",
            ),
            (
                "",
                "{rate: {per_second: 1, every: 2}}",
                "/workflow/0/spec/policy/rate/every",
                "unknown field `every`",
            ),
            (
                "executor: {spec: {policy: {concurrency: {limit: 2, on_limit: drop}}}}\n",
                "{}",
                "/executor/spec/policy/concurrency/on_limit",
                "must be one of `queue`, `reject`, `cancel-oldest`",
            ),
            (
                "executor: {spec: {policy: {concurrency: {limit: -1}}}}\n",
                "{}",
                "/executor/spec/policy/concurrency/limit",
                "must be an integer >= 1",
            ),
            (
                "executor: {spec: {policy: {concurrency: {limit: 1, queue: 3}}}}\n",
                "{}",
                "/executor/spec/policy/concurrency/queue",
                "unknown field `queue`",
            ),
        ];
        for (executor, policy, path, says) in cases {
            let d = check(executor, policy);
            let errs = errors(&d);
            assert!(
                errs.iter().any(|(p, m)| p == path && m.contains(says)),
                "{executor}{policy}: want {path} {says:?}, got {errs:#?}"
            );
            assert!(
                d.iter().all(|x| x.span.is_some_and(|s| s.line > 0)),
                "{d:?}"
            );
        }
    }
}
