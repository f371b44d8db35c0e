//! `noetl migrate` on `playbooks/legacy/`: each legacy playbook, migrated,
//! must equal its golden canonical form in `playbooks/legacy/migrated/`
//! (the text) and `<name>.log` (one line per change or refusal), and the
//! migrated form must load with no error unless the file is there to show
//! refusals. `BLESS=1` rewrites the goldens.

use std::path::{Path, PathBuf};

use noetl_migrate::migrate;

fn legacy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../playbooks/legacy")
}

fn log_of(m: &noetl_migrate::Migration) -> String {
    m.report()
        .into_iter()
        .map(|(line, text)| format!("{line}: {text}\n"))
        .collect()
}

#[test]
fn every_legacy_playbook_migrates_to_its_golden_canonical_form() {
    let bless = std::env::var("BLESS").is_ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(legacy_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "too few legacy playbooks");
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_stem().unwrap().to_string_lossy().to_string();
        let src = std::fs::read_to_string(file).unwrap();
        let m = migrate(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
        let log = log_of(&m);
        let golden = legacy_dir().join("migrated").join(format!("{name}.yaml"));
        let golden_log = legacy_dir().join("migrated").join(format!("{name}.log"));
        if bless {
            std::fs::write(&golden, &m.text).unwrap();
            std::fs::write(&golden_log, &log).unwrap();
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        let want_log = std::fs::read_to_string(&golden_log).unwrap_or_default();
        if m.text != want {
            failures.push(format!(
                "{name}: migrated text differs from {}:\n{}",
                golden.display(),
                m.text
            ));
        }
        if log != want_log {
            failures.push(format!(
                "{name}: changes differ from {}:\n{log}",
                golden_log.display()
            ));
        }
        assert!(
            !m.changes.is_empty() || !m.refusals.is_empty(),
            "{name}: nothing to migrate"
        );
        // Migrating again changes nothing.
        let again = migrate(&m.text).unwrap();
        assert!(
            again.changes.is_empty(),
            "{name}: a second run changes {:?}",
            again.changes
        );
        let loaded = noetl_core::load::load_playbook(&m.text, &format!("{name}.yaml"));
        match (name.as_str(), loaded) {
            ("refused", Err(_)) => assert!(!m.refusals.is_empty()),
            ("refused", Ok(_)) => failures.push("refused: expected to stay invalid".into()),
            (_, Ok(l)) => {
                if let Some(w) = l.warnings.0.iter().find(|w| w.code == "W107") {
                    failures.push(format!(
                        "{name}: a bare workload name is left: {}",
                        w.message
                    ));
                }
            }
            (_, Err(e)) => failures.push(format!("{name}: the migrated form does not load:\n{e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_legacy_playbook_is_refused_as_written() {
    for entry in std::fs::read_dir(legacy_dir()).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            let src = std::fs::read_to_string(&p).unwrap();
            let loaded = noetl_core::load::load_playbook(&src, "x.yaml");
            assert!(
                loaded.is_err(),
                "{} loads as written: not legacy",
                p.display()
            );
        }
    }
}

#[test]
fn every_runnable_legacy_playbook_has_a_clean_canonical_twin() {
    let migrated = legacy_dir().join("migrated");
    let mut runnable: Vec<String> = std::fs::read_dir(&migrated)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_string_lossy().to_string();
            name.strip_suffix(".expect.json").map(str::to_string)
        })
        .collect();
    runnable.sort();
    assert!(runnable.len() >= 6, "too few runnable legacy examples");
    for name in runnable {
        let twin = legacy_dir().join("canonical").join(format!("{name}.yaml"));
        let src = std::fs::read_to_string(&twin)
            .unwrap_or_else(|e| panic!("{name}: no canonical twin {}: {e}", twin.display()));
        let loaded = noetl_core::load::load_playbook(&src, &format!("{name}.yaml"))
            .unwrap_or_else(|e| panic!("{name}: the twin does not load: {e}"));
        assert!(
            loaded.warnings.0.is_empty(),
            "{name}: the canonical twin draws warnings: {:?}",
            loaded.warnings.0
        );
        assert!(
            migrate(&src).unwrap().changes.is_empty(),
            "{name}: migrate would change the canonical twin"
        );
    }
}
