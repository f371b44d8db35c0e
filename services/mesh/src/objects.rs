//! Results by reference: values too large to ride in messages and KV are
//! written to object storage (a local directory by default, S3/MinIO when
//! configured) and travel as a small reference object:
//!
//! ```json
//! {"ref": "noetl://execution/<eid>/result/<step>/<id>", "store": "local",
//!  "key": "execution/<eid>/result/<step>/<id>.json", "size": 123456,
//!  "checksum": "sha256:<hex>", "preview": "<first bytes of the JSON>"}
//! ```
//!
//! Readers hydrate a reference back into the value ([`ResultStore::hydrate`])
//! where a template, a tool or `loop.in` reads into it; the checksum is
//! verified on every read. Objects are immutable: a key is written once.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::{path::Path as ObjectPath, ObjectStore, PutPayload};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Scheme of a reference's `ref` field.
pub const REF_SCHEME: &str = "noetl://";

/// Characters of the JSON kept as a reference's `preview`.
pub const PREVIEW_CHARS: usize = 256;

/// Where results are stored.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A local directory (all services must share it: one host, or a
    /// shared volume).
    Local(PathBuf),
    /// An S3-compatible bucket.
    S3(S3Location),
}

/// An S3-compatible bucket and how to reach it.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Location {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix inside the bucket (may be empty).
    pub prefix: String,
    /// Endpoint URL for MinIO and other S3-compatible servers
    /// (`NOETL_S3_ENDPOINT`); `None` = AWS.
    pub endpoint: Option<String>,
    /// Region (`AWS_REGION`, default `us-east-1`).
    pub region: String,
    /// Access key id (`AWS_ACCESS_KEY_ID`).
    pub access_key_id: Option<String>,
    /// Secret access key (`AWS_SECRET_ACCESS_KEY`); never printed.
    pub secret_access_key: Option<String>,
}

impl std::fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(p) => write!(f, "Local({})", p.display()),
            Self::S3(s) => f
                .debug_struct("S3")
                .field("bucket", &s.bucket)
                .field("prefix", &s.prefix)
                .field("endpoint", &s.endpoint)
                .field("region", &s.region)
                .field("access_key_id", &s.access_key_id)
                .field(
                    "secret_access_key",
                    &s.secret_access_key.as_ref().map(|_| "[redacted]"),
                )
                .finish(),
        }
    }
}

impl StoreLocation {
    /// Parse `NOETL_OBJECT_STORE`: `s3://bucket[/prefix]`, `file:///dir` or
    /// a directory path. S3 settings come from `NOETL_S3_ENDPOINT`,
    /// `AWS_REGION`, `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    pub fn parse(spec: &str) -> Result<Self, ObjectError> {
        if let Some(rest) = spec.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(ObjectError::Config(format!(
                    "NOETL_OBJECT_STORE={spec:?} names no bucket (use s3://BUCKET[/PREFIX])"
                )));
            }
            let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            return Ok(Self::S3(S3Location {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
                endpoint: var("NOETL_S3_ENDPOINT"),
                region: var("AWS_REGION").unwrap_or_else(|| "us-east-1".into()),
                access_key_id: var("AWS_ACCESS_KEY_ID"),
                secret_access_key: var("AWS_SECRET_ACCESS_KEY"),
            }));
        }
        let path = spec.strip_prefix("file://").unwrap_or(spec);
        if path.is_empty() || spec.contains("://") && !spec.starts_with("file://") {
            return Err(ObjectError::Config(format!(
                "NOETL_OBJECT_STORE={spec:?}: use s3://BUCKET[/PREFIX], file:///DIR or a directory"
            )));
        }
        Ok(Self::Local(PathBuf::from(path)))
    }

    /// `local` or `s3`, as reference objects name it.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Local(_) => "local",
            Self::S3(_) => "s3",
        }
    }
}

/// Object storage errors. Each names the key and the store.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The store cannot be set up.
    #[error("object store: {0}")]
    Config(String),
    /// Writing an object failed.
    #[error("object store ({store}): writing {key} failed: {message}")]
    Write {
        /// `local` / `s3`.
        store: String,
        /// Object key.
        key: String,
        /// Cause.
        message: String,
    },
    /// Reading an object failed (missing, unreachable).
    #[error("object store ({store}): reading {key} failed: {message}")]
    Read {
        /// `local` / `s3`.
        store: String,
        /// Object key.
        key: String,
        /// Cause.
        message: String,
    },
    /// The object a reference names is not there (deleted, or another
    /// store than the one that wrote it).
    #[error("object store ({store}): {key} does not exist (was it deleted, or do the services use different stores?)")]
    Missing {
        /// `local` / `s3`.
        store: String,
        /// Object key.
        key: String,
    },
    /// The object does not match its reference.
    #[error("object store ({store}): {key} is corrupt: {message}")]
    Corrupt {
        /// `local` / `s3`.
        store: String,
        /// Object key.
        key: String,
        /// What did not match.
        message: String,
    },
}

