//! `noetl schedule ...` and `noetl serve timer` end to end: the `noetl`
//! binary against a real nats-server, the services as separate processes.

use std::process::Output;
use std::time::Duration;

use serde_json::Value;

mod support;
use support::{admin_init, exec_wait, noetl, serve, wait_until, Procs};

fn fixture(name: &str) -> String {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn schedules_are_checked_listed_backfilled_fired_and_removed() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let home = tempfile::tempdir().unwrap();
    admin_init(noetl(home.path()), &url);
    let cli = |args: &[&str]| -> Output {
        noetl(home.path())
            .args(args)
            .args(["--nats", &url])
            .output()
            .unwrap()
    };
    let out = cli(&["playbook", "register", &fixture("catalog_v.yaml")]);
    assert!(out.status.success(), "{}", text(&out));

    // Refused, naming what is wrong: exit 2, or 3 for an unknown playbook.
    let add = |name: &str, playbook: &str, extra: &[&str]| {
        let mut args = vec!["schedule", "add", name, playbook];
        args.extend_from_slice(extra);
        cli(&args)
    };
    for (name, playbook, extra, code, says) in [
        (
            "bad",
            "demo/catalogued",
            &["--cron", "* * *"][..],
            2,
            "cron expression \"* * *\" is invalid",
        ),
        (
            "bad",
            "demo/catalogued",
            &["--cron", "* * * * *", "--tz", "Mars/Base"],
            2,
            "unknown time zone \"Mars/Base\"",
        ),
        (
            "a.b",
            "demo/catalogued",
            &["--cron", "* * * * *"],
            2,
            "schedule name \"a.b\" is invalid",
        ),
        (
            "bad",
            "demo/nothing",
            &["--cron", "* * * * *"],
            3,
            "demo/nothing",
        ),
        (
            "bad",
            "demo/catalogued",
            &["--cron", "* * * * *", "--overlap", "never"],
            2,
            "never",
        ),
        (
            "bad",
            "demo/catalogued",
            &["--cron", "* * * * *", "--catch-up", "all"],
            2,
            "catch-up",
        ),
    ] {
        let out = add(name, playbook, extra);
        assert_eq!(out.status.code(), Some(code), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{}",
            text(&out)
        );
    }

    let out = add(
        "every_second",
        "demo/catalogued",
        &[
            "--cron",
            "* * * * * *",
            "--overlap",
            "allow",
            "--set",
            "v=7",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let added: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(added["workload"]["v"], 7);
    assert_eq!(added["catch_up"], serde_json::json!({"last": 1}));
    assert_eq!(added["next_ticks"].as_array().unwrap().len(), 5);
    let again = add("every_second", "demo/catalogued", &["--cron", "* * * * *"]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));

    // Backfill: one run per tick, once.
    let fill = || {
        cli(&[
            "schedule",
            "backfill",
            "every_second",
            "--json",
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "2026-01-01T00:00:02Z",
        ])
    };
    let out = fill();
    assert!(out.status.success(), "{}", text(&out));
    let ticks: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(ticks.len(), 3);
    assert!(ticks.iter().all(|t| t["started"] == true));

    let mut procs = Procs(Vec::new());
    for service in [
        &["router"][..],
        &["scheduler"],
        &["executor", "--kind", "noop"],
        &["timer"],
    ] {
        procs.0.push(serve(noetl(home.path()), &url, service));
    }
    for t in &ticks {
        let s = exec_wait(
            noetl(home.path()),
            &url,
            t["execution_id"].as_str().unwrap(),
            60,
        );
        assert_eq!(
            s["ctx"]["v"], 7,
            "the schedule's --set reached the run: {s}"
        );
    }
    let out = fill();
    let again: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        again.iter().all(|t| t["started"] == false),
        "{}",
        text(&out)
    );

    // The timer fires it.
    let started = || {
        let out = cli(&["schedule", "show", "every_second", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["state"]["started"].as_u64().unwrap_or(0)
    };
    wait_until("the timer to fire twice", Duration::from_secs(30), || {
        started() >= 2
    });

    let out = cli(&["schedule", "list", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["name"], "every_second", "{}", text(&out));
    let out = cli(&["schedule", "pause", "every_second"]);
    assert!(out.status.success(), "{}", text(&out));
    // Without --json, `show` speaks text, not JSON (issue 40, point 10).
    let out = cli(&["schedule", "show", "every_second"]);
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.starts_with("schedule every_second  paused\n"),
        "{shown}"
    );
    assert!(serde_json::from_str::<Value>(&shown).is_err(), "{shown}");
    let out = cli(&["schedule", "remove", "every_second"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = cli(&["schedule", "show", "every_second"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let out = cli(&["schedule", "list"]);
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        text(&out)
    );
}
