//! `noetl migrate`: a task's `auth` written as a mapping that resolves
//! from Google (NoETL's inline forms) becomes a keychain entry the task
//! names (docs/migrate.md, "Credentials"):
//!
//! - `auth: {source: adc}` (also `gcp`, `workload_identity`: Google's
//!   application default credentials) → `auth: google_adc`, declared as
//!   `kind: google_access_token` (the executor's Google account: the
//!   metadata server on GCE / GKE);
//! - `auth: {ALIAS: {type: bearer, provider: secret_manager, key: K,
//!   oauth_credential: C}}` (GCP Secret Manager's secret `K`, read with the
//!   Google credential `C`, sent as a bearer) → `auth: ALIAS`, declared as
//!   `kind: secret_manager`, `provider: gcp`, `auth: C`, `map: { token: K }`.
//!
//! Other mappings are left as written (the validator says what they
//! need). The values are copied as written (a template rewrite already
//! ran), so a second run changes nothing.

use noetl_core::yaml::{Node, NodeKind};

use crate::edits::{line_start, replace_entry, value_text, Edits};
use crate::walk::tasks;

/// An entry to declare in `keychain` for an inline `auth`.
pub(crate) struct Inline {
    /// The entry's (and the task's new `auth`) name.
    pub(crate) name: String,
    /// Its kind.
    pub(crate) kind: &'static str,
    /// Its other fields, `key: value` as YAML text.
    pub(crate) fields: Vec<String>,
    /// Line of the first task naming it.
    pub(crate) line: usize,
}

/// What an inline `auth` mapping becomes, when it is a form this rewrites.
fn entry_for(text: &str, auth: &Node, task: &str) -> Option<(String, &'static str, Vec<String>)> {
    let scalar = |n: &Node, k: &str| n.get(k).and_then(Node::as_str).map(str::to_ascii_lowercase);
    if matches!(
        scalar(auth, "source").as_deref(),
        Some("adc" | "gcp" | "workload_identity")
    ) {
        if auth.entries().iter().any(|(k, _)| k.name != "source") {
            return None;
        }
        return Some(("google_adc".into(), "google_access_token", Vec::new()));
    }
    // `{ALIAS: {...}}`, or the fields written directly (named after the task).
    let (name, body) = match auth.entries() {
        [(alias, body)] if body.is_map() => (alias.name.clone(), body),
        _ => (format!("{task}_secret"), auth),
    };
    let provider = scalar(body, "provider")?;
    let bearer = matches!(scalar(body, "type").as_deref(), None | Some("bearer"));
    if !matches!(provider.as_str(), "secret_manager" | "gcp" | "google") || !bearer {
        return None;
    }
    let known = ["type", "provider", "key", "oauth_credential"];
    if body
        .entries()
        .iter()
        .any(|(k, _)| !known.contains(&k.name.as_str()))
    {
        return None;
    }
    let field = |k: &str| {
        body.entry(k)
            .filter(|(_, v)| v.as_str().is_some())
            .map(|(key, v)| value_text(text, key.span.offset, v).to_string())
    };
    let key = field("key")?;
    let mut fields = vec!["provider: gcp".to_string()];
    if let Some(c) = field("oauth_credential") {
        fields.push(format!("auth: {c}"));
    }
    fields.push(format!("map: {{ token: {key} }}"));
    Some((name, "secret_manager", fields))
}

