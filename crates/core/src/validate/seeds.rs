//! Checks of settings the seed documents name (docs/dsl.md): keychain
//! kinds, `executor.spec.policy`, `executor.spec.limits`,
//! `loop.spec.policy.exec` and task policy `on_unmatched`. None of them is
//! silently ignored: each either takes effect or is refused with the reason.

use super::{allowed_list, closest, Validator};
use crate::codes::Code;
use crate::yaml::{escape, Node};

/// Credential kinds the keychain resolves (`noetl credential put --kind`).
pub const CREDENTIAL_KINDS: &[&str] = &[
    "postgres_credential",
    "bearer",
    "basic",
    "api_key",
    "secret",
];

/// Keychain kinds resolved when an execution uses them rather than read
/// from the store (docs/dsl.md "Keychain"): `secret_manager` with
/// `provider: aws` (AWS Secrets Manager) or `gcp` (GCP Secret Manager),
/// `oauth2` (a client-credentials token), `static` (the values written in
/// `map`), `google_id_token` (a Google ID token for `target_audience`) and
/// `google_access_token` (an access token for Google's APIs).
pub const SERVICE_KEYCHAIN_KINDS: &[&str] = &[
    "secret_manager",
    "oauth2",
    "static",
    "google_id_token",
    "google_access_token",
];

/// The `provider`s of a `secret_manager` entry this engine reaches.
pub const SECRET_PROVIDERS_REACHED: &[&str] = &["aws", "gcp"];

/// The `provider`s of a `secret_manager` entry this engine does not reach,
/// and the service each names (refused by name).
const SECRET_PROVIDERS: &[(&str, &str)] = &[
    ("google", "GCP Secret Manager (write `provider: gcp`)"),
    ("azure", "Azure Key Vault"),
    ("vault", "HashiCorp Vault"),
    ("k8s", "Kubernetes secrets"),
];

/// Keychain kinds that resolve from a cloud service, with what they need.
const CLOUD_KEYCHAIN_KINDS: &[(&str, &str)] = &[(
    "secrets",
    "a cloud secret manager (GCP Secret Manager, AWS Secrets Manager, Azure Key Vault)",
)];

/// `executor.spec.limits` keys (docs/architecture.md "Limits").
const LIMIT_KEYS: &[&str] = &["max_payload_bytes", "max_loop_items", "timeout_s"];

/// `executor.spec.policy` keys that remain after normalisation moved
/// `limits.*` and `defaults.timeouts` to their plain spelling.
const EXECUTOR_POLICY_KEYS: &[&str] = &["limits", "defaults", "results", "concurrency"];

/// `loop.spec.policy.exec` values: an intent only.
const LOOP_EXEC: &[&str] = &["distributed", "local"];

/// Task policy `on_unmatched` values.
pub const ON_UNMATCHED: &[&str] = &["continue", "fail"];

/// The cloud service an `auth` written as a mapping resolves from, when it
/// names one: NoETL's inline forms (`{source: adc}`, `{provider:
/// secret_manager, ...}`, a DuckDB `{gcs: {...}}` secret).
pub(super) fn cloud_auth(auth: &serde_json::Value) -> Option<&'static str> {
    let obj = auth.as_object()?;
    let text = |k: &str| obj.get(k).and_then(serde_json::Value::as_str).unwrap_or("");
    let lower = |s: &str| s.to_ascii_lowercase();
    if matches!(
        lower(text("source")).as_str(),
        "adc" | "gcp" | "workload_identity"
    ) {
        return Some("Google Application Default Credentials (a GCP service account)");
    }
    if !text("provider").is_empty() || lower(text("source")) == "secret_manager" {
        return Some(
            "a cloud secret manager (GCP Secret Manager, AWS Secrets Manager, Azure Key Vault)",
        );
    }
    let service = lower(text("service"));
    let kind = lower(text("type"));
    let scope = lower(text("scope"));
    if service.starts_with("gcs")
        || kind.starts_with("gcs")
        || kind == "gcp"
        || scope.starts_with("gs://")
    {
        return Some("Google Cloud Storage");
    }
    if service.starts_with("s3")
        || kind.starts_with("s3")
        || kind == "aws"
        || scope.starts_with("s3://")
    {
        return Some("Amazon S3");
    }
    if lower(text("tool")) == "hmac" {
        return Some("cloud storage (GCS or S3 HMAC keys)");
    }
    // A mapping of named secrets (DuckDB's `auth: {pg_db: {...}, gcs_secret: {...}}`).
    obj.iter().find_map(|(k, v)| {
        let k = lower(k);
        if k.starts_with("gcs") || k == "gcp" {
            Some("Google Cloud Storage")
        } else if k.starts_with("s3") || k == "aws" {
            Some("Amazon S3")
        } else {
            v.is_object().then(|| cloud_auth(v)).flatten()
        }
    })
}

