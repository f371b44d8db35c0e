//! A task's `script`: its source text (python `code`, postgres and duckdb
//! `command`) loaded when the task runs, from the task itself, a file, an
//! http(s) URL, or an object of S3 (`s3://`) or Google Cloud Storage
//! (`gs://`) (docs/tools.md, "Scripts"). NoETL's `script` field.
//!
//! ```yaml
//! script:
//!   uri: scripts/load.sql          # file: the path; http: the URL, or a label
//!   source:
//!     type: file                   # inline | file | http | s3 | gcs
//!     # inline: code: "..."; http: endpoint (the URL), method, headers, timeout
//!     # s3, gcs: auth (a keychain entry), region, endpoint
//! ```

use std::time::Duration;

use serde_json::Value;

/// The task field a `script` stands in for, for the kinds that take one.
pub fn script_target(kind: &str) -> Option<&'static str> {
    match kind {
        "python" => Some("code"),
        "postgres" | "duckdb" => Some("command"),
        _ => None,
    }
}

/// Where a script's text comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptSource {
    /// The text itself (`source.code`).
    Inline(String),
    /// A file where the executor runs: relative paths resolve against the
    /// executor's script directory.
    File(String),
    /// An http(s) GET (or `method`) whose body is the text.
    Http {
        /// The URL.
        url: String,
        /// GET unless given.
        method: String,
        /// Request headers.
        headers: Vec<(String, String)>,
        /// Bound on the whole request.
        timeout: Duration,
    },
    /// An object of S3 or Google Cloud Storage, read through object_store.
    Object(ObjectSource),
}

/// An object to read: `s3://bucket/key` or `gs://bucket/key`, with the
/// keychain entry holding its credentials and, for S3, where.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectSource {
    /// The object's URL (`s3://` or `gs://`).
    pub url: String,
    /// A keychain entry name: for S3 `access_key_id`, `secret_access_key`
    /// (`session_token`, `region`, `endpoint`); for GCS
    /// `service_account_json` (or a service-account key's own fields).
    /// Without it, the executor's environment (`AWS_*`,
    /// `GOOGLE_SERVICE_ACCOUNT`...).
    pub auth: Option<String>,
    /// S3 region (else the credential's, else `AWS_REGION`).
    pub region: Option<String>,
    /// S3-compatible endpoint (else the credential's, else AWS's).
    pub endpoint: Option<String>,
}

/// Default bound on fetching a script over http.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Script source types that need a cloud service this engine does not
/// reach, and which.
const CLOUD: &[(&str, &str)] = &[("azure", "Azure Blob Storage")];

/// A `script` this engine cannot load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// Not a mapping, or a field of the wrong shape.
    #[error("`script` {0}")]
    Shape(String),
    /// A source type that needs a cloud service.
    #[error("`script` source type `{kind}` is not available in this engine: it needs {service}")]
    Cloud {
        /// The `source.type`.
        kind: String,
        /// The service it needs.
        service: &'static str,
    },
}

impl ScriptError {
    /// What to do instead.
    pub fn hint(&self) -> &'static str {
        match self {
            Self::Shape(_) => "write `script: {uri: PATH_OR_URL, source: {type: inline | file | http | s3 | gcs}}` (docs/tools.md, \"Scripts\")",
            Self::Cloud { .. } => "copy the script to S3 or GCS (`s3://`, `gs://`), where the executor can read it (`type: file`), or serve it over http (`type: http`), or inline it",
        }
    }
}

fn text<'v>(
    m: &'v serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<&'v str>, ScriptError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ScriptError::Shape(format!(
            "`{key}` must be a string, found {}",
            crate::json_type(other)
        ))),
    }
}

