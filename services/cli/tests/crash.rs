//! Stuck work never stays stuck: two `noetl serve executor` processes, a
//! long task on one of them, SIGKILL — the task is picked up by the other
//! executor within the consumers' ack wait (plus a margin), and the
//! execution completes. While its executor lives, the same long task is
//! never redelivered: in-progress acks keep it there past the ack wait.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use support::{wait_until, Procs};

/// The consumers' ack wait in this test (`NOETL_ACK_WAIT_MS`).
const ACK_WAIT: Duration = Duration::from_millis(2000);

fn noetl(home: &Path) -> Command {
    let mut c = support::noetl(home);
    c.env("NOETL_ACK_WAIT_MS", ACK_WAIT.as_millis().to_string());
    c
}

/// Each run appends the pid of the executor running it, then naps for
/// longer than the ack wait.
const LONG: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: long_task }
workload: { marker: "" }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        args: { marker: "{{ workload.marker }}" }
        code: |
          import os, time
          with open(marker, 'a') as f:
              f.write(str(os.getppid()) + '\n')
          time.sleep(7)
          result = 'slept'
        spec:
          timeout: 60
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { nap: "{{ outcome.result }}" } }
"#;

fn runs(marker: &Path) -> Vec<u32> {
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn a_task_whose_executor_is_killed_runs_on_another_within_the_ack_wait() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let playbook = dir.path().join("long.yaml");
    std::fs::write(&playbook, LONG).unwrap();
    let marker = dir.path().join("runs");

    support::admin_init(noetl(&home), &url);
    let mut services = Procs(Vec::new());
    for service in ["router", "scheduler"] {
        services
            .0
            .push(support::serve(noetl(&home), &url, &[service]));
    }
    let mut executors = Vec::new();
    for _ in 0..2 {
        let child = noetl(&home)
            .args([
                "serve",
                "executor",
                "--kind",
                "python",
                "--concurrency",
                "1",
            ])
            .args(["--nats", &url])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        executors.push(child.id());
        services.0.push(child);
    }

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

    wait_until("the task to start", Duration::from_secs(60), || {
        !runs(&marker).is_empty()
    });
    let first = runs(&marker)[0];
    assert!(
        executors.contains(&first),
        "{first} is not one of {executors:?}"
    );
    // Alive, its executor keeps the task past the ack wait: no second run.
    std::thread::sleep(ACK_WAIT + Duration::from_millis(1500));
    assert_eq!(
        runs(&marker),
        vec![first],
        "redelivered while its executor lived"
    );

    // Crash it: no ack, no drain.
    let killed = Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let at = Instant::now();
    let bound = ACK_WAIT + Duration::from_secs(4);
    wait_until(
        "the task to run on the other executor",
        Duration::from_secs(60),
        || runs(&marker).len() >= 2,
    );
    let took = at.elapsed();
    let second = runs(&marker)[1];
    let other = *executors.iter().find(|p| **p != first).unwrap();
    assert_eq!(second, other, "picked up by the surviving executor");
    assert!(
        took <= bound,
        "picked up {took:?} after the kill; the bound is the ack wait ({ACK_WAIT:?}) plus 4 s"
    );
    eprintln!("redelivered {took:?} after the kill (ack wait {ACK_WAIT:?})");

    // The execution completes on the survivor, with the task's effect once.
    let out = noetl(&home)
        .args(["exec", "status", &id, "--wait", "--json", "--timeout", "60"])
        .args(["--nats", &url])
        .output()
        .unwrap();
    let s: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("exec status: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["ctx"]["nap"], "slept", "{s}");
    assert_eq!(
        runs(&marker).len(),
        2,
        "at-least-once: the interrupted call ran again, once"
    );
}
