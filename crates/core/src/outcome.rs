//! The outcome envelope every tool invocation produces (docs/dsl.md "The pipeline").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Whether a policy rule's `when` reads the outcome's status or error
/// (`outcome.status`, `outcome.error`; `output.` in the engine-internals
/// spelling): a policy with such a rule tells errors apart, and its `else`
/// rule is meant for what is left (W109; `noetl migrate` adds the error
/// case before a fallback rule it writes otherwise).
pub fn reads_status(when: &str) -> bool {
    [
        "outcome.status",
        "outcome.error",
        "output.status",
        "output.error",
    ]
    .iter()
    .any(|n| when.contains(n))
}

/// `outcome.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    /// The tool succeeded.
    Ok,
    /// The tool failed.
    Error,
}

/// `outcome.error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutcomeError {
    /// Stable error kind, e.g. `timeout`, `python.exception`, `http.status`.
    pub kind: String,
    /// Whether retrying may help.
    #[serde(default)]
    pub retryable: bool,
    /// Human-readable message (never contains secret values).
    #[serde(default)]
    pub message: String,
    /// Kind-specific details.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Why a step-run failed, as `step.failed` and `loop.iteration.failed`
/// carry it under `error`: `{kind, message, task}` (`task` is `null` when
/// no one task is to blame).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepError {
    /// Stable error kind (`timeout`, `policy`, `workbook`, a tool's kind...).
    pub kind: String,
    /// What went wrong, for people.
    pub message: String,
    /// The task that failed the step-run.
    #[serde(default)]
    pub task: Option<String>,
}

impl StepError {
    /// A step error of `kind`.
    pub fn new(kind: &str, message: impl Into<String>, task: Option<&str>) -> Self {
        Self {
            kind: kind.to_string(),
            message: message.into(),
            task: task.map(str::to_string),
        }
    }

    /// As the JSON an event carries.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a step error is plain JSON")
    }
}

/// `outcome.meta`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutcomeMeta {
    /// 1-based attempt number.
    pub attempt: u32,
    /// Wall time of the invocation.
    pub duration_ms: u64,
    /// RFC 3339 start time.
    pub started_at: String,
    /// The execution's trace id (W3C, 32 hex digits): the trace its spans
    /// and events belong to (docs/observability.md).
    #[serde(default)]
    pub trace_id: String,
}

/// One final outcome of one tool invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// ok | error.
    pub status: OutcomeStatus,
    /// Success output (inline value or a result reference object).
    #[serde(default)]
    pub result: Value,
    /// Structured error, on `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<OutcomeError>,
    /// Attempt, timing.
    #[serde(default)]
    pub meta: OutcomeMeta,
    /// Tool helpers: `http`, `pg`, `py`... (e.g. `outcome.http.status`).
    #[serde(flatten)]
    pub helpers: Map<String, Value>,
}

impl Outcome {
    /// A successful outcome with `result`.
    pub fn ok(result: Value) -> Self {
        Self {
            status: OutcomeStatus::Ok,
            result,
            error: None,
            meta: OutcomeMeta::default(),
            helpers: Map::new(),
        }
    }

    /// A failed outcome.
    pub fn error(kind: impl Into<String>, message: impl Into<String>, retryable: bool) -> Self {
        Self {
            status: OutcomeStatus::Error,
            result: Value::Null,
            error: Some(OutcomeError {
                kind: kind.into(),
                retryable,
                message: message.into(),
                extra: Map::new(),
            }),
            meta: OutcomeMeta::default(),
            helpers: Map::new(),
        }
    }

    /// Attach a tool helper object (`http`, `pg`, `py`...).
    pub fn with_helper(mut self, name: &str, value: Value) -> Self {
        self.helpers.insert(name.to_string(), value);
        self
    }

    /// True when `status == ok`.
    pub fn is_ok(&self) -> bool {
        self.status == OutcomeStatus::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_when_reads_the_status_through_either_spelling() {
        assert!(reads_status("{{ outcome.status == 'error' }}"));
        assert!(reads_status("{{ output.error.retryable }}"));
        assert!(!reads_status("{{ outcome.result > 3 }}"));
    }
}
