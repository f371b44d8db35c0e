//! noetl-tool-noop: the `noop` tool kind.
//!
//! It does nothing and always succeeds. Its result is the task's rendered
//! `result` field when the task has one, else `_prev` (so a noop passes the
//! pipeline's data through). Useful for policy-only tasks (`set_iter`,
//! `set_ctx`, `jump`, `break` decisions) and for routing-only steps.

use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;

/// The `noop` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopTool;

impl NoopTool {
    /// The result of one call: `config.result` if present, else `_prev`.
    pub fn result_of(call: &ToolCall) -> serde_json::Value {
        call.config
            .get("result")
            .cloned()
            .unwrap_or_else(|| call.prev.clone())
    }
}

impl Tool for NoopTool {
    fn kind(&self) -> &'static str {
        "noop"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        let outcome = Outcome::ok(Self::result_of(&call));
        Box::pin(async move { ToolReturn::from(outcome) })
    }
}
