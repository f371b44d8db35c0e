//! What the transfer tests share: a throw-away PostgreSQL schema, and a
//! transfer call that asserts a secret never reaches its outcome.

use std::collections::BTreeMap;

use noetl_core::tool::{AuthCredential, Tool, ToolCall};
use noetl_core::Outcome;
use noetl_tool_postgres::PostgresTool;
use noetl_tool_transfer::TransferTool;
use serde_json::{json, Value};

/// A schema of its own (`<prefix>_<uuid>`), dropped at the end.
pub struct Schema {
    pg: PostgresTool,
    cred: AuthCredential,
    /// Its name (`$S` in the statements [`Schema::sql`] runs).
    pub name: String,
}

impl Schema {
    /// Create it, reaching PostgreSQL with `cred`.
    pub async fn new(prefix: &str, cred: AuthCredential) -> Self {
        let s = Self {
            pg: PostgresTool::new(),
            cred,
            name: format!("{prefix}_{}", uuid::Uuid::new_v4().simple()),
        };
        s.sql(&format!("create schema {}", s.name)).await;
        s
    }

    /// Run `command`, `$S` naming the schema; its result.
    pub async fn sql(&self, command: &str) -> Value {
        let call = ToolCall {
            auth: Some(self.cred.clone()),
            ..ToolCall::new(
                "postgres",
                json!({"command": command.replace("$S", &self.name)})
                    .as_object()
                    .cloned()
                    .unwrap(),
            )
        };
        let o = self.pg.call(call).await.outcome;
        assert!(o.is_ok(), "{command}: {:?}", o.error);
        o.result
    }

    /// Drop it and what it holds.
    pub async fn drop_now(self) {
        self.sql("drop schema $S cascade").await;
    }
}

/// Run a transfer task with `config` and the keychain entries `auths`;
/// `secret` must appear nowhere in its outcome.
pub async fn transfer(config: Value, auths: &[(&str, AuthCredential)], secret: &str) -> Outcome {
    let nested: BTreeMap<String, AuthCredential> = auths
        .iter()
        .map(|(k, c)| (k.to_string(), c.clone()))
        .collect();
    let call = ToolCall {
        step: "load".into(),
        task: "xfer".into(),
        nested_auth: nested,
        ..ToolCall::new("transfer", config.as_object().cloned().expect("object"))
    };
    let o = TransferTool::new().call(call).await.outcome;
    let text = serde_json::to_string(&o).unwrap();
    assert!(!text.contains(secret), "a secret leaked: {text}");
    o
}
