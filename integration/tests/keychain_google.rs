//! Keychain entries resolved from Google (docs/dsl.md "Keychain"):
//! `secret_manager` with `provider: gcp`, `google_id_token` (a service
//! account key from Secret Manager, from a stored credential, or the
//! metadata server's default account) and `static` values, against a
//! server this test runs that answers as GCP Secret Manager, Google's token
//! endpoint and the GCE metadata server do, and checks what it is sent:
//! `Metadata-Flavor: Google`, the bearer token, the audience, the JWT's
//! RS256 signature. Each entry is resolved once per execution, its value
//! reaches the tasks, and no value reaches events, KV or error messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use noetl_integration::Cluster;
use noetl_mesh::{credentials::Credential, state::ExecStatus};
use serde_json::{json, Value};

const OPENAI_KEY: &str = "sk-Gcp-Secret-71234";
const META_ACCESS: &str = "ya29.Meta-Access-Token-52345";
const SA_ACCESS: &str = "ya29.Sa-Access-Token-63456";
const CLIENT_ID: &str = "client-Id-Static-84567";
const AUDIENCE: &str = "https://svc-abc.a.run.app";

/// An ID token as Google shapes one: a JWT whose payload says who and
/// for whom (the test does not sign it: the client never checks it).
fn id_token(who: &str, aud: &str) -> String {
    let payload = json!({"iss": "https://accounts.google.com", "email": who, "aud": aud, "exp": 4_000_000_000u64});
    format!(
        "eyJhbGciOiJSUzI1NiJ9.{}.c2lnLW9mLXt3aG99LXRlc3Q",
        URL_SAFE_NO_PAD.encode(payload.to_string())
    )
}

/// What the fake Google saw.
#[derive(Clone, Default)]
struct Google {
    /// Requests by kind (`metadata-token`, `metadata-identity`, `jwt-id`,
    /// `jwt-access`, `secret`).
    calls: Arc<Mutex<HashMap<String, usize>>>,
    /// The public key (PKCS#1 DER) of the service account's key.
    public_key: Arc<Vec<u8>>,
    /// The service account key Secret Manager holds.
    sa_json: Arc<String>,
}

impl Google {
    fn count(&self, k: &str) {
        *self.calls.lock().unwrap().entry(k.into()).or_default() += 1;
    }
    fn calls(&self, k: &str) -> usize {
        self.calls.lock().unwrap().get(k).copied().unwrap_or(0)
    }
}

fn refused(status: StatusCode, code: &str) -> Response {
    (status, Json(json!({"error": {"code": status.as_u16(), "message": format!("echo {OPENAI_KEY}"), "status": code}}))).into_response()
}

async fn metadata_token(State(g): State<Google>, headers: HeaderMap) -> Response {
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return (
            StatusCode::FORBIDDEN,
            "Missing Metadata-Flavor:Google header",
        )
            .into_response();
    }
    g.count("metadata-token");
    Json(json!({"access_token": META_ACCESS, "expires_in": 3599, "token_type": "Bearer"}))
        .into_response()
}

async fn metadata_identity(
    State(g): State<Google>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return (
            StatusCode::FORBIDDEN,
            "Missing Metadata-Flavor:Google header",
        )
            .into_response();
    }
    if q.get("format").map(String::as_str) != Some("full") {
        return (StatusCode::BAD_REQUEST, "format").into_response();
    }
    g.count("metadata-identity");
    id_token("default@p.iam.gserviceaccount.com", &q["audience"]).into_response()
}

/// Google's token endpoint: a JWT signed with the account's key, for an
/// access token (`scope`) or an ID token (`target_audience`).
async fn token(State(g): State<Google>, Form(form): Form<HashMap<String, String>>) -> Response {
    if form.get("grant_type").map(String::as_str)
        != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "unsupported_grant_type"})),
        )
            .into_response();
    }
    let jwt = form.get("assertion").cloned().unwrap_or_default();
    let parts: Vec<&str> = jwt.split('.').collect();
    let verified = parts.len() == 3
        && ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            g.public_key.as_slice(),
        )
        .verify(
            format!("{}.{}", parts[0], parts[1]).as_bytes(),
            &URL_SAFE_NO_PAD.decode(parts[2]).unwrap_or_default(),
        )
        .is_ok();
    if !verified {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_grant"})),
        )
            .into_response();
    }
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    assert_eq!(
        claims["iss"], "invoker@p.iam.gserviceaccount.com",
        "{claims}"
    );
    match (claims["target_audience"].as_str(), claims["scope"].as_str()) {
        (Some(aud), None) => {
            g.count("jwt-id");
            Json(json!({"id_token": id_token("invoker@p.iam.gserviceaccount.com", aud)}))
                .into_response()
        }
        (None, Some(_)) => {
            g.count("jwt-access");
            Json(json!({"access_token": SA_ACCESS, "expires_in": 3600, "token_type": "Bearer"}))
                .into_response()
        }
        _ => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_scope"})),
        )
            .into_response(),
    }
}

