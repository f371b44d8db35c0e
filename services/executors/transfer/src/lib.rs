//! noetl-tool-transfer: the `transfer` kind — rows from a SQL query
//! (PostgreSQL, DuckDB) or an HTTP source returning JSON rows, written in
//! batches into a PostgreSQL or DuckDB table.
//!
//! Fields: `source` (`tool: postgres | duckdb | http`; `query` and `auth` /
//! `connection` / `database` for SQL; the http tool's fields, `auth` and
//! `data_path` for HTTP), `target` (`tool: postgres | duckdb`, `table`,
//! `auth` / `connection` / `database`, `key` for upserts), `mapping`
//! (target column → source field, dotted; on the task or the target),
//! `chunk_size` (rows per batch, default 1000), `mode` (`insert` /
//! `append`, `upsert`, `replace`). NoETL's `type:` / `kind:` for `tool:`
//! are read too.
//!
//! Each side runs through the kind's own tool (the postgres tool's pools,
//! TLS and value conversion; the duckdb tool; the http tool's clients), so
//! a side fails with that tool's outcome (`postgres.sql`, `http.status`,
//! `timeout`...) and `outcome.transfer = {stage, rows_read, rows_written,
//! batches}` says how far it got. Each batch is one `INSERT` statement
//! (atomic on its own); `spec.timeout` bounds each call.
//!
//! Result: `{rows_read, rows_written, batches, columns, source_type,
//! target_type, direction, target_table, mode}`, plus NoETL's names
//! `rows_transferred` and `chunks_processed`.

pub mod plan;

use std::sync::Arc;

use noetl_core::tool::{AuthCredential, Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::{json, Map, Value};

pub use plan::{ConfigError, Mode, Plan, SourceKind, TargetKind};

/// The `transfer` tool.
#[derive(Debug, Clone)]
pub struct TransferTool {
    http: Arc<noetl_tool_http::HttpTool>,
    postgres: Arc<noetl_tool_postgres::PostgresTool>,
    duckdb: noetl_tool_duckdb::DuckdbTool,
}

impl Default for TransferTool {
    fn default() -> Self {
        Self::new()
    }
}

impl TransferTool {
    /// The tool, with its own http clients and postgres pools.
    pub fn new() -> Self {
        Self {
            http: Arc::new(noetl_tool_http::HttpTool::new()),
            postgres: Arc::new(noetl_tool_postgres::PostgresTool::new()),
            duckdb: noetl_tool_duckdb::DuckdbTool,
        }
    }
}

impl Tool for TransferTool {
    fn kind(&self) -> &'static str {
        "transfer"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        let tool = self.clone();
        Box::pin(async move { tool.run(call).await })
    }
}

/// How far a transfer got.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    rows_read: usize,
    rows_written: u64,
    batches: usize,
}

impl Progress {
    fn helper(&self, stage: &str) -> Value {
        json!({
            "stage": stage,
            "rows_read": self.rows_read,
            "rows_written": self.rows_written,
            "batches": self.batches,
        })
    }
}

impl TransferTool {
    fn tool(&self, kind: &str) -> &dyn Tool {
        match kind {
            "http" => self.http.as_ref(),
            "postgres" => self.postgres.as_ref(),
            _ => &self.duckdb,
        }
    }

    /// Call the tool of one side with these fields.
    async fn side(
        &self,
        call: &ToolCall,
        kind: &str,
        config: Map<String, Value>,
        auth: Option<&AuthCredential>,
    ) -> Outcome {
        let sub = ToolCall {
            execution_id: call.execution_id.clone(),
            step: call.step.clone(),
            task: call.task.clone(),
            spec: call.spec.clone(),
            attempt: call.attempt,
            auth: auth.cloned(),
            ..ToolCall::new(kind, config)
        };
        self.tool(kind).call(sub).await.outcome
    }

