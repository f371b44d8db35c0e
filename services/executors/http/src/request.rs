//! A task's fields, checked and turned into a request description.

use noetl_core::timeout::{task_timeouts, TaskTimeouts};
use std::time::Duration;

use noetl_core::tool::AuthCredential;
use serde_json::{Map, Value};

/// Default connect timeout.
pub const DEFAULT_CONNECT: Duration = Duration::from_secs(10);
/// Default read (whole request) timeout.
pub const DEFAULT_READ: Duration = Duration::from_secs(60);

/// Why a task's fields cannot make a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `url` missing or not a string.
    #[error("`url` is required (a string)")]
    NoUrl,
    /// `url` does not parse.
    #[error("`url` {url:?} is not a valid http(s) URL: {reason}")]
    BadUrl {
        /// The URL as shown in messages: no query, password or token.
        url: String,
        /// Parser message.
        reason: String,
    },
    /// Unknown method.
    #[error("`method` {0:?} is not an HTTP method")]
    BadMethod(String),
    /// More than one body field.
    #[error("use one of `json`, `body`, `form`; the task has {0}")]
    SeveralBodies(String),
    /// A field has the wrong shape.
    #[error("`{field}` must be {expected}")]
    Shape {
        /// Field name.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// `spec.timeout` unusable.
    #[error(transparent)]
    Timeout(#[from] noetl_core::timeout::TimeoutError),
    /// The credential cannot authenticate HTTP.
    #[error("credential `{name}` is of kind {kind}; http `auth` takes bearer, basic or api_key")]
    AuthKind {
        /// Credential name.
        name: String,
        /// Its kind.
        kind: String,
    },
    /// The credential lacks a field.
    #[error("credential `{name}` ({kind}) has no `{field}`")]
    AuthField {
        /// Credential name.
        name: String,
        /// Its kind.
        kind: String,
        /// Missing field.
        field: &'static str,
    },
}

/// The body of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// No body.
    None,
    /// JSON (`json:`).
    Json(Value),
    /// Raw text (`body:`).
    Text(String),
    /// URL-encoded form (`form:`).
    Form(Vec<(String, String)>),
}

/// How a credential is applied.
#[derive(Clone, PartialEq)]
pub enum Auth {
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// HTTP basic.
    Basic(String, Option<String>),
    /// A header or query parameter carrying a key.
    ApiKeyHeader(String, String),
    /// A query parameter carrying a key.
    ApiKeyQuery(String, String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Auth::Bearer(_) => "Bearer",
            Auth::Basic(..) => "Basic",
            Auth::ApiKeyHeader(h, _) => return write!(f, "ApiKeyHeader({h}, [redacted])"),
            Auth::ApiKeyQuery(q, _) => return write!(f, "ApiKeyQuery({q}, [redacted])"),
        };
        write!(f, "{kind}([redacted])")
    }
}

/// A checked request.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Upper-case method.
    pub method: reqwest::Method,
    /// The URL with `params` applied.
    pub url: reqwest::Url,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Body,
    /// Follow 3xx (max 10).
    pub follow_redirects: bool,
    /// Check the server's TLS certificate (`verify_ssl`, default true).
    pub verify_tls: bool,
    /// Connect timeout.
    pub connect: Duration,
    /// Whole-request timeout.
    pub read: Duration,
    /// Credential.
    pub auth: Option<Auth>,
}

/// A scalar as header/query text.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `(connect, read)` from `spec.timeout` (docs/tools.md).
pub fn timeouts(spec: &Value) -> Result<(Duration, Duration), ConfigError> {
    let defaults = TaskTimeouts {
        connect: DEFAULT_CONNECT,
        read: DEFAULT_READ,
    };
    let t = task_timeouts(spec, defaults)?;
    Ok((t.connect, t.read))
}

/// The URL as messages and results show it: no query, fragment, password
/// or user token ([`noetl_core::field_rules::shown_url`]).
pub fn display_url(url: &reqwest::Url) -> String {
    noetl_core::field_rules::shown_url(url)
}

