//! `--migrate` on `run`, `exec start` and `playbook register`, and
//! `playbook register DIR --recursive`: legacy NoETL playbooks run as
//! written, each against a real nats-server.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

mod support;
use support::Procs;

/// The legacy folder: `parent.yaml` calls `sub/child.yaml` by catalog
/// path; `sub/notes.yml` is not a playbook; `broken.yaml` is refused.
fn tree() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/legacy_tree")
}

fn parent() -> String {
    tree().join("parent.yaml").display().to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// `noetl playbook register TREE --recursive --migrate --json` plus
/// `extra`, asserting it exits 1 (`broken.yaml` is not registered) and
/// what became of each file (the playbooks stored as `version`).
fn register_tree(mut noetl: Command, extra: &[&str], version: u64) {
    let out = noetl
        .args(["playbook", "register"])
        .arg(tree())
        .args(["--recursive", "--migrate", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "one file failed: {err}");
    let rows: Vec<Value> = json_of(&out).as_array().unwrap().clone();
    let by_file = |name: &str| -> &Value {
        rows.iter()
            .find(|r| r["file"].as_str().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("no row for {name}: {rows:?}"))
    };
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(by_file("parent.yaml")["path"], "legacy/parent");
    assert_eq!(by_file("parent.yaml")["version"], version);
    assert_eq!(by_file("sub/child.yaml")["path"], "legacy/child");
    assert_eq!(by_file("sub/child.yaml")["version"], version);
    assert_eq!(
        by_file("sub/notes.yml")["skipped"],
        "not a Playbook (kind: Notes)"
    );
    let broken = by_file("broken.yaml")["error"].as_str().unwrap();
    assert!(broken.starts_with("does not load: "), "{broken}");
    // The rewrite's change lines, as `noetl migrate` prints them, and its
    // refusal.
    assert!(
        err.contains("parent.yaml:17: task `call`: `input` → `args`"),
        "{err}"
    );
    assert!(err.contains("broken.yaml:10: refused: "), "{err}");
}

#[test]
fn run_migrate_runs_a_legacy_file_and_prints_the_changes() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    let child = tree().join("sub/child.yaml");
    // As written, the legacy child is refused where it loads.
    let out = noetl()
        .args(["run", "--json", "--timeout", "120"])
        .arg(&child)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // With --migrate it runs, as NoETL would run it.
    let out = noetl()
        .args(["run", "--migrate", "--json", "--timeout", "120"])
        .arg(&child)
        .args(["--set", "n=21"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let s = json_of(&out);
    assert_eq!(s["status"], "completed");
    assert_eq!(s["ctx"]["doubled"], 42, "{s}");
    assert!(
        err.contains("child.yaml:14: task `double`: `input` → `args`"),
        "{err}"
    );
    assert!(err.contains("migrated in memory: "), "{err}");

    // A rewrite that still does not load stops before anything runs, with
    // the diagnostics and where their lines come from.
    let out = noetl()
        .args(["run", "--migrate", "--json"])
        .arg(tree().join("broken.yaml"))
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("refused: "), "{err}");
    assert!(err.contains("error["), "{err}");
    assert!(out.stdout.is_empty(), "nothing ran: {}", text(&out.stdout));

    // A catalog path runs what was registered: --migrate is for files.
    let out = noetl()
        .args(["run", "--migrate", "legacy/parent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("noetl playbook register FILE --migrate"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_registered_legacy_folder_runs_by_path_from_the_local_store() {
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    register_tree(noetl(), &[], 1);
    // The catalog holds the migrated text: it loads as is.
    let show = noetl()
        .args(["playbook", "show", "legacy/child"])
        .output()
        .unwrap();
    assert!(show.status.success(), "{}", text(&show.stderr));
    let yaml = text(&show.stdout);
    assert!(yaml.contains("args:") && !yaml.contains("input:"), "{yaml}");

    // The parent, by path, calls the child by path.
    let out = noetl()
        .args(["run", "--json", "--timeout", "120", "legacy/parent"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = json_of(&out);
    assert_eq!(s["status"], "completed");
    assert_eq!(s["ctx"]["doubled"], 8, "{s}");
    // And the parent's file, migrated in memory, finds the same child.
    let out = noetl()
        .args(["run", "--migrate", "--json", "--timeout", "120", &parent()])
        .args(["--set", "n=5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json_of(&out)["ctx"]["doubled"], 10);

    // Registering again makes the next versions; a folder needs --recursive.
    register_tree(noetl(), &[], 2);
    let out = noetl()
        .args(["playbook", "register"])
        .arg(tree())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("add --recursive"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn exec_start_migrate_runs_on_separate_services_with_children_from_the_catalog() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let home = tempfile::tempdir().unwrap();
    let noetl = || support::noetl(home.path());
    support::admin_init(noetl(), &url);
    let mut children = Vec::new();
    for args in [
        vec!["router"],
        vec!["scheduler"],
        vec!["loop-supervisor"],
        vec!["executor", "--kind", "python"],
        vec!["executor", "--kind", "playbook"],
    ] {
        children.push(support::serve(noetl(), &url, &args));
    }
    let _services = Procs(children);
    register_tree(noetl(), &["--nats", &url], 1);

    let file = parent();
    let id = support::exec_start(noetl(), &url, &["--migrate", file.as_str(), "--set", "n=7"]);
    let s = support::exec_wait(noetl(), &url, &id, 120);
    assert_eq!(s["status"], "completed");
    assert_eq!(s["ctx"]["doubled"], 14, "{s}");

    // Without --migrate the legacy file is refused before anything starts.
    let out = noetl()
        .args(["exec", "start", &file, "--nats", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn migrate_help_points_to_the_compatibility_table() {
    let home = tempfile::tempdir().unwrap();
    let out = support::noetl(home.path())
        .args(["migrate", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = text(&out.stdout);
    assert!(help.contains("docs/noetl-compat.md"), "{help}");
}