    // Over 80 lines on purpose: read, map, then write batch after batch,
    // each step turning a side's failure into the task's outcome.
    async fn run(&self, call: ToolCall) -> ToolReturn {
        let who = format!("transfer task {:?} of step {:?}", call.task, call.step);
        let plan = match plan::plan(&call.config) {
            Ok(p) => p,
            Err(e) => {
                return ToolReturn::from(Outcome::error(
                    "transfer.config",
                    format!("{who}: {e}"),
                    false,
                ))
            }
        };
        let mut progress = Progress::default();
        // A side's failure keeps its own kind; the message says which side.
        let side_failed = |mut o: Outcome, stage: &str, p: Progress| {
            if let Some(e) = o.error.as_mut() {
                e.message = format!("{who}: {stage} {}: {}", side_name(&plan, stage), e.message);
            }
            ToolReturn::from(o.with_helper("transfer", p.helper(stage)))
        };
        let fail = |kind: &str, message: String, stage: &str, p: Progress| {
            ToolReturn::from(
                Outcome::error(kind, format!("{who}: {message}"), false)
                    .with_helper("transfer", p.helper(stage)),
            )
        };
        // Read.
        let read = self
            .side(
                &call,
                plan.source.name(),
                plan.source_config.clone(),
                call.nested_auth.get("source"),
            )
            .await;
        if !read.is_ok() {
            return side_failed(read, "source", progress);
        }
        let (rows, source_columns) =
            match plan::rows_of(plan.source, &read.result, plan.data_path.as_deref()) {
                Ok(r) => r,
                Err(e) => {
                    return fail(
                        "transfer.source",
                        format!("source: {e}"),
                        "source",
                        progress,
                    )
                }
            };
        progress.rows_read = rows.len();
        let mapping: Vec<(String, String)> = if plan.mapping.is_empty() {
            source_columns
                .iter()
                .map(|c| (c.clone(), c.clone()))
                .collect()
        } else {
            plan.mapping.clone()
        };
        let columns: Vec<String> = mapping.iter().map(|(c, _)| c.clone()).collect();
        let key: Vec<String> = if plan.key.is_empty() {
            columns.iter().take(1).cloned().collect()
        } else {
            plan.key.clone()
        };
        let key_index: Vec<usize> = key
            .iter()
            .filter_map(|k| columns.iter().position(|c| c == k))
            .collect();
        if plan.mode == Mode::Upsert && key_index.len() != key.len() {
            return fail(
                "transfer.config",
                format!("`target.key` {key:?} must be among the columns written {columns:?}"),
                "target",
                progress,
            );
        }
        let target_auth = call.nested_auth.get("target");
        // Write.
        if plan.mode == Mode::Replace {
            let empty = match plan.target {
                TargetKind::Postgres => format!("TRUNCATE TABLE {}", plan.table),
                TargetKind::Duckdb => format!("DELETE FROM {}", plan.table),
            };
            let mut config = plan.target_config.clone();
            config.insert("command".into(), Value::String(empty));
            let o = self
                .side(&call, plan.target.name(), config, target_auth)
                .await;
            if !o.is_ok() {
                return side_failed(o, "target", progress);
            }
        }
        if !columns.is_empty() {
            let per_batch = plan::rows_per_batch(plan.target, plan.chunk_size, columns.len());
            for chunk in rows.chunks(per_batch) {
                let mut values: Vec<Vec<Value>> = chunk
                    .iter()
                    .map(|r| mapping.iter().map(|(_, src)| plan::pick(r, src)).collect())
                    .collect();
                if plan.mode == Mode::Upsert {
                    values = plan::last_per_key(values, &key_index);
                }
                let sql = plan::insert_sql(&plan::BatchSql {
                    target: plan.target,
                    table: &plan.table,
                    columns: &columns,
                    rows: values.len(),
                    mode: plan.mode,
                    key: &key,
                });
                let mut config = plan.target_config.clone();
                config.insert("command".into(), Value::String(sql));
                config.insert(
                    "params".into(),
                    Value::Array(values.into_iter().flatten().collect()),
                );
                let o = self
                    .side(&call, plan.target.name(), config, target_auth)
                    .await;
                if !o.is_ok() {
                    return side_failed(o, "target", progress);
                }
                progress.batches += 1;
                progress.rows_written += o
                    .result
                    .get("row_count")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
            }
        }
        ToolReturn::from(Outcome::ok(json!({
            "rows_read": progress.rows_read,
            "rows_written": progress.rows_written,
            "batches": progress.batches,
            "rows_transferred": progress.rows_written,
            "chunks_processed": progress.batches,
            "columns": columns,
            "source_type": plan.source.name(),
            "target_type": plan.target.name(),
            "direction": format!("{}_to_{}", plan.source.name(), plan.target.name()),
            "target_table": plan.table,
            "mode": plan.mode.name(),
        })))
    }
}

fn side_name(plan: &Plan, stage: &str) -> &'static str {
    if stage == "source" {
        plan.source.name()
    } else {
        plan.target.name()
    }
}
