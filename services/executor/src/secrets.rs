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
/// entries before it. The error names the entry and keeps its kind (a KV
/// outage is transient: the command is retried; a missing credential is
/// not); the values of the entries resolved before it are redacted from
/// its text ([`redact_error`]).
pub async fn resolve(
    mesh: &Mesh,
    plan: &noetl_mesh::plan::PlanRecord,
) -> Result<Resolved, CredentialError> {
    let vault = mesh.vault();
    let mut out = Resolved::default();
    let mut values = Vec::new();
    for entry in &plan.playbook.keychain {
        let resolved = if crate::keychain::SERVICE_KINDS.contains(&entry.kind.as_str()) {
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
            crate::keychain::resolve(mesh, &plan.execution_id, &e)
                .await
                .map(|data| (entry.kind.clone(), data))
        } else {
            vault.get(&entry.name).await.map(|c| (c.kind, c.data))
        };
        // The error is published (`step.failed`): a service's answer or an
        // endpoint rendered from the entries before may quote their values.
        let (kind, data) = resolved.map_err(|e| redact_error(e, &redaction_set(&values)))?;
        collect_secret_fields(&kind, &data, &mut values);
        out.kinds.insert(entry.name.clone(), kind);
        out.scope.insert(entry.name.clone(), data);
    }
    out.secrets = redaction_set(&values);
    Ok(out)
}

