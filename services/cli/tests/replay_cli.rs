//! `noetl exec replay`, `noetl admin rebuild` and the spec's event names in
//! `noetl events tail`, against separate services: a finished execution
//! replays equal; its records purged from KV are reported, then written
//! back from its events; a running execution whose header, plan and ctx
//! are purged mid-run completes with the ctx of a clean run, and one whose
//! waiter is purged while it waits still takes its signal.

use std::process::{Command, Output};
use std::time::Duration;

use noetl_mesh::{keys::Keys, Mesh, MeshConfig};
use serde_json::{json, Value};

mod support;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> (Output, Value) {
    let out = cmd.output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, json)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `noetl admin rebuild --execution <id> --json`: its output and report.
fn rebuild(mut noetl: Command, id: &str, url: &str) -> (Output, Value) {
    run(noetl.args([
        "admin",
        "rebuild",
        "--execution",
        id,
        "--json",
        "--nats",
        url,
    ]))
}

/// Purge `keys` of the exec bucket and the execution's ctx.
fn purge(url: &str, home: &std::path::Path, eid: &str, keys: &[String]) {
    let (rt, mesh) = attached(url, home);
    rt.block_on(async {
        for k in keys {
            mesh.exec_kv().purge(k).await.unwrap();
        }
        mesh.ctx_kv().purge(eid).await.unwrap();
    });
}

