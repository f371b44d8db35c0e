//! How the API starts: without tokens it runs open on loopback only (and
//! refuses an address others can reach), a bootstrap token is stored
//! hashed as an admin token, and it serves HTTPS with a certificate.

use std::time::Duration;

use noetl_api::auth::Role;
use noetl_api::tokens::{hash, Tokens};
use noetl_api::{ApiParams, ServeError, TlsFiles};
use noetl_integration::Cluster;
use serde_json::json;
use tokio_util::sync::CancellationToken;

mod support;
use support::{assert_error, Api, FLOW};

fn params(cluster: &Cluster, listener: std::net::TcpListener) -> ApiParams {
    ApiParams {
        mesh: cluster.mesh.clone(),
        listener,
        tls: None,
        bootstrap_token: None,
        insecure_no_auth: false,
        extra: axum::Router::new(),
        shutdown: CancellationToken::new(),
        limits: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_tokens_the_api_is_open_on_loopback_and_refuses_a_public_address() {
    let cluster = Cluster::start().await;
    // 0.0.0.0 without a token: refused, naming the ways out.
    let public = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let refused = noetl_api::serve(params(&cluster, public)).await;
    let e = refused.expect_err("no token on a public address");
    assert!(matches!(e, ServeError::Unprotected(_)), "{e}");
    assert!(e.to_string().contains("--insecure-no-auth"), "{e}");
    assert!(e.to_string().contains("noetl admin token create"), "{e}");

    // Loopback: open, requests act as `anonymous` with every role.
    let api = Api::serve(cluster, None).await;
    api.register(None, FLOW).await;
    let id = api.execute(None, "tests/api_flow", json!({})).await;
    api.wait_status(&id, None, "COMPLETED").await;
    // A token sent is still checked.
    assert_error(
        &api.get("/api/executions", Some("noetl_unknown")).await,
        401,
        "not known",
    );

    // A token made while the API runs (`noetl admin token create`) makes
    // tokens required at once, without a restart; revoking the last one
    // opens loopback again.
    let tokens = Tokens::new(api.cluster.mesh.tokens_kv().clone());
    let viewer = tokens.create("late", Role::Viewer).await.unwrap();
    let refused = poll_status(&api, None, 401).await;
    assert_error(&refused, 401, "needs a bearer token");
    assert_eq!(api.get("/api/executions", Some(&viewer)).await.status, 200);
    assert_eq!(tokens.revoke("late").await.unwrap(), 1);
    poll_status(&api, None, 200).await;
}

/// `GET /api/executions` until it answers `want` (the API follows the
/// tokens bucket; a change lands within milliseconds).
async fn poll_status(api: &Api, token: Option<&str>, want: u16) -> support::Answer {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = api.get("/api/executions", token).await;
        if a.status == want || std::time::Instant::now() > deadline {
            assert_eq!(a.status, want, "{}", a.text);
            return a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bootstrap_token_is_stored_hashed_as_admin_and_replaced_when_it_changes() {
    let cluster = Cluster::start().await;
    let tokens = Tokens::new(cluster.mesh.tokens_kv().clone());
    let short = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut p = params(&cluster, short);
    p.bootstrap_token = Some("short".into());
    let e = noetl_api::serve(p)
        .await
        .expect_err("a weak bootstrap token");
    assert!(e.to_string().contains("at least 16"), "{e}");

    for token in [
        "first-bootstrap-token-0123456789",
        "second-bootstrap-token-0123456789",
    ] {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut p = params(&cluster, listener);
        p.bootstrap_token = Some(token.into());
        let shutdown = p.shutdown.clone();
        let served = tokio::spawn(noetl_api::serve(p));
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            let r = http
                .get(format!("{base}/api/executions"))
                .bearer_auth(token)
                .send()
                .await;
            if let Ok(r) = r {
                break r.status().as_u16();
            }
            assert!(std::time::Instant::now() < deadline, "not up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(status, 200, "the bootstrap token is an admin token");
        let none = http
            .get(format!("{base}/api/executions"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            none.status().as_u16(),
            401,
            "tokens exist: auth is required"
        );
        shutdown.cancel();
        served.await.unwrap().unwrap();
    }
    // Only the hash of the current one is stored, as `bootstrap`, admin.
    let listed = tokens.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].name.as_str(), listed[0].role),
        ("bootstrap", Role::Admin)
    );
    let kv = cluster.mesh.tokens_kv();
    assert!(kv
        .get(hash("second-bootstrap-token-0123456789"))
        .await
        .unwrap()
        .is_some());
    assert!(kv
        .get(hash("first-bootstrap-token-0123456789"))
        .await
        .unwrap()
        .is_none());
    assert!(tokens
        .lookup("first-bootstrap-token-0123456789")
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_serves_https_with_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let tls = noetl_api::load_tls(&TlsFiles {
        cert: cert_path.clone(),
        key: key_path,
    })
    .unwrap();
    let bad = noetl_api::load_tls(&TlsFiles {
        cert: dir.path().join("missing.pem"),
        key: cert_path.clone(),
    })
    .expect_err("a missing certificate");
    assert!(bad.to_string().contains("missing.pem"), "{bad}");

    let (cluster, tokens) = {
        let c = Cluster::start().await;
        let t = Tokens::new(c.mesh.tokens_kv().clone());
        (c, t)
    };
    let viewer = tokens.create("tls-viewer", Role::Viewer).await.unwrap();
    let api = Api::serve(cluster, Some(tls)).await;
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let r = loop {
        match client
            .get(format!("{}/api/executions", api.base))
            .bearer_auth(&viewer)
            .send()
            .await
        {
            Ok(r) => break r,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no HTTPS answer: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(r.status().as_u16(), 200);
    assert!(api.base.starts_with("https://"));
    // Plain HTTP to the TLS port gets no API answer.
    let plain = api.base.replace("https://", "http://");
    let r = reqwest::get(format!("{plain}/health")).await;
    assert!(r.map(|r| !r.status().is_success()).unwrap_or(true));
}
