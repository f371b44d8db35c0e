//! Keychain entries resolved when used rather than read from the local
//! store under their name (docs/security.md "Keychain"): `secret_manager`
//! (AWS Secrets Manager, [`aws`]; GCP Secret Manager, [`gcp`]), `oauth2`
//! client-credentials tokens ([`oauth2`]), Google ID and access tokens
//! (`google_id_token`, `google_access_token`, [`gcp`]) and `static` values
//! written in the playbook. Each service-resolved entry is resolved once per execution
//! and kept, encrypted, in the auth cache ([`noetl_mesh::auth_cache`])
//! until it expires; errors name the entry, its playbook and the
//! service's answer, never a value.

pub mod aws;
pub mod gcp;
pub mod google;
pub mod oauth2;

use noetl_core::template::Scope;
use noetl_mesh::credentials::CredentialError;
use noetl_mesh::Mesh;
use serde_json::{Map, Value};

/// Keychain kinds resolved from a service (the others come from the store).
pub const SERVICE_KINDS: &[&str] = noetl_core::validate::SERVICE_KEYCHAIN_KINDS;

/// How long a resolved value is kept when the service says nothing of its
/// lifetime (the spec's `auth_cache` TTL: one hour); an entry's `ttl_s`
/// overrides it.
pub const DEFAULT_TTL_S: u64 = 3600;

/// What resolving one entry needs: the entry, where it is used, and the
/// scope its templates render in (`workload`, the keychain entries before
/// it).
pub struct Entry<'a> {
    /// The entry's name.
    pub name: &'a str,
    /// One of [`SERVICE_KINDS`].
    pub kind: &'a str,
    /// The playbook declaring it (`metadata.name`), for errors.
    pub playbook: &'a str,
    /// Its other fields (`provider`, `map`, `endpoint`, `data`...).
    pub fields: &'a Map<String, Value>,
    /// The render scope of its templates.
    pub scope: &'a Scope,
}

/// A resolved value and how long it may be kept (milliseconds).
pub struct Fetched {
    /// The value `{{ keychain.<name> }}` reads.
    pub data: Value,
    /// Its lifetime.
    pub ttl_ms: u64,
}

/// The value of a service-resolved entry for execution `eid`: from the
/// auth cache, else from its service (then cached).
pub async fn resolve(mesh: &Mesh, eid: &str, e: &Entry<'_>) -> Result<Value, CredentialError> {
    // Written in the playbook: nothing to ask, nothing to cache.
    if e.kind == "static" {
        return static_map(e);
    }
    let vault = mesh.vault();
    if let Some(v) = vault.cache_get(eid, e.name).await? {
        return Ok(v);
    }
    let provider = e.fields.get("provider").and_then(Value::as_str);
    let fetched = match e.kind {
        "secret_manager" if provider == Some("gcp") => gcp::fetch_secrets(&vault, e).await?,
        "secret_manager" => aws::fetch(&vault, e).await?,
        "oauth2" => oauth2::fetch(&vault, e).await?,
        "google_id_token" => gcp::fetch_id_token(&vault, e).await?,
        "google_access_token" => gcp::fetch_access_token(&vault, e).await?,
        other => {
            return Err(provider_err(
                e,
                format!("kind `{other}` is not resolved from a service"),
            ))
        }
    };
    let cache_type = if matches!(e.kind, "oauth2" | "google_id_token" | "google_access_token") {
        "token"
    } else {
        "secret"
    };
    let expires = noetl_mesh::events::now_ms().saturating_add(fetched.ttl_ms);
    vault
        .cache_put(eid, e.name, cache_type, &fetched.data, expires)
        .await?;
    Ok(fetched.data)
}

/// A `static` entry's value: each field of `map` rendered over `workload`
/// and the entries before it (NoETL's `static`).
pub fn static_map(e: &Entry<'_>) -> Result<Value, CredentialError> {
    let map = e
        .fields
        .get("map")
        .and_then(Value::as_object)
        .ok_or_else(|| provider_err(e, "`map` (field → value) is missing".into()))?;
    let mut out = Map::new();
    for (field, v) in map {
        let value = noetl_core::template::render_value(v, e.scope)
            .map_err(|err| provider_err(e, format!("`map.{field}` does not render: {err}")))?;
        out.insert(field.clone(), value);
    }
    Ok(Value::Object(out))
}

/// The entry's cache lifetime cap: `ttl_s`, else [`DEFAULT_TTL_S`].
pub fn ttl_cap_ms(fields: &Map<String, Value>) -> u64 {
    fields
        .get("ttl_s")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_TTL_S)
        .saturating_mul(1000)
}

/// Render a field of the entry (a template over `workload` and earlier
/// keychain entries) to text; the error names the field, not its value.
pub(crate) fn render_text(
    e: &Entry<'_>,
    field: &str,
    v: &Value,
) -> Result<String, CredentialError> {
    let out = noetl_core::template::render_value(v, e.scope)
        .map_err(|err| provider_err(e, format!("`{field}` does not render: {err}")))?;
    Ok(match out {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    })
}

/// `url` as error messages show it: no query (a token endpoint's may carry
/// a client secret), fragment, password or user token
/// ([`noetl_core::field_rules::shown_url_text`]; as written when it has
/// none).
pub(crate) fn shown_url(url: &str) -> String {
    noetl_core::field_rules::shown_url_text(url)
}

pub(crate) fn provider_err(e: &Entry<'_>, message: String) -> CredentialError {
    CredentialError::Provider {
        name: e.name.to_string(),
        kind: e.kind.to_string(),
        playbook: e.playbook.to_string(),
        message,
    }
}

/// A stored credential an entry's `auth` names (its data), read from the
/// vault.
pub(crate) async fn auth_data(
    vault: &noetl_mesh::credentials::Vault,
    e: &Entry<'_>,
) -> Result<Option<Value>, CredentialError> {
    let Some(auth) = e.fields.get("auth") else {
        return Ok(None);
    };
    let name = render_text(e, "auth", auth)?;
    Ok(Some(vault.get(&name).await?.data))
}

#[cfg(test)]
mod tests {
    use super::shown_url;

    #[test]
    fn urls_in_messages_lose_their_query_and_credentials() {
        assert_eq!(
            shown_url("https://idp.example/token?client_secret=s3cret#frag"),
            "https://idp.example/token"
        );
        assert_eq!(
            shown_url("https://app:p$w&d@idp.example/token"),
            "https://app:***@idp.example/token"
        );
        assert_eq!(
            shown_url("https://ghp_tok3n@idp.example/"),
            "https://***@idp.example/"
        );
        assert_eq!(shown_url("not a url?key=s3cret"), "not a url");
        assert_eq!(shown_url("http://127.0.0.1:4566"), "http://127.0.0.1:4566");
    }
}
