//! noetl-tool-duckdb: the `duckdb` tool kind — SQL over local files and
//! over results of earlier tasks.
//!
//! Fields: `command` (one or more statements, split like the postgres
//! tool's; or a list), `params` (a list bound to `?`/`$1` of a single
//! statement), `database` (a DuckDB file; default: a fresh in-memory
//! database per task), `tables` (an object `name: [ {row}... ]` registered
//! as temporary tables before the command runs, so `{{ fetch.rows }}` can
//! be queried; columns come from the rows' keys, typed by their first
//! non-null value). DuckDB reads local files itself:
//! `SELECT * FROM read_csv('data.csv')`. `spec.timeout` (seconds, default
//! 60).
//!
//! Result of one statement: `{rows, row_count, columns}` for a query,
//! `{rows: [], row_count: <affected>, command}` otherwise; several
//! statements: `{statements: [...]}` plus the last one's fields on top.
//! Values: numbers, booleans and text as themselves; decimals as numbers
//! (text beyond 15 significant digits); dates and timestamps as RFC 3339
//! text; blobs as `\x<hex>`.
//!
//! Outcomes: `duckdb.sql` (the message names the statement), `timeout`
//! (retryable), `duckdb.config`, and `duckdb.unavailable` when this build
//! has no DuckDB (the `engine` feature, on in the `noetl` binary unless it
//! is built with `--no-default-features`).

#[cfg(feature = "engine")]
mod engine;

use noetl_core::timeout::read_timeout;
use std::time::Duration;

use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::{Map, Value};

/// Default `spec.timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What a task asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Statements, in order.
    pub statements: Vec<String>,
    /// Parameters of a single statement.
    pub params: Vec<Value>,
    /// DuckDB file, or `None` for in-memory.
    pub database: Option<String>,
    /// Temporary tables to create from rows.
    pub tables: Vec<(String, Vec<Map<String, Value>>)>,
    /// Deadline.
    pub timeout: Duration,
}

/// Why a task's fields are wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `command` / `params` unusable.
    #[error(transparent)]
    Command(#[from] noetl_core::sql::CommandError),
    /// `tables` of the wrong shape.
    #[error("`tables.{0}` must be a list of row objects (e.g. `{{{{ fetch.rows }}}}`)")]
    Table(String),
    /// A table name that is not an identifier.
    #[error("table name {0:?} must be an identifier ([A-Za-z_][A-Za-z0-9_]*)")]
    TableName(String),
    /// `spec.timeout` unusable.
    #[error(transparent)]
    Timeout(#[from] noetl_core::timeout::TimeoutError),
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// Check a task's fields.
pub fn job(config: &Map<String, Value>, spec: &Value) -> Result<Job, ConfigError> {
    let statements = noetl_core::sql::command_statements(config)?;
    let params = noetl_core::sql::command_params(config, statements.len())?;
    let mut tables = Vec::new();
    if let Some(Value::Object(t)) = config.get("tables") {
        for (name, rows) in t {
            if !is_identifier(name) {
                return Err(ConfigError::TableName(name.clone()));
            }
            let Value::Array(rows) = rows else {
                return Err(ConfigError::Table(name.clone()));
            };
            let rows: Option<Vec<Map<String, Value>>> =
                rows.iter().map(|r| r.as_object().cloned()).collect();
            tables.push((
                name.clone(),
                rows.ok_or_else(|| ConfigError::Table(name.clone()))?,
            ));
        }
    }
    let timeout = read_timeout(spec, DEFAULT_TIMEOUT)?;
    Ok(Job {
        statements,
        params,
        database: config
            .get("database")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && *s != ":memory:")
            .map(str::to_string),
        tables,
        timeout,
    })
}

/// The `duckdb` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct DuckdbTool;

impl DuckdbTool {
    /// True when DuckDB is compiled into this build.
    pub const fn available() -> bool {
        cfg!(feature = "engine")
    }
}

impl Tool for DuckdbTool {
    fn kind(&self) -> &'static str {
        "duckdb"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        Box::pin(async move {
            let who = format!("duckdb task {:?} of step {:?}", call.task, call.step);
            let job = match job(&call.config, &call.spec) {
                Ok(j) => j,
                Err(e) => {
                    return ToolReturn::from(Outcome::error(
                        "duckdb.config",
                        format!("{who}: {e}"),
                        false,
                    ))
                }
            };
            run(who, job).await
        })
    }
}

