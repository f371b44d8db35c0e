//! Objects outside the mesh's own store, named by URL: `s3://bucket/key`
//! (S3 or an S3-compatible server) and `gs://bucket/key` (Google Cloud
//! Storage, or its emulator), read and written through object_store with
//! the fields of a keychain credential, else the executor's environment.
//! Tasks read scripts this way (docs/tools.md, "Scripts"); a `transfer`
//! reads and writes rows this way (docs/tools.md, "transfer"). Errors name
//! the URL and the store's answer, never a credential.

use std::sync::Arc;

use object_store::path::Path;
use object_store::ObjectStore;
use serde_json::Value;

use crate::objects::{process_env, s3_builder, S3Location};

/// What went wrong reading an object.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Not an `s3://` or `gs://` URL with a bucket and a key.
    #[error("{url:?} is not an s3://bucket/key or gs://bucket/key URL")]
    Url {
        /// The URL.
        url: String,
    },
    /// The store could not be set up from the credential (field names only).
    #[error("{url}: {message}")]
    Config {
        /// The URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// The store refused or failed.
    #[error("{url}: {message}")]
    Store {
        /// The URL.
        url: String,
        /// The store's answer.
        message: String,
    },
    /// Larger than the caller's limit.
    #[error("{url} has {size} bytes, more than the {max} allowed")]
    TooLarge {
        /// The URL.
        url: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: usize,
    },
}

/// Which store a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// `s3://`.
    S3,
    /// `gs://`.
    Gcs,
}

/// `(scheme, bucket, key)` of an `s3://` or `gs://` URL.
pub fn parse_url(url: &str) -> Result<(Scheme, String, String), RemoteError> {
    let bad = || RemoteError::Url { url: url.into() };
    let (scheme, rest) = if let Some(r) = url.strip_prefix("s3://") {
        (Scheme::S3, r)
    } else if let Some(r) = url.strip_prefix("gs://") {
        (Scheme::Gcs, r)
    } else {
        return Err(bad());
    };
    let (bucket, key) = rest.split_once('/').ok_or_else(bad)?;
    if bucket.is_empty() || key.is_empty() || key.ends_with('/') {
        return Err(bad());
    }
    Ok((scheme, bucket.to_string(), key.to_string()))
}

/// A string field of the credential, under any of `names`.
fn field(cred: Option<&Value>, names: &[&str]) -> Option<String> {
    let c = cred?;
    names.iter().find_map(|n| {
        c.get(*n)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    })
}

/// The S3 location of `bucket`: region and endpoint from the arguments,
/// else the credential (`region`, `endpoint`), else the environment; keys
/// from the credential (`access_key_id` / `aws_access_key_id`, ...).
pub fn s3_location(
    bucket: &str,
    cred: Option<&Value>,
    region: Option<&str>,
    endpoint: Option<&str>,
    env: &[(String, String)],
) -> S3Location {
    let var = |k: &str| {
        env.iter()
            .find(|(n, v)| n == k && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    S3Location {
        bucket: bucket.to_string(),
        prefix: String::new(),
        endpoint: endpoint
            .map(str::to_string)
            .or_else(|| field(cred, &["endpoint", "endpoint_url"])),
        region: region
            .map(str::to_string)
            .or_else(|| field(cred, &["region", "aws_region"]))
            .or_else(|| var("AWS_REGION"))
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into()),
        access_key_id: field(cred, &["access_key_id", "aws_access_key_id"]),
        secret_access_key: field(cred, &["secret_access_key", "aws_secret_access_key"]),
    }
}

/// The service-account key of a GCS credential: its
/// `service_account_json` (text or object), else the credential itself
/// when it is one (`client_email`, `private_key`; an emulator's
/// `gcs_base_url` with `disable_oauth`).
pub fn gcs_key(cred: &Value) -> Option<String> {
    match cred.get("service_account_json") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(v @ Value::Object(_)) => Some(v.to_string()),
        _ if cred.get("private_key").is_some() || cred.get("gcs_base_url").is_some() => {
            let mut key = cred.clone();
            if let Some(m) = key.as_object_mut() {
                for f in ["private_key", "private_key_id", "client_email"] {
                    m.entry(f).or_insert_with(|| Value::String(String::new()));
                }
            }
            Some(key.to_string())
        }
        _ => None,
    }
}

