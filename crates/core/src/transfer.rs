//! The two sides of a `transfer` task (docs/tools.md, "transfer"): which
//! tool each side is, and what an object side (`s3`, `gcs`) names. Read by
//! `noetl validate` (on the playbook as written, templates left alone) and
//! by the transfer tool (on the rendered fields), so both refuse the same
//! sides with the same messages.

use serde_json::{Map, Value};

/// Why a side of a transfer is wrong. Each names the field (`source.tool`,
/// `target.url`...) so the validator can point at it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SideError {
    /// No or an unknown tool on one side.
    #[error("`{side}.tool` must be one of {allowed}, got {got:?}")]
    Tool {
        /// `source` or `target`.
        side: &'static str,
        /// The tools it takes.
        allowed: &'static str,
        /// What was given (lower-cased; empty when absent).
        got: String,
    },
    /// A field the side needs.
    #[error("`{field}` is required: {about}")]
    Missing {
        /// The field (`target.url`).
        field: String,
        /// What it holds.
        about: &'static str,
    },
    /// A field of the wrong shape or value, or one the side does not read.
    #[error("`{field}` {problem}")]
    Field {
        /// The field.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

impl SideError {
    /// The dotted field the error is about (`source.tool`, `mode`).
    pub fn field(&self) -> String {
        match self {
            Self::Tool { side, .. } => format!("{side}.tool"),
            Self::Missing { field, .. } | Self::Field { field, .. } => field.clone(),
        }
    }
}

/// Where rows come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A query on PostgreSQL.
    Postgres,
    /// A query on DuckDB.
    Duckdb,
    /// An HTTP response holding JSON rows.
    Http,
    /// An object of S3 (or an S3-compatible server): `s3://bucket/key`.
    S3,
    /// An object of Google Cloud Storage: `gs://bucket/key`.
    Gcs,
}

/// Where rows go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// A PostgreSQL table.
    Postgres,
    /// A table of a DuckDB file.
    Duckdb,
    /// An object of S3 (or an S3-compatible server).
    S3,
    /// An object of Google Cloud Storage.
    Gcs,
}

/// The object stores a side may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// `s3://`.
    S3,
    /// `gs://`.
    Gcs,
}

impl Store {
    /// The URL scheme with its `://`.
    pub fn scheme(self) -> &'static str {
        match self {
            Self::S3 => "s3://",
            Self::Gcs => "gs://",
        }
    }

    fn tool(self) -> &'static str {
        match self {
            Self::S3 => "s3",
            Self::Gcs => "gcs",
        }
    }
}

impl SourceKind {
    /// The tool's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Duckdb => "duckdb",
            Self::Http => "http",
            Self::S3 => "s3",
            Self::Gcs => "gcs",
        }
    }

    /// The object store it reads, for an object side.
    pub fn store(self) -> Option<Store> {
        match self {
            Self::S3 => Some(Store::S3),
            Self::Gcs => Some(Store::Gcs),
            _ => None,
        }
    }
}

impl TargetKind {
    /// The tool's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Duckdb => "duckdb",
            Self::S3 => "s3",
            Self::Gcs => "gcs",
        }
    }

    /// The object store it writes, for an object side.
    pub fn store(self) -> Option<Store> {
        match self {
            Self::S3 => Some(Store::S3),
            Self::Gcs => Some(Store::Gcs),
            _ => None,
        }
    }
}

/// The tools a source may be.
pub const SOURCE_TOOLS: &str = "postgres, duckdb, http, s3, gcs";
/// The tools a target may be.
pub const TARGET_TOOLS: &str = "postgres, duckdb, s3, gcs";

