//! `noetl serve --http-addr`: `/healthz`, `/readyz` and `/metrics` of real
//! service processes against a real nats-server — ready once the consumers
//! pull, counting what they handle, 503 while NATS is down, 200 again when
//! it is back, 503 naming the consumer whose pulls fail, and gone when the
//! process has drained.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use noetl_mesh::server::{NatsServerProcess, ServerOptions};
use serde_json::Value;

mod support;
use support::{free_port, noetl, Procs};

/// Its entry step has an admission policy, so its token goes through the
/// scheduler (a step without one the router starts itself).
const TINY: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: tiny }
workflow:
  - step: start
    spec:
      policy:
        admit:
          rules:
            - else:
                then: { allow: true }
    tool:
      - name: seed
        kind: noop
        result: 7
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { seed: "{{ outcome.result }}" } }
"#;

/// [`support::http_get`] with a 5 s read timeout.
fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    support::http_get(port, path, Duration::from_secs(5))
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + timeout;
    loop {
        match done() {
            Ok(()) => return,
            Err(last) => assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; last: {last}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until `path` on `port` answers `status`.
fn wait_status(port: u16, path: &str, status: u16, timeout: Duration) -> String {
    let mut body = String::new();
    wait_until(
        &format!("{path} on :{port} to answer {status}"),
        timeout,
        || match get(port, path) {
            Ok((s, b)) if s == status => {
                body = b;
                Ok(())
            }
            Ok((s, b)) => Err(format!("{s} {b}")),
            Err(e) => Err(e.to_string()),
        },
    );
    body
}

/// The value of one sample line (`series value`) of a scrape.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn scrape(port: u16) -> String {
    let (status, body) = get(port, "/metrics").expect("scrape /metrics");
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn health_ready_and_metrics_follow_the_consumers_and_the_nats_connection() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let nats_opts = ServerOptions {
        store_dir: dir.path().join("nats"),
        port: Some(free_port()),
        binary: None,
    };
    let mut nats = NatsServerProcess::start(nats_opts.clone()).expect("nats-server");
    let url = nats.url();
    let playbook = dir.path().join("tiny.yaml");
    std::fs::write(&playbook, TINY).unwrap();

    // One health port per process.
    let (router, scheduler, executor) = (free_port(), free_port(), free_port());
    let mut services = Procs(Vec::new());
    for (args, port) in [
        (vec!["router"], router),
        (vec!["scheduler"], scheduler),
        (vec!["executor", "--kind", "noop"], executor),
    ] {
        let log = dir.path().join(format!("{}.log", args[0]));
        let child = noetl(&home)
            .arg("serve")
            .args(&args)
            .args(["--nats", &url, "--http-addr", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        services.0.push(child);
    }

    // Live at once; ready once every consumer loop has pulled (the first
    // empty pull expires after 5 s), and until then 503 saying why.
    for port in [router, scheduler, executor] {
        let body = wait_status(port, "/healthz", 200, Duration::from_secs(60));
        assert_eq!(body, "ok\n");
        let (status, why) = get(port, "/readyz").unwrap();
        assert_eq!(status, 503, "{why}");
        assert!(
            why.contains(": has not pulled yet") || why == "no consumer loop is running\n",
            "{why}"
        );
    }
    for port in [router, scheduler, executor] {
        let body = wait_status(port, "/readyz", 200, Duration::from_secs(60));
        assert_eq!(body, "ready\n");
    }
    let before = scrape(router);
    assert_eq!(
        sample(&before, "noetl_nats_connected"),
        Some(1.0),
        "{before}"
    );
    assert_eq!(
        sample(
            &before,
            r#"noetl_messages_total{consumer="router-requests",disposition="ack"}"#
        ),
        Some(0.0),
        "a series shows at 0 before the first message:\n{before}"
    );

    // Run an execution through the three processes.
    let out = noetl(&home)
        .args(["exec", "start"])
        .arg(&playbook)
        .args(["--json", "--nats", &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = id["execution_id"].as_str().unwrap().to_string();
    let out = noetl(&home)
        .args(["exec", "status", &id, "--wait", "--json", "--timeout", "60"])
        .args(["--nats", &url])
        .output()
        .unwrap();
    let s: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("exec status: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(s["status"], "completed", "{s}");

    // What each consumer loop handled is counted. The completing event may
    // still be acked just after the status shows: poll briefly.
    let at_least = |port: u16, series: &str, min: f64| {
        wait_until(
            &format!("{series} >= {min} on :{port}"),
            Duration::from_secs(10),
            || {
                let m = scrape(port);
                match sample(&m, series) {
                    Some(v) if v >= min => Ok(()),
                    v => Err(format!("{v:?} in:\n{m}")),
                }
            },
        )
    };
    let acked = |consumer: &str| {
        format!(r#"noetl_messages_total{{consumer="{consumer}",disposition="ack"}}"#)
    };
    at_least(router, &acked("router-requests"), 1.0);
    at_least(router, &acked("router-events"), 1.0);
    at_least(scheduler, &acked("scheduler"), 1.0);
    at_least(executor, &acked("executor-noop"), 1.0);
    at_least(
        executor,
        r#"noetl_handler_duration_seconds_count{consumer="executor-noop"}"#,
        1.0,
    );
    // What the engine did: tasks by kind and outcome, their time, and
    // executions by status (one each here).
    at_least(
        executor,
        r#"noetl_tasks_total{kind="noop",status="ok"}"#,
        1.0,
    );
    at_least(
        executor,
        r#"noetl_task_duration_seconds_count{kind="noop"}"#,
        1.0,
    );
    at_least(router, r#"noetl_executions_total{status="started"}"#, 1.0);
    at_least(router, r#"noetl_executions_total{status="completed"}"#, 1.0);
    let m = scrape(router);
    let conflicts = sample(&m, r#"noetl_kv_cas_conflicts_total{bucket="noetl_exec"}"#);
    assert!(
        conflicts.is_some(),
        "the exec bucket's conflict counter:\n{m}"
    );
    assert_eq!(
        sample(&m, r#"noetl_executions_total{status="failed"}"#),
        None
    );
    let m = scrape(executor);
    for series in [
        r#"noetl_in_flight{consumer="executor-noop"}"#,
        r#"noetl_messages_total{consumer="executor-noop",disposition="dead_letter"}"#,
        r#"noetl_pull_failures_total{consumer="executor-noop"}"#,
    ] {
        assert_eq!(sample(&m, series), Some(0.0), "{series} in:\n{m}");
    }
    assert!(!m.contains(&id), "an execution id is a metric label:\n{m}");

    // NATS goes away: neither live nor ready, within a few seconds.
    nats.stop();
    for port in [router, scheduler, executor] {
        let why = wait_status(port, "/healthz", 503, Duration::from_secs(10));
        assert!(why.contains("NATS connection lost"), "{why}");
        assert_eq!(why.lines().count(), 1, "{why}");
        let why = wait_status(port, "/readyz", 503, Duration::from_secs(10));
        assert!(why.contains("NATS connection lost"), "{why}");
    }
    assert_eq!(sample(&scrape(router), "noetl_nats_connected"), Some(0.0));

    // It comes back (same port, same store): live and ready again.
    let _nats = NatsServerProcess::start(nats_opts).expect("nats-server restart");
    for port in [router, scheduler, executor] {
        wait_status(port, "/healthz", 200, Duration::from_secs(60));
        wait_status(port, "/readyz", 200, Duration::from_secs(60));
    }
    assert_eq!(sample(&scrape(router), "noetl_nats_connected"), Some(1.0));

    // Its durable consumer deleted (topology gone): the router's pulls fail,
    // so it is live but not ready, names the consumer and counts failures.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = async_nats::connect(url.as_str()).await.unwrap();
        async_nats::jetstream::new(client)
            .delete_consumer_from_stream("noetl-router-events", "NOETL_EVENTS")
            .await
            .unwrap();
    });
    let why = wait_status(router, "/readyz", 503, Duration::from_secs(20));
    assert!(why.contains("consumer router-events: pull failed"), "{why}");
    assert!(!why.contains("router-requests"), "{why}");
    assert_eq!(why.lines().count(), 1, "{why}");
    assert_eq!(get(router, "/healthz").unwrap().0, 200);
    at_least(
        router,
        r#"noetl_pull_failures_total{consumer="router-events"}"#,
        1.0,
    );

    // SIGTERM: the router drains, exits 0, and its health port closes.
    let child = &mut services.0[0];
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let mut status = None;
    wait_until("the router to exit", Duration::from_secs(30), || {
        status = child.try_wait().unwrap();
        status.map(|_| ()).ok_or_else(|| "running".into())
    });
    let log = std::fs::read_to_string(dir.path().join("router.log")).unwrap_or_default();
    assert!(status.unwrap().success(), "{status:?}; log:\n{log}");
    assert!(log.contains("health server stopped"), "{log}");
    assert!(
        get(router, "/healthz").is_err(),
        "the health port still answers after exit"
    );
}

#[test]
fn a_bad_http_addr_fails_before_joining_the_mesh() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    // No NATS at this URL: the address is checked first.
    let out = noetl(dir.path())
        .args(["serve", "router", "--nats", "nats://127.0.0.1:1"])
        .env("NOETL_HTTP_ADDR", &addr)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot listen on --http-addr / NOETL_HTTP_ADDR {addr}"
        )),
        "{err}"
    );
}

/// A port free now and outside the kernel's ephemeral range
/// (`ip_local_port_range`), so no outgoing connection or `free_port` of
/// another test takes it before a server that starts later binds it (one
/// run in many found its nats-server's port taken after the wait below).
fn port_kept_for_later() -> u16 {
    let range =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low: u16 = (range.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(32768);
    let from = 10_000 + (std::process::id() % 10_000) as u16;
    (from..low)
        .chain(10_000..from)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below the ephemeral range")
}

#[test]
fn a_service_started_before_its_nats_server_waits_for_it_then_serves() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let nats_opts = ServerOptions {
        store_dir: dir.path().join("nats"),
        port: Some(port_kept_for_later()),
        binary: None,
    };
    let url = format!("nats://127.0.0.1:{}", nats_opts.port.unwrap());
    let (router, scheduler) = (free_port(), free_port());
    let mut services = Procs(Vec::new());
    let mut logs = Vec::new();
    for (service, port) in [("router", router), ("scheduler", scheduler)] {
        let log = dir.path().join(format!("{service}.log"));
        let child = noetl(&home)
            .args(["serve", service, "--nats", &url])
            .args(["--http-addr", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        services.0.push(child);
        logs.push(log);
    }
    // No server yet: both keep running, saying why they are not serving.
    for log in &logs {
        wait_until(
            "a log line about the retry",
            Duration::from_secs(30),
            || {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                if text.contains("cannot join the mesh yet; retrying") {
                    Ok(())
                } else {
                    Err(text)
                }
            },
        );
    }
    for child in &mut services.0 {
        assert!(child.try_wait().unwrap().is_none(), "exited without NATS");
    }

    // A signal while waiting ends the wait cleanly.
    let waiting = &mut services.0[1];
    let term = Command::new("kill")
        .args(["-TERM", &waiting.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let mut status = None;
    wait_until("the scheduler to exit", Duration::from_secs(20), || {
        status = waiting.try_wait().unwrap();
        status.map(|_| ()).ok_or_else(|| "running".into())
    });
    assert!(status.unwrap().success(), "{status:?}");

    // The server comes up: the router joins and becomes ready.
    let _nats = NatsServerProcess::start(nats_opts).expect("nats-server");
    wait_status(router, "/readyz", 200, Duration::from_secs(60));
    assert!(services.0[0].try_wait().unwrap().is_none());
}
