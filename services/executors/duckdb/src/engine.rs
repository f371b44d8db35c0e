//! Running a job on DuckDB (blocking; called on a blocking thread).

use std::sync::Arc;

use duckdb::types::{TimeUnit, Value as Db};
use duckdb::{Connection, InterruptHandle};
use noetl_core::sql::{combine, StatementResult};
use serde_json::{json, Map, Value};

use crate::Job;

/// Run every statement; the error names the statement that failed.
/// `on_open` receives the connection's interrupt handle as soon as the
/// database is open, so a caller past its deadline can stop the query
/// instead of leaving it to run on.
pub fn run(job: &Job, on_open: impl FnOnce(Arc<InterruptHandle>)) -> Result<Value, String> {
    let conn = match &job.database {
        Some(path) => Connection::open(path).map_err(|e| format!("cannot open {path:?}: {e}"))?,
        None => Connection::open_in_memory().map_err(|e| e.to_string())?,
    };
    on_open(conn.interrupt_handle());
    for (name, rows) in &job.tables {
        register(&conn, name, rows).map_err(|e| format!("table `{name}`: {e}"))?;
    }
    let total = job.statements.len();
    let mut results = Vec::with_capacity(total);
    for (i, sql) in job.statements.iter().enumerate() {
        let at = if total > 1 {
            format!("statement {} of {total}: ", i + 1)
        } else {
            String::new()
        };
        let r = statement(&conn, sql, &job.params).map_err(|e| format!("{at}{e}"))?;
        results.push(r);
    }
    Ok(combine(results))
}

fn is_query(sql: &str) -> bool {
    let words: Vec<String> = sql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    let first = words.first().map(String::as_str).unwrap_or("");
    match first {
        "SELECT" | "WITH" | "VALUES" | "FROM" | "SHOW" | "DESCRIBE" | "PRAGMA" | "EXPLAIN"
        | "SUMMARIZE" | "TABLE" | "CALL" | "PIVOT" | "UNPIVOT" => true,
        // Writes answer with rows only when they say what to return.
        "INSERT" | "UPDATE" | "DELETE" | "MERGE" => words.iter().any(|w| w == "RETURNING"),
        _ => false,
    }
}

fn to_db(v: &Value) -> Db {
    match v {
        Value::Null => Db::Null,
        Value::Bool(b) => Db::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Db::BigInt(i),
            None => Db::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Db::Text(s.clone()),
        other => Db::Text(other.to_string()),
    }
}

fn statement(conn: &Connection, sql: &str, params: &[Value]) -> Result<StatementResult, String> {
    let mut stmt = conn.prepare(sql).map_err(|e| e.to_string())?;
    let values: Vec<Db> = params.iter().map(to_db).collect();
    if !is_query(sql) {
        let n = stmt
            .execute(duckdb::params_from_iter(values.iter()))
            .map_err(|e| e.to_string())?;
        return Ok(StatementResult::count(sql, n as u64));
    }
    let mut rows = stmt
        .query(duckdb::params_from_iter(values.iter()))
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut columns: Vec<String> = Vec::new();
    while let Some(row) = rows.next().map_err(|e| e.to_string())? {
        if columns.is_empty() {
            columns = row.as_ref().column_names();
        }
        let mut obj = Map::new();
        for (i, name) in columns.iter().enumerate() {
            let v: Db = row.get(i).map_err(|e| e.to_string())?;
            obj.insert(name.clone(), to_json(v));
        }
        out.push(obj);
    }
    Ok(StatementResult::rows(columns, out))
}

fn micros(unit: TimeUnit, v: i64) -> i128 {
    match unit {
        TimeUnit::Second => v as i128 * 1_000_000,
        TimeUnit::Millisecond => v as i128 * 1_000,
        TimeUnit::Microsecond => v as i128,
        TimeUnit::Nanosecond => v as i128 / 1_000,
    }
}

fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(f.to_string()))
}

