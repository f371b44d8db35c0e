//! The spec's keychain example runs (docs/security.md "Keychain"): a
//! `secret_manager` entry read from AWS Secrets Manager (moto's server,
//! `make setup`), an `oauth2` client-credentials token from a token
//! endpoint this test serves, each resolved once per execution (the auth
//! cache) and used by several steps; another execution asks again. No
//! value reaches events, KV, logs or error messages.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use noetl_integration::Cluster;
use noetl_mesh::{credentials::Credential, state::ExecStatus};
use noetl_testkit::moto::MotoServer;
use serde_json::{json, Value};

const SECRET: &str = "sk-Moto-Secret-81234";
const CLIENT_SECRET: &str = "cs-Client-Secret-92345";
const ACCESS_TOKEN: &str = "at-Access-Token-03456";
const AWS_SECRET_KEY: &str = "aws-Secret-Key-14567";

/// The token endpoint: client credentials in, a token out; counts the
/// tokens it gave. `/api` answers whether the bearer is that token.
#[derive(Clone, Default)]
struct Issuer {
    issued: Arc<AtomicUsize>,
}

async fn start_issuer() -> (String, Issuer) {
    async fn token(
        State(s): State<Issuer>,
        Form(form): Form<Vec<(String, String)>>,
    ) -> axum::response::Response {
        let get = |k: &str| form.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        if get("grant_type").as_deref() != Some("client_credentials")
            || get("client_id").as_deref() != Some("app-1")
            || get("client_secret").as_deref() != Some(CLIENT_SECRET)
        {
            return (StatusCode::UNAUTHORIZED, Json(json!({"error": "invalid_client", "error_description": format!("got {form:?}")}))).into_response();
        }
        s.issued.fetch_add(1, Ordering::SeqCst);
        Json(json!({"access_token": ACCESS_TOKEN, "token_type": "Bearer", "expires_in": 3600, "scope": "read"})).into_response()
    }
    async fn api(headers: HeaderMap) -> Json<Value> {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        Json(json!({"authorized": auth == format!("Bearer {ACCESS_TOKEN}"), "echo": auth}))
    }
    let issuer = Issuer::default();
    let app = Router::new()
        .route("/token", post(token))
        .route("/api", get(api))
        .with_state(issuer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), issuer)
}

/// The seed's keychain, with what each entry needs to resolve.
const PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: keychain_services }
keychain:
  - name: openai_token
    kind: secret_manager
    provider: aws
    auth: aws_main
    map: { token: prod/openai }
  - name: client
    kind: secret
  - name: api_token
    kind: oauth2
    endpoint: "{{ workload.issuer }}/token"
    data:
      grant_type: client_credentials
      client_id: "{{ keychain.client.client_id }}"
      client_secret: "{{ keychain.client.client_secret }}"
