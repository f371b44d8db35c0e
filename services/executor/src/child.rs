//! `kind: playbook`: a task that runs another playbook as a child execution.
//!
//! The executor publishes the child's execution request (by catalog `path`
//! and optional `version`, inline `playbook` text, or a `file` read where
//! the executor runs) with the child's workload overrides from `args`, its
//! `return_step` and `timeout`, and the command that continues the parent
//! at this task. Then it lets go of
//! the command: no executor slot is held while the child runs. When the
//! child ends, the router publishes that continuation with the child's
//! outcome, and the parent's pipeline goes on with the task's policy.
//!
//! The child's execution id is derived from the parent task run, so a
//! redelivered command starts the same child once. The parent task's `iter`
//! is the child's `iter.parent` (read-only; `iter.parent.parent`... further
//! up a chain).
//!
//! Credentials never ride along: a task whose fields read `keychain` (or
//! whose rendered fields carry a resolved secret value) is refused with a
//! `playbook.config` error, because the child's request, its workload in
//! the plan and its `playbook.initialized` event would all hold the value.
//! The child declares the credential in its own `keychain` instead and the
//! executor running the child's task decrypts it there.

use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use noetl_mesh::scope;
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

/// Why a playbook task's fields cannot start a child.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChildError {
    /// Not exactly one of `path`, `playbook`, `file`.
    #[error("a playbook task needs exactly one of `path` (catalog), `playbook` (YAML text) or `file`; it has {given}")]
    Source {
        /// The fields given, or `none`.
        given: String,
    },
    /// `version` is not a positive integer.
    #[error("`version` must be a positive integer, got {0}")]
    Version(String),
    /// The `file` cannot be read.
    #[error("cannot read child playbook file {file:?}: {reason}")]
    File {
        /// The path.
        file: String,
        /// The I/O error.
        reason: String,
    },
    /// `timeout` is not a positive number of seconds.
    #[error("`timeout` of a playbook task must be a positive number of seconds (the child's deadline), got {0}")]
    Timeout(String),
    /// `return_step` is not a step name.
    #[error("`return_step` of a playbook task must name a step of the child playbook, got {0}")]
    ReturnStep(String),
    /// `args` is not an object.
    #[error(
        "`args` of a playbook task must be an object (the child's workload overrides), got {0}"
    )]
    Args(String),
    /// Fields that would carry a credential value into the child.
    #[error("{} `keychain`: credential values are not passed to child executions (the child's request, plan and events would hold them); declare the credential in the child playbook's own `keychain` and read it there as `{{{{ keychain.<name>.<field> }}}}`", subject(.0))]
    Keychain(Vec<String>),
}

/// "`args` reads" / "`args`, `path` read".
fn subject(fields: &[String]) -> String {
    let verb = if fields.len() == 1 { "reads" } else { "read" };
    format!("{} {verb}", fields.join(", "))
}

/// What a child execution request is built from.
pub(crate) struct ChildParams<'a> {
    /// The task's fields as written (templates not rendered).
    pub raw: &'a Map<String, Value>,
    /// The task's rendered fields.
    pub config: &'a Map<String, Value>,
    /// Resolved secret values of the parent step (none when it reads no
    /// `keychain`).
    pub secrets: &'a [String],
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

/// The task's fields that read `keychain` in a template, or whose rendered
/// value holds one of `secrets` (a credential that reached them another
/// way). The inline `playbook` is the child's own text, never rendered
/// here: the child resolves its own keychain.
fn keychain_fields(
    raw: &Map<String, Value>,
    rendered: &Map<String, Value>,
    secrets: &[String],
) -> Vec<String> {
    let mut out: Vec<String> = raw
        .iter()
        .filter(|(k, _)| k.as_str() != "playbook")
        .filter(|(_, v)| scope::roots(scope::strings(v)).contains("keychain"))
        .map(|(k, _)| format!("`{k}`"))
        .collect();
    for (k, v) in rendered.iter().filter(|(k, _)| k.as_str() != "playbook") {
        let carries = scope::strings(v)
            .iter()
            .any(|s| secrets.iter().any(|secret| s.contains(secret.as_str())));
        let name = format!("`{k}`");
        if carries && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// Refuse fields of an `artifact` task that read `keychain` or carry a
/// resolved secret value: the object store keeps what it is given in
/// clear, for every execution that shares it to read.
pub(crate) fn no_keychain(
    raw: &Map<String, Value>,
    rendered: &Map<String, Value>,
    secrets: &[String],
) -> Result<(), String> {
    let leaking = keychain_fields(raw, rendered, secrets);
    if leaking.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} `keychain`: credential values are not stored as artifacts (the object store keeps them in clear, for every execution that shares it)",
        subject(&leaking)
    ))
}

