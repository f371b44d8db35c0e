//! Loading a task's `script` (docs/tools.md, "Scripts"): the text of its
//! python `code` or SQL `command`, from the task, a file where the executor
//! runs, an http(s) URL, or an `s3://` / `gs://` object (read with the
//! keychain entry its `source.auth` names). Where it comes from is decided by
//! [`noetl_core::script::script_source`]; this module only reads.

use noetl_core::script::ScriptSource;
use serde_json::{Map, Value};

/// Largest script this executor loads.
pub(crate) const MAX_SCRIPT_BYTES: usize = 16 << 20;

/// The rendered config with its `script` replaced by the field it stands
/// in for; the config as is when it has no `script`. `Err` is the message
/// of the task's `script` error outcome.
pub(crate) async fn load_into(
    kind: &str,
    mut config: Map<String, Value>,
    credentials: &crate::secrets::Resolved,
) -> Result<Map<String, Value>, String> {
    let Some(field) = noetl_core::script::script_target(kind) else {
        return Ok(config);
    };
    let Some(script) = config.remove("script") else {
        return Ok(config);
    };
    let source = noetl_core::script::script_source(&script).map_err(|e| e.to_string())?;
    let text = load(&source, credentials).await?;
    config.insert(field.to_string(), Value::String(text));
    Ok(config)
}

/// The text `source` names.
async fn load(
    source: &ScriptSource,
    credentials: &crate::secrets::Resolved,
) -> Result<String, String> {
    match source {
        ScriptSource::Object(o) => {
            let cred = match &o.auth {
                Some(name) => Some(credentials.scope.get(name).ok_or_else(|| {
                    format!(
                        "script {}: `source.auth` names `{name}`, which the playbook's keychain does not declare",
                        o.url
                    )
                })?),
                None => None,
            };
            let bytes = noetl_mesh::remote::read_object(
                &o.url,
                cred,
                o.region.as_deref(),
                o.endpoint.as_deref(),
                MAX_SCRIPT_BYTES,
            )
            .await
            .map_err(|e| format!("script {e}"))?;
            String::from_utf8(bytes).map_err(|_| format!("script {} is not UTF-8 text", o.url))
        }
        ScriptSource::Inline(code) => Ok(code.clone()),
        ScriptSource::File(path) => {
            let meta = tokio::fs::metadata(path)
                .await
                .map_err(|e| format!("cannot read script file {path:?}: {e}"))?;
            if meta.len() > MAX_SCRIPT_BYTES as u64 {
                return Err(format!(
                    "script file {path:?} has {} bytes, more than the {MAX_SCRIPT_BYTES} a script may have",
                    meta.len()
                ));
            }
            tokio::fs::read_to_string(path)
                .await
                .map_err(|e| format!("cannot read script file {path:?}: {e}"))
        }
        ScriptSource::Http {
            url,
            method,
            headers,
            timeout,
        } => fetch(url, method, headers, *timeout).await,
    }
}

/// The body of an http(s) request, which must succeed (2xx) and be text.
async fn fetch(
    url: &str,
    method: &str,
    headers: &[(String, String)],
    timeout: std::time::Duration,
) -> Result<String, String> {
    // Messages name the URL without its query: it may carry a key.
    let shown = url.split(['?', '#']).next().unwrap_or(url);
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| format!("script source method {method:?} is not an HTTP method"))?;
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| format!("script fetch from {shown}: {e}"))?;
    let mut req = client.request(method, url);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let mut resp = req
        .send()
        .await
        .map_err(|e| format!("script fetch from {shown} failed: {}", e.without_url()))?;
    if !resp.status().is_success() {
        return Err(format!(
            "script fetch from {shown} answered {}",
            resp.status()
        ));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("script fetch from {shown} failed: {}", e.without_url()))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_SCRIPT_BYTES {
            return Err(format!(
                "script from {shown} is larger than the {MAX_SCRIPT_BYTES} bytes a script may have"
            ));
        }
    }
    String::from_utf8(body).map_err(|_| format!("script from {shown} is not UTF-8 text"))
}
