//! A new user's first hour (issue 40), one test per stumble, each the
//! scenario as the user met it, asserting what they see now: an error a
//! catch-all rule swallowed, a failed loop's cause, `validate` catching what
//! `run` refuses, an unreachable NATS, the README's mesh recipe as written,
//! `events tail | head`, a paused execution, a failed execution's `show` and
//! `why`, the local store against `NOETL_NATS_URL`, the run summary's order,
//! a join that never started in an execution that completed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use support::Procs;

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A playbook file `name` holding `yaml`, in `dir`.
fn playbook(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, yaml).unwrap();
    p
}

/// What `noetl run` of a playbook holding `yaml`, written into `dir`,
/// printed (its home `dir/home`).
fn run_playbook(dir: &Path, yaml: &str) -> Output {
    let file = playbook(dir, "playbook.yaml", yaml);
    support::noetl(&dir.join("home"))
        .arg("run")
        .arg(&file)
        .output()
        .unwrap()
}

/// The execution id of `noetl run`'s summary (`execution ID  STATUS ...`).
fn run_id(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("execution "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no execution line in:\n{out}"))
        .to_string()
}

/// The policy pattern of `playbooks/hello.yaml` (as it was) on a python
/// task with a NameError; the next step loops over what it set.
const SWALLOWED: &str = r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: swallowed }
workflow:
  - step: compute
    tool:
      - name: calc
        kind: python
        code: |
          result = [1, 2, totl]
        spec:
          policy:
            rules:
              - else:
                  then:
                    do: continue
                    set_ctx:
                      total: "{{ outcome.result }}"
    next:
      arcs:
        - step: total
  - step: total
    loop:
      in: "{{ ctx.total }}"
      iterator: n
    tool:
      - name: show
        kind: noop
        result: "{{ iter.n }}"
"#;

#[test]
fn a_python_error_a_catch_all_rule_went_on_after_is_shown_as_a_handled_error() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let file = playbook(dir.path(), "swallowed.yaml", SWALLOWED);
    // `validate` warns of the trap, and says how to mean it.
    let out = support::noetl(&home)
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("warning[W109]"), "{}", text(&out));
    assert!(
        stdout(&out).contains("outcome.status == 'error'"),
        "{}",
        text(&out)
    );
    let out = support::noetl(&home)
        .args(["run", "--timeout", "120"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let s = stdout(&out);
    assert!(
        s.contains(
            "handled error: compute.calc: python.exception: NameError: name 'totl' is not defined"
        ),
        "the NameError is shown:\n{s}"
    );
    assert!(
        s.contains("failed: step total: loop.in"),
        "and the failure it caused:\n{s}"
    );
    // The same in --json, and in `exec show` of the execution afterwards.
    let out = support::noetl(&home)
        .args(["run", "--json", "--timeout", "120"])
        .arg(&file)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let handled = &v["problems"]["handled"][0];
    assert_eq!(handled["step"], "compute", "{v}");
    assert_eq!(handled["action"], "continue", "{v}");
    assert!(
        handled["message"].as_str().unwrap().contains("NameError"),
        "{v}"
    );
    let id = v["execution_id"].as_str().unwrap();
    let show = support::noetl(&home)
        .args(["exec", "show", id, "--local"])
        .output()
        .unwrap();
    assert!(
        stdout(&show).contains("handled error: compute.calc"),
        "{}",
        text(&show)
    );
}

/// A python task's error a catch-all rule continues after, then a `noop`
/// task of the same step: the pipeline is handed to another executor
/// between the error and the step's end.
const HANDED_OFF: &str = r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: handed_off }
workflow:
  - step: compute
    tool:
      - name: calc
        kind: python
        code: |
          result = [1, 2, totl]
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue }
      - name: after
        kind: noop
        result: 7
    next:
      arcs:
        - step: each
  - step: each
    loop:
      in: [1, 2, 3]
      iterator: n
    tool:
      - name: risky
        kind: python
        args: { n: "{{ iter.n }}" }
        code: |
          result = n / (n - 2)
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue }
"#;

/// The step record of `step` of execution `eid`, read from KV.
fn step_record(url: &str, home: &Path, eid: &str, step: &str) -> Value {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mesh = noetl_mesh::Mesh::attach(noetl_mesh::MeshConfig {
            nats_url: url.to_string(),
            data_dir: home.to_path_buf(),
            ..noetl_mesh::MeshConfig::default()
        })
        .await
        .unwrap();
        noetl_mesh::kv::get::<Value>(mesh.exec_kv(), &noetl_mesh::keys::Keys::step(eid, step))
            .await
            .unwrap()
            .unwrap_or(Value::Null)
    })
}

