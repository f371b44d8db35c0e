//! A transfer task's fields → what to read, how to map it and what to
//! write; the SQL of each batch. Plain functions, unit-tested here.

use serde_json::{Map, Value};

pub use noetl_core::transfer::{Format, ObjectSide, SideError, SourceKind, TargetKind};

/// Default rows per batch (`chunk_size`).
pub const DEFAULT_CHUNK: usize = 1000;
/// Most parameters PostgreSQL binds to one statement.
pub const PG_MAX_PARAMS: usize = 65_535;

/// Why a task's fields are wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `source` / `target` missing or not a mapping.
    #[error("`{0}` is required: a mapping with `tool` and its fields")]
    Side(&'static str),
    /// A side's tool, or an object side's fields (the checks `noetl
    /// validate` makes too).
    #[error(transparent)]
    Sides(#[from] SideError),
    /// A field the side needs.
    #[error("`{0}` is required")]
    Missing(&'static str),
    /// A field of the wrong shape.
    #[error("`{field}` {problem}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

/// How rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `INSERT` (NoETL's `append`, the default).
    Insert,
    /// `INSERT ... ON CONFLICT (key) DO UPDATE`.
    Upsert,
    /// Empty the table first, then insert.
    Replace,
}

impl Mode {
    /// The mode's name in results.
    pub fn name(self) -> &'static str {
        match self {
            Self::Insert => "insert",
            Self::Upsert => "upsert",
            Self::Replace => "replace",
        }
    }
}

/// What a transfer task asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Source tool.
    pub source: SourceKind,
    /// The fields handed to the source tool (`command` for SQL; the http
    /// fields), without `auth` (resolved by the executor).
    pub source_config: Map<String, Value>,
    /// Dotted path to the rows inside an HTTP response's JSON (or a JSON
    /// object's).
    pub data_path: Option<String>,
    /// The object an `s3` / `gcs` source reads (set exactly for those).
    pub source_object: Option<ObjectSide>,
    /// Target tool.
    pub target: TargetKind,
    /// Fields handed to the target tool besides `command` / `params`
    /// (`connection`, `database`).
    pub target_config: Map<String, Value>,
    /// Target table (`name` or `schema.name`); empty for an object target.
    pub table: String,
    /// The object an `s3` / `gcs` target writes (set exactly for those).
    pub target_object: Option<ObjectSide>,
    /// Target column → source field (a dotted path); empty: every source
    /// column under its own name.
    pub mapping: Vec<(String, String)>,
    /// Conflict columns of an upsert (default: the first column).
    pub key: Vec<String>,
    /// Rows per batch.
    pub chunk_size: usize,
    /// Insert, upsert or replace.
    pub mode: Mode,
}

fn str_list(v: &Value, field: &'static str) -> Result<Vec<String>, ConfigError> {
    match v {
        Value::String(s) => Ok(s
            .split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect()),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or(ConfigError::Field {
                    field,
                    problem: "must be a column name or a list of them".into(),
                })
            })
            .collect(),
        _ => Err(ConfigError::Field {
            field,
            problem: "must be a column name or a list of them".into(),
        }),
    }
}

/// Whether `s` is a table name this tool writes to (shared with
/// `noetl validate`).
pub use noetl_core::transfer::is_table_name;

fn mapping(v: Option<&Value>) -> Result<Vec<(String, String)>, ConfigError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(col, src)| match src {
                Value::String(s) if !s.trim().is_empty() => Ok((col.clone(), s.trim().to_string())),
                _ => Err(ConfigError::Field {
                    field: "mapping",
                    problem: format!("`{col}` must name a source field (a string)"),
                }),
            })
            .collect(),
        Some(_) => Err(ConfigError::Field {
            field: "mapping",
            problem: "must be a mapping of target column → source field".into(),
        }),
    }
}

