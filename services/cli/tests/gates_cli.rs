//! Concurrency and rate limits from the CLI: `exec why` names the key an
//! execution is queued behind (with its limit, holders and place), and
//! `exec status`, `show` and `list` show it queued, and `validate` /
//! `schema` know the policy fields.

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

mod support;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> (Output, Value) {
    let out = cmd.output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, json)
}

#[test]
fn why_names_the_concurrency_key_a_queued_execution_waits_behind() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["python"]);
    let playbook = fixture("why_gated.yaml");
    let start = |nap: &str| {
        support::exec_start(
            noetl(),
            &url,
            &[playbook.as_str(), "--set", &format!("nap={nap}")],
        )
    };
    let first = start("30");
    support::wait_until("the first execution runs", Duration::from_secs(30), || {
        let (_, json) = run(noetl().args(["exec", "why", &first, "--json", "--nats", &url]));
        json["waits"][0]["reason"]["kind"] == "running"
    });
    let second = start("0.1");
    let mut last = Value::Null;
    support::wait_until("why names the key", Duration::from_secs(30), || {
        let (out, json) = run(noetl().args(["exec", "why", &second, "--json", "--nats", &url]));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        last = json;
        last["waits"][0]["reason"]["kind"] == "concurrency_queue"
    });
    let reason = &last["waits"][0]["reason"];
    assert_eq!(reason["key"], "cust-acme", "{last}");
    assert_eq!(reason["limit"], 1);
    assert_eq!(reason["held_by"], serde_json::json!([first]));
    assert_eq!(reason["position"], 1);
    let (out, _) = run(noetl().args(["exec", "why", &second, "--nats", &url]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "the execution is queued behind concurrency key `cust-acme` (limit 1) held by executions {first}; position 1"
        )),
        "{text}"
    );
    // `exec status`, `show` and `list` say queued too (issue 40), `--json`
    // of `status` keeping `running` with `queued: true`.
    let (out, _) = run(noetl().args(["exec", "status", &second, "--nats", &url]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with(&format!("execution {second}  queued")),
        "{said}"
    );
    assert!(said.contains(&format!("noetl exec why {second}")), "{said}");
    let (_, json) = run(noetl().args(["exec", "status", &second, "--json", "--nats", &url]));
    assert_eq!(
        (&json["status"], &json["queued"]),
        (&Value::from("running"), &Value::from(true)),
        "{json}"
    );
    let (out, _) = run(noetl().args(["exec", "show", &second, "--nats", &url]));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.starts_with(&format!("execution {second}  queued")),
        "{shown}"
    );
    let out = noetl()
        .args([
            "exec", "list", "--json", "--status", "queued", "--nats", &url,
        ])
        .output()
        .unwrap();
    let listed: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["execution_id"], second.as_str());
    assert_eq!(listed[0]["status"], "queued");
    // The first one's end starts the second.
    let (out, _) = run(noetl().args(["exec", "cancel", &first, "--wait", "--nats", &url]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        support::exec_wait(noetl(), &url, &second, 60)["status"],
        "completed"
    );
}

#[test]
fn validate_refuses_bad_limits_naming_the_field_and_schema_shows_them() {
    let home = tempfile::tempdir().unwrap();
    let bad = fixture("gates_bad.yaml");
    let out = support::noetl(home.path())
        .args(["validate", &bad])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for want in [
        format!("{bad}:7:42: error[E004]: `executor.spec.policy.concurrency.on_limit` must be one of `queue`, `reject`, `cancel-oldest`, found `drop`"),
        format!("{bad}:12:31: error[E004]: `spec.policy.concurrency.limit` must be an integer >= 1, found `0`"),
        format!("{bad}:13:42: error[E005]: unknown field `window` in `spec.policy.rate`"),
    ] {
        assert!(text.contains(&want), "want {want}\n{text}");
    }
    let out = support::noetl(home.path()).arg("schema").output().unwrap();
    assert!(out.status.success());
    let schema: Value = serde_json::from_slice(&out.stdout).unwrap();
    let defs = &schema["definitions"];
    let on_limit: Vec<&Value> = defs["OnLimit"]["oneOf"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", defs["OnLimit"]))
        .iter()
        .map(|v| &v["const"])
        .collect();
    assert_eq!(on_limit, ["queue", "reject", "cancel-oldest"]);
    for (def, field) in [
        ("StepPolicy", "concurrency"),
        ("StepPolicy", "rate"),
        ("RateLimit", "per_second"),
        ("ExecutionConcurrency", "on_limit"),
    ] {
        assert!(
            defs[def]["properties"].get(field).is_some(),
            "{def}.{field}: {}",
            defs[def]
        );
    }
    let executor_spec = schema
        .pointer("/definitions/Executor/properties/spec")
        .unwrap();
    assert!(
        executor_spec.to_string().contains("ExecutorSpecShape"),
        "{executor_spec}"
    );
}
