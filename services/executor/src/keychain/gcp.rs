//! Keychain entries resolved from Google ([`super::google`] for the
//! credentials):
//!
//! - `secret_manager` with `provider: gcp`: each field of `map` is one
//!   secret version of GCP Secret Manager, read with `:access` (REST,
//!   `payload.data` base64); a value that is a JSON object or array is
//!   read as JSON (NoETL's reading), any other as text.
//! - `google_id_token`: a Google ID token for `target_audience`, minted
//!   for the service account whose key is in Secret Manager
//!   (`service_account_secret`, read with `auth`), in a stored credential
//!   (`service_account_credential`), or, with neither, the metadata
//!   server's default account. The value is `{id_token, access_token (the
//!   same token), token_type: Bearer, audience}`, as NoETL's.
//! - `google_access_token`: an access token for Google's APIs (`scopes`,
//!   default `cloud-platform`) for the account of `auth`, or the metadata
//!   server's: `{access_token, token_type: Bearer, expires_in}`. `noetl
//!   migrate` declares one for a task's `auth: {source: adc}`.
//!
//! `auth` names a stored credential holding a service account key or
//! `{source: metadata}`; without it the metadata server answers. The
//! Secret Manager endpoint is the entry's `endpoint`, else its `auth`
//! credential's `endpoint`, else Google's.
//!
//! ```yaml
//! keychain:
//!   - name: openai
//!     kind: secret_manager
//!     provider: gcp
//!     auth: gcp_sa                     # optional
//!     map: { api_key: projects/p/secrets/openai/versions/latest }
//!   - name: run_token
//!     kind: google_id_token
//!     service_account_credential: invoker_sa
//!     target_audience: https://svc-abc.a.run.app
//! ```

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::google::{self, Source, Want};
use super::{auth_data, provider_err, render_text, ttl_cap_ms, Entry, Fetched};
use noetl_mesh::credentials::{CredentialError, Vault};

/// GCP Secret Manager's endpoint.
pub const SECRET_MANAGER: &str = "https://secretmanager.googleapis.com";

/// The version path of a secret: `projects/P/secrets/S/versions/V` as
/// written, `projects/P/secrets/S` → its `latest` version.
pub fn version_path(path: &str) -> String {
    let path = path.trim().trim_matches('/');
    if path.contains("/versions/") {
        path.to_string()
    } else {
        format!("{path}/versions/latest")
    }
}

/// A secret's payload as the entry's value: JSON when it is an object or
/// an array, else the text.
pub fn payload_value(text: String) -> Value {
    match serde_json::from_str::<Value>(&text) {
        Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
        _ => Value::String(text),
    }
}

/// Read one secret version: its payload as text.
pub async fn access(
    client: &reqwest::Client,
    endpoint: &str,
    bearer: &str,
    path: &str,
) -> Result<String, String> {
    let url = format!(
        "{}/v1/{}:access",
        endpoint.trim_end_matches('/'),
        version_path(path)
    );
    let resp = client
        .get(&url)
        .bearer_auth(bearer)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| format!("cannot reach it: {}", e.without_url()))?;
    let answer = google::json_answer(resp, "Secret Manager").await?;
    let data = answer
        .pointer("/payload/data")
        .and_then(Value::as_str)
        .ok_or("the answer has no `payload.data`")?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|_| "`payload.data` is not base64")?;
    String::from_utf8(bytes).map_err(|_| "the secret is not UTF-8 text".into())
}

/// The Google [`Source`] of the entry's `auth` credential (none: the
/// metadata server).
async fn auth_source(
    vault: &Vault,
    e: &Entry<'_>,
) -> Result<(Source, Option<Value>), CredentialError> {
    let auth = auth_data(vault, e).await?;
    let s = google::source(auth.as_ref(), &|k| std::env::var(k).ok())
        .map_err(|m| provider_err(e, format!("its `auth` credential: {m}")))?;
    Ok((s, auth))
}