#[test]
fn replay_finds_a_purged_record_rebuild_writes_it_back_and_tail_takes_the_spec_s_names() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop", "python"]);

    let id = support::exec_start(noetl(), &url, &[fixture("replayed.yaml")]);
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["ctx"]["total"], json!(5));

    let (out, report) = run(noetl().args(["exec", "replay", &id, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(report["equal"], json!(true), "{report}");
    let (out, _) = run(noetl().args(["exec", "replay", &id, "--nats", &url]));
    assert!(text(&out).contains("equal"), "{}", text(&out));

    // Time travel: as of the first task.done only `first` is in ctx.
    let (out, _) = run(noetl().args([
        "events",
        "tail",
        "--execution",
        &id,
        "--type",
        "command.completed",
        "--from-start",
        "--no-follow",
        "--json",
        "--nats",
        &url,
    ]));
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        5,
        "the spec's command.completed is our task.done"
    );
    assert!(lines.iter().all(|l| l["event_type"] == "task.done"));
    let first_seq = lines[0]["seq"].as_u64().unwrap();
    let (out, state) = run(noetl().args([
        "exec",
        "replay",
        &id,
        "--until",
        &first_seq.to_string(),
        "--json",
        "--nats",
        &url,
    ]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(state["ctx"], json!({"first": "napped"}), "{state}");
    assert_eq!(state["header"]["status"], "running");
    // Exported, the events fold to the same state without the stream.
    let file = home.path().join("export.jsonl");
    let (out, _) = run(noetl().args([
        "events",
        "export",
        &id,
        "--out",
        file.to_str().unwrap(),
        "--nats",
        &url,
    ]));
    assert!(out.status.success(), "{}", text(&out));
    let exported = std::fs::read_to_string(&file).unwrap();
    assert!(exported.lines().count() > 20, "{exported}");
    let (out, state) =
        run(noetl().args(["exec", "replay", "--from", file.to_str().unwrap(), "--json"]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(state["header"]["status"], "completed", "{state}");
    assert_eq!(state["ctx"]["total"], json!(5), "{state}");
    let (out, state) = run(noetl().args([
        "exec",
        "replay",
        "--from",
        file.to_str().unwrap(),
        "--until",
        &first_seq.to_string(),
        "--json",
    ]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(state["ctx"], json!({"first": "napped"}), "{state}");
    let (out, _) = run(noetl().args(["events", "export", "--since", "1h", "--nats", &url]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).lines().count() >= exported.lines().count(),
        "every event since an hour ago"
    );
    let (out, _) = run(noetl().args([
        "events",
        "tail",
        "--type",
        "batch.*",
        "--no-follow",
        "--nats",
        &url,
    ]));
    // Batches are ours (a loop window's, read as its iterations: cli.rs).
    assert!(out.status.success(), "{}", text(&out));

    // Its records purged: replay names them; rebuild writes them back.
    purge(
        &url,
        home.path(),
        &id,
        &[
            Keys::header(&id),
            Keys::plan(&id),
            Keys::step(&id, "squares"),
        ],
    );
    let (out, report) = run(noetl().args(["exec", "replay", &id, "--json", "--nats", &url]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let what: Vec<&str> = report["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["what"].as_str().unwrap())
        .collect();
    assert!(what.contains(&"header"), "{what:?}");
    assert!(what.contains(&"step \"squares\""), "{what:?}");
    assert!(what.contains(&"ctx.total"), "{what:?}");
    let (out, rebuilt) = rebuild(noetl(), &id, &url);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        (
            rebuilt["header"].clone(),
            rebuilt["plan"].clone(),
            rebuilt["steps"].clone(),
            rebuilt["ctx"].clone()
        ),
        (json!(true), json!(true), json!(1), json!(true)),
        "{rebuilt}"
    );
    let (out, report) = run(noetl().args(["exec", "replay", &id, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}: {report}", text(&out));
    let status = support::exec_wait(noetl(), &url, &id, 5);
    assert_eq!(status["status"], "completed");
    assert_eq!(status["ctx"]["total"], json!(5));
    assert_eq!(status["steps"]["squares"], "done");
    let (out, _) = run(noetl().args(["exec", "replay", "nope", "--nats", &url]));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
}

#[test]
fn a_running_execution_whose_header_plan_and_ctx_are_purged_completes_as_a_clean_run() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop", "python"]);

    let id = support::exec_start(
        noetl(),
        &url,
        &[fixture("replayed.yaml"), "--set".into(), "nap2=3".into()],
    );
    // While `middle` naps, after `start` wrote `first`, the execution's
    // header, plan and ctx are purged from KV.
    support::wait_until("middle runs", Duration::from_secs(30), || {
        let (_, state) = run(noetl().args([
            "exec",
            "replay",
            &id,
            "--json",
            "--until",
            "999999999",
            "--nats",
            &url,
        ]));
        state["ctx"]["first"] == "napped"
            && state["header"]["live"]
                .as_array()
                .is_some_and(|l| l.iter().any(|t| t["step"] == "middle"))
    });
    purge(
        &url,
        home.path(),
        &id,
        &[Keys::header(&id), Keys::plan(&id)],
    );
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["ctx"]["total"], json!(5), "{end}");
    assert_eq!(end["ctx"]["first"], json!("napped"), "{end}");
    let (out, report) = run(noetl().args(["exec", "replay", &id, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}: {report}", text(&out));
}

#[test]
fn a_step_result_read_by_name_and_purged_before_it_is_read_is_rebuilt_from_the_events() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop", "python"]);

    let id = support::exec_start(noetl(), &url, &[fixture("purged_result.yaml")]);
    // While `middle` naps, the result `end` reads by name (`start`'s) is
    // purged from KV, and nothing else.
    support::wait_until("middle runs", Duration::from_secs(30), || {
        let (_, state) = run(noetl().args([
            "exec",
            "replay",
            &id,
            "--json",
            "--until",
            "999999999",
            "--nats",
            &url,
        ]));
        state["header"]["live"]
            .as_array()
            .is_some_and(|l| l.iter().any(|t| t["step"] == "middle"))
    });
    let (rt, mesh) = attached(&url, home.path());
    let had = rt.block_on(async {
        let key = Keys::result(&id, "start");
        let had = noetl_mesh::kv::get::<serde_json::Value>(mesh.exec_kv(), &key)
            .await
            .unwrap();
        mesh.exec_kv().purge(&key).await.unwrap();
        had
    });
    drop(mesh);
    drop(rt);
    assert_eq!(had, Some(json!({"x": 7})), "the result was kept by name");
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["ctx"]["x"], json!(7), "{end}");
    let (out, report) = run(noetl().args(["exec", "replay", &id, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}: {report}", text(&out));
}

#[test]
fn a_waiter_purged_while_its_step_waits_is_rebuilt_from_the_events_and_takes_the_signal() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop", "wait"]);

    let id = support::exec_start(noetl(), &url, &[fixture("purged_wait.yaml")]);
    let key = Keys::wait(&id, "approval");
    let (rt, mesh) = attached(&url, home.path());
    // While `start` waits, its waiter is purged from KV, and nothing else.
    support::wait_until("start waits", Duration::from_secs(30), || {
        rt.block_on(mesh.waiters(&id)).unwrap().len() == 1
    });
    let gone_from = rt.block_on(mesh.waiters(&id)).unwrap();
    let gone = rt.block_on(async {
        mesh.exec_kv().purge(&key).await.unwrap();
        mesh.waiters(&id).await.unwrap()
    });
    assert!(gone.is_empty(), "the waiter was purged: {gone:?}");
    // `noetl admin rebuild` writes it back as it was...
    let (out, rebuilt) = rebuild(noetl(), &id, &url);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(rebuilt["waiters"], 1, "{rebuilt}");
    let back = rt.block_on(mesh.waiters(&id)).unwrap();
    assert_eq!(back, gone_from, "the waiter as it was");
    // ...and purged again, the signal finds it from the events.
    rt.block_on(mesh.exec_kv().purge(&key)).unwrap();
    // It refuses data that does not fit its schema, and continues the
    // step-run with data that does.
    let signal = |data: &str| {
        run(noetl().args([
            "exec", "signal", &id, "approval", "--data", data, "--json", "--nats", &url,
        ]))
    };
    let (out, _) = signal(r#"{"by": 7}"#);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("$.by"), "{}", text(&out));
    let (out, took) = signal(r#"{"by": "ann"}"#);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(took["step"], "start", "{took}");
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["ctx"]["by"], "ann", "{end}");
    // Consumed once: a second signal finds no waiter, in KV or the log.
    let (out, _) = signal(r#"{"by": "bo"}"#);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(rt.block_on(mesh.waiters(&id)).unwrap().is_empty());
    drop(mesh);
    drop(rt);
    let (out, report) = run(noetl().args(["exec", "replay", &id, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}: {report}", text(&out));
    assert_eq!(report["equal"], true, "{report}");
}

#[test]
fn a_running_loop_whose_run_chunks_claims_and_ctx_are_purged_completes_as_a_clean_run() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop", "python"]);

    let id = support::exec_start(noetl(), &url, &[fixture("purged_loop.yaml")]);
    // A few iterations in (2 at a time, 0.3 s each), every record of the
    // loop run is purged: its record, its collection, its iterations'
    // claims (the `seen` contributions), and the execution's ctx.
    support::wait_until("iterations end", Duration::from_secs(30), || {
        let (out, _) = run(noetl().args([
            "events",
            "tail",
            "--execution",
            &id,
            "--type",
            "loop.iteration.done",
            "--from-start",
            "--no-follow",
            "--nats",
            &url,
        ]));
        String::from_utf8_lossy(&out.stdout).lines().count() >= 3
    });
    let (rt, mesh) = attached(&url, home.path());
    let purged = rt.block_on(async {
        let keys = noetl_mesh::kv::keys_under(mesh.loop_kv(), &id)
            .await
            .unwrap();
        for k in &keys {
            mesh.loop_kv().purge(k).await.unwrap();
        }
        mesh.ctx_kv().purge(&id).await.unwrap();
        keys
    });
    drop(mesh);
    drop(rt);
    assert!(
        purged.iter().any(|k| k.contains(".items.")) && purged.iter().any(|k| k.contains(".it.")),
        "the run's chunks and claims were purged: {purged:?}"
    );
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    let n = 12u64;
    assert_eq!(
        end["ctx"]["total"],
        json!((0..n).map(|i| i * i).sum::<u64>()),
        "{end}"
    );
    assert_eq!(
        end["ctx"]["seen"],
        json!((0..n).collect::<Vec<_>>()),
        "{end}"
    );
    assert_eq!(end["ctx"]["done"], json!(n), "{end}");
    let (out, report) = run(noetl().args(["exec", "replay", &id, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}: {report}", text(&out));
}

#[test]
fn a_running_loop_s_run_and_checkpoints_purged_are_written_back_by_admin_rebuild_as_they_were() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop", "python"]);

    let id = support::exec_start(noetl(), &url, &[fixture("purged_checkpoint.yaml")]);
    let (rt, mesh) = attached(&url, home.path());
    let stored = || {
        rt.block_on(async {
            let mut out = std::collections::BTreeMap::new();
            for k in noetl_mesh::kv::keys_under(mesh.loop_kv(), &id)
                .await
                .unwrap()
            {
                let v: Option<Value> = noetl_mesh::kv::get(mesh.loop_kv(), &k).await.unwrap();
                out.insert(k, v);
            }
            out
        })
    };
    // Both iterations set `iter` and sleep in `slow`: each has a
    // checkpoint, and nothing moves until they wake.
    support::wait_until("both checkpoints", Duration::from_secs(30), || {
        stored().keys().filter(|k| k.contains(".ckpt.")).count() == 2
    });
    let before = stored();
    rt.block_on(async {
        for k in before.keys() {
            mesh.loop_kv().purge(k).await.unwrap();
        }
    });
    assert!(stored().is_empty(), "the loop run's records were purged");
    let (out, rebuilt) = rebuild(noetl(), &id, &url);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(rebuilt["loop_runs"], 1, "{rebuilt}");
    assert_eq!(rebuilt["checkpoints"], 2, "{rebuilt}");
    assert!(rebuilt.get("notes").is_none(), "{rebuilt}");
    let after = stored();
    let ckpts = |m: &std::collections::BTreeMap<String, Option<Value>>| {
        m.iter()
            .filter(|(k, _)| k.contains(".ckpt."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ckpts(&after),
        ckpts(&before),
        "the checkpoints as they were"
    );
    let run_key = Keys::loop_run(&id, run_id_of(&before));
    let (was, back) = (&before[&run_key], &after[&run_key]);
    for field in ["total", "done", "failed", "in_flight", "next"] {
        assert_eq!(
            was.as_ref().map(|r| &r[field]),
            back.as_ref().map(|r| &r[field]),
            "the run's {field}"
        );
    }
    // Run again, nothing is missing.
    let (out, again) = rebuild(noetl(), &id, &url);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        (&again["loop_runs"], &again["checkpoints"]),
        (&json!(0), &json!(0))
    );
    drop(mesh);
    drop(rt);
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["ctx"]["pages"], json!(3), "{end}");
    let (out, report) = run(noetl().args(["exec", "replay", &id, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}: {report}", text(&out));
}

/// The loop run id among the loop bucket's keys of an execution (the key
/// `<eid>.<run>` with nothing after the run).
fn run_id_of(keys: &std::collections::BTreeMap<String, Option<Value>>) -> &str {
    keys.keys()
        .find_map(|k| {
            let (_, rest) = k.split_once('.')?;
            (!rest.contains('.')).then_some(rest)
        })
        .expect("the loop run's record")
}

/// Attach to the mesh at `url` (for what no command does: reading the
/// stream's config, a retention sweep at a chosen time).
fn attached(url: &str, home: &std::path::Path) -> (tokio::runtime::Runtime, Mesh) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mesh = rt
        .block_on(Mesh::attach(MeshConfig {
            nats_url: url.to_string(),
            data_dir: home.to_path_buf(),
            ..MeshConfig::default()
        }))
        .unwrap();
    (rt, mesh)
}

#[test]
fn show_at_an_event_compact_keeps_the_log_and_retention_drops_only_ended_executions() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop", "python"]);
    let id = support::exec_start(noetl(), &url, &[fixture("replayed.yaml")]);
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    // One that keeps running (its `middle` naps a minute).
    let running = support::exec_start(
        noetl(),
        &url,
        &[fixture("replayed.yaml"), "--set".into(), "nap2=60".into()],
    );

    // `exec show --at`: the tree as of the first task.done.
    let (out, _) = run(noetl().args([
        "events",
        "tail",
        "--execution",
        &id,
        "--type",
        "task.done",
        "--from-start",
        "--no-follow",
        "--json",
        "--nats",
        &url,
    ]));
    let first_seq = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .next()
        .expect("a task.done");
    let at = first_seq.to_string();
    let (out, tree) =
        run(noetl().args(["exec", "show", &id, "--at", &at, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(tree["status"], "running", "{tree}");
    let steps: Vec<&str> = tree["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert!(
        !steps.contains(&"squares"),
        "not reached at seq {at}: {steps:?}"
    );
    let (out, _) = run(noetl().args(["exec", "show", &id, "--at", &at, "--nats", &url]));
    assert!(
        text(&out).contains(&format!("as of seq {at}")),
        "{}",
        text(&out)
    );
    let (out, _) = run(noetl().args(["exec", "show", &id, "--at", "soon", "--nats", &url]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--at \"soon\""), "{}", text(&out));

    // Compact: nothing ended an hour ago; with 0s the ended one goes,
    // the running one stays, and the ended one is still shown from its log.
    let (out, c) = run(noetl().args([
        "admin",
        "compact",
        "--older-than",
        "1h",
        "--dry-run",
        "--json",
        "--nats",
        &url,
    ]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(c["executions"], json!([]), "{c}");
    let (out, c) = run(noetl().args([
        "admin",
        "compact",
        "--older-than",
        "0s",
        "--json",
        "--nats",
        &url,
    ]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(c["executions"], json!([id.clone()]), "{c}");
    let (out, _) = run(noetl().args(["exec", "status", &id, "--json", "--nats", &url]));
    assert_eq!(
        out.status.code(),
        Some(3),
        "its KV state is gone: {}",
        text(&out)
    );
    let (out, _) = run(noetl().args(["exec", "show", &id, "--nats", &url]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("compacted"), "{}", text(&out));
    let (_, tree) = run(noetl().args(["exec", "show", &id, "--json", "--nats", &url]));
    assert_eq!(tree["status"], "completed", "{tree}");
    let (out, state) = run(noetl().args([
        "exec",
        "replay",
        &id,
        "--until",
        "999999999",
        "--json",
        "--nats",
        &url,
    ]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(state["ctx"]["total"], json!(5), "{state}");
    let (out, _) = run(noetl().args(["admin", "compact", "--older-than", "later", "--nats", &url]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // Retention: the event stream has no age limit; a sweep 31 days on
    // removes the ended execution's events, never the running one's.
    let (rt, mesh) = attached(&url, home.path());
    let max_age = rt.block_on(async {
        let mut s = mesh
            .js()
            .get_stream(mesh.subjects().events_stream())
            .await
            .unwrap();
        s.info().await.unwrap().config.max_age
    });
    assert_eq!(max_age, Duration::ZERO);
    let later = noetl_mesh::events::now_ms() + 31 * 86_400_000;
    let swept = rt.block_on(mesh.sweep_retention(later)).unwrap();
    assert_eq!(swept.executions, vec![id.clone()], "{swept:?}");
    // Every stored event of it (its loop's iterations stored in batches).
    assert!(swept.events > 10, "{swept:?}");
    let (out, _) = run(noetl().args(["exec", "show", &id, "--nats", &url]));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let (out, tree) = run(noetl().args(["exec", "show", &running, "--json", "--nats", &url]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(tree["status"], "running", "{tree}");
    let (out, _) = run(noetl().args(["exec", "cancel", &running, "--nats", &url]));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn replay_against_a_changed_playbook_reports_the_first_decision_that_differs() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop"]);
    let original = std::fs::read_to_string(fixture("rejudged.yaml")).unwrap();
    let id = support::exec_start(noetl(), &url, &[fixture("rejudged.yaml")]);
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["steps"]["gated"], "done", "{end}");

    let changed = |name: &str, from: &str, to: &str| {
        assert!(original.contains(from), "{from}");
        let path = home.path().join(name);
        std::fs::write(&path, original.replace(from, to)).unwrap();
        path.to_str().unwrap().to_string()
    };
    let replay_with = |file: &str| {
        run(noetl().args([
            "exec",
            "replay",
            &id,
            "--playbook",
            file,
            "--json",
            "--nats",
            &url,
        ]))
    };
    // The divergence a changed playbook gives (exit 2).
    let divergence = |file: &str| {
        let (out, r) = replay_with(file);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        r["divergence"].clone()
    };
    // Cosmetic: a description and a comment. The same decisions.
    let cosmetic = changed(
        "cosmetic.yaml",
        "desc: the first step",
        "desc: renamed # and a comment",
    );
    let (out, r) = replay_with(&cosmetic);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(r["divergence"], Value::Null, "{r}");
    assert!(r["decisions"].as_u64().unwrap() >= 4, "{r}");
    let (out, _) = run(noetl().args([
        "exec",
        "replay",
        &id,
        "--playbook",
        &cosmetic,
        "--nats",
        &url,
    ]));
    assert!(text(&out).contains("the same"), "{}", text(&out));

    // A changed arc: its args.
    let arc = changed(
        "arc.yaml",
        "args: { value: \"{{ event.result }}\" }",
        "args: { value: \"{{ event.result + 1 }}\" }",
    );
    let d = &divergence(&arc);
    assert_eq!(
        (d["decision"].as_str(), d["step"].as_str()),
        (Some("arcs"), Some("start")),
        "{d}"
    );
    assert_eq!(d["event"]["event_type"], "step.done", "{d}");
    assert!(d["recorded"].to_string().contains("\"value\":7"), "{d}");
    assert!(d["now"].to_string().contains("\"value\":8"), "{d}");
    // A changed task rule: its action.
    let rule = changed(
        "rule.yaml",
        "then: { do: continue, set_ctx: { seeded: true } }",
        "then: { do: break, set_ctx: { seeded: true } }",
    );
    let d = &divergence(&rule);
    assert_eq!(
        (d["decision"].as_str(), d["step"].as_str()),
        (Some("task policy"), Some("start")),
        "{d}"
    );
    assert_eq!(d["event"]["event_type"], "task.done", "{d}");
    assert_eq!(
        (
            d["recorded"]["action"].as_str(),
            d["now"]["action"].as_str()
        ),
        (Some("continue"), Some("break")),
        "{d}"
    );
    // A changed task rule: its `set_ctx`.
    let patch = changed(
        "patch.yaml",
        "set_ctx: { seeded: true }",
        "set_ctx: { seeded: 1 }",
    );
    let d = &divergence(&patch);
    assert_eq!(d["decision"], "task policy", "{d}");
    assert_eq!(d["now"]["set_ctx"], json!({"seeded": 1}), "{d}");
    // A changed admission.
    let admission = changed(
        "admission.yaml",
        "args.value > workload.threshold",
        "args.value > 100",
    );
    let d = &divergence(&admission);
    assert_eq!(
        (d["decision"].as_str(), d["step"].as_str()),
        (Some("admission"), Some("gated")),
        "{d}"
    );
    assert_eq!(
        (d["recorded"].as_str(), d["now"].as_str()),
        (Some("admitted"), Some("denied")),
        "{d}"
    );
    // A changed loop collection.
    let collection = changed(
        "collection.yaml",
        "range(workload.n)",
        "range(workload.n + 1)",
    );
    let d = &divergence(&collection);
    assert_eq!(d["decision"], "loop collection", "{d}");
    assert_eq!(
        (d["recorded"].clone(), d["now"].clone()),
        (json!(3), json!(4)),
        "{d}"
    );
    let (out, _) = run(noetl().args([
        "exec",
        "replay",
        &id,
        "--playbook",
        &collection,
        "--nats",
        &url,
    ]));
    assert!(
        text(&out).contains("diverges at the loop collection of step \"squares\""),
        "{}",
        text(&out)
    );
    // Every recent execution of the playbook: one, diverging.
    let (out, _) = run(noetl().args([
        "exec",
        "replay",
        "--all",
        "--since",
        "1h",
        "--playbook",
        &collection,
        "--nats",
        &url,
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("1 execution(s) checked, 1 diverge"),
        "{}",
        text(&out)
    );
    let (out, _) = run(noetl().args([
        "exec",
        "replay",
        "--all",
        "--since",
        "1h",
        "--playbook",
        &cosmetic,
        "--nats",
        &url,
    ]));
    assert!(out.status.success(), "{}", text(&out));
    // A playbook that does not load is refused before anything is read.
    let broken = changed("broken.yaml", "kind: noop", "kind: nope");
    let (out, _) = replay_with(&broken);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nope"), "{}", text(&out));
}

/// A running execution whose header was purged is still one the CLI
/// knows and operates: `exec status`, `exec why` and `exec list` show it
/// running (from its events), `pause`, `unpause`, `signal` and `cancel` act on it.
/// Before, each read the header alone and answered "no execution" (exit
/// 3) until the execution's next event wrote it back.
#[test]
fn a_running_execution_whose_header_was_purged_is_still_operated_from_the_cli() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let _services = support::mesh_services(home.path(), &url, &["noop", "wait"]);
    let (rt, mesh) = attached(&url, home.path());
    let waiting = |id: &str| {
        support::wait_until("start waits", Duration::from_secs(30), || {
            rt.block_on(mesh.waiters(id)).unwrap().len() == 1
        });
    };
    let purge_header = |id: &str| {
        rt.block_on(mesh.exec_kv().purge(Keys::header(id))).unwrap();
        assert!(rt.block_on(mesh.exec_header(id)).unwrap().is_none());
    };
    let cli = |args: &[&str]| {
        let (out, json) = run(noetl().args(args).args(["--json", "--nats", &url]));
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        json
    };

    let id = support::exec_start(noetl(), &url, &[fixture("purged_wait.yaml")]);
    waiting(&id);
    purge_header(&id);
    assert_eq!(cli(&["exec", "status", &id])["status"], "running");
    assert_eq!(cli(&["exec", "why", &id])["status"], "running");
    // Listed too (one JSON line per execution), the header still purged.
    let (out, _) = run(noetl().args(["exec", "list", "--json", "--nats", &url]));
    assert!(out.status.success(), "{}", text(&out));
    let listed: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        listed
            .iter()
            .any(|r| r["execution_id"] == id.as_str() && r["status"] == "running"),
        "{listed:?}"
    );
    assert!(rt.block_on(mesh.exec_header(&id)).unwrap().is_none());
    purge_header(&id);
    assert_eq!(cli(&["exec", "pause", &id])["paused"], true);
    purge_header(&id);
    assert_eq!(cli(&["exec", "unpause", &id])["paused"], false);
    purge_header(&id);
    let signal = [
        "exec",
        "signal",
        &id,
        "approval",
        "--data",
        r#"{"by": "ann"}"#,
    ];
    assert_eq!(cli(&signal)["step"], "start");
    let end = support::exec_wait(noetl(), &url, &id, 60);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["ctx"]["by"], "ann", "{end}");

    let other = support::exec_start(noetl(), &url, &[fixture("purged_wait.yaml")]);
    waiting(&other);
    purge_header(&other);
    let cancelled = cli(&["exec", "cancel", &other, "--wait"]);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    // Still nothing for an id neither KV nor the log knows.
    let (out, _) = run(noetl().args(["exec", "status", "no-such-id", "--nats", &url]));
    assert_eq!(out.status.code(), Some(3));
}