/// The side's tool as written (`tool`, or NoETL's `kind` / `type`),
/// trimmed and lower-cased; empty when absent.
pub fn tool_of(side: &Map<String, Value>) -> String {
    ["tool", "kind", "type"]
        .iter()
        .find_map(|k| side.get(*k).and_then(Value::as_str))
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// `source.tool`.
pub fn source_kind(src: &Map<String, Value>) -> Result<SourceKind, SideError> {
    match tool_of(src).as_str() {
        "postgres" => Ok(SourceKind::Postgres),
        "duckdb" => Ok(SourceKind::Duckdb),
        "http" => Ok(SourceKind::Http),
        "s3" => Ok(SourceKind::S3),
        "gcs" | "gs" => Ok(SourceKind::Gcs),
        other => Err(SideError::Tool {
            side: "source",
            allowed: SOURCE_TOOLS,
            got: other.into(),
        }),
    }
}

/// `target.tool`.
pub fn target_kind(tgt: &Map<String, Value>) -> Result<TargetKind, SideError> {
    match tool_of(tgt).as_str() {
        "postgres" => Ok(TargetKind::Postgres),
        "duckdb" => Ok(TargetKind::Duckdb),
        "s3" => Ok(TargetKind::S3),
        "gcs" | "gs" => Ok(TargetKind::Gcs),
        other => Err(SideError::Tool {
            side: "target",
            allowed: TARGET_TOOLS,
            got: other.into(),
        }),
    }
}

/// How rows are laid out in an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line (`jsonl`, `ndjson`).
    JsonLines,
    /// One JSON document: an array of objects (or one object).
    Json,
    /// Comma-separated values with a header row.
    Csv,
}

impl Format {
    /// The format's name in `format:` and in results.
    pub fn name(self) -> &'static str {
        match self {
            Self::JsonLines => "jsonl",
            Self::Json => "json",
            Self::Csv => "csv",
        }
    }

    /// The format a `format:` value names.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "jsonl" | "ndjson" | "json_lines" | "jsonlines" => Some(Self::JsonLines),
            "json" => Some(Self::Json),
            "csv" => Some(Self::Csv),
            _ => None,
        }
    }

    /// The format a key's extension says (`.jsonl`, `.ndjson`, `.json`,
    /// `.csv`).
    pub fn from_key(key: &str) -> Option<Self> {
        let ext = key.rsplit_once('.')?.1;
        (!ext.contains('/')).then(|| Self::from_name(ext)).flatten()
    }

    /// The object's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::JsonLines => "application/x-ndjson",
            Self::Json => "application/json",
            Self::Csv => "text/csv",
        }
    }
}

/// An object one side reads or writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSide {
    /// `s3://bucket/key` or `gs://bucket/key`.
    pub url: String,
    /// How its rows are laid out.
    pub format: Format,
    /// S3 region (else the credential's, else `AWS_REGION`).
    pub region: Option<String>,
    /// S3-compatible endpoint (else the credential's, else AWS's).
    pub endpoint: Option<String>,
    /// Source, JSON only: dotted path to the rows inside the document.
    pub data_path: Option<String>,
}

/// Fields an object side reads, besides the tool's name.
const OBJECT_FIELDS: &[&str] = &["url", "uri", "format", "auth", "region", "endpoint"];

fn templated(v: &str) -> bool {
    v.contains("{{") || v.contains("{%")
}

/// Whether the part after the scheme names a bucket and a key.
fn has_bucket_and_key(rest: &str) -> bool {
    matches!(rest.split_once('/'), Some((b, k)) if !b.is_empty() && !k.is_empty() && !k.ends_with('/'))
}

/// Refuse a field an object side does not read (a table's, a query's, a
/// typo), naming it.
fn only_object_fields(
    side: &'static str,
    tool: &'static str,
    m: &Map<String, Value>,
) -> Result<(), SideError> {
    for key in m.keys() {
        let known = OBJECT_FIELDS.contains(&key.as_str())
            || ["tool", "kind", "type"].contains(&key.as_str())
            || (side == "target" && key == "mapping")
            || (side == "source" && key == "data_path");
        if !known {
            let why = match key.as_str() {
                "table" | "key" | "query" | "command" => format!(
                    "is not read by {side} `{tool}`: it names an object by `{side}.url`, not a table or a query"
                ),
                _ => format!(
                    "is not a field of {side} `{tool}`: it takes url, format, auth, region, endpoint{}",
                    if side == "source" { ", data_path" } else { ", mapping" }
                ),
            };
            return Err(SideError::Field {
                field: format!("{side}.{key}"),
                problem: why,
            });
        }
    }
    Ok(())
}