/// The Secret Manager endpoint: the entry's `endpoint`, its `auth`
/// credential's, else Google's.
fn endpoint(e: &Entry<'_>, auth: Option<&Value>) -> Result<String, CredentialError> {
    if let Some(v) = e.fields.get("endpoint") {
        return render_text(e, "endpoint", v);
    }
    Ok(auth
        .and_then(|a| a.get("endpoint"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(SECRET_MANAGER)
        .to_string())
}

/// An access token for Secret Manager from the entry's `auth`.
async fn secret_manager_token(
    client: &reqwest::Client,
    vault: &Vault,
    e: &Entry<'_>,
) -> Result<(String, String), CredentialError> {
    let (source, auth) = auth_source(vault, e).await?;
    let endpoint = endpoint(e, auth.as_ref())?;
    let t = google::token(
        client,
        &source,
        &Want::Access(google::CLOUD_PLATFORM.into()),
    )
    .await
    .map_err(|m| provider_err(e, format!("an access token for Secret Manager: {m}")))?;
    Ok((t.token, endpoint))
}

/// `secret_manager` with `provider: gcp`: every secret of `map`.
pub async fn fetch_secrets(vault: &Vault, e: &Entry<'_>) -> Result<Fetched, CredentialError> {
    let map = e
        .fields
        .get("map")
        .and_then(Value::as_object)
        .ok_or_else(|| provider_err(e, "`map` (field → secret) is missing".into()))?;
    let client = reqwest::Client::new();
    let (bearer, endpoint) = secret_manager_token(&client, vault, e).await?;
    let mut out = Map::new();
    for (field, path) in map {
        let path = render_text(e, &format!("map.{field}"), path)?;
        let text = access(&client, &endpoint, &bearer, &path)
            .await
            .map_err(|m| {
                provider_err(
                    e,
                    format!(
                        "secret `{path}` (field `{field}`) at {}: {m}",
                        super::shown_url(&endpoint)
                    ),
                )
            })?;
        out.insert(field.clone(), payload_value(text));
    }
    Ok(Fetched {
        data: Value::Object(out),
        ttl_ms: ttl_cap_ms(e.fields),
    })
}

/// `google_id_token`: an ID token for `target_audience`.
pub async fn fetch_id_token(vault: &Vault, e: &Entry<'_>) -> Result<Fetched, CredentialError> {
    let audience = e
        .fields
        .get("target_audience")
        .ok_or_else(|| provider_err(e, "`target_audience` is missing".into()))?;
    let audience = render_text(e, "target_audience", audience)?;
    let client = reqwest::Client::new();
    let source = if let Some(path) = e.fields.get("service_account_secret") {
        let path = render_text(e, "service_account_secret", path)?;
        let (bearer, endpoint) = secret_manager_token(&client, vault, e).await?;
        let text = access(&client, &endpoint, &bearer, &path)
            .await
            .map_err(|m| {
                provider_err(
                    e,
                    format!(
                        "service account secret `{path}` at {}: {m}",
                        super::shown_url(&endpoint)
                    ),
                )
            })?;
        let key: Value = serde_json::from_str(&text).map_err(|_| {
            provider_err(
                e,
                format!("service account secret `{path}` is not a JSON key"),
            )
        })?;
        google::source(Some(&key), &|_| None)
            .map_err(|m| provider_err(e, format!("service account secret `{path}`: {m}")))?
    } else if let Some(name) = e.fields.get("service_account_credential") {
        let name = render_text(e, "service_account_credential", name)?;
        let data = vault.get(&name).await?.data;
        google::source(Some(&data), &|k| std::env::var(k).ok())
            .map_err(|m| provider_err(e, format!("service account credential `{name}`: {m}")))?
    } else {
        auth_source(vault, e).await?.0
    };
    let t = google::token(&client, &source, &Want::Id(audience.clone()))
        .await
        .map_err(|m| provider_err(e, format!("an ID token for `{audience}`: {m}")))?;
    let ttl_ms = token_ttl_ms(e, t.expires_in);
    Ok(Fetched {
        data: json!({
            "id_token": t.token,
            "access_token": t.token,
            "token_type": "Bearer",
            "audience": audience,
        }),
        ttl_ms,
    })
}

/// How long a token lasting `expires_in` seconds is kept: 90 % of its
/// life, at most the entry's cap.
fn token_ttl_ms(e: &Entry<'_>, expires_in: Option<u64>) -> u64 {
    let cap = ttl_cap_ms(e.fields);
    expires_in
        .map(|s| s.saturating_mul(900).min(cap))
        .unwrap_or(cap)
}

/// The scopes of a `google_access_token` entry, space-separated (as the
/// JWT's `scope` claim and the metadata server's `scopes` take them).
fn scopes(e: &Entry<'_>) -> Result<String, CredentialError> {
    match e.fields.get("scopes") {
        None => Ok(google::CLOUD_PLATFORM.to_string()),
        Some(Value::Array(list)) => {
            let mut out = Vec::new();
            for (i, s) in list.iter().enumerate() {
                out.push(render_text(e, &format!("scopes.{i}"), s)?);
            }
            Ok(out.join(" "))
        }
        Some(v) => render_text(e, "scopes", v),
    }
}

/// `google_access_token`: an access token for the account of `auth`.
pub async fn fetch_access_token(vault: &Vault, e: &Entry<'_>) -> Result<Fetched, CredentialError> {
    let scopes = scopes(e)?;
    let client = reqwest::Client::new();
    let (source, _) = auth_source(vault, e).await?;
    let t = google::token(&client, &source, &Want::Access(scopes))
        .await
        .map_err(|m| provider_err(e, format!("an access token: {m}")))?;
    let ttl_ms = token_ttl_ms(e, t.expires_in);
    Ok(Fetched {
        data: json!({
            "access_token": t.token,
            "token_type": "Bearer",
            "expires_in": t.expires_in,
        }),
        ttl_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_without_a_version_reads_its_latest() {
        assert_eq!(
            version_path("projects/p/secrets/s"),
            "projects/p/secrets/s/versions/latest"
        );
        assert_eq!(
            version_path("/projects/p/secrets/s/versions/3/"),
            "projects/p/secrets/s/versions/3"
        );
    }

    #[test]
    fn json_objects_and_arrays_are_read_as_json_other_text_as_text() {
        assert_eq!(
            payload_value(r#"{"type":"service_account"}"#.into()),
            json!({"type": "service_account"})
        );
        assert_eq!(payload_value("[1]".into()), json!([1]));
        assert_eq!(payload_value("0123".into()), json!("0123"));
        assert_eq!(payload_value("sk-abc".into()), json!("sk-abc"));
        assert_eq!(payload_value("true".into()), json!("true"));
    }
}