/// Check a transfer task's fields.
pub fn plan(config: &Map<String, Value>) -> Result<Plan, ConfigError> {
    let side = |name: &'static str| match config.get(name) {
        Some(Value::Object(m)) => Ok(m),
        _ => Err(ConfigError::Side(name)),
    };
    let src = side("source")?;
    let tgt = side("target")?;
    let source = noetl_core::transfer::source_kind(src)?;
    let target = noetl_core::transfer::target_kind(tgt)?;
    let (source_config, data_path, source_object) = match source.store() {
        Some(store) => {
            let o = noetl_core::transfer::object_side("source", store, src, true)?;
            (Map::new(), o.data_path.clone(), Some(o))
        }
        None => {
            let (c, p) = source_fields(source, src)?;
            (c, p, None)
        }
    };
    let (table, target_config, target_object) = match target.store() {
        Some(store) => {
            let o = noetl_core::transfer::object_side("target", store, tgt, true)?;
            if let Some(m) = config.get("mode").and_then(Value::as_str) {
                noetl_core::transfer::object_mode(m, target.name())?;
            }
            (String::new(), Map::new(), Some(o))
        }
        None => (target_table(tgt)?, target_fields(target, tgt)?, None),
    };
    let mapping = match (config.get("mapping"), tgt.get("mapping")) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Field {
                field: "mapping",
                problem: "is given twice (task and target); keep one".into(),
            })
        }
        (m, None) | (None, m) => mapping(m)?,
    };
    let chunk_size = chunk_size(config.get("chunk_size"))?;
    let mode = mode(config.get("mode"))?;
    let key = match tgt.get("key").or_else(|| config.get("key")) {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => str_list(v, "target.key")?,
    };
    Ok(Plan {
        source,
        source_config,
        data_path,
        source_object,
        target,
        target_config,
        table,
        target_object,
        mapping,
        key,
        chunk_size,
        mode,
    })
}

/// The fields handed to the source tool, and an HTTP source's `data_path`.
fn source_fields(
    source: SourceKind,
    src: &Map<String, Value>,
) -> Result<(Map<String, Value>, Option<String>), ConfigError> {
    let mut source_config = Map::new();
    let mut data_path = None;
    match source {
        SourceKind::Http => {
            for (k, v) in src {
                match k.as_str() {
                    "tool" | "kind" | "type" | "auth" => {}
                    "data_path" => data_path = v.as_str().map(str::to_string),
                    _ => {
                        source_config.insert(k.clone(), v.clone());
                    }
                }
            }
            if !source_config.contains_key("url") {
                return Err(ConfigError::Missing("source.url"));
            }
        }
        // Object sources are read by the transfer tool itself (`plan`).
        SourceKind::Postgres | SourceKind::Duckdb | SourceKind::S3 | SourceKind::Gcs => {
            let query = src
                .get("query")
                .or_else(|| src.get("command"))
                .ok_or(ConfigError::Missing("source.query"))?;
            source_config.insert("command".into(), query.clone());
            for k in ["connection", "database", "params"] {
                if let Some(v) = src.get(k) {
                    source_config.insert(k.into(), v.clone());
                }
            }
        }
    }
    Ok((source_config, data_path))
}

/// `target.table`, checked.
fn target_table(tgt: &Map<String, Value>) -> Result<String, ConfigError> {
    let table = tgt
        .get("table")
        .and_then(Value::as_str)
        .map(str::trim)
        .ok_or(ConfigError::Missing("target.table"))?
        .to_string();
    if !is_table_name(&table) {
        return Err(ConfigError::Field {
            field: "target.table",
            problem: format!("{table:?} must be a table name (`name` or `schema.name`)"),
        });
    }
    Ok(table)
}

/// The fields handed to the target tool besides `command` / `params`.
fn target_fields(
    target: TargetKind,
    tgt: &Map<String, Value>,
) -> Result<Map<String, Value>, ConfigError> {
    let mut target_config = Map::new();
    for k in ["connection", "database"] {
        if let Some(v) = tgt.get(k) {
            target_config.insert(k.into(), v.clone());
        }
    }
    if target == TargetKind::Duckdb && !target_config.contains_key("database") {
        return Err(ConfigError::Missing("target.database"));
    }
    Ok(target_config)
}

/// `chunk_size`: a positive number of rows (default [`DEFAULT_CHUNK`]).
fn chunk_size(v: Option<&Value>) -> Result<usize, ConfigError> {
    match v {
        None | Some(Value::Null) => Ok(DEFAULT_CHUNK),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .filter(|n| *n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| ConfigError::Field {
                field: "chunk_size",
                problem: format!("must be a positive number of rows, got {v}"),
            }),
    }
}

/// `mode`, NoETL's names included (default insert).
fn mode(v: Option<&Value>) -> Result<Mode, ConfigError> {
    match v.and_then(Value::as_str).map(str::trim) {
        None | Some("insert" | "append") => Ok(Mode::Insert),
        Some("upsert") => Ok(Mode::Upsert),
        Some("replace" | "overwrite") => Ok(Mode::Replace),
        Some(other) => Err(ConfigError::Field {
            field: "mode",
            problem: format!("must be insert (append), upsert or replace, got {other:?}"),
        }),
    }
}

