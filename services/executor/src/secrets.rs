//! Keychain resolution where the task runs, and redaction of every resolved
//! secret value from what leaves the executor (outcomes, results, `ctx` and
//! `iter` patches, and therefore events and KV).

use base64::Engine as _;
use noetl_core::Outcome;
use noetl_mesh::credentials::CredentialError;
use noetl_mesh::Mesh;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{Map, Value};

/// What replaces a secret value.
pub const REDACTED: &str = "[redacted]";

/// Secret strings shorter than this are not redacted by substring (they
/// would mangle ordinary text); credentials are expected to be longer.
pub const MIN_REDACTED_LEN: usize = 4;

/// A transformed form of a secret (an encoding, or a part of one that
/// sits inside a longer encoded text) shorter than this is not redacted:
/// too likely to occur by chance in ordinary output.
pub const MIN_ENCODED_LEN: usize = 8;

/// The resolved `keychain` scope and the strings to redact.
#[derive(Debug, Default, Clone)]
pub struct Resolved {
    /// `{name: {field: value}}` for the `keychain` template scope.
    pub scope: Map<String, Value>,
    /// Every secret string leaf and its common encodings ([`needles`]),
    /// longest first: computed once per step.
    pub secrets: Vec<String>,
    /// Credential kind by name.
    pub kinds: std::collections::HashMap<String, String>,
}

impl Resolved {
    /// The credential named `name`, for a task's `auth` field.
    /// An `oauth2`, `google_id_token` or `google_access_token` entry is
    /// used as a `bearer` of its `access_token` (a Google ID token's is the
    /// ID token), a `secret_manager` entry with a `token` field as a
    /// `bearer` of it (what `noetl migrate` makes of NoETL's inline `auth:
    /// {type: bearer, provider: secret_manager, key}`).
    pub fn credential(&self, name: &str) -> Option<noetl_core::tool::AuthCredential> {
        let kind = self.kinds.get(name)?.clone();
        let data = self.scope.get(name)?.clone();
        let (kind, data) = match kind.as_str() {
            "oauth2" | "google_id_token" | "google_access_token" => (
                "bearer".to_string(),
                serde_json::json!({ "token": data.get("access_token").cloned().unwrap_or(Value::Null) }),
            ),
            "secret_manager" if data.get("token").is_some() => (
                "bearer".to_string(),
                serde_json::json!({ "token": data.get("token").cloned().unwrap_or(Value::Null) }),
            ),
            _ => (kind, data),
        };
        Some(noetl_core::tool::AuthCredential {
            name: name.to_string(),
            kind,
            data,
        })
    }
}

/// Resolve every entry the playbook's keychain declares, in order: a
/// stored credential is decrypted; a `secret_manager` or `oauth2` entry
/// comes from the execution's auth cache or its service
/// ([`crate::keychain`]), its templates rendering over `workload` and the
/// entries before it. The error names the entry, never a value, and keeps
/// its kind: a KV outage is transient (the command is retried), a missing
/// credential is not.
pub async fn resolve(
    mesh: &Mesh,
    plan: &noetl_mesh::plan::PlanRecord,
) -> Result<Resolved, CredentialError> {
    let vault = mesh.vault();
    let mut out = Resolved::default();
    let mut values = Vec::new();
    for entry in &plan.playbook.keychain {
        let (kind, data) = if crate::keychain::SERVICE_KINDS.contains(&entry.kind.as_str()) {
            let scope = noetl_core::template::Scope::new()
                .workload(plan.workload.clone())
                .keychain(Value::Object(out.scope.clone()))
                .execution_id(plan.execution_id.clone());
            let e = crate::keychain::Entry {
                name: &entry.name,
                kind: &entry.kind,
                playbook: &plan.playbook.metadata.name,
                fields: &entry.extra,
                scope: &scope,
            };
            let data = crate::keychain::resolve(mesh, &plan.execution_id, &e).await?;
            (entry.kind.clone(), data)
        } else {
            let cred = vault.get(&entry.name).await?;
            (cred.kind, cred.data)
        };
        collect_secret_fields(&kind, &data, &mut values);
        out.kinds.insert(entry.name.clone(), kind);
        out.scope.insert(entry.name.clone(), data);
    }
    out.secrets = redaction_set(&values);
    Ok(out)
}

/// Every needle of every value ([`needles`]), deduplicated, longest first
/// (so a secret is replaced whole before a shorter secret inside it).
pub fn redaction_set(values: &[String]) -> Vec<String> {
    let mut out: Vec<String> = values.iter().flat_map(|v| needles(v)).collect();
    out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    out.dedup();
    out
}

