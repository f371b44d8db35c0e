//! SQL helpers shared by the SQL tool kinds (`postgres`, `duckdb`).
//!
//! Splitting a command into its SQL statements at top-level `;`, outside
//! quotes ('…', "…", E'…' escapes), dollar quotes ($$…$$, $tag$…$tag$) and
//! comments (`--` to end of line, nested `/* */`); and the shape of a
//! command's result ([`StatementResult`], [`combine`]).

use serde_json::{Map, Value};

/// Why a SQL task's `command` / `params` cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// No statements.
    #[error("`command` is required: one or more SQL statements (a string or a list)")]
    NoCommand,
    /// `params` with several statements.
    #[error(
        "`params` binds the parameters of one statement; the command has {0}: split it into tasks"
    )]
    ParamsForSeveral(usize),
    /// `params` is not a list.
    #[error("`params` must be a list (bound to $1, $2... / ?)")]
    ParamsShape,
}

/// The statements of a task's `command` (or `query`): a string, or a list
/// of strings, each split at top-level `;`.
pub fn command_statements(config: &Map<String, Value>) -> Result<Vec<String>, CommandError> {
    let out: Vec<String> = match config.get("command").or_else(|| config.get("query")) {
        Some(Value::String(s)) => statements(s),
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_str)
            .flat_map(statements)
            .collect(),
        _ => Vec::new(),
    };
    if out.is_empty() {
        return Err(CommandError::NoCommand);
    }
    Ok(out)
}

/// A task's `params`: positional values, only for a single statement.
pub fn command_params(
    config: &Map<String, Value>,
    statements: usize,
) -> Result<Vec<Value>, CommandError> {
    match config.get("params") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(p)) if statements == 1 => Ok(p.clone()),
        Some(Value::Array(_)) => Err(CommandError::ParamsForSeveral(statements)),
        Some(_) => Err(CommandError::ParamsShape),
    }
}

/// The non-empty statements of `sql`, trimmed, without their `;`.
pub fn statements(sql: &str) -> Vec<String> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' => {
                // E'...' strings allow backslash escapes.
                let escapes = i > 0 && matches!(b[i - 1], b'E' | b'e');
                i += 1;
                while i < b.len() {
                    if escapes && b[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    if b[i] == b'\'' {
                        if i + 1 < b.len() && b[i + 1] == b'\'' {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += 1;
                }
                i += 1;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 1;
                i += 2;
                while i < b.len() && depth > 0 {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                    } else {
                        i += 1;
                    }
                }
            }
            b'$' => match dollar_tag(&b[i..]) {
                Some(tag_len) => {
                    let tag = &b[i..i + tag_len];
                    i += tag_len;
                    while i < b.len() && !b[i..].starts_with(tag) {
                        i += 1;
                    }
                    i += tag_len;
                }
                None => i += 1,
            },
            b';' => {
                push(&mut out, &sql[start..i]);
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < sql.len() {
        push(&mut out, &sql[start..]);
    }
    out
}

/// Length of a dollar-quote opener (`$$` or `$tag$`) at the start of `b`;
/// `None` for a parameter like `$1`.
fn dollar_tag(b: &[u8]) -> Option<usize> {
    let mut j = 1;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        if j == 1 && b[j].is_ascii_digit() {
            return None;
        }
        j += 1;
    }
    (j < b.len() && b[j] == b'$').then_some(j + 1)
}

fn push(out: &mut Vec<String>, s: &str) {
    let t = s.trim();
    if !t.is_empty() && !is_only_comments(t) {
        out.push(t.to_string());
    }
}

fn is_only_comments(s: &str) -> bool {
    s.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with("--"))
}

/// What one SQL statement gave: the rows of a query, or the count of a
/// statement that returns none. Both SQL tool kinds answer in this shape.
#[derive(Debug, Clone, PartialEq)]
pub enum StatementResult {
    /// A statement that returns rows: `{rows, row_count, columns}`.
    Rows {
        /// Column names, in the statement's order.
        columns: Vec<String>,
        /// One object per row, keyed by column name.
        rows: Vec<Map<String, Value>>,
    },
    /// A statement that returns no rows: `{rows: [], row_count, command}`.
    Count {
        /// The statement's first word, upper-case (`INSERT`, `CREATE`...).
        command: String,
        /// Rows the statement affected.
        count: u64,
    },
}

impl StatementResult {
    /// The result of a query: its columns and rows.
    pub fn rows(columns: Vec<String>, rows: Vec<Map<String, Value>>) -> Self {
        Self::Rows { columns, rows }
    }

    /// The result of `sql`, which returned no rows and affected `count`.
    pub fn count(sql: &str, count: u64) -> Self {
        let command = sql
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        Self::Count { command, count }
    }

    /// The result as JSON.
    pub fn to_value(&self) -> Value {
        self.clone().into_value()
    }

    /// The result as JSON, consuming it.
    pub fn into_value(self) -> Value {
        Value::Object(self.into_map())
    }