/// What each batch writes, once the source's columns are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Target column → source field (dotted).
    pub mapping: Vec<(String, String)>,
    /// Target columns, in order.
    pub columns: Vec<String>,
    /// Conflict columns of an upsert (default: the first column).
    pub key: Vec<String>,
    /// Positions of `key` among `columns`.
    pub key_index: Vec<usize>,
}

/// The columns a transfer writes: the plan's mapping, else every source
/// column under its own name. An upsert's key must be among them.
pub fn layout(plan: &Plan, source_columns: &[String]) -> Result<Layout, ConfigError> {
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
        return Err(ConfigError::Field {
            field: "target.key",
            problem: format!("{key:?} must be among the columns written {columns:?}"),
        });
    }
    Ok(Layout {
        mapping,
        columns,
        key,
        key_index,
    })
}

/// The target tool's fields for one batch of rows: the plan's target fields
/// plus the batch's `INSERT` as `command` and its values as `params`.
pub fn batch_config(
    plan: &Plan,
    layout: &Layout,
    chunk: &[Map<String, Value>],
) -> Map<String, Value> {
    let mut values: Vec<Vec<Value>> = chunk
        .iter()
        .map(|r| layout.mapping.iter().map(|(_, src)| pick(r, src)).collect())
        .collect();
    if plan.mode == Mode::Upsert {
        values = last_per_key(values, &layout.key_index);
    }
    let sql = insert_sql(&BatchSql {
        target: plan.target,
        table: &plan.table,
        columns: &layout.columns,
        rows: values.len(),
        mode: plan.mode,
        key: &layout.key,
    });
    let mut config = plan.target_config.clone();
    config.insert("command".into(), Value::String(sql));
    config.insert(
        "params".into(),
        Value::Array(values.into_iter().flatten().collect()),
    );
    config
}

/// Rows read from a source, as objects.
pub type Rows = Vec<Map<String, Value>>;

/// The rows in a source tool's result: a SQL result's `rows` (and
/// `columns`), or the JSON of an HTTP response (`data`) at `data_path`; a
/// single object is one row. Columns: the SQL result's, else every key in
/// first-seen order.
pub fn rows_of(
    source: SourceKind,
    result: &Value,
    data_path: Option<&str>,
) -> Result<(Rows, Vec<String>), String> {
    let at = match source {
        SourceKind::Http => result.get("data").cloned().unwrap_or(Value::Null),
        _ => result.get("rows").cloned().unwrap_or(Value::Array(vec![])),
    };
    let columns: Vec<String> = result
        .get("columns")
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    rows_in(at, data_path, columns)
}

/// The rows in a JSON value at `data_path` (an array of objects; a single
/// object is one row; `null` none), and their columns: `columns` when
/// given, else every key in first-seen order.
pub fn rows_in(
    mut at: Value,
    data_path: Option<&str>,
    mut columns: Vec<String>,
) -> Result<(Rows, Vec<String>), String> {
    if let Some(path) = data_path.filter(|p| !p.is_empty()) {
        for part in path.split('.') {
            at = match at {
                Value::Object(mut m) => m
                    .remove(part)
                    .ok_or_else(|| format!("the response has no `{path}` (at `{part}`)"))?,
                Value::Array(_) => break,
                other => {
                    return Err(format!(
                        "`{path}` does not lead to rows: `{part}` is inside {}",
                        noetl_core::json_type(&other)
                    ))
                }
            };
        }
    }
    let items = match at {
        Value::Array(a) => a,
        Value::Null => Vec::new(),
        other => vec![other],
    };
    let mut rows = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Value::Object(m) => rows.push(m),
            other => {
                return Err(format!(
                    "row {} is {}, not an object",
                    i + 1,
                    noetl_core::json_type(&other)
                ))
            }
        }
    }
    if columns.is_empty() {
        for r in &rows {
            for k in r.keys() {
                if !columns.contains(k) {
                    columns.push(k.clone());
                }
            }
        }
    }
    Ok((rows, columns))
}

