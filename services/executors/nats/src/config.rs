//! Task fields and credentials → one NATS operation and where to run it;
//! and the guard that keeps tasks off the mesh's own subjects, streams and
//! buckets. Plain functions, unit-tested here.

use noetl_core::timeout::{task_timeouts, TaskTimeouts};
use std::time::Duration;

use bytes::Bytes;
use noetl_core::tool::AuthCredential;
use serde_json::{Map, Value};

/// Default connect timeout.
pub const DEFAULT_CONNECT: Duration = Duration::from_secs(5);
/// Default bound of one operation (`spec.timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The operations, by their `operation` value (shared with `noetl validate`).
pub use noetl_core::field_rules::NATS_OPERATIONS as OPERATIONS;

/// Why a task cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No or an unknown `operation`.
    #[error("`operation` must be one of {ops}, got {0}", ops = OPERATIONS.join(", "))]
    Operation(String),
    /// A field the operation needs is missing or empty.
    #[error("`{field}` is required by `operation: {op}`")]
    Missing {
        /// The operation.
        op: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A field of the wrong shape.
    #[error("`{field}` {problem}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The credential has a kind the tool does not take.
    #[error("credential `{name}` is of kind {kind}; nats `auth` takes secret, basic or bearer")]
    Kind {
        /// Credential name.
        name: String,
        /// Its kind.
        kind: String,
    },
    /// The credential's fields conflict or are half given.
    #[error("credential `{name}`: {problem}")]
    Credential {
        /// Credential name.
        name: String,
        /// What is wrong (field names only).
        problem: String,
    },
    /// `spec.timeout` unusable.
    #[error(transparent)]
    Timeout(#[from] noetl_core::timeout::TimeoutError),
}

/// A task would address what belongs to the mesh itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {name:?} belongs to {owner}; nats tasks may not address it (docs/security.md)")]
pub struct Protected {
    /// `subject`, `bucket`, `stream`.
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// Whose it is.
    pub owner: String,
}

/// How `object_get` returns the object and `object_put` reads `data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Text (`utf-8`, the default); `object_get` parses JSON text.
    Text,
    /// Base64 text of the bytes.
    Base64,
}

/// One operation, with its payload already encoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Core NATS publish (no acknowledgement).
    Publish {
        /// Subject.
        subject: String,
        /// Payload.
        payload: Bytes,
        /// Headers.
        headers: Vec<(String, String)>,
    },
    /// JetStream publish, acknowledged by the stream that stores it.
    JsPublish {
        /// Subject.
        subject: String,
        /// Payload.
        payload: Bytes,
        /// Headers.
        headers: Vec<(String, String)>,
        /// The stream that must store it (`Nats-Expected-Stream`).
        stream: Option<String>,
    },
    /// Request/reply within the read timeout.
    Request {
        /// Subject.
        subject: String,
        /// Payload.
        payload: Bytes,
        /// Headers.
        headers: Vec<(String, String)>,
    },
    /// Read a key.
    KvGet {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
    },
    /// Write a key (the bucket is created when missing).
    KvPut {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
        /// Value.
        value: Bytes,
    },
    /// Delete a key.
    KvDelete {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
    },
    /// List the keys of a bucket.
    KvKeys {
        /// Bucket.
        bucket: String,
    },
    /// Read an object.
    ObjectGet {
        /// Bucket.
        bucket: String,
        /// Object name.
        name: String,
        /// How to return it.
        encoding: Encoding,
    },
    /// Write an object (the bucket is created when missing).
    ObjectPut {
        /// Bucket.
        bucket: String,
        /// Object name.
        name: String,
        /// Its bytes.
        data: Bytes,
        /// Description stored with it.
        description: Option<String>,
    },
    /// Delete an object.
    ObjectDelete {
        /// Bucket.
        bucket: String,
        /// Object name.
        name: String,
    },
}

