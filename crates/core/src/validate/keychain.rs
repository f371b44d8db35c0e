//! Checks of the keychain kinds resolved without a stored credential of
//! their own name (docs/dsl.md "Keychain"): `static` (the values written in
//! `map`), `google_id_token` (a Google ID token minted for
//! `target_audience`) and `google_access_token` (an access token for
//! Google's APIs); `secret_manager` and `oauth2` are checked in `seeds`.

use super::Validator;
use crate::codes::Code;
use crate::yaml::Node;

/// The fields of a service-resolved keychain entry of kind `kind` that
/// name a stored credential (each must be stored before the execution
/// starts): `auth` (the credential that reaches the service) and, for
/// `google_id_token`, `service_account_credential` (the service account
/// key). `static` names none.
pub fn credential_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "static" => &[],
        "google_id_token" => &["auth", "service_account_credential"],
        _ => &["auth"],
    }
}

impl Validator {
    /// A `static` entry has a non-empty `map` of field → value (a value
    /// may be a template over `workload` and the entries before it).
    pub(super) fn static_entry(&mut self, entry: &Node, path: &str, name: &str) {
        match entry.get("map") {
            None => self.err(
                Code::E003,
                entry.span,
                path,
                format!("keychain entry `{name}` (static) has no `map`"),
                "add `map: { <field>: <value> }`: `{{ keychain.<name>.<field> }}` reads each value",
            ),
            Some(m) if !m.is_map() || m.entries().is_empty() => self.err(
                Code::E004,
                m.span,
                &format!("{path}/map"),
                format!(
                    "`map` of keychain entry `{name}` must be a non-empty mapping of field → value"
                ),
                "e.g. `map: { client_id: \"{{ workload.client_id }}\" }`",
            ),
            Some(_) => {}
        }
    }

    /// A `google_id_token` entry names its `target_audience` and at most
    /// one service account: `service_account_secret` (a GCP Secret
    /// Manager secret holding its key, read with `auth`) or
    /// `service_account_credential` (a stored credential holding it);
    /// with neither the token is the metadata server's default account's.
    pub(super) fn google_id_token_entry(&mut self, entry: &Node, path: &str, name: &str) {
        if entry.get("target_audience").is_none() {
            self.err(
                Code::E003,
                entry.span,
                path,
                format!("keychain entry `{name}` (google_id_token) has no `target_audience`"),
                "add `target_audience:` the URL of the service the token is for (the token's `aud`)",
            );
        }
        if let (Some(_), Some(c)) = (
            entry.get("service_account_secret"),
            entry.get("service_account_credential"),
        ) {
            self.err(
                Code::E004,
                c.span,
                &format!("{path}/service_account_credential"),
                format!("keychain entry `{name}` (google_id_token) names both `service_account_secret` and `service_account_credential`"),
                "keep one: `service_account_secret` (a Secret Manager secret holding the key) or `service_account_credential` (a stored credential holding it)",
            );
        }
    }

    /// A `google_access_token` entry's `scopes`, when given, is a scope or
    /// a list of scopes (default: `cloud-platform`).
    pub(super) fn google_access_token_entry(&mut self, entry: &Node, path: &str, name: &str) {
        let Some(v) = entry.get("scopes") else {
            return;
        };
        let ok =
            v.as_str().is_some() || (v.is_seq() && v.items().iter().all(|i| i.as_str().is_some()));
        if !ok {
            self.err(
                Code::E004,
                v.span,
                &format!("{path}/scopes"),
                format!("`scopes` of keychain entry `{name}` must be a scope or a list of scopes, found {}", v.type_name()),
                "e.g. `scopes: [https://www.googleapis.com/auth/cloud-platform]`",
            );
        }
    }
}