/// The strings that reveal `secret` when they occur in output: the value
/// itself and what a task makes of it with one common transformation —
/// upper and lower case; hex (lower and upper case); base64, standard and
/// URL-safe, with and without padding, whole and as it appears inside a
/// longer encoded text (e.g. `base64("user:" + secret)`: the characters
/// that depend on the secret's bytes alone, for each of its three possible
/// alignments); percent-encoding as Python's `quote` / `quote_plus`,
/// JavaScript's `encodeURIComponent` and lower-case escapes write it.
///
/// Empty for a secret shorter than [`MIN_REDACTED_LEN`]; a transformed form
/// shorter than [`MIN_ENCODED_LEN`] is left out. Chains of transformations
/// (base64 of the upper-cased value), slices, reversal or encryption are
/// not caught (see docs/security.md).
pub fn needles(secret: &str) -> Vec<String> {
    if secret.len() < MIN_REDACTED_LEN {
        return Vec::new();
    }
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let bytes = secret.as_bytes();
    let mut out = vec![secret.to_string()];
    let mut add = |form: String, min: usize| {
        if form.len() >= min && !out.contains(&form) {
            out.push(form);
        }
    };
    // Case variants are as long as the secret: the secret's own rule.
    add(secret.to_uppercase(), MIN_REDACTED_LEN);
    add(secret.to_lowercase(), MIN_REDACTED_LEN);
    let mut encoded = vec![
        hex::encode(bytes),
        hex::encode_upper(bytes),
        STANDARD.encode(bytes),
        STANDARD_NO_PAD.encode(bytes),
        URL_SAFE.encode(bytes),
        URL_SAFE_NO_PAD.encode(bytes),
    ];
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        for shift in 0..3 {
            encoded.push(base64_core(engine, bytes, shift));
        }
    }
    for style in PERCENT_STYLES {
        encoded.push(percent_encode(secret, style));
    }
    for form in encoded {
        add(form, MIN_ENCODED_LEN);
    }
    out
}

/// The base64 characters of `secret` that do not depend on its neighbours
/// when it starts `shift` bytes (mod 3) into a longer encoded text.
fn base64_core(engine: &base64::engine::GeneralPurpose, secret: &[u8], shift: usize) -> String {
    let mut framed = vec![0u8; shift];
    framed.extend_from_slice(secret);
    let encoded = engine.encode(&framed);
    // Character i holds bits [6i, 6i+6); the secret holds bits
    // [8·shift, 8·(shift+len)).
    let start = (8 * shift).div_ceil(6);
    let end = (8 * (shift + secret.len())) / 6;
    encoded.get(start..end).unwrap_or("").to_string()
}

/// RFC 3986's unreserved characters are left as they are.
const UNRESERVED: AsciiSet = NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One way of percent-encoding.
struct PercentStyle {
    /// The characters encoded.
    set: &'static AsciiSet,
    /// `%2f` rather than `%2F`.
    lower: bool,
    /// A space as `+` (form encoding): `set` leaves spaces alone.
    plus: bool,
}

const PERCENT_STYLES: &[PercentStyle] = &[
    // RFC 3986 unreserved only: Python's quote(s, safe='').
    PercentStyle {
        set: &UNRESERVED,
        lower: false,
        plus: false,
    },
    PercentStyle {
        set: &UNRESERVED,
        lower: true,
        plus: false,
    },
    // Python's quote(s) (keeps `/`).
    PercentStyle {
        set: &UNRESERVED.remove(b'/'),
        lower: false,
        plus: false,
    },
    // Python's quote_plus(s), HTML forms.
    PercentStyle {
        set: &UNRESERVED.remove(b' '),
        lower: false,
        plus: true,
    },
    // JavaScript's encodeURIComponent.
    PercentStyle {
        set: &UNRESERVED
            .remove(b'!')
            .remove(b'\'')
            .remove(b'(')
            .remove(b')')
            .remove(b'*'),
        lower: false,
        plus: false,
    },
];

