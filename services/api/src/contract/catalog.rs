//! `/api/catalog/*`: register, list, read and delete playbooks.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{ObjectOf, VersionSpec};

fn playbook() -> String {
    "Playbook".into()
}

fn yes() -> bool {
    true
}

/// `POST /api/catalog/register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogRegisterRequest {
    /// The playbook YAML, as text or base64 of it.
    pub content: String,
    /// `Playbook` (the only kind this catalog holds).
    #[serde(default = "playbook")]
    pub resource_type: String,
    /// A playbook in NoETL's dialect is rewritten by `noetl migrate` and
    /// stored canonical, with the text as sent beside it (the default);
    /// `false` takes the text as written (this engine's addition).
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub migrate: bool,
}

/// What `POST /api/catalog/register` stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogRegisterResponse {
    /// `success`.
    pub status: String,
    /// `Resource '<path>' version '<N>' registered.`
    pub message: String,
    /// The catalog path (`metadata.path`, else `metadata.name`).
    pub path: String,
    /// The version this registration got (1, 2, ...).
    pub version: u32,
    /// `<path>@v<version>`: names this version (`POST /api/execute`).
    pub catalog_id: String,
    /// `playbook`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// What the migration rewrote (`<request>:<line>: migrated: ...`,
    /// lines of the text as sent), then the loader's warnings, one line
    /// each (the playbook runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// True when the text was in NoETL's dialect and what is stored is
    /// its migration (the text as sent is kept beside it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub migrated: bool,
}

/// `POST /api/catalog/list`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogEntriesRequest {
    /// Only entries of this kind (`Playbook`; any other lists nothing).
    #[serde(default)]
    pub resource_type: Option<String>,
    /// Accepted for NoETL's clients; this catalog keeps no archived entries.
    #[serde(default)]
    pub include_archived: bool,
}

/// The latest version of every registered path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogEntries {
    /// Sorted by path.
    pub entries: Vec<CatalogEntryResponse>,
}

/// One registered version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogEntryResponse {
    /// `<path>@v<version>`.
    pub catalog_id: String,
    /// Catalog path.
    pub path: String,
    /// `playbook`.
    pub kind: String,
    /// Version.
    pub version: u32,
    /// The YAML text that runs (canonical: migrated when it was sent in
    /// NoETL's dialect).
    pub content: Option<String>,
    /// The text as it was sent, when the server migrated it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_content: Option<String>,
    /// The normalised `workflow` as JSON (`null` if it no longer loads).
    pub layout: Option<Value>,
    /// The `workload` as JSON.
    pub payload: Option<Value>,
    /// The `metadata` as JSON.
    pub meta: Option<Value>,
    /// When it was registered (RFC 3339).
    pub created_at: String,
}

/// `POST /api/catalog/resource`: one version, by id or by path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogEntryRequest {
    /// `<path>@v<version>`.
    #[serde(default)]
    pub catalog_id: Option<String>,
    /// Catalog path.
    #[serde(default)]
    pub path: Option<String>,
    /// A version number, or `latest` (the default).
    #[serde(default)]
    pub version: Option<VersionSpec>,
}

/// `POST /api/catalog/delete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogDeleteRequest {
    /// Catalog path.
    pub path: String,
    /// Only this version; absent: every version of the path.
    #[serde(default)]
    pub version: Option<u32>,
}

/// One version a delete removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeletedCatalogEntry {
    /// `<path>@v<version>`.
    pub catalog_id: String,
    /// The version.
    pub version: u32,
}

/// What `POST /api/catalog/delete` removed (idempotent: nothing is 200
/// with `count: 0`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogDeleteResponse {
    /// `success`.
    pub status: String,
    /// What was removed, in one line.
    pub message: String,
    /// Catalog path.
    pub path: String,
    /// Each version removed, highest first.
    pub deleted: Vec<DeletedCatalogEntry>,
    /// How many.
    pub count: usize,
}

/// `POST /api/catalog/register/batch`: NoETL's `catalog load`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogBatchRequest {
    /// 1 to 1,000 registrations, each as for `POST /api/catalog/register`.
    #[schema(value_type = Vec<CatalogRegisterRequest>)]
    pub items: Vec<ObjectOf<CatalogRegisterRequest>>,
}

/// The outcome of one registration of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogBatchItem {
    /// Its position in the request.
    pub index: usize,
    /// `success` or `error`.
    pub status: String,
    /// The catalog path it was stored under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The version it got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// `<path>@v<version>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_id: Option<String>,
    /// What the migration rewrote, then the loader's warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// True when what is stored is the migration of the text sent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub migrated: bool,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A playbook that does not load: its findings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<Value>,
}

/// What `POST /api/catalog/register/batch` did (items fail one by one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CatalogBatchResponse {
    /// `success` (all stored), `partial` or `error` (none stored).
    pub status: String,
    /// Stored.
    pub registered: usize,
    /// Refused.
    pub failed: usize,
    /// Always 0 (NoETL's count of what it skipped).
    pub skipped: usize,
    /// One per item, in order.
    pub results: Vec<CatalogBatchItem>,
}
