//! noetl-tool-artifact: the `artifact` tool kind (docs/tools.md,
//! "`artifact`"): put a value in the mesh's object store and get it back
//! by reference, from this execution or any other that shares the store.
//!
//! - `action: put` stores `data` under `uri` (`noetl://artifacts/<path>`,
//!   replaced if there) or, without one, under a name derived from the
//!   execution and the value's checksum; `outcome.result = {ref, store,
//!   size, checksum}`.
//! - `action: get` (the default) reads the reference in `uri` (a
//!   `noetl://` string) or `result_ref` (what a put returned, a result
//!   reference, or its `ref`); `outcome.result = {data, ref, size}`, the
//!   checksum verified when the reference carries one.
//!
//! The reference a put returns has no `key`, so templates do not read it
//! back by themselves as they do a step result stored by reference: it can
//! sit in `ctx` or travel to another execution as it is.
//!
//! Errors: `artifact.config` (wrong fields), `artifact.missing` (nothing
//! stored there), `artifact.store` (the store failed; retryable unless the
//! object is corrupt), `artifact.unavailable` (no object store: the call
//! was made outside the executor runtime).

use noetl_core::tool::{Objects, ObjectsError, Tool, ToolCall, ToolFuture, ToolReturn};
use noetl_core::Outcome;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// Scheme of every reference.
pub const SCHEME: &str = "noetl://";

/// Where puts go in the store: `artifacts/...`, apart from the results of
/// executions (`execution/...`), so no clean-up of an execution's results
/// removes them.
pub const PREFIX: &str = "artifacts";

/// The `artifact` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArtifactTool;

impl Tool for ArtifactTool {
    fn kind(&self) -> &'static str {
        "artifact"
    }

    fn call(&self, call: ToolCall) -> ToolFuture {
        Box::pin(async move { ToolReturn::from(run(call).await) })
    }
}

/// What a task asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Store `data` under `name` (a path in the store, without `.json`).
    Put {
        /// Where.
        name: String,
        /// The value.
        data: Value,
    },
    /// Read the object at `key`.
    Get {
        /// `noetl://...` as given.
        reference: String,
        /// The object's key in the store.
        key: String,
        /// `sha256:<hex>` to check, when the reference carries one.
        checksum: Option<String>,
    },
}

/// The task's fields could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

fn config_error(m: impl Into<String>) -> ConfigError {
    ConfigError(m.into())
}

/// What one task does, from its rendered fields (`execution_id` names the
/// default place of a put). A plain function: every refusal names the
/// field.
pub fn action(config: &Map<String, Value>, execution_id: &str) -> Result<Action, ConfigError> {
    let given = |k: &str| config.get(k).filter(|v| !v.is_null());
    let verb = match given("action") {
        None => "get",
        Some(Value::String(s)) => s.as_str(),
        Some(v) => {
            return Err(config_error(format!(
                "`action` must be `get` or `put`, got {v}"
            )))
        }
    };
    let misplaced = |fields: &[&str], verb: &str| -> Result<(), ConfigError> {
        match fields.iter().find(|f| given(f).is_some()) {
            Some(f) => Err(config_error(format!(
                "`{f}` is not a field of an artifact {verb}"
            ))),
            None => Ok(()),
        }
    };
    match verb {
        "put" => {
            misplaced(&["result_ref"], "put")?;
            let Some(data) = given("data") else {
                return Err(config_error(
                    "an artifact put needs `data`: the value to store",
                ));
            };
            let name = match given("uri") {
                None => {
                    let digest = hex::encode(Sha256::digest(data.to_string().as_bytes()));
                    format!("{PREFIX}/{}/{}", execution_id, &digest[..32])
                }
                Some(Value::String(uri)) => put_name(uri)?,
                Some(v) => return Err(config_error(format!("`uri` must be a string, got {v}"))),
            };
            Ok(Action::Put {
                name,
                data: data.clone(),
            })
        }
        "get" => {
            misplaced(&["data"], "get")?;
            let (reference, checksum) = match (given("uri"), given("result_ref")) {
                (Some(Value::String(u)), None) => (u.clone(), None),
                (None, Some(Value::String(r))) => (r.clone(), None),
                (None, Some(Value::Object(r))) => match r.get("ref").and_then(Value::as_str) {
                    Some(s) => (
                        s.to_string(),
                        r.get("checksum").and_then(Value::as_str).map(str::to_string),
                    ),
                    None => {
                        return Err(config_error(
                            "`result_ref` must be a reference: an object with a `ref` (what a put returned), or the `ref` itself",
                        ))
                    }
                },
                (None, None) => {
                    return Err(config_error(
                        "an artifact get needs `uri` or `result_ref`: the reference to read",
                    ))
                }
                (Some(_), Some(_)) => {
                    return Err(config_error(
                        "an artifact get takes one of `uri` and `result_ref`, not both",
                    ))
                }
                (Some(v), None) | (None, Some(v)) => {
                    return Err(config_error(format!(
                        "the reference to read must be a `noetl://` string or a reference object, got {v}"
                    )))
                }
            };
            let key = format!("{}.json", path_of(&reference)?);
            Ok(Action::Get {
                reference,
                key,
                checksum,
            })
        }
        other => Err(config_error(format!(
            "`action` must be `get` or `put`, got {other:?}"
        ))),
    }
}

