//! What a catalog request names and what a registration stores: catalog
//! ids, versions, the playbook text of a registration, an entry as NoETL
//! shows it, and the execution an execute request asks for.

use base64::Engine as _;
use noetl_core::load::load_playbook;
use noetl_mesh::catalog::Entry;
use serde_json::Value;

use crate::contract::catalog::CatalogEntryResponse;
use crate::contract::execute::{CatalogIdInput, ExecuteRequest};
use crate::contract::VersionSpec;
use crate::error::ApiError;

/// The catalog id of a version: `<path>@v<version>`, as executions started
/// from it name their source.
pub fn catalog_id(path: &str, version: u32) -> String {
    format!("{path}@v{version}")
}

pub use noetl_mesh::catalog::parse_catalog_id;

/// A version as a client gave it: `None` for the latest.
pub fn version_of(spec: Option<&VersionSpec>) -> Result<Option<u32>, ApiError> {
    let bad = |v: &dyn std::fmt::Display| {
        ApiError::invalid(format!(
            "version {v} is not a version: use a number from 1, or \"latest\""
        ))
    };
    match spec {
        None => Ok(None),
        Some(VersionSpec::Number(n)) => match u32::try_from(*n) {
            Ok(v) if v > 0 => Ok(Some(v)),
            _ => Err(bad(n)),
        },
        Some(VersionSpec::Text(t)) if t.eq_ignore_ascii_case("latest") => Ok(None),
        Some(VersionSpec::Text(t)) => match t.trim().parse::<u32>() {
            Ok(v) if v > 0 => Ok(Some(v)),
            _ => Err(bad(&format!("{t:?}"))),
        },
    }
}

/// The text of a registration's `content`: base64 of UTF-8 text is
/// decoded (as NoETL's server does), anything else is the text itself.
pub fn decode_content(content: &str) -> String {
    base64::engine::general_purpose::STANDARD
        .decode(content.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .unwrap_or_else(|| content.to_string())
}

/// A playbook ready to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    /// The text to store: canonical (migrated when it was sent in NoETL's
    /// dialect).
    pub text: String,
    /// The text as sent, when `text` is its migration.
    pub original: Option<String>,
    /// Its catalog path: `metadata.path`, else `metadata.name`.
    pub path: String,
    /// `metadata.name`.
    pub name: String,
    /// What the migration rewrote, then the loader's warnings, one line
    /// each.
    pub warnings: Vec<String>,
}

/// What [`registration`] reads.
pub struct RegisterInput<'a> {
    /// The request's `content`.
    pub content: &'a str,
    /// The request's `resource_type`.
    pub resource_type: &'a str,
    /// Rewrite a playbook in NoETL's dialect first (the request's
    /// `migrate`, true unless it says false).
    pub migrate: bool,
}

/// Decode, (migrate,) load and validate a registration: the playbook to
/// store, or a 422 naming each problem (with the loader's diagnostics).
pub fn registration(input: RegisterInput<'_>) -> Result<Registration, ApiError> {
    const NAME: &str = "<request>";
    if !input.resource_type.eq_ignore_ascii_case("playbook") {
        return Err(ApiError::invalid(format!(
            "resource_type {:?}: this catalog holds playbooks only (`Playbook`)",
            input.resource_type
        )));
    }
    let text = decode_content(input.content);
    if text.trim().is_empty() {
        return Err(ApiError::invalid(
            "`content` is empty: send the playbook YAML",
        ));
    }
    let prepared = super::dialect::prepare(&text, NAME, input.migrate)?;
    let meta = &prepared.loaded.playbook.metadata;
    let path = meta
        .path
        .clone()
        .filter(|p| !p.trim().is_empty())
        .unwrap_or_else(|| meta.name.clone());
    if path.trim().is_empty() {
        return Err(ApiError::invalid(
            "the playbook needs `metadata.path` (or `metadata.name`) to be registered",
        ));
    }
    Ok(Registration {
        name: meta.name.clone(),
        path,
        text: prepared.text,
        original: prepared.original,
        warnings: prepared.warnings,
    })
}

