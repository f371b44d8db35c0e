//! The `workbook`: reusable named tasks a pipeline runs with
//! `kind: workbook` and `task: <name>`.
//!
//! Accepted shapes (all equivalent):
//!
//! ```yaml
//! workbook:
//!   tasks:
//!     lookup: { kind: http, url: "https://api/{{ args.id }}" }
//! ---
//! workbook:
//!   tasks:
//!     - name: lookup
//!       kind: http
//!       url: "https://api/{{ args.id }}"
//! ---
//! workbook:
//!   - name: lookup
//!     kind: http
//!     url: "https://api/{{ args.id }}"
//! ```
//!
//! A call site `{name: fetch, kind: workbook, task: lookup, args: {...},
//! spec: {...}}` runs as the workbook task with the call site's label: its
//! fields are the workbook task's, overlaid by the call site's (an `args`
//! object is merged key by key); its spec is the workbook task's spec under
//! the call site's, and the call site's `policy` wins when it has one.

use serde_json::{Map, Value};

use crate::merge::deep_merge;
use crate::model::{Task, TaskSpec};

/// The named tasks of a `workbook` section, in document order.
pub fn tasks(workbook: Option<&Value>) -> Vec<(String, Value)> {
    let list = match workbook {
        Some(Value::Object(m)) => match m.get("tasks") {
            Some(Value::Object(named)) => {
                return named.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
            }
            Some(Value::Array(a)) => a,
            _ => return Vec::new(),
        },
        Some(Value::Array(a)) => a,
        _ => return Vec::new(),
    };
    list.iter()
        .filter_map(|t| Some((t.get("name")?.as_str()?.to_string(), t.clone())))
        .collect()
}

/// Why a workbook call cannot be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkbookError {
    /// The call site has no `task` string.
    #[error("task {label:?} (kind workbook) needs `task: <workbook task name>`")]
    NoTaskName {
        /// The call site's label.
        label: String,
    },
    /// No workbook task of that name.
    #[error("task {label:?} calls workbook task {name:?}, which the `workbook` does not define{}", if known.is_empty() { String::new() } else { format!(" (it defines: {})", known.join(", ")) })]
    Unknown {
        /// The call site's label.
        label: String,
        /// The name asked for.
        name: String,
        /// The names defined.
        known: Vec<String>,
    },
    /// The workbook task is not a task (`kind` missing, or `kind: workbook`).
    #[error("workbook task {name:?} must have a `kind` other than `workbook`")]
    BadTask {
        /// Its name.
        name: String,
    },
}

/// The task a pipeline runs for `call`: `call` itself unless its kind is
/// `workbook`, else the named workbook task under the call site's label.
pub fn resolve(workbook: Option<&Value>, call: &Task) -> Result<Task, WorkbookError> {
    if call.kind != "workbook" {
        return Ok(call.clone());
    }
    let label = call.name.clone();
    let name = call
        .config
        .get("task")
        .and_then(Value::as_str)
        .ok_or_else(|| WorkbookError::NoTaskName {
            label: label.clone(),
        })?
        .to_string();
    let all = tasks(workbook);
    let Some((_, def)) = all.iter().find(|(n, _)| *n == name) else {
        return Err(WorkbookError::Unknown {
            label,
            name,
            known: all.into_iter().map(|(n, _)| n).collect(),
        });
    };
    let Some(Value::Object(def)) = Some(def) else {
        return Err(WorkbookError::BadTask { name });
    };
    let kind = match def.get("kind").and_then(Value::as_str) {
        Some(k) if k != "workbook" && !k.is_empty() => k.to_string(),
        _ => return Err(WorkbookError::BadTask { name }),
    };
    let mut config: Map<String, Value> = def
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "name" | "kind" | "spec"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in &call.config {
        if k == "task" {
            continue;
        }
        match (config.get_mut(k), v) {
            (Some(Value::Object(base)), Value::Object(over)) if k == "args" => {
                for (ak, av) in over {
                    base.insert(ak.clone(), av.clone());
                }
            }
            _ => {
                config.insert(k.clone(), v.clone());
            }
        }
    }
    let def_spec: TaskSpec = def
        .get("spec")
        .cloned()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default();
    let mut extra = Value::Object(def_spec.extra.clone());
    deep_merge(&mut extra, &Value::Object(call.spec.extra.clone()));
    let spec = TaskSpec {
        policy: call.spec.policy.clone().or(def_spec.policy),
        extra: match extra {
            Value::Object(m) => m,
            _ => Map::new(),
        },
    };
    Ok(Task {
        name: label,
        kind,
        spec,
        config,
    })
}

/// The kind whose executors run `task`: the workbook task's kind for a
/// workbook call (validation, `E038`, guarantees it resolves in a loaded
/// playbook), else the task's own.
pub fn effective_kind(workbook: Option<&Value>, task: &Task) -> String {
    match resolve(workbook, task) {
        Ok(t) => t.kind,
        Err(_) => task.kind.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(v: Value) -> Task {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn every_shape_resolves_with_call_site_overrides() {
        let shapes = [
            json!({"tasks": {"double": {"kind": "python", "code": "result = x * 2", "args": {"x": 1, "y": 2}, "spec": {"timeout": 5}}}}),
            json!({"tasks": [{"name": "double", "kind": "python", "code": "result = x * 2", "args": {"x": 1, "y": 2}, "spec": {"timeout": 5}}]}),
            json!([{"name": "double", "kind": "python", "code": "result = x * 2", "args": {"x": 1, "y": 2}, "spec": {"timeout": 5}}]),
        ];
        for wb in shapes {
            let t = resolve(
                Some(&wb),
                &call(json!({"name": "twice", "kind": "workbook", "task": "double", "args": {"x": 21}, "spec": {"retries": 1}})),
            )
            .unwrap();
            assert_eq!(t.name, "twice");
            assert_eq!(t.kind, "python");
            assert_eq!(t.config["code"], "result = x * 2");
            assert_eq!(t.config["args"], json!({"x": 21, "y": 2}));
            assert!(!t.config.contains_key("task"));
            assert_eq!(t.spec.extra["timeout"], 5);
            assert_eq!(t.spec.extra["retries"], 1);
        }
    }

    #[test]
    fn unknown_names_and_non_workbook_tasks() {
        let wb = json!({"tasks": {"a": {"kind": "noop"}, "b": {"kind": "noop"}}});
        let plain = call(json!({"name": "n", "kind": "noop"}));
        assert_eq!(resolve(Some(&wb), &plain).unwrap(), plain);
        let err = resolve(
            Some(&wb),
            &call(json!({"name": "n", "kind": "workbook", "task": "c"})),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "task \"n\" calls workbook task \"c\", which the `workbook` does not define (it defines: a, b)"
        );
        assert!(matches!(
            resolve(Some(&wb), &call(json!({"name": "n", "kind": "workbook"}))),
            Err(WorkbookError::NoTaskName { .. })
        ));
    }
}