/// The path a `noetl://` reference names, refusing `.`, `..` and empty
/// segments.
fn path_of(reference: &str) -> Result<String, ConfigError> {
    let Some(path) = reference.strip_prefix(SCHEME) else {
        return Err(config_error(format!(
            "{reference:?} is not a reference of this engine's object store (`noetl://...`); other stores (s3://, gs://, file://) are not read by the artifact tool"
        )));
    };
    let path = path.trim_end_matches(".json");
    if path
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(config_error(format!(
            "{reference:?} is not a usable reference: empty, `.` or `..` segments"
        )));
    }
    Ok(path.to_string())
}

/// Where a put with `uri` goes: `noetl://artifacts/<path>`.
fn put_name(uri: &str) -> Result<String, ConfigError> {
    let path = path_of(uri)?;
    match path.strip_prefix(PREFIX).and_then(|p| p.strip_prefix('/')) {
        Some(rest) if !rest.is_empty() => Ok(path),
        _ => Err(config_error(format!(
            "an artifact put stores under `noetl://{PREFIX}/<path>`, got {uri:?}"
        ))),
    }
}

async fn run(call: ToolCall) -> Outcome {
    let action = match action(&call.config, &call.execution_id) {
        Ok(a) => a,
        Err(e) => return Outcome::error("artifact.config", e.to_string(), false),
    };
    let Some(objects) = call.objects.as_deref() else {
        return Outcome::error(
            "artifact.unavailable",
            "no object store: artifact tasks run in the executor runtime, which hands them the mesh's store",
            false,
        );
    };
    match action {
        Action::Put { name, data } => put(objects, &name, &data).await,
        Action::Get {
            reference,
            key,
            checksum,
        } => get(objects, &reference, &key, checksum.as_deref()).await,
    }
}

async fn put(objects: &dyn Objects, name: &str, data: &Value) -> Outcome {
    match objects.put(name, data).await {
        Ok(r) => Outcome::ok(json!({
            "ref": r["ref"],
            "store": r["store"],
            "size": r["size"],
            "checksum": r["checksum"],
        })),
        Err(e) => store_error(e),
    }
}

async fn get(objects: &dyn Objects, reference: &str, key: &str, checksum: Option<&str>) -> Outcome {
    match objects.get(key, checksum).await {
        Ok(data) => {
            let size = data.to_string().len();
            Outcome::ok(json!({"data": data, "ref": reference, "size": size}))
        }
        Err(e) => store_error(e),
    }
}