/// A registered version as NoETL lists it: the text, and the workflow,
/// workload and metadata as JSON (`null` where the text no longer loads).
pub fn entry_response(e: &Entry) -> CatalogEntryResponse {
    let loaded = load_playbook(&e.yaml, &e.path).ok();
    let part = |f: &dyn Fn(&noetl_core::Playbook) -> Option<Value>| {
        loaded.as_ref().and_then(|l| f(&l.playbook))
    };
    CatalogEntryResponse {
        catalog_id: catalog_id(&e.path, e.version),
        path: e.path.clone(),
        kind: "playbook".into(),
        version: e.version,
        content: Some(e.yaml.clone()),
        original_content: e.original.clone(),
        layout: part(&|p| serde_json::to_value(&p.workflow).ok()),
        payload: part(&|p| Some(Value::Object(p.workload.clone()))),
        meta: part(&|p| serde_json::to_value(&p.metadata).ok()),
        created_at: e.registered_at.clone(),
    }
}

/// The catalog version an execute request names: its path, and its
/// version (`None`: the latest).
pub fn target(req: &ExecuteRequest) -> Result<(String, Option<u32>), ApiError> {
    let path = req.path.as_deref().map(str::trim).filter(|p| !p.is_empty());
    match (path, &req.catalog_id) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "give either `path` or `catalog_id`, not both",
        )),
        (None, None) => Err(ApiError::invalid(
            "Either 'path' or 'catalog_id' must be provided",
        )),
        (Some(p), None) => Ok((p.to_string(), version_of(req.version.as_ref())?)),
        (None, Some(CatalogIdInput::Text(id))) => match parse_catalog_id(id.trim()) {
            Some((p, v)) => Ok((p, Some(v))),
            None => Err(ApiError::invalid(format!(
                "catalog_id {id:?} is not a catalog id: use `<path>@v<N>` as /api/catalog/register returned it, or `path`"
            ))),
        },
        (None, Some(CatalogIdInput::Number(n))) => Err(ApiError::invalid(format!(
            "catalog_id {n} is a NoETL catalog id; this engine names versions `<path>@v<N>` (as /api/catalog/register returns them): send that, or `path`"
        ))),
    }
}

