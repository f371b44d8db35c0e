//! Keychain kinds resolved from a service (docs/dsl.md "Keychain"):
//! `secret_manager` with `provider: aws` and `oauth2` load; another
//! provider, or an entry missing what it needs, is refused naming it.

use noetl_core::diagnostic::Diagnostic;
use noetl_core::load::load_playbook;

fn diags(keychain: &str) -> Vec<Diagnostic> {
    let src = format!(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\nkeychain:\n{keychain}workflow:\n  - step: start\n"
    );
    match load_playbook(&src, "t.yaml") {
        Ok(l) => l.warnings.0,
        Err(e) => e.diagnostics.0,
    }
}

#[test]
fn the_seed_keychain_with_aws_secrets_manager_and_oauth2_loads() {
    let k = r#"  - name: openai_token
    kind: secret_manager
    provider: aws
    auth: aws_main
    map: { token: prod/openai }
  - name: api
    kind: oauth2
    endpoint: "https://auth.example/token"
    scope: local
    auto_renew: true
    data: { grant_type: client_credentials, client_id: a, client_secret: "{{ keychain.openai_token.token }}" }
  - name: pg_k8s
    kind: postgres_credential
"#;
    assert_eq!(diags(k), vec![]);
}

#[test]
fn other_providers_are_refused_by_name_at_their_line() {
    for (provider, service) in [
        ("gcp", "GCP Secret Manager"),
        ("azure", "Azure Key Vault"),
        ("vault", "HashiCorp Vault"),
    ] {
        let k = format!("  - name: s\n    kind: secret_manager\n    provider: {provider}\n    map: {{ a: b }}\n");
        let d = diags(&k);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].code, "E004");
        assert_eq!(d[0].span.map(|s| s.line), Some(8));
        assert!(
            d[0].message
                .contains(&format!("provider `{provider}` ({service})"))
                && d[0].message.contains("AWS Secrets Manager only"),
            "{}",
            d[0].message
        );
    }
}

#[test]
fn what_an_entry_needs_is_named() {
    let d = diags("  - name: s\n    kind: secret_manager\n    map: { a: b }\n");
    assert!(
        d.iter()
            .any(|d| d.code == "E003" && d.message.contains("has no `provider`")),
        "{d:#?}"
    );
    let d = diags("  - name: s\n    kind: secret_manager\n    provider: aws\n");
    assert!(
        d.iter()
            .any(|d| d.code == "E003" && d.message.contains("has no `map`")),
        "{d:#?}"
    );
    let d = diags("  - name: t\n    kind: oauth2\n    data: [a]\n");
    assert!(
        d.iter()
            .any(|d| d.code == "E003" && d.message.contains("(oauth2) has no `endpoint`")),
        "{d:#?}"
    );
    assert!(
        d.iter().any(|d| d.code == "E004"
            && d.message
                .contains("`data` of keychain entry `t` must be a mapping")),
        "{d:#?}"
    );
}

#[test]
fn kinds_no_service_here_resolves_stay_refused() {
    for kind in ["secrets", "google_id_token"] {
        let d = diags(&format!("  - name: s\n    kind: {kind}\n"));
        assert!(
            d.iter().any(|d| d.code == "E004"
                && d.message
                    .contains(&format!("keychain kind `{kind}` is not available here"))),
            "{kind}: {d:#?}"
        );
    }
}
