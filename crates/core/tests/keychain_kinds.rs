//! Keychain kinds resolved when used (docs/dsl.md "Keychain"):
//! `secret_manager` with `provider: aws` or `gcp`, `oauth2`, `static` and
//! `google_id_token` load; another provider or kind, or an entry missing
//! what it needs, is refused naming it.

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
        ("google", "GCP Secret Manager (write `provider: gcp`)"),
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
                && d[0]
                    .message
                    .contains("AWS Secrets Manager and GCP Secret Manager only"),
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
fn gcp_secret_manager_static_and_google_id_token_entries_load() {
    let k = r#"  - name: gcp_secret
    kind: secret_manager
    provider: gcp
    auth: "{{ workload.gcp_auth }}"
    map: { api_key: projects/1/secrets/openai/versions/latest }
  - name: amadeus_credentials
    kind: static
    scope: global
    map:
      client_id: "{{ workload.client_id }}"
      client_secret: "{{ keychain.gcp_secret.api_key }}"
  - name: from_secret
    kind: google_id_token
    auto_renew: true
    auth: google_oauth
    service_account_secret: projects/1/secrets/sa/versions/latest
    target_audience: https://svc.a.run.app
  - name: from_credential
    kind: google_id_token
    service_account_credential: invoker_sa
    target_audience: https://svc.a.run.app
  - name: from_metadata
    kind: google_id_token
    target_audience: https://svc.a.run.app
"#;
    assert_eq!(diags(k), vec![]);
}

#[test]
fn static_and_google_id_token_entries_name_what_they_lack() {
    let d = diags("  - name: s\n    kind: static\n");
    assert!(
        d.iter()
            .any(|d| d.code == "E003" && d.message.contains("`s` (static) has no `map`")),
        "{d:#?}"
    );
    let d = diags("  - name: s\n    kind: static\n    map: [a]\n");
    assert!(
        d.iter()
            .any(|d| d.code == "E004" && d.message.contains("`map` of keychain entry `s`")),
        "{d:#?}"
    );
    let d = diags("  - name: t\n    kind: google_id_token\n");
    assert!(
        d.iter().any(|d| d.code == "E003"
            && d.message
                .contains("`t` (google_id_token) has no `target_audience`")),
        "{d:#?}"
    );
    let d = diags("  - name: t\n    kind: google_id_token\n    target_audience: https://a\n    service_account_secret: projects/1/secrets/s\n    service_account_credential: sa\n");
    assert!(
        d.iter().any(|d| d.code == "E004"
            && d.message
                .contains("names both `service_account_secret` and `service_account_credential`")),
        "{d:#?}"
    );
}

#[test]
fn kinds_no_service_here_resolves_stay_refused() {
    let d = diags("  - name: s\n    kind: secrets\n");
    assert!(
        d.iter().any(|d| d.code == "E004"
            && d.message
                .contains("keychain kind `secrets` is not available here")),
        "{d:#?}"
    );
    for kind in ["google_oauth", "azure_key"] {
        let d = diags(&format!("  - name: s\n    kind: {kind}\n"));
        assert!(
            d.iter().any(|d| d.code == "E004"
                && d.message
                    .contains(&format!("unknown keychain kind `{kind}`"))),
            "{kind}: {d:#?}"
        );
    }
}

#[test]
fn a_google_access_token_entry_loads_and_its_scopes_are_checked() {
    let ok = "  - name: google_adc\n    kind: google_access_token\n  - name: ro\n    kind: google_access_token\n    auth: gcp_sa\n    scopes: [https://www.googleapis.com/auth/devstorage.read_only]\n";
    assert_eq!(diags(ok), vec![]);
    let d = diags("  - name: g\n    kind: google_access_token\n    scopes: { a: b }\n");
    assert!(
        d.iter().any(|d| d.code == "E004"
            && d.message
                .contains("`scopes` of keychain entry `g` must be a scope or a list")),
        "{d:#?}"
    );
}