/// The source type of a `script` as written (`source.type`; `inline` when
/// `uri: inline`), checked before the task renders: a template passes.
pub fn script_kind(script: &Value) -> Result<String, ScriptError> {
    let m = script
        .as_object()
        .ok_or_else(|| ScriptError::Shape("must be a mapping with `uri` and `source`".into()))?;
    let source = match m.get("source") {
        None | Some(Value::Null) => None,
        Some(Value::Object(s)) => Some(s),
        Some(other) => {
            return Err(ScriptError::Shape(format!(
                "`source` must be a mapping with a `type`, found {}",
                crate::json_type(other)
            )))
        }
    };
    let declared = match source {
        Some(s) => text(s, "type")?.map(str::to_ascii_lowercase),
        None => None,
    };
    let uri = text(m, "uri")?;
    let kind = match (declared, uri) {
        (Some(k), _) => k,
        (None, Some("inline")) => "inline".into(),
        (None, Some(u)) if u.starts_with("http://") || u.starts_with("https://") => "http".into(),
        (None, Some(u)) if u.starts_with("gs://") => "gcs".into(),
        (None, Some(u)) if u.starts_with("s3://") => "s3".into(),
        (None, Some(_)) => "file".into(),
        (None, None) => {
            return Err(ScriptError::Shape(
                "needs `source.type` (inline, file, http, s3 or gcs) and `uri`".into(),
            ))
        }
    };
    if kind.contains("{{") {
        return Ok(kind);
    }
    if let Some((_, service)) = CLOUD.iter().find(|(k, _)| *k == kind) {
        return Err(ScriptError::Cloud { kind, service });
    }
    match kind.as_str() {
        "inline" | "file" | "http" | "https" | "s3" | "gcs" => Ok(kind),
        "gs" => Ok("gcs".into()),
        other => Err(ScriptError::Shape(format!(
            "source type `{other}` is not one of inline, file, http, s3, gcs"
        ))),
    }
}

