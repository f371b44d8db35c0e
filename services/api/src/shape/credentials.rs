//! Credentials as the API shows them (names and kinds, never data), and
//! what a stored credential must be.

use noetl_mesh::credentials::{Credential, Listed, KINDS};

use crate::contract::credentials::{CredentialCreateRequest, CredentialFilter, CredentialResponse};
use crate::error::ApiError;

/// Longest credential name.
pub const MAX_NAME: usize = 128;

/// A listed credential as NoETL shows one (its name is its id).
pub fn view(c: &Listed) -> CredentialResponse {
    CredentialResponse {
        id: c.name.clone(),
        name: c.name.clone(),
        credential_type: c.kind.clone(),
        created_at: c.updated_at.clone(),
        updated_at: c.updated_at.clone(),
        data_withheld: None,
    }
}

/// The credentials `f` keeps (kind equal, name containing `q` in any case).
pub fn select(all: &[Listed], f: &CredentialFilter) -> Vec<CredentialResponse> {
    let q = f.q.as_ref().map(|q| q.to_lowercase());
    all.iter()
        .filter(|c| f.credential_type.as_ref().is_none_or(|t| &c.kind == t))
        .filter(|c| {
            q.as_ref()
                .is_none_or(|q| c.name.to_lowercase().contains(q.as_str()))
        })
        .map(view)
        .collect()
}

/// Field renames of an alias: `(theirs, ours)`, applied when ours is absent.
pub type Renames = &'static [(&'static str, &'static str)];

/// NoETL's credential types and the kind each is here, with NoETL's field
/// names renamed to ours.
pub const ALIASES: &[(&str, &str, Renames)] = &[
    ("postgres", "postgres_credential", PG_FIELDS),
    ("postgresql", "postgres_credential", PG_FIELDS),
    ("bearer_token", "bearer", &[("access_token", "token")]),
    ("httpBearerAuth", "bearer", &[("access_token", "token")]),
    ("token", "bearer", &[("access_token", "token")]),
    ("httpBasicAuth", "basic", &[("user", "username")]),
    ("apikey", "api_key", &[("api_key", "key"), ("value", "key")]),
    ("apiKey", "api_key", &[("api_key", "key"), ("value", "key")]),
    (
        "httpApiKey",
        "api_key",
        &[("api_key", "key"), ("value", "key")],
    ),
    ("generic", "secret", &[]),
    ("snowflake", "secret", &[]),
    ("mysql", "secret", &[]),
    ("gcs", "secret", &[]),
    ("google_service_account", "secret", &[]),
    ("google_oauth", "secret", &[]),
    ("aws", "secret", &[]),
];

/// NoETL's `db_*` fields of a PostgreSQL credential and ours.
const PG_FIELDS: &[(&str, &str)] = &[
    ("db_host", "host"),
    ("db_port", "port"),
    ("db_user", "user"),
    ("db_password", "password"),
    ("db_name", "database"),
    ("username", "user"),
    ("dbname", "database"),
];

/// The kind a request's `type` is here (ours, or a NoETL alias of one),
/// and the data with NoETL's field names renamed to ours (a number, such
/// as a port, becomes text). `None` for a type that is neither.
pub fn canonical(kind: &str, data: serde_json::Value) -> Option<(String, serde_json::Value)> {
    if KINDS.iter().any(|(k, _)| *k == kind) {
        return Some((kind.to_string(), data));
    }
    let (_, ours, renames) = ALIASES
        .iter()
        .find(|(theirs, _, _)| theirs.eq_ignore_ascii_case(kind))?;
    let data = match data {
        serde_json::Value::Object(mut map) => {
            for (theirs, field) in *renames {
                if map.contains_key(*field) {
                    continue;
                }
                if let Some(v) = map.remove(*theirs) {
                    let v = match v {
                        serde_json::Value::Number(n) => serde_json::Value::String(n.to_string()),
                        other => other,
                    };
                    map.insert((*field).to_string(), v);
                }
            }
            serde_json::Value::Object(map)
        }
        other => other,
    };
    Some(((*ours).to_string(), data))
}

