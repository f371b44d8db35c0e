//! NoETL's own command-line client (PyPI `noetl`, pinned in the Makefile
//! and installed into `.venv/` by `make setup`) against the API over a real
//! mesh: each command a NoETL user runs daily, with what it prints.
//!
//! The client is found at `NOETL_PY_CLI`, else `<workspace>/.venv/noetl-cli/bin/noetl`;
//! without it the test fails, naming `make setup`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod support;
use support::{Api, FLOW, SLOW};

/// A playbook as NoETL's users write them (NoETL's spellings that load here
/// as written: `desc`, a workload, a python task reading it, `next` arcs).
const NOETL_STYLE: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: noetl_style_greeting
  path: tests/noetl_style_greeting
  description: A greeting, written the way NoETL's fixtures are
workload:
  name: World
workflow:
  - step: start
    desc: Say hello
    tool:
      - name: greet
        kind: python
        args: { name: "{{ workload.name }}" }
        code: |
          result = {"greeting": "Hello, " + name}
    next:
      arcs:
        - step: end
  - step: end
    desc: Done
    tool:
      - name: finish
        kind: noop
        result: done
"#;

/// A playbook of our own in NoETL's dialect (`input`, a bare workload
/// name, `next` as a list), which the server migrates.
const NOETL_DIALECT: &str = include_str!("fixtures/noetl_dialect/sum.yaml");

/// NoETL's client, pointed at one API as one principal.
struct Cli {
    bin: PathBuf,
    server: String,
    token: String,
    home: tempfile::TempDir,
}

/// What a command did.
struct Ran {
    ok: bool,
    out: String,
}

