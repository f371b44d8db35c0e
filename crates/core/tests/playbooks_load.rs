//! Every example playbook (`playbooks/*.yaml`, `playbooks/seeds/*.yaml`) and
//! every valid fixture loads with zero errors; the normalised model is
//! runnable (entry step, canonical task names).

use std::path::{Path, PathBuf};

use noetl_core::load::load_file;

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

fn load_all(files: &[PathBuf]) -> Vec<String> {
    let mut failures = Vec::new();
    for f in files {
        match load_file(f) {
            Ok(l) => {
                let pb = &l.playbook;
                if pb.entry_step().is_none() {
                    failures.push(format!("{}: no entry step", f.display()));
                }
                for s in &pb.workflow {
                    for t in &s.tool {
                        if t.name.is_empty() || t.kind.is_empty() {
                            failures.push(format!("{}: task without name/kind", f.display()));
                        }
                    }
                }
            }
            Err(e) => failures.push(e.render_human()),
        }
    }
    failures
}

#[test]
fn repository_playbooks_load_without_errors() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../playbooks");
    let mut files = yaml_files(&root);
    files.extend(yaml_files(&root.join("seeds")));
    let failures = load_all(&files);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn valid_fixtures_load_without_errors() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/valid");
    let files = yaml_files(&dir);
    assert!(files.len() >= 2);
    let failures = load_all(&files);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn seed_examples_load_without_warnings() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../playbooks/seeds");
    let files = yaml_files(&dir);
    assert!(files.len() >= 13, "{} seed examples", files.len());
    let mut noisy = Vec::new();
    for f in &files {
        match load_file(f) {
            Ok(l) if l.warnings.is_empty() => {}
            Ok(l) => noisy.push(l.warnings.render_short(&f.display().to_string())),
            Err(e) => noisy.push(e.render_human()),
        }
    }
    assert!(noisy.is_empty(), "{}", noisy.join("\n"));
}