#[test]
fn a_handled_error_is_in_the_step_record_after_a_hand_off_and_replays_equal() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (server, _procs) = mesh(&home);
    let url = server.url();
    let file = playbook(dir.path(), "handed_off.yaml", HANDED_OFF);
    let id = support::exec_start(support::noetl(&home), &url, &[file]);
    let end = support::exec_wait(support::noetl(&home), &url, &id, 120);
    assert_eq!(end["status"], "completed", "{end}");
    // The step went on, so it is done; its record keeps the error.
    let record = step_record(&url, &home, &id, "compute");
    assert_eq!(record["status"], "done", "{record}");
    let handled = &record["handled"][0];
    assert_eq!(
        (&handled["task"], &handled["kind"], &handled["action"]),
        (
            &Value::from("calc"),
            &Value::from("python.exception"),
            &Value::from("continue")
        ),
        "{record}"
    );
    assert!(
        handled["message"]
            .as_str()
            .unwrap()
            .contains("NameError: name 'totl' is not defined"),
        "{record}"
    );
    // A loop step's record keeps its iterations' handled errors.
    let each = step_record(&url, &home, &id, "each");
    assert_eq!(each["status"], "done", "{each}");
    let handled = &each["handled"][0];
    assert_eq!(
        (&handled["task"], &handled["times"]),
        (&Value::from("risky"), &Value::from(1)),
        "{each}"
    );
    assert!(
        handled["message"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError"),
        "{each}"
    );
    // The fold of the event log gives the same records.
    let replay = support::noetl(&home)
        .args(["exec", "replay", &id, "--json", "--nats", &url])
        .output()
        .unwrap();
    assert!(replay.status.success(), "{}", text(&replay));
    let report: Value = serde_json::from_slice(&replay.stdout).unwrap();
    assert_eq!(report["equal"], true, "{report}");
    // `exec show` says it beside its tree.
    let show = support::noetl(&home)
        .args(["exec", "show", &id, "--nats", &url])
        .output()
        .unwrap();
    assert!(
        stdout(&show).contains("handled error: compute.calc: python.exception: NameError"),
        "{}",
        text(&show)
    );
}

const FAILING_LOOP: &str = r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: failing_loop }
workflow:
  - step: each
    loop:
      in: [1, 2, 3, 4]
      iterator: n
    tool:
      - name: work
        kind: python
        args: { n: "{{ iter.n }}" }
        code: |
          raise ValueError("bad item %d" % n)
"#;

#[test]
fn a_failed_loop_prints_its_first_failed_iterations_and_stays_readable_after_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let file = playbook(dir.path(), "failing_loop.yaml", FAILING_LOOP);
    let out = support::noetl(&home)
        .args(["run", "--timeout", "120"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let s = stdout(&out);
    assert!(s.contains("iteration(s) failed; the first:"), "{s}");
    assert!(
        s.contains("each[0].work: python.exception: ValueError: bad item 1"),
        "the first failed iteration with its error:\n{s}"
    );
    let id = run_id(&s);
    assert!(
        s.contains(&format!("look at it again: noetl exec show {id} --local")),
        "{s}"
    );
    // As it says: the run's store is kept, and read with --local.
    let show = support::noetl(&home)
        .args(["exec", "show", &id, "--local"])
        .output()
        .unwrap();
    assert_eq!(show.status.code(), Some(1), "{}", text(&show));
    let shown = stdout(&show);
    assert!(
        shown.contains(&format!("execution {id}  failed")),
        "{shown}"
    );
    assert!(
        shown.contains("each[0].work: python.exception: ValueError"),
        "{shown}"
    );
    // `why` names its error and the resume that goes on.
    let why = support::noetl(&home)
        .args(["exec", "why", &id, "--local"])
        .output()
        .unwrap();
    assert!(
        stdout(&why).contains(&format!("noetl exec resume {id}")),
        "{}",
        text(&why)
    );
}

#[test]
fn validate_refuses_an_unknown_reducer_as_run_does_and_warns_of_a_misspelt_workload_key() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let reducer = playbook(
        dir.path(),
        "reducer.yaml",
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: reducer }
workflow:
  - step: each
    loop:
      in: [1, 2]
      iterator: n
      spec:
        mode: parallel
        policy:
          reducers:
            total: add
    tool:
      - name: t
        kind: noop
        result: "{{ iter.n }}"
"#,
    );
    let out = support::noetl(&home)
        .args(["validate"])
        .arg(&reducer)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stdout(&out).contains("error[E045]: unknown reducer `add` for ctx key `total`"),
        "{}",
        text(&out)
    );
    // `run` refuses it before anything starts, with the same diagnostic.
    let out = support::noetl(&home)
        .arg("run")
        .arg(&reducer)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("E045"), "{}", text(&out));

    let typo = playbook(
        dir.path(),
        "typo.yaml",
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: typo }
workload:
  threshold: 3
