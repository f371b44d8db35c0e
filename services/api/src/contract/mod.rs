//! The request and response bodies of the API: NoETL's REST contract
//! (field names and status strings as NoETL's server spells them, so its
//! CLI and scripts read them unchanged), and this engine's additions. Each
//! type derives serde and `utoipa::ToSchema`: the OpenAPI document at
//! `/api/openapi.json` is generated from them.

pub mod catalog;
pub mod credentials;
pub mod events;
pub mod execute;
pub mod executions;
pub mod health;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every error answer: NoETL's `{"error": ..., "status": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What was wrong, in one line (never a secret).
    pub error: String,
    /// The HTTP status code, repeated.
    pub status: u16,
    /// A playbook that does not load: one diagnostic per finding
    /// (`{file, line, column, severity, code, message, help, path}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<serde_json::Value>,
}

/// A catalog version: a number, or `"latest"` (NoETL sends either).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum VersionSpec {
    /// A version number (1, 2, ...).
    Number(u64),
    /// `"latest"`, or a number as text (`"3"`).
    Text(String),
}