/// `e` with every secret of `secrets` ([`redaction_set`]) redacted from its
/// message: a service's answer, or an endpoint or secret id rendered from
/// earlier keychain entries. Its variant, and so its retryability, is kept.
pub fn redact_error(e: CredentialError, secrets: &[String]) -> CredentialError {
    match e {
        CredentialError::Provider {
            name,
            kind,
            playbook,
            mut message,
        } => {
            redact_str(&mut message, secrets);
            CredentialError::Provider {
                name,
                kind,
                playbook,
                message,
            }
        }
        // The others name a credential, a file or the bucket: no value.
        other => other,
    }
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
/// JavaScript's `encodeURIComponent` and lower-case escapes write it;
/// backslash-escaped inside a string literal ([`escaped_forms`]: JSON,
/// Python's `repr`), when that differs from the value.
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
    // Escaped in a string literal (a PEM key's newlines written `\n` by a
    // printed dict or a JSON document): never shorter than the secret.
    for form in escaped_forms(secret) {
        add(form, MIN_REDACTED_LEN);
    }
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

/// `secret` as it appears between the quotes of a string literal, when
/// escaping changes it: JSON as `serde_json` and Python's `json.dumps(...,
/// ensure_ascii=False)` write it, and as `json.dumps` writes it by default
/// (non-ASCII as `\uXXXX`); Python's `repr` (what `print` of a dict or a
/// list shows), with the quotes it chooses and with single quotes.
pub fn escaped_forms(secret: &str) -> Vec<String> {
    let json = serde_json::to_string(secret).expect("a string always serialises");
    let mut out = vec![json[1..json.len() - 1].to_string(), json_ascii(secret)];
    let auto = if secret.contains('\'') && !secret.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(python_repr_body(secret, auto));
    out.push(python_repr_body(secret, '\''));
    out.retain(|f| f != secret);
    out.dedup();
    out
}

/// The body of Python's `json.dumps(s)` (`ensure_ascii=True`).
fn json_ascii(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out
}

/// The body of Python's `repr(s)` quoted with `quote`: `\\`, the quote,
/// `\n`, `\r` and `\t` escaped, other control characters as `\xNN`;
/// non-ASCII characters Python deems unprintable (approximated: control,
/// format and separator characters) as `\xNN`, `\uNNNN` or `\UNNNNNNNN`.
fn python_repr_body(s: &str, quote: char) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            c if c.is_ascii() || (python_unprintable(c) && (c as u32) < 0x100) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if python_unprintable(c) && (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if python_unprintable(c) => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether Python's `str.isprintable` is false for a non-ASCII `c`
/// (approximated without Unicode category tables).
fn python_unprintable(c: char) -> bool {
    c.is_control()
        || c.is_whitespace()
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}')
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
        // A number (a PIN, an account number) as its JSON text, under the
        // strings' length rule.
        Value::Number(n) => {
            let text = n.to_string();
            if text.len() >= MIN_REDACTED_LEN {
                out.push(text);
            }
        }
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

/// Replace every secret occurring in `s`, and the part of one that a cut
/// of the text left at the cut ([`redact_cut_edges`]).
pub fn redact_str(s: &mut String, secrets: &[String]) {
    for secret in secrets {
        if s.contains(secret.as_str()) {
            *s = s.replace(secret.as_str(), REDACTED);
        }
    }
    if s.contains(CUT_MARK) {
        redact_cut_edges(s, secrets);
    }
}

/// What every note of a cut text contains. Tools bound their output before
/// it is redacted, so a secret can be cut in two; they note the cut as
/// [`CUT_AFTER`] (the text before it is the kept head) or [`CUT_BEFORE`]
/// (the text after it is the kept tail).
pub const CUT_MARK: &str = "...[truncated";

/// Follows a kept head: `"\n...[truncated N bytes]"` (or `chars`).
pub const CUT_AFTER: &str = "\n...[truncated ";

/// Precedes a kept tail (a traceback's last lines).
pub const CUT_BEFORE: &str = "...[truncated]\n";

/// Redact the part of a secret left at each cut of `s` ([`CUT_MARK`]): a
/// head ending in the beginning of a needle, a tail beginning with the end
/// of one, at least [`MIN_REDACTED_LEN`] bytes of it (a shorter part stays:
/// too likely to occur by chance). A character the cut split in two (its
/// `U+FFFD`) goes with the part.
pub fn redact_cut_edges(s: &mut String, secrets: &[String]) {
    let mut cuts: Vec<std::ops::Range<usize>> = Vec::new();
    for (at, _) in s.match_indices(CUT_AFTER) {
        let head = s[..at].trim_end_matches('\u{fffd}');
        let n = part_ending(head, secrets);
        if n > 0 {
            cuts.push(head.len() - n..at);
        }
    }
    for (at, _) in s.match_indices(CUT_BEFORE) {
        let from = at + CUT_BEFORE.len();
        let n = part_beginning(&s[from..], secrets);
        if n > 0 {
            cuts.push(from..from + n);
        }
    }
    cuts.sort_by_key(|r| std::cmp::Reverse(r.start));
    let mut before = usize::MAX;
    for r in cuts {
        if r.end <= before {
            before = r.start;
            s.replace_range(r, REDACTED);
        }
    }
}

/// The length of the longest end of `text` that is a proper beginning of a
/// needle, if at least [`MIN_REDACTED_LEN`] bytes; else 0.
fn part_ending(text: &str, secrets: &[String]) -> usize {
    let mut best = 0;
    for needle in secrets {
        let mut from = text.len().saturating_sub(needle.len().saturating_sub(1));
        while !text.is_char_boundary(from) {
            from += 1;
        }
        // The first (longest) end that begins the needle.
        let found = text[from..]
            .char_indices()
            .map(|(i, _)| &text[from + i..])
            .take_while(|part| part.len() >= MIN_REDACTED_LEN && part.len() > best)
            .find(|part| needle.starts_with(*part));
        if let Some(part) = found {
            best = part.len();
        }
    }
    best
}

/// The length of the longest beginning of `text` that is a proper end of a
/// needle, if at least [`MIN_REDACTED_LEN`] bytes; else 0.
fn part_beginning(text: &str, secrets: &[String]) -> usize {
    let mut best = 0;
    for needle in secrets {
        let longest = text.len().min(needle.len().saturating_sub(1));
        let found = (MIN_REDACTED_LEN.max(best + 1)..=longest)
            .rev()
            .filter(|&n| text.is_char_boundary(n))
            .find(|&n| needle.ends_with(&text[..n]));
        if let Some(n) = found {
            best = n;
        }
    }
    best
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

    /// A PEM-like key with a quote of each kind, a backslash, a control
    /// character, a non-ASCII letter and a tab.
    const KEY: &str = "-----BEGIN KEY-----\nMIIE\"q'\\z\x01é\t\n-----END KEY-----";

    #[test]
    fn escaped_forms_of_a_secret_in_printed_text_are_redacted() {
        let set = redaction_set(&[KEY.to_string(), "it's-a-pin\n".to_string()]);
        // Each form written out as Python 3 prints it.
        for (how, printed) in [
            (
                "print(args) (repr)",
                r#"{'key': '-----BEGIN KEY-----\nMIIE"q\'\\z\x01é\t\n-----END KEY-----'}"#,
            ),
            (
                "json.dumps",
                r#"{"key": "-----BEGIN KEY-----\nMIIE\"q'\\z\u0001\u00e9\t\n-----END KEY-----"}"#,
            ),
            (
                "json.dumps(ensure_ascii=False), serde_json",
                r#"{"key": "-----BEGIN KEY-----\nMIIE\"q'\\z\u0001é\t\n-----END KEY-----"}"#,
            ),
            ("repr in double quotes", r#"{'k': "it's-a-pin\n"}"#),
        ] {
            let mut out = printed.to_string();
            redact_str(&mut out, &set);
            assert!(
                out == "{'key': '[redacted]'}"
                    || out == r#"{"key": "[redacted]"}"#
                    || out == r#"{'k': "[redacted]"}"#,
                "{how}: {out}"
            );
        }
        // The serde_json form is the one an outcome's JSON carries.
        let json = serde_json::to_string(&json!({"key": KEY})).unwrap();
        let mut out = json.clone();
        redact_str(&mut out, &set);
        assert_eq!(out, r#"{"key":"[redacted]"}"#, "{json}");
        // A plain secret has no escaped form of its own.
        assert!(escaped_forms("tok-plain-123").is_empty());
    }

    #[test]
    fn numeric_secrets_are_redacted_as_their_text() {
        let mut values = Vec::new();
        collect_secret_fields(
            "secret",
            &json!({"pin": 12345678, "n": 7, "ratio": 0.5, "acct": 9876.25}),
            &mut values,
        );
        assert_eq!(values.len(), 2, "{values:?}");
        let set = redaction_set(&values);
        let mut v = json!({"out": "pin 12345678, acct 9876.25, 7 rows, ratio 0.5"});
        redact_value(&mut v, &set);
        assert_eq!(
            v["out"],
            "pin [redacted], acct [redacted], 7 rows, ratio 0.5"
        );
    }

    #[test]
    fn a_secret_cut_by_a_bound_on_output_is_redacted_at_the_cut() {
        let secret = "pw-Hunter2-s3cret-77";
        let set = redaction_set(&[secret.to_string()]);
        let redact = |text: &str| {
            let mut s = text.to_string();
            redact_str(&mut s, &set);
            s
        };
        // A kept head (python's stdout, shell's streams, Rust truncation):
        // the beginning of the secret, then the note.
        assert_eq!(
            redact("token=pw-Hunter2-s3\n...[truncated 1200 chars]"),
            "token=[redacted]\n...[truncated 1200 chars]"
        );
        // Split inside a multi-byte character, then decoded lossily.
        let cut = "pw-Hunter2-é-tail";
        let set_e = redaction_set(&[cut.to_string()]);
        let mut s = "x pw-Hunter2-\u{fffd}\n...[truncated 9 bytes]".to_string();
        redact_str(&mut s, &set_e);
        assert_eq!(s, "x [redacted]\n...[truncated 9 bytes]");
        // Its hex form cut the same way.
        let hex_head = &hex::encode(secret)[..20];
        assert_eq!(
            redact(&format!("{hex_head}\n...[truncated 5 bytes]")),
            "[redacted]\n...[truncated 5 bytes]"
        );
        // A kept tail (a traceback's last lines): the end of the secret.
        assert_eq!(
            redact("...[truncated]\nter2-s3cret-77'\nValueError: bad"),
            "...[truncated]\n[redacted]'\nValueError: bad"
        );
        // Under the minimum, and away from a cut, text is left alone.
        for text in [
            "ends in pw-\n...[truncated 3 bytes]",
            "pw-Hunter2 is not cut here",
            "...[truncated]\n-77 rows",
        ] {
            assert_eq!(redact(text), text);
        }
    }

    #[test]
    fn a_keychain_error_is_redacted_with_the_entries_before_it() {
        let set = redaction_set(&["client-S3CRET-1".to_string()]);
        let e = CredentialError::Provider {
            name: "token".into(),
            kind: "oauth2".into(),
            playbook: "p".into(),
            message: "token endpoint https://idp/t/client-S3CRET-1 refused: HTTP 401".into(),
        };
        let shown = redact_error(e, &set).to_string();
        assert!(!shown.contains("S3CRET"), "{shown}");
        assert!(
            shown.contains("https://idp/t/[redacted] refused"),
            "{shown}"
        );
        let missing = redact_error(CredentialError::NotFound { name: "pg".into() }, &set);
        assert!(matches!(missing, CredentialError::NotFound { .. }));
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
