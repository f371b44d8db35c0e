//! `noetl serve api` and `noetl admin token` as an operator runs them:
//! separate processes against a private nats-server, real HTTP. Tokens are
//! printed once and stored hashed; the bootstrap token from the
//! environment is an admin token; the API answers the mesh's probes on its
//! own address, logs each request with its principal and audits changes;
//! it refuses a public address without tokens, and drains on SIGTERM. A
//! NoETL client's flow runs on a mesh of separate `noetl serve` processes.

use std::process::Stdio;
use std::time::{Duration, Instant};

use noetl_testkit::TestServer;
use serde_json::{json, Value};

mod support;
use support::{admin_init, free_port, noetl, serve, signal_and_wait, Procs};

const BOOTSTRAP: &str = "bootstrap-secret-4c1d9e7a22f0b6";

fn token_create(home: &std::path::Path, url: &str, role: &str, name: &str) -> String {
    let out = noetl(home)
        .args([
            "admin", "token", "create", "--role", role, "--name", name, "--json",
        ])
        .args(["--nats", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["name"].as_str(), v["role"].as_str()),
        (Some(name), Some(role))
    );
    v["token"].as_str().unwrap().to_string()
}

async fn wait_ready(http: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
            if r.status().as_u16() == 200 {
                assert_eq!(r.text().await.unwrap(), "ready\n");
                return;
            }
        }
        assert!(Instant::now() < deadline, "the API did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_api_takes_tokens_logs_principals_audits_changes_and_drains_on_sigterm() {
    let nats = TestServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    admin_init(noetl(&home), &url);

    // A token is printed once; the list shows names and roles only.
    let viewer = token_create(&home, &url, "viewer", "dashboard");
    assert!(
        viewer.starts_with("noetl_") && viewer.len() > 40,
        "{viewer}"
    );
    let list = noetl(&home)
        .args(["admin", "token", "list", "--json", "--nats", &url])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(
        listed.contains("\"dashboard\"") && listed.contains("\"viewer\""),
        "{listed}"
    );
    assert!(
        !listed.contains(&viewer[6..]),
        "the list shows a token: {listed}"
    );

    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = dir.path().join("api.log");
    let child = noetl(&home)
        .args([
            "serve",
            "api",
            "--http-addr",
            &format!("127.0.0.1:{port}"),
            "--nats",
            &url,
        ])
        .env("NOETL_API_BOOTSTRAP_TOKEN", BOOTSTRAP)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut procs = Procs(vec![child]);
    let http = reqwest::Client::new();
    wait_ready(&http, &base).await;

    // The mesh's probes on the API's address, and NoETL's.
    let healthz = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(healthz.text().await.unwrap(), "ok\n");
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert!(metrics
        .text()
        .await
        .unwrap()
        .contains("noetl_nats_connected 1"));
    let health: Value = http
        .get(format!("{base}/api/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (health["status"].as_str(), health["nats"].as_str()),
        (Some("ok"), Some("connected"))
    );

    // Roles: the viewer reads and may not register; the bootstrap token
    // is an admin's.
    let get = |token: Option<&str>| {
        let mut r = http.get(format!("{base}/api/executions"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    assert_eq!(get(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(get(Some(&viewer)).await.unwrap().status().as_u16(), 200);
    let playbook = std::fs::read_to_string("tests/fixtures/hello.yaml").unwrap();
    let register = |token: &str| {
        http.post(format!("{base}/api/catalog/register"))
            .bearer_auth(token)
            .json(&json!({"content": playbook}))
            .send()
    };
    assert_eq!(register(&viewer).await.unwrap().status().as_u16(), 403);
    let reg = register(BOOTSTRAP).await.unwrap();
    assert_eq!(reg.status().as_u16(), 200);
    let reg: Value = reg.json().await.unwrap();
    assert_eq!(reg["path"], "hello");

    // SIGTERM: it drains and exits 0; nothing listens afterwards.
    let status = signal_and_wait(&mut procs.0[0], "TERM", "the API to exit");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "exit {status:?}; log:\n{text}");
    assert!(http.get(format!("{base}/health")).send().await.is_err());

    // The log: each request with its principal, the change audited,
    // never a token.
    assert!(text.contains("principal=dashboard"), "{text}");
    let audit = text
        .lines()
        .find(|l| {
            l.contains("audit")
                && l.contains("catalog.register")
                && l.contains("principal=bootstrap")
        })
        .unwrap_or_else(|| panic!("no audit record of the registration:\n{text}"));
    assert!(
        audit.contains("hello@v1") && audit.contains("ok"),
        "{audit}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("path=/api/catalog/register")
                && l.contains("status=403")
                && l.contains("principal=dashboard")),
        "no access line of the refused registration:\n{text}"
    );
    for secret in [BOOTSTRAP, &viewer[6..]] {
        assert!(!text.contains(secret), "a token in the log:\n{text}");
    }
}

#[test]
fn serve_api_refuses_a_public_address_without_tokens_and_other_services_refuse_its_flags() {
    let nats = TestServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let out = noetl(&home)
        .args([
            "serve",
            "api",
            "--http-addr",
            &format!("0.0.0.0:{}", free_port()),
        ])
        .args(["--nats", &url])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("without authentication") && err.contains("--insecure-no-auth"),
        "{err}"
    );

    let out = noetl(&home)
        .args([
            "serve",
            "router",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--nats",
            &url,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tls-cert is an option of `noetl serve api` only"),
        "{err}"
    );
}

/// NoETL's client flow against a mesh of separate processes, as deployed:
/// `noetl serve router`, `scheduler`, `loop-supervisor`, `executor` and
/// `api` on one nats-server. Register → execute by path → poll the status
/// until `COMPLETED` → the events and a step's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noetl_client_runs_a_playbook_on_a_mesh_of_separate_processes() {
    let nats = TestServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    admin_init(noetl(&home), &url);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let addr = format!("127.0.0.1:{port}");
    let procs = Procs(vec![
        serve(noetl(&home), &url, &["router"]),
        serve(noetl(&home), &url, &["scheduler"]),
        serve(noetl(&home), &url, &["loop-supervisor"]),
        serve(
            noetl(&home),
            &url,
            &["executor", "--kind", "python", "--kind", "noop"],
        ),
        serve(noetl(&home), &url, &["api", "--http-addr", &addr]),
    ]);
    let http = reqwest::Client::new();
    wait_ready(&http, &base).await;

    let playbook = std::fs::read_to_string("tests/fixtures/hello.yaml").unwrap();
    let reg: Value = http
        .post(format!("{base}/api/catalog/register"))
        .json(&json!({"content": playbook}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (reg["path"].as_str(), reg["version"].as_u64()),
        (Some("hello"), Some(1)),
        "{reg}"
    );
    let started = http
        .post(format!("{base}/api/execute"))
        .json(&json!({"path": "hello", "payload": {"name": "Ada"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status().as_u16(), 200);
    let started: Value = started.json().await.unwrap();
    let eid = started["execution_id"]
        .as_str()
        .expect("an execution id")
        .to_string();

    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let s: Value = http
            .get(format!("{base}/api/executions/{eid}/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if s["status"] != "RUNNING" {
            break s;
        }
        assert!(Instant::now() < deadline, "still running: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status["status"], "COMPLETED", "{status}");
    let detail = http
        .get(format!("{base}/api/executions/{eid}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(detail.contains("execution.completed"), "{detail}");
    let result = http
        .get(format!("{base}/api/executions/{eid}/results/start"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(result.contains("Hello, Ada!"), "{result}");
    drop(procs);
}