impl Op {
    /// The `operation` value.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Publish { .. } => "publish",
            Op::JsPublish { .. } => "js_publish",
            Op::Request { .. } => "request",
            Op::KvGet { .. } => "kv_get",
            Op::KvPut { .. } => "kv_put",
            Op::KvDelete { .. } => "kv_delete",
            Op::KvKeys { .. } => "kv_keys",
            Op::ObjectGet { .. } => "object_get",
            Op::ObjectPut { .. } => "object_put",
            Op::ObjectDelete { .. } => "object_delete",
        }
    }

    /// The subject, bucket and stream names it addresses.
    fn names(&self) -> Vec<(&'static str, &str)> {
        match self {
            Op::Publish { subject, .. } | Op::Request { subject, .. } => {
                vec![("subject", subject.as_str())]
            }
            Op::JsPublish {
                subject, stream, ..
            } => {
                let mut v = vec![("subject", subject.as_str())];
                if let Some(s) = stream {
                    v.push(("stream", s.as_str()));
                }
                v
            }
            Op::KvGet { bucket, .. }
            | Op::KvPut { bucket, .. }
            | Op::KvDelete { bucket, .. }
            | Op::KvKeys { bucket }
            | Op::ObjectGet { bucket, .. }
            | Op::ObjectPut { bucket, .. }
            | Op::ObjectDelete { bucket, .. } => vec![("bucket", bucket.as_str())],
        }
    }
}

/// A JSON value as message bytes: a string as its text, `null` as
/// nothing, anything else as JSON.
pub fn to_bytes(v: &Value) -> Bytes {
    match v {
        Value::Null => Bytes::new(),
        Value::String(s) => Bytes::from(s.clone()),
        other => Bytes::from(other.to_string()),
    }
}

/// Message bytes as JSON: parsed when they are JSON, else their text;
/// bytes that are not UTF-8 as `{"base64": ...}`.
pub fn from_bytes(b: &[u8]) -> Value {
    use base64::Engine as _;
    match std::str::from_utf8(b) {
        Ok("") => Value::Null,
        Ok(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string())),
        Err(_) => serde_json::json!({
            "base64": base64::engine::general_purpose::STANDARD.encode(b)
        }),
    }
}

fn text(config: &Map<String, Value>, field: &'static str) -> Result<Option<String>, ConfigError> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(v) => Err(ConfigError::Field {
            field,
            problem: format!("must be a string, got {}", noetl_core::json_type(v)),
        }),
    }
}

fn need(
    config: &Map<String, Value>,
    op: &'static str,
    field: &'static str,
) -> Result<String, ConfigError> {
    text(config, field)?.ok_or(ConfigError::Missing { op, field })
}

fn headers(config: &Map<String, Value>) -> Result<Vec<(String, String)>, ConfigError> {
    match config.get("headers") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => Ok(m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), v)
            })
            .collect()),
        Some(v) => Err(ConfigError::Field {
            field: "headers",
            problem: format!("must be a mapping, got {}", noetl_core::json_type(v)),
        }),
    }
}

fn encoding(config: &Map<String, Value>) -> Result<Encoding, ConfigError> {
    match text(config, "encoding")?.as_deref() {
        None | Some("utf-8" | "utf8" | "text") => Ok(Encoding::Text),
        Some("base64") => Ok(Encoding::Base64),
        Some(other) => Err(ConfigError::Field {
            field: "encoding",
            problem: format!("must be `utf-8` or `base64`, got {other:?}"),
        }),
    }
}

