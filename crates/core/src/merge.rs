//! Spec layering (docs/dsl.md, Spec layering): the effective spec of a task is the overlay
//! of `kind_defaults`, `executor.spec`, `step.spec`, `loop.spec` and
//! `task.spec`, inner winning.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::model::{Playbook, Step, Task};

/// Overlays `overlay` onto `base`: maps deep-merge (inner wins on conflicts),
/// scalars and lists in `overlay` replace what `base` holds (a `null` in
/// `overlay` is a scalar and replaces too).
pub fn deep_merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(bv) => deep_merge(bv, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The effective spec of `task` in `step` of `playbook`:
/// `merge(kind_defaults, executor.spec, step.spec, loop.spec, task.spec)`.
///
/// `policy` is typed by scope (docs/dsl.md "Spec layering"): `executor`, `step` and
/// `loop` policies are non-control (admission, lifecycle, scheduling) and are
/// not inherited, nor is a `policy` in `kind_defaults`. The effective spec's
/// `policy` is exactly the task's own `spec.policy`, absent when the task has
/// none. Every other key is layered. Layers that are not objects are ignored.
pub fn effective_task_spec(
    kind_defaults: &Value,
    playbook: &Playbook,
    step: &Step,
    task: &Task,
) -> Value {
    let mut out = Value::Object(Map::new());
    let executor = playbook.executor.as_ref().map(|e| &e.spec);
    let outer = [
        Some(kind_defaults.clone()),
        executor.map(|s| Value::Object(s.clone())),
        Some(to_value(&step.spec)),
        step.loop_.as_ref().map(|l| to_value(&l.spec)),
    ];
    for mut layer in outer.into_iter().flatten() {
        if let Value::Object(m) = &mut layer {
            m.remove("policy");
            deep_merge(&mut out, &layer);
        }
    }
    let task_spec = to_value(&task.spec);
    if task_spec.is_object() {
        deep_merge(&mut out, &task_spec);
    }
    out
}

fn to_value(v: &impl Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scalars_inner_wins_maps_merge_lists_replace() {
        let mut base = json!({
            "a": 1,
            "keep": "x",
            "m": {"x": 1, "y": {"z": 1, "w": 2}},
            "l": [1, 2, 3],
            "s": {"nested": true},
        });
        deep_merge(
            &mut base,
            &json!({
                "a": 2,
                "m": {"y": {"z": 9}, "n": 3},
                "l": [4],
                "s": "scalar now",
                "new": null,
            }),
        );
        assert_eq!(
            base,
            json!({
                "a": 2,
                "keep": "x",
                "m": {"x": 1, "y": {"z": 9, "w": 2}, "n": 3},
                "l": [4],
                "s": "scalar now",
                "new": null,
            })
        );
    }

    #[test]
    fn map_overlay_replaces_scalar_base_and_null_overrides() {
        let mut base = json!({"a": 1, "b": 2});
        deep_merge(&mut base, &json!({"a": {"x": 1}, "b": null}));
        assert_eq!(base, json!({"a": {"x": 1}, "b": null}));
        let mut base = json!(5);
        deep_merge(&mut base, &json!({"k": 1}));
        assert_eq!(base, json!({"k": 1}));
    }

    fn playbook(step: Value, executor_spec: Value) -> (Playbook, Step) {
        let pb: Playbook = serde_json::from_value(json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "t"},
            "executor": {"spec": executor_spec},
            "workflow": [step],
        }))
        .unwrap();
        let step = pb.workflow[0].clone();
        (pb, step)
    }

    #[test]
    fn effective_task_spec_layers_in_order() {
        let (pb, step) = playbook(
            json!({
                "step": "s",
                "spec": {
                    "timeout": {"connect": 3, "read": 30},
                    "tags": ["step"],
                    "policy": {"admit": {"rules": [{"else": true, "then": {"allow": true}}]}},
                },
                "loop": {
                    "in": [1, 2],
                    "iterator": "x",
                    "spec": {"mode": "parallel", "max_in_flight": 2, "retries": {"n": 1},
                             "policy": {"exec": "distributed"}},
                },
                "tool": [
                    {"name": "t", "kind": "http", "url": "u", "spec": {
                        "timeout": {"read": 15},
                        "policy": {"rules": [{"else": true, "then": {"do": "break"}}]},
                    }},
                    {"name": "u", "kind": "noop"},
                ],
            }),
            json!({
                "limits": {"max_payload_bytes": 1000},
                "timeout": {"connect": 1, "read": 1, "write": 1},
                "policy": {"results": {"reference_first": true}},
            }),
        );
        let defaults = json!({"timeout": {"connect": 10}, "retries": {"n": 0, "m": 0}, "kind_only": 1,
                              "policy": {"rules": []}});
        let eff = effective_task_spec(&defaults, &pb, &step, &step.tool[0]);
        assert_eq!(
            eff["timeout"],
            json!({"connect": 3, "read": 15, "write": 1})
        );
        assert_eq!(eff["limits"], json!({"max_payload_bytes": 1000}));
        assert_eq!(eff["tags"], json!(["step"]));
        assert_eq!(eff["retries"], json!({"n": 1, "m": 0}));
        assert_eq!(eff["kind_only"], json!(1));
        assert_eq!(eff["max_in_flight"], json!(2));
        // the task's own policy, nothing inherited
        assert_eq!(
            eff["policy"],
            json!({"rules": [{"else": true, "then": {"do": "break"}}]})
        );

        // a task without a policy gets none, even though every outer layer has one
        let eff = effective_task_spec(&defaults, &pb, &step, &step.tool[1]);
        assert!(eff.get("policy").is_none(), "{eff}");
        assert_eq!(
            eff["timeout"],
            json!({"connect": 3, "read": 30, "write": 1})
        );
    }

    #[test]
    fn effective_task_spec_without_executor_or_loop() {
        let pb: Playbook = serde_json::from_value(json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "t"},
            "workflow": [{"step": "s", "tool": [{"name": "t", "kind": "noop", "spec": {"timeout": 5}}]}],
        }))
        .unwrap();
        let step = &pb.workflow[0];
        let eff = effective_task_spec(&Value::Null, &pb, step, &step.tool[0]);
        assert_eq!(eff, json!({"timeout": 5}));
    }
}