/// The execution id an execute request gets: its own (checked), one
/// derived from its dedup key (the same key, the same execution), or a
/// fresh one.
pub fn execution_id(req: &ExecuteRequest) -> Result<String, ApiError> {
    if let Some(id) = &req.execution_id {
        if !noetl_mesh::ids::is_valid_execution_id(id) {
            return Err(ApiError::invalid(format!(
                "execution_id {id:?}: use {}",
                noetl_mesh::ids::NAME_RULE
            )));
        }
        if req.dedup.is_some() {
            return Err(ApiError::invalid(
                "give either `execution_id` or `dedup`, not both",
            ));
        }
        return Ok(id.clone());
    }
    match &req.dedup {
        Some(d) if d.key.is_empty() || d.key.len() > 256 => {
            Err(ApiError::invalid("dedup.key must be 1-256 characters"))
        }
        Some(d) => Ok(format!(
            "d{}",
            noetl_mesh::ids::derive_id(&["dedup", &d.key])
        )),
        None => Ok(noetl_mesh::ids::new_execution_id()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::execute::DedupSpec;

    #[test]
    fn a_catalog_id_names_a_path_and_version() {
        let id = catalog_id("examples/hello", 3);
        assert_eq!(id, "examples/hello@v3");
        assert_eq!(parse_catalog_id(&id), Some(("examples/hello".into(), 3)));
        assert_eq!(parse_catalog_id("a@b@v2"), Some(("a@b".into(), 2)));
        for bad in ["examples/hello", "@v1", "x@v0", "x@vlatest", "123"] {
            assert_eq!(parse_catalog_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn versions_are_numbers_or_latest() {
        assert_eq!(version_of(None).unwrap(), None);
        assert_eq!(version_of(Some(&VersionSpec::Number(2))).unwrap(), Some(2));
        assert_eq!(
            version_of(Some(&VersionSpec::Text("latest".into()))).unwrap(),
            None
        );
        assert_eq!(
            version_of(Some(&VersionSpec::Text("4".into()))).unwrap(),
            Some(4)
        );
        for bad in [VersionSpec::Number(0), VersionSpec::Text("v2".into())] {
            let e = version_of(Some(&bad)).unwrap_err();
            assert_eq!(e.status().as_u16(), 422, "{e}");
        }
    }

    #[test]
    fn content_is_text_or_base64_of_it() {
        let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\n";
        let b64 = base64::engine::general_purpose::STANDARD.encode(yaml);
        assert_eq!(decode_content(&b64), yaml);
        assert_eq!(decode_content(yaml), yaml);
    }

    const HELLO: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: hello\n  path: examples/hello\nworkflow:\n  - step: start\n    tool:\n      - name: t\n        kind: noop\n";

    #[test]
    fn a_registration_loads_the_playbook_and_takes_its_path() {
        let r = registration(RegisterInput {
            content: HELLO,
            resource_type: "Playbook",
            migrate: false,
        })
        .unwrap();
        assert_eq!(
            (r.path.as_str(), r.name.as_str()),
            ("examples/hello", "hello")
        );
        let no_path = HELLO.replace("  path: examples/hello\n", "");
        let r = registration(RegisterInput {
            content: &no_path,
            resource_type: "playbook",
            migrate: false,
        })
        .unwrap();
        assert_eq!(r.path, "hello", "the name stands in, as in NoETL");
    }

    #[test]
    fn a_registration_that_does_not_load_is_422_with_diagnostics() {
        let bad = HELLO.replace("kind: noop", "kind: pyhton");
        let e = registration(RegisterInput {
            content: &bad,
            resource_type: "Playbook",
            migrate: false,
        })
        .unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
        assert!(e.to_string().contains("E006"), "{e}");
        assert!(matches!(
            e,
            ApiError::Validation {
                diagnostics: Some(_),
                ..
            }
        ));
        let e = registration(RegisterInput {
            content: HELLO,
            resource_type: "Tool",
            migrate: false,
        })
        .unwrap_err();
        assert!(e.to_string().contains("playbooks only"), "{e}");
    }

    #[test]
    fn an_execute_request_names_one_version() {
        let by_path = ExecuteRequest {
            path: Some("a/b".into()),
            version: Some(VersionSpec::Number(2)),
            ..Default::default()
        };
        assert_eq!(target(&by_path).unwrap(), ("a/b".into(), Some(2)));
        let by_id = ExecuteRequest {
            catalog_id: Some(CatalogIdInput::Text("a/b@v3".into())),
            ..Default::default()
        };
        assert_eq!(target(&by_id).unwrap(), ("a/b".into(), Some(3)));
        let numeric = ExecuteRequest {
            catalog_id: Some(CatalogIdInput::Number(42)),
            ..Default::default()
        };
        assert!(target(&numeric)
            .unwrap_err()
            .to_string()
            .contains("<path>@v<N>"));
        let neither = ExecuteRequest::default();
        assert!(target(&neither)
            .unwrap_err()
            .to_string()
            .contains("'path' or 'catalog_id'"));
    }

    #[test]
    fn a_dedup_key_always_gives_the_same_execution_id() {
        let req = |key: &str| ExecuteRequest {
            dedup: Some(crate::contract::ObjectOf(DedupSpec {
                key: key.into(),
                window_secs: None,
            })),
            ..Default::default()
        };
        assert_eq!(
            execution_id(&req("k")).unwrap(),
            execution_id(&req("k")).unwrap()
        );
        assert_ne!(
            execution_id(&req("k")).unwrap(),
            execution_id(&req("j")).unwrap()
        );
        assert!(noetl_mesh::ids::is_valid_execution_id(
            &execution_id(&req("k")).unwrap()
        ));
        assert!(execution_id(&req("")).is_err());
        let own = ExecuteRequest {
            execution_id: Some("bad id".into()),
            ..Default::default()
        };
        assert_eq!(execution_id(&own).unwrap_err().status().as_u16(), 422);
        let fresh = ExecuteRequest::default();
        assert_ne!(execution_id(&fresh).unwrap(), execution_id(&fresh).unwrap());
    }
}
