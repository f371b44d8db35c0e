//! Calling a tool: its config rendered (raw fields left as written), the
//! call on a task of its own (a panicking tool fails its task, not the
//! replica), bounded by the time left. Shared by the pipeline and the
//! cursor claim.

use std::sync::Arc;
use std::time::Duration;

use noetl_core::template::{render_value, Scope};
use noetl_core::tool::{Tool, ToolCall, ToolReturn};
use noetl_core::{Outcome, Task};
use serde_json::{Map, Value};
use tracing::Instrument;

/// Render a task's config, leaving the tool's raw fields as written.
pub(crate) fn render_config(
    task: &Task,
    raw: &[&str],
    scope: &Scope,
) -> Result<Map<String, Value>, String> {
    let mut out = Map::with_capacity(task.config.len());
    for (k, v) in &task.config {
        let v = if raw.contains(&k.as_str()) {
            v.clone()
        } else {
            render_value(v, scope).map_err(|e| format!("field `{k}`: {e}"))?
        };
        out.insert(k.clone(), v);
    }
    Ok(out)
}

/// Call a tool on its own task so a panicking tool fails its task, not the
/// replica.
pub(crate) async fn call_tool(tool: &Arc<dyn Tool>, call: ToolCall) -> ToolReturn {
    let kind = call.kind.clone();
    // On the task's span: a tool's own spans and propagated trace context
    // (the http tool's `traceparent`) belong to the task.
    match tokio::spawn(tool.call(call).in_current_span()).await {
        Ok(r) => r,
        Err(e) => ToolReturn::from(Outcome::error(
            "tool.panic",
            format!("the {kind} tool panicked: {e}"),
            false,
        )),
    }
}

/// [`call_tool`] bounded by `left`: `None` when the time ran out, and the
/// call is then aborted (a python interpreter is killed with it).
pub(crate) async fn call_tool_within(
    tool: &Arc<dyn Tool>,
    call: ToolCall,
    left: Duration,
) -> Option<ToolReturn> {
    let kind = call.kind.clone();
    let mut handle = tokio::spawn(tool.call(call).in_current_span());
    match tokio::time::timeout(left, &mut handle).await {
        Ok(Ok(r)) => Some(r),
        Ok(Err(e)) => Some(ToolReturn::from(Outcome::error(
            "tool.panic",
            format!("the {kind} tool panicked: {e}"),
            false,
        ))),
        Err(_) => {
            handle.abort();
            None
        }
    }
}