fn store_error(e: ObjectsError) -> Outcome {
    if e.missing {
        return Outcome::error("artifact.missing", e.message, false);
    }
    Outcome::error("artifact.store", e.message, !e.permanent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(v: Value) -> Result<Action, ConfigError> {
        action(v.as_object().unwrap(), "e1")
    }

    #[test]
    fn a_put_without_uri_is_named_by_execution_and_checksum() {
        let a = act(json!({"action": "put", "data": {"n": 1}})).unwrap();
        let Action::Put { name, data } = a else {
            panic!("not a put")
        };
        assert_eq!(data, json!({"n": 1}));
        assert!(name.starts_with("artifacts/e1/"), "{name}");
        assert_eq!(name.len(), "artifacts/e1/".len() + 32);
        // The same value, the same place: a redelivered put writes once.
        let Action::Put { name: again, .. } =
            act(json!({"action": "put", "data": {"n": 1}})).unwrap()
        else {
            panic!()
        };
        assert_eq!(name, again);
    }

    #[test]
    fn a_put_with_uri_stores_under_artifacts_only() {
        let a = act(json!({"action": "put", "data": 1, "uri": "noetl://artifacts/reports/daily"}))
            .unwrap();
        assert_eq!(
            a,
            Action::Put {
                name: "artifacts/reports/daily".into(),
                data: json!(1)
            }
        );
        for uri in [
            "noetl://execution/e1/result/s/x",
            "s3://bucket/x",
            "noetl://artifacts/",
            "noetl://artifacts/../x",
        ] {
            let e = act(json!({"action": "put", "data": 1, "uri": uri})).unwrap_err();
            assert!(
                e.0.contains(uri.trim_end_matches('/')) || e.0.contains("artifacts"),
                "{uri}: {e}"
            );
        }
        assert!(act(json!({"action": "put"}))
            .unwrap_err()
            .0
            .contains("`data`"));
        assert!(act(json!({"action": "put", "data": 1, "result_ref": "x"}))
            .unwrap_err()
            .0
            .contains("`result_ref`"));
    }

    #[test]
    fn a_get_reads_a_uri_a_reference_object_or_its_ref() {
        let want = Action::Get {
            reference: "noetl://artifacts/a/b".into(),
            key: "artifacts/a/b.json".into(),
            checksum: None,
        };
        assert_eq!(act(json!({"uri": "noetl://artifacts/a/b"})).unwrap(), want);
        assert_eq!(
            act(json!({"action": "get", "result_ref": "noetl://artifacts/a/b"})).unwrap(),
            want
        );
        let r = act(json!({"result_ref": {"ref": "noetl://execution/e/result/s/x", "key": "execution/e/result/s/x.json", "checksum": "sha256:ab"}})).unwrap();
        assert_eq!(
            r,
            Action::Get {
                reference: "noetl://execution/e/result/s/x".into(),
                key: "execution/e/result/s/x.json".into(),
                checksum: Some("sha256:ab".into()),
            }
        );
    }

    #[test]
    fn a_get_without_a_usable_reference_is_refused_naming_why() {
        let cases = [
            (json!({}), "`uri` or `result_ref`"),
            (
                json!({"uri": "noetl://a", "result_ref": "noetl://b"}),
                "not both",
            ),
            (
                json!({"uri": "gs://b/x.json"}),
                "not a reference of this engine",
            ),
            (
                json!({"result_ref": {"kind": "result_ref"}}),
                "an object with a `ref`",
            ),
            (json!({"result_ref": 3}), "got 3"),
            (json!({"uri": "noetl://a//b"}), "empty"),
            (
                json!({"uri": "noetl://a", "data": 1}),
                "`data` is not a field of an artifact get",
            ),
            (
                json!({"action": "delete", "uri": "noetl://a"}),
                "`get` or `put`",
            ),
        ];
        for (config, want) in cases {
            let e = act(config.clone()).unwrap_err();
            assert!(e.0.contains(want), "{config}: {e}");
        }
    }
}