/// Rewrite every inline Google `auth` of a task to the name of a keychain
/// entry, and return the entries to declare (one per name; the same name
/// written with other fields, or already declared, is refused).
pub(crate) fn rewrite(root: &Node, e: &mut Edits, declared: &[&str]) -> Vec<Inline> {
    let mut out: Vec<Inline> = Vec::new();
    for (t, task) in tasks(root) {
        let Some((key, auth)) = t.entry("auth") else {
            continue;
        };
        if !matches!(auth.kind, NodeKind::Map(_)) {
            continue;
        }
        let Some((name, kind, fields)) = entry_for(e.text, auth, &task) else {
            continue;
        };
        let line = key.span.line;
        let start = line_start(e.text, key.span.offset);
        if !e.text[start..key.span.offset].trim().is_empty() {
            e.refuse(line, format!("task `{task}`: its inline `auth` is in a flow mapping: declare it in `keychain` as `{name}` (kind {kind}) and write `auth: {name}`"));
            continue;
        }
        if declared.contains(&name.as_str()) {
            e.refuse(line, format!("task `{task}`: its inline `auth` would be declared as `{name}`, which `keychain` already declares: declare it yourself and write `auth: NAME`"));
            continue;
        }
        match out.iter().find(|i| i.name == name) {
            Some(i) if i.kind != kind || i.fields != fields => {
                e.refuse(line, format!("task `{task}`: its inline `auth` `{name}` differs from the one of line {}: declare both in `keychain` under their own names", i.line));
                continue;
            }
            Some(_) => {}
            None => out.push(Inline {
                name: name.clone(),
                kind,
                fields,
                line,
            }),
        }
        let pad = " ".repeat(key.span.offset - start);
        replace_entry(
            e,
            key.span.offset,
            format!("{pad}auth: {name}\n"),
            line,
            format!("task `{task}`: inline `auth` → `auth: {name}`, declared in `keychain` (kind {kind})"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::migrate;

    fn playbook(workflow: &str) -> String {
        format!("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\nworkload:\n  key_path: projects/1/secrets/openai/versions/1\n  cred: google_oauth\n{workflow}")
    }

    fn http(auth: &str) -> String {
        format!("      - name: call\n        kind: http\n        url: https://api.example/v1\n        auth:\n{auth}")
    }

    #[test]
    fn an_inline_gcp_secret_becomes_a_secret_manager_entry_named_by_its_alias() {
        let auth = "          openai:\n            type: bearer\n            provider: secret_manager\n            key: '{{ workload.key_path }}'\n            oauth_credential: '{{ workload.cred }}'\n";
        let src = playbook(&format!(
            "workflow:\n  - step: start\n    tool:\n{}    next: {{ arcs: [ {{ step: again }} ] }}\n  - step: again\n    tool:\n{}",
            http(auth),
            http(auth)
        ));
        let m = migrate(&src).unwrap();
        assert!(
            m.text.contains("keychain:\n  - name: openai\n    kind: secret_manager\n    provider: gcp\n    auth: '{{ workload.cred }}'\n    map: { token: '{{ workload.key_path }}' }\nworkflow:\n"),
            "{}",
            m.text
        );
        assert_eq!(
            m.text.matches("        auth: openai\n").count(),
            2,
            "{}",
            m.text
        );
        assert_eq!(m.text.matches("- name: openai").count(), 1, "declared once");
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
        assert!(
            m.report()[0].1.contains(
                "inline `auth` → `auth: openai`, declared in `keychain` (kind secret_manager)"
            ),
            "{:?}",
            m.report()
        );
        noetl_core::load::load_playbook(&m.text, "t.yaml").expect("loads");
        assert_eq!(
            migrate(&m.text).unwrap().text,
            m.text,
            "a second run changes nothing"
        );
    }

    #[test]
    fn application_default_credentials_become_a_google_access_token_entry() {
        let src = playbook(&format!(
            "keychain:\n  - name: pg\n    kind: postgres_credential\nworkflow:\n  - step: start\n    tool:\n{}",
            http("          source: adc\n")
        ));
        let m = migrate(&src).unwrap();
        assert!(
            m.text.contains("  - name: pg\n    kind: postgres_credential\n  - name: google_adc\n    kind: google_access_token\nworkflow:"),
            "{}",
            m.text
        );
        assert!(m.text.contains("        auth: google_adc\n"), "{}", m.text);
        noetl_core::load::load_playbook(&m.text, "t.yaml").expect("loads");
        assert_eq!(migrate(&m.text).unwrap().text, m.text);
    }

    #[test]
    fn other_inline_auths_are_left_and_conflicts_refused() {
        // Not a form this rewrites: left for the validator to refuse.
        let src = playbook(&format!(
            "workflow:\n  - step: start\n    tool:\n{}",
            http("          provider: secret_manager\n          key: x\n          region: us\n")
        ));
        let m = migrate(&src).unwrap();
        assert!(
            m.text.contains("          region: us\n") && !m.text.contains("keychain:"),
            "{}",
            m.text
        );
        // The same alias with another secret: refused, the second left.
        let a = "          openai:\n            provider: secret_manager\n            key: a\n";
        let b = "          openai:\n            provider: secret_manager\n            key: b\n";
        let src = playbook(&format!(
            "workflow:\n  - step: start\n    tool:\n{}    next: {{ arcs: [ {{ step: again }} ] }}\n  - step: again\n    tool:\n{}",
            http(a),
            http(b)
        ));
        let m = migrate(&src).unwrap();
        assert_eq!(m.refusals.len(), 1, "{:?}", m.refusals);
        assert!(
            m.refusals[0].why.contains("differs from the one of line"),
            "{:?}",
            m.refusals
        );
        assert!(m.text.contains("            key: b\n"), "{}", m.text);
    }
}
