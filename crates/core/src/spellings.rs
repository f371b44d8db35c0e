//! The seed documents' spellings of settings the engine reads one level up
//! (docs/dsl.md, "Loops" and "Document"), normalised on the positioned
//! tree so diagnostics keep their line and column:
//!
//! - `loop.spec.policy.mode` / `loop.spec.policy.max_in_flight` →
//!   `loop.spec.mode` / `loop.spec.max_in_flight`;
//! - `executor.spec.policy.limits.<limit>` → `executor.spec.limits.<limit>`;
//! - `executor.spec.policy.defaults.timeouts` (or `timeout_s`) → `executor.spec.timeout`
//!   (the outermost layer of every task's `spec.timeout`).
//!
//! A setting written both ways with different values is refused (E004) at
//! the seed spelling; the same value twice is accepted. Normalising twice
//! changes nothing: a moved value is gone from where it was written, and a
//! conflicting pair is left as written.

use crate::codes::Code;
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::yaml::{escape, Key, Node, NodeKind};

/// One setting to move: `spec/<from...>/<key>` → `spec/<to...>/<to_key>`.
struct Lift<'a> {
    from: &'a [&'a str],
    key: &'a str,
    to: &'a [&'a str],
    to_key: &'a str,
}

/// What the diagnostics call a spec and where it is.
struct At<'a> {
    /// `loop.spec`, `executor.spec`.
    name: &'a str,
    /// The spec's JSON pointer.
    path: &'a str,
}

fn map_mut(n: &mut Node) -> Option<&mut Vec<(Key, Node)>> {
    match &mut n.kind {
        NodeKind::Map(e) => Some(e),
        _ => None,
    }
}

fn get_mut<'a>(n: &'a mut Node, name: &str) -> Option<&'a mut Node> {
    map_mut(n)?
        .iter_mut()
        .find(|(k, _)| k.name == name)
        .map(|(_, v)| v)
}

fn walk<'a>(n: &'a Node, path: &[&str]) -> Option<&'a Node> {
    path.iter().try_fold(n, |n, k| n.get(k))
}

fn walk_mut<'a>(mut n: &'a mut Node, path: &[&str]) -> Option<&'a mut Node> {
    for k in path {
        n = get_mut(n, k)?;
    }
    Some(n)
}

fn dotted(name: &str, path: &[&str], key: &str) -> String {
    let mut parts = vec![name];
    parts.extend_from_slice(path);
    parts.push(key);
    parts.join(".")
}

/// Move one setting (see the module docs); an error when both spellings
/// are written with different values.
fn lift(spec: &mut Node, at: &At<'_>, l: &Lift<'_>, diags: &mut Diagnostics) {
    let Some((key, value)) = walk(spec, l.from)
        .filter(|n| n.is_map())
        .and_then(|n| n.entry(l.key))
        .map(|(k, v)| (k.clone(), v.clone()))
    else {
        return;
    };
    // The destination's parent must be a mapping (or absent): anything
    // else is left for the validator to report.
    let mut parent = spec.clone();
    for (i, k) in l.to.iter().enumerate() {
        match parent.get(k).cloned() {
            Some(n) if n.is_map() => parent = n,
            Some(_) => return,
            None => {
                let prefix = &l.to[..i];
                let holder = walk_mut(spec, prefix).and_then(map_mut);
                if let Some(e) = holder {
                    e.push((
                        Key {
                            name: k.to_string(),
                            span: key.span,
                        },
                        Node {
                            kind: NodeKind::Map(Vec::new()),
                            span: key.span,
                        },
                    ));
                }
                parent = Node {
                    kind: NodeKind::Map(Vec::new()),
                    span: key.span,
                };
            }
        }
    }
    if let Some(existing) = parent.get(l.to_key) {
        if existing.to_json() != value.to_json() {
            let seed = dotted(at.name, l.from, l.key);
            let plain = dotted(at.name, l.to, l.to_key);
            let pointer: String = l
                .from
                .iter()
                .chain(std::iter::once(&l.key))
                .map(|k| format!("/{}", escape(k)))
                .collect();
            diags.push(
                Diagnostic::error(
                    Code::E004,
                    key.span,
                    &format!("{}{pointer}", at.path),
                    format!(
                        "`{seed}: {}` and `{plain}: {}` disagree (line {})",
                        value.to_json(),
                        existing.to_json(),
                        existing.span.line
                    ),
                )
                .help(format!(
                    "`{seed}` and `{plain}` are the same setting: write it once"
                )),
            );
            return;
        }
    }
    if let Some(e) = walk_mut(spec, l.from).and_then(map_mut) {
        e.retain(|(k, _)| k.name != l.key);
    }
    if let Some(e) = walk_mut(spec, l.to).and_then(map_mut) {
        if !e.iter().any(|(k, _)| k.name == l.to_key) {
            e.push((
                Key {
                    name: l.to_key.to_string(),
                    span: key.span,
                },
                value,
            ));
        }
    }
}

