//! Calling a tool: its config rendered (raw fields left as written), the
//! call (a panicking tool fails its task, not the replica), bounded by
//! the time left. Shared by the pipeline and the cursor claim.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
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

/// Call a tool so that a panicking tool fails its task, not the replica:
/// the panic is caught where the call is awaited (no task of its own, which
/// a quick tool would pay for on every call).
pub(crate) async fn call_tool(tool: &Arc<dyn Tool>, call: ToolCall) -> ToolReturn {
    let kind = call.kind.clone();
    match AssertUnwindSafe(tool.call(call)).catch_unwind().await {
        Ok(r) => r,
        Err(panic) => ToolReturn::from(Outcome::error(
            "tool.panic",
            format!("the {kind} tool panicked: {}", panic_text(&*panic)),
            false,
        )),
    }
}

/// What a panic said, when it said it as text.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
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

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_core::tool::ToolFuture;

    /// A tool whose call panics.
    struct Panics;

    async fn boom() -> ToolReturn {
        panic!("boom at row 7")
    }

    impl Tool for Panics {
        fn kind(&self) -> &'static str {
            "noop"
        }
        fn call(&self, _call: ToolCall) -> ToolFuture {
            Box::pin(boom())
        }
    }

    #[tokio::test]
    async fn a_panicking_tool_fails_its_task_with_what_the_panic_said() {
        let tool: Arc<dyn Tool> = Arc::new(Panics);
        let r = call_tool(&tool, ToolCall::new("noop", Map::new())).await;
        let e = r.outcome.error.expect("an error outcome");
        assert_eq!(e.kind, "tool.panic");
        assert_eq!(e.message, "the noop tool panicked: boom at row 7");
        assert!(!e.retryable);
        // Within a deadline, likewise.
        let r = call_tool_within(
            &tool,
            ToolCall::new("noop", Map::new()),
            Duration::from_secs(5),
        )
        .await
        .expect("within the time left");
        let e = r.outcome.error.expect("an error outcome");
        assert_eq!(e.kind, "tool.panic");
        assert!(e.message.contains("boom at row 7"), "{}", e.message);
    }
}