workflow:
  - step: start
    tool: { kind: noop, result: 5 }
    next:
      arcs:
        - step: big
          when: "{{ workload.treshold > 2 }}"
  - step: big
"#,
    );
    let out = support::noetl(&home)
        .args(["validate"])
        .arg(&typo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = stdout(&out);
    assert!(said.contains("warning[W106]"), "{said}");
    assert!(said.contains("did you mean `workload.threshold`"), "{said}");
}

#[test]
fn an_unreachable_nats_fails_at_once_with_one_line_and_exit_5() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("nats://127.0.0.1:{}", support::free_port());
    let started = Instant::now();
    let out = support::noetl(dir.path())
        .args(["exec", "status", "some-id", "--nats", &url])
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line:\n{err}");
    assert!(
        err.contains(&format!("cannot reach NATS at {url}")),
        "{err}"
    );
    assert!(err.contains("nats-server -js"), "what to check:\n{err}");
    assert_eq!(err.to_lowercase().matches("refused").count(), 1, "{err}");
}

/// The block between `<!-- mesh-recipe -->` and `<!-- /mesh-recipe -->`
/// of the README, without its fences.
fn readme_recipe() -> String {
    let readme = std::fs::read_to_string(noetl_integration::repo_root().join("README.md")).unwrap();
    let start = readme
        .find("<!-- mesh-recipe -->")
        .expect("the recipe's marker");
    let end = readme
        .find("<!-- /mesh-recipe -->")
        .expect("its end marker");
    readme[start..end]
        .lines()
        .filter(|l| !l.starts_with("<!--") && !l.starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_readme_mesh_recipe_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    // As written, but on a free port (4222 may be taken on this machine).
    let port = support::free_port();
    let recipe = readme_recipe();
    assert!(recipe.contains("nats-server -js"), "{recipe}");
    let script = recipe.replace("4222", &port.to_string());
    let bin = |p: &Path| p.parent().unwrap().to_path_buf();
    let noetl = PathBuf::from(env!("CARGO_BIN_EXE_noetl"));
    let nats = noetl_mesh::server::find_binary(None).expect("nats-server");
    let path = format!(
        "{}:{}:{}",
        bin(&noetl).display(),
        bin(&nats).display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = dir.path().join("recipe.log");
    let mut child = Command::new("bash")
        .args(["-e", "-c", &script])
        .current_dir(noetl_integration::repo_root())
        .env("HOME", dir.path())
        .env("NOETL_HOME", dir.path().join("noetl"))
        .env("PATH", path)
        .env_remove("NOETL_NATS_URL")
        .env_remove("NOETL_HTTP_ADDR")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = child.id();
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The recipe leaves its servers running: stop the whole group.
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{group}")])
        .status();
    let _ = child.wait();
    support::wait_until(
        "the recipe's servers to stop",
        Duration::from_secs(30),
        || {
            !Command::new("kill")
                .args(["-0", "--", &format!("-{group}")])
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success()
        },
    );
    let said = std::fs::read_to_string(&log).unwrap();
    let status = status.unwrap_or_else(|| panic!("the recipe did not end in 180 s:\n{said}"));
    assert!(status.success(), "the recipe failed ({status:?}):\n{said}");
    assert!(said.contains("completed"), "{said}");
    assert!(said.contains("HELLO, WORLD!"), "{said}");
}

use std::os::unix::process::{CommandExt, ExitStatusExt};

#[test]
fn events_tail_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let hello = noetl_integration::repo_root().join("playbooks/hello.yaml");
    let run = || {
        let out = support::noetl(&home)
            .args(["run", "--nats", &url])
            .arg(&hello)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
    };
    run();
    let mut tail = support::noetl(&home)
        .args(["events", "tail", "--from-start", "--nats", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: one line read, then the pipe closed.
    let mut first = String::new();
    BufReader::new(tail.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty());
    // New events make it write again, into the closed pipe.
    let mut status = None;
    for _ in 0..10 {
        run();
        std::thread::sleep(Duration::from_millis(300));
        status = tail.try_wait().unwrap();
        if status.is_some() {
            break;
        }
    }
    let Some(status) = status else {
        let _ = tail.kill();
        panic!("events tail went on writing into a closed pipe");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut tail.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.is_empty(), "quietly: {err}");
    assert_eq!(
        status.signal(),
        Some(13),
        "ended by SIGPIPE, as cat is: {status:?}"
    );
}

/// A mesh of separate services on a test server (`noop` and `python`
/// executors).
fn mesh(home: &Path) -> (noetl_testkit::TestServer, Procs) {
    let server = noetl_testkit::TestServer::start();
    support::admin_init(support::noetl(home), &server.url());
    let procs = support::mesh_services(home, &server.url(), &["noop", "python"]);
    (server, procs)
}

#[test]
fn a_paused_execution_shows_as_paused_in_exec_status_and_exec_show() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (server, _procs) = mesh(&home);
    let url = server.url();
    let slow = format!("{}/tests/fixtures/slow.yaml", env!("CARGO_MANIFEST_DIR"));
    let id = support::exec_start(support::noetl(&home), &url, &[slow]);
    // Paused once the router has it (a pause of an unknown id is refused).
    support::wait_until("the execution to start", Duration::from_secs(30), || {
        support::noetl(&home)
            .args(["exec", "status", &id, "--nats", &url])
            .output()
            .unwrap()
            .status
            .success()
    });
    let out = support::noetl(&home)
        .args([
            "exec",
            "pause",
            &id,
            "--reason",
            "db maintenance",
            "--nats",
            &url,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));

    let status = support::noetl(&home)
        .args(["exec", "status", &id, "--nats", &url])
        .output()
        .unwrap();
    let said = stdout(&status);
    assert!(said.contains(&format!("execution {id}  paused")), "{said}");
    assert!(said.contains("db maintenance"), "{said}");
    assert!(said.contains(&format!("noetl exec unpause {id}")), "{said}");
    let json = support::noetl(&home)
        .args(["exec", "status", &id, "--json", "--nats", &url])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["status"], "running", "{v}");
    assert_eq!(v["paused"]["reason"], "db maintenance", "{v}");
    let show = support::noetl(&home)
        .args(["exec", "show", &id, "--nats", &url])
        .output()
        .unwrap();
    let shown = stdout(&show);
    assert!(
        shown.starts_with(&format!("execution {id}  paused")),
        "{shown}"
    );
    // `exec list` says so too, and lists it under `paused` and `running`.
    let list = |filter: &[&str]| {
        let out = support::noetl(&home)
            .args(["exec", "list", "--json", "--nats", &url])
            .args(filter)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        stdout(&out)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| v["execution_id"] == id.as_str())
            .map(|v| v["status"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(list(&[]), ["paused"]);
    assert_eq!(list(&["--status", "paused"]), ["paused"]);
    assert_eq!(list(&["--status", "running"]), ["paused"]);
    assert!(list(&["--status", "completed"]).is_empty());
    let table = support::noetl(&home)
        .args(["exec", "list", "--nats", &url])
        .output()
        .unwrap();
    let row = stdout(&table)
        .lines()
        .find(|l| l.starts_with(&id))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no row for {id}:\n{}", text(&table)));
    assert_eq!(row.split_whitespace().nth(1), Some("paused"), "{row}");

    let out = support::noetl(&home)
        .args(["exec", "cancel", &id, "--wait", "--nats", &url])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_failed_execution_shows_each_run_once_and_why_names_exec_resume() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let file = playbook(
        dir.path(),
        "second_fails.yaml",
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: second_fails }
workflow:
  - step: start
    tool: { kind: noop, result: 1 }
    next:
      arcs:
        - step: total
  - step: total
    tool:
      - name: boom
        kind: python
        code: "raise RuntimeError('kaput')"
"#,
    );
    let out = support::noetl(&home)
        .args(["run", "--nats", &url])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let id = run_id(&stdout(&out));
    let show = support::noetl(&home)
        .args(["exec", "show", &id, "--json", "--nats", &url])
        .output()
        .unwrap();
    let tree: Value = serde_json::from_slice(&show.stdout).unwrap();
    let mut runs = Vec::new();
    for step in tree["steps"].as_array().unwrap() {
        for r in step["runs"].as_array().unwrap() {
            assert_ne!(r["status"], "scheduled", "{tree:#}");
            runs.push(r["step_run_id"].as_str().unwrap().to_string());
        }
    }
    let mut distinct = runs.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        runs.len(),
        "a run shown under two steps: {tree:#}"
    );

    let why = support::noetl(&home)
        .args(["exec", "why", &id, "--nats", &url])
        .output()
        .unwrap();
    let said = stdout(&why);
    assert!(said.contains("RuntimeError: kaput"), "{said}");
    assert!(
        said.contains(&format!("noetl exec resume {id} (runs again: total)")),
        "{said}"
    );
}

#[test]
fn noetl_nats_url_sends_catalog_commands_to_that_mesh_as_the_docs_say() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(support::noetl(&home), &url);
    let hello = noetl_integration::repo_root().join("playbooks/hello.yaml");
    let out = support::noetl(&home)
        .env("NOETL_NATS_URL", &url)
        .args(["playbook", "register"])
        .arg(&hello)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // On the mesh the variable names...
    let on_mesh = support::noetl(&home)
        .args(["playbook", "list", "--nats", &url])
        .output()
        .unwrap();
    assert!(
        stdout(&on_mesh).contains("examples/hello"),
        "{}",
        text(&on_mesh)
    );
    // ...and not in the local store, which commands use without either.
    let local = support::noetl(&home)
        .args(["playbook", "list"])
        .output()
        .unwrap();
    assert!(local.status.success(), "{}", text(&local));
    assert!(
        !stdout(&local).contains("examples/hello"),
        "{}",
        text(&local)
    );
}

