//! The `wait` tool kind: a task that waits for a signal
//! ([`noetl_mesh::signal`]). Like `playbook`, its tasks are run by the
//! executor runtime: the runtime stores the waiter and the step-run waits,
//! without holding an executor, until a signal or its timeout continues
//! it. This module reads the task's fields.

use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::{Map, Value};

/// The `wait` kind: an executor serving it consumes `<p>.task.wait`
/// (where signals and timeouts send the continuation); [`Tool::call`] is
/// never used.
#[derive(Debug, Clone, Copy, Default)]
pub struct WaitTool;

impl Tool for WaitTool {
    fn kind(&self) -> &'static str {
        noetl_mesh::signal::WAIT_KIND
    }

    fn call(&self, _call: ToolCall) -> ToolFuture {
        Box::pin(async {
            ToolReturn::from(Outcome::error(
                "wait.runtime",
                "wait tasks are run by the executor runtime, not called as a tool",
                false,
            ))
        })
    }
}

/// A `wait` task's fields, read.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitConfig {
    /// The signal's name.
    pub signal: String,
    /// Seconds until it times out, if it does.
    pub timeout_s: Option<f64>,
    /// The JSON Schema of the data it accepts.
    pub schema: Option<Value>,
}

/// Read a `wait` task's rendered fields; `Err` names the field problem.
pub fn config(c: &Map<String, Value>) -> Result<WaitConfig, String> {
    let signal = match c.get("signal") {
        Some(Value::String(s)) if noetl_mesh::signal::valid_signal(s) => s.clone(),
        Some(other) => {
            return Err(format!(
                "`signal` must be a name of {}, got {other}",
                noetl_mesh::ids::NAME_RULE
            ))
        }
        None => return Err("a wait task needs `signal`: the name a signal is sent to".into()),
    };
    let timeout_s = match c.get("timeout_s") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                .filter(|s: &f64| s.is_finite() && *s > 0.0)
                .ok_or_else(|| {
                    format!("`timeout_s` must be a number of seconds above 0, got {v}")
                })?,
        ),
    };
    let schema = match c.get("schema") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(other) => {
            return Err(format!(
                "`schema` must be a JSON Schema object, got {other}"
            ))
        }
    };
    Ok(WaitConfig {
        signal,
        timeout_s,
        schema,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_wait_needs_a_signal_name_and_takes_a_timeout_and_a_schema() {
        let c = config(&obj(
            json!({"signal": "approval", "timeout_s": "1.5", "schema": {"type": "object"}}),
        ))
        .unwrap();
        assert_eq!(c.signal, "approval");
        assert_eq!(c.timeout_s, Some(1.5));
        assert_eq!(c.schema, Some(json!({"type": "object"})));
        assert!(config(&obj(json!({})))
            .unwrap_err()
            .contains("needs `signal`"));
        assert!(config(&obj(json!({"signal": "a.b"})))
            .unwrap_err()
            .contains("A-Za-z0-9"));
        assert!(config(&obj(json!({"signal": "s", "timeout_s": 0})))
            .unwrap_err()
            .contains("timeout_s"));
        assert!(config(&obj(json!({"signal": "s", "schema": "x"})))
            .unwrap_err()
            .contains("schema"));
    }
}