/// Where the rendered `script` of a task says its text comes from.
pub fn script_source(script: &Value) -> Result<ScriptSource, ScriptError> {
    let kind = script_kind(script)?;
    let m = script.as_object().expect("script_kind checked the mapping");
    let empty = serde_json::Map::new();
    let source = m.get("source").and_then(Value::as_object).unwrap_or(&empty);
    let uri = text(m, "uri")?;
    match kind.as_str() {
        "inline" => {
            let code = text(source, "code")?
                .or(text(m, "code")?)
                .ok_or_else(|| ScriptError::Shape("of type inline needs `source.code`".into()))?;
            Ok(ScriptSource::Inline(code.to_string()))
        }
        "s3" | "gcs" => {
            let scheme = if kind == "s3" { "s3://" } else { "gs://" };
            let url = uri
                .or(text(source, "url")?)
                .map(str::trim)
                .filter(|u| u.starts_with(scheme) && u.len() > scheme.len())
                .ok_or_else(|| {
                    ScriptError::Shape(format!(
                        "of type {kind} needs `uri`: a {scheme}bucket/key URL"
                    ))
                })?;
            Ok(ScriptSource::Object(ObjectSource {
                url: url.to_string(),
                auth: text(source, "auth")?.map(str::to_string),
                region: text(source, "region")?.map(str::to_string),
                endpoint: text(source, "endpoint")?.map(str::to_string),
            }))
        }
        "file" => {
            let path = uri
                .or(text(source, "path")?)
                .filter(|p| !p.trim().is_empty())
                .ok_or_else(|| ScriptError::Shape("of type file needs `uri` (a path)".into()))?;
            Ok(ScriptSource::File(path.trim().to_string()))
        }
        _ => {
            let url = text(source, "endpoint")?
                .or(text(source, "url")?)
                .or(uri)
                .map(str::trim)
                .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
                .ok_or_else(|| {
                    ScriptError::Shape(
                        "of type http needs `source.endpoint` (or `uri`): an http:// or https:// URL"
                            .into(),
                    )
                })?;
            let method = text(source, "method")?
                .unwrap_or("GET")
                .to_ascii_uppercase();
            let headers = match source.get("headers") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Object(h)) => h
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        (k.clone(), v)
                    })
                    .collect(),
                Some(other) => {
                    return Err(ScriptError::Shape(format!(
                        "`source.headers` must be a mapping, found {}",
                        crate::json_type(other)
                    )))
                }
            };
            let timeout = match source.get("timeout") {
                None | Some(Value::Null) => HTTP_TIMEOUT,
                Some(v) => {
                    let t = crate::timeout::task_timeouts(
                        &serde_json::json!({ "timeout": v }),
                        crate::timeout::TaskTimeouts {
                            connect: HTTP_TIMEOUT,
                            read: HTTP_TIMEOUT,
                        },
                    )
                    .map_err(|e| ScriptError::Shape(format!("`source.timeout`: {e}")))?;
                    t.read
                }
            };
            Ok(ScriptSource::Http {
                url: url.to_string(),
                method,
                headers,
                timeout,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_three_sources_read_as_noetl_writes_them() {
        assert_eq!(
            script_source(&json!({"uri": "inline", "source": {"type": "inline", "code": "x = 1"}})),
            Ok(ScriptSource::Inline("x = 1".into()))
        );
        assert_eq!(
            script_source(&json!({"uri": "sql/load.sql", "source": {"type": "file"}})),
            Ok(ScriptSource::File("sql/load.sql".into()))
        );
        let http = script_source(&json!({"uri": "hello.py", "source": {
            "type": "http", "endpoint": "https://h/s/hello.py", "method": "get", "timeout": 5,
            "headers": {"X-A": 1}}}))
        .unwrap();
        assert_eq!(
            http,
            ScriptSource::Http {
                url: "https://h/s/hello.py".into(),
                method: "GET".into(),
                headers: vec![("X-A".into(), "1".into())],
                timeout: Duration::from_secs(5),
            }
        );
    }

    #[test]
    fn the_type_follows_the_uri_when_not_given() {
        assert_eq!(
            script_kind(&json!({"uri": "https://h/x.py"})).unwrap(),
            "http"
        );
        assert_eq!(script_kind(&json!({"uri": "./x.py"})).unwrap(), "file");
        assert_eq!(
            script_kind(&json!({"uri": "{{ p }}", "source": {"type": "file"}})).unwrap(),
            "file"
        );
    }

    #[test]
    fn s3_and_gs_objects_are_read_with_their_keychain_entry() {
        assert_eq!(script_kind(&json!({"uri": "s3://b/x.sql"})).unwrap(), "s3");
        assert_eq!(
            script_source(&json!({"uri": "gs://b/x.py", "source": {"type": "gcs", "auth": "g"}})),
            Ok(ScriptSource::Object(ObjectSource {
                url: "gs://b/x.py".into(),
                auth: Some("g".into()),
                region: None,
                endpoint: None,
            }))
        );
        assert_eq!(
            script_source(
                &json!({"uri": "s3://b/k/x.sql", "source": {"type": "s3", "region": "eu-west-1", "endpoint": "http://h:9000"}})
            ),
            Ok(ScriptSource::Object(ObjectSource {
                url: "s3://b/k/x.sql".into(),
                auth: None,
                region: Some("eu-west-1".into()),
                endpoint: Some("http://h:9000".into()),
            }))
        );
        let e = script_source(&json!({"uri": "b/x.sql", "source": {"type": "s3"}})).unwrap_err();
        assert!(
            e.to_string().contains("needs `uri`: a s3://bucket/key URL"),
            "{e}"
        );
        assert!(matches!(
            script_kind(&json!({"uri": "x", "source": {"type": "azure"}})),
            Err(ScriptError::Cloud {
                service: "Azure Blob Storage",
                ..
            })
        ));
    }

    #[test]
    fn misshapen_scripts_say_what_is_missing() {
        let e = |v: Value| script_source(&v).unwrap_err().to_string();
        assert!(e(json!("x.py")).contains("must be a mapping"));
        assert!(e(json!({"source": {"type": "ftp"}, "uri": "x"}))
            .contains("not one of inline, file, http, s3, gcs"));
        assert!(e(json!({"uri": "inline"})).contains("needs `source.code`"));
        assert!(e(json!({"source": {"type": "http"}, "uri": "x.py"})).contains("source.endpoint"));
        assert!(e(json!({"source": {"type": "file"}})).contains("needs `uri`"));
        assert!(
            e(json!({"source": {"type": "http", "endpoint": "http://h", "timeout": -1}}))
                .contains("source.timeout")
        );
    }

    #[test]
    fn script_stands_in_for_the_source_field_of_three_kinds() {
        assert_eq!(script_target("python"), Some("code"));
        assert_eq!(script_target("postgres"), Some("command"));
        assert_eq!(script_target("duckdb"), Some("command"));
        assert_eq!(script_target("http"), None);
    }
}