fn percent_encode(s: &str, style: &PercentStyle) -> String {
    let encoded = utf8_percent_encode(s, style.set).to_string();
    let encoded = if style.plus {
        encoded.replace(' ', "+")
    } else {
        encoded
    };
    if !style.lower {
        return encoded;
    }
    // The crate writes upper-case hex; some encoders write lower-case.
    let mut out = String::with_capacity(encoded.len());
    let mut hex_left = 0;
    for c in encoded.chars() {
        if c == '%' {
            hex_left = 2;
            out.push(c);
        } else if hex_left > 0 {
            hex_left -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Fields that locate or name rather than authenticate (`host`, `user`,
/// `database`...): redacting them would mangle ordinary output (a database
/// named `test`). Every other field is secret; a `secret` credential's
/// fields all are.
pub const NON_SECRET_FIELDS: &[&str] = &[
    "host",
    "port",
    "user",
    "username",
    "database",
    "dbname",
    "db",
    "sslmode",
    "header",
    "name",
    "in",
    "token_type",
    "expires_in",
    "scope",
    "audience",
];

fn collect_secret_fields(kind: &str, data: &Value, out: &mut Vec<String>) {
    match data {
        // Every field of a `secret` or `static` entry is secret.
        Value::Object(m) if !matches!(kind, "secret" | "static") => {
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
        trace_id: _,
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

    /// A token as a user would transform it in a task, each form written
    /// out as Python produces it (not computed by the code under test).
    const TOKEN: &str = "tok-Bearer/44170 ~x?>";

    fn redacted(text: &str) -> String {
        let mut s = text.to_string();
        redact_str(&mut s, &redaction_set(&[TOKEN.to_string()]));
        s
    }

    #[test]
    fn percent_styles_encode_as_the_encoders_they_stand_for() {
        let text = "a b/c+d~é";
        let got: Vec<String> = PERCENT_STYLES
            .iter()
            .map(|s| percent_encode(text, s))
            .collect();
        assert_eq!(
            got,
            [
                "a%20b%2Fc%2Bd~%C3%A9", // RFC 3986
                "a%20b%2fc%2bd~%c3%a9", // lower-case hex
                "a%20b/c%2Bd~%C3%A9",   // Python quote
                "a+b%2Fc%2Bd~%C3%A9",   // Python quote_plus, forms
                "a%20b%2Fc%2Bd~%C3%A9", // encodeURIComponent
            ]
        );
        let js = &PERCENT_STYLES[4];
        assert_eq!(percent_encode("it's (x)*!", js), "it's%20(x)*!");
    }

    #[test]
    fn every_common_encoding_of_a_secret_is_redacted() {
        for (how, form) in [
            ("t.upper()", "TOK-BEARER/44170 ~X?>"),
            ("t.lower()", "tok-bearer/44170 ~x?>"),
            (
                "t.encode().hex()",
                "746f6b2d4265617265722f3434313730207e783f3e",
            ),
            (
                "hex, upper case",
                "746F6B2D4265617265722F3434313730207E783F3E",
            ),
            ("b64encode", "dG9rLUJlYXJlci80NDE3MCB+eD8+"),
            ("urlsafe_b64encode", "dG9rLUJlYXJlci80NDE3MCB-eD8-"),
            ("quote(t, safe='')", "tok-Bearer%2F44170%20~x%3F%3E"),
            ("quote(t)", "tok-Bearer/44170%20~x%3F%3E"),
            ("quote_plus(t)", "tok-Bearer%2F44170+~x%3F%3E"),
            ("lower-case escapes", "tok-Bearer%2f44170%20~x%3f%3e"),
        ] {
            assert_eq!(
                redacted(&format!("got {form} back")),
                "got [redacted] back",
                "{how}"
            );
        }
    }

    #[test]
    fn base64_without_padding_and_inside_longer_texts_is_redacted() {
        assert_eq!(
            redacted("b64: dG9rLUJlYXJlci80NDE3MCB-eD8- ok"),
            "b64: [redacted] ok"
        );
        // The secret at each of the three alignments inside a longer
        // encoded text: base64(b"user:" + t + b"!"), base64(b"x" + t),
        // base64(b"xy" + t), standard and URL-safe.
        for blob in [
            "dXNlcjp0b2stQmVhcmVyLzQ0MTcwIH54Pz4h",
            "eHRvay1CZWFyZXIvNDQxNzAgfng/PiE=",
            "eHRvay1CZWFyZXIvNDQxNzAgfng_Pg==",
            "eHl0b2stQmVhcmVyLzQ0MTcwIH54Pz4=",
        ] {
            let out = redacted(blob);
            assert!(
                out.contains(REDACTED) && out.len() + 15 < blob.len() + REDACTED.len(),
                "{blob} -> {out}"
            );
        }
    }

    #[test]
    fn short_values_and_ordinary_text_are_left_alone() {
        assert!(needles("abc").is_empty());
        let n = needles("abcd");
        assert!(n.contains(&"ABCD".to_string()), "{n:?}");
        assert!(n.contains(&"61626364".to_string()), "{n:?}");
        assert!(n.contains(&"YWJjZA==".to_string()), "{n:?}");
        // Unpadded "YWJjZA" and the in-text cores are too short to be told
        // apart from chance.
        for f in &n {
            assert!(
                f.eq_ignore_ascii_case("abcd") || f.len() >= MIN_ENCODED_LEN,
                "{f} in {n:?}"
            );
        }
        let text = "rows 1..40, status ok, TOKEN unset, see /docs?page=2";
        assert_eq!(redacted(text), text);
    }

    #[test]
    fn the_set_is_deduplicated_longest_first() {
        let set = redaction_set(&["1234abcd".into(), "1234ABCD".into(), "zz".into()]);
        let mut sorted = set.clone();
        sorted.sort_by_key(|s| std::cmp::Reverse(s.len()));
        assert_eq!(
            set.iter().map(String::len).collect::<Vec<_>>(),
            sorted.iter().map(String::len).collect::<Vec<_>>()
        );
        let unique: std::collections::HashSet<_> = set.iter().collect();
        assert_eq!(unique.len(), set.len(), "{set:?}");
        assert!(set.contains(&"1234abcd".to_string()) && set.contains(&"1234ABCD".to_string()));
        assert!(!set.iter().any(|s| s == "zz"));
    }
}
