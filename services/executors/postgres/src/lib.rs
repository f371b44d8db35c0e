//! noetl-tool-postgres: the `postgres` tool kind.
//!
//! Fields: `command` (one or more SQL statements in a string, split at
//! top-level `;` outside quotes, dollar quotes and comments; or a list of
//! strings), `params` (a list bound to `$1`, `$2`... of a single
//! statement), `auth` (a keychain entry of kind `postgres_credential`:
//! `host` (default 127.0.0.1), `port` (5432), `user`, `password`,
//! `database`, `sslmode`, `sslrootcert`), or `connection:
//! postgresql://...` (or `key=value`), and `transaction` (default true: a
//! command of several statements runs in one transaction, so a retried
//! task never half-applies). `spec.timeout` is seconds or `{connect,
//! read}` (defaults 10 s and 60 s); on timeout the query is cancelled and
//! its connection discarded.
//!
//! Result of one statement: `{rows: [{column: value}...], row_count,
//! columns}` for a query and `{rows: [], row_count: <affected>, command}`
//! for a write. Several statements: `{statements: [...each...]}` plus the
//! last statement's `rows`, `row_count` and `columns` at the top. Values:
//! booleans, integers, floats and JSON as themselves; numeric as a number
//! up to 15 significant digits, else its exact text; uuid, date, time and
//! timestamps as text (RFC 3339); bytea as `\x<hex>`; arrays as lists.
//! Parameters are converted to the types PostgreSQL infers for them
//! (write `$1::text::<type>` for a type the tool cannot send).
//!
//! TLS follows libpq's `sslmode` (`disable`, `allow`, `prefer` (default),
//! `require`, `verify-ca`, `verify-full`) and `sslrootcert` (a PEM file,
//! inline PEM, or `system`; default the platform trust store): see [`tls`].
//!
//! Outcomes: `postgres.sql` with `outcome.pg = {code, sqlstate, message,
//! detail, constraint, table, schema}` (retryable for 40001, 40P01, 57P01,
//! 53300 and class 08); `postgres.connect` (retryable); `timeout`
//! (retryable); `postgres.config`. Connections are pooled per credential
//! (bounded, created lazily); messages name the credential and host, never
//! a password.

pub mod config;
pub mod convert;
pub mod tls;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use noetl_core::sql::StatementResult;
use noetl_core::tool::{Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::{json, Map, Value};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use config::{ConfigError, Target};

/// Replica-wide settings.
#[derive(Debug, Clone)]
pub struct PostgresLimits {
    /// Connections per credential.
    pub pool_size: usize,
}

impl Default for PostgresLimits {
    fn default() -> Self {
        Self { pool_size: 8 }
    }
}

/// A pool and the TLS connector its connections (and query
/// cancellations) use.
#[derive(Clone)]
struct Pooled {
    pool: Pool,
    tls: MakeRustlsConnect,
}

/// The `postgres` tool.
#[derive(Clone)]
pub struct PostgresTool {
    pools: Arc<Mutex<HashMap<String, Pooled>>>,
    limits: PostgresLimits,
}

impl std::fmt::Debug for PostgresTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresTool")
            .field("limits", &self.limits)
            .finish()
    }
}

impl Default for PostgresTool {
    fn default() -> Self {
        Self::new()
    }
}

impl PostgresTool {
    /// The tool with default limits.
    pub fn new() -> Self {
        Self::with_limits(PostgresLimits::default())
    }

    /// The tool with explicit limits.
    pub fn with_limits(limits: PostgresLimits) -> Self {
        Self {
            pools: Default::default(),
            limits,
        }
    }

    /// Pools open right now (one per credential in use).
    pub fn pools(&self) -> usize {
        self.pools.lock().expect("pools lock").len()
    }

    fn pool(&self, target: &Target, connect: Duration) -> Result<Pooled, String> {
        let mut g = self.pools.lock().expect("pools lock");
        if let Some(p) = g.get(&target.pool_key) {
            return Ok(p.clone());
        }
        let tls = tls::connector(&target.tls).map_err(|e| format!("{}: {e}", target.label))?;
        let mgr = Manager::from_config(
            target.config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(self.limits.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(connect))
            .create_timeout(Some(connect))
            .build()
            .map_err(|e| e.to_string())?;
        let pooled = Pooled { pool, tls };
        g.insert(target.pool_key.clone(), pooled.clone());
        Ok(pooled)
    }
}

impl Tool for PostgresTool {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        let tool = self.clone();
        Box::pin(async move { tool.run(call).await })
    }
}

/// Retryable SQLSTATEs.
pub fn retryable(code: &str) -> bool {
    matches!(code, "40001" | "40P01" | "57P01" | "53300") || code.starts_with("08")
}

