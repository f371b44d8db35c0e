//! `kind: playbook`: a task that runs another playbook as a child execution.
//!
//! The executor publishes the child's execution request (by catalog `path`
//! and optional `version`, inline `playbook` text, or a `file` read where
//! the executor runs) with the child's workload overrides from `args`, and
//! the command that continues the parent at this task. Then it lets go of
//! the command: no executor slot is held while the child runs. When the
//! child ends, the router publishes that continuation with the child's
//! outcome, and the parent's pipeline goes on with the task's policy.
//!
//! The child's execution id is derived from the parent task run, so a
//! redelivered command starts the same child once. The parent task's `iter`
//! is the child's `iter.parent` (read-only; `iter.parent.parent`... further
//! up a chain).

use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use noetl_wire::{ExecutionRequest, TaskCommand};
use serde_json::{Map, Value};

/// The `playbook` kind. Executors that serve it consume
/// `<p>.task.playbook`; the runtime handles its tasks itself, so
/// [`Tool::call`] is never used.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlaybookTool;

impl Tool for PlaybookTool {
    fn kind(&self) -> &'static str {
        "playbook"
    }

    /// An inline child playbook is the child's own text: its templates are
    /// the child's, not rendered in the parent.
    fn raw_fields(&self) -> &'static [&'static str] {
        &["playbook"]
    }

    fn call(&self, _call: ToolCall) -> ToolFuture {
        Box::pin(async {
            ToolReturn::from(Outcome::error(
                "playbook.runtime",
                "playbook tasks are run by the executor runtime, not called as a tool",
                false,
            ))
        })
    }
}

/// What a child execution request is built from.
pub(crate) struct ChildParams<'a> {
    /// The task's rendered fields.
    pub config: &'a Map<String, Value>,
    /// The child's execution id.
    pub child_id: String,
    /// The parent execution.
    pub parent_id: &'a str,
    /// Trace id shared with the parent.
    pub trace_id: &'a str,
    /// The command that continues the parent at this task.
    pub resume: TaskCommand,
    /// The parent task's `iter` (with its own `parent` chain).
    pub parent_iter: Value,
}

/// The child's execution request, or why the task's fields are wrong.
pub(crate) fn request(p: ChildParams<'_>) -> Result<ExecutionRequest, String> {
    let c = p.config;
    let text = |k: &str| c.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let given: Vec<&str> = ["path", "playbook", "file"]
        .into_iter()
        .filter(|k| text(k).is_some())
        .collect();
    if given.len() != 1 {
        return Err(format!(
            "a playbook task needs exactly one of `path` (catalog), `playbook` (YAML text) or `file`; it has {}",
            if given.is_empty() {
                "none".to_string()
            } else {
                given.join(", ")
            }
        ));
    }
    let mut req = ExecutionRequest {
        execution_id: p.child_id,
        parent_execution_id: p.parent_id.to_string(),
        trace_id: p.trace_id.to_string(),
        parent_resume: Some(p.resume),
        parent_iter_json: if p.parent_iter.is_null() {
            Vec::new()
        } else {
            p.parent_iter.to_string().into_bytes()
        },
        ..Default::default()
    };
    match given[0] {
        "path" => {
            req.path = text("path").unwrap_or_default().to_string();
            req.source_name = req.path.clone();
            req.version = match c.get("version") {
                None | Some(Value::Null) => 0,
                Some(v) => v
                    .as_u64()
                    .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                    .filter(|v| *v >= 1 && *v <= u32::MAX as u64)
                    .ok_or_else(|| format!("`version` must be a positive integer, got {v}"))?
                    as u32,
            };
        }
        "playbook" => {
            req.playbook_yaml = text("playbook").unwrap_or_default().to_string();
            req.source_name = "inline child playbook".into();
        }
        _ => {
            let file = text("file").unwrap_or_default();
            req.playbook_yaml = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read child playbook file {file:?}: {e}"))?;
            req.source_name = file.to_string();
        }
    }
    req.workload_json = match c.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(v @ Value::Object(_)) => v.to_string().into_bytes(),
        Some(other) => {
            return Err(format!(
                "`args` of a playbook task must be an object (the child's workload overrides), got {other}"
            ))
        }
    };
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(config: &Map<String, Value>) -> ChildParams<'_> {
        ChildParams {
            config,
            child_id: "c1".into(),
            parent_id: "p1",
            trace_id: "t",
            resume: TaskCommand::default(),
            parent_iter: json!({"city": "Paris"}),
        }
    }

    #[test]
    fn requests_by_path_inline_or_file() {
        let c = json!({"path": "demo/child", "version": "2", "args": {"x": 1}});
        let r = request(params(c.as_object().unwrap())).unwrap();
        assert_eq!((r.path.as_str(), r.version), ("demo/child", 2));
        assert_eq!(r.parent_execution_id, "p1");
        assert_eq!(r.workload_json, br#"{"x":1}"#);
        assert_eq!(r.parent_iter_json, br#"{"city":"Paris"}"#);
        let c = json!({"playbook": "apiVersion: x"});
        let r = request(params(c.as_object().unwrap())).unwrap();
        assert_eq!(r.playbook_yaml, "apiVersion: x");
        let c = json!({"file": "/nonexistent/child.yaml"});
        let e = request(params(c.as_object().unwrap())).unwrap_err();
        assert!(e.contains("/nonexistent/child.yaml"), "{e}");
    }

    #[test]
    fn bad_fields_are_named() {
        let c = json!({"path": "a", "playbook": "b"});
        let e = request(params(c.as_object().unwrap())).unwrap_err();
        assert!(e.contains("path, playbook"), "{e}");
        let c = json!({"path": "a", "args": [1]});
        assert!(request(params(c.as_object().unwrap()))
            .unwrap_err()
            .contains("`args`"));
        let c = json!({"path": "a", "version": 0});
        assert!(request(params(c.as_object().unwrap()))
            .unwrap_err()
            .contains("`version`"));
    }
}