/// `loop.spec.policy.mode` / `max_in_flight` → `loop.spec.mode` /
/// `max_in_flight` (`path`: the loop's JSON pointer).
pub(crate) fn loop_spec(loop_: &mut Node, path: &str, diags: &mut Diagnostics) {
    let Some(spec) = get_mut(loop_, "spec") else {
        return;
    };
    let at = At {
        name: "loop.spec",
        path: &format!("{path}/spec"),
    };
    for key in ["mode", "max_in_flight"] {
        let l = Lift {
            from: &["policy"],
            key,
            to: &[],
            to_key: key,
        };
        lift(spec, &at, &l, diags);
    }
}

/// `executor.spec.policy.limits.*` → `executor.spec.limits.*`;
/// `executor.spec.policy.defaults.timeouts` (or NoETL's `timeout_s`) →
/// `executor.spec.timeout`.
pub(crate) fn executor_spec(root: &mut Node, diags: &mut Diagnostics) {
    let Some(spec) = get_mut(root, "executor").and_then(|e| get_mut(e, "spec")) else {
        return;
    };
    let at = At {
        name: "executor.spec",
        path: "/executor/spec",
    };
    let limits: Vec<String> = walk(spec, &["policy", "limits"])
        .map(|l| l.entries().iter().map(|(k, _)| k.name.clone()).collect())
        .unwrap_or_default();
    for key in &limits {
        let l = Lift {
            from: &["policy", "limits"],
            key,
            to: &["limits"],
            to_key: key,
        };
        lift(spec, &at, &l, diags);
    }
    // `timeout_s` is NoETL's name of the same default (seconds).
    for key in ["timeouts", "timeout_s"] {
        let l = Lift {
            from: &["policy", "defaults"],
            key,
            to: &[],
            to_key: "timeout",
        };
        lift(spec, &at, &l, diags);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::parse;
    use serde_json::json;

    fn run(src: &str) -> (serde_json::Value, Diagnostics) {
        let mut root = parse(src).unwrap();
        let mut d = Diagnostics::default();
        executor_spec(&mut root, &mut d);
        (root.to_json(), d)
    }

    #[test]
    fn executor_policy_limits_and_default_timeouts_move_to_their_plain_spelling() {
        let (j, d) = run("executor:\n  spec:\n    limits: { max_loop_items: 5 }\n    policy:\n      limits: { max_payload_bytes: 100 }\n      defaults: { timeouts: 7 }\n");
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            j["executor"]["spec"]["limits"],
            json!({"max_loop_items": 5, "max_payload_bytes": 100})
        );
        assert_eq!(j["executor"]["spec"]["timeout"], 7);
        assert_eq!(
            j["executor"]["spec"]["policy"],
            json!({"limits": {}, "defaults": {}})
        );
    }

    #[test]
    fn noetl_s_default_timeout_s_is_the_default_task_timeout() {
        let (j, d) =
            run("executor:\n  spec:\n    policy:\n      defaults:\n        timeout_s: 30\n");
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(j["executor"]["spec"]["timeout"], 30);
        let (_, d) = run(
            "executor:\n  spec:\n    policy:\n      defaults: { timeouts: 5, timeout_s: 30 }\n",
        );
        assert_eq!(d.codes(), ["E004"]);
    }

    #[test]
    fn a_setting_written_both_ways_must_agree() {
        let (_, d) = run("executor:\n  spec:\n    limits: { max_payload_bytes: 5 }\n    policy:\n      limits:\n        max_payload_bytes: 100\n");
        assert_eq!(d.codes(), ["E004"]);
        let e = &d.0[0];
        assert_eq!(e.span.unwrap().line, 6);
        assert_eq!(e.path, "/executor/spec/policy/limits/max_payload_bytes");
        assert!(e.message.contains("disagree (line 3)"), "{}", e.message);
        let (j, d) = run("executor:\n  spec:\n    limits: { max_payload_bytes: 5 }\n    policy: { limits: { max_payload_bytes: 5 } }\n");
        assert!(d.is_empty());
        assert_eq!(j["executor"]["spec"]["limits"]["max_payload_bytes"], 5);
    }
}