impl PostgresTool {
    // Over 80 lines on purpose: one statement batch from connect to outcome (pool,
    // transaction, rows, error mapping).
    async fn run(&self, call: ToolCall) -> ToolReturn {
        let who = format!("postgres task {:?} of step {:?}", call.task, call.step);
        let config_error = |e: &dyn std::fmt::Display| {
            ToolReturn::from(Outcome::error(
                "postgres.config",
                format!("{who}: {e}"),
                false,
            ))
        };
        let (connect, read) = match config::timeouts(&call.spec) {
            Ok(t) => t,
            Err(e) => return config_error(&e),
        };
        let target = match config::target(&call.config, call.auth.as_ref(), connect) {
            Ok(t) => t,
            Err(e) => return config_error(&e),
        };
        let statements = match noetl_core::sql::command_statements(&call.config) {
            Ok(s) => s,
            Err(e) => return config_error(&e),
        };
        let params = match noetl_core::sql::command_params(&call.config, statements.len()) {
            Ok(p) => p,
            Err(e) => return config_error(&e),
        };
        let transaction = statements.len() > 1
            && !matches!(call.config.get("transaction"), Some(Value::Bool(false)));
        let pool = match self.pool(&target, connect) {
            Ok(p) => p,
            Err(e) => return config_error(&e),
        };
        let client = match pool.pool.get().await {
            Ok(c) => c,
            Err(e) => {
                let (code, msg) = match &e {
                    deadpool_postgres::PoolError::Backend(pe) => {
                        (pe.code().map(|c| c.code().to_string()), describe(pe))
                    }
                    deadpool_postgres::PoolError::Timeout(_) => (
                        None,
                        format!("no connection within {}s", connect.as_secs_f64()),
                    ),
                    other => (None, other.to_string()),
                };
                let mut o = Outcome::error(
                    "postgres.connect",
                    format!(
                        "{who}: cannot connect to {} (sslmode {}): {msg}",
                        target.label, target.tls.mode
                    ),
                    true,
                );
                if let Some(code) = code {
                    o = o.with_helper("pg", json!({"code": code, "sqlstate": code}));
                }
                return ToolReturn::from(o);
            }
        };
        let cancel = client.cancel_token();
        let work = run_statements(&client, &statements, &params, transaction);
        match tokio::time::timeout(read, work).await {
            Ok(Ok(results)) => ToolReturn::from(Outcome::ok(noetl_core::sql::combine(results))),
            Ok(Err((index, e))) => {
                if transaction {
                    let _ = client.batch_execute("ROLLBACK").await;
                }
                ToolReturn::from(sql_error(&who, &target, index, statements.len(), &e))
            }
            Err(_) => {
                let _ = cancel.cancel_query(pool.tls.clone()).await;
                // The connection may be mid-transaction: never reuse it.
                let _ = deadpool_postgres::Object::take(client);
                ToolReturn::from(Outcome::error(
                    "timeout",
                    format!(
                        "{who}: {} did not finish within {}s (cancelled)",
                        target.label,
                        read.as_secs_f64()
                    ),
                    true,
                ))
            }
        }
    }
}

/// Run every statement; `Err((index, error))` at the first failure.
async fn run_statements(
    client: &tokio_postgres::Client,
    statements: &[String],
    params: &[Value],
    transaction: bool,
) -> Result<Vec<StatementResult>, (usize, tokio_postgres::Error)> {
    if transaction {
        client.batch_execute("BEGIN").await.map_err(|e| (0, e))?;
    }
    let mut out = Vec::with_capacity(statements.len());
    for (i, sql) in statements.iter().enumerate() {
        let stmt = client.prepare(sql).await.map_err(|e| (i, e))?;
        let bound: Vec<convert::Param> = params.iter().cloned().map(convert::Param).collect();
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = bound
            .iter()
            .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        if stmt.columns().is_empty() {
            let n = client.execute(&stmt, &refs).await.map_err(|e| (i, e))?;
            out.push(StatementResult::count(sql, n));
        } else {
            let rows = client.query(&stmt, &refs).await.map_err(|e| (i, e))?;
            let columns: Vec<String> = stmt
                .columns()
                .iter()
                .map(|c| c.name().to_string())
                .collect();
            let mut list = Vec::with_capacity(rows.len());
            for row in &rows {
                let mut obj = Map::new();
                for (ci, name) in columns.iter().enumerate() {
                    let cell: convert::Cell = row.try_get(ci).map_err(|e| (i, e))?;
                    obj.insert(name.clone(), cell.0);
                }
                list.push(obj);
            }
            out.push(StatementResult::rows(columns, list));
        }
    }
    if transaction {
        client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| (statements.len().saturating_sub(1), e))?;
    }
    Ok(out)
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            // The Display of a connection error names the cause, never the
            // password.
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(x) = src {
                s = format!("{s}: {x}");
                src = x.source();
            }
            s
        }
    }
}

fn sql_error(
    who: &str,
    target: &Target,
    index: usize,
    total: usize,
    e: &tokio_postgres::Error,
) -> Outcome {
    let at = if total > 1 {
        format!(" (statement {} of {total})", index + 1)
    } else {
        String::new()
    };
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code().to_string();
            let mut o = Outcome::error(
                "postgres.sql",
                format!("{who}{at} on {}: {} [{code}]", target.label, db.message()),
                retryable(&code),
            );
            o = o.with_helper(
                "pg",
                json!({
                    "code": code,
                    "sqlstate": code,
                    "message": db.message(),
                    "detail": db.detail(),
                    "constraint": db.constraint(),
                    "table": db.table(),
                    "schema": db.schema(),
                }),
            );
            o
        }
        None => {
            let code = e.code().map(|c| c.code().to_string());
            let closed = e.is_closed();
            let mut o = Outcome::error(
                if closed {
                    "postgres.connect"
                } else {
                    "postgres.sql"
                },
                format!("{who}{at} on {}: {}", target.label, describe(e)),
                closed || code.as_deref().map(retryable).unwrap_or(false),
            );
            if let Some(code) = code {
                o = o.with_helper("pg", json!({"code": code, "sqlstate": code}));
            }
            o
        }
    }
}
