//! `oauth2` entries: a token from an OAuth2 token endpoint, by the
//! client-credentials grant (RFC 6749 §4.4) written as NoETL writes it:
//! `endpoint`, `method` (POST), `headers`, and the form `data`; `auth`
//! may name a stored `basic` credential sent as HTTP Basic (the client id
//! and secret, `client_secret_basic`). The token answer (`access_token`,
//! `token_type`, `expires_in`...) is the entry's value, kept for the
//! execution until `expires_in` (or `ttl_s`, default one hour) passes.
//!
//! ```yaml
//! keychain:
//!   - name: client
//!     kind: secret                       # { client_id, client_secret }
//!   - name: api
//!     kind: oauth2
//!     endpoint: "{{ workload.token_url }}"
//!     data:
//!       grant_type: client_credentials
//!       client_id: "{{ keychain.client.client_id }}"
//!       client_secret: "{{ keychain.client.client_secret }}"
//!       scope: read
//! ```

use serde_json::{Map, Value};

use super::{auth_data, provider_err, render_text, ttl_cap_ms, Entry, Fetched};
use noetl_mesh::credentials::{CredentialError, Vault};

/// How long a token answer may be kept: its `expires_in` (seconds, less
/// a 10% margin so it is not used in its last moments) capped by the
/// entry's TTL.
pub fn token_ttl_ms(answer: &Value, cap_ms: u64) -> u64 {
    match answer.get("expires_in").and_then(|v| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    }) {
        Some(s) => (s.saturating_mul(900)).min(cap_ms),
        None => cap_ms,
    }
}

/// The words of an OAuth2 error answer (`error`, `error_description`):
/// RFC 6749 §5.2 defines them as codes and text for the client, never a
/// credential.
pub fn error_text(status: u16, body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match v.get("error").and_then(Value::as_str) {
        Some(code) => format!("HTTP {status} `{code}`"),
        None => format!("HTTP {status}"),
    }
}

/// Ask the token endpoint.
pub async fn fetch(vault: &Vault, e: &Entry<'_>) -> Result<Fetched, CredentialError> {
    let endpoint = e
        .fields
        .get("endpoint")
        .ok_or_else(|| provider_err(e, "`endpoint` (the token URL) is missing".into()))?;
    let endpoint = render_text(e, "endpoint", endpoint)?;
    let shown = super::shown_url(&endpoint);
    let method = match e.fields.get("method") {
        Some(m) => render_text(e, "method", m)?.to_ascii_uppercase(),
        None => "POST".into(),
    };
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| provider_err(e, format!("`method` {method} is not an HTTP method")))?;
    let mut form: Vec<(String, String)> = Vec::new();
    for (k, v) in e
        .fields
        .get("data")
        .and_then(Value::as_object)
        .unwrap_or(&Map::new())
    {
        form.push((k.clone(), render_text(e, &format!("data.{k}"), v)?));
    }
    if !form.iter().any(|(k, _)| k == "grant_type") {
        form.push(("grant_type".into(), "client_credentials".into()));
    }
    let client = reqwest::Client::new();
    let mut call = client
        .request(method, &endpoint)
        .header("accept", "application/json");
    for (k, v) in e
        .fields
        .get("headers")
        .and_then(Value::as_object)
        .unwrap_or(&Map::new())
    {
        call = call.header(k.as_str(), render_text(e, &format!("headers.{k}"), v)?);
    }
    if let Some(auth) = auth_data(vault, e).await? {
        let field = |k: &str| {
            auth.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        call = call.basic_auth(field("username"), Some(field("password")));
    }
    let resp = call.form(&form).send().await.map_err(|err| {
        provider_err(
            e,
            format!(
                "token endpoint {shown}: cannot reach it: {}",
                err.without_url()
            ),
        )
    })?;
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.map_err(|err| {
        provider_err(
            e,
            format!(
                "token endpoint {shown}: reading the answer: {}",
                err.without_url()
            ),
        )
    })?;
    if !(200..300).contains(&status) {
        return Err(provider_err(
            e,
            format!(
                "token endpoint {shown} refused: {}",
                error_text(status, &bytes)
            ),
        ));
    }
    let answer: Value = serde_json::from_slice(&bytes).map_err(|_| {
        provider_err(
            e,
            format!("token endpoint {shown}: HTTP {status}, the answer is not JSON"),
        )
    })?;
    if answer.get("access_token").and_then(Value::as_str).is_none() {
        return Err(provider_err(
            e,
            format!("token endpoint {shown}: HTTP {status}, the answer has no `access_token`"),
        ));
    }
    Ok(Fetched {
        ttl_ms: token_ttl_ms(&answer, ttl_cap_ms(e.fields)),
        data: answer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_token_is_kept_for_most_of_its_life_within_the_cap() {
        assert_eq!(token_ttl_ms(&json!({"expires_in": 100}), 3_600_000), 90_000);
        assert_eq!(
            token_ttl_ms(&json!({"expires_in": "100"}), 3_600_000),
            90_000
        );
        assert_eq!(
            token_ttl_ms(&json!({"expires_in": 86400}), 3_600_000),
            3_600_000
        );
        assert_eq!(token_ttl_ms(&json!({}), 60_000), 60_000);
    }

    #[test]
    fn an_error_answer_gives_its_code_only() {
        let body = br#"{"error":"invalid_client","error_description":"bad secret s3cr3t-value"}"#;
        assert_eq!(error_text(401, body), "HTTP 401 `invalid_client`");
        assert_eq!(error_text(500, b"oops s3cr3t"), "HTTP 500");
    }
}