    fn into_map(self) -> Map<String, Value> {
        let mut m = Map::new();
        match self {
            Self::Rows { columns, rows } => {
                let n = rows.len();
                m.insert("rows".into(), rows.into_iter().map(Value::Object).collect());
                m.insert("row_count".into(), n.into());
                m.insert("columns".into(), columns.into());
            }
            Self::Count { command, count } => {
                m.insert("rows".into(), Value::Array(Vec::new()));
                m.insert("row_count".into(), count.into());
                m.insert("command".into(), command.into());
            }
        }
        m
    }
}

/// A command's result: one statement's own result, or for several the last
/// one's fields at the top plus `statements: [...each...]`.
pub fn combine(mut results: Vec<StatementResult>) -> Value {
    if results.len() == 1 {
        return results.pop().expect("one").into_value();
    }
    let mut top = match results.last() {
        Some(last) => last.clone().into_map(),
        None => Map::new(),
    };
    top.insert(
        "statements".into(),
        Value::Array(
            results
                .into_iter()
                .map(StatementResult::into_value)
                .collect(),
        ),
    );
    Value::Object(top)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn splits_at_top_level_semicolons_only() {
        assert_eq!(
            statements("create table t(a int); insert into t values (1);\n"),
            vec!["create table t(a int)", "insert into t values (1)"]
        );
        assert_eq!(
            statements("select 'a;b', \"c;d\", E'x\\';y' ; select 2"),
            vec!["select 'a;b', \"c;d\", E'x\\';y'", "select 2"]
        );
        assert_eq!(statements("select 'it''s;'"), vec!["select 'it''s;'"]);
    }

    #[test]
    fn dollar_quotes_comments_and_parameters() {
        let body = "do $fn$ begin perform 1; raise notice 'x;'; end $fn$; select $1";
        assert_eq!(
            statements(body),
            vec![
                "do $fn$ begin perform 1; raise notice 'x;'; end $fn$",
                "select $1"
            ]
        );
        assert_eq!(
            statements("select $$a;b$$; -- c;d\nselect /* e; /* f; */ g; */ 3;"),
            vec!["select $$a;b$$", "-- c;d\nselect /* e; /* f; */ g; */ 3"]
        );
        assert!(statements("  ;; -- only a comment\n").is_empty());
    }

    fn row(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("an object")
    }

    #[test]
    fn a_query_gives_rows_count_and_columns_in_that_order() {
        let r = StatementResult::rows(
            vec!["id".into(), "name".into()],
            vec![
                row(json!({"id": 1, "name": "a"})),
                row(json!({"id": 2, "name": null})),
            ],
        );
        assert_eq!(
            serde_json::to_string(&r.to_value()).unwrap(),
            r#"{"rows":[{"id":1,"name":"a"},{"id":2,"name":null}],"row_count":2,"columns":["id","name"]}"#
        );
        let empty = StatementResult::rows(Vec::new(), Vec::new());
        assert_eq!(
            serde_json::to_string(&empty.into_value()).unwrap(),
            r#"{"rows":[],"row_count":0,"columns":[]}"#
        );
    }

    #[test]
    fn a_write_gives_its_count_and_command_word() {
        let w = StatementResult::count("  insert into t\nvalues (1)", 3);
        assert_eq!(
            w,
            StatementResult::Count {
                command: "INSERT".into(),
                count: 3
            }
        );
        assert_eq!(
            serde_json::to_string(&w.to_value()).unwrap(),
            r#"{"rows":[],"row_count":3,"command":"INSERT"}"#
        );
        assert_eq!(
            StatementResult::count("", 0).to_value(),
            json!({"rows": [], "row_count": 0, "command": ""})
        );
    }

    #[test]
    fn one_statement_is_its_own_result_several_are_listed_under_the_last() {
        let create = StatementResult::count("create table t (a int)", 0);
        let query = StatementResult::rows(vec!["a".into()], vec![row(json!({"a": 1}))]);
        assert_eq!(combine(vec![query.clone()]), query.to_value());
        assert_eq!(
            serde_json::to_string(&combine(vec![create.clone(), query.clone()])).unwrap(),
            concat!(
                r#"{"rows":[{"a":1}],"row_count":1,"columns":["a"],"#,
                r#""statements":[{"rows":[],"row_count":0,"command":"CREATE"},"#,
                r#"{"rows":[{"a":1}],"row_count":1,"columns":["a"]}]}"#
            )
        );
        assert_eq!(
            serde_json::to_string(&combine(vec![query, create])).unwrap(),
            concat!(
                r#"{"rows":[],"row_count":0,"command":"CREATE","#,
                r#""statements":[{"rows":[{"a":1}],"row_count":1,"columns":["a"]},"#,
                r#"{"rows":[],"row_count":0,"command":"CREATE"}]}"#
            )
        );
        assert_eq!(combine(Vec::new()), json!({"statements": []}));
    }
}