impl Cli {
    fn new(api: &Api, token: &str) -> Self {
        let bin = std::env::var_os("NOETL_PY_CLI")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/noetl-cli/bin/noetl")
            });
        assert!(
            bin.exists(),
            "NoETL's client is not at {} (run `make setup`, which installs the pinned PyPI `noetl` into .venv/, or set NOETL_PY_CLI)",
            bin.display()
        );
        Self {
            bin,
            server: api.base.clone(),
            token: token.to_string(),
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// `noetl --server-url URL ARGS...` with the token in
    /// `NOETL_SESSION_TOKEN` (as NoETL's client reads it).
    async fn run(&self, args: &[&str]) -> Ran {
        let out = tokio::process::Command::new(&self.bin)
            .arg("--server-url")
            .arg(&self.server)
            .args(args)
            .env("HOME", self.home.path())
            .env("NOETL_SESSION_TOKEN", &self.token)
            .env("NO_COLOR", "1")
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ran {
            ok: out.status.success(),
            out: strip_ansi(&text),
        }
    }

    /// Run, asserting success: what it printed.
    async fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args).await;
        assert!(r.ok, "noetl {args:?} failed:\n{}", r.out);
        r.out
    }

    /// Run with `--json` at the end: the JSON it printed (the last line
    /// that parses).
    async fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args).await;
        out.lines()
            .rev()
            .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
            .or_else(|| serde_json::from_str(out.trim()).ok())
            .unwrap_or_else(|| panic!("noetl {args:?} printed no JSON:\n{out}"))
    }

    /// `noetl status ID` until it shows `want` (its human summary).
    async fn status_until(&self, id: &str, want: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.ok(&["status", id]).await;
            if out.contains(&format!("Status:    {want}")) {
                return out;
            }
            assert!(Instant::now() < deadline, "never {want}:\n{out}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `text` without ANSI colour codes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Write `files` (name, text) into a new directory.
fn dir_of(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn noetls_cli_drives_the_api_end_to_end() {
    let (api, keys) = Api::start().await;
    let admin = Cli::new(&api, &keys.admin);
    let files = dir_of(&[
        ("flow.yaml", FLOW),
        ("noetl_style.yaml", NOETL_STYLE),
        ("slow.yaml", SLOW),
    ]);
    let path = |n: &str| files.path().join(n).display().to_string();

    // register: ours, and one written NoETL's way; then a directory.
    let out = admin
        .ok(&["register", "playbook", "-f", &path("flow.yaml")])
        .await;
    assert!(out.contains("tests/api_flow"), "{out}");
    let out = admin
        .ok(&["register", "playbook", "-f", &path("noetl_style.yaml")])
        .await;
    assert!(out.contains("tests/noetl_style_greeting"), "{out}");
    let out = admin
        .ok(&[
            "register",
            "playbook",
            "-d",
            &files.path().display().to_string(),
        ])
        .await;
    assert!(out.contains("3 succeeded, 0 failed"), "{out}");
    // catalog load: one batch request.
    let out = admin
        .ok(&["catalog", "load", &files.path().display().to_string()])
        .await;
    assert!(out.contains("registered 3, failed 0"), "{out}");
    // catalog list / get.
    let out = admin.ok(&["catalog", "list", "Playbook"]).await;
    for p in [
        "tests/api_flow",
        "tests/noetl_style_greeting",
        "tests/api_slow",
    ] {
        assert!(out.contains(p), "{p} missing:\n{out}");
    }
    let out = admin
        .ok(&["catalog", "get", "tests/noetl_style_greeting"])
        .await;
    assert!(out.contains("noetl_style_greeting"), "{out}");
    // A playbook in NoETL's dialect registers as written: the server
    // migrates it, says what it rewrote, and keeps the text sent.
    let dialect = dir_of(&[("sum.yaml", NOETL_DIALECT)]);
    let sum = dialect.path().join("sum.yaml").display().to_string();
    let out = admin.ok(&["register", "playbook", "-f", &sum]).await;
    assert!(
        out.contains(r#""migrated":true"#) && out.contains("`input` → `args`"),
        "{out}"
    );
    let out = admin
        .ok(&["catalog", "get", "tests/noetl_dialect_sum"])
        .await;
    assert!(
        out.contains("original_content") && out.contains("input:"),
        "{out}"
    );

    // run with a payload, then the human status until it shows the end.
    let started = admin
        .json(&[
            "run",
            "tests/noetl_style_greeting",
            "-r",
            "distributed",
            "--payload",
            r#"{"name": "Ada"}"#,
            "--json",
        ])
        .await;
    let id = started["execution_id"].as_str().unwrap().to_string();
    let out = admin.status_until(&id, "COMPLETED").await;
    assert!(out.contains("Steps:     2 completed"), "{out}");
    assert!(out.contains("Duration:"), "{out}");
    let result = api
        .get(
            &format!("/api/executions/{id}/results/start"),
            Some(&keys.viewer),
        )
        .await;
    assert_eq!(
        result.json["result"]["greeting"], "Hello, Ada",
        "{}",
        result.text
    );

    // ehdb: executions, one execution, its events newest first.
    let out = admin.ok(&["ehdb", "query", "executions"]).await;
    assert!(out.contains(&id), "{out}");
    let out = admin.ok(&["ehdb", "query", "execution", &id]).await;
    assert!(out.contains("status:       COMPLETED"), "{out}");
    let out = admin.ok(&["ehdb", "query", "events", &id]).await;
    let completed = out.find("execution.completed").expect("the terminal event");
    let first = out.find("step.").unwrap_or(usize::MAX);
    assert!(completed < first, "newest first:\n{out}");

    // credentials: NoETL's `type: postgres` with `db_*` fields; the data
    // never comes back.
    let secret = "pg-s3cret-7781";
    let cred = json!({"name": "pg_local", "type": "postgres",
        "data": {"db_host": "127.0.0.1", "db_port": 5432, "db_user": "noetl",
                 "db_password": secret, "db_name": "test"}});
    let cred_file = dir_of(&[("pg.json", &cred.to_string())]);
    let cred_path = cred_file.path().join("pg.json").display().to_string();
    let out = admin
        .ok(&["register", "credential", "-f", &cred_path])
        .await;
    assert!(out.contains("postgres_credential"), "{out}");
    let out = admin.ok(&["get", "credential", "pg_local"]).await;
    assert!(
        out.contains("data_withheld") && !out.contains(secret),
        "{out}"
    );

    // rerun: the same playbook and workload.
    let again = admin.json(&["execute", "rerun", &id, "--json"]).await;
    let rerun = again["execution_id"].as_str().unwrap().to_string();
    assert_ne!(rerun, id);
    admin.status_until(&rerun, "COMPLETED").await;

    // cancel a running one.
    let slow = admin
        .json(&[
            "run",
            "tests/api_slow",
            "-r",
            "distributed",
            "--payload",
            r#"{"seconds": 30}"#,
            "--json",
        ])
        .await;
    let slow = slow["execution_id"].as_str().unwrap().to_string();
    let out = admin.ok(&["cancel", &slow, "--reason", "test"]).await;
    assert!(out.contains("Cancelled: 1 execution(s)"), "{out}");
    admin.status_until(&slow, "FAILED").await;

    // cleanup: a dry run, then the KV state of ended executions goes.
    let dry = admin
        .json(&[
            "cleanup",
            "--older-than-minutes",
            "0",
            "--dry-run",
            "--json",
        ])
        .await;
    assert_eq!(dry["cancelled_count"], 3, "{dry}");
    let done = admin
        .json(&["cleanup", "--older-than-minutes", "0", "--json"])
        .await;
    assert_eq!(done["cancelled_count"], 3, "{done}");
    let gone = api
        .get(&format!("/api/executions/{id}/status"), Some(&keys.viewer))
        .await;
    assert_eq!(gone.status, 404);
    let seen = api.seen.lock().unwrap();
    assert!(seen.iter().all(|b| !b.contains(secret)));
}