#[cfg(feature = "engine")]
async fn run(who: String, job: Job) -> ToolReturn {
    let timeout = job.timeout;
    let handle: Slot = std::sync::Arc::new(std::sync::Mutex::new(None));
    let slot = handle.clone();
    let mut work = tokio::task::spawn_blocking(move || {
        engine::run(&job, |h| {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(h)
        })
    });
    let finished = tokio::time::timeout(timeout, &mut work).await;
    if finished.is_err() {
        // Now, and again until it is over (in the background).
        interrupt(&handle);
        tokio::spawn(async move { stop(&handle, &work).await });
    }
    match finished {
        Ok(Ok(Ok(result))) => ToolReturn::from(Outcome::ok(result)),
        Ok(Ok(Err(e))) => {
            ToolReturn::from(Outcome::error("duckdb.sql", format!("{who}: {e}"), false))
        }
        Ok(Err(e)) => {
            ToolReturn::from(Outcome::error("duckdb.panic", format!("{who}: {e}"), false))
        }
        Err(_) => ToolReturn::from(Outcome::error(
            "timeout",
            format!("{who}: did not finish within {}s", timeout.as_secs_f64()),
            true,
        )),
    }
}

/// Where the job's interrupt handle lands once its database is open.
#[cfg(feature = "engine")]
type Slot = std::sync::Arc<std::sync::Mutex<Option<std::sync::Arc<duckdb::InterruptHandle>>>>;

/// Stop a job past its deadline so its blocking thread is free again:
/// interrupt it until it is over. One interrupt is not enough: DuckDB
/// clears the flag when a statement starts, so an interrupt that lands
/// while the database opens, a table loads or between statements is lost.
#[cfg(feature = "engine")]
async fn stop<T>(handle: &Slot, work: &tokio::task::JoinHandle<T>) {
    while !work.is_finished() {
        interrupt(handle);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(feature = "engine")]
fn interrupt(handle: &Slot) {
    if let Some(h) = handle.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        h.interrupt();
    }
}

#[cfg(not(feature = "engine"))]
async fn run(who: String, _job: Job) -> ToolReturn {
    ToolReturn::from(Outcome::error(
        "duckdb.unavailable",
        format!(
            "{who}: this noetl was built without DuckDB (--no-default-features); rebuild it with DuckDB: `make build` (links DuckDB's prebuilt library), or `cargo build -p noetl-cli` (default features: compiles DuckDB, about 12 min the first time on 2 cores)"
        ),
        false,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_become_a_job() {
        let c = json!({"command": "create table t(a int); select * from t", "tables": {"pages": [{"a": 1}]}, "database": ":memory:"});
        let j = job(c.as_object().unwrap(), &json!({"timeout": 2})).unwrap();
        assert_eq!(j.statements.len(), 2);
        assert_eq!(j.tables[0].0, "pages");
        assert_eq!(j.database, None);
        assert_eq!(j.timeout, Duration::from_secs(2));
        let bad = json!({"command": "select 1", "tables": {"x y": []}});
        assert!(matches!(
            job(bad.as_object().unwrap(), &Value::Null),
            Err(ConfigError::TableName(_))
        ));
        let bad = json!({"command": "select 1; select 2", "params": [1]});
        assert!(job(bad.as_object().unwrap(), &Value::Null).is_err());
    }

    /// An interrupt that lands before the statement starts is lost (DuckDB
    /// clears it when the statement begins); `stop` still stops the job.
    #[cfg(feature = "engine")]
    #[tokio::test]
    async fn a_job_past_its_deadline_stops_even_when_its_first_interrupt_is_lost() {
        let job = Job {
            // 10^12 rows: hours of work unless interrupted.
            statements: vec![
                "select sum(a.range * b.range) from range(1000000) a, range(1000000) b".into(),
            ],
            params: vec![],
            database: None,
            tables: vec![],
            timeout: Duration::from_secs(1),
        };
        let handle: Slot = Default::default();
        let slot = handle.clone();
        let (opened, go) = std::sync::mpsc::channel::<()>();
        let work = tokio::task::spawn_blocking(move || {
            engine::run(&job, |h| {
                h.interrupt(); // before any statement: cleared when it starts
                *slot.lock().unwrap() = Some(h);
                opened.send(()).unwrap();
            })
        });
        go.recv().unwrap();
        tokio::time::timeout(Duration::from_secs(120), stop(&handle, &work))
            .await
            .expect("the job ran on past its interrupts");
        let err = work.await.unwrap().unwrap_err();
        assert!(err.to_lowercase().contains("interrupt"), "{err}");
    }
}
