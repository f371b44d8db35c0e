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
        let mut run = Run {
            tool: self,
            call: &call,
            plan: &plan,
            who,
            progress: Progress::default(),
        };
        match run.transfer().await {
            Ok(columns) => ToolReturn::from(Outcome::ok(run.result(&columns))),
            Err(stop) => run.stopped(stop),
        }
    }
}

/// Why a transfer stopped, before it becomes the task's outcome.
enum Stop {
    /// A side's tool failed: its own outcome.
    Side {
        outcome: Box<Outcome>,
        stage: &'static str,
    },
    /// The transfer itself failed.
    Own {
        kind: &'static str,
        message: String,
        stage: &'static str,
    },
}

/// One transfer task under way: read, map, then write batch after batch.
struct Run<'a> {
    tool: &'a TransferTool,
    call: &'a ToolCall,
    plan: &'a Plan,
    who: String,
    progress: Progress,
}

impl Run<'_> {
    /// The whole transfer; the columns written.
    async fn transfer(&mut self) -> Result<Vec<String>, Stop> {
        let (rows, source_columns) = self.read().await?;
        self.progress.rows_read = rows.len();
        let layout = plan::layout(self.plan, &source_columns).map_err(|e| Stop::Own {
            kind: "transfer.config",
            message: e.to_string(),
            stage: "target",
        })?;
        if self.plan.mode == Mode::Replace {
            self.empty_target().await?;
        }
        if !layout.columns.is_empty() {
            self.write(&rows, &layout).await?;
        }
        Ok(layout.columns)
    }

    /// Call the source's tool and take the rows from its result.
    async fn read(&self) -> Result<(plan::Rows, Vec<String>), Stop> {
        let plan = self.plan;
        let read = self
            .tool
            .side(
                self.call,
                plan.source.name(),
                plan.source_config.clone(),
                self.call.nested_auth.get("source"),
            )
            .await;
        if !read.is_ok() {
            return Err(Stop::Side {
                outcome: Box::new(read),
                stage: "source",
            });
        }
        plan::rows_of(plan.source, &read.result, plan.data_path.as_deref()).map_err(|e| Stop::Own {
            kind: "transfer.source",
            message: format!("source: {e}"),
            stage: "source",
        })
    }

    /// Call the target's tool with these fields.
    async fn target(&self, config: Map<String, Value>) -> Result<Outcome, Stop> {
        let o = self
            .tool
            .side(
                self.call,
                self.plan.target.name(),
                config,
                self.call.nested_auth.get("target"),
            )
            .await;
        if !o.is_ok() {
            return Err(Stop::Side {
                outcome: Box::new(o),
                stage: "target",
            });
        }
        Ok(o)
    }

    /// `mode: replace`: empty the table before the first batch.
    async fn empty_target(&self) -> Result<(), Stop> {
        let plan = self.plan;
        let empty = match plan.target {
            TargetKind::Postgres => format!("TRUNCATE TABLE {}", plan.table),
            TargetKind::Duckdb => format!("DELETE FROM {}", plan.table),
        };
        let mut config = plan.target_config.clone();
        config.insert("command".into(), Value::String(empty));
        self.target(config).await.map(|_| ())
    }

    /// Write the rows, one `INSERT` per batch.
    async fn write(
        &mut self,
        rows: &[Map<String, Value>],
        layout: &plan::Layout,
    ) -> Result<(), Stop> {
        let plan = self.plan;
        let per_batch = plan::rows_per_batch(plan.target, plan.chunk_size, layout.columns.len());
        for chunk in rows.chunks(per_batch) {
            let o = self.target(plan::batch_config(plan, layout, chunk)).await?;
            self.progress.batches += 1;
            self.progress.rows_written += o
                .result
                .get("row_count")
                .and_then(Value::as_u64)
                .unwrap_or(0);
        }
        Ok(())
    }

    /// The task's result once every batch is written.
    fn result(&self, columns: &[String]) -> Value {
        let (plan, progress) = (self.plan, self.progress);
        json!({
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
        })
    }

    /// The task's outcome when the transfer stopped, saying how far it got.
    fn stopped(&self, stop: Stop) -> ToolReturn {
        let who = &self.who;
        match stop {
            // A side's failure keeps its own kind; the message says which side.
            Stop::Side { outcome, stage } => {
                let mut o = *outcome;
                if let Some(e) = o.error.as_mut() {
                    e.message = format!(
                        "{who}: {stage} {}: {}",
                        side_name(self.plan, stage),
                        e.message
                    );
                }
                ToolReturn::from(o.with_helper("transfer", self.progress.helper(stage)))
            }
            Stop::Own {
                kind,
                message,
                stage,
            } => ToolReturn::from(
                Outcome::error(kind, format!("{who}: {message}"), false)
                    .with_helper("transfer", self.progress.helper(stage)),
            ),
        }
    }
}

fn side_name(plan: &Plan, stage: &str) -> &'static str {
    if stage == "source" {
        plan.source.name()
    } else {
        plan.target.name()
    }
}
