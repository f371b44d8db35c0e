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
use serde_json::Value;
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
    /// (`NOETL_S3_ENDPOINT`); `None` = the environment's (`AWS_ENDPOINT_URL_S3`,
    /// `AWS_ENDPOINT_URL`, `AWS_ENDPOINT`), else AWS.
    pub endpoint: Option<String>,
    /// Region (`AWS_REGION`, else `AWS_DEFAULT_REGION`, else `us-east-1`).
    pub region: String,
    /// Access key id (`AWS_ACCESS_KEY_ID`, or from `NOETL_S3_CREDENTIAL`).
    pub access_key_id: Option<String>,
    /// Secret access key (`AWS_SECRET_ACCESS_KEY`, or from
    /// `NOETL_S3_CREDENTIAL`); never printed.
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

/// The process environment as `(name, value)` pairs (values that are not
/// UTF-8 are left out, as object_store's `from_env` does).
pub fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// The non-empty value of `name` in `env`.
fn env_var<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

impl StoreLocation {
    /// Parse `NOETL_OBJECT_STORE`: `s3://bucket[/prefix]`, `file:///dir` or
    /// a directory path, reading the S3 settings from the process
    /// environment (see [`StoreLocation::parse_with_env`]).
    pub fn parse(spec: &str) -> Result<Self, ObjectError> {
        Self::parse_with_env(spec, &process_env())
    }

