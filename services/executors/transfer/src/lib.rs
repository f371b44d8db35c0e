//! noetl-tool-transfer: the `transfer` kind — rows from a SQL query
//! (PostgreSQL, DuckDB), an HTTP source returning JSON rows, or an object
//! of S3 or Google Cloud Storage, written in batches into a PostgreSQL or
//! DuckDB table, or whole into an object.
//!
//! Fields: `source` (`tool: postgres | duckdb | http | s3 | gcs`; `query`
//! and `auth` / `connection` / `database` for SQL; the http tool's fields,
//! `auth` and `data_path` for HTTP; `url`, `format`, `auth`, `region`,
//! `endpoint` for an object), `target` (`tool: postgres | duckdb | s3 |
//! gcs`, `table`, `auth` / `connection` / `database`, `key` for upserts;
//! an object's fields), `mapping` (target column → source field, dotted;
//! on the task or the target), `chunk_size` (rows per batch, default
//! 1000), `mode` (`insert` / `append`, `upsert`, `replace`). NoETL's
//! `type:` / `kind:` for `tool:` are read too.
//!
//! Each SQL or HTTP side runs through the kind's own tool (the postgres
//! tool's pools, TLS and value conversion; the duckdb tool; the http tool's
//! clients), so a side fails with that tool's outcome (`postgres.sql`,
//! `http.status`, `timeout`...) and `outcome.transfer = {stage, rows_read,
//! rows_written, batches}` says how far it got. Each batch is one `INSERT`
//! statement (atomic on its own); `spec.timeout` bounds each call. An
//! object side is read or written through `noetl_mesh::remote`, with the
//! keychain entry its `auth` names, as a `script` from `s3://` / `gs://` is
//! read; its failures are `transfer.object`.
//!
//! Result: `{rows_read, rows_written, batches, columns, source_type,
//! target_type, direction, target_table, mode}` (`source_url`,
//! `target_url` and `format` for object sides), plus NoETL's names
//! `rows_transferred` and `chunks_processed`.

pub mod object;
pub mod plan;

use std::sync::Arc;

use noetl_core::tool::{AuthCredential, Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::{json, Map, Value};

pub use plan::{ConfigError, Format, Mode, ObjectSide, Plan, SourceKind, TargetKind};

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
        if let Some(o) = &self.plan.target_object {
            // Written whole, even without rows: the object says so.
            self.write_object(o, &rows, &layout).await?;
            return Ok(layout.columns);
        }
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
        if let Some(o) = &plan.source_object {
            return self.read_object(o).await;
        }
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

    /// The rows of the source's object.
    async fn read_object(&self, o: &plan::ObjectSide) -> Result<(plan::Rows, Vec<String>), Stop> {
        let cred = self.call.nested_auth.get("source").map(|a| &a.data);
        let read = noetl_mesh::remote::read_object(
            &o.url,
            cred,
            o.region.as_deref(),
            o.endpoint.as_deref(),
            object::MAX_OBJECT_BYTES,
        );
        let bytes = self
            .within("source", "read", read)
            .await?
            .map_err(|e| object_stop(e, "source"))?;
        object::rows_from(o.format, &bytes, self.plan.data_path.as_deref()).map_err(|e| Stop::Own {
            kind: "transfer.source",
            message: format!("source {}: {e}", o.url),
            stage: "source",
        })
    }

    /// Write every row into the target's object, whole.
    async fn write_object(
        &mut self,
        o: &plan::ObjectSide,
        rows: &[Map<String, Value>],
        layout: &plan::Layout,
    ) -> Result<(), Stop> {
        let bytes = object::object_bytes(o.format, layout, rows);
        let cred = self.call.nested_auth.get("target").map(|a| &a.data);
        let write = noetl_mesh::remote::write_object(
            &o.url,
            cred,
            o.region.as_deref(),
            o.endpoint.as_deref(),
            bytes,
            Some(o.format.content_type()),
        );
        self.within("target", "write", write)
            .await?
            .map_err(|e| object_stop(e, "target"))?;
        self.progress.batches = 1;
        self.progress.rows_written = rows.len() as u64;
        Ok(())
    }

    /// `fut` within the task's `spec.timeout` (default 300 s).
    async fn within<T>(
        &self,
        stage: &'static str,
        what: &str,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T, Stop> {
        let limit = noetl_core::timeout::read_timeout(&self.call.spec, OBJECT_TIMEOUT)
            .unwrap_or(OBJECT_TIMEOUT);
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| Stop::Own {
                kind: "timeout",
                message: format!(
                    "{stage}: the object {what} did not finish within {}s",
                    limit.as_secs_f64()
                ),
                stage,
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
            // An object is replaced whole when written.
            TargetKind::S3 | TargetKind::Gcs => return Ok(()),
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
        let mut result = json!({
            "rows_read": progress.rows_read,
            "rows_written": progress.rows_written,
            "batches": progress.batches,
            "rows_transferred": progress.rows_written,
            "chunks_processed": progress.batches,
            "columns": columns,
            "source_type": plan.source.name(),
            "target_type": plan.target.name(),
            "direction": format!("{}_to_{}", plan.source.name(), plan.target.name()),
            "target_table": if plan.target_object.is_some() { Value::Null } else { Value::String(plan.table.clone()) },
            "mode": plan.mode.name(),
        });
        for (name, o) in [
            ("source", &plan.source_object),
            ("target", &plan.target_object),
        ] {
            if let (Some(o), Some(r)) = (o, result.as_object_mut()) {
                r.insert(format!("{name}_url"), Value::String(o.url.clone()));
                r.insert(
                    format!("{name}_format"),
                    Value::String(o.format.name().into()),
                );
            }
        }
        result
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

/// Bound on one object read or write when `spec.timeout` gives none.
const OBJECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// A failed object read or write: a URL or credential the store cannot
/// use is `transfer.config`; anything the store answered is
/// `transfer.object`. The message names the URL, never a credential.
fn object_stop(e: noetl_mesh::remote::RemoteError, stage: &'static str) -> Stop {
    use noetl_mesh::remote::RemoteError;
    let kind = match e {
        RemoteError::Url { .. } | RemoteError::Config { .. } => "transfer.config",
        RemoteError::Store { .. } | RemoteError::TooLarge { .. } => "transfer.object",
    };
    Stop::Own {
        kind,
        message: format!("{stage}: {e}"),
        stage,
    }
}

fn side_name(plan: &Plan, stage: &str) -> &'static str {
    if stage == "source" {
        plan.source.name()
    } else {
        plan.target.name()
    }
}
