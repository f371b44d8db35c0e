//! Operating executions from the CLI against separate services: `exec why`
//! says what an open token waits for, and `exec retry` starts the same
//! playbook again with the same workload.

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

mod support;
use support::Procs;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> (Output, Value) {
    let out = cmd.output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, json)
}

#[test]
fn why_names_the_kind_a_task_waits_for_and_retry_reruns_with_the_same_workload() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    // No http executor: the `fetch` step's task waits in its kind's queue.
    let mut children = Vec::new();
    for args in [
        vec!["router"],
        vec!["scheduler"],
        vec!["loop-supervisor"],
        vec!["executor", "--kind", "noop"],
        vec!["executor", "--kind", "python"],
    ] {
        let mut c = noetl();
        c.env("NOETL_EXECUTOR_WAIT_MS", "120000");
        children.push(support::serve(c, &url, &args));
    }
    let _services = Procs(children);

    let id = support::exec_start(noetl(), &url, &[fixture("why_http.yaml")]);
    let mut last = Value::Null;
    support::wait_until("why names the http queue", Duration::from_secs(30), || {
        let (out, json) = run(noetl().args(["exec", "why", &id, "--json", "--nats", &url]));
        if out.status.code() == Some(3) {
            return false; // the router, starting too, has not taken the request yet
        }
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        last = json;
        // (`start`'s task may be queued a moment too, for a noop executor
        // still starting on a loaded machine.)
        last["waits"][0]["step"] == "fetch" && last["waits"][0]["reason"]["kind"] == "queued"
    });
    let wait = &last["waits"][0];
    assert_eq!(last["status"], "running");
    assert_eq!(wait["step"], "fetch");
    assert_eq!(wait["reason"]["task"], "get");
    assert_eq!(wait["reason"]["tool"], "http");
    assert_eq!(wait["reason"]["queue"], Value::Null, "{last}");
    let (out, _) = run(noetl().args(["exec", "why", &id, "--nats", &url]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("task `get` is queued for kind http")
            && text.contains("no executor of kind http has ever started"),
        "{text}"
    );
    // Ended: nothing waits.
    let (out, _) = run(noetl().args(["exec", "cancel", &id, "--wait", "--nats", &url]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, ended) = run(noetl().args(["exec", "why", &id, "--json", "--nats", &url]));
    assert_eq!(ended["status"], "cancelled");
    assert_eq!(ended["waits"], serde_json::json!([]));

    // Retry: a new execution of the same playbook (sent inline, from the
    // plan) with the workload the first one ran with.
    let first = support::exec_start(
        noetl(),
        &url,
        &[fixture("hello.yaml").as_str(), "--set", "name=Bo"],
    );
    assert_eq!(
        support::exec_wait(noetl(), &url, &first, 60)["status"],
        "completed"
    );
    let (out, json) = run(noetl().args(["exec", "retry", &first, "--json", "--nats", &url]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = json["execution_id"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    let s = support::exec_wait(noetl(), &url, &second, 60);
    assert_eq!(s["status"], "completed");
    assert_eq!(s["ctx"]["greeting"], "Hello, Bo!");
    // `--as` picks the id, idempotently.
    for _ in 0..2 {
        let (out, json) = run(noetl().args([
            "exec", "retry", &first, "--as", "again-1", "--json", "--nats", &url,
        ]));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(json["execution_id"], "again-1");
    }
    assert_eq!(
        support::exec_wait(noetl(), &url, "again-1", 60)["status"],
        "completed"
    );
    let (out, _) = run(noetl().args(["exec", "retry", "no-such-id", "--nats", &url]));
    assert_eq!(out.status.code(), Some(3), "not found");
}
