//! Google credentials for the keychain entries that reach Google
//! (`secret_manager` with `provider: gcp`, `google_id_token`), obtained as
//! Google's own client libraries obtain them:
//!
//! - a service account key (the JSON Google issues: `type:
//!   service_account`, `client_email`, `private_key`, `token_uri`, or that
//!   object under `service_account_info`): a JWT signed with the key (RS256)
//!   is exchanged at `token_uri` (the JWT-bearer grant, RFC 7523) for an
//!   access token (claim `scope`) or an ID token (claim `target_audience`);
//! - the metadata server of GCE / GKE (workload identity), when no key is
//!   given: `instance/service-accounts/default/token` and
//!   `.../identity?audience=AUD&format=full`, with `Metadata-Flavor:
//!   Google`, at `GCE_METADATA_HOST` (as Google's libraries honour it) or
//!   `metadata.google.internal`; a credential `{source: metadata,
//!   metadata_host: HOST}` names another host.
//!
//! Errors say which step and what the service answered (an HTTP status and
//! OAuth2 error code), never a key or a token.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::{json, Value};

/// Google's token endpoint, when a key names none.
pub const TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

/// The metadata server's host when `GCE_METADATA_HOST` is not set.
pub const METADATA_HOST: &str = "metadata.google.internal";

/// The scope of an access token for Google's APIs.
pub const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";

/// How a JWT asserting a service account is exchanged for a token.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// A service account key: what signing and exchanging a JWT needs.
#[derive(Clone, PartialEq)]
pub struct ServiceAccountKey {
    /// The account (`client_email`), the JWT's issuer.
    pub client_email: String,
    /// The key's id (`private_key_id`), the JWT's `kid`.
    pub key_id: Option<String>,
    /// The PEM of the PKCS#8 private key.
    pub private_key: String,
    /// Where the JWT is exchanged (`token_uri`).
    pub token_uri: String,
}

impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

/// Where Google tokens come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A service account key.
    Key(ServiceAccountKey),
    /// The metadata server at this host (`host[:port]`).
    Metadata(String),
}