#[test]
fn the_run_summary_lists_steps_in_the_order_they_ran() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_playbook(
        dir.path(),
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: order }
workflow:
  - step: start
    tool: { kind: noop, result: 1 }
    next: { arcs: [ { step: zebra } ] }
  - step: zebra
    tool: { kind: noop, result: 2 }
    next: { arcs: [ { step: apple } ] }
  - step: apple
    tool: { kind: noop, result: 3 }
"#,
    );
    assert!(out.status.success(), "{}", text(&out));
    let s = stdout(&out);
    let steps: Vec<&str> = s
        .lines()
        .skip_while(|l| *l != "steps:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    assert_eq!(steps, ["start", "zebra", "apple"], "{s}");
}

/// A join one of whose inputs routed elsewhere: the execution completes
/// with the join `not_run`, and the run (and `exec show` after it) says
/// why it never started.
#[test]
fn a_join_an_input_never_reached_is_named_under_the_completed_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_playbook(
        dir.path(),
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: join_never }
workflow:
  - step: start
    tool: { kind: noop }
    next: { spec: { mode: inclusive }, arcs: [ { step: left }, { step: right } ] }
  - step: left
    tool: { kind: noop }
    next: { arcs: [ { step: merge } ] }
  - step: right
    tool: { kind: noop }
    next: { arcs: [ { step: merge, when: "{{ false }}" }, { step: other } ] }
  - step: other
    tool: { kind: noop }
  - step: merge
    spec: { join: all }
    tool: { kind: noop }