/// The credential a create request stores: a 422 naming the problem for
/// an empty or overlong name, a kind that is not one (ours, or NoETL's
/// [`ALIASES`]), or data that is not an object (the vault checks each
/// kind's fields). Never echoes `data`.
pub fn to_store(req: CredentialCreateRequest) -> Result<Credential, ApiError> {
    let name = req.name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(ApiError::invalid(format!(
            "credential name must be 1-{MAX_NAME} printable characters"
        )));
    }
    if !req.data.is_object() {
        return Err(ApiError::invalid(
            "credential `data` must be a JSON object of the credential's fields",
        ));
    }
    let Some((kind, data)) = canonical(&req.credential_type, req.data) else {
        return Err(ApiError::invalid(format!(
            "credential type {} is not one of {}, nor one of NoETL's {}",
            crate::shape::params::shown(&req.credential_type),
            KINDS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", "),
            ALIASES
                .iter()
                .map(|(k, _, _)| *k)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    Ok(Credential {
        name: name.to_string(),
        kind,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn listed(name: &str, kind: &str) -> Listed {
        Listed {
            name: name.into(),
            kind: kind.into(),
            updated_at: "2026-01-01T00:00:00.000Z".into(),
        }
    }

    fn request(name: &str, kind: &str, data: serde_json::Value) -> CredentialCreateRequest {
        CredentialCreateRequest {
            name: name.into(),
            credential_type: kind.into(),
            data,
            description: None,
            tags: None,
            meta: None,
        }
    }

    #[test]
    fn noetls_types_and_fields_are_aliases_of_ours() {
        let pg = json!({"db_host": "h", "db_port": 5432, "db_user": "u", "db_password": "p", "db_name": "n"});
        let (kind, data) = canonical("postgres", pg).unwrap();
        assert_eq!(kind, "postgres_credential");
        assert_eq!(
            data,
            json!({"host": "h", "port": "5432", "user": "u", "password": "p", "database": "n"})
        );
        let (kind, data) = canonical("httpBearerAuth", json!({"access_token": "t"})).unwrap();
        assert_eq!((kind.as_str(), data), ("bearer", json!({"token": "t"})));
        let (kind, data) = canonical("generic", json!({"a": 1})).unwrap();
        assert_eq!((kind.as_str(), data), ("secret", json!({"a": 1})));
        let (kind, _) = canonical("bearer", json!({"token": "t"})).unwrap();
        assert_eq!(kind, "bearer", "ours as they are");
        assert!(canonical("oauth9", json!({})).is_none());
        let stored = to_store(request("pg", "POSTGRES", json!({"db_user": "u"}))).unwrap();
        assert_eq!(stored.kind, "postgres_credential");
        assert_eq!(stored.data["user"], "u");
    }

    #[test]
    fn a_listing_filters_by_kind_and_name() {
        let all = [
            listed("pg_main", "postgres_credential"),
            listed("api", "bearer"),
        ];
        let by_kind = select(
            &all,
            &CredentialFilter {
                credential_type: Some("bearer".into()),
                q: None,
            },
        );
        assert_eq!(by_kind.len(), 1);
        assert_eq!(
            (by_kind[0].id.as_str(), by_kind[0].credential_type.as_str()),
            ("api", "bearer")
        );
        let by_name = select(
            &all,
            &CredentialFilter {
                credential_type: None,
                q: Some("PG".into()),
            },
        );
        assert_eq!(by_name[0].name, "pg_main");
    }

    #[test]
    fn a_credential_needs_a_name_a_kind_and_an_object_and_errors_never_echo_data() {
        let secret = "s3cr3t-value-xyz";
        let ok = to_store(request("api", "bearer", json!({"token": secret}))).unwrap();
        assert_eq!(ok.kind, "bearer");
        for bad in [
            request("", "bearer", json!({"token": secret})),
            request("api", "oauth", json!({"token": secret})),
            request("api", "bearer", json!(secret)),
        ] {
            let e = to_store(bad).unwrap_err();
            assert_eq!(e.status().as_u16(), 422);
            assert!(!e.to_string().contains(secret), "{e}");
        }
    }
}