fn auth_of(c: &AuthCredential) -> Result<Auth, ConfigError> {
    let need = |field: &'static str| {
        c.field(field)
            .map(str::to_string)
            .ok_or_else(|| ConfigError::AuthField {
                name: c.name.clone(),
                kind: c.kind.clone(),
                field,
            })
    };
    match c.kind.as_str() {
        "bearer" => Ok(Auth::Bearer(need("token")?)),
        "basic" => Ok(Auth::Basic(
            need("username")?,
            c.field("password").map(str::to_string),
        )),
        "api_key" => {
            let key = c
                .field("key")
                .or_else(|| c.field("value"))
                .map(str::to_string)
                .ok_or_else(|| ConfigError::AuthField {
                    name: c.name.clone(),
                    kind: c.kind.clone(),
                    field: "key",
                })?;
            if c.field("in") == Some("query") {
                let name = c.field("name").unwrap_or("api_key").to_string();
                Ok(Auth::ApiKeyQuery(name, key))
            } else {
                let header = c
                    .field("header")
                    .or_else(|| c.field("name"))
                    .unwrap_or("X-API-Key")
                    .to_string();
                Ok(Auth::ApiKeyHeader(header, key))
            }
        }
        _ => Err(ConfigError::AuthKind {
            name: c.name.clone(),
            kind: c.kind.clone(),
        }),
    }
}

/// Check a task's fields.
pub fn parse(
    config: &Map<String, Value>,
    spec: &Value,
    auth: Option<&AuthCredential>,
) -> Result<Spec, ConfigError> {
    let mut url = url(config)?;
    let method = method(config)?;
    add_params(&mut url, config.get("params"))?;
    let headers = headers(config)?;
    let body = body(config)?;
    let follow_redirects = flag(config, "follow_redirects")?;
    let verify_tls = flag(config, "verify_ssl")?;
    let (connect, read) = timeouts(spec)?;
    Ok(Spec {
        method,
        url,
        headers,
        body,
        follow_redirects,
        verify_tls,
        connect,
        read,
        auth: auth.map(auth_of).transpose()?,
    })
}

/// `url`: required, an http(s) URL.
fn url(config: &Map<String, Value>) -> Result<reqwest::Url, ConfigError> {
    let raw = config
        .get("url")
        .and_then(Value::as_str)
        .ok_or(ConfigError::NoUrl)?;
    let url = reqwest::Url::parse(raw).map_err(|e| ConfigError::BadUrl {
        url: noetl_core::field_rules::shown_url_text(raw),
        reason: e.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::BadUrl {
            url: display_url(&url),
            reason: format!("scheme {:?} is not http or https", url.scheme()),
        });
    }
    Ok(url)
}

/// `method` (default GET), any case.
fn method(config: &Map<String, Value>) -> Result<reqwest::Method, ConfigError> {
    match config.get("method") {
        None | Some(Value::Null) => Ok(reqwest::Method::GET),
        Some(Value::String(m)) => reqwest::Method::from_bytes(m.trim().to_uppercase().as_bytes())
            .map_err(|_| ConfigError::BadMethod(m.clone())),
        Some(_) => Err(ConfigError::Shape {
            field: "method",
            expected: "a string",
        }),
    }
}

/// Append `params` to the URL's query: a list repeats the key, `null` is
/// left out.
fn add_params(url: &mut reqwest::Url, params: Option<&Value>) -> Result<(), ConfigError> {
    match params {
        None | Some(Value::Null) => {}
        Some(Value::Object(params)) => {
            let mut q = url.query_pairs_mut();
            for (k, v) in params {
                match v {
                    Value::Array(items) => {
                        for item in items {
                            q.append_pair(k, &text(item));
                        }
                    }
                    Value::Null => {}
                    v => {
                        q.append_pair(k, &text(v));
                    }
                }
            }
        }
        Some(_) => {
            return Err(ConfigError::Shape {
                field: "params",
                expected: "an object",
            })
        }
    }
    Ok(())
}

/// `headers`: an object of header values.
fn headers(config: &Map<String, Value>) -> Result<Vec<(String, String)>, ConfigError> {
    match config.get("headers") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(h)) => Ok(h.iter().map(|(k, v)| (k.clone(), text(v))).collect()),
        Some(_) => Err(ConfigError::Shape {
            field: "headers",
            expected: "an object of header values",
        }),
    }
}

/// The body: at most one of `json`, `body` and `form`.
fn body(config: &Map<String, Value>) -> Result<Body, ConfigError> {
    let present: Vec<&str> = ["json", "body", "form"]
        .into_iter()
        .filter(|k| !matches!(config.get(*k), None | Some(Value::Null)))
        .collect();
    if present.len() > 1 {
        return Err(ConfigError::SeveralBodies(present.join(", ")));
    }
    Ok(match present.first().copied() {
        None => Body::None,
        Some("json") => Body::Json(config["json"].clone()),
        Some("body") => Body::Text(match &config["body"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }),
        _ => match &config["form"] {
            Value::Object(f) => Body::Form(f.iter().map(|(k, v)| (k.clone(), text(v))).collect()),
            _ => {
                return Err(ConfigError::Shape {
                    field: "form",
                    expected: "an object",
                })
            }
        },
    })
}