"#,
    );
    assert!(out.status.success(), "{}", text(&out));
    let s = stdout(&out);
    assert!(s.contains("  not_run  merge"), "{s}");
    let said = "join never started: step merge had 1 of its 2 inputs (from left; none from right) when the execution ended";
    assert!(s.contains(said), "{s}");
    let show = support::noetl(&dir.path().join("home"))
        .args(["exec", "show", &run_id(&s), "--local"])
        .output()
        .unwrap();
    assert!(stdout(&show).contains(said), "{}", text(&show));
}

#[test]
fn an_execution_refused_before_its_first_step_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_playbook(
        dir.path(),
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: refused }
keychain:
  - { name: pg_missing, kind: postgres_credential }
workflow:
  - step: start
    tool:
      - name: q
        kind: postgres
        auth: pg_missing
        command: select 1
"#,
    );
    assert!(!out.status.success(), "{}", text(&out));
    let all = text(&out);
    let s = stdout(&out);
    assert!(
        s.lines().any(|l| l.starts_with("execution ")
            && l.ends_with("  failed  (ended before its first step)")),
        "{all}"
    );
    // The reason once, on the error line: not again as a service's log line.
    assert_eq!(
        all.matches("`pg_missing` (postgres_credential) is not stored")
            .count(),
        1,
        "{all}"
    );
    assert!(s.contains("error: keychain cannot be resolved"), "{all}");
}