/// A field of a row by dotted path (`user.id`); `null` when absent.
pub fn pick(row: &Map<String, Value>, path: &str) -> Value {
    if let Some(v) = row.get(path) {
        return v.clone();
    }
    let mut parts = path.split('.');
    let mut at = parts.next().and_then(|p| row.get(p));
    for p in parts {
        at = at.and_then(|v| v.get(p));
    }
    at.cloned().unwrap_or(Value::Null)
}

fn quote(c: &str) -> String {
    format!("\"{}\"", c.replace('"', "\"\""))
}

/// What one batch's statement needs.
pub struct BatchSql<'a> {
    /// Target tool.
    pub target: TargetKind,
    /// Table name.
    pub table: &'a str,
    /// Target columns.
    pub columns: &'a [String],
    /// Rows in the batch.
    pub rows: usize,
    /// Insert or upsert.
    pub mode: Mode,
    /// Conflict columns of an upsert.
    pub key: &'a [String],
}

/// The `INSERT` of one batch: placeholders `$n` (PostgreSQL) or `?`
/// (DuckDB), row after row.
pub fn insert_sql(b: &BatchSql<'_>) -> String {
    let cols: Vec<String> = b.columns.iter().map(|c| quote(c)).collect();
    let n = b.columns.len();
    let mut values = Vec::with_capacity(b.rows);
    for r in 0..b.rows {
        let marks: Vec<String> = (0..n)
            .map(|c| match b.target {
                TargetKind::Postgres => format!("${}", r * n + c + 1),
                _ => "?".into(),
            })
            .collect();
        values.push(format!("({})", marks.join(", ")));
    }
    let mut sql = format!(
        "INSERT INTO {} ({}) VALUES {}",
        b.table,
        cols.join(", "),
        values.join(", ")
    );
    if b.mode == Mode::Upsert {
        let keys: Vec<String> = b.key.iter().map(|c| quote(c)).collect();
        let updates: Vec<String> = b
            .columns
            .iter()
            .filter(|c| !b.key.contains(c))
            .map(|c| format!("{} = EXCLUDED.{}", quote(c), quote(c)))
            .collect();
        if updates.is_empty() {
            sql.push_str(&format!(" ON CONFLICT ({}) DO NOTHING", keys.join(", ")));
        } else {
            sql.push_str(&format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                keys.join(", "),
                updates.join(", ")
            ));
        }
    }
    sql
}

/// Rows per statement: `chunk_size`, but never more parameters than
/// PostgreSQL binds to one statement.
pub fn rows_per_batch(target: TargetKind, chunk_size: usize, columns: usize) -> usize {
    match target {
        TargetKind::Postgres => chunk_size.min(PG_MAX_PARAMS / columns.max(1)).max(1),
        TargetKind::Duckdb | TargetKind::S3 | TargetKind::Gcs => chunk_size.max(1),
    }
}