/// Secret Manager's `GET /v1/projects/P/secrets/S/versions/V:access`.
async fn secret(State(g): State<Google>, uri: Uri, headers: HeaderMap) -> Response {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if bearer != format!("Bearer {META_ACCESS}") && bearer != format!("Bearer {SA_ACCESS}") {
        return refused(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
    }
    let payload = match uri.path() {
        "/v1/projects/p/secrets/openai/versions/1:access" => OPENAI_KEY.to_string(),
        "/v1/projects/p/secrets/invoker/versions/latest:access" => g.sa_json.to_string(),
        _ => return refused(StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
    };
    g.count("secret");
    Json(json!({"name": uri.path(), "payload": {"data": STANDARD.encode(payload)}})).into_response()
}

/// The service the ID token is for: whether the bearer is one for it.
async fn api(headers: HeaderMap) -> Json<Value> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let aud = bearer
        .split('.')
        .nth(1)
        .and_then(|p| URL_SAFE_NO_PAD.decode(p).ok())
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .map(|c| (c["aud"].clone(), c["email"].clone()));
    let known = match bearer {
        META_ACCESS => "metadata access token",
        OPENAI_KEY => "openai secret",
        _ => "other",
    };
    Json(
        json!({"for_me": aud.as_ref().map(|(a, _)| a == AUDIENCE), "who": aud.map(|(_, w)| w), "bearer": known}),
    )
}

/// A 2048-bit RSA key in PKCS#8 PEM, made by openssl for this run.
fn rsa_key() -> String {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn start_google() -> (String, Google, Value) {
    let pem = rsa_key();
    let der: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let pair = ring::signature::RsaKeyPair::from_pkcs8(&STANDARD.decode(der).unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sa = json!({"type": "service_account", "project_id": "p", "private_key_id": "k1",
                    "private_key": pem, "client_email": "invoker@p.iam.gserviceaccount.com",
                    "token_uri": format!("http://{addr}/token")});
    let g = Google {
        public_key: Arc::new(
            ring::signature::KeyPair::public_key(&pair)
                .as_ref()
                .to_vec(),
        ),
        sa_json: Arc::new(sa.to_string()),
        ..Google::default()
    };
    let app = Router::new()
        .route(
            "/computeMetadata/v1/instance/service-accounts/default/token",
            get(metadata_token),
        )
        .route(
            "/computeMetadata/v1/instance/service-accounts/default/identity",
            get(metadata_identity),
        )
        .route("/token", post(token))
        .route("/api", get(api))
        .fallback(secret)
        .with_state(g.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr.to_string(), g, sa)
}

const PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: keychain_google }
workload: { api: "", audience: "", client_id: "" }
keychain:
  - name: openai
    kind: secret_manager
    provider: gcp
    auth: gcp_meta
    map: { api_key: projects/p/secrets/openai/versions/1 }
  - name: creds
    kind: static
    map:
      client_id: "{{ workload.client_id }}"
      client_secret: "{{ keychain.openai.api_key }}"
  - name: from_secret
    kind: google_id_token
    auto_renew: true
    auth: gcp_meta
    service_account_secret: projects/p/secrets/invoker
    target_audience: "{{ workload.audience }}"
  - name: from_credential
    kind: google_id_token
    service_account_credential: invoker_sa
    target_audience: "{{ workload.audience }}"
  - name: from_metadata
    kind: google_id_token
    auth: gcp_meta
    target_audience: "{{ workload.audience }}"
workflow:
  - step: start
    tool:
      - name: use
        kind: python
        args: { key: "{{ keychain.openai.api_key }}", id: "{{ keychain.creds.client_id }}", secret: "{{ keychain.creds.client_secret }}" }
        code: "result = {'key': len(key), 'same': key == secret, 'id': len(id), 'echo': 'seen ' + key + ' ' + id}"
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { start: "{{ outcome.result }}" } } } } ] } }
    next: { arcs: [ { step: call } ] }
  - step: call
    tool:
      - name: by_auth
        kind: http
        url: "{{ workload.api }}/api"
        auth: from_secret
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { secret_sa: "{{ outcome.result.data }}" } } } } ] } }
      - name: by_header
        kind: http
        url: "{{ workload.api }}/api"
        headers: { Authorization: "Bearer {{ keychain.from_credential.id_token }}" }
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { credential_sa: "{{ outcome.result.data }}" } } } } ] } }
      - name: by_metadata
        kind: http
        url: "{{ workload.api }}/api"
        headers: { Authorization: "{{ keychain.from_metadata.token_type }} {{ keychain.from_metadata.access_token }}" }
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { metadata: "{{ outcome.result.data }}", audience: "{{ keychain.from_metadata.audience }}" } } } } ] } }
"#;

