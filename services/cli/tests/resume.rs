//! `noetl exec resume` against separate services: a failed execution goes
//! on where it stopped, and its events prove that no finished step or loop
//! iteration ran again and that it ends as a clean run does; `--from`
//! restarts at an earlier step, superseding what followed; a catalog
//! version is accepted when it still has the steps left to run and refused
//! otherwise.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod support;
use support::Procs;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The mesh the tests share: a server, its services, and the CLI.
struct Mesh {
    home: tempfile::TempDir,
    url: String,
    _services: Procs,
    _server: noetl_testkit::TestServer,
}

impl Mesh {
    fn up() -> Self {
        let home = tempfile::tempdir().unwrap();
        let server = noetl_testkit::TestServer::start();
        let url = server.url();
        support::admin_init(support::noetl(home.path()), &url);
        let services = support::mesh_services(home.path(), &url, &["noop", "python", "wait"]);
        Self {
            home,
            url,
            _services: services,
            _server: server,
        }
    }

    fn noetl(&self) -> Command {
        support::noetl(self.home.path())
    }

    /// `noetl ARGS --nats URL`: its output and its stdout as JSON.
    fn run(&self, args: &[&str]) -> (Output, Value) {
        let out = self
            .noetl()
            .args(args)
            .args(["--nats", &self.url])
            .output()
            .unwrap();
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out, json)
    }

    fn start(&self, args: &[&str]) -> String {
        support::exec_start(self.noetl(), &self.url, args)
    }

    /// The summary once the execution ended, whatever its status.
    fn ended(&self, id: &str) -> Value {
        let (out, json) = self.run(&["exec", "status", id, "--wait", "--json", "--timeout", "90"]);
        assert!(json.is_object(), "{}", String::from_utf8_lossy(&out.stderr));
        json
    }

    fn resume(&self, id: &str, extra: &[&str]) -> (Output, Value) {
        let mut args = vec!["exec", "resume", id, "--json"];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// Assert that `noetl exec replay` finds every stored record of the
    /// execution equal to what its events give (its last writes get up to
    /// 5 s to land).
    fn replays(&self, id: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let (out, json) = self.run(&["exec", "replay", id, "--json"]);
            if out.status.success() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "replay of {id}: {json} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Every stored event of the execution.
    /// Wait (at most 10 s) until `id` has written no event for 1 s and
    /// its records equal what its events give.
    fn settled(&self, id: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut last = (self.events(id).len(), std::time::Instant::now());
        while last.1.elapsed() < std::time::Duration::from_secs(1) {
            assert!(std::time::Instant::now() < deadline, "{id} never settled");
            std::thread::sleep(std::time::Duration::from_millis(200));
            let n = self.events(id).len();
            if n != last.0 {
                last = (n, std::time::Instant::now());
            }
        }
        self.replays(id);
    }

    fn events(&self, id: &str) -> Vec<Value> {
        let (out, _) = self.run(&[
            "events",
            "tail",
            "--execution",
            id,
            "--from-start",
            "--json",
            "--no-follow",
        ]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How many events of `event_type` each step (or, with `by_index`, each
/// loop index) has.
fn count(events: &[Value], event_type: &str, by_index: bool) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for e in events.iter().filter(|e| e["event_type"] == event_type) {
        let key = if by_index {
            e["payload"]["index"].to_string()
        } else {
            e["step"].as_str().unwrap_or_default().to_string()
        };
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// An execution of `resume_loop_cancelled.yaml` cancelled once three of
/// its loop's iterations are done; its id.
fn cancelled_in_its_loop(m: &Mesh) -> String {
    let id = m.start(&[&fixture("resume_loop_cancelled.yaml")]);
    support::wait_until(
        "three iterations done",
        std::time::Duration::from_secs(30),
        || count(&m.events(&id), "loop.iteration.done", true).len() >= 3,
    );
    let (out, _) = m.run(&["exec", "cancel", &id, "--wait"]);
    ok(&out);
    let cancelled = m.ended(&id);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    id
}

/// How many iterations ended in the first loop run of `events`.
fn ended_in_first_run(events: &[Value]) -> usize {
    let ends = |e: &&Value| e["event_type"] == "loop.iteration.done";
    let first_run = events.iter().find(ends).unwrap()["payload"]["loop_run_id"].clone();
    (events.iter().filter(ends))
        .filter(|e| e["payload"]["loop_run_id"] == first_run)
        .count()
}

/// Resume `id` (of `resume_loop_cancelled.yaml`, with `extra` arguments) and assert that it
/// completes with every item counted and seen once.
fn resumed_complete(m: &Mesh, id: &str, extra: &[&str]) {
    let (out, _) = m.resume(id, extra);
    ok(&out);
    let done = m.ended(id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["ctx"]["count"], 10, "{done}");
    every_item_once(&done);
}

/// Assert that the `seen` (`append`) of the summary `done` holds items 0
/// to 9, each once.
fn every_item_once(done: &Value) {
    let mut seen: Vec<i64> = (done["ctx"]["seen"].as_array())
        .map(|s| s.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    seen.sort_unstable();
    assert_eq!(seen, (0..10).collect::<Vec<_>>(), "every item once: {done}");
}

fn steps(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn a_failed_execution_resumes_where_it_stopped_and_ends_as_a_clean_run() {
    let m = Mesh::up();
    let clean = m.start(&[&fixture("resume_third.yaml"), "--set", "fixed=true"]);
    let clean = m.ended(&clean);
    assert_eq!(clean["status"], "completed", "{clean}");

    // Fails at its third step.
    let id = m.start(&[&fixture("resume_third.yaml")]);
    let failed = m.ended(&id);
    assert_eq!(failed["status"], "failed", "{failed}");
    m.replays(&id);
    // Not resumable while running or unknown; nor from a step it lacks.
    let (out, _) = m.resume("no-such-execution", &[]);
    assert_eq!(out.status.code(), Some(3));
    let (out, _) = m.resume(&id, &["--from", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`--from nope` names no step"));

    // The cause fixed, it resumes: the third step runs again, then the fourth.
    let (out, json) = m.resume(&id, &["--set", "fixed=true"]);
    ok(&out);
    assert_eq!(json["resumes"], 1);
    assert_eq!(json["steps"], serde_json::json!(["third"]));
    let resumed = m.ended(&id);
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert_eq!(resumed["ctx"], clean["ctx"], "the end state of a clean run");
    m.replays(&id);
    let events = m.events(&id);
    assert_eq!(
        count(&events, "step.started", false),
        steps(&[("fourth", 1), ("second", 1), ("start", 1), ("third", 2)]),
        "no finished step ran again"
    );
    let ev = events
        .iter()
        .find(|e| e["event_type"] == "execution.resumed")
        .expect("execution.resumed");
    assert_eq!(ev["payload"]["set"], serde_json::json!(["fixed"]));
    assert_eq!(ev["payload"]["steps"], serde_json::json!(["third"]));
    // Completed: nothing to resume.
    let (out, _) = m.resume(&id, &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_failed_parallel_loop_runs_only_the_iterations_that_did_not_finish() {
    let m = Mesh::up();
    let clean = m.start(&[&fixture("resume_loop.yaml"), "--set", "fixed=true"]);
    let clean = m.ended(&clean);
    assert_eq!(clean["status"], "completed", "{clean}");
    assert_eq!(clean["ctx"]["total"], 1225);

    let id = m.start(&[&fixture("resume_loop.yaml")]);
    let failed = m.ended(&id);
    assert_eq!(failed["status"], "failed", "{failed}");
    let before = m.events(&id);
    let failed_at = count(&before, "loop.iteration.failed", true);
    assert_eq!(failed_at.len(), 3, "items 2, 5 and 8 fail: {failed_at:?}");
    let done_before = count(&before, "loop.iteration.done", true);

    let (out, json) = m.resume(&id, &["--set", "fixed=true"]);
    ok(&out);
    assert_eq!(json["steps"], serde_json::json!(["items"]));
    let resumed = m.ended(&id);
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert_eq!(resumed["ctx"]["total"], clean["ctx"]["total"]);
    m.replays(&id);
    assert_eq!(resumed["ctx"]["count"], 50);
    let events = m.events(&id);
    let started = count(&events, "loop.iteration.started", true);
    assert_eq!(started.len(), 50, "every item ran");
    for (index, n) in &started {
        let want = if failed_at.contains_key(index) { 2 } else { 1 };
        assert_eq!(*n, want, "item {index}: finished ones never run again");
    }
    let done = count(&events, "loop.iteration.done", true);
    assert_eq!(done.len(), 50);
    assert!(done.values().all(|n| *n == 1), "{done:?}");
    assert!(done_before.len() < 50 - 3, "the failure stopped dispatch");
    let ev = events
        .iter()
        .find(|e| e["event_type"] == "execution.resumed")
        .unwrap();
    assert_eq!(
        ev["payload"]["continued_loops"],
        serde_json::json!(["items"])
    );
}

/// A loop resumed twice: the first resume (one iteration at a time) fails
/// again on the first of the two failed items before the second went out;
/// the second resume runs both. Before, it took only the failures of the
/// run that stopped, and the item the first resume had still to run again
/// was never run: the loop ended without it (`count` 9, `total` 40).
#[test]
fn a_loop_resumed_twice_runs_what_the_first_resume_had_left() {
    let m = Mesh::up();
    let id = m.start(&[&fixture("resume_loop_twice.yaml")]);
    assert_eq!(m.ended(&id)["status"], "failed");
    let failed_at = count(&m.events(&id), "loop.iteration.failed", true);
    assert_eq!(failed_at.len(), 2, "items 3 and 5 fail: {failed_at:?}");

    let (out, _) = m.resume(&id, &["--set", "window=1", "--set", "level=1"]);
    ok(&out);
    let again = m.ended(&id);
    assert_eq!(again["status"], "failed", "item 3 fails again: {again}");
    let failed = count(&m.events(&id), "loop.iteration.failed", true);
    assert_eq!(failed.get("3"), Some(&2), "{failed:?}");
    assert_eq!(failed.get("5"), Some(&1), "5 did not go out: {failed:?}");

    let (out, _) = m.resume(&id, &["--set", "level=2"]);
    ok(&out);
    let done = m.ended(&id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["ctx"]["count"], 10, "{done}");
    assert_eq!(done["ctx"]["total"], 45, "{done}");
    every_item_once(&done);
    let finished = count(&m.events(&id), "loop.iteration.done", true);
    assert_eq!(finished.len(), 10, "every item finished: {finished:?}");
    assert!(finished.values().all(|n| *n == 1), "{finished:?}");
    m.replays(&id);
}

/// A loop cancelled while it runs: its run never ends, so the growing
/// reducers' contributions of its finished iterations are still only in
/// its claims, and the resumed run folds them before its own. Before, the
/// resumed run's finish looked for every counted success in its own claims
/// and, never finding them, was retried until it was dead-lettered: the
/// execution never ended; and the cancelled run went on starting
/// iterations once the execution was resumed, beside the new run (every
/// remaining item ran twice).
#[test]
fn a_cancelled_loop_resumed_keeps_the_contributions_of_the_run_it_continues() {
    let m = &Mesh::up();
    let id = cancelled_in_its_loop(m);
    let before = count(&m.events(&id), "loop.iteration.done", true).len();
    assert!(before < 10, "cancelled before the loop ended: {before}");

    resumed_complete(m, &id, &[]);
    // The cancelled run started nothing after the resume: only the two
    // iterations in flight at the cancel may have ended in it since.
    let in_first = ended_in_first_run(&m.events(&id));
    assert!(
        in_first <= before + 2,
        "{in_first} ended in the cancelled run, {before} before the cancel"
    );
    m.replays(&id);
}

/// A cancelled loop whose KV state was compacted away (its run and that
/// run's claims with it) resumes from its events: the contributions of the
/// run it continues, which never ended, are rebuilt from them when the new
/// run folds its growing reducers. Before, that finish rebuilt only the
/// new run's own claims, found the earlier ones still missing and was
/// retried until it was dead-lettered: the execution never ended.
#[test]
fn a_cancelled_and_compacted_loop_resumed_keeps_the_contributions_of_the_run_it_continues() {
    let m = &Mesh::up();
    let id = cancelled_in_its_loop(m);
    m.settled(&id);
    let (out, c) = m.run(&["admin", "compact", "--older-than", "0s", "--json"]);
    ok(&out);
    assert_eq!(c["executions"], serde_json::json!([id.clone()]), "{c}");

    resumed_complete(m, &id, &[]);
    m.replays(&id);
}

/// A failed loop whose KV state was compacted away (`noetl admin compact`:
/// header, plan, step records, `ctx`, the stopped loop run) resumes from
/// its events: its records are written back from them, and the new run
/// still takes only the iterations that did not finish (the stopped run
/// folded from its events), ending as a clean run does.
#[test]
fn a_compacted_failed_loop_resumes_from_its_events_and_runs_only_what_did_not_finish() {
    let m = Mesh::up();
    let id = m.start(&[&fixture("resume_loop.yaml")]);
    let failed = m.ended(&id);
    assert_eq!(failed["status"], "failed", "{failed}");
    let failed_at = count(&m.events(&id), "loop.iteration.failed", true);
    assert_eq!(failed_at.len(), 3, "items 2, 5 and 8 fail: {failed_at:?}");
    // Compaction is for executions that ended long ago: wait until the
    // last messages of this one (acks, prunes) are done with it.
    m.settled(&id);
    let (out, c) = m.run(&["admin", "compact", "--older-than", "0s", "--json"]);
    ok(&out);
    assert_eq!(c["executions"], serde_json::json!([id.clone()]), "{c}");
    let (out, _) = m.run(&["exec", "status", &id, "--json"]);
    assert_eq!(out.status.code(), Some(3), "compacted: no KV state left");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ended and its state was removed")
            && err.contains(&format!("noetl exec show {id}")),
        "says what still reads it: {err}"
    );

    let (out, json) = m.resume(&id, &["--set", "fixed=true"]);
    ok(&out);
    assert_eq!(json["steps"], serde_json::json!(["items"]), "{json}");
    let resumed = m.ended(&id);
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert_eq!(resumed["ctx"]["total"], 1225, "{resumed}");
    assert_eq!(resumed["ctx"]["count"], 50, "{resumed}");
    assert_eq!(resumed["steps"]["start"], "done", "{resumed}");
    let events = m.events(&id);
    let started = count(&events, "loop.iteration.started", true);
    assert_eq!(started.len(), 50, "every item ran");
    for (index, n) in &started {
        let want = if failed_at.contains_key(index) { 2 } else { 1 };
        assert_eq!(*n, want, "item {index}: finished ones never run again");
    }
    assert_eq!(
        count(&events, "step.started", false).get("start"),
        Some(&1),
        "the finished first step did not run again"
    );
    m.replays(&id);
}

/// A loop stopped by a cancel and left by a restart `--from` its own step
/// starts nothing more: the new run runs every item once, and only its
/// reducers are folded. Before, nothing marked the stopped run: a late
/// report refilled its window once the execution ran again, and it went on
/// beside the new run, folding its reducers into `ctx` too.
#[test]
fn a_cancelled_loop_restarted_from_its_step_leaves_its_stopped_run_stopped() {
    let m = &Mesh::up();
    let id = cancelled_in_its_loop(m);
    let before = count(&m.events(&id), "loop.iteration.done", true).len();
    resumed_complete(m, &id, &["--from", "items"]);
    let in_first = ended_in_first_run(&m.events(&id));
    assert!(
        in_first <= before + 2,
        "{in_first} ended in the stopped run, {before} before the cancel"
    );
    m.replays(&id);
}

#[test]
fn from_an_earlier_step_supersedes_what_followed() {
    let m = Mesh::up();
    let id = m.start(&[&fixture("resume_third.yaml")]);
    assert_eq!(m.ended(&id)["status"], "failed");
    let (out, json) = m.resume(&id, &["--from", "second", "--set", "fixed=true"]);
    ok(&out);
    assert_eq!(json["steps"], serde_json::json!(["second"]));
    assert_eq!(json["superseded"], serde_json::json!(["second", "third"]));
    assert_eq!(m.ended(&id)["status"], "completed");
    m.replays(&id);
    let events = m.events(&id);
    assert_eq!(
        count(&events, "step.started", false),
        steps(&[("fourth", 1), ("second", 2), ("start", 1), ("third", 2)])
    );
    assert_eq!(
        count(&events, "step.superseded", false),
        steps(&[("second", 1), ("third", 1)])
    );
}

/// Register `text` in the catalog; its version.
fn register(m: &Mesh, dir: &Path, name: &str, text: &str) -> u64 {
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    let (out, json) = m.run(&["playbook", "register", "--json", file.to_str().unwrap()]);
    ok(&out);
    json["version"].as_u64().unwrap()
}

#[test]
fn a_version_is_accepted_when_it_has_the_steps_left_and_refused_otherwise() {
    let m = Mesh::up();
    let dir = tempfile::tempdir().unwrap();
    let v1 = std::fs::read_to_string(fixture("resume_third.yaml")).unwrap();
    assert_eq!(register(&m, dir.path(), "v1.yaml", &v1), 1);
    let id = m.start(&["tests/resume_third"]);
    assert_eq!(m.ended(&id)["status"], "failed");
    // Version 2 drops the failed step: refused, naming it.
    let (head, _) = v1.split_once("  - step: third").unwrap();
    let v2 = format!(
        "{}  - step: fourth\n",
        head.replace("step: third", "step: fourth")
    );
    assert_eq!(register(&m, dir.path(), "v2.yaml", &v2), 2);
    let (out, _) = m.resume(&id, &["--playbook-version", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tests/resume_third@v2") && err.contains("\"third\""),
        "{err}"
    );
    // Version 3 fixes the cause in the playbook itself: accepted.
    let v3 = v1.replace("raise RuntimeError('the cause is not fixed yet')", "pass");
    assert_ne!(v3, v1);
    assert_eq!(register(&m, dir.path(), "v3.yaml", &v3), 3);
    let (out, _) = m.resume(&id, &["--playbook-version", "3"]);
    ok(&out);
    let s = m.ended(&id);
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["ctx"]["three"], 3);
    // Version 3 is its source from now on (the events say so too), so a
    // retry runs version 3 again: it completes (version 1 fails).
    m.replays(&id);
    let (out, json) = m.run(&["exec", "retry", &id, "--json"]);
    ok(&out);
    let again = json["execution_id"].as_str().unwrap().to_string();
    let s = m.ended(&again);
    assert_eq!(s["status"], "completed", "{s}");
    let events = m.events(&again);
    let init = events
        .iter()
        .find(|e| e["event_type"] == "playbook.initialized");
    assert_eq!(
        init.map(|e| e["payload"]["source"].clone()),
        Some(serde_json::json!("tests/resume_third@v3")),
        "{events:?}"
    );
    // Compacted, it is still replayed against another catalog version.
    let (out, _) = m.run(&["admin", "compact", "--older-than", "0s", "--json"]);
    ok(&out);
    let (out, r) = m.run(&["exec", "replay", &id, "--version", "3", "--json"]);
    ok(&out);
    assert!(r["decisions"].as_u64().unwrap() > 0, "{r}");
}

#[test]
fn a_resume_takes_a_slot_of_its_concurrency_key_or_is_refused_until_one_is_free() {
    let m = Mesh::up();
    let gated = fixture("resume_gated.yaml");
    let failed = m.start(&[&gated]);
    assert_eq!(m.ended(&failed)["status"], "failed");
    // Another execution holds the only slot (it waits for a signal).
    let holder = m.start(&[&gated, "--set", "hold=true"]);
    let (out, _) = m.resume(&failed, &["--set", "fixed=true"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot resume now: concurrency key `one-at-a-time` is at its limit of 1")
            && err.contains(&holder),
        "{err}"
    );
    support::wait_until(
        "the holder takes the signal",
        std::time::Duration::from_secs(30),
        || m.run(&["exec", "signal", &holder, "go"]).0.status.success(),
    );
    assert_eq!(m.ended(&holder)["status"], "completed");
    let (out, _) = m.resume(&failed, &["--set", "fixed=true"]);
    ok(&out);
    assert_eq!(m.ended(&failed)["status"], "completed");
}

/// A resumed execution whose KV state was compacted runs again with `exec
/// retry` from its events: the playbook its plan kept and the workload
/// its resume changed (`fixed=true`, carried by `execution.resumed`), so
/// the retry completes where the first run failed. Before, the retry of
/// a compacted execution answered "no execution" (exit 3).
#[test]
fn a_compacted_execution_runs_again_with_the_workload_its_resume_gave() {
    let m = Mesh::up();
    let id = m.start(&[&fixture("resume_third.yaml")]);
    assert_eq!(m.ended(&id)["status"], "failed");
    let (out, _) = m.resume(&id, &["--set", "fixed=true"]);
    ok(&out);
    assert_eq!(m.ended(&id)["status"], "completed");
    let (out, c) = m.run(&["admin", "compact", "--older-than", "0s", "--json"]);
    ok(&out);
    assert_eq!(c["executions"], serde_json::json!([id.clone()]), "{c}");

    let (out, json) = m.run(&["exec", "retry", &id, "--as", "nightly-1", "--json"]);
    ok(&out);
    let again = json["execution_id"].as_str().unwrap().to_string();
    assert_eq!(again, "nightly-1");
    let s = m.ended(&again);
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["ctx"]["three"], 3, "{s}");
    // Compacted too, its id asked again names it: not a second run.
    let (out, _) = m.run(&["admin", "compact", "--older-than", "0s", "--json"]);
    ok(&out);
    for args in [
        &["exec", "retry", &id, "--as", "nightly-1", "--json"][..],
        &[
            "exec",
            "start",
            &fixture("resume_third.yaml"),
            "--id",
            "nightly-1",
            "--json",
        ],
    ] {
        let (out, json) = m.run(args);
        ok(&out);
        assert_eq!(json["execution_id"], "nightly-1");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("exists already: not started again"), "{err}");
    }
    // Still nothing for an id neither KV nor the log knows.
    let (out, _) = m.run(&["exec", "retry", "no-such-id"]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no execution \"no-such-id\""), "{err}");
}
