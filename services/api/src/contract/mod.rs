//! The request and response bodies of the API: NoETL's REST contract
//! (field names and status strings as NoETL's server spells them, so its
//! CLI and scripts read them unchanged), and this engine's additions. Each
//! type derives serde and `utoipa::ToSchema`: the OpenAPI document at
//! `/api/openapi.json` is generated from them.

pub mod catalog;
pub mod credentials;
pub mod ehdb;
pub mod events;
pub mod execute;
pub mod executions;
pub mod health;
pub mod history;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every error answer: NoETL's `{"error": ..., "status": ...}`, with the
/// line also as `message` (NoETL's clients read either).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What was wrong, in one line (never a secret).
    pub error: String,
    /// The same line, where NoETL's clients read it.
    pub message: String,
    /// The HTTP status code, repeated.
    pub status: u16,
    /// A playbook that does not load: one diagnostic per finding
    /// (`{file, line, column, severity, code, message, help, path}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<serde_json::Value>,
}

/// A JSON object read as `T` (a struct): an array in its place is refused,
/// where serde alone would read it as the struct's fields in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct ObjectOf<T>(pub T);

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for ObjectOf<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        T::deserialize(serde_json::Value::Object(map))
            .map(ObjectOf)
            .map_err(serde::de::Error::custom)
    }
}

impl<T> std::ops::Deref for ObjectOf<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
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