/// The operation a task's fields ask for.
pub fn operation(config: &Map<String, Value>) -> Result<Op, ConfigError> {
    let op = text(config, "operation")?.unwrap_or_default();
    let op: &'static str = OPERATIONS
        .iter()
        .find(|o| **o == op)
        .copied()
        .ok_or_else(|| ConfigError::Operation(format!("{op:?}")))?;
    let payload = || to_bytes(config.get("data").unwrap_or(&Value::Null));
    Ok(match op {
        "publish" => Op::Publish {
            subject: need(config, op, "subject")?,
            payload: payload(),
            headers: headers(config)?,
        },
        "js_publish" => Op::JsPublish {
            subject: need(config, op, "subject")?,
            payload: payload(),
            headers: headers(config)?,
            stream: text(config, "stream")?,
        },
        "request" => Op::Request {
            subject: need(config, op, "subject")?,
            payload: payload(),
            headers: headers(config)?,
        },
        "kv_get" => Op::KvGet {
            bucket: need(config, op, "bucket")?,
            key: need(config, op, "key")?,
        },
        "kv_put" => Op::KvPut {
            bucket: need(config, op, "bucket")?,
            key: need(config, op, "key")?,
            value: to_bytes(config.get("value").unwrap_or(&Value::Null)),
        },
        "kv_delete" => Op::KvDelete {
            bucket: need(config, op, "bucket")?,
            key: need(config, op, "key")?,
        },
        "kv_keys" => Op::KvKeys {
            bucket: need(config, op, "bucket")?,
        },
        "object_get" => Op::ObjectGet {
            bucket: need(config, op, "bucket")?,
            name: need(config, op, "object")?,
            encoding: encoding(config)?,
        },
        "object_put" => {
            let data = match (encoding(config)?, config.get("data")) {
                (Encoding::Base64, Some(Value::String(s))) => {
                    use base64::Engine as _;
                    Bytes::from(
                        base64::engine::general_purpose::STANDARD
                            .decode(s.trim())
                            .map_err(|e| ConfigError::Field {
                                field: "data",
                                problem: format!("is not base64: {e}"),
                            })?,
                    )
                }
                (_, v) => to_bytes(v.unwrap_or(&Value::Null)),
            };
            Op::ObjectPut {
                bucket: need(config, op, "bucket")?,
                name: need(config, op, "object")?,
                data,
                description: text(config, "description")?,
            }
        }
        _ => Op::ObjectDelete {
            bucket: need(config, op, "bucket")?,
            name: need(config, op, "object")?,
        },
    })
}

/// Refuse what belongs to the mesh whose prefix is `prefix`, or to NATS
/// itself: subjects under `<prefix>.`, `$...` (the JetStream, KV, object
/// store and system APIs) and `_INBOX.` (other clients' replies); streams
/// and buckets named `<prefix>_...` (the mesh's `NOETL_WORK`,
/// `noetl_exec`...). Names compare without regard to case. Also refuses
/// wildcards in a subject a message is sent to.
pub fn check_protected(prefix: &str, op: &Op) -> Result<(), Protected> {
    let mesh = || format!("the NoETL mesh (prefix {prefix:?})");
    for (what, name) in op.names() {
        let lower = name.to_ascii_lowercase();
        let refuse = |owner: String| {
            Err(Protected {
                what,
                name: name.to_string(),
                owner,
            })
        };
        if what == "subject" {
            let first = lower.split('.').next().unwrap_or("");
            if first == prefix.to_ascii_lowercase() {
                return refuse(mesh());
            }
            if lower.starts_with('$') {
                return refuse("the NATS server's own APIs ($JS, $KV, $O, $SYS)".into());
            }
            if first == "_inbox" {
                return refuse("another client's replies (_INBOX)".into());
            }
            if name.split('.').any(|t| t == "*" || t == ">") {
                return refuse("no one: a message is sent to one subject, not a wildcard".into());
            }
        } else if lower.starts_with(&format!("{}_", prefix.to_ascii_lowercase())) {
            return refuse(mesh());
        }
    }
    Ok(())
}

/// How a task authenticates, from its keychain credential. `Debug` shows
/// no secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CredAuth {
    /// Servers from the credential (`url`, `nats_url`, `server`, `servers`).
    pub urls: Option<String>,
    /// User and password.
    pub user_password: Option<(String, String)>,
    /// A token.
    pub token: Option<String>,
    /// The text of a `.creds` file (JWT + nkey seed).
    pub creds: Option<String>,
    /// An nkey user seed (`SU...`).
    pub nkey_seed: Option<String>,
}