fn store_for(
    url: &str,
    scheme: &Scheme,
    bucket: &str,
    cred: Option<&Value>,
    region: Option<&str>,
    endpoint: Option<&str>,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let config = |e: object_store::Error| RemoteError::Config {
        url: url.into(),
        message: e.to_string(),
    };
    match scheme {
        Scheme::S3 => {
            let env = process_env();
            let loc = s3_location(bucket, cred, region, endpoint, &env);
            let store = s3_builder(&loc, &env).build().map_err(config)?;
            Ok(Arc::new(store))
        }
        Scheme::Gcs => {
            use object_store::gcp::GoogleCloudStorageBuilder;
            let mut b = match cred {
                Some(_) => GoogleCloudStorageBuilder::new(),
                None => GoogleCloudStorageBuilder::from_env(),
            }
            .with_bucket_name(bucket);
            if let Some(c) = cred {
                let key = gcs_key(c).ok_or_else(|| RemoteError::Config {
                    url: url.into(),
                    message: "the credential has no `service_account_json` (nor a service-account key's `client_email` and `private_key`)".into(),
                })?;
                let http = c
                    .get("gcs_base_url")
                    .and_then(Value::as_str)
                    .is_some_and(|u| u.starts_with("http://"));
                b = b.with_service_account_key(key);
                if http {
                    b = b.with_client_options(
                        object_store::ClientOptions::new().with_allow_http(true),
                    );
                }
            }
            Ok(Arc::new(b.build().map_err(config)?))
        }
    }
}

/// The bytes of the object `url` names, at most `max`.
pub async fn read_object(
    url: &str,
    cred: Option<&Value>,
    region: Option<&str>,
    endpoint: Option<&str>,
    max: usize,
) -> Result<Vec<u8>, RemoteError> {
    let (scheme, bucket, key) = parse_url(url)?;
    let store = store_for(url, &scheme, &bucket, cred, region, endpoint)?;
    let failed = |e: object_store::Error| RemoteError::Store {
        url: url.into(),
        message: match e {
            object_store::Error::NotFound { .. } => "no such object".into(),
            other => other.to_string(),
        },
    };
    let got = store.get(&Path::from(key.as_str())).await.map_err(failed)?;
    let size = got.meta.size;
    if size > max as u64 {
        return Err(RemoteError::TooLarge {
            url: url.into(),
            size,
            max,
        });
    }
    Ok(got.bytes().await.map_err(failed)?.to_vec())
}

/// Store `bytes` as the object `url` names (replacing one already
/// there), with `content_type` when given.
pub async fn write_object(
    url: &str,
    cred: Option<&Value>,
    region: Option<&str>,
    endpoint: Option<&str>,
    bytes: Vec<u8>,
    content_type: Option<&str>,
) -> Result<(), RemoteError> {
    use object_store::{Attribute, Attributes, PutOptions, PutPayload};
    let (scheme, bucket, key) = parse_url(url)?;
    let store = store_for(url, &scheme, &bucket, cred, region, endpoint)?;
    let mut opts = PutOptions::default();
    if let Some(ct) = content_type {
        opts.attributes = Attributes::from_iter([(Attribute::ContentType, ct.to_string())]);
    }
    store
        .put_opts(&Path::from(key.as_str()), PutPayload::from(bytes), opts)
        .await
        .map_err(|e| RemoteError::Store {
            url: url.into(),
            message: match e {
                object_store::Error::NotFound { .. } => "no such bucket".into(),
                other => other.to_string(),
            },
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn urls_name_a_scheme_a_bucket_and_a_key() {
        assert_eq!(
            parse_url("s3://b/dir/x.sql").unwrap(),
            (Scheme::S3, "b".into(), "dir/x.sql".into())
        );
        assert_eq!(
            parse_url("gs://b/x.py").unwrap(),
            (Scheme::Gcs, "b".into(), "x.py".into())
        );
        for bad in ["s3://b", "s3:///x", "gs://b/", "http://b/x", "b/x"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn s3_settings_come_from_the_arguments_then_the_credential_then_the_environment() {
        let env = vec![("AWS_REGION".to_string(), "eu-north-1".to_string())];
        let cred = json!({"aws_access_key_id": "A", "aws_secret_access_key": "S", "region": "ap-south-1", "endpoint": "http://c:1"});
        let l = s3_location("b", Some(&cred), None, Some("http://arg:2"), &env);
        assert_eq!(
            (l.region.as_str(), l.endpoint.as_deref()),
            ("ap-south-1", Some("http://arg:2"))
        );
        assert_eq!(
            (l.access_key_id.as_deref(), l.secret_access_key.as_deref()),
            (Some("A"), Some("S"))
        );
        let l = s3_location("b", None, None, None, &env);
        assert_eq!(
            (l.region.as_str(), l.endpoint, l.access_key_id),
            ("eu-north-1", None, None)
        );
    }

    #[test]
    fn a_gcs_key_is_the_service_account_json_or_the_credential_itself() {
        assert_eq!(
            gcs_key(&json!({"service_account_json": "{\"a\":1}"})).as_deref(),
            Some("{\"a\":1}")
        );
        let k: Value = serde_json::from_str(
            &gcs_key(&json!({"gcs_base_url": "http://e:1", "disable_oauth": true})).unwrap(),
        )
        .unwrap();
        assert_eq!(k["client_email"], "");
        assert_eq!(k["gcs_base_url"], "http://e:1");
        assert_eq!(gcs_key(&json!({"token": "x"})), None);
    }
}
