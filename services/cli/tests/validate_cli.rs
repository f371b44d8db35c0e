//! `noetl validate` and `noetl schema` as a user runs them.

use std::path::PathBuf;
use std::process::Command;

fn fixture(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/core/tests/fixtures")
        .join(rel)
        .display()
        .to_string()
}

fn noetl(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_noetl"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run noetl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn valid_files_print_ok_and_exit_zero() {
    let pagination = fixture("valid/pagination.yaml");
    let shapes = fixture("valid/shapes.yaml");
    let (code, out) = noetl(&["validate", &pagination, &shapes]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("ok: {pagination} (0 warnings)")),
        "{out}"
    );
    assert!(out.contains(&format!("ok: {shapes} (1 warning)")), "{out}");
    assert!(out.contains("warning[W101]"), "{out}");
}

#[test]
fn errors_show_the_source_line_caret_and_help_and_exit_one() {
    let bad = fixture("invalid/jump_unknown.yaml");
    let (code, out) = noetl(&["validate", &bad]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "{bad}:17:39: error[E022]: jump target `fetch_pages`"
        )),
        "{out}"
    );
    assert!(out.contains("17 |                 then: { do: jump, to: fetch_pages }"));
    assert!(
        out.contains("   |                                       ^"),
        "{out}"
    );
    assert!(out.contains("= help: tasks of this pipeline: `fetch`, `paginate`"));
    assert!(out.contains(&format!("refused: {bad} (1 error, 0 warnings)")));
}

#[test]
fn short_and_json_formats() {
    let bad = fixture("invalid/routing.yaml");
    let good = fixture("valid/pagination.yaml");
    let (code, out) = noetl(&["validate", "--format", "short", &bad, &good]);
    assert_eq!(code, 1);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{bad}:10:7: error[E015]: ")),
        "{out}"
    );
    assert_eq!(lines.last().unwrap(), &format!("ok: {good} (0 warnings)"));

    let (code, out) = noetl(&["validate", "--format", "json", &bad]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON output");
    let first = &v[0];
    assert_eq!(first["file"], bad.as_str());
    assert_eq!(first["line"], 10);
    assert_eq!(first["column"], 7);
    assert_eq!(first["severity"], "error");
    assert_eq!(first["code"], "E015");
    assert_eq!(first["path"], "/workflow/0/next");
    assert!(first["help"].as_str().unwrap().contains("arcs"));
}

#[test]
fn missing_file_is_an_error() {
    let (code, out) = noetl(&["validate", "/nonexistent/playbook.yaml"]);
    assert_eq!(code, 1);
    assert!(out.contains("error[E001]: cannot read the file"), "{out}");
}