    /// [`StoreLocation::parse`] with the environment given: S3 settings
    /// come from `NOETL_S3_ENDPOINT`, `AWS_REGION` (else
    /// `AWS_DEFAULT_REGION`, else `us-east-1`), `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`; [`ResultStore::open_with_env`] adds the
    /// rest of the `AWS_*` settings.
    pub fn parse_with_env(spec: &str, env: &[(String, String)]) -> Result<Self, ObjectError> {
        if let Some(rest) = spec.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(ObjectError::Config(format!(
                    "NOETL_OBJECT_STORE={spec:?} names no bucket (use s3://BUCKET[/PREFIX])"
                )));
            }
            let var = |k: &str| env_var(env, k).map(str::to_string);
            return Ok(Self::S3(S3Location {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
                endpoint: var("NOETL_S3_ENDPOINT"),
                region: var("AWS_REGION")
                    .or_else(|| var("AWS_DEFAULT_REGION"))
                    .unwrap_or_else(|| "us-east-1".into()),
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

/// A result stored by reference, as it stands in place of the value (in
/// events, KV, args and `_prev`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reference {
    /// `noetl://<execution>/<step>/<id>`.
    #[serde(rename = "ref")]
    pub reference: String,
    /// `local` or `s3`.
    pub store: String,
    /// The object's key.
    pub key: String,
    /// Bytes of its JSON.
    pub size: usize,
    /// `sha256:<hex>` of those bytes.
    pub checksum: String,
    /// Its first bytes, for people reading events.
    pub preview: String,
}

impl Reference {
    /// The reference `v` is, if it is one ([`is_ref`]).
    pub fn of(v: &Value) -> Option<Self> {
        if !is_ref(v) {
            return None;
        }
        serde_json::from_value(v.clone()).ok()
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

/// The S3 client settings: every `AWS_*` setting object_store knows, read
/// from `env` as `AmazonS3Builder::from_env` reads the process
/// environment (keys, `AWS_SESSION_TOKEN`, `AWS_ENDPOINT`,
/// `AWS_ALLOW_HTTP`, container credentials, ...), plus
/// `AWS_ENDPOINT_URL_S3`; then what `location` sets on top: bucket,
/// region, `NOETL_S3_ENDPOINT` (path-style, HTTP allowed for `http://`)
/// and keys (`NOETL_S3_CREDENTIAL`). An endpoint from the environment that
/// is `http://` allows HTTP unless `AWS_ALLOW_HTTP` says otherwise. The
/// environment's session token is dropped when the location's access key
/// is not the environment's (it belongs to other keys). IRSA
/// (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`) is read by object_store
/// from the process environment when no keys are set.
pub fn s3_builder(s3: &S3Location, env: &[(String, String)]) -> object_store::aws::AmazonS3Builder {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use object_store::ClientConfigKey;
    let foreign_keys = s3.access_key_id.is_some()
        && s3.access_key_id.as_deref() != env_var(env, "AWS_ACCESS_KEY_ID");
    let mut b = AmazonS3Builder::new();
    for (k, v) in env {
        if !k.starts_with("AWS_") || v.is_empty() {
            continue;
        }
        let Ok(key) = k.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() else {
            continue;
        };
        if foreign_keys && key == AmazonS3ConfigKey::Token {
            continue;
        }
        b = b.with_config(key, v);
    }
    if let Some(e) = env_var(env, "AWS_ENDPOINT_URL_S3") {
        b = b.with_endpoint(e);
    }
    b = b.with_bucket_name(&s3.bucket).with_region(&s3.region);
    if let Some(e) = &s3.endpoint {
        b = b
            .with_endpoint(e)
            .with_allow_http(e.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    } else if env_var(env, "AWS_ALLOW_HTTP").is_none()
        && b.get_config_value(&AmazonS3ConfigKey::Endpoint)
            .is_some_and(|e| e.starts_with("http://"))
    {
        b = b.with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp),
            "true",
        );
    }
    if let Some(k) = &s3.access_key_id {
        b = b.with_access_key_id(k);
    }
    if let Some(k) = &s3.secret_access_key {
        b = b.with_secret_access_key(k);
    }
    b
}

impl ResultStore {
    /// Open (and for a local directory, create) the store, with the S3
    /// client settings of the process environment.
    pub fn open(location: StoreLocation) -> Result<Self, ObjectError> {
        Self::open_with_env(location, &process_env())
    }

    /// [`ResultStore::open`] with the environment given (see
    /// [`s3_builder`]).
    pub fn open_with_env(
        location: StoreLocation,
        env: &[(String, String)],
    ) -> Result<Self, ObjectError> {
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
                let store = s3_builder(s3, env)
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
        let name = format!(
            "execution/{}/result/{}/{}",
            segment(p.execution_id),
            segment(p.step),
            segment(p.id)
        );
        self.put_at(name, p.value).await
    }

    /// Write `value` under `name` (`/`-separated; each segment made safe
    /// for every backend) and return its reference. An object already
    /// there is replaced.
    pub async fn put_named(&self, name: &str, value: &Value) -> Result<Value, ObjectError> {
        let name = name
            .split('/')
            .filter(|s| !s.is_empty())
            .map(segment)
            .collect::<Vec<_>>()
            .join("/");
        if name.is_empty() {
            return Err(ObjectError::Config("an object needs a name".into()));
        }
        self.put_at(name, value).await
    }

    async fn put_at(&self, name: String, value: &Value) -> Result<Value, ObjectError> {
        let text = value.to_string();
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
        Ok(serde_json::to_value(Reference {
            reference: format!("{REF_SCHEME}{name}"),
            store: self.location.label().to_string(),
            key,
            size,
            checksum,
            preview,
        })
        .expect("a reference serialises"))
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
        let reference: Reference = serde_json::from_value(v).map_err(|e| ObjectError::Corrupt {
            store: self.label(),
            key: key.clone(),
            message: format!("its reference does not decode: {e}"),
        })?;
        self.read(&key, Some(&reference.checksum)).await
    }

    /// The JSON value stored under `key`, checked against `checksum`
    /// (`sha256:<hex>`) when one is given.
    pub async fn read(&self, key: &str, checksum: Option<&str>) -> Result<Value, ObjectError> {
        let key = key.to_string();
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
        let got = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        if let Some(want) = checksum.filter(|want| *want != got) {
            return Err(ObjectError::Corrupt {
                store: self.label(),
                key,
                message: format!("checksum {got} does not match the reference's {want}"),
            });
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

/// The store as tools see it ([`noetl_core::tool::Objects`]): what the
/// `artifact` tool puts and gets.
impl noetl_core::tool::Objects for ResultStore {
    fn put<'a>(
        &'a self,
        name: &'a str,
        value: &'a Value,
    ) -> noetl_core::tool::ObjectsFuture<'a, Value> {
        Box::pin(async move { self.put_named(name, value).await.map_err(tool_error) })
    }

    fn get<'a>(
        &'a self,
        key: &'a str,
        checksum: Option<&'a str>,
    ) -> noetl_core::tool::ObjectsFuture<'a, Value> {
        Box::pin(async move { self.read(key, checksum).await.map_err(tool_error) })
    }
}

fn tool_error(e: ObjectError) -> noetl_core::tool::ObjectsError {
    noetl_core::tool::ObjectsError {
        missing: matches!(e, ObjectError::Missing { .. }),
        permanent: e.is_permanent(),
        message: e.to_string(),
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
    let safe: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.len() <= crate::keys::MAX_KEY_PART {
        return safe;
    }
    // A name of any length (a step's) stays a bounded object name: the
    // NATS object store puts it in a subject, S3 keys stop at 1,024 bytes.
    format!("h-{}", hex::encode(Sha256::digest(s.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_name_segment_is_safe_and_bounded() {
        assert_eq!(segment("fetch page/1"), "fetch_page_1");
        let long = segment(&"s".repeat(3000));
        assert!(
            long.len() <= crate::keys::MAX_KEY_PART && long.starts_with("h-"),
            "{long}"
        );
        assert_ne!(long, segment(&"s".repeat(3001)));
    }

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

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn s3(loc: StoreLocation) -> S3Location {
        match loc {
            StoreLocation::S3(s) => s,
            other => panic!("not S3: {other:?}"),
        }
    }

    #[test]
    fn the_region_comes_from_the_environment_unless_set() {
        let region = |pairs: &[(&str, &str)]| {
            s3(StoreLocation::parse_with_env("s3://b", &env(pairs)).unwrap()).region
        };
        assert_eq!(region(&[]), "us-east-1");
        assert_eq!(region(&[("AWS_DEFAULT_REGION", "eu-west-1")]), "eu-west-1");
        assert_eq!(
            region(&[
                ("AWS_DEFAULT_REGION", "eu-west-1"),
                ("AWS_REGION", "ap-south-1")
            ]),
            "ap-south-1"
        );
        let loc = s3(StoreLocation::parse_with_env(
            "s3://b/p",
            &env(&[("AWS_REGION", "eu-north-1")]),
        )
        .unwrap());
        let b = s3_builder(&loc, &env(&[("AWS_REGION", "eu-north-1")]));
        use object_store::aws::AmazonS3ConfigKey as K;
        assert_eq!(
            b.get_config_value(&K::Region).as_deref(),
            Some("eu-north-1")
        );
        assert_eq!(b.get_config_value(&K::Bucket).as_deref(), Some("b"));
    }

    #[test]
    fn environment_settings_are_applied_under_the_noetl_ones() {
        use object_store::aws::AmazonS3ConfigKey as K;
        use object_store::ClientConfigKey as C;
        let e = env(&[
            ("AWS_ACCESS_KEY_ID", "AKENV"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
            ("AWS_SESSION_TOKEN", "env-token"),
            ("AWS_ENDPOINT", "http://127.0.0.1:9"),
            ("AWS_BUCKET", "not-this-one"),
        ]);
        let loc = s3(StoreLocation::parse_with_env("s3://b", &e).unwrap());
        let b = s3_builder(&loc, &e);
        assert_eq!(b.get_config_value(&K::Bucket).as_deref(), Some("b"));
        assert_eq!(
            b.get_config_value(&K::AccessKeyId).as_deref(),
            Some("AKENV")
        );
        assert_eq!(b.get_config_value(&K::Token).as_deref(), Some("env-token"));
        assert_eq!(
            b.get_config_value(&K::Endpoint).as_deref(),
            Some("http://127.0.0.1:9")
        );
        // An http:// endpoint from the environment allows HTTP...
        assert_eq!(
            b.get_config_value(&K::Client(C::AllowHttp)).as_deref(),
            Some("true")
        );
        // ...unless AWS_ALLOW_HTTP says otherwise.
        let mut no_http = e.clone();
        no_http.push(("AWS_ALLOW_HTTP".into(), "false".into()));
        let b = s3_builder(&loc, &no_http);
        assert_eq!(
            b.get_config_value(&K::Client(C::AllowHttp)).as_deref(),
            Some("false")
        );
        // Keys from the keychain (NOETL_S3_CREDENTIAL) replace the
        // environment's, and its session token with them.
        let mut keychain = loc.clone();
        keychain.access_key_id = Some("AKVAULT".into());
        keychain.secret_access_key = Some("vault-secret".into());
        let b = s3_builder(&keychain, &e);
        assert_eq!(
            b.get_config_value(&K::AccessKeyId).as_deref(),
            Some("AKVAULT")
        );
        assert_eq!(b.get_config_value(&K::Token), None);
        // NOETL_S3_ENDPOINT wins over AWS_ENDPOINT and forces path style.
        let mut e2 = e.clone();
        e2.push((
            "NOETL_S3_ENDPOINT".into(),
            "https://minio.example:9000".into(),
        ));
        e2.push(("AWS_VIRTUAL_HOSTED_STYLE_REQUEST".into(), "true".into()));
        let loc2 = s3(StoreLocation::parse_with_env("s3://b", &e2).unwrap());
        let b = s3_builder(&loc2, &e2);
        assert_eq!(
            b.get_config_value(&K::Endpoint).as_deref(),
            Some("https://minio.example:9000")
        );
        assert_eq!(
            b.get_config_value(&K::VirtualHostedStyleRequest).as_deref(),
            Some("false")
        );
        assert_eq!(
            b.get_config_value(&K::Client(C::AllowHttp)).as_deref(),
            Some("false")
        );
    }
}