/// A python task that sleeps 20 s, then a step after it.
const SLOW: &str = r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: slow }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(20)
          result = "woke"
    next:
      arcs:
        - step: after
  - step: after
    tool: { kind: noop }
"#;

/// `noetl run` of `file` in `home`, signalled with `signal` (as `kill`
/// names it) once its python task has started: what it printed.
fn run_signalled(home: &Path, file: &Path, signal: &str) -> Output {
    let child = support::noetl(home)
        .args(["run", "--json", "--timeout", "120"])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    child.wait_with_output().unwrap()
}

#[test]
fn a_run_stopped_by_kill_or_a_closed_terminal_cancels_its_execution_and_exits_soon() {
    let dir = tempfile::tempdir().unwrap();
    let file = playbook(dir.path(), "slow.yaml", SLOW);
    let home = dir.path().join("home");
    for signal in ["-TERM", "-HUP"] {
        let t0 = Instant::now();
        let out = run_signalled(&home, &file, signal);
        assert_eq!(out.status.code(), Some(1), "{signal}: {}", text(&out));
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(s["status"], "cancelled", "{signal}: {s}");
        // Its python task still sleeps: the run does not wait it out.
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{signal}: took {:?}",
            t0.elapsed()
        );
    }
    let running = support::noetl(&home)
        .args(["exec", "list", "--local", "--status", "running", "--json"])
        .output()
        .unwrap();
    assert!(running.status.success(), "{}", text(&running));
    assert_eq!(stdout(&running).trim(), "", "nothing left running");
}

#[test]
fn a_run_says_which_executions_an_earlier_killed_run_left_running() {
    let dir = tempfile::tempdir().unwrap();
    let file = playbook(dir.path(), "slow.yaml", SLOW);
    let home = dir.path().join("home");
    let killed = run_signalled(&home, &file, "-KILL");
    assert!(!killed.status.success());
    let out = support::noetl(&home)
        .args(["run", "--timeout", "120"])
        .arg(playbook(
            dir.path(),
            "hello.yaml",
            "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: hello }\nworkflow:\n  - step: start\n    tool: { kind: noop }\n",
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let note = err
        .lines()
        .find(|l| l.starts_with("note: an execution an earlier run left running goes on"))
        .unwrap_or_else(|| panic!("no note in:\n{err}"));
    assert!(note.contains("(slow)"), "{note}");
    assert!(note.contains("noetl exec cancel ID --local"), "{note}");
    // The leftover's work, cut short as the run stops, is no warning of the
    // NATS client's to the user.
    assert!(!err.contains("WARN async_nats"), "{err}");
    // As the note says: cancelled with --local, it is cancelled by the next run.
    let left = note
        .split_once("services: ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .expect("the execution's id")
        .to_string();
    let cancel = support::noetl(&home)
        .args(["exec", "cancel", &left, "--local"])
        .output()
        .unwrap();
    assert!(cancel.status.success(), "{}", text(&cancel));
    assert!(
        stdout(&cancel).contains("the next `noetl run` on it cancels the execution"),
        "{}",
        text(&cancel)
    );
    // A run's router takes the request up as it starts; a run this short
    // may stop before it is done, so up to three.
    let mut s = Value::Null;
    for _ in 0..3 {
        let again = support::noetl(&home)
            .args(["run", "--timeout", "120"])
            .arg(dir.path().join("hello.yaml"))
            .output()
            .unwrap();
        assert!(again.status.success(), "{}", text(&again));
        let status = support::noetl(&home)
            .args(["exec", "status", &left, "--local", "--json"])
            .output()
            .unwrap();
        s = serde_json::from_slice(&status.stdout).unwrap_or_else(|_| panic!("{}", text(&status)));
        if s["status"] == "cancelled" {
            break;
        }
    }
    assert_eq!(s["status"], "cancelled", "{s}");
}