/// The [`Source`] a credential's data describes: a service account key
/// (the key itself, or under `service_account_info`), or `source:
/// metadata` (also `adc`, `gce`; `metadata_host` names the host). No
/// credential: the metadata server. The host is the credential's
/// `metadata_host`, else `GCE_METADATA_HOST` (`env`), else
/// [`METADATA_HOST`]. The error says what the data lacks.
pub fn source(
    data: Option<&Value>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Source, String> {
    let host = |d: Option<&Value>| {
        d.and_then(|d| d.get("metadata_host"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .or_else(|| env("GCE_METADATA_HOST").filter(|s| !s.is_empty()))
            .unwrap_or_else(|| METADATA_HOST.to_string())
    };
    let Some(data) = data else {
        return Ok(Source::Metadata(host(None)));
    };
    if let Some(info) = data.get("service_account_info").filter(|v| v.is_object()) {
        return key(info).map(Source::Key);
    }
    let text = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or("");
    if text("type") == "service_account" {
        return key(data).map(Source::Key);
    }
    if matches!(text("source"), "metadata" | "adc" | "gce") || !text("metadata_host").is_empty() {
        return Ok(Source::Metadata(host(Some(data))));
    }
    Err(match text("type") {
        "" => "it is neither a service account key (`type: service_account`) nor `source: metadata`".into(),
        other => format!("its `type: {other}` is not read here: store a service account key (`type: service_account`) or `source: metadata`"),
    })
}

fn key(v: &Value) -> Result<ServiceAccountKey, String> {
    let text = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let (Some(client_email), Some(private_key)) = (text("client_email"), text("private_key"))
    else {
        return Err("the service account key lacks `client_email` or `private_key`".into());
    };
    Ok(ServiceAccountKey {
        client_email,
        key_id: text("private_key_id"),
        private_key,
        token_uri: text("token_uri").unwrap_or_else(|| TOKEN_URI.to_string()),
    })
}

/// What a token is asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Want {
    /// An access token with this scope.
    Access(String),
    /// An ID token for this audience.
    Id(String),
}

/// The claims of the JWT a key signs for `want`, issued at `now_s`
/// (valid one hour, Google's maximum).
pub fn claims(key: &ServiceAccountKey, want: &Want, now_s: u64) -> Value {
    let mut c = json!({
        "iss": key.client_email,
        "aud": key.token_uri,
        "iat": now_s,
        "exp": now_s + 3600,
    });
    match want {
        Want::Access(scope) => c["scope"] = json!(scope),
        Want::Id(audience) => {
            c["sub"] = json!(key.client_email);
            c["target_audience"] = json!(audience);
        }
    }
    c
}

/// The DER of a PEM block (`-----BEGIN PRIVATE KEY-----`...).
pub fn pem_der(pem: &str) -> Result<Vec<u8>, String> {
    let body: String = pem
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .collect();
    STANDARD
        .decode(body.as_bytes())
        .map_err(|_| "the service account's `private_key` is not a PEM key".into())
}

/// The signed JWT (RS256) of `claims`.
pub fn sign(key: &ServiceAccountKey, claims: &Value) -> Result<String, String> {
    use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
    let pair = RsaKeyPair::from_pkcs8(&pem_der(&key.private_key)?).map_err(|e| {
        format!("the service account's `private_key` is not an RSA PKCS#8 key ({e})")
    })?;
    let mut header = json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = &key.key_id {
        header["kid"] = json!(kid);
    }
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut sig = vec![0; pair.public().modulus_len()];
    pair.sign(
        &RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut sig,
    )
    .map_err(|_| "signing the token request failed".to_string())?;
    Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
}

/// The `exp` claim of a JWT (seconds since the epoch), when it has one.
pub fn jwt_exp(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice::<Value>(&bytes)
        .ok()?
        .get("exp")?
        .as_u64()
}

/// A token: the text and, when known, its lifetime left (seconds).
pub struct Token {
    /// The access or ID token.
    pub token: String,
    /// Seconds it stays valid (`expires_in`, or the ID token's `exp`).
    pub expires_in: Option<u64>,
}

/// Ask `source` for a token.
pub async fn token(
    client: &reqwest::Client,
    source: &Source,
    want: &Want,
) -> Result<Token, String> {
    match source {
        Source::Key(key) => {
            let now = noetl_mesh::events::now_ms() / 1000;
            let jwt = sign(key, &claims(key, want, now))?;
            let resp = client
                .post(&key.token_uri)
                .header("accept", "application/json")
                .form(&[("grant_type", JWT_BEARER), ("assertion", jwt.as_str())])
                .send()
                .await
                .map_err(|e| {
                    format!(
                        "token endpoint {}: cannot reach it: {}",
                        super::shown_url(&key.token_uri),
                        e.without_url()
                    )
                })?;
            let what = format!("token endpoint {}", super::shown_url(&key.token_uri));
            let answer = json_answer(resp, &what).await?;
            let field = match want {
                Want::Access(_) => "access_token",
                Want::Id(_) => "id_token",
            };
            let token = answer
                .get(field)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{what}: the answer has no `{field}`"))?
                .to_string();
            let expires_in = match want {
                Want::Access(_) => answer.get("expires_in").and_then(Value::as_u64),
                Want::Id(_) => jwt_exp(&token).map(|e| e.saturating_sub(now)),
            };
            Ok(Token { token, expires_in })
        }
        Source::Metadata(host) => {
            let base =
                format!("http://{host}/computeMetadata/v1/instance/service-accounts/default");
            let call = match want {
                Want::Access(scope) => client
                    .get(format!("{base}/token"))
                    .query(&[("scopes", scope.as_str())]),
                Want::Id(audience) => client
                    .get(format!("{base}/identity"))
                    .query(&[("audience", audience.as_str()), ("format", "full")]),
            };
            let what = format!("metadata server {host}");
            let resp = call
                .header("Metadata-Flavor", "Google")
                .send()
                .await
                .map_err(|e| format!("{what}: cannot reach it: {}", e.without_url()))?;
            match want {
                Want::Access(_) => {
                    let answer = json_answer(resp, &what).await?;
                    let token = answer
                        .get("access_token")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("{what}: the answer has no `access_token`"))?
                        .to_string();
                    Ok(Token {
                        token,
                        expires_in: answer.get("expires_in").and_then(Value::as_u64),
                    })
                }
                Want::Id(_) => {
                    let status = resp.status().as_u16();
                    let body = resp
                        .text()
                        .await
                        .map_err(|e| format!("{what}: reading the answer: {}", e.without_url()))?;
                    if !(200..300).contains(&status) {
                        return Err(format!("{what} refused: HTTP {status}"));
                    }
                    let token = body.trim().to_string();
                    let now = noetl_mesh::events::now_ms() / 1000;
                    let expires_in = jwt_exp(&token).map(|e| e.saturating_sub(now));
                    Ok(Token { token, expires_in })
                }
            }
        }
    }
}

/// A JSON answer, or an error with the status and the OAuth2 / Google
/// error code (never the body, which may echo what was sent).
pub async fn json_answer(resp: reqwest::Response, what: &str) -> Result<Value, String> {
    let status = resp.status().as_u16();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| format!("{what}: reading the answer: {}", e.without_url()))?;
    if !(200..300).contains(&status) {
        return Err(format!("{what} refused: {}", error_text(status, &bytes)));
    }
    serde_json::from_slice(&bytes)
        .map_err(|_| format!("{what}: HTTP {status}, the answer is not JSON"))
}