workload: { issuer: "" }
workflow:
  - step: start
    tool:
      - name: call
        kind: http
        url: "{{ workload.issuer }}/api"
        auth: api_token
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { first: "{{ outcome.result.data }}" } } } } ] } }
    next: { arcs: [ { step: secret } ] }
  - step: secret
    tool:
      - name: use
        kind: python
        args: { token: "{{ keychain.openai_token.token }}" }
        code: "result = {'len': len(token), 'echo': 'seen ' + token}"
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { secret: "{{ outcome.result }}" } } } } ] } }
    next: { arcs: [ { step: again } ] }
  - step: again
    tool:
      - name: call
        kind: http
        url: "{{ workload.issuer }}/api"
        headers: { Authorization: "Bearer {{ keychain.api_token.access_token }}" }
        spec: { policy: { rules: [ { else: { then: { do: continue, set_ctx: { again: "{{ outcome.result.data.authorized }}" } } } } ] } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_manager_and_oauth2_entries_resolve_once_per_execution_and_never_leak() {
    let moto = MotoServer::start();
    moto.create_secret("prod/openai", SECRET).await;
    let (issuer_url, issuer) = start_issuer().await;
    let cluster = Cluster::start().await;
    let vault = cluster.mesh.vault();
    for (name, data) in [
        (
            "aws_main",
            json!({"access_key_id": "AKIATEST", "secret_access_key": AWS_SECRET_KEY,
                            "region": noetl_testkit::moto::REGION, "endpoint": moto.endpoint()}),
        ),
        (
            "client",
            json!({"client_id": "app-1", "client_secret": CLIENT_SECRET}),
        ),
    ] {
        vault
            .put(&Credential {
                name: name.into(),
                kind: "secret".into(),
                data,
            })
            .await
            .unwrap();
    }
    let (eid, s) = cluster
        .completed(PLAYBOOK, json!({"issuer": issuer_url}))
        .await;
    assert_eq!(s.ctx["first"]["authorized"], json!(true), "{s:?}");
    assert_eq!(s.ctx["first"]["echo"], json!("Bearer [redacted]"), "{s:?}");
    assert_eq!(
        s.ctx["secret"],
        json!({"len": SECRET.len(), "echo": "seen [redacted]"})
    );
    assert_eq!(s.ctx["again"], json!(true));
    // Three step-runs read the token: one request to the endpoint.
    assert_eq!(
        issuer.issued.load(Ordering::SeqCst),
        1,
        "cached per execution"
    );
    // Another execution asks again.
    let (eid2, s2) = cluster
        .completed(PLAYBOOK, json!({"issuer": issuer_url}))
        .await;
    assert_eq!(s2.ctx["again"], json!(true));
    assert_eq!(
        issuer.issued.load(Ordering::SeqCst),
        2,
        "a new execution, a new token"
    );

    // Refused by the endpoint: the step fails naming the entry and the
    // OAuth2 error code, not what was sent.
    vault
        .put(&Credential {
            name: "client".into(),
            kind: "secret".into(),
            data: json!({"client_id": "app-1", "client_secret": "cs-Wrong-Secret-55555"}),
        })
        .await
        .unwrap();
    let eid3 = cluster
        .submit(PLAYBOOK, "k.yaml", json!({"issuer": issuer_url}))
        .await;
    let s3 = cluster.wait(&eid3, Duration::from_secs(60)).await;
    assert_eq!(s3.status, ExecStatus::Failed, "{s3:?}");
    let err = s3.error.clone().unwrap_or_default();
    assert!(
        err.contains("keychain `api_token` (oauth2)") && err.contains("invalid_client"),
        "{err}"
    );
    assert!(!err.contains("cs-Wrong-Secret-55555"), "{err}");

    for e in [&eid, &eid2, &eid3] {
        cluster.settled_events(e).await;
    }
    let mut haystack = noetl_integration::every_stream(&cluster.mesh).await;
    haystack.push_str(&format!("{s:?}{s2:?}{s3:?}"));
    for secret in [
        SECRET,
        CLIENT_SECRET,
        ACCESS_TOKEN,
        AWS_SECRET_KEY,
        "cs-Wrong-Secret-55555",
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
        haystack.contains("step.done") && haystack.contains("_cache."),
        "events and the auth cache were searched"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_fails_the_step_naming_the_entry_and_the_secret() {
    let moto = MotoServer::start();
    let cluster = Cluster::start().await;
    cluster
        .mesh
        .vault()
        .put(&Credential {
            name: "aws_main".into(),
            kind: "secret".into(),
            data: json!({"access_key_id": "AKIATEST", "secret_access_key": AWS_SECRET_KEY,
                         "region": noetl_testkit::moto::REGION, "endpoint": moto.endpoint()}),
        })
        .await
        .unwrap();
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: missing_secret }
keychain:
  - { name: gone, kind: secret_manager, provider: aws, auth: aws_main, map: { token: prod/none } }
workflow:
  - step: start
    tool: { kind: noop, result: "{{ keychain.gone.token }}" }
"#;
    let eid = cluster.submit(yaml, "m.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let err = s.error.unwrap_or_default();
    assert!(
        err.contains("keychain `gone` (secret_manager)")
            && err.contains("prod/none")
            && err.contains("ResourceNotFoundException"),
        "{err}"
    );
    cluster.stop().await;
}