/// The object a side names: `url` (or `uri`, as `script` has it) with the
/// store's scheme, `format` (else the key's extension), `region`,
/// `endpoint`, a JSON source's `data_path`; `auth` is resolved by the
/// executor. `rendered: false` (the validator) lets any templated value
/// pass where its value is not known yet.
pub fn object_side(
    side: &'static str,
    store: Store,
    m: &Map<String, Value>,
    rendered: bool,
) -> Result<ObjectSide, SideError> {
    let field = |name: &str| format!("{side}.{name}");
    let tool = store.tool();
    only_object_fields(side, tool, m)?;
    let text = |name: &str| -> Result<Option<String>, SideError> {
        match m.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(other) => Err(SideError::Field {
                field: field(name),
                problem: format!("must be text, found {}", crate::json_type(other)),
            }),
        }
    };
    let url = match (text("url")?, text("uri")?) {
        (Some(_), Some(_)) => {
            return Err(SideError::Field {
                field: field("uri"),
                problem: format!("and `{side}.url` are both given; keep one"),
            })
        }
        (Some(u), None) | (None, Some(u)) => u,
        (None, None) => {
            return Err(SideError::Missing {
                field: field("url"),
                about: match store {
                    Store::S3 => "the object's s3://bucket/key URL",
                    Store::Gcs => "the object's gs://bucket/key URL",
                },
            })
        }
    };
    let scheme = store.scheme();
    let url_ok = match url.strip_prefix(scheme) {
        Some(rest) => has_bucket_and_key(rest) || (!rendered && templated(rest)),
        None => !rendered && templated(&url) && !url.contains("://"),
    };
    if !url_ok {
        return Err(SideError::Field {
            field: field("url"),
            problem: format!(
                "{url:?} is not an object of {side} `{tool}`: write {scheme}bucket/key"
            ),
        });
    }
    let format = match text("format")? {
        Some(f) if !rendered && templated(&f) => None,
        Some(f) => Some(Format::from_name(&f).ok_or_else(|| SideError::Field {
            field: field("format"),
            problem: format!("must be jsonl (ndjson), json or csv, got {f:?}"),
        })?),
        None => match Format::from_key(&url) {
            Some(f) => Some(f),
            None if !rendered && templated(&url) => None,
            None => {
                return Err(SideError::Missing {
                    field: field("format"),
                    about: "jsonl (ndjson), json or csv; the key's extension (.jsonl, .ndjson, .json, .csv) gives it when there is one",
                })
            }
        },
    };
    let data_path = text("data_path")?.filter(|p| !p.is_empty());
    if let (Some(f), Some(_)) = (format, &data_path) {
        if f != Format::Json {
            return Err(SideError::Field {
                field: field("data_path"),
                problem: format!(
                    "reads rows inside one JSON document; a {} object has its rows at the top",
                    f.name()
                ),
            });
        }
    }
    Ok(ObjectSide {
        url,
        // Unknown only while templated (the validator's reading).
        format: format.unwrap_or(Format::Json),
        region: text("region")?,
        endpoint: text("endpoint")?,
        data_path,
    })
}

/// Whether `s` is a table name the transfer tool writes to: one to three
/// dotted identifiers (`[A-Za-z_][A-Za-z0-9_$]*`), used as written. Shared
/// by the transfer tool (`target.table`) and `noetl validate`.
pub fn is_table_name(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    (1..=3).contains(&parts.len())
        && parts.iter().all(|p| {
            let mut c = p.chars();
            matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
                && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == '$')
        })
}

/// `mode` for an object target: the object is written whole, so `insert`
/// and `replace` both replace it; `upsert` has no key to merge on.
pub fn object_mode(mode: &str, tool: &'static str) -> Result<(), SideError> {
    match mode.trim() {
        "upsert" => Err(SideError::Field {
            field: "mode".into(),
            problem: format!(
                "upsert cannot merge rows into an object (target `{tool}` writes it whole); write insert or replace"
            ),
        }),
        _ => Ok(()),
    }
}

