//! `POST /api/execute` and `POST /api/execute/batch`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::{ObjectOf, VersionSpec};

/// A catalog id as a client sends it: this engine's `<path>@v<N>` text,
/// or NoETL's numeric id (refused with a message saying what to send).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum CatalogIdInput {
    /// `<path>@v<N>`, as `POST /api/catalog/register` returned it.
    Text(String),
    /// A NoETL catalog id (a number): not one of this engine's.
    Number(i64),
}

/// NoETL's de-duplication: requests with the same key start one execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DedupSpec {
    /// The key (1-256 characters).
    pub key: String,
    /// Accepted for NoETL's clients; the key holds for as long as the
    /// execution's record exists.
    #[serde(default)]
    pub window_secs: Option<u64>,
}

/// `POST /api/execute`: start a registered playbook.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecuteRequest {
    /// Catalog path (`metadata.path`).
    #[serde(default)]
    pub path: Option<String>,
    /// `<path>@v<N>` instead of `path`.
    #[serde(default)]
    pub catalog_id: Option<CatalogIdInput>,
    /// With `path`: this version instead of the latest.
    #[serde(default)]
    pub version: Option<VersionSpec>,
    /// Workload overrides, merged over the playbook's `workload`
    /// (`workload` is accepted as another name for it).
    #[serde(default, alias = "workload")]
    pub payload: Map<String, Value>,
    /// Start one execution per key.
    #[serde(default)]
    #[schema(value_type = Option<DedupSpec>)]
    pub dedup: Option<ObjectOf<DedupSpec>>,
    /// The execution id to use (1-128 characters of `[A-Za-z0-9_-]`;
    /// idempotent: the same id starts one execution).
    #[serde(default)]
    pub execution_id: Option<String>,
}

/// What `POST /api/execute` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecuteResponse {
    /// The execution id.
    pub execution_id: String,
    /// `started` (the router took it), `queued` (published; no router has
    /// taken it yet) or `duplicate` (the id or dedup key had started one).
    pub status: String,
    /// The catalog path.
    pub path: String,
    /// The version resolved when it was requested.
    pub version: u32,
    /// `<path>@v<version>`.
    pub catalog_id: String,
}

/// `POST /api/execute/batch`: up to 1,000 requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchExecuteRequest {
    /// The requests, each as for `POST /api/execute`.
    #[schema(value_type = Vec<ExecuteRequest>)]
    pub executions: Vec<ObjectOf<ExecuteRequest>>,
}

/// The result of one request of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchItemResult {
    /// Its position in the request.
    pub index: usize,
    /// `started`, `queued`, `duplicate` or `error`.
    pub status: String,
    /// The execution id (absent on error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What `POST /api/execute/batch` did (items fail one by one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchExecuteResponse {
    /// Requests in the batch.
    pub count: usize,
    /// Started or queued.
    pub started: usize,
    /// Already started before.
    pub duplicates: usize,
    /// Refused.
    pub failed: usize,
    /// One per request, in order.
    pub results: Vec<BatchItemResult>,
}