fn to_json(v: Db) -> Value {
    match v {
        Db::Null => Value::Null,
        Db::Boolean(b) => Value::Bool(b),
        Db::TinyInt(i) => json!(i),
        Db::SmallInt(i) => json!(i),
        Db::Int(i) => json!(i),
        Db::BigInt(i) => json!(i),
        Db::HugeInt(i) => match i64::try_from(i) {
            Ok(x) => json!(x),
            Err(_) => Value::String(i.to_string()),
        },
        Db::UTinyInt(i) => json!(i),
        Db::USmallInt(i) => json!(i),
        Db::UInt(i) => json!(i),
        Db::UBigInt(i) => json!(i),
        Db::Float(f) => float(f as f64),
        Db::Double(f) => float(f),
        Db::Decimal(d) => {
            let text = d.to_string();
            let significant = text.chars().filter(char::is_ascii_digit).count();
            match text.parse::<f64>() {
                Ok(f) if significant <= 15 => float(f),
                _ => Value::String(text),
            }
        }
        Db::Timestamp(unit, v) => {
            let us = micros(unit, v);
            time::OffsetDateTime::from_unix_timestamp_nanos(us * 1_000)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .map(Value::String)
                .unwrap_or(Value::Null)
        }
        Db::Date32(days) => time::Date::from_julian_day(2_440_588 + days)
            .map(|d| Value::String(d.to_string()))
            .unwrap_or(Value::Null),
        Db::Time64(unit, v) => {
            let us = micros(unit, v) as i64;
            let t = time::Time::MIDNIGHT + time::Duration::microseconds(us);
            Value::String(t.to_string())
        }
        Db::Text(s) => Value::String(s),
        Db::Blob(b) => Value::String(format!("\\x{}", hex::encode(b))),
        Db::List(items) => Value::Array(items.into_iter().map(to_json).collect()),
        other => Value::String(format!("{other:?}")),
    }
}

/// Create a temporary table from row objects: columns from the union of
/// keys (in first-seen order), typed by their first non-null value.
fn register(conn: &Connection, name: &str, rows: &[Map<String, Value>]) -> Result<(), String> {
    let mut columns: Vec<(String, &'static str)> = Vec::new();
    for row in rows {
        for (k, v) in row {
            let ty = match v {
                Value::Null => continue,
                Value::Bool(_) => "BOOLEAN",
                Value::Number(n) if n.is_i64() => "BIGINT",
                Value::Number(_) => "DOUBLE",
                Value::String(_) => "VARCHAR",
                _ => "JSON_TEXT",
            };
            match columns.iter_mut().find(|(c, _)| c == k) {
                Some((_, t)) if *t == "BIGINT" && ty == "DOUBLE" => *t = "DOUBLE",
                Some(_) => {}
                None => columns.push((k.clone(), ty)),
            }
        }
    }
    for row in rows {
        for k in row.keys() {
            if !columns.iter().any(|(c, _)| c == k) {
                columns.push((k.clone(), "VARCHAR"));
            }
        }
    }
    if columns.is_empty() {
        columns.push(("value".into(), "VARCHAR"));
    }
    let quote = |c: &str| format!("\"{}\"", c.replace('"', "\"\""));
    let defs: Vec<String> = columns
        .iter()
        .map(|(c, t)| {
            let t = if *t == "JSON_TEXT" { "VARCHAR" } else { t };
            format!("{} {t}", quote(c))
        })
        .collect();
    conn.execute_batch(&format!("CREATE TEMP TABLE {name} ({})", defs.join(", ")))
        .map_err(|e| e.to_string())?;
    let marks = vec!["?"; columns.len()].join(", ");
    let mut insert = conn
        .prepare(&format!("INSERT INTO {name} VALUES ({marks})"))
        .map_err(|e| e.to_string())?;
    for row in rows {
        let values: Vec<Db> = columns
            .iter()
            .map(|(c, _)| row.get(c).map(to_db).unwrap_or(Db::Null))
            .collect();
        insert
            .execute(duckdb::params_from_iter(values.iter()))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_that_return_rows_are_told_from_writes() {
        for q in [
            "select 1",
            "  (SELECT 1)",
            "with t as (select 1) select * from t",
            "from 'x.csv'",
            "call pragma_version()",
            "pivot t on k using sum(v)",
            "insert into t values (1) returning id",
            "delete from t where id = 1 RETURNING *",
        ] {
            assert!(is_query(q), "{q}");
        }
        for w in [
            "insert into t values (1)",
            "update t set returning_count = 1",
            "create table t (id int)",
            "copy t to 'out.parquet'",
        ] {
            assert!(!is_query(w), "{w}");
        }
    }
}