async fn put(cluster: &Cluster, name: &str, data: Value) {
    cluster
        .mesh
        .vault()
        .put(&Credential {
            name: name.into(),
            kind: "secret".into(),
            data,
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_secrets_google_id_tokens_and_static_values_resolve_once_and_never_leak() {
    let (addr, google, sa) = start_google().await;
    let cluster = Cluster::start().await;
    put(
        &cluster,
        "gcp_meta",
        json!({"source": "metadata", "metadata_host": addr, "endpoint": format!("http://{addr}")}),
    )
    .await;
    put(&cluster, "invoker_sa", sa.clone()).await;
    let workload =
        json!({"api": format!("http://{addr}"), "audience": AUDIENCE, "client_id": CLIENT_ID});
    let (eid, s) = cluster.completed(PLAYBOOK, workload.clone()).await;
    assert_eq!(
        s.ctx["start"],
        json!({"key": OPENAI_KEY.len(), "same": true, "id": CLIENT_ID.len(), "echo": "seen [redacted] [redacted]"}),
        "{s:?}"
    );
    let invoker =
        json!({"for_me": true, "who": "invoker@p.iam.gserviceaccount.com", "bearer": "other"});
    assert_eq!(s.ctx["secret_sa"], invoker, "{s:?}");
    assert_eq!(s.ctx["credential_sa"], invoker, "{s:?}");
    assert_eq!(
        s.ctx["metadata"],
        json!({"for_me": true, "who": "default@p.iam.gserviceaccount.com", "bearer": "other"}),
        "{s:?}"
    );
    assert_eq!(s.ctx["audience"], AUDIENCE, "the audience is not a secret");
    // Two steps read the keychain: each entry was asked for once.
    let once = [
        ("metadata-token", 2),
        ("secret", 2),
        ("jwt-id", 2),
        ("metadata-identity", 1),
        ("jwt-access", 0),
    ];
    for (k, n) in once {
        assert_eq!(google.calls(k), n, "{k}");
    }
    // Another execution asks again.
    let (eid2, s2) = cluster.completed(PLAYBOOK, workload.clone()).await;
    assert_eq!(s2.ctx["secret_sa"], invoker, "{s2:?}");
    assert_eq!(google.calls("jwt-id"), 4);

    // A service account key as `auth`: its own access token reads the secrets.
    put(&cluster, "gcp_meta", {
        let mut k = sa.clone();
        k["endpoint"] = json!(format!("http://{addr}"));
        k
    })
    .await;
    let (eid3, s3) = cluster.completed(PLAYBOOK, workload.clone()).await;
    assert_eq!(s3.ctx["start"]["same"], json!(true), "{s3:?}");
    assert_eq!(
        google.calls("jwt-access"),
        2,
        "an access token per entry reading Secret Manager"
    );
    assert_eq!(
        s3.ctx["metadata"]["who"],
        "invoker@p.iam.gserviceaccount.com"
    );

    for e in [&eid, &eid2, &eid3] {
        cluster.settled_events(e).await;
    }
    let mut haystack = noetl_integration::every_stream(&cluster.mesh).await;
    haystack.push_str(&format!("{s:?}{s2:?}{s3:?}"));
    let meta_id = id_token("default@p.iam.gserviceaccount.com", AUDIENCE);
    let sa_id = id_token("invoker@p.iam.gserviceaccount.com", AUDIENCE);
    let private = sa["private_key"]
        .as_str()
        .unwrap()
        .lines()
        .nth(3)
        .unwrap()
        .to_string();
    // CLIENT_ID is in the workload, as written (a `static` entry's
    // values are what the playbook and its workload say); task output
    // shows it redacted (above).
    for secret in [
        OPENAI_KEY,
        META_ACCESS,
        SA_ACCESS,
        &meta_id,
        &sa_id,
        &private,
    ] {
        if let Some(at) = haystack.find(secret) {
            let around =
                &haystack.as_bytes()[at.saturating_sub(300)..(at + 100).min(haystack.len())];
            panic!(
                "secret {secret:?} leaked: ...{}...",
                String::from_utf8_lossy(around)
            );
        }
    }
    assert!(
        haystack.contains("task.done") && haystack.contains("_cache."),
        "events and the auth cache were searched"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_secret_fails_the_step_naming_the_entry_and_the_playbook() {
    let (addr, _google, _sa) = start_google().await;
    let cluster = Cluster::start().await;
    put(
        &cluster,
        "gcp_meta",
        json!({"source": "metadata", "metadata_host": addr, "endpoint": format!("http://{addr}")}),
    )
    .await;
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: refused_secret }
keychain:
  - { name: gone, kind: secret_manager, provider: gcp, auth: gcp_meta, map: { token: projects/p/secrets/other/versions/2 } }
workflow:
  - step: start
    tool: { kind: noop, result: "{{ keychain.gone.token }}" }
"#;
    let eid = cluster.submit(yaml, "r.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let err = s.error.unwrap_or_default();
    assert!(
        err.contains("keychain `gone` (secret_manager) of playbook `refused_secret`")
            && err.contains("projects/p/secrets/other/versions/2")
            && err.contains("PERMISSION_DENIED"),
        "{err}"
    );
    assert!(
        !err.contains(OPENAI_KEY) && !err.contains(META_ACCESS),
        "{err}"
    );
    cluster.stop().await;
}

/// What `noetl migrate` makes of NoETL's inline `auth: {source: adc}` and
/// `auth: {ALIAS: {type: bearer, provider: secret_manager, key,
/// oauth_credential}}` (docs/migrate.md): entries the tasks name, sent as
/// bearers.
const MIGRATED_INLINE: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: inline_google_auth }
workload: { api: "", key_path: projects/p/secrets/openai/versions/1, cred: gcp_meta }
keychain:
  - name: openai
    kind: secret_manager
    provider: gcp
    auth: '{{ workload.cred }}'
    map: { token: '{{ workload.key_path }}' }
  - name: google_adc
    kind: google_access_token
    auth: gcp_meta
workflow:
  - step: start
    tool:
      - name: adc
        kind: http
        url: "{{ workload.api }}/api"
        auth: google_adc
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { adc: "{{ outcome.result.data.bearer }}" } } } } ] } }
      - name: secret
        kind: http
        url: "{{ workload.api }}/api"
        auth: openai
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { secret: "{{ outcome.result.data.bearer }}" } } } } ] } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrated_inline_google_auths_send_their_tokens_as_bearers() {
    let (addr, google, _sa) = start_google().await;
    let cluster = Cluster::start().await;
    put(
        &cluster,
        "gcp_meta",
        json!({"source": "metadata", "metadata_host": addr, "endpoint": format!("http://{addr}")}),
    )
    .await;
    let (eid, s) = cluster
        .completed(MIGRATED_INLINE, json!({"api": format!("http://{addr}")}))
        .await;
    assert_eq!(s.ctx["adc"], "metadata access token", "{s:?}");
    assert_eq!(s.ctx["secret"], "openai secret", "{s:?}");
    assert_eq!(google.calls("metadata-token"), 2, "one per entry");
    cluster.settled_events(&eid).await;
    let haystack = noetl_integration::every_stream(&cluster.mesh).await;
    for secret in [OPENAI_KEY, META_ACCESS] {
        assert!(!haystack.contains(secret), "{secret} leaked");
    }
    cluster.stop().await;
}
