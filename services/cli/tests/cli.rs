//! The `noetl` binary end to end: run (embedded), validate, exec, events,
//! serve — each against a real nats-server.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

mod support;
use support::Procs;

fn noetl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_noetl"));
    // A private data dir per test process: no shared JetStream store.
    c.env(
        "NOETL_HOME",
        std::env::temp_dir().join(format!("noetl-cli-test-{}", std::process::id())),
    );
    c.env_remove("NOETL_NATS_URL");
    c
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn run_json_completes_with_ctx_and_set_reaches_workload() {
    let out = noetl()
        .args(["run", "--json", "--timeout", "120"])
        .args([&fixture("hello.yaml"), "--set", "name=Ada"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = json_of(&out);
    assert_eq!(s["status"], "completed");
    assert_eq!(s["ctx"]["greeting"], "Hello, Ada!");
    assert_eq!(s["steps"]["loop"], "done");
    assert_eq!(s["steps"]["end"], "done");
}

#[test]
fn concurrent_runs_with_one_data_dir_do_not_share_a_store() {
    // Both runs find the same NOETL_HOME: one takes the persistent store,
    // the other must fall back to a private one instead of sharing it.
    let spawn = || {
        noetl()
            .args(["run", "--json", "--timeout", "120"])
            .args([&fixture("hello.yaml"), "--set", "name=Bo"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = json_of(&out);
        assert_eq!(s["status"], "completed");
        assert_eq!(s["ctx"]["greeting"], "Hello, Bo!");
    }
}

#[test]
fn a_run_that_finds_the_local_store_taken_says_it_uses_a_temporary_one() {
    let home = tempfile::tempdir().unwrap();
    let lock = std::fs::File::create(home.path().join("nats.lock")).unwrap();
    lock.try_lock().unwrap();
    let out = noetl()
        .env("NOETL_HOME", home.path())
        .args(["run", "--json", "--timeout", "120", &fixture("hello.yaml")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(json_of(&out)["status"], "completed");
    assert!(err.contains("is in use by another run"), "{err}");
    assert!(err.contains("uses a temporary store"), "{err}");
    drop(lock);
}

#[test]
fn run_with_sync_always_completes_on_a_server_that_fsyncs_every_write() {
    let home = tempfile::tempdir().unwrap();
    let out = noetl()
        .env("NOETL_HOME", home.path())
        .args(["run", "--json", "--timeout", "120", "--sync", "always"])
        .args([&fixture("hello.yaml"), "--set", "name=Sy"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_of(&out)["ctx"]["greeting"], "Hello, Sy!");
    // The private server ran from the persistent store with the setting.
    let store = home.path().join("nats");
    let config = std::fs::read_to_string(store.join("nats-server.conf")).unwrap();
    assert!(config.contains("sync_interval: always"), "{config}");
    let log = std::fs::read_to_string(store.join("nats-server.log")).unwrap();
    assert!(log.contains("Using configuration file:"), "{log}");

    // It is a setting of the private server only.
    let out = noetl()
        .args(["run", "--sync", "always", "--nats", "nats://127.0.0.1:1"])
        .arg(fixture("hello.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--sync") && err.contains("--nats"), "{err}");
}

#[test]
fn workload_file_then_set_override_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("w.json");
    std::fs::write(&file, r#"{"name": "File", "extra": 1}"#).unwrap();
    let run = |set: Option<&str>| {
        let mut c = noetl();
        c.args(["run", "--json", "--timeout", "120", &fixture("hello.yaml")])
            .arg("--workload")
            .arg(&file);
        if let Some(s) = set {
            c.args(["--set", s]);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_of(&out)
    };
    assert_eq!(run(None)["ctx"]["greeting"], "Hello, File!");
    assert_eq!(run(Some("name=Set"))["ctx"]["greeting"], "Hello, Set!");
    std::fs::write(&file, "[1, 2]").unwrap();
    let out = noetl()
        .args(["run", &fixture("hello.yaml"), "--workload"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("must hold a JSON object"), "{err}");
    assert!(err.contains("w.json"), "{err}");
}

#[test]
fn run_ignores_noetl_nats_url_and_runs_locally() {
    // A shell set up for a cluster (NOETL_NATS_URL) must not send
    // `noetl run` there, to wait for services that are not watching.
    let out = noetl()
        .env("NOETL_NATS_URL", "nats://127.0.0.1:1")
        .args(["run", "--json", "--timeout", "120", &fixture("hello.yaml")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_of(&out)["status"], "completed");
}

#[test]
fn ctrl_c_cancels_the_run_and_exits_1_with_status_cancelled() {
    let child = noetl()
        .args(["run", "--json", "--timeout", "120", &fixture("slow.yaml")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The python task sleeps 10 s; interrupt while it runs.
    std::thread::sleep(Duration::from_secs(3));
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = json_of(&out);
    assert_eq!(s["status"], "cancelled", "{s}");
    assert_ne!(s["steps"]["after"], "done", "{s}");
}

#[test]
fn a_failing_playbook_exits_1_with_status_failed() {
    let out = noetl()
        .args(["run", "--json", "--timeout", "120", &fixture("fails.yaml")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = json_of(&out);
    assert_eq!(s["status"], "failed");
    assert!(
        s["error"].as_str().unwrap().contains("RuntimeError: kaput"),
        "{s}"
    );
}

#[test]
fn an_invalid_playbook_is_refused_with_its_line() {
    let out = noetl()
        .args(["run", &fixture("invalid.yaml")])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a playbook that does not load: usage"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid.yaml:11:17: error[E030]"), "{err}");
    let out = noetl()
        .args([
            "validate",
            "--format",
            "json",
            &fixture("invalid.yaml"),
            &fixture("hello.yaml"),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let d = json_of(&out);
    assert_eq!(d[0]["code"], "E030");
    assert_eq!(d[0]["line"], 11);
}

/// What `noetl events tail --execution ID --from-start --json` (plus
/// `extra` flags) prints within 1.5 s, one JSON object per line.
fn tail_events(url: &str, id: &str, extra: &[&str]) -> Vec<Value> {
    let mut tail = noetl()
        .args([
            "events",
            "tail",
            "--execution",
            id,
            "--from-start",
            "--json",
        ])
        .args(extra)
        .args(["--nats", url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = tail.kill();
    let out = tail.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn exec_start_status_and_events_tail_against_separate_services() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let mut children = Vec::new();
    for args in [
        vec!["router"],
        vec!["scheduler"],
        vec!["loop-supervisor"],
        vec!["executor", "--kind", "noop"],
        vec!["executor", "--kind", "python"],
    ] {
        children.push(support::serve(noetl(), &url, &args));
    }
    let _services = Procs(children);
    let id = support::exec_start(
        noetl(),
        &url,
        &[fixture("hello.yaml").as_str(), "--set", "name=Bo"],
    );
    let s = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(s["status"], "completed");
    assert_eq!(s["ctx"]["greeting"], "Hello, Bo!");

    let lines = tail_events(&url, &id, &[]);
    assert_eq!(lines.first().unwrap()["event_type"], "playbook.initialized");
    assert_eq!(lines.last().unwrap()["event_type"], "execution.completed");
    assert!(lines.iter().all(|l| l["execution_id"] == id.as_str()));

    // --type filters by event type (a glob).
    let types: Vec<String> = tail_events(&url, &id, &["--type", "step.*"])
        .iter()
        .map(|l| l["event_type"].as_str().unwrap().to_string())
        .collect();
    assert!(types.iter().any(|t| t == "step.done"), "{types:?}");
    assert!(types.iter().all(|t| t.starts_with("step.")), "{types:?}");
    // A one-task step's `task.done` is stored inside its `step.done`: the
    // type finds it all the same.
    let done = tail_events(&url, &id, &["--type", "task.done"]);
    assert!(!done.is_empty());
    assert!(
        done.iter().all(|l| l["event_type"] == "task.done"),
        "{done:?}"
    );

    // A loop window stored in batches is read as its iterations: by their
    // own types, and by the batches'.
    let lp = support::exec_start(noetl(), &url, &[fixture("batched.yaml").as_str()]);
    let s = support::exec_wait(noetl(), &url, &lp, 60);
    assert_eq!(s["status"], "completed", "{s}");
    let ended = tail_events(&url, &lp, &["--type", "loop.iteration.done"]);
    assert_eq!(ended.len(), 12, "{ended:?}");
    let batched = tail_events(&url, &lp, &["--type", "batch.*"]);
    let of = |t: &str| batched.iter().filter(|l| l["event_type"] == t).count();
    assert_eq!(
        (of("loop.iteration.started"), of("loop.iteration.done")),
        (12, 12),
        "{batched:?}"
    );
    assert_eq!(of("task.done") + 24, batched.len(), "{batched:?}");

    // Commands that end by themselves: --until-done, --no-follow, --count.
    let tail = |extra: &[&str]| {
        noetl()
            .args(["events", "tail", "--json", "--nats", &url])
            .args(extra)
            .output()
            .unwrap()
    };
    let lines = |out: &Output| -> Vec<Value> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let out = tail(&["--execution", &id, "--until-done"]);
    assert_eq!(out.status.code(), Some(0), "completed: exit 0");
    let all = lines(&out);
    assert_eq!(all.last().unwrap()["event_type"], "execution.completed");
    let out = tail(&[
        "--execution",
        &id,
        "--from-start",
        "--no-follow",
        "--type",
        "step.*",
    ]);
    assert!(out.status.success());
    let steps = lines(&out);
    assert!(!steps.is_empty());
    assert!(steps
        .iter()
        .all(|l| l["event_type"].as_str().unwrap().starts_with("step.")));
    let out = tail(&["--execution", &id, "--from-start", "--count", "2"]);
    assert_eq!(lines(&out).len(), 2, "--count 2 prints two events");
    let out = tail(&["--execution", &id, "--since", "1h", "--no-follow"]);
    assert_eq!(
        lines(&out).len(),
        all.len(),
        "--since 1h sees the whole execution"
    );
    let third = all[2]["seq"].as_u64().unwrap();
    let out = tail(&[
        "--execution",
        &id,
        "--from-seq",
        &third.to_string(),
        "--no-follow",
    ]);
    let from = lines(&out);
    assert_eq!(from[0]["seq"].as_u64(), Some(third));
    assert_eq!(from.len(), all.len() - 2);
    let out = tail(&["--since", "ten minutes", "--no-follow"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected a duration"));
    let out = tail(&["--until-done"]);
    assert_eq!(out.status.code(), Some(2), "--until-done needs --execution");
    // A failed execution: --until-done exits 1.
    let failing = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../playbooks/failure_unhandled.yaml"
    );
    let out = noetl()
        .args(["exec", "start", failing, "--json", "--nats", &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed_id = json_of(&out)["execution_id"].as_str().unwrap().to_string();
    let out = tail(&[
        "--execution",
        &failed_id,
        "--until-done",
        "--type",
        "step.*",
    ]);
    assert_eq!(out.status.code(), Some(1), "failed: exit 1");
    let shown = lines(&out);
    assert!(shown
        .iter()
        .all(|l| l["event_type"].as_str().unwrap().starts_with("step.")));

    // exec list: newest first, filtered by status.
    let list = |extra: &[&str]| {
        let out = noetl()
            .args(["exec", "list", "--json", "--nats", &url])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines(&out)
    };
    let all = list(&[]);
    let ids: Vec<&str> = all
        .iter()
        .map(|r| r["execution_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [failed_id.as_str(), lp.as_str(), id.as_str()],
        "newest first"
    );
    assert_eq!(all[2]["status"], "completed");
    assert!(all[2]["duration_ms"].as_i64().unwrap() >= 0);
    let failed = list(&["--status", "failed"]);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["execution_id"], failed_id.as_str());
    assert_eq!(list(&["--limit", "1"]).len(), 1);

    // exec show: the execution as a tree of steps and tasks.
    let out = noetl()
        .args(["exec", "show", &id, "--json", "--nats", &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = json_of(&out);
    assert_eq!(tree["status"], "completed");
    let steps: Vec<&str> = tree["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert!(steps.contains(&"start"), "{steps:?}");
    assert!(
        tree["steps"][0]["runs"][0]["tasks"][0]["runs"]
            .as_u64()
            .unwrap()
            >= 1
    );
    let out = noetl()
        .args(["exec", "show", &failed_id, "--nats", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a failed execution: exit 1");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("failed") && text.contains("step "), "{text}");
    let out = noetl()
        .args(["exec", "show", "no-such-id", "--nats", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "not found");

    for cmd in ["status", "cancel"] {
        let out = noetl()
            .args(["exec", cmd, "no-such-id", "--nats", &url])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "exec {cmd}: not found");
        assert!(String::from_utf8_lossy(&out.stderr).contains("no execution \"no-such-id\""));
    }
    // exec cancel --json on an ended execution: nothing requested.
    let out = noetl()
        .args(["exec", "cancel", &id, "--json", "--nats", &url])
        .output()
        .unwrap();
    assert!(out.status.success());
    let c = json_of(&out);
    assert_eq!(c["execution_id"], id.as_str());
    assert_eq!(c["requested"], false);
    assert_eq!(c["status"], "completed");
    let out = noetl()
        .args(["serve", "executor", "--kind", "nope", "--nats", &url])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown tool kind \"nope\""));
}

#[test]
fn credentials_resolve_where_used_and_never_leak() {
    let home = tempfile::tempdir().unwrap();
    let cli = || {
        let mut c = noetl();
        c.env("NOETL_HOME", home.path())
            .env_remove("NOETL_SECRET_KEY")
            .env_remove("NOETL_SECRET_KEY_FILE")
            .env("RUST_LOG", "debug");
        c
    };
    let token = "tok-S3CRET-0123456789";
    let password = "pw-Hunter2-Zz";
    let put = |name: &str, kind: &str, body: serde_json::Value| {
        let f = home.path().join(format!("{name}.json"));
        std::fs::write(&f, body.to_string()).unwrap();
        let out = cli()
            .args(["credential", "put", name, "--kind", kind, "--from-file"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::remove_file(&f).unwrap();
    };
    put("api_token", "bearer", serde_json::json!({ "token": token }));
    put(
        "db",
        "basic",
        serde_json::json!({"username": "app", "password": password}),
    );
    let api_key = "key-Partner-77441";
    let signing = "sig-Value-55310";
    let pg_password = "pg-Warehouse-90210";
    put("partner", "api_key", serde_json::json!({ "key": api_key }));
    put("signing", "secret", serde_json::json!({ "value": signing }));
    put(
        "warehouse",
        "postgres_credential",
        serde_json::json!({"host": "127.0.0.1", "user": "postgres", "password": pg_password, "database": "test"}),
    );

    let list = cli()
        .args(["credential", "list", "--json"])
        .output()
        .unwrap();
    let listed = json_of(&list);
    assert_eq!(listed[0]["name"], "api_token");
    assert_eq!(listed[1]["kind"], "basic");
    assert_eq!(listed.as_array().unwrap().len(), 5);

    let out = cli()
        .args(["run", "--json", "--timeout", "120"])
        .arg(fixture("keychain_python.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let s = json_of(&out);
    // The secrets reached the task...
    assert_eq!(s["ctx"]["token_len"], token.len());
    assert_eq!(s["ctx"]["pw_len"], password.len());
    // ...and nothing that left it carries them.
    assert_eq!(s["ctx"]["echoed"], "[redacted]");
    assert_eq!(s["ctx"]["direct"], "[redacted]");
    assert!(
        s["ctx"]["boom"]
            .as_str()
            .unwrap()
            .contains("bad token [redacted]"),
        "{s}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    // Every byte the run left behind: the JetStream store (events, KV, the
    // credentials bucket), the logs, the printed summary.
    let mut haystack = stdout + &stderr;
    for entry in walk(home.path()) {
        haystack.push_str(&String::from_utf8_lossy(&std::fs::read(entry).unwrap()));
    }
    // Every kind reached its task, and came back redacted.
    assert_eq!(s["ctx"]["more"]["key"], "[redacted]", "{s}");
    assert_eq!(s["ctx"]["more"]["signing"], "[redacted]", "{s}");
    assert_eq!(s["ctx"]["row"]["who"], "postgres", "{s}");
    assert_eq!(s["ctx"]["row"]["echoed"], "[redacted]", "{s}");
    for secret in [token, password, api_key, signing, pg_password] {
        if let Some(at) = haystack.find(secret) {
            let from = haystack[..at]
                .char_indices()
                .rev()
                .nth(300)
                .map(|(i, _)| i)
                .unwrap_or(0);
            let context: String = haystack[from..].chars().take(400).collect();
            panic!("secret {secret:?} leaked: ...{context}...");
        }
    }
    assert!(haystack.contains("task.done"), "the store was searched");

    // A declared credential that is not stored fails before the first step.
    let out = cli()
        .args(["credential", "delete", "db", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        json_of(&out),
        serde_json::json!({"name": "db", "deleted": true})
    );
    let out = cli().args(["credential", "delete", "db"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "deleting what is not stored: not found"
    );
    let out = cli()
        .args(["run", "--json", "--timeout", "120"])
        .arg(fixture("keychain_python.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = json_of(&out);
    let err = s["error"].as_str().unwrap();
    assert!(
        err.contains("keychain cannot be resolved") && err.contains("`db` (basic) is not stored"),
        "{err}"
    );
    assert_eq!(s["steps"]["start"], serde_json::Value::Null, "{s}");
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn playbooks_register_list_show_and_run_by_path_from_the_local_store() {
    let home = tempfile::tempdir().unwrap();
    let cli = || {
        let mut c = noetl();
        c.env("NOETL_HOME", home.path());
        c
    };
    // Two versions: the second differs in its workload default.
    let v1 = std::fs::read_to_string(fixture("catalog_v.yaml")).unwrap();
    let v2_file = home.path().join("v2.yaml");
    std::fs::write(&v2_file, v1.replace("{ v: 1 }", "{ v: 2 }")).unwrap();
    for (file, version) in [
        (fixture("catalog_v.yaml"), 1),
        (v2_file.display().to_string(), 2),
    ] {
        let out = cli()
            .args(["playbook", "register", "--json", &file])
            .output()
            .unwrap();
        let r = json_of(&out);
        assert_eq!(r["path"], "demo/catalogued");
        assert_eq!(r["version"], version);
    }
    let list = json_of(&cli().args(["playbook", "list", "--json"]).output().unwrap());
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["version"], 2);

    let show = cli()
        .args(["playbook", "show", "demo/catalogued", "--version", "1"])
        .output()
        .unwrap();
    assert!(show.status.success());
    assert_eq!(String::from_utf8_lossy(&show.stdout), v1);

    let run = |extra: &[&str]| {
        let out = cli()
            .args(["run", "--json", "--timeout", "120", "demo/catalogued"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_of(&out)["ctx"]["v"].clone()
    };
    assert_eq!(run(&[]), 2, "latest");
    assert_eq!(run(&["--version", "1"]), 1, "pinned");

    // Unknown path: the execution fails and says how to register.
    let out = cli()
        .args(["run", "--json", "--timeout", "120", "demo/missing"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let s = json_of(&out);
    assert_eq!(s["status"], "failed");
    assert!(
        s["error"]
            .as_str()
            .unwrap()
            .contains("noetl playbook register"),
        "{s}"
    );
    // Registering needs metadata.path.
    let no_path = home.path().join("nopath.yaml");
    std::fs::write(&no_path, v1.replace(", path: demo/catalogued", "")).unwrap();
    let out = cli()
        .args(["playbook", "register"])
        .arg(&no_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "usage");
    assert!(String::from_utf8_lossy(&out.stderr).contains("metadata.path"));
    // Unknown version on show.
    let out = cli()
        .args(["playbook", "show", "demo/catalogued", "--version", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "not found");
    assert!(String::from_utf8_lossy(&out.stderr).contains("version 9"));
}

/// Processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

#[test]
fn only_an_executor_serving_python_starts_interpreters() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let spawn = |args: &[&str]| {
        noetl()
            .args(args)
            .args(["--nats", &url])
            .env("NOETL_PYTHON_WARM", "2")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let services = Procs(vec![
        spawn(&["serve", "router"]),
        spawn(&["serve", "executor", "--kind", "noop"]),
        spawn(&["serve", "executor", "--kind", "python"]),
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while children_of(services.0[2].id()).len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the python executor never warmed its interpreters"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The others had as long, and a moment more, to start any.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(children_of(services.0[0].id()), Vec::<u32>::new(), "router");
    assert_eq!(
        children_of(services.0[1].id()),
        Vec::<u32>::new(),
        "noop executor"
    );
}

#[test]
fn events_decode_prints_a_raw_message_from_stdin() {
    use std::io::Write;
    let ev = noetl_wire::Event {
        event_id: "ev1".into(),
        event_type: "step.done".into(),
        execution_id: "e1".into(),
        step: "start".into(),
        payload_json: br#"{"status":"ok","result":42}"#.to_vec(),
        ..Default::default()
    };
    let decode = |input: &[u8], extra: &[&str]| {
        let mut child = noetl()
            .args(["events", "decode"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = decode(&noetl_mesh::codec::encode(&ev), &["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_eq!(v["event_type"], "step.done");
    assert_eq!(v["payload"]["result"], 42);
    let out = decode(&noetl_mesh::codec::event_json(&ev).unwrap(), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("step.done") && text.contains("result=42"),
        "{text}"
    );
    let out = decode(b"garbage\n", &[]);
    assert_eq!(out.status.code(), Some(2), "bad input: usage");
    assert!(String::from_utf8_lossy(&out.stderr).contains("stdin line 1"));
}

#[test]
fn completions_generate_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef noetl"),
        ("fish", "complete -c noetl"),
    ] {
        let out = noetl().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script:.200}");
        for sub in ["validate", "exec", "events", "credential"] {
            assert!(script.contains(sub), "{shell} completes `{sub}`");
        }
    }
    let out = noetl().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "an unknown shell: usage");
}

#[test]
fn exit_codes_tell_timeout_and_unreachable_nats_apart() {
    // A run that outlives its --timeout: 4.
    let out = noetl()
        .args(["run", "--timeout", "1", &fixture("slow.yaml")])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing listens on the port: 5.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = noetl()
        .args([
            "exec",
            "list",
            "--nats",
            &format!("nats://127.0.0.1:{port}"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Flags clap refuses: 2.
    let out = noetl()
        .args(["exec", "list", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn an_id_or_signal_name_that_cannot_be_one_is_refused_before_nats_is_read() {
    // Nothing listens there: a command that got as far as NATS would
    // exit 5 (or ride out a failover for 60 s), not 2 at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nats = format!("nats://127.0.0.1:{port}");
    let cases: &[(&[&str], &str)] = &[
        (&["exec", "status", "abc,"], "abc,"),
        (&["exec", "cancel", "a.b"], "a.b"),
        (&["exec", "show", "*"], "*"),
        (&["exec", "why", "_mesh"], "_mesh"),
        (&["exec", "pause", "a b"], "a b"),
        (&["exec", "retry", "ok-id", "--as", "x>"], "x>"),
        (&["exec", "resume", ">"], ">"),
        (&["events", "export", "*"], "*"),
        (&["events", "tail", "--execution", "e.*"], "e.*"),
        (&["exec", "signal", "ok-id", "approval.v2"], "approval.v2"),
    ];
    for (args, bad) in cases {
        let started = std::time::Instant::now();
        let out = noetl()
            .args(*args)
            .args(["--nats", &nats])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{args:?} took {:?}",
            started.elapsed()
        );
        assert!(stderr.contains(&format!("'{bad}'")), "{args:?}: {stderr}");
        assert!(
            stderr.contains("1-128 characters of [A-Za-z0-9_-]"),
            "{args:?}: {stderr}"
        );
    }
    let signal = noetl()
        .args(["exec", "signal", "ok-id", "approval.v2", "--nats", &nats])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&signal.stderr);
    assert!(stderr.contains("<NAME>"), "names the argument: {stderr}");
    assert!(stderr.contains("not a signal name"), "{stderr}");
}