/// A true/false field, true when absent.
fn flag(config: &Map<String, Value>, field: &'static str) -> Result<bool, ConfigError> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ConfigError::Shape {
            field,
            expected: "true or false",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn shown_urls_carry_no_password_query_or_token() {
        // The rule itself is tested in noetl_core::field_rules.
        let shown = |raw: &str| display_url(&reqwest::Url::parse(raw).unwrap());
        assert_eq!(shown("http://u:pa$s@h:8080/p?a=1"), "http://u:***@h:8080/p");
        // A URL that does not parse is shown the same way.
        let e = parse(
            &cfg(json!({"url": "http://app:pa$s@[bad/p?key=k3y"})),
            &json!({}),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains("pa$s") && !e.contains("k3y"), "{e}");
        assert!(e.contains("http://***@[bad/p"), "{e}");
    }

    #[test]
    fn fields_become_a_request() {
        let s = parse(
            &cfg(json!({"url": "http://h/p?a=1", "method": "post", "params": {"b": 2, "c": ["x", "y"]}, "headers": {"X-N": 5}, "json": {"k": 1}})),
            &json!({"timeout": {"connect": 1, "read": 2.5}}),
            None,
        )
        .unwrap();
        assert_eq!(s.method, reqwest::Method::POST);
        assert_eq!(s.url.as_str(), "http://h/p?a=1&b=2&c=x&c=y");
        assert_eq!(s.headers, vec![("X-N".to_string(), "5".to_string())]);
        assert_eq!(s.body, Body::Json(json!({"k": 1})));
        assert_eq!(s.connect, Duration::from_secs(1));
        assert_eq!(s.read, Duration::from_millis(2500));
        assert!(s.follow_redirects);
        assert!(s.verify_tls);
        let s = parse(
            &cfg(json!({"url": "https://h", "verify_ssl": false})),
            &Value::Null,
            None,
        )
        .unwrap();
        assert!(!s.verify_tls);
    }

    #[test]
    fn bad_fields_are_named() {
        let e = |v: Value| parse(&cfg(v), &Value::Null, None).unwrap_err().to_string();
        assert_eq!(e(json!({})), "`url` is required (a string)");
        assert!(e(json!({"url": "ftp://h/x"})).contains("not http or https"));
        assert!(e(json!({"url": "http://h", "json": 1, "form": {}})).contains("json, form"));
        assert!(e(json!({"url": "http://h", "method": "GE T"})).contains("`method`"));
        assert!(e(json!({"url": "http://h", "verify_ssl": "no"})).contains("`verify_ssl`"));
        let t = parse(
            &cfg(json!({"url": "http://h"})),
            &json!({"timeout": "x"}),
            None,
        );
        assert!(matches!(t, Err(ConfigError::Timeout(_))));
    }

    #[test]
    fn credentials_map_to_auth_and_never_print() {
        let cred = |kind: &str, data: Value| AuthCredential {
            name: "c".into(),
            kind: kind.into(),
            data,
        };
        let s = parse(
            &cfg(json!({"url": "http://h"})),
            &Value::Null,
            Some(&cred("bearer", json!({"token": "tok-123456"}))),
        )
        .unwrap();
        assert_eq!(s.auth, Some(Auth::Bearer("tok-123456".into())));
        assert!(!format!("{s:?}").contains("tok-123456"));
        let s = parse(
            &cfg(json!({"url": "http://h"})),
            &Value::Null,
            Some(&cred(
                "api_key",
                json!({"key": "k-1", "in": "query", "name": "apikey"}),
            )),
        )
        .unwrap();
        assert_eq!(
            s.auth,
            Some(Auth::ApiKeyQuery("apikey".into(), "k-1".into()))
        );
        let e = parse(
            &cfg(json!({"url": "http://h"})),
            &Value::Null,
            Some(&cred("postgres_credential", json!({"user": "u"}))),
        )
        .unwrap_err();
        assert!(e.to_string().contains("bearer, basic or api_key"));
    }
}