/// What [`ResultStore::put`] stores.
pub struct PutParams<'a> {
    /// Execution id.
    pub execution_id: &'a str,
    /// Step name.
    pub step: &'a str,
    /// A deterministic id (the same input writes the same key, so a
    /// redelivered write is harmless).
    pub id: &'a str,
    /// The value.
    pub value: &'a Value,
}

/// The result store of a mesh endpoint.
#[derive(Clone)]
pub struct ResultStore {
    inner: Arc<dyn ObjectStore>,
    location: StoreLocation,
}

impl std::fmt::Debug for ResultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ResultStore({:?})", self.location)
    }
}

/// True when `v` is a result reference.
pub fn is_ref(v: &Value) -> bool {
    v.get("ref")
        .and_then(Value::as_str)
        .is_some_and(|r| r.starts_with(REF_SCHEME))
        && v.get("key").and_then(Value::as_str).is_some()
}

impl ObjectError {
    /// True when retrying cannot help (the object is gone or corrupt).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::Missing { .. } | Self::Corrupt { .. } | Self::Config(_)
        )
    }
}

impl ResultStore {
    /// Open (and for a local directory, create) the store.
    pub fn open(location: StoreLocation) -> Result<Self, ObjectError> {
        let inner: Arc<dyn ObjectStore> = match &location {
            StoreLocation::Local(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    ObjectError::Config(format!("cannot create {}: {e}", dir.display()))
                })?;
                Arc::new(
                    object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(|e| {
                        ObjectError::Config(format!("cannot use {}: {e}", dir.display()))
                    })?,
                )
            }
            StoreLocation::S3(s3) => {
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(&s3.bucket)
                    .with_region(&s3.region);
                if let Some(e) = &s3.endpoint {
                    b = b
                        .with_endpoint(e)
                        .with_allow_http(e.starts_with("http://"))
                        .with_virtual_hosted_style_request(false);
                }
                if let Some(k) = &s3.access_key_id {
                    b = b.with_access_key_id(k);
                }
                if let Some(k) = &s3.secret_access_key {
                    b = b.with_secret_access_key(k);
                }
                let store = b
                    .build()
                    .map_err(|e| ObjectError::Config(format!("S3 bucket {:?}: {e}", s3.bucket)))?;
                if s3.prefix.is_empty() {
                    Arc::new(store)
                } else {
                    Arc::new(object_store::prefix::PrefixStore::new(
                        store,
                        s3.prefix.as_str(),
                    ))
                }
            }
        };
        Ok(Self { inner, location })
    }

    /// Where it stores.
    pub fn location(&self) -> &StoreLocation {
        &self.location
    }

    fn label(&self) -> String {
        self.location.label().to_string()
    }

    /// Write `p.value` and return its reference.
    pub async fn put(&self, p: PutParams<'_>) -> Result<Value, ObjectError> {
        let text = p.value.to_string();
        let name = format!(
            "execution/{}/result/{}/{}",
            segment(p.execution_id),
            segment(p.step),
            segment(p.id)
        );
        let key = format!("{name}.json");
        let checksum = format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())));
        let mut end = PREVIEW_CHARS.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let preview = text[..end].to_string();
        let size = text.len();
        self.inner
            .put(&ObjectPath::from(key.as_str()), PutPayload::from(text))
            .await
            .map_err(|e| ObjectError::Write {
                store: self.label(),
                key: key.clone(),
                message: e.to_string(),
            })?;
        Ok(json!({
            "ref": format!("{REF_SCHEME}{name}"),
            "store": self.location.label(),
            "key": key,
            "size": size,
            "checksum": checksum,
            "preview": preview,
        }))
    }

    /// `value` itself when its JSON is at most `limit` bytes, else its
    /// reference (written under `p`'s key).
    pub async fn offload(&self, p: PutParams<'_>, limit: usize) -> Result<Value, ObjectError> {
        if is_small(p.value, limit) || is_ref(p.value) {
            return Ok(p.value.clone());
        }
        self.put(p).await
    }

    /// The value a reference stands for (checksum verified); any other
    /// value is returned as it is.
    pub async fn hydrate(&self, v: Value) -> Result<Value, ObjectError> {
        if !is_ref(&v) {
            return Ok(v);
        }
        let key = v["key"].as_str().unwrap_or_default().to_string();
        let bytes = self
            .inner
            .get(&ObjectPath::from(key.as_str()))
            .await
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => ObjectError::Missing {
                    store: self.label(),
                    key: key.clone(),
                },
                e => ObjectError::Read {
                    store: self.label(),
                    key: key.clone(),
                    message: e.to_string(),
                },
            })?
            .bytes()
            .await
            .map_err(|e| ObjectError::Read {
                store: self.label(),
                key: key.clone(),
                message: e.to_string(),
            })?;
        if let Some(want) = v.get("checksum").and_then(Value::as_str) {
            let got = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
            if got != want {
                return Err(ObjectError::Corrupt {
                    store: self.label(),
                    key,
                    message: format!("checksum {got} does not match the reference's {want}"),
                });
            }
        }
        serde_json::from_slice(&bytes).map_err(|e| ObjectError::Corrupt {
            store: self.label(),
            key,
            message: format!("not JSON: {e}"),
        })
    }

    /// Delete every object of an execution (best effort; returns how many).
    pub async fn purge_execution(&self, execution_id: &str) -> Result<usize, ObjectError> {
        use futures::StreamExt;
        let prefix = ObjectPath::from(format!("execution/{}", segment(execution_id)));
        let mut listing = self.inner.list(Some(&prefix));
        let mut n = 0;
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| ObjectError::Read {
                store: self.label(),
                key: prefix.to_string(),
                message: e.to_string(),
            })?;
            if self.inner.delete(&meta.location).await.is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// True when `v`'s JSON fits in `limit` bytes (scalars always do).