/// The code of an OAuth2 error (`error: "invalid_grant"`) or a Google API
/// error (`error: {status: "PERMISSION_DENIED"}`): codes, never text that
/// could hold a value.
pub fn error_text(status: u16, body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let code = match v.get("error") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Object(o)) => o.get("status").and_then(Value::as_str).map(str::to_string),
        _ => None,
    };
    match code {
        Some(c) => format!("HTTP {status} `{c}`"),
        None => format!("HTTP {status}"),
    }
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
    fn a_key_is_used_when_given_else_the_metadata_server() {
        let sa = json!({"type": "service_account", "client_email": "a@p.iam", "private_key": "PEM", "private_key_id": "k1"});
        let Source::Key(k) = source(Some(&sa), &env(&[])).unwrap() else {
            panic!()
        };
        assert_eq!(
            (
                k.client_email.as_str(),
                k.token_uri.as_str(),
                k.key_id.as_deref()
            ),
            ("a@p.iam", TOKEN_URI, Some("k1"))
        );
        let nested = json!({"service_account_info": {"client_email": "b@p", "private_key": "PEM", "token_uri": "http://t/token"}});
        let Source::Key(k) = source(Some(&nested), &env(&[])).unwrap() else {
            panic!()
        };
        assert_eq!(k.token_uri, "http://t/token");
        assert_eq!(
            source(None, &env(&[])).unwrap(),
            Source::Metadata(METADATA_HOST.into())
        );
        let e = env(&[("GCE_METADATA_HOST", "127.0.0.1:9")]);
        assert_eq!(
            source(None, &e).unwrap(),
            Source::Metadata("127.0.0.1:9".into())
        );
        assert_eq!(
            source(Some(&json!({"source": "adc"})), &e).unwrap(),
            Source::Metadata("127.0.0.1:9".into())
        );
        assert_eq!(
            source(
                Some(&json!({"source": "metadata", "metadata_host": "h:1"})),
                &e
            )
            .unwrap(),
            Source::Metadata("h:1".into())
        );
    }

    #[test]
    fn what_a_credential_lacks_is_named_without_its_values() {
        let e = source(
            Some(&json!({"type": "service_account", "client_email": "a@p"})),
            &env(&[]),
        )
        .unwrap_err();
        assert!(e.contains("`private_key`"), "{e}");
        let e = source(
            Some(&json!({"type": "authorized_user", "refresh_token": "rt-Secret"})),
            &env(&[]),
        )
        .unwrap_err();
        assert!(
            e.contains("authorized_user") && !e.contains("rt-Secret"),
            "{e}"
        );
        assert!(source(Some(&json!({"token": "x"})), &env(&[]))
            .unwrap_err()
            .contains("service account key"));
    }

    #[test]
    fn an_id_token_request_asserts_the_audience_an_access_token_request_the_scope() {
        let k = ServiceAccountKey {
            client_email: "a@p".into(),
            key_id: None,
            private_key: String::new(),
            token_uri: "http://t/token".into(),
        };
        let c = claims(&k, &Want::Id("https://svc.run.app".into()), 100);
        assert_eq!(
            c,
            json!({"iss": "a@p", "sub": "a@p", "aud": "http://t/token", "iat": 100, "exp": 3700, "target_audience": "https://svc.run.app"})
        );
        let c = claims(&k, &Want::Access(CLOUD_PLATFORM.into()), 100);
        assert_eq!(c["scope"], CLOUD_PLATFORM);
        assert!(c.get("target_audience").is_none());
    }

    #[test]
    fn a_jwt_expiry_is_read_and_garbage_is_not() {
        let payload = URL_SAFE_NO_PAD.encode(br#"{"exp": 1234, "aud": "x"}"#);
        assert_eq!(jwt_exp(&format!("h.{payload}.s")), Some(1234));
        assert_eq!(jwt_exp("not-a-jwt"), None);
        assert_eq!(jwt_exp("a.!!.c"), None);
    }

    #[test]
    fn error_answers_give_their_code_only() {
        assert_eq!(
            error_text(
                400,
                br#"{"error":"invalid_grant","error_description":"bad sig for a@p"}"#
            ),
            "HTTP 400 `invalid_grant`"
        );
        assert_eq!(error_text(403, br#"{"error":{"code":403,"message":"denied on s3cr3t","status":"PERMISSION_DENIED"}}"#), "HTTP 403 `PERMISSION_DENIED`");
        assert_eq!(error_text(502, b"<html>"), "HTTP 502");
    }

    #[test]
    fn a_pem_that_is_not_a_key_is_refused_by_name() {
        let k = ServiceAccountKey {
            client_email: "a@p".into(),
            key_id: None,
            private_key: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into(),
            token_uri: TOKEN_URI.into(),
        };
        let e = sign(&k, &json!({})).unwrap_err();
        assert!(e.contains("not an RSA PKCS#8 key"), "{e}");
        assert!(pem_der("-----BEGIN X-----\n@@@\n").is_err());
    }
}
