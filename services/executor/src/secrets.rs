//! Keychain resolution where the task runs, and redaction of every resolved
//! secret value from what leaves the executor (outcomes, results, `ctx` and
//! `iter` patches, and therefore events and KV).

use base64::Engine as _;
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
    // What travels on the wire is a secret too: a server that echoes the
    // `Authorization: Basic ...` header (httpbin does) must not put the
    // encoded password in a result.
    if kind == "basic" {
        let field = |k: &str| match data.get(k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        if let (Some(user), Some(password)) = (field("username"), field("password")) {
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            collect(&Value::String(encoded), out);
        }
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

/// Redact an outcome in place: its result, error (kind, message, extra
/// fields), tool helpers and meta.
///
/// Fails closed by construction: the outcome is walked field by field (no
/// serialisation round trip that could fail, or that could let a tool
/// helper named like a field, e.g. `meta`, shadow it), and the fields are
/// destructured exhaustively, so a field added to [`Outcome`] does not
/// compile here until it is redacted too.
pub fn redact_outcome(outcome: &mut Outcome, secrets: &[String]) {
    if secrets.is_empty() {
        return;
    }
    let Outcome {
        status: _,
        result,
        error,
        meta,
        helpers,
    } = outcome;
    redact_value(result, secrets);
    if let Some(noetl_core::OutcomeError {
        kind,
        retryable: _,
        message,
        extra,
    }) = error
    {
        redact_str(kind, secrets);
        redact_str(message, secrets);
        extra.values_mut().for_each(|v| redact_value(v, secrets));
    }
    let noetl_core::OutcomeMeta {
        attempt: _,
        duration_ms: _,
        started_at,
    } = meta;
    redact_str(started_at, secrets);
    helpers.values_mut().for_each(|v| redact_value(v, secrets));
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

    #[test]
    fn an_outcome_is_redacted_even_when_it_does_not_round_trip() {
        // A tool helper named `meta` collides with the envelope's own field:
        // the outcome no longer survives a JSON round trip, which used to
        // leave it unredacted.
        let secrets = vec!["tok-SECRET-99".to_string()];
        let mut o = Outcome::error("boom", "token tok-SECRET-99 refused", false);
        o.result = json!({"echo": "Bearer tok-SECRET-99"});
        o.error
            .as_mut()
            .unwrap()
            .extra
            .insert("why".into(), json!(["tok-SECRET-99"]));
        o.helpers.insert("meta".into(), json!("tok-SECRET-99"));
        o.helpers
            .insert("http".into(), json!({"url": "x?k=tok-SECRET-99"}));
        redact_outcome(&mut o, &secrets);
        let all = format!("{o:?}");
        assert!(!all.contains("tok-SECRET-99"), "{all}");
        assert_eq!(o.result["echo"], "Bearer [redacted]");
        assert_eq!(o.error.unwrap().message, "token [redacted] refused");
        assert_eq!(o.helpers["meta"], "[redacted]");
    }

    #[test]
    fn basic_credentials_redact_their_wire_form() {
        let mut secrets = Vec::new();
        collect_secret_fields(
            "basic",
            &json!({"username": "app", "password": "pw-Hunter2"}),
            &mut secrets,
        );
        let wire = base64::engine::general_purpose::STANDARD.encode("app:pw-Hunter2");
        assert!(secrets.contains(&wire), "{secrets:?}");
        let mut v = json!({"authorization": format!("Basic {wire}")});
        redact_value(&mut v, &secrets);
        assert_eq!(v["authorization"], "Basic [redacted]");
    }
}
