//! The contract between the executor runtime and one tool kind.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;

use crate::Outcome;

/// One invocation of a tool, with every template already rendered.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// Execution id.
    pub execution_id: String,
    /// Step name.
    pub step: String,
    /// Task name.
    pub task: String,
    /// Tool kind.
    pub kind: String,
    /// The task's kind-specific fields, rendered (except the tool's raw fields).
    pub config: serde_json::Map<String, Value>,
    /// The effective task spec (layered), e.g. `timeout`.
    pub spec: Value,
    /// Step-run `args` (token inscription).
    pub args: Value,
    /// `_prev`.
    pub prev: Value,
    /// `iter`, inside loops.
    pub iter: Option<Value>,
    /// `ctx` as of this task.
    pub ctx: Value,
    /// `workload`.
    pub workload: Value,
    /// 1-based attempt.
    pub attempt: u32,
    /// The decrypted credential named by the task's `auth` field, if any.
    pub auth: Option<AuthCredential>,
}

impl ToolCall {
    /// A call of `kind` with these fields and empty scopes (execution `e1`,
    /// step `s`, task `t`, attempt 1): a starting point for tests and tools
    /// that call other tools; set the other fields with struct update.
    pub fn new(kind: &str, config: serde_json::Map<String, Value>) -> Self {
        Self {
            execution_id: "e1".into(),
            step: "s".into(),
            task: "t".into(),
            kind: kind.into(),
            config,
            spec: Value::Null,
            args: Value::Object(Default::default()),
            prev: Value::Null,
            iter: None,
            ctx: Value::Object(Default::default()),
            workload: Value::Object(Default::default()),
            attempt: 1,
            auth: None,
        }
    }
}

/// A keychain credential resolved for one task (`auth: NAME`). Its values
/// must never reach an outcome: the runtime redacts them anyway, and its
/// `Debug` form prints no value.
#[derive(Clone)]
pub struct AuthCredential {
    /// Keychain entry name.
    pub name: String,
    /// Credential kind (`postgres_credential`, `bearer`, `basic`...).
    pub kind: String,
    /// Secret fields (a JSON object).
    pub data: Value,
}

impl AuthCredential {
    /// A string field of the credential, if present.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.data.get(name).and_then(Value::as_str)
    }
}

impl std::fmt::Debug for AuthCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthCredential")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("data", &"[redacted]")
            .finish()
    }
}

/// What a tool gives back besides the outcome.
#[derive(Debug, Clone)]
pub struct ToolReturn {
    /// The outcome envelope (`meta` is filled by the runtime).
    pub outcome: Outcome,
    /// A server-requested minimum delay before a retry (HTTP `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl From<Outcome> for ToolReturn {
    fn from(outcome: Outcome) -> Self {
        Self {
            outcome,
            retry_after: None,
        }
    }
}

/// A boxed, sendable future.
pub type ToolFuture = Pin<Box<dyn Future<Output = ToolReturn> + Send + 'static>>;

/// A built-in tool kind: its name and the task fields it receives
/// unrendered. The one list of kinds: the validator, the executors and the
/// CLI all read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The `kind:` value.
    pub name: &'static str,
    /// Task fields passed to the tool as written: their text may hold
    /// braces that are not templates of this playbook (python `code`; an
    /// inline child `playbook`, whose templates are the child's).
    pub raw_fields: &'static [&'static str],
}

/// Every built-in tool kind.
pub const KINDS: &[Kind] = &[
    Kind {
        name: "noop",
        raw_fields: &[],
    },
    Kind {
        name: "python",
        raw_fields: &["code"],
    },
    Kind {
        name: "playbook",
        raw_fields: &["playbook"],
    },
    Kind {
        name: "http",
        raw_fields: &[],
    },
    Kind {
        name: "postgres",
        raw_fields: &[],
    },
    Kind {
        name: "duckdb",
        raw_fields: &[],
    },
];

/// The raw fields of `kind` (none for a kind not built in).
pub fn raw_fields(kind: &str) -> &'static [&'static str] {
    KINDS
        .iter()
        .find(|k| k.name == kind)
        .map_or(&[], |k| k.raw_fields)
}

/// A tool kind. Tools never fail with a Rust error: every failure is an
/// `error` outcome that task policy can test.
pub trait Tool: Send + Sync + 'static {
    /// The kind this tool serves (`noop`, `python`...).
    fn kind(&self) -> &'static str;
    /// Fields of the task config that must NOT be template-rendered before the
    /// call (the tool renders or interprets them itself): those [`KINDS`]
    /// gives for this kind.
    fn raw_fields(&self) -> &'static [&'static str] {
        raw_fields(self.kind())
    }
    /// Run one invocation.
    fn call(&self, call: ToolCall) -> ToolFuture;
}
