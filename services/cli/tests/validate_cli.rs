//! `noetl validate` and `noetl schema` as a user runs them.

use std::path::PathBuf;
use std::process::Command;

fn fixture(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/fixtures")
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
