//! The rule shape admission rules and task policy rules share:
//! `{when, else, then}`, a string `when`, and the one form of `else`.

use super::{allowed_list, flow, Validator};
use crate::codes::Code;
use crate::yaml::{escape, Node, NodeKind};

const RULE_KEYS: &[&str] = &["when", "else", "then"];

/// An `else` that normalisation left as written: not a rule (E004).
pub(super) fn misshapen_else(rule: &Node) -> bool {
    rule.get("else")
        .is_some_and(|e| !matches!(e.kind, NodeKind::Bool(true)))
}

impl Validator {
    /// Closed rule shape `{when, else, then}` (legacy `expr`/`eval` named as
    /// such) and a string `when`.
    pub(super) fn rule_shape(&mut self, r: &Node, path: &str, what: &str) {
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

    /// `when` must be a template string (booleans were normalised already),
    /// and compile as the engine evaluates it ([`Self::condition`]).
    pub(super) fn when_is_string(&mut self, n: &Node, path: &str) {
        if let Some(w) = n.get("when") {
            match w.as_str() {
                Some(cond) => self.condition(w, &format!("{path}/when"), cond),
                None => self.err(
                    Code::E004,
                    w.span,
                    &format!("{path}/when"),
                    format!("`when` must be a template string, found {}", w.type_name()),
                    "write `when: \"{{ ... }}\"`",
                ),
            }
        }
    }

    /// A `when` as the engine evaluates it: a bare expression
    /// (`outcome.status == 'error'`) must parse (E036) and apply only
    /// filters and tests the engine has (E049); a template is checked with
    /// every other template. A condition of several `{{ }}` joined by text
    /// renders as that text, true unless it is empty or a false word (W113).
    fn condition(&mut self, w: &Node, path: &str, cond: &str) {
        if crate::template::is_template(cond) {
            if renders_as_text(cond) {
                self.warn(
                    Code::W113,
                    w.span,
                    path,
                    format!(
                        "condition {cond:?} renders as text (`true and false`, say), \
                         which is true unless empty or a false word"
                    ),
                    "write one expression: `{{ a and b }}`",
                );
            }
            return;
        }
        match crate::template::check_condition(cond) {
            Err(e) => {
                let message = match e {
                    crate::template::TemplateError::Syntax { message, .. } => message,
                    other => other.to_string(),
                };
                let one_line = message.lines().next().unwrap_or("").to_string();
                self.err(
                    Code::E036,
                    w.span,
                    path,
                    format!("condition {cond:?} does not parse: {one_line}"),
                    "a `when` is one expression (`outcome.status == 'error'`, or \
                     `{{ outcome.status == 'error' }}`): Jinja operators are `and`, `or`, \
                     `not`, `==`",
                );
            }
            Ok(names) => self.unknown_filters(w, path, &names),
        }
    }
}

/// Whether condition template `cond` is evaluated as rendered text made of
/// two or more `{{ }}` outputs (and no `{% %}` logic): `{{ a }} and {{ b }}`
/// renders as `false and false`, which is true.
fn renders_as_text(cond: &str) -> bool {
    cond.matches("{{").count() >= 2 && !cond.contains("{%")
}
