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

/// The credential a create request stores: a 422 naming the problem for
/// an empty or overlong name, a kind that is not one, or data that is not
/// an object (the vault checks each kind's fields). Never echoes `data`.
pub fn to_store(req: CredentialCreateRequest) -> Result<Credential, ApiError> {
    let name = req.name.trim();
    if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(ApiError::invalid(format!(
            "credential name must be 1-{MAX_NAME} printable characters"
        )));
    }
    if !KINDS.iter().any(|(k, _)| *k == req.credential_type) {
        return Err(ApiError::invalid(format!(
            "credential type {:?} is not one of {}",
            req.credential_type,
            KINDS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
        )));
    }
    if !req.data.is_object() {
        return Err(ApiError::invalid(
            "credential `data` must be a JSON object of the credential's fields",
        ));
    }
    Ok(Credential {
        name: name.to_string(),
        kind: req.credential_type,
        data: req.data,
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