/// What `noetl validate` finds wrong with a transfer task's sides as
/// written: an unknown tool, an object side's url, format or fields, an
/// upsert into an object. A templated value passes; a side that is not a
/// mapping is the type check's to report.
pub fn check_sides(config: &Map<String, Value>) -> Vec<SideError> {
    let mut found = Vec::new();
    let side = |name: &str| config.get(name).and_then(Value::as_object);
    let skip = |m: &Map<String, Value>| templated(&tool_of(m));
    if let Some(src) = side("source").filter(|m| !skip(m)) {
        match source_kind(src) {
            Ok(kind) => {
                if let Some(store) = kind.store() {
                    found.extend(object_side("source", store, src, false).err());
                }
            }
            Err(e) => found.push(e),
        }
    }
    if let Some(tgt) = side("target").filter(|m| !skip(m)) {
        match target_kind(tgt) {
            Ok(kind) => {
                if let Some(store) = kind.store() {
                    found.extend(object_side("target", store, tgt, false).err());
                    if let Some(mode) = config.get("mode").and_then(Value::as_str) {
                        found.extend(object_mode(mode, kind.name()).err());
                    }
                }
            }
            Err(e) => found.push(e),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn tools_are_read_from_tool_kind_or_type() {
        assert_eq!(source_kind(&obj(json!({"type": "S3"}))), Ok(SourceKind::S3));
        assert_eq!(
            target_kind(&obj(json!({"tool": "gs"}))),
            Ok(TargetKind::Gcs)
        );
        let e = target_kind(&obj(json!({"tool": "http"}))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`target.tool` must be one of postgres, duckdb, s3, gcs, got \"http\""
        );
        assert_eq!(e.field(), "target.tool");
    }

    #[test]
    fn an_object_side_names_its_url_and_format() {
        let s = object_side(
            "source",
            Store::S3,
            &obj(json!({"tool": "s3", "url": "s3://b/dir/rows.ndjson", "auth": "s3_main", "endpoint": "http://h:1"})),
            true,
        )
        .unwrap();
        assert_eq!(s.format, Format::JsonLines);
        assert_eq!(s.endpoint.as_deref(), Some("http://h:1"));
        let s = object_side(
            "target",
            Store::Gcs,
            &obj(
                json!({"tool": "gcs", "uri": "gs://b/out", "format": "CSV", "mapping": {"a": "b"}}),
            ),
            true,
        )
        .unwrap();
        assert_eq!((s.url.as_str(), s.format), ("gs://b/out", Format::Csv));
        let s = object_side(
            "source",
            Store::Gcs,
            &obj(json!({"url": "gs://b/doc.json", "data_path": "data.items"})),
            true,
        )
        .unwrap();
        assert_eq!(s.data_path.as_deref(), Some("data.items"));
    }

    #[test]
    fn wrong_object_sides_are_refused_naming_the_field() {
        let e = |side, store, v: Value| {
            let e = object_side(side, store, &obj(v), true).unwrap_err();
            (e.field(), e.to_string())
        };
        let (f, m) = e("target", Store::S3, json!({"url": "gs://b/x.csv"}));
        assert_eq!(f, "target.url");
        assert!(m.contains("write s3://bucket/key"), "{m}");
        assert_eq!(
            e("source", Store::S3, json!({"url": "s3://b/"})).0,
            "source.url"
        );
        let (f, m) = e("source", Store::S3, json!({"url": "s3://b/rows"}));
        assert_eq!(f, "source.format");
        assert!(m.contains("extension"), "{m}");
        let (f, m) = e(
            "source",
            Store::S3,
            json!({"url": "s3://b/r.csv", "format": "parquet"}),
        );
        assert_eq!(f, "source.format");
        assert!(m.contains("\"parquet\""), "{m}");
        let (f, m) = e(
            "target",
            Store::Gcs,
            json!({"url": "gs://b/r.csv", "table": "t"}),
        );
        assert_eq!(f, "target.table");
        assert!(m.contains("not a table"), "{m}");
        assert_eq!(
            e(
                "source",
                Store::S3,
                json!({"url": "s3://b/r.csv", "data_path": "x"})
            )
            .0,
            "source.data_path"
        );
        assert_eq!(e("source", Store::S3, json!({})).0, "source.url");
        assert_eq!(
            e(
                "source",
                Store::S3,
                json!({"url": "s3://b/a.csv", "uri": "s3://b/a.csv"})
            )
            .0,
            "source.uri"
        );
    }

    #[test]
    fn the_validator_lets_templates_pass_and_refuses_the_rest() {
        let c =
            |v: Value| -> Vec<String> { check_sides(&obj(v)).iter().map(|e| e.field()).collect() };
        assert!(c(json!({
            "source": {"tool": "s3", "url": "s3://{{ workload.bucket }}/{{ workload.key }}"},
            "target": {"tool": "{{ workload.tool }}", "url": "x"}
        }))
        .is_empty());
        assert!(c(json!({
            "source": {"tool": "gcs", "url": "{{ workload.url }}", "format": "{{ workload.f }}"},
            "target": {"tool": "postgres", "table": "t"}
        }))
        .is_empty());
        assert_eq!(
            c(
                json!({"source": {"tool": "snowflake"}, "target": {"tool": "s3", "url": "gs://b/x.csv"}, "mode": "upsert"})
            ),
            ["source.tool", "target.url", "mode"]
        );
    }
}
