//! `/api/credentials`: secrets go in, never come out.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// `POST /api/credentials`: store (or replace) a credential.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CredentialCreateRequest {
    /// Name, as playbooks' `keychain` declares it.
    pub name: String,
    /// Kind: `postgres_credential`, `bearer`, `basic`, `api_key`, `secret`,
    /// or one of NoETL's types (`postgres` with `db_*` fields, `generic`...)
    /// stored as the kind it is an alias of.
    #[serde(rename = "type")]
    pub credential_type: String,
    /// The secret fields (a JSON object); encrypted, never returned.
    pub data: Value,
    /// Accepted for NoETL's clients; not stored.
    #[serde(default)]
    pub description: Option<String>,
    /// Accepted for NoETL's clients; not stored.
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    /// Accepted for NoETL's clients; not stored.
    #[serde(default)]
    pub meta: Option<Value>,
}

/// A credential as the API shows it: name and kind, never its data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CredentialResponse {
    /// The name (credentials are named, not numbered).
    pub id: String,
    /// The name.
    pub name: String,
    /// The kind.
    #[serde(rename = "type")]
    pub credential_type: String,
    /// The last write (RFC 3339).
    pub created_at: String,
    /// The last write (RFC 3339).
    pub updated_at: String,
    /// Asked for with `include_data=true`: why the data is not in the
    /// answer (it never leaves the vault).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_withheld: Option<String>,
}

/// `GET /api/credentials` filters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, IntoParams, ToSchema)]
#[into_params(parameter_in = Query)]
pub struct CredentialFilter {
    /// Only this kind.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub credential_type: Option<String>,
    /// Only names containing this (any case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
}

/// `GET /api/credentials`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CredentialListResponse {
    /// Sorted by name.
    pub items: Vec<CredentialResponse>,
    /// The filters applied, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<CredentialFilter>,
}

/// `GET /api/credentials/{name}` options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GetCredentialQuery {
    /// NoETL returns the data when true; this API answers the name and
    /// kind with `data_withheld` saying why the data is not there.
    #[serde(default)]
    pub include_data: bool,
}

/// What `DELETE /api/credentials/{name}` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CredentialDeleteResponse {
    /// `Credential deleted successfully`.
    pub message: String,
    /// The name.
    pub id: String,
}