impl Validator {
    /// A keychain entry's `kind` must be one the keychain resolves (E004);
    /// a kind that needs a cloud service says which.
    pub(super) fn keychain_kind(&mut self, entry: &Node, path: &str) {
        let Some(k) = entry.get("kind") else {
            return;
        };
        let Some(kind) = k.as_str().filter(|s| !s.is_empty()) else {
            return; // required_str reports it
        };
        if CREDENTIAL_KINDS.contains(&kind) {
            return;
        }
        if SERVICE_KEYCHAIN_KINDS.contains(&kind) {
            self.service_entry(entry, path, kind);
            return;
        }
        let kinds = allowed_list(CREDENTIAL_KINDS);
        let (message, help) = match CLOUD_KEYCHAIN_KINDS.iter().find(|(n, _)| *n == kind) {
            Some((_, needs)) => (
                format!("keychain kind `{kind}` is not available here: it resolves from {needs}, which this engine does not reach"),
                format!("store the value with `noetl credential put <name> --kind secret --from-file value.json` and declare `kind: secret` (keychain kinds: {kinds})"),
            ),
            None => (
                format!("unknown keychain kind `{kind}`"),
                match closest(kind, CREDENTIAL_KINDS) {
                    Some(c) => format!("did you mean `{c}`? keychain kinds: {kinds}"),
                    None => format!("keychain kinds: {kinds}"),
                },
            ),
        };
        self.err(Code::E004, k.span, &format!("{path}/kind"), message, &help);
    }

    /// A `secret_manager` entry names `provider: aws` or `gcp` (another
    /// provider is refused naming its service) and a `map`; an `oauth2`
    /// entry an `endpoint`; a `static` entry a `map`; a `google_id_token`
    /// entry a `target_audience` and at most one service account. Other
    /// fields are accepted, as on every entry (NoETL's `scope`,
    /// `auto_renew`... take no effect here).
    fn service_entry(&mut self, entry: &Node, path: &str, kind: &str) {
        let name = entry.get("name").and_then(Node::as_str).unwrap_or("?");
        match kind {
            "static" => return self.static_entry(entry, path, name),
            "google_id_token" => return self.google_id_token_entry(entry, path, name),
            "google_access_token" => return self.google_access_token_entry(entry, path, name),
            _ => {}
        }
        if kind == "oauth2" {
            if entry.get("endpoint").is_none() {
                self.err(Code::E003, entry.span, path, format!("keychain entry `{name}` (oauth2) has no `endpoint`"), "add `endpoint:` the token URL; `data:` holds the form (`grant_type: client_credentials`, `client_id`, `client_secret`, `scope`)");
            }
            for key in ["data", "headers"] {
                if let Some(v) = entry.get(key).filter(|v| !v.is_map()) {
                    self.err(Code::E004, v.span, &format!("{path}/{key}"), format!("`{key}` of keychain entry `{name}` must be a mapping, found {}", v.type_name()), "e.g. `data: { grant_type: client_credentials, client_id: ..., client_secret: ... }`");
                }
            }
            return;
        }
        match entry.get("provider") {
            None => self.err(
                Code::E003,
                entry.span,
                path,
                format!("keychain entry `{name}` (secret_manager) has no `provider`"),
                "add `provider: aws` (AWS Secrets Manager) or `provider: gcp` (GCP Secret Manager)",
            ),
            Some(p) => match p.as_str() {
                Some(reached) if SECRET_PROVIDERS_REACHED.contains(&reached) => {}
                Some(other) => {
                    let service = SECRET_PROVIDERS
                        .iter()
                        .find(|(n, _)| *n == other)
                        .map(|(_, s)| *s);
                    let message = match service {
                        Some(s) => format!("keychain entry `{name}`: provider `{other}` ({s}) is not available here: this engine reaches AWS Secrets Manager and GCP Secret Manager only"),
                        None => format!("keychain entry `{name}`: unknown provider `{other}`"),
                    };
                    self.err(Code::E004, p.span, &format!("{path}/provider"), message, "use `provider: aws` or `provider: gcp`, or store the value with `noetl credential put <name> --kind secret` and declare `kind: secret`");
                }
                None => self.err(
                    Code::E004,
                    p.span,
                    &format!("{path}/provider"),
                    format!("`provider` of keychain entry `{name}` must be a string"),
                    "`provider: aws` or `provider: gcp`",
                ),
            },
        }
        match entry.get("map") {
            None => self.err(Code::E003, entry.span, path, format!("keychain entry `{name}` (secret_manager) has no `map`"), "add `map: { <field>: <secret id> }`: each field reads the value of that secret"),
            Some(m) if !m.is_map() || m.entries().is_empty() => self.err(Code::E004, m.span, &format!("{path}/map"), format!("`map` of keychain entry `{name}` must be a non-empty mapping of field → secret id"), "e.g. `map: { token: prod/openai }` (AWS) or `map: { token: projects/P/secrets/S/versions/latest }` (GCP)"),
            Some(_) => {}
        }
    }

