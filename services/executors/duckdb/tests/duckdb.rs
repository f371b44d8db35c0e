//! The duckdb tool: with DuckDB compiled in (`--features engine`, on in the
//! workspace test run), SQL over a local CSV file and over earlier results;
//! without it, a clear error instead of a task that never runs.

use noetl_core::tool::{Tool, ToolCall};
use noetl_tool_duckdb::DuckdbTool;
use serde_json::{json, Value};

fn call(config: Value) -> ToolCall {
    ToolCall {
        task: "q".into(),
        ..ToolCall::new("duckdb", config.as_object().unwrap().clone())
    }
}

#[cfg(not(feature = "engine"))]
#[tokio::test]
async fn without_the_engine_tasks_fail_clearly() {
    let o = DuckdbTool
        .call(call(json!({"command": "select 1"})))
        .await
        .outcome;
    let e = o.error.unwrap();
    assert_eq!(e.kind, "duckdb.unavailable");
    assert!(e.message.contains("--no-default-features"), "{}", e.message);
}

#[cfg(feature = "engine")]
#[tokio::test]
async fn sql_over_a_csv_file_and_over_results() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("cities.csv");
    std::fs::write(&csv, "city,pop\nParis,2100000\nRome,2800000\nOslo,700000\n").unwrap();
    let o = DuckdbTool
        .call(call(json!({
            "command": format!("select city, pop from read_csv('{}') where pop > ? order by pop desc", csv.display()),
            "params": [1000000],
        })))
        .await
        .outcome;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(
        o.result["rows"],
        json!([{"city": "Rome", "pop": 2800000}, {"city": "Paris", "pop": 2100000}])
    );
    assert_eq!(o.result["columns"], json!(["city", "pop"]));

    // Rows of an earlier task as a table, several statements.
    let o = DuckdbTool
        .call(call(json!({
            "tables": {"pages": [{"page": 1, "n": 3}, {"page": 2, "n": 4.5}, {"page": 3, "n": null}]},
            "command": "create table totals as select sum(n) as total, count(*) as pages from pages; select * from totals",
        })))
        .await
        .outcome;
    assert!(o.is_ok(), "{:?}", o.error);
    assert_eq!(o.result["rows"][0]["total"], 7.5);
    assert_eq!(o.result["rows"][0]["pages"], 3);
    assert_eq!(o.result["statements"].as_array().unwrap().len(), 2);

    let o = DuckdbTool
        .call(call(json!({"command": "select * from no_such_table"})))
        .await
        .outcome;
    let e = o.error.unwrap();
    assert_eq!(e.kind, "duckdb.sql");
    assert!(e.message.contains("no_such_table"), "{}", e.message);
}

#[cfg(feature = "engine")]
#[tokio::test]
async fn a_query_past_its_timeout_is_a_retryable_timeout() {
    let mut c = call(json!({
        "command": "select sum(a.range * b.range) from range(100000) a, range(100000) b",
    }));
    c.spec = json!({"timeout": 0.5});
    let o = DuckdbTool.call(c).await.outcome;
    let e = o.error.unwrap();
    assert_eq!(e.kind, "timeout");
    assert!(e.retryable);
    assert!(e.message.contains("0.5s"), "{}", e.message);
}
