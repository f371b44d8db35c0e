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
    /// The credentials named by an `auth` inside a mapping field of the
    /// task (a transfer's `source.auth` and `target.auth`), by that field.
    pub nested_auth: std::collections::BTreeMap<String, AuthCredential>,
    /// The mesh's object store, handed to every call by the executor
    /// runtime (`None` in a call made outside it, e.g. a unit test).
    pub objects: Option<std::sync::Arc<dyn Objects>>,
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
            nested_auth: Default::default(),
            objects: None,
        }
    }
}

/// A boxed, sendable future of an [`Objects`] operation.
pub type ObjectsFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ObjectsError>> + Send + 'a>>;

/// The object store of the mesh (docs/architecture.md, "Results by
/// reference"), as the executor runtime hands it to tools that store or
/// read values by reference (`artifact`). Every service that shares the
/// store reads what any of them wrote.
pub trait Objects: Send + Sync + std::fmt::Debug {
    /// Store `value` as JSON under `name` (`/`-separated segments, made
    /// safe for every backend), replacing what was there; returns its
    /// reference `{ref, store, key, size, checksum, preview}`.
    fn put<'a>(&'a self, name: &'a str, value: &'a Value) -> ObjectsFuture<'a, Value>;
    /// The value stored under `key`, checked against `checksum`
    /// (`sha256:<hex>`) when one is given.
    fn get<'a>(&'a self, key: &'a str, checksum: Option<&'a str>) -> ObjectsFuture<'a, Value>;
}

/// Why an [`Objects`] operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ObjectsError {
    /// The object is not there (never written, or deleted).
    pub missing: bool,
    /// Retrying cannot help (missing, corrupt, a configuration problem).
    pub permanent: bool,
    /// What failed, naming the store and the key.
    pub message: String,
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

/// A built-in tool kind: its name, the task fields it reads, and those it
/// receives unrendered. The one list of kinds: the validator, the JSON
/// Schema, the executors and the CLI all read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The `kind:` value.
    pub name: &'static str,
    /// Task fields passed to the tool as written: their text may hold
    /// braces that are not templates of this playbook (python `code`; an
    /// inline child `playbook`, whose templates are the child's).
    pub raw_fields: &'static [&'static str],
    /// The fields the tool reads, besides [`TASK_FIELDS`]: any other field
    /// of a task of this kind is refused when the playbook loads (`E005`).
    pub fields: &'static [Field],
}

/// What a tool field may hold, as the validator checks it before the run.
/// A string holding a template (`{{ ... }}`) passes for every type: it is
/// rendered at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// Any value.
    Any,
    /// A string.
    Str,
    /// A boolean.
    Bool,
    /// A mapping.
    Object,
    /// A list.
    List,
    /// A string or a list of strings.
    StrOrList,
    /// A string or a number.
    Scalar,
}

impl FieldType {
    /// How a message names the type.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Any => "any value",
            Self::Str => "a string",
            Self::Bool => "a boolean",
            Self::Object => "a mapping",
            Self::List => "a list",
            Self::StrOrList => "a string or a list of strings",
            Self::Scalar => "a string or a number",
        }
    }
}

/// One field a tool reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The field's name.
    pub name: &'static str,
    /// What it holds.
    pub ty: FieldType,
    /// Whether a task of the kind must have it.
    pub required: bool,
    /// One line for the JSON Schema (editors show it).
    pub about: &'static str,
}

const fn field(name: &'static str, ty: FieldType, about: &'static str) -> Field {
    Field {
        name,
        ty,
        required: false,
        about,
    }
}

const fn required(name: &'static str, ty: FieldType, about: &'static str) -> Field {
    Field {
        required: true,
        ..field(name, ty, about)
    }
}

/// The fields every task has, whatever its kind.
pub const TASK_FIELDS: &[&str] = &["name", "kind", "spec", "desc"];

