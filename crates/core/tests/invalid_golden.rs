//! Golden diagnostics: every `invalid/*.yaml` and `warnings/*.yaml` under
//! `playbooks/` (and this crate's `tests/fixtures/`) is loaded, its short
//! diagnostics (file paths relative to that root) are compared with the
//! sibling `<name>.expected`, and every code named on a `# expect:` line must
//! be among them. `BLESS=1 cargo test -p noetl-core --test invalid_golden`
//! (re)writes the `.expected` files.

use std::path::{Path, PathBuf};

use noetl_core::load::load_playbook;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn repo_playbooks() -> PathBuf {
    crate_dir().join("../../playbooks")
}

fn fixtures() -> PathBuf {
    crate_dir().join("tests/fixtures")
}

/// Codes named by `# expect: E022` lines (several per line allowed,
/// separated by spaces or commas).
fn expected_codes(src: &str) -> Vec<String> {
    src.lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .filter_map(|l| l.trim_start().strip_prefix("expect:"))
        .flat_map(|rest| {
            rest.split(|c: char| c == ',' || c.is_whitespace())
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Check one `root/<sub>/*.yaml` family; returns (files checked, failures).
fn check(root: &Path, sub: &str, must_fail: bool) -> (usize, Vec<String>) {
    let bless = std::env::var_os("BLESS").is_some();
    let files = yaml_files(&root.join(sub));
    let mut failures = Vec::new();
    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let rel = format!("{sub}/{file}");
        let src = std::fs::read_to_string(path).unwrap();
        let (diags, failed) = match load_playbook(&src, &rel) {
            Ok(l) => (l.warnings, false),
            Err(e) => (e.diagnostics, true),
        };
        if failed != must_fail {
            failures.push(format!(
                "{rel}: expected it to {}, got:\n{}",
                if must_fail { "be refused" } else { "load" },
                diags.render_short(&rel)
            ));
        }
        let got_codes = diags.codes();
        let want = expected_codes(&src);
        if want.is_empty() {
            failures.push(format!("{rel}: no `# expect: CODE` line"));
        }
        for code in &want {
            if !got_codes.iter().any(|c| c == code) {
                failures.push(format!(
                    "{rel}: expected {code}, got {got_codes:?}:\n{}",
                    diags.render_short(&rel)
                ));
            }
        }
        let rendered = format!("{}\n", diags.render_short(&rel));
        let expected_path = path.with_extension("expected");
        if bless {
            std::fs::write(&expected_path, &rendered).unwrap();
            continue;
        }
        match std::fs::read_to_string(&expected_path) {
            Ok(expected) if expected == rendered => {}
            Ok(expected) => failures.push(format!(
                "{rel}: diagnostics differ from {} (BLESS=1 to accept)\n--- expected\n{expected}--- got\n{rendered}",
                expected_path.display()
            )),
            Err(_) => failures.push(format!(
                "{rel}: no {} (run with BLESS=1)\n{rendered}",
                expected_path.display()
            )),
        }
    }
    (files.len(), failures)
}

/// Checks both families under `root`. A missing or emptied folder is a
/// failure, not a silent pass: each must hold at least `min_invalid` /
/// `min_warnings` playbooks.
fn run(root: &Path, min_invalid: usize, min_warnings: usize) {
    let (n_invalid, mut failures) = check(root, "invalid", true);
    let (n_warn, more) = check(root, "warnings", false);
    failures.extend(more);
    assert!(
        n_invalid >= min_invalid,
        "{n_invalid} golden files under {:?}, expected at least {min_invalid}",
        root.join("invalid")
    );
    assert!(
        n_warn >= min_warnings,
        "{n_warn} golden files under {:?}, expected at least {min_warnings}",
        root.join("warnings")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn crate_fixtures_match_their_golden_diagnostics() {
    run(&fixtures(), 5, 2);
}

#[test]
fn repository_playbooks_match_their_golden_diagnostics() {
    run(&repo_playbooks(), 30, 5);
}

#[test]
#[should_panic(expected = "golden files under")]
fn a_missing_golden_folder_fails() {
    run(&crate_dir().join("tests/no-such-folder"), 1, 1);
}

#[test]
fn expect_lines_are_parsed() {
    assert_eq!(
        expected_codes("# expect: E022\n# expect: E030, W102 E001\nkey: 1 # expect: no\n"),
        vec!["E022", "E030", "W102", "E001"]
    );
}
