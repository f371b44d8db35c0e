//! The noop tool.

use noetl_core::tool::{Tool, ToolCall};
use noetl_core::OutcomeStatus;
use noetl_tool_noop::NoopTool;
use serde_json::{json, Value};

fn call(config: Value) -> ToolCall {
    ToolCall {
        prev: json!({"from": "previous"}),
        ..ToolCall::new("noop", config.as_object().cloned().expect("object"))
    }
}

#[tokio::test]
async fn result_field_wins() {
    let r = NoopTool.call(call(json!({"result": {"a": 1}}))).await;
    assert_eq!(r.outcome.status, OutcomeStatus::Ok);
    assert_eq!(r.outcome.result, json!({"a": 1}));
    assert!(r.retry_after.is_none());
}

#[tokio::test]
async fn passes_prev_through() {
    let r = NoopTool.call(call(json!({}))).await;
    assert_eq!(r.outcome.status, OutcomeStatus::Ok);
    assert_eq!(r.outcome.result, json!({"from": "previous"}));
    // An explicit null result is a result.
    let r = NoopTool.call(call(json!({"result": null}))).await;
    assert_eq!(r.outcome.result, Value::Null);
    assert_eq!(NoopTool.kind(), "noop");
    assert!(NoopTool.raw_fields().is_empty());
}