impl std::fmt::Debug for CredAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredAuth")
            .field(
                "urls",
                &self.urls.as_deref().map(noetl_mesh::connect::display_urls),
            )
            .field("user", &self.user_password.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

/// A credential's NATS settings. Kinds: `secret` (any of the fields
/// below), `basic` (`username`, `password`), `bearer` (`token`); fields
/// under NoETL's names too (`nats_url`, `nats_user`, `nats_password`,
/// `nats_token`).
pub fn cred_auth(c: &AuthCredential) -> Result<CredAuth, ConfigError> {
    if !matches!(c.kind.as_str(), "secret" | "basic" | "bearer" | "nats") {
        return Err(ConfigError::Kind {
            name: c.name.clone(),
            kind: c.kind.clone(),
        });
    }
    let get = |names: &[&str]| {
        names.iter().find_map(|n| match c.data.get(*n) {
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_string()),
            _ => None,
        })
    };
    let user = get(&["user", "username", "nats_user"]);
    let password = get(&["password", "nats_password"]);
    let out = CredAuth {
        urls: get(&["url", "nats_url", "servers", "server"]),
        user_password: user.clone().zip(password.clone()),
        token: get(&["token", "nats_token"]),
        creds: get(&["creds", "nats_creds"]),
        nkey_seed: get(&["nkey_seed", "nkey", "seed"]),
    };
    let bad = |problem: &str| ConfigError::Credential {
        name: c.name.clone(),
        problem: problem.into(),
    };
    if user.is_some() != password.is_some() {
        return Err(bad("`user` and `password` must be given together"));
    }
    let methods = [
        out.user_password.is_some(),
        out.token.is_some(),
        out.creds.is_some(),
        out.nkey_seed.is_some(),
    ];
    if methods.iter().filter(|m| **m).count() > 1 {
        return Err(bad(
            "choose one of user/password, token, creds or nkey_seed",
        ));
    }
    if let Some(seed) = &out.nkey_seed {
        if !seed.starts_with("SU") {
            return Err(bad("`nkey_seed` must be a user seed (starting with SU)"));
        }
    }
    Ok(out)
}