use FieldType::{Any, Bool, Object, Scalar, Str, StrOrList};

/// Every built-in tool kind (docs/tools.md).
pub const KINDS: &[Kind] = &[
    Kind {
        name: "noop",
        raw_fields: &[],
        fields: &[field("result", Any, "the task's result (default: `_prev`)")],
    },
    Kind {
        name: "python",
        raw_fields: &["code"],
        fields: &[
            required(
                "code",
                Str,
                "Python source, not template-rendered; sets `result` or defines `main()`",
            ),
            field(
                "args",
                Object,
                "inputs: `args`, and each identifier key as a global",
            ),
            field(
                "libs",
                Object,
                "modules imported before `code`: `alias: module` or `alias: {from, import}`; a missing one fails the task (`python.libs`)",
            ),
            field(
                "script",
                Object,
                "instead of `code`: load it from `source.type` inline, file or http (docs/tools.md, \"Scripts\")",
            ),
        ],
    },
    Kind {
        name: "playbook",
        raw_fields: &["playbook"],
        fields: &[
            field("path", Str, "catalog path of a registered playbook"),
            field("version", Scalar, "with `path`: a pinned version"),
            field("playbook", Str, "the child playbook's YAML, inline"),
            field("file", Str, "a playbook file, read where the executor runs"),
            field("args", Object, "the child's workload overrides"),
            field(
                "return_step",
                Str,
                "the task's result is this child step's last result (default: the child's `ctx`)",
            ),
            field(
                "timeout",
                Scalar,
                "seconds: the child's execution deadline (at most its own `timeout_s`)",
            ),
        ],
    },
    Kind {
        name: "wait",
        raw_fields: &["schema"],
        fields: &[
            required(
                "signal",
                Str,
                "the signal's name (`noetl exec signal ID NAME --data JSON`): [A-Za-z0-9_-]",
            ),
            field(
                "timeout_s",
                Scalar,
                "seconds: without a signal by then the task fails with kind `timeout`",
            ),
            field(
                "schema",
                Object,
                "a JSON Schema the signal's data must fit (docs/operations.md, \"Waiting for a signal\")",
            ),
        ],
    },
    Kind {
        name: "nats",
        raw_fields: &[],
        fields: &[
            required(
                "operation",
                Str,
                "publish, js_publish, request, kv_get, kv_put, kv_delete, kv_keys, object_get, object_put, object_delete",
            ),
            field("subject", Str, "publish / js_publish / request: the subject"),
            field("data", Any, "the message or object: text as is, other values as JSON"),
            field("headers", Object, "message headers"),
            field("stream", Str, "js_publish: the stream that must store it"),
            field("bucket", Str, "KV bucket or object store"),
            field("key", Str, "KV key"),
            field("value", Any, "kv_put: text as is, other values as JSON"),
            field("object", Str, "object name (a task's `name` is its label)"),
            field("encoding", Str, "objects: utf-8 (default) or base64"),
            field("description", Str, "object_put: a description stored with it"),
            field("url", Str, "another NATS server (default: the mesh's own)"),
            field("auth", Str, "keychain entry: secret, basic or bearer"),
        ],
    },
    Kind {
        name: "transfer",
        raw_fields: &[],
        fields: &[
            required(
                "source",
                Object,
                "tool: postgres | duckdb (query), http (url, data_path) or s3 | gcs (url, format), and auth",
            ),
            required(
                "target",
                Object,
                "tool: postgres | duckdb (table, auth / connection / database, key) or s3 | gcs (url, format, auth)",
            ),
            field("mapping", Object, "target column: source field (dotted path)"),
            field("chunk_size", Scalar, "rows per batch (default 1000)"),
            field("mode", Str, "insert (append, default), upsert or replace"),
        ],
    },
    Kind {
        name: "http",
        raw_fields: &[],
        fields: &[
            required("url", Str, "http:// or https:// URL"),
            field(
                "method",
                Str,
                "GET (default), POST, PUT, PATCH, DELETE, HEAD, OPTIONS",
            ),
            field("headers", Object, "header values"),
            field("params", Object, "query string; a list repeats the key"),
            field("json", Any, "a JSON body"),
            field("body", Str, "a text body, sent as is"),
            field("form", Object, "a URL-encoded form body"),
            field(
                "follow_redirects",
                Bool,
                "follow up to 10 redirects (default true)",
            ),
            field("auth", Str, "keychain entry: bearer, basic or api_key"),
            field(
                "verify_ssl",
                Bool,
                "check the server's TLS certificate (default true); false accepts any",
            ),
        ],
    },
    Kind {
        name: "postgres",
        raw_fields: &[],
        fields: &[
            required("command", StrOrList, "SQL statements, or a list of them"),
            field(
                "params",
                FieldType::List,
                "values bound to $1, $2... of a single statement",
            ),
            field("auth", Str, "keychain entry of kind postgres_credential"),
            field(
                "script",
                Object,
                "instead of `command`: load it from `source.type` inline, file or http (docs/tools.md, \"Scripts\")",
            ),
            field(
                "connection",
                Str,
                "instead of auth: a postgresql:// URL or key=value string",
            ),
            field(
                "transaction",
                Bool,
                "run several statements in one transaction (default true)",
            ),
        ],
    },
    Kind {
        name: "duckdb",
        raw_fields: &[],
        fields: &[
            required("command", StrOrList, "SQL statements, or a list of them"),
            field(
                "params",
                FieldType::List,
                "values bound to ? / $1... of a single statement",
            ),
            field("database", Str, "a DuckDB file (default: in memory)"),
            field(
                "tables",
                Object,
                "name: rows, created as temporary tables first",
            ),
            field(
                "script",
                Object,
                "instead of `command`: load it from `source.type` inline, file or http (docs/tools.md, \"Scripts\")",
            ),
        ],
    },
    Kind {
        name: "shell",
        raw_fields: &[],
        fields: &[
            field(
                "command",
                StrOrList,
                "a script run by /bin/sh -c, or a list: the program and its arguments, run without a shell",
            ),
            field(
                "cmds",
                StrOrList,
                "scripts run one after another by /bin/sh -c until one fails (NoETL's form)",
            ),
            field(
                "env",
                Object,
                "variables set for the process, on top of the executor's allow-list",
            ),
            field("cwd", Str, "the working directory"),
            field(
                "check",
                Bool,
                "a non-zero exit status is an error outcome (default true)",
            ),
        ],
    },
    Kind {
        name: "artifact",
        raw_fields: &[],
        fields: &[
            field("action", Str, "`get` (default) or `put`"),
            field("data", Any, "put: the value to store"),
            field(
                "uri",
                Str,
                "get: the `noetl://` reference to read; put: where to store (`noetl://artifacts/<path>`)",
            ),
            field(
                "result_ref",
                Any,
                "get: a reference object (what a put returned), or its `ref`",
            ),
        ],
    },
];