/// The child's execution request, or why the task's fields are wrong.
pub(crate) fn request(p: ChildParams<'_>) -> Result<ExecutionRequest, ChildError> {
    let c = p.config;
    let leaking = keychain_fields(p.raw, c, p.secrets);
    if !leaking.is_empty() {
        return Err(ChildError::Keychain(leaking));
    }
    let text = |k: &str| c.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let given: Vec<&str> = ["path", "playbook", "file"]
        .into_iter()
        .filter(|k| text(k).is_some())
        .collect();
    if given.len() != 1 {
        return Err(ChildError::Source {
            given: if given.is_empty() {
                "none".to_string()
            } else {
                given.join(", ")
            },
        });
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
                    .ok_or_else(|| ChildError::Version(v.to_string()))?
                    as u32,
            };
        }
        "playbook" => {
            req.playbook_yaml = text("playbook").unwrap_or_default().to_string();
            req.source_name = "inline child playbook".into();
        }
        _ => {
            let file = text("file").unwrap_or_default();
            req.playbook_yaml = std::fs::read_to_string(file).map_err(|e| ChildError::File {
                file: file.to_string(),
                reason: e.to_string(),
            })?;
            req.source_name = file.to_string();
        }
    }
    req.return_step = match c.get("return_step") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(other) => return Err(ChildError::ReturnStep(other.to_string())),
    };
    req.timeout_s = match c.get("timeout") {
        None | Some(Value::Null) => 0.0,
        Some(v) => v
            .as_f64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .filter(|s: &f64| s.is_finite() && *s > 0.0)
            .ok_or_else(|| ChildError::Timeout(v.to_string()))?,
    };
    req.workload_json = match c.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(v @ Value::Object(_)) => v.to_string().into_bytes(),
        Some(other) => return Err(ChildError::Args(other.to_string())),
    };
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(config: &Map<String, Value>) -> ChildParams<'_> {
        ChildParams {
            raw: config,
            config,
            secrets: &[],
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
        assert!(e.to_string().contains("/nonexistent/child.yaml"), "{e}");
    }

    #[test]
    fn return_step_and_timeout_ride_in_the_request() {
        let c = json!({"path": "a", "return_step": "finish", "timeout": "30"});
        let r = request(params(c.as_object().unwrap())).unwrap();
        assert_eq!((r.return_step.as_str(), r.timeout_s), ("finish", 30.0));
        let c = json!({"path": "a"});
        let r = request(params(c.as_object().unwrap())).unwrap();
        assert_eq!((r.return_step.as_str(), r.timeout_s), ("", 0.0));
        for bad in [json!(0), json!(-5), json!("soon")] {
            let c = json!({"path": "a", "timeout": bad});
            let e = request(params(c.as_object().unwrap())).unwrap_err();
            assert!(e.to_string().contains("`timeout`"), "{e}");
        }
        let c = json!({"path": "a", "return_step": 3});
        let e = request(params(c.as_object().unwrap())).unwrap_err();
        assert!(e.to_string().contains("`return_step`"), "{e}");
    }

    #[test]
    fn bad_fields_are_named() {
        let c = json!({"path": "a", "playbook": "b"});
        let e = request(params(c.as_object().unwrap())).unwrap_err();
        assert!(e.to_string().contains("path, playbook"), "{e}");
        let c = json!({"path": "a", "args": [1]});
        assert!(request(params(c.as_object().unwrap()))
            .unwrap_err()
            .to_string()
            .contains("`args`"));
        let c = json!({"path": "a", "version": 0});
        assert!(request(params(c.as_object().unwrap()))
            .unwrap_err()
            .to_string()
            .contains("`version`"));
    }

    #[test]
    fn credentials_are_refused_in_child_fields() {
        // Read in a template...
        let raw = json!({"path": "a", "args": {"token": "{{ keychain.api.token }}", "n": 1}});
        let rendered = json!({"path": "a", "args": {"token": "tok-SECRET-1", "n": 1}});
        let secrets = ["tok-SECRET-1".to_string()];
        let p = ChildParams {
            raw: raw.as_object().unwrap(),
            config: rendered.as_object().unwrap(),
            secrets: &secrets,
            ..params(rendered.as_object().unwrap())
        };
        let e = request(p).unwrap_err();
        assert_eq!(e, ChildError::Keychain(vec!["`args`".into()]));
        let m = e.to_string();
        assert!(m.contains("`args` reads `keychain`"), "{m}");
        assert!(m.contains("{{ keychain.<name>.<field> }}"), "{m}");
        assert!(!m.contains("tok-SECRET-1"), "{m}");
        // ...or arriving by another road (a secret value already rendered).
        let raw = json!({"path": "a", "args": {"token": "{{ workload.t }}"}});
        let p = ChildParams {
            raw: raw.as_object().unwrap(),
            config: rendered.as_object().unwrap(),
            secrets: &secrets,
            ..params(rendered.as_object().unwrap())
        };
        assert!(matches!(request(p), Err(ChildError::Keychain(_))));
        // The inline child text is the child's own: its keychain is fine.
        let inline = json!({"playbook": "x: '{{ keychain.api.token }}'"});
        let p = ChildParams {
            secrets: &secrets,
            ..params(inline.as_object().unwrap())
        };
        assert!(request(p).is_ok());
    }
}
