//! The API under hostile input, against a real nats-server and the API
//! over real TCP: every path parameter checked before storage, catalog
//! paths bounded (the API's NATS connection survives them), header, body
//! and idle timeouts, the connection limit, and log lines no client text
//! can forge.

use std::io::Write as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use noetl_api::Limits;
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod support;
use support::{assert_error, Api, FLOW};

/// Every log line of this test binary.
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(sink.clone()))
            .try_init();
        buf
    })
    .clone()
}

/// A writer into the shared log buffer.
struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_path_parameter_is_checked_before_it_touches_storage() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    api.register(admin, FLOW).await;
    let id = api.execute(admin, "tests/api_flow", json!({})).await;
    api.wait_status(&id, viewer, "COMPLETED").await;

    // An id that is not one: a C1 control character, another record's key.
    for bad in [
        "%C2%97".to_string(),
        format!("{id}.step.start"),
        "a*".into(),
    ] {
        for (method, tail) in [
            (Method::POST, "resume"),
            (Method::POST, "cancel"),
            (Method::POST, "pause"),
            (Method::POST, "unpause"),
            (Method::POST, "signals/go"),
            (Method::GET, "status"),
            (Method::GET, "events"),
            (Method::GET, "results/start"),
        ] {
            let a = api
                .call(
                    method.clone(),
                    &format!("/api/executions/{bad}/{tail}"),
                    admin,
                    None,
                )
                .await;
            assert_error(&a, 400, "path parameter `id`");
            assert!(!a.text.contains("\"execution_id\""), "{tail}: {}", a.text);
        }
        assert_error(
            &api.get(&format!("/api/executions/{bad}"), viewer).await,
            400,
            "is not an execution id",
        );
    }
    // Names: a control character, or too long.
    let step = api
        .get(&format!("/api/executions/{id}/results/a%0Ab"), viewer)
        .await;
    assert_error(&step, 400, "path parameter `step`");
    // A signal name is checked by the format the mesh keys waiters by: one
    // in another format is 400, not "nobody waits" (404).
    for bad in ["s".repeat(129), "approval.v2".into(), "a%20b".into()] {
        let signal = api
            .post(
                &format!("/api/executions/{id}/signals/{bad}"),
                admin,
                &json!({}),
            )
            .await;
        assert_error(&signal, 400, "path parameter `name`");
        assert_error(&signal, 400, "1-128 characters of [A-Za-z0-9_-]");
    }
    for method in [Method::GET, Method::DELETE] {
        let a = api
            .call(
                method,
                &format!("/api/credentials/{}", "c".repeat(129)),
                admin,
                None,
            )
            .await;
        assert_error(&a, 400, "path parameter `name`");
    }
    // Nothing of that reached the mesh: the execution is as it was.
    let after = api.wait_status(&id, viewer, "COMPLETED").await;
    assert_eq!(after["execution_id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn catalog_paths_over_the_limit_are_refused_and_the_mesh_connection_holds() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));
    let connects = || {
        api.cluster
            .mesh
            .client()
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = connects();
    let huge = "p".repeat(5000);
    let read = api
        .post("/api/catalog/resource", viewer, &json!({"path": huge}))
        .await;
    assert_error(&read, 422, "1-256 characters");
    assert!(read.text.len() < 600, "the path is not echoed whole");
    let by_id = api
        .post(
            "/api/catalog/resource",
            viewer,
            &json!({"catalog_id": format!("{huge}@v1")}),
        )
        .await;
    assert_error(&by_id, 422, "catalog path");
    let start = api
        .post("/api/execute", admin, &json!({"path": huge}))
        .await;
    assert_error(&start, 422, "catalog path");
    let gone = api
        .post("/api/catalog/delete", admin, &json!({"path": huge}))
        .await;
    assert_error(&gone, 422, "catalog path");
    let doc = FLOW.replace("path: tests/api_flow", &format!("path: {huge}"));
    let reg = api
        .post("/api/catalog/register", admin, &json!({"content": doc}))
        .await;
    assert_error(&reg, 422, "catalog path");
    let nested = api
        .post(
            "/api/catalog/resource",
            viewer,
            &json!({"path": "a/".repeat(2000)}),
        )
        .await;
    assert_error(&nested, 422, "catalog path");
    let types = api
        .get(&format!("/api/events?type={}", "a.".repeat(1000)), viewer)
        .await;
    assert_error(&types, 400, "at most 128");

    // A step name of any length makes a bounded key and object name: it
    // runs, its result stored by reference (FLOW keeps at most 64 bytes
    // inline).
    let long_step = "s".repeat(3000);
    let doc = FLOW.replace("step: start", &format!("step: {long_step}"));
    api.register(admin, &doc).await;
    let id = api.execute(admin, "tests/api_flow", json!({})).await;
    let status = api.wait_status(&id, viewer, "COMPLETED").await;
    assert_eq!(status["steps"][long_step.as_str()], "done", "{status}");
    assert_eq!(
        connects(),
        before,
        "the API's NATS connection was never closed"
    );
}

/// Open a TCP connection to the API.
async fn connect(api: &Api) -> TcpStream {
    TcpStream::connect(api.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Read what the server sends until it closes the connection (or
/// `within` passes: `None`).
async fn until_closed(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok()
        .map(|_| String::from_utf8_lossy(&got).into_owned())
}

/// Read one answer (head and JSON body) within `within`: what arrived.
async fn read_answer(s: &mut TcpStream, within: Duration) -> String {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&got);
            if text.contains("\r\n\r\n") && text.trim_end().ends_with('}') {
                return;
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_slow_and_too_many_clients_are_cut_off_and_health_holds() {
    let limits = Limits {
        max_connections: 8,
        header_timeout: Duration::from_secs(3),
        body_timeout: Duration::from_secs(1),
    };
    let (mut api, keys) = Api::start_with(limits).await;
    // No pooled connection: the server closes idle ones within seconds.
    api.http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // 20 connections that send nothing: each past the limit takes the slot
    // of the oldest silent one, which is closed; /api/health answers at
    // once, well before the header timeout would free a slot.
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(connect(&api).await);
    }
    let t0 = Instant::now();
    let health = api.get("/api/health", None).await;
    assert_eq!(health.status, 200, "{}", health.text);
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    // Closed by eviction, not by the header timeout (3 s after they
    // connected): at least 12 of them within 1.5 s of the health answer
    // (13 when the health connection kept its slot to the end). Which
    // ones is the server's order of accepting them, close to but not
    // always the order they connected in: the count is what holds. (A
    // bound of 100 ms per connection measured how fast a loaded machine
    // runs the closing task, not the eviction, and failed on CI's 2 cores.)
    let left = (t0 + Duration::from_millis(1500)).saturating_duration_since(Instant::now());
    let evicted = futures::future::join_all(idle.iter_mut().map(|s| until_closed(s, left)))
        .await
        .into_iter()
        .filter(Option::is_some)
        .count();
    assert!(
        (12..=13).contains(&evicted),
        "{evicted} of 20 gave their slots (12 or 13 should)"
    );
    for s in idle.iter_mut() {
        let closed = until_closed(s, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "an idle connection stays open");
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
    // Every slot held by a connection that has spoken: a new one is
    // closed at once.
    let mut talking = Vec::new();
    for _ in 0..8 {
        let mut s = connect(&api).await;
        s.write_all(b"GET /api/health HTTP/1.1\r\nHost: api\r\n")
            .await
            .unwrap();
        talking.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut refused = connect(&api).await;
    assert!(
        until_closed(&mut refused, Duration::from_millis(1500))
            .await
            .is_some(),
        "a ninth connection is closed at once"
    );
    drop(talking);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A body declared over the limit: 413 at once, nothing read.
    let mut s = connect(&api).await;
    s.write_all(
        b"POST /api/catalog/register HTTP/1.1\r\nHost: api\r\nContent-Length: 10000000\r\n\r\n",
    )
    .await
    .unwrap();
    let answer = read_answer(&mut s, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("10000000 bytes"), "{answer}");

    // A body that never arrives: 408 after the body timeout.
    let mut s = connect(&api).await;
    let head = format!(
        "POST /api/catalog/register HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {}\r\nContent-Length: 100\r\n\r\n{{\"content",
        keys.admin
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let t0 = Instant::now();
    let answer = read_answer(&mut s, Duration::from_secs(4)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );

    // Headers that never end, and a kept-alive connection left idle: closed.
    let mut s = connect(&api).await;
    s.write_all(b"GET /api/health HTTP/1.1\r\nHost: api\r\n")
        .await
        .unwrap();
    assert!(until_closed(&mut s, Duration::from_secs(6)).await.is_some());
    let mut s = connect(&api).await;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: api\r\n\r\n")
        .await
        .unwrap();
    let kept = until_closed(&mut s, Duration::from_secs(6)).await;
    let kept = kept.expect("a kept-alive connection left idle is closed");
    assert!(kept.starts_with("HTTP/1.1 200"), "{kept}");
    let health = api.get("/api/health", None).await;
    assert_eq!(health.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_newline_in_what_a_client_sends_forges_no_log_line() {
    let logs = logs();
    let (api, keys) = Api::start().await;
    let admin = Some(keys.admin.as_str());
    let forged = "INFO audit: principal=root action=credential.delete outcome=ok";
    let name = format!("evil\n{forged}");
    let put = api
        .post(
            "/api/credentials",
            admin,
            &json!({"name": name, "type": "bearer", "data": {"token": "t0ps3cret"}}),
        )
        .await;
    assert_eq!(put.status, 422, "{}", put.text);
    let doc = FLOW.replace("path: tests/api_flow", "path: \"a\\nINFO forged line\"");
    let reg = api
        .post("/api/catalog/register", admin, &json!({"content": doc}))
        .await;
    assert_eq!(reg.status, 422, "{}", reg.text);
    let _ = std::io::stdout().flush();
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("evil\\nINFO audit"),
        "the name is logged, escaped:\n{text}"
    );
    for line in text.lines() {
        assert!(!line.starts_with(forged), "a forged line: {line}");
        assert!(!line.starts_with("INFO forged"), "a forged line: {line}");
        assert!(!line.contains("t0ps3cret"), "a secret in the log: {line}");
    }
}