/// The kind of a task that calls a task of the root `workbook`: handled by
/// the executor runtime, so not in [`KINDS`], but a kind a task may have.
pub const WORKBOOK: &str = "workbook";

/// Every `kind:` a task may have: [`KINDS`] and [`WORKBOOK`].
pub fn task_kinds() -> impl Iterator<Item = &'static str> {
    KINDS.iter().map(|k| k.name).chain([WORKBOOK])
}

/// A tool kind NoETL has that this engine does not run, because it needs a
/// cloud account or a service the mesh does not run. `noetl validate`
/// refuses a task of such a kind (`E007`) naming what it needs, so it never
/// waits at run time for an executor that does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable {
    /// The `kind:` value.
    pub name: &'static str,
    /// What it needs, completing "it needs ...".
    pub needs: &'static str,
    /// What to do instead (the help line).
    pub instead: &'static str,
}

const fn unavailable_kind(
    name: &'static str,
    needs: &'static str,
    instead: &'static str,
) -> Unavailable {
    Unavailable {
        name,
        needs,
        instead,
    }
}

/// NoETL's tool kinds this engine refuses, and why (docs/tools.md,
/// "Kinds this engine does not run").
pub const UNAVAILABLE: &[Unavailable] = &[
    unavailable_kind(
        "snowflake",
        "a Snowflake account",
        "query Snowflake outside the playbook, or load its data with `postgres` / `duckdb` tasks",
    ),
    unavailable_kind(
        "snowflake_transfer",
        "a Snowflake account",
        "export from Snowflake outside the playbook and load the files with `duckdb` or `postgres`",
    ),
    unavailable_kind(
        "gcs",
        "Google Cloud Storage and a service account",
        "store values with `kind: artifact` (the mesh's object store, S3 or MinIO)",
    ),
    unavailable_kind(
        "google_id_token",
        "a Google Cloud service account",
        "store the token with `noetl credential put` and read it through the playbook's `keychain`",
    ),
    unavailable_kind(
        "secrets",
        "a cloud secret manager (Google Secret Manager, AWS Secrets Manager)",
        "store the value with `noetl credential put` and read it through the playbook's `keychain`",
    ),
    unavailable_kind(
        "container",
        "a Kubernetes cluster to run the container as a job",
        "run the program with `kind: shell` on the executor, or call the service over `http`",
    ),
    unavailable_kind(
        "script",
        "a Kubernetes cluster to run the script as a job (and cloud storage to fetch it from)",
        "run the script with `kind: python` or `kind: shell`",
    ),
    unavailable_kind(
        "subscription",
        "a message source the mesh does not run (Kafka, Google Pub/Sub) to drain",
        "read NATS messages and keys with `kind: nats`; feed other queues to the engine over `http` or NATS",
    ),
    unavailable_kind(
        "ducklake",
        "a DuckLake catalog and its cloud data store",
        "use `kind: duckdb` on local files, or `kind: postgres`",
    ),
    unavailable_kind(
        "agent",
        "an AI agent runtime (ADK, LangChain) and a model provider",
        "call the model's HTTP API with `kind: http`",
    ),
    unavailable_kind(
        "mcp",
        "an MCP server",
        "call the server's HTTP API with `kind: http`",
    ),
    unavailable_kind(
        "ollama_bridge",
        "an Ollama model server",
        "call Ollama's HTTP API with `kind: http`",
    ),
    unavailable_kind(
        "ibkr",
        "an Interactive Brokers account and gateway",
        "call the gateway's HTTP API with `kind: http`",
    ),
    unavailable_kind(
        "gateway",
        "NoETL's API gateway service",
        "call the service with `kind: http`",
    ),
];

/// The kind NoETL has and this engine refuses, named `name`.
pub fn unavailable(name: &str) -> Option<&'static Unavailable> {
    UNAVAILABLE.iter().find(|k| k.name == name)
}

/// The built-in kind named `name`.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// Whether `v` (JSON) may stand in a field of type `ty` before rendering.
pub fn fits(ty: FieldType, v: &Value) -> bool {
    let template = |s: &str| s.contains("{{") || s.contains("{%");
    match (ty, v) {
        (FieldType::Any, _) => true,
        (_, Value::String(s)) if template(s) => true,
        (FieldType::Str, Value::String(_)) => true,
        (FieldType::Bool, Value::Bool(_)) => true,
        (FieldType::Object, Value::Object(_)) => true,
        (FieldType::List, Value::Array(_)) => true,
        (FieldType::StrOrList, Value::String(_)) => true,
        (FieldType::StrOrList, Value::Array(a)) => a.iter().all(Value::is_string),
        (FieldType::Scalar, Value::String(_) | Value::Number(_)) => true,
        _ => false,
    }
}

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