/// An upsert's rows with one row per key, the last one winning (one
/// statement may not update a row twice).
pub fn last_per_key(rows: Vec<Vec<Value>>, key_index: &[usize]) -> Vec<Vec<Value>> {
    let mut seen: Vec<Vec<Value>> = Vec::new();
    let mut out: Vec<Vec<Value>> = Vec::new();
    for row in rows.into_iter().rev() {
        let k: Vec<Value> = key_index.iter().map(|i| row[*i].clone()).collect();
        if !seen.contains(&k) {
            seen.push(k);
            out.push(row);
        }
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value) -> Result<Plan, ConfigError> {
        plan(v.as_object().unwrap())
    }

    #[test]
    fn noetl_fields_become_a_plan() {
        let pl = p(json!({
            "source": {"type": "http", "url": "http://x/posts", "method": "GET", "data_path": "data.items", "auth": "api"},
            "target": {"type": "postgres", "auth": "pg", "table": "public.posts",
                       "mapping": {"post_id": "id", "user_id": "userId"}},
            "chunk_size": 2, "mode": "append"
        }))
        .unwrap();
        assert_eq!(pl.source, SourceKind::Http);
        assert_eq!(pl.data_path.as_deref(), Some("data.items"));
        assert!(!pl.source_config.contains_key("auth"));
        assert_eq!(pl.mapping[0], ("post_id".into(), "id".into()));
        assert_eq!((pl.chunk_size, pl.mode), (2, Mode::Insert));
        let pl = p(json!({"source": {"tool": "postgres", "query": "select 1"},
                          "target": {"tool": "duckdb", "database": "/tmp/x.db", "table": "t", "key": ["a", "b"]},
                          "mode": "upsert"}))
        .unwrap();
        assert_eq!(pl.source_config["command"], "select 1");
        assert_eq!(pl.key, ["a", "b"]);
    }

    #[test]
    fn wrong_fields_are_named() {
        let e = p(json!({"source": {"tool": "snowflake", "query": "q"}, "target": {"tool": "postgres", "table": "t"}}))
            .unwrap_err();
        assert!(e.to_string().contains("`source.tool`") && e.to_string().contains("snowflake"));
        let e = p(json!({"source": {"tool": "http", "url": "u"}, "target": {"tool": "postgres", "table": "t; drop table x"}}))
            .unwrap_err();
        assert!(e.to_string().contains("target.table"), "{e}");
        let e = p(json!({"source": {"tool": "http", "url": "u"}, "target": {"tool": "duckdb", "table": "t"}}))
            .unwrap_err();
        assert_eq!(e, ConfigError::Missing("target.database"));
        let e = p(json!({"source": {"tool": "http", "url": "u"}, "target": {"tool": "postgres", "table": "t"}, "mode": "merge"}))
            .unwrap_err();
        assert!(e.to_string().contains("merge"));
        assert!(p(json!({"target": {}})).is_err());
    }

    #[test]
    fn object_sides_become_a_plan() {
        let pl = p(json!({
            "source": {"tool": "postgres", "query": "select 1"},
            "target": {"tool": "s3", "url": "s3://b/out/rows.csv", "auth": "s3_main",
                       "endpoint": "http://h:1", "mapping": {"a": "b"}}
        }))
        .unwrap();
        assert_eq!(pl.target, TargetKind::S3);
        let o = pl.target_object.as_ref().unwrap();
        assert_eq!(
            (o.format, o.endpoint.as_deref()),
            (Format::Csv, Some("http://h:1"))
        );
        assert!(pl.table.is_empty() && pl.target_config.is_empty());
        assert_eq!(pl.mapping, [("a".to_string(), "b".to_string())]);
        let pl = p(json!({
            "source": {"type": "gcs", "uri": "gs://b/in.json", "data_path": "data"},
            "target": {"tool": "postgres", "table": "t"}, "mode": "upsert"
        }))
        .unwrap();
        assert_eq!(
            (pl.source, pl.data_path.as_deref()),
            (SourceKind::Gcs, Some("data"))
        );
        assert!(pl.source_config.is_empty() && pl.target_object.is_none());
        assert_eq!(pl.source_object.unwrap().url, "gs://b/in.json");
    }

    #[test]
    fn wrong_object_sides_are_refused_naming_the_field() {
        let field = |v: Value| match p(v).unwrap_err() {
            ConfigError::Sides(e) => (e.field(), e.to_string()),
            other => panic!("{other}"),
        };
        let sql = json!({"tool": "postgres", "query": "q"});
        let (f, m) = field(
            json!({"source": sql, "target": {"tool": "gcs", "url": "gs://b/x.jsonl"}, "mode": "upsert"}),
        );
        assert_eq!(f, "mode");
        assert!(m.contains("upsert cannot merge rows into an object"), "{m}");
        let (f, m) = field(
            json!({"source": {"tool": "s3", "url": "gs://b/x.jsonl"}, "target": {"tool": "postgres", "table": "t"}}),
        );
        assert_eq!(f, "source.url");
        assert!(
            m.contains("\"gs://b/x.jsonl\" is not an object of source `s3`"),
            "{m}"
        );
        let (f, _) = field(json!({"source": sql, "target": {"tool": "s3", "url": "s3://b/x"}}));
        assert_eq!(f, "target.format");
        let (f, m) = field(
            json!({"source": sql, "target": {"tool": "s3", "url": "s3://b/x.csv", "table": "t"}}),
        );
        assert_eq!(f, "target.table");
        assert!(m.contains("not a table"), "{m}");
        let (f, m) = field(json!({"source": sql, "target": {"tool": "http", "url": "http://x"}}));
        assert_eq!(f, "target.tool");
        assert!(m.contains("postgres, duckdb, s3, gcs"), "{m}");
    }

    #[test]
    fn rows_come_from_sql_results_or_json_at_a_path() {
        let (rows, cols) = rows_of(
            SourceKind::Http,
            &json!({"data": {"data": {"items": [{"a": 1}, {"b": 2}]}}}),
            Some("data.items"),
        )
        .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(cols, ["a", "b"]);
        let (rows, _) = rows_of(SourceKind::Http, &json!({"data": {"id": 1}}), None).unwrap();
        assert_eq!(rows.len(), 1);
        let e = rows_of(SourceKind::Http, &json!({"data": [1]}), None).unwrap_err();
        assert!(e.contains("row 1 is a number"), "{e}");
        let (_, cols) = rows_of(
            SourceKind::Postgres,
            &json!({"rows": [], "columns": ["x", "y"]}),
            None,
        )
        .unwrap();
        assert_eq!(cols, ["x", "y"]);
        let row = json!({"user": {"id": 7}, "a.b": 1})
            .as_object()
            .cloned()
            .unwrap();
        assert_eq!(pick(&row, "user.id"), json!(7));
        assert_eq!(pick(&row, "a.b"), json!(1));
        assert_eq!(pick(&row, "missing.x"), Value::Null);
    }

    #[test]
    fn batches_are_one_insert_each() {
        let cols = vec!["id".to_string(), "title".to_string()];
        let sql = insert_sql(&BatchSql {
            target: TargetKind::Postgres,
            table: "public.posts",
            columns: &cols,
            rows: 2,
            mode: Mode::Upsert,
            key: &cols[..1],
        });
        assert_eq!(
            sql,
            r#"INSERT INTO public.posts ("id", "title") VALUES ($1, $2), ($3, $4) ON CONFLICT ("id") DO UPDATE SET "title" = EXCLUDED."title""#
        );
        let sql = insert_sql(&BatchSql {
            target: TargetKind::Duckdb,
            table: "t",
            columns: &cols[..1],
            rows: 1,
            mode: Mode::Insert,
            key: &[],
        });
        assert_eq!(sql, r#"INSERT INTO t ("id") VALUES (?)"#);
        assert_eq!(rows_per_batch(TargetKind::Postgres, 100_000, 10), 6553);
        assert_eq!(rows_per_batch(TargetKind::Duckdb, 500, 10), 500);
        let rows = vec![
            vec![json!(1), json!("a")],
            vec![json!(2), json!("b")],
            vec![json!(1), json!("c")],
        ];
        assert_eq!(
            last_per_key(rows, &[0]),
            vec![vec![json!(2), json!("b")], vec![json!(1), json!("c")]]
        );
    }

    fn object(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn the_layout_maps_columns_and_checks_an_upserts_key() {
        let pl = p(json!({"source": {"tool": "http", "url": "u"},
                          "target": {"tool": "postgres", "table": "t"}, "mode": "upsert"}))
        .unwrap();
        let cols = vec!["id".to_string(), "name".to_string()];
        let l = layout(&pl, &cols).unwrap();
        assert_eq!(l.columns, cols);
        assert_eq!(l.mapping[1], ("name".into(), "name".into()));
        assert_eq!((l.key, l.key_index), (vec!["id".to_string()], vec![0]));
        let pl = p(json!({"source": {"tool": "http", "url": "u"},
                          "target": {"tool": "postgres", "table": "t", "key": "nope",
                                     "mapping": {"a": "x.y"}},
                          "mode": "upsert"}))
        .unwrap();
        let e = layout(&pl, &cols).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"`target.key` ["nope"] must be among the columns written ["a"]"#
        );
        let pl = Plan {
            mode: Mode::Insert,
            ..pl
        };
        assert_eq!(layout(&pl, &cols).unwrap().columns, ["a"]);
    }

    #[test]
    fn a_batch_is_the_target_fields_with_its_insert_and_values() {
        let pl = p(json!({"source": {"tool": "http", "url": "u"},
                          "target": {"tool": "postgres", "table": "t", "connection": "c",
                                     "mapping": {"id": "id", "n": "user.name"}},
                          "mode": "upsert"}))
        .unwrap();
        let l = layout(&pl, &[]).unwrap();
        let rows = [
            object(json!({"id": 1, "user": {"name": "a"}})),
            object(json!({"id": 1, "user": {"name": "b"}})),
        ];
        let c = batch_config(&pl, &l, &rows);
        assert_eq!(
            Value::Object(c),
            json!({
                "connection": "c",
                "command": r#"INSERT INTO t ("id", "n") VALUES ($1, $2) ON CONFLICT ("id") DO UPDATE SET "n" = EXCLUDED."n""#,
                "params": [1, "b"],
            })
        );
    }
}
