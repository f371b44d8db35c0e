//! Keychain resolution where the task runs, and redaction of every resolved
//! secret value from what leaves the executor (outcomes, results, `ctx` and
//! `iter` patches, and therefore events and KV).

use noetl_core::Outcome;
use noetl_mesh::Mesh;
use serde_json::{Map, Value};

/// What replaces a secret value.
pub const REDACTED: &str = "[redacted]";

/// Secret strings shorter than this are not redacted by substring (they
/// would mangle ordinary text); credentials are expected to be longer.
pub const MIN_REDACTED_LEN: usize = 4;

/// The resolved `keychain` scope and the strings to redact.
#[derive(Debug, Default, Clone)]
pub struct Resolved {
    /// `{name: {field: value}}` for the `keychain` template scope.
    pub scope: Map<String, Value>,
    /// Every secret string leaf, longest first.
    pub secrets: Vec<String>,
    /// Credential kind by name.
    pub kinds: std::collections::HashMap<String, String>,
}

impl Resolved {
    /// The credential named `name`, for a task's `auth` field.
    pub fn credential(&self, name: &str) -> Option<noetl_core::tool::AuthCredential> {
        Some(noetl_core::tool::AuthCredential {
            name: name.to_string(),
            kind: self.kinds.get(name)?.clone(),
            data: self.scope.get(name)?.clone(),
        })
    }
}

/// Decrypt every credential the playbook declares. The error names the
/// credential, never a value.
pub async fn resolve(
    mesh: &Mesh,
    playbook: &noetl_core::model::Playbook,
) -> Result<Resolved, String> {
    let vault = mesh.vault();
    let mut out = Resolved::default();
    for entry in &playbook.keychain {
        let cred = vault.get(&entry.name).await.map_err(|e| e.to_string())?;
        collect_secret_fields(&cred.kind, &cred.data, &mut out.secrets);
        out.kinds.insert(entry.name.clone(), cred.kind.clone());
        out.scope.insert(entry.name.clone(), cred.data);
    }
    out.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.secrets.dedup();
    Ok(out)
}

/// Fields that locate or name rather than authenticate (`host`, `user`,
/// `database`...): redacting them would mangle ordinary output (a database
/// named `test`). Every other field is secret; a `secret` credential's
/// fields all are.
pub const NON_SECRET_FIELDS: &[&str] = &[
    "host", "port", "user", "username", "database", "dbname", "db", "sslmode", "header", "name",
    "in",
];

fn collect_secret_fields(kind: &str, data: &Value, out: &mut Vec<String>) {
    match data {
        Value::Object(m) if kind != "secret" => {
            for (k, v) in m {
                if !NON_SECRET_FIELDS.contains(&k.as_str()) {
                    collect(v, out);
                }
            }
        }
        other => collect(other, out),
    }
}

fn collect(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.len() >= MIN_REDACTED_LEN => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
        Value::Object(m) => m.values().for_each(|x| collect(x, out)),
        _ => {}
    }
}

/// Replace every secret occurring in any string of `v`.
pub fn redact_value(v: &mut Value, secrets: &[String]) {
    match v {
        Value::String(s) => redact_str(s, secrets),
        Value::Array(a) => a.iter_mut().for_each(|x| redact_value(x, secrets)),
        Value::Object(m) => m.values_mut().for_each(|x| redact_value(x, secrets)),
        _ => {}
    }
}

/// Replace every secret occurring in `s`.
pub fn redact_str(s: &mut String, secrets: &[String]) {
    for secret in secrets {
        if s.contains(secret.as_str()) {
            *s = s.replace(secret.as_str(), REDACTED);
        }
    }
}

/// Redact an outcome in place (result, error message and extra fields).
pub fn redact_outcome(outcome: &mut Outcome, secrets: &[String]) {
    if secrets.is_empty() {
        return;
    }
    if let Ok(mut v) = serde_json::to_value(&*outcome) {
        redact_value(&mut v, secrets);
        if let Ok(o) = serde_json::from_value(v) {
            *outcome = o;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_replaced_everywhere_longest_first() {
        let mut secrets = Vec::new();
        collect(
            &json!({"token": "abcd1234", "user": "abcd", "n": 5, "x": "ab"}),
            &mut secrets,
        );
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut v =
            json!({"msg": "Bearer abcd1234 failed for abcd", "list": ["abcd1234"], "ab": "ab"});
        redact_value(&mut v, &secrets);
        assert_eq!(
            v,
            json!({"msg": "Bearer [redacted] failed for [redacted]", "list": ["[redacted]"], "ab": "ab"})
        );
    }
}
