//! SIGTERM drains an executor: `noetl serve executor --kind python` as its
//! own process, a slow task in flight, SIGTERM — the task finishes (its
//! `task.done` is published, the execution completes) and the process
//! exits 0.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use support::{noetl, wait_until, Procs};

const SLOW: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: slow_task }
workload: { marker: "" }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        args: { marker: "{{ workload.marker }}" }
        code: |
          import time
          open(marker, 'w').write('started')
          time.sleep(3)
          result = 'slept'
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { nap: "{{ outcome.result }}" } }
"#;

#[test]
fn sigterm_lets_the_running_task_finish_then_exits_0() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let playbook = dir.path().join("slow.yaml");
    std::fs::write(&playbook, SLOW).unwrap();
    let marker = dir.path().join("started");
    let log = dir.path().join("executor.log");

    support::admin_init(noetl(&home), &url);
    let mut services = Procs(Vec::new());
    for service in ["router", "scheduler"] {
        services
            .0
            .push(support::serve(noetl(&home), &url, &[service]));
    }
    let executor = noetl(&home)
        .args([
            "serve",
            "executor",
            "--kind",
            "python",
            "--concurrency",
            "2",
            "--log-format",
            "json",
        ])
        .args(["--nats", &url])
        .env("RUST_LOG", "info,noetl_executor=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = executor.id();
    services.0.push(executor);

    let out = noetl(&home)
        .args(["exec", "start"])
        .arg(&playbook)
        .args(["--json", "--set"])
        .arg(format!("marker={}", marker.display()))
        .args(["--nats", &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = id["execution_id"].as_str().unwrap().to_string();

    // The task is running (it takes 3 s): ask the executor to stop.
    wait_until("the task to start", Duration::from_secs(60), || {
        marker.exists()
    });
    let term = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let signalled = Instant::now();

    // It drains, then exits 0 on its own.
    let executor = services.0.last_mut().unwrap();
    let mut status = None;
    wait_until("the executor to exit", Duration::from_secs(60), || {
        status = executor.try_wait().unwrap();
        status.is_some()
    });
    let status = status.unwrap();
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "exit {status:?}; log:\n{log_text}");
    assert!(
        signalled.elapsed() >= Duration::from_millis(500),
        "it exited at once instead of draining; log:\n{log_text}"
    );
    assert!(
        log_text.contains("drained"),
        "no drain in the log:\n{log_text}"
    );

    // The task finished where it ran: its task.done is in the log and the
    // execution completed with its result.
    let out = noetl(&home)
        .args(["exec", "status", &id, "--wait", "--json", "--timeout", "60"])
        .args(["--nats", &url])
        .output()
        .unwrap();
    let s: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("exec status: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(s["status"], "completed", "{s}; executor log:\n{log_text}");
    assert_eq!(s["ctx"]["nap"], "slept", "{s}");

    // JSON logs: the task's line carries where it ran, as span fields.
    let finished: Value = log_text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["message"] == "task finished")
        .unwrap_or_else(|| panic!("no JSON `task finished` line in:\n{log_text}"));
    let field = |name: &str| {
        finished["spans"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|s| s.get(name).and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| panic!("no {name} in {finished}"))
    };
    assert_eq!(field("execution_id"), id);
    assert_eq!(field("task"), "nap");
    assert!(!field("step_run_id").is_empty());
    assert!(!field("trace_id").is_empty());
    assert!(!field("step").is_empty());

    let mut tail = noetl(&home)
        .args([
            "events",
            "tail",
            "--execution",
            &id,
            "--from-start",
            "--json",
        ])
        .args(["--nats", &url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = tail.kill();
    let out = tail.wait_with_output().unwrap();
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let done = events
        .iter()
        .find(|e| e["event_type"] == "task.done" && e["task"] == "nap")
        .unwrap_or_else(|| panic!("no task.done for nap: {events:#?}"));
    assert_eq!(done["payload"]["status"], "ok", "{done}");
}
