//! A live token as the header records it: a leaf module, read by the
//! event payloads and the KV records alike (`state` re-exports it).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A live token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Deterministic token id (also the next step-run id).
    pub token_id: String,
    /// Target step.
    pub step: String,
    /// Rendered inscription.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub args: Value,
    /// Arc index in the parent step's `next.arcs`.
    #[serde(default)]
    pub arc: usize,
    /// The step-run whose boundary fired it (empty for the entry token).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
}

/// The id of execution `eid`'s entry token.
pub fn entry_token_id(eid: &str) -> String {
    crate::ids::derive_id(&[eid, "entry"])
}

impl TokenRecord {
    /// A token `token_id` for `step`, without args, fired by no step-run
    /// (the entry token; set `args`, `arc` and `parent` for others).
    pub fn new(token_id: impl Into<String>, step: impl Into<String>) -> Self {
        Self {
            token_id: token_id.into(),
            step: step.into(),
            args: Value::Null,
            arc: 0,
            parent: String::new(),
        }
    }
}