/// `(connect, operation)` timeouts from `spec.timeout` (docs/tools.md).
pub fn timeouts(spec: &Value) -> Result<(Duration, Duration), ConfigError> {
    let defaults = TaskTimeouts {
        connect: DEFAULT_CONNECT,
        read: DEFAULT_TIMEOUT,
    };
    let t = task_timeouts(spec, defaults)?;
    Ok((t.connect, t.read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn op(v: Value) -> Result<Op, ConfigError> {
        operation(v.as_object().unwrap())
    }

    #[test]
    fn fields_become_an_operation() {
        let o = op(
            json!({"operation": "kv_put", "bucket": "sessions", "key": "k1", "value": {"a": 1}}),
        )
        .unwrap();
        assert_eq!(
            o,
            Op::KvPut {
                bucket: "sessions".into(),
                key: "k1".into(),
                value: Bytes::from_static(br#"{"a":1}"#)
            }
        );
        let o = op(json!({"operation": "publish", "subject": "a.b", "data": "hi"})).unwrap();
        assert!(matches!(o, Op::Publish { ref payload, .. } if payload == "hi"));
        let e = op(json!({"operation": "kv_get", "bucket": "b"})).unwrap_err();
        assert_eq!(e.to_string(), "`key` is required by `operation: kv_get`");
        let e = op(json!({"operation": "kv_read"})).unwrap_err().to_string();
        assert!(e.contains("kv_get") && e.contains("\"kv_read\""), "{e}");
        let o = op(json!({"operation": "object_put", "bucket": "b", "object": "n", "data": "aGk=", "encoding": "base64"}))
            .unwrap();
        assert!(matches!(o, Op::ObjectPut { ref data, .. } if data == "hi"));
    }

    #[test]
    fn values_round_trip_as_json_or_text() {
        assert_eq!(
            from_bytes(&to_bytes(&json!({"a": [1, 2]}))),
            json!({"a": [1, 2]})
        );
        assert_eq!(
            from_bytes(&to_bytes(&json!("plain text"))),
            json!("plain text")
        );
        assert_eq!(from_bytes(&to_bytes(&json!(7))), json!(7));
        assert_eq!(from_bytes(&[0xff, 0x00]), json!({"base64": "/wA="}));
    }

    #[test]
    fn the_mesh_and_the_server_apis_are_out_of_reach() {
        let sub = |s: &str| Op::Publish {
            subject: s.into(),
            payload: Bytes::new(),
            headers: vec![],
        };
        let bucket = |b: &str| Op::KvGet {
            bucket: b.into(),
            key: "k".into(),
        };
        for s in [
            "noetl.exec.request",
            "NOETL.task.python",
            "$JS.API.STREAM.DELETE.NOETL_WORK",
            "$KV.noetl_ctx.e1",
            "_INBOX.abc",
            "orders.*",
        ] {
            assert!(check_protected("noetl", &sub(s)).is_err(), "{s}");
        }
        for b in ["noetl_exec", "NOETL_WORK", "Noetl_credentials"] {
            let e = check_protected("noetl", &bucket(b)).unwrap_err();
            assert!(e.to_string().contains("prefix \"noetl\""), "{e}");
        }
        assert!(check_protected("noetl", &sub("orders.created")).is_ok());
        assert!(check_protected("noetl", &sub("noetlx.a")).is_ok());
        assert!(check_protected("noetl", &bucket("sessions")).is_ok());
        // Another prefix guards its own names, not NoETL's default ones.
        assert!(check_protected("acme", &bucket("noetl_exec")).is_ok());
        assert!(check_protected("acme", &bucket("acme_ctx")).is_err());
        let js = Op::JsPublish {
            subject: "orders.x".into(),
            payload: Bytes::new(),
            headers: vec![],
            stream: Some("NOETL_EVENTS".into()),
        };
        assert!(check_protected("noetl", &js).is_err());
    }

    #[test]
    fn credentials_give_one_way_to_authenticate() {
        let cred = |kind: &str, data: Value| AuthCredential {
            name: "n".into(),
            kind: kind.into(),
            data,
        };
        let a = cred_auth(&cred(
            "secret",
            json!({"nats_url": "nats://h:4222", "nats_user": "u", "nats_password": "p"}),
        ))
        .unwrap();
        assert_eq!(a.urls.as_deref(), Some("nats://h:4222"));
        assert_eq!(a.user_password, Some(("u".into(), "p".into())));
        assert!(!format!("{a:?}").contains("\"p\""), "{a:?}");
        let t = cred_auth(&cred("bearer", json!({"token": "tok"}))).unwrap();
        assert_eq!(t.token.as_deref(), Some("tok"));
        let e = cred_auth(&cred("postgres_credential", json!({"user": "u"}))).unwrap_err();
        assert!(e.to_string().contains("secret, basic or bearer"), "{e}");
        let e = cred_auth(&cred("secret", json!({"user": "u"}))).unwrap_err();
        assert!(e.to_string().contains("together"), "{e}");
        let e = cred_auth(&cred(
            "secret",
            json!({"token": "t", "user": "u", "password": "p"}),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("choose one"), "{e}");
    }

    #[test]
    fn timeouts_take_seconds_or_connect_and_read() {
        assert_eq!(
            timeouts(&json!({"timeout": 2})).unwrap(),
            (Duration::from_secs(2), Duration::from_secs(2))
        );
        assert_eq!(
            timeouts(&json!({"timeout": {"read": 0.5}})).unwrap(),
            (DEFAULT_CONNECT, Duration::from_millis(500))
        );
        assert!(timeouts(&json!({"timeout": -1})).is_err());
    }
}