#[test]
fn schema_prints_the_json_schema() {
    let (code, out) = noetl(&["schema"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("schema JSON");
    assert_eq!(v["title"], "NoETL playbook (canonical v10)");
    // Draft-07: what yaml-language-server handles best.
    assert_eq!(v["$schema"], "http://json-schema.org/draft-07/schema#");
    assert!(v["definitions"]["Step"].is_object());
    assert!(v.get("$defs").is_none());
}

fn legacy(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../playbooks/legacy")
        .join(name)
}

fn run_noetl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_noetl"))
        .args(args)
        .output()
        .expect("run noetl")
}

#[test]
fn migrate_prints_the_canonical_playbook_and_one_line_per_change() {
    let file = legacy("task_input.yaml");
    let out = run_noetl(&["migrate", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let golden = std::fs::read_to_string(legacy("migrated/task_input.yaml")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), golden);
    let name = file.display();
    assert!(
        err.contains(&format!("{name}:15: task `total`: `input` → `args`")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{name}:16: `numbers` → `workload.numbers`")),
        "{err}"
    );
    assert!(
        err.contains("8 change(s), 0 refused; the result is a valid canonical playbook"),
        "{err}"
    );
}

#[test]
fn migrate_diff_and_write_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("legacy.yaml");
    std::fs::copy(legacy("python_libs.yaml"), &copy).unwrap();
    let path = copy.to_str().unwrap();
    let out = run_noetl(&["migrate", "--diff", path]);
    assert_eq!(out.status.code(), Some(0));
    let diff = String::from_utf8_lossy(&out.stdout);
    assert!(diff.contains("-        libs: [math, json]"), "{diff}");
    assert!(diff.contains("+          import math"), "{diff}");
    assert_eq!(
        std::fs::read_to_string(&copy).unwrap(),
        std::fs::read_to_string(legacy("python_libs.yaml")).unwrap(),
        "--diff changes nothing"
    );
    let out = run_noetl(&["migrate", "--write", path]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(&copy).unwrap(),
        std::fs::read_to_string(legacy("migrated/python_libs.yaml")).unwrap()
    );
    let (code, out) = noetl(&["validate", path]);
    assert_eq!(code, 0, "{out}");
    // A second run has nothing left to do.
    let out = run_noetl(&["migrate", "--write", path]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("0 change(s), 0 refused"));
}

#[test]
fn migrate_says_what_it_refused_and_exits_1() {
    let out = run_noetl(&[
        "migrate",
        "--diff",
        legacy("refused.yaml").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused.yaml:9: refused: step `start`: step-level `vars`"),
        "{err}"
    );
    assert!(err.contains("the result does not load yet"), "{err}");
    // Several files need --write or --diff.
    let a = legacy("refused.yaml");
    let out = run_noetl(&["migrate", a.to_str().unwrap(), a.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --write"));
}

/// The spec's smaller gaps (docs/errors.md E046, E047) are refused by
/// `validate` and by `run` alike, with the file, line and column, before
/// anything runs: both load through the same checks.
#[test]
fn validate_and_run_refuse_loop_done_loop_outside_a_loop_and_sugar_the_same_way() {
    let bad = fixture("invalid/spec_gaps.yaml");
    let lines = [
        format!("{bad}:18:17: error[E046]: template reads `loop.done`, which is not a variable"),
        format!("{bad}:23:23: error[E046]: template reads `loop.index` in a task of step `report`, which has no `loop`"),
        format!("{bad}:24:9: error[E047]: task `task_1` of step `report` uses the authoring sugar `choose`"),
    ];
    let (code, out) = noetl(&["validate", &bad]);
    assert_eq!(code, 1, "{out}");
    for l in &lines {
        assert!(out.contains(l.as_str()), "validate: no `{l}` in:\n{out}");
    }
    let run = run_noetl(&["run", &bad]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_ne!(run.status.code(), Some(0), "{err}");
    for l in &lines {
        assert!(err.contains(l.as_str()), "run: no `{l}` in:\n{err}");
    }
}

/// A playbook with a python task whose code does not compile (a block
/// scalar, its error on the code's second line), one whose top level
/// `return`s (as a task may), and a one-line one that does not compile.
const PYTHON_TASKS: &str = r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: python_syntax }
workflow:
  - step: start
    tool:
      - name: broken
        kind: python
        code: |
          total = 0
          def main(:
              return total
      - name: returns
        kind: python
        code: |
          x = 2
          return x * 2
      - name: unclosed
        kind: python
        code: "result = (1"
      - name: scripted
        kind: python
        script: { uri: inline, source: { type: inline, code: "if x" } }
workbook:
  - name: helper
    kind: python
    code: |
      def f():
      return 1
"#;

#[test]
fn validate_points_at_python_code_that_does_not_compile() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("python_syntax.yaml");
    std::fs::write(&file, PYTHON_TASKS).unwrap();
    let path = file.display().to_string();
    let (code, out) = noetl(&["validate", &path]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "{path}:11:20: error[E048]: python code of task `broken` of step `start` does not compile"
        )),
        "{out}"
    );
    assert!(out.contains("11 |           def main(:"), "{out}");
    assert!(out.contains("(line 2 of the code)"), "{out}");
    assert!(
        out.contains(&format!(
            "{path}:20:25: error[E048]: python code of task `unclosed` of step `start` does not compile"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "{path}:23:67: error[E048]: python code of task `scripted` of step `start` does not compile"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "{path}:29:7: error[E048]: python code of workbook task `helper` does not compile"
        )),
        "{out}"
    );
    assert!(!out.contains("task `returns`"), "{out}");
    assert!(out.contains("(Python 3."), "{out}");
    assert!(out.contains(&format!("refused: {path} (4 errors, 0 warnings)")));

    // `run` refuses it the same way, before it starts anything.
    let out = Command::new(env!("CARGO_BIN_EXE_noetl"))
        .args(["run", &path])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error[E048]: python code of task `broken` of step `start`"),
        "{stderr}"
    );
    assert!(!stderr.contains("execution"), "{stderr}");

    // Without an interpreter the code is not checked, and a note says so.
    let out = Command::new(env!("CARGO_BIN_EXE_noetl"))
        .args(["validate", &path])
        .env("NO_COLOR", "1")
        .env("NOETL_PYTHON", "/nonexistent/python9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("python code not checked") && stderr.contains("/nonexistent/python9"),
        "{stderr}"
    );
}