    /// `executor.spec.limits` names known limits; `executor.spec.policy`
    /// holds only what takes effect: `limits` and `defaults.timeouts`
    /// (moved to their plain spelling when loading) and
    /// `results.reference_first: true`.
    pub(super) fn executor_spec(&mut self, spec: &Node) {
        if let Some(limits) = spec.get("limits") {
            if self.expect_map(limits, "/executor/spec/limits", "`executor.spec.limits`") {
                self.unknown_keys(
                    limits,
                    "/executor/spec/limits",
                    "`executor.spec.limits`",
                    LIMIT_KEYS,
                );
                for key in ["max_payload_bytes", "max_loop_items"] {
                    if let Some(n) = limits.get(key) {
                        if !matches!(n.to_json().as_u64(), Some(v) if v >= 1) {
                            self.err(
                                Code::E004,
                                n.span,
                                &format!("/executor/spec/limits/{key}"),
                                format!("`executor.spec.limits.{key}` must be an integer >= 1, found {}", n.type_name()),
                                "e.g. `max_payload_bytes: 65536`",
                            );
                        }
                    }
                }
            }
        }
        let Some(policy) = spec.get("policy") else {
            return;
        };
        let pp = "/executor/spec/policy";
        if !self.expect_map(policy, pp, "`executor.spec.policy`") {
            return;
        }
        self.unknown_keys(policy, pp, "`executor.spec.policy`", EXECUTOR_POLICY_KEYS);
        if let Some(c) = policy.get("concurrency") {
            let cp = format!("{pp}/concurrency");
            self.concurrency(c, &cp, super::gates::Level::Execution);
        }
        if let Some(l) = policy.get("limits") {
            // Normalisation moved every limit; what is left is the wrong shape.
            self.expect_map(l, &format!("{pp}/limits"), "`executor.spec.policy.limits`");
        }
        if let Some(d) = policy.get("defaults") {
            if self.expect_map(
                d,
                &format!("{pp}/defaults"),
                "`executor.spec.policy.defaults`",
            ) {
                for (k, _) in d.entries() {
                    let (message, help) = if k.name == "resources" {
                        (
                            "`executor.spec.policy.defaults.resources` is not available: executors are sized by their deployment, not per playbook".to_string(),
                            "remove it; set CPU and memory on the executor Deployment (charts/noetl) or `noetl serve executor --concurrency`",
                        )
                    } else {
                        (
                            format!("unknown field `{}` in `executor.spec.policy.defaults`", k.name),
                            "`defaults.timeouts` (the default task timeout) is the one default here",
                        )
                    };
                    self.err(
                        Code::E005,
                        k.span,
                        &format!("{pp}/defaults/{}", escape(&k.name)),
                        message,
                        help,
                    );
                }
            }
        }
        if let Some(r) = policy.get("results") {
            let rp = format!("{pp}/results");
            if self.expect_map(r, &rp, "`executor.spec.policy.results`") {
                let what = "`executor.spec.policy.results`";
                self.unknown_keys(r, &rp, what, &["reference_first"]);
                if let Some(v) = r.get("reference_first") {
                    if v.to_json() != serde_json::Value::Bool(true) {
                        self.err(
                            Code::E004,
                            v.span,
                            &format!("{rp}/reference_first"),
                            "`results.reference_first` must be `true`: results above `executor.spec.limits.max_payload_bytes` always travel by reference".into(),
                            "remove it (reference-first is how results travel), or raise `max_payload_bytes`",
                        );
                    }
                }
            }
        }
    }

    /// `loop.spec.policy.exec` is an intent: `distributed` or `local`.
    pub(super) fn loop_exec(&mut self, spec: &Node, path: &str) {
        let Some(exec) = spec.get("policy").and_then(|p| p.get("exec")) else {
            return;
        };
        if !exec.as_str().is_some_and(|s| LOOP_EXEC.contains(&s)) {
            self.err(
                Code::E004,
                exec.span,
                &format!("{path}/spec/policy/exec"),
                format!(
                    "`loop.spec.policy.exec` must be one of {}",
                    allowed_list(LOOP_EXEC)
                ),
                "an intent only: iterations are dispatched through the work queue either way",
            );
        }
    }

    /// Task policy `on_unmatched`: what happens when no rule matches and
    /// there is no `else` (`continue`, the default, or `fail`).
    pub(super) fn on_unmatched(&mut self, policy: &Node, path: &str, task: &str) {
        let Some(v) = policy.get("on_unmatched") else {
            return;
        };
        if !v.as_str().is_some_and(|s| ON_UNMATCHED.contains(&s)) {
            let shown = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.type_name().to_string());
            self.err(
                Code::E004,
                v.span,
                &format!("{path}/on_unmatched"),
                format!(
                    "`on_unmatched: {shown}` in task `{task}`: it must be one of {}",
                    allowed_list(ON_UNMATCHED)
                ),
                "`continue` (the default) goes on to the next task; `fail` fails the step-run",
            );
        }
    }
}
