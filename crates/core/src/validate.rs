//! Validation of a normalised playbook tree. Every rule reports with the
//! position of the offending node, a one-line reason and a help line; all
//! findings are returned at once. Codes are documented in `docs/errors.md`.
//!
//! One module per part of the document: `root` (the top level and the
//! workflow), `step` (a step's keys, spec, admission and loop), `task` (a
//! pipeline's tasks and their tool fields), `task_policy`, `next` (routing),
//! `workbook`, `templates` (template syntax and the names templates read),
//! `rules` (the rule shape admission and task policy share), `cursor` and
//! `seeds`. The checks all report through `Validator`, defined here with
//! the helpers they share.

use crate::codes::Code;

use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::limits::{MAX_ARCS, MAX_STEPS};
use crate::yaml::{escape, Node, NodeKind};

mod cursor;
mod fields;
mod gates;
mod http;
mod keychain;
mod loop_reads;
mod next;
mod root;
mod rules;
mod seeds;
mod step;
mod task;
mod task_policy;
mod templates;
mod workbook;

pub use gates::ON_LIMIT;
pub use keychain::credential_fields;
pub use seeds::{CREDENTIAL_KINDS, ON_UNMATCHED, SECRET_PROVIDERS_REACHED, SERVICE_KEYCHAIN_KINDS};

/// The control actions of a task policy rule (`then.do`).
const ACTIONS: &[&str] = &["continue", "retry", "jump", "break", "fail"];

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
}
