//! `secret_manager` entries with `provider: aws`: each field of `map` is
//! the `SecretString` of one secret, read with Secrets Manager's
//! `GetSecretValue` (a JSON POST signed with SigV4 by object_store's
//! [`AwsAuthorizer`]).
//!
//! ```yaml
//! keychain:
//!   - name: openai
//!     kind: secret_manager
//!     provider: aws
//!     auth: aws_main               # optional: a stored credential with access_key_id, secret_access_key
//!     region: eu-west-1            # optional
//!     map: { token: prod/openai }  # field → secret id (name or ARN)
//! ```

use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::HttpRequestBody;
use serde_json::{json, Map, Value};

use super::{auth_data, provider_err, render_text, ttl_cap_ms, Entry, Fetched};
use noetl_mesh::credentials::{CredentialError, Vault};

/// Where and as whom Secrets Manager is called.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The region signed for.
    pub region: String,
    /// The service's URL (`https://secretsmanager.<region>.amazonaws.com`,
    /// or an endpoint that speaks its API).
    pub endpoint: String,
    /// Access key id.
    pub key_id: String,
    /// Secret access key.
    pub secret_key: String,
    /// Session token, for temporary credentials.
    pub token: Option<String>,
}

/// Decide the [`Target`] from the entry's fields (rendered), the `auth`
/// credential's data and the environment, in that order of precedence:
/// `region` (entry, `auth`, `AWS_REGION`, `AWS_DEFAULT_REGION`),
/// `endpoint` (entry, `auth`, `AWS_ENDPOINT_URL_SECRETS_MANAGER`,
/// `AWS_ENDPOINT_URL`, else AWS's own), keys (`auth`'s
/// `access_key_id`/`secret_access_key`/`session_token`, else
/// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`). The
/// error says what is missing.
pub fn target(
    region: Option<String>,
    endpoint: Option<String>,
    auth: Option<&Value>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Target, String> {
    let from_auth = |k: &str| {
        auth.and_then(|a| a.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let env = |k: &str| env(k).filter(|s| !s.is_empty());
    let region = region
        .filter(|s| !s.is_empty())
        .or_else(|| from_auth("region"))
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .ok_or("no region: set `region` on the entry, `region` in its `auth` credential, or AWS_REGION")?;
    let endpoint = endpoint
        .filter(|s| !s.is_empty())
        .or_else(|| from_auth("endpoint"))
        .or_else(|| env("AWS_ENDPOINT_URL_SECRETS_MANAGER"))
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .unwrap_or_else(|| format!("https://secretsmanager.{region}.amazonaws.com"));
    let (key_id, secret_key, token) = match auth {
        Some(_) => (
            from_auth("access_key_id"),
            from_auth("secret_access_key"),
            from_auth("session_token"),
        ),
        None => (
            env("AWS_ACCESS_KEY_ID"),
            env("AWS_SECRET_ACCESS_KEY"),
            env("AWS_SESSION_TOKEN"),
        ),
    };
    let (Some(key_id), Some(secret_key)) = (key_id, secret_key) else {
        return Err(match auth {
            Some(_) => "its `auth` credential lacks `access_key_id` or `secret_access_key`".into(),
            None => "no AWS keys: name a stored credential with `access_key_id` and `secret_access_key` in `auth`, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into(),
        });
    };
    Ok(Target {
        region,
        endpoint: endpoint.trim_end_matches('/').to_string(),
        key_id,
        secret_key,
        token,
    })
}

/// What Secrets Manager's error answer says (`__type` without its
/// namespace, and `message`): no secret is ever in it.
pub fn error_text(status: u16, body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let kind = v
        .get("__type")
        .and_then(Value::as_str)
        .map(|t| t.rsplit('#').next().unwrap_or(t).to_string());
    let msg = v
        .get("message")
        .or_else(|| v.get("Message"))
        .and_then(Value::as_str);
    match (kind, msg) {
        (Some(k), Some(m)) => format!("HTTP {status} {k}: {m}"),
        (Some(k), None) => format!("HTTP {status} {k}"),
        _ => format!("HTTP {status}"),
    }
}

/// Fetch every secret of the entry's `map`.
pub async fn fetch(vault: &Vault, e: &Entry<'_>) -> Result<Fetched, CredentialError> {
    let provider = e
        .fields
        .get("provider")
        .and_then(Value::as_str)
        .unwrap_or("");
    if provider != "aws" {
        return Err(provider_err(
            e,
            format!("provider `{provider}` is not reached: only `aws` (AWS Secrets Manager)"),
        ));
    }
    let opt = |k: &str| -> Result<Option<String>, CredentialError> {
        e.fields.get(k).map(|v| render_text(e, k, v)).transpose()
    };
    let auth = auth_data(vault, e).await?;
    let t = target(opt("region")?, opt("endpoint")?, auth.as_ref(), &|k| {
        std::env::var(k).ok()
    })
    .map_err(|m| provider_err(e, m))?;
    let map = e
        .fields
        .get("map")
        .and_then(Value::as_object)
        .ok_or_else(|| provider_err(e, "`map` (field → secret id) is missing".into()))?;
    let client = reqwest::Client::new();
    let mut out = Map::new();
    for (field, id) in map {
        let id = render_text(e, &format!("map.{field}"), id)?;
        let secret = get_secret_value(&client, &t, &id).await.map_err(|m| {
            provider_err(
                e,
                format!(
                    "secret `{id}` (field `{field}`) at {}: {m}",
                    super::shown_url(&t.endpoint)
                ),
            )
        })?;
        out.insert(field.clone(), Value::String(secret));
    }
    Ok(Fetched {
        data: Value::Object(out),
        ttl_ms: ttl_cap_ms(e.fields),
    })
}

/// `GetSecretValue` for `secret_id`: its `SecretString`.
pub async fn get_secret_value(
    client: &reqwest::Client,
    t: &Target,
    secret_id: &str,
) -> Result<String, String> {
    let body = serde_json::to_vec(&json!({ "SecretId": secret_id })).expect("JSON serialises");
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("{}/", t.endpoint))
        .header("content-type", "application/x-amz-json-1.1")
        .header("x-amz-target", "secretsmanager.GetSecretValue")
        .body(HttpRequestBody::from(body.clone()))
        .map_err(|e| format!("bad endpoint: {e}"))?;
    let credential = AwsCredential {
        key_id: t.key_id.clone(),
        secret_key: t.secret_key.clone(),
        token: t.token.clone(),
    };
    AwsAuthorizer::new(&credential, "secretsmanager", &t.region).authorize(&mut req, None);
    let mut call = client.post(format!("{}/", t.endpoint)).body(body);
    for (k, v) in req.headers() {
        call = call.header(k.as_str(), v.as_bytes());
    }
    let resp = call
        .send()
        .await
        .map_err(|e| format!("cannot reach it: {}", e.without_url()))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| format!("reading the answer: {}", e.without_url()))?;
    if !(200..300).contains(&status) {
        return Err(error_text(status, &bytes));
    }
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|_| format!("HTTP {status}: the answer is not JSON"))?;
    v.get("SecretString")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| "the secret has no SecretString (binary secrets are not read)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_entry_wins_over_its_auth_which_wins_over_the_environment() {
        let auth = json!({"access_key_id": "AK", "secret_access_key": "SK", "region": "eu-west-1", "endpoint": "http://auth:1/"});
        let e = env(&[
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", "http://env:2"),
            ("AWS_ACCESS_KEY_ID", "EK"),
            ("AWS_SECRET_ACCESS_KEY", "ES"),
        ]);
        let t = target(Some("ap-south-1".into()), None, Some(&auth), &e).unwrap();
        assert_eq!(
            (t.region.as_str(), t.endpoint.as_str(), t.key_id.as_str()),
            ("ap-south-1", "http://auth:1", "AK")
        );
        let t = target(None, None, None, &e).unwrap();
        assert_eq!(
            (
                t.region.as_str(),
                t.endpoint.as_str(),
                t.key_id.as_str(),
                t.secret_key.as_str()
            ),
            ("us-east-1", "http://env:2", "EK", "ES")
        );
        let t = target(
            None,
            None,
            None,
            &env(&[
                ("AWS_DEFAULT_REGION", "us-west-2"),
                ("AWS_ACCESS_KEY_ID", "A"),
                ("AWS_SECRET_ACCESS_KEY", "S"),
            ]),
        )
        .unwrap();
        assert_eq!(t.endpoint, "https://secretsmanager.us-west-2.amazonaws.com");
    }

    #[test]
    fn what_is_missing_is_named() {
        let none = env(&[]);
        assert!(target(None, None, None, &none)
            .unwrap_err()
            .contains("no region"));
        let e = target(Some("r".into()), None, None, &none).unwrap_err();
        assert!(e.contains("AWS_ACCESS_KEY_ID"), "{e}");
        let e = target(
            Some("r".into()),
            None,
            Some(&json!({"access_key_id": "A"})),
            &none,
        )
        .unwrap_err();
        assert!(e.contains("secret_access_key"), "{e}");
    }

    #[test]
    fn an_error_answer_is_read_for_its_type_and_message() {
        let body = br#"{"__type":"com.amazonaws#ResourceNotFoundException","message":"Secrets Manager can't find the specified secret."}"#;
        assert_eq!(
            error_text(400, body),
            "HTTP 400 ResourceNotFoundException: Secrets Manager can't find the specified secret."
        );
        assert_eq!(error_text(500, b"<html>"), "HTTP 500");
    }
}