pub fn is_small(v: &Value, limit: usize) -> bool {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => true,
        Value::String(s) => s.len() + 2 <= limit,
        _ => v.to_string().len() <= limit,
    }
}

/// A path segment safe for every backend.
fn segment(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn large_values_round_trip_by_reference_on_a_local_dir() {
        let dir = tempfile::tempdir().unwrap();
        let store = ResultStore::open(StoreLocation::Local(dir.path().into())).unwrap();
        let small = json!({"a": 1});
        let p = |v| PutParams {
            execution_id: "e1",
            step: "fetch",
            id: "r1",
            value: v,
        };
        assert_eq!(store.offload(p(&small), 100).await.unwrap(), small);
        let big = json!({"rows": (0..1000).map(|i| json!({"i": i, "s": "ü"})).collect::<Vec<_>>()});
        let r = store.offload(p(&big), 100).await.unwrap();
        assert!(is_ref(&r), "{r}");
        assert_eq!(r["ref"], "noetl://execution/e1/result/fetch/r1");
        assert_eq!(r["store"], "local");
        assert_eq!(r["size"], big.to_string().len());
        assert!(r["preview"].as_str().unwrap().len() <= PREVIEW_CHARS);
        assert!(dir
            .path()
            .join("execution/e1/result/fetch/r1.json")
            .is_file());
        assert_eq!(store.hydrate(r.clone()).await.unwrap(), big);

        // A missing object is a permanent error naming the key.
        let mut gone = r.clone();
        gone["key"] = json!("execution/e1/result/fetch/nope.json");
        let e = store.hydrate(gone).await.unwrap_err();
        assert!(e.is_permanent());
        assert!(e.to_string().contains("nope.json does not exist"), "{e}");
        // A tampered object is refused, naming the key.
        std::fs::write(dir.path().join("execution/e1/result/fetch/r1.json"), "[1]").unwrap();
        let err = store.hydrate(r).await.unwrap_err().to_string();
        assert!(err.contains("execution/e1/result/fetch/r1.json"), "{err}");
        assert!(err.contains("checksum"), "{err}");
        assert_eq!(store.purge_execution("e1").await.unwrap(), 1);
    }

    #[test]
    fn locations_parse_and_never_print_the_secret() {
        assert_eq!(
            StoreLocation::parse("/tmp/x").unwrap(),
            StoreLocation::Local("/tmp/x".into())
        );
        assert_eq!(
            StoreLocation::parse("file:///tmp/y").unwrap(),
            StoreLocation::Local("/tmp/y".into())
        );
        assert!(StoreLocation::parse("s3://").is_err());
        assert!(StoreLocation::parse("gs://b").is_err());
        let loc = StoreLocation::S3(S3Location {
            bucket: "b".into(),
            prefix: "p".into(),
            endpoint: None,
            region: "r".into(),
            access_key_id: Some("AK".into()),
            secret_access_key: Some("very-secret-value".into()),
        });
        assert!(!format!("{loc:?}").contains("very-secret-value"));
    }
}
