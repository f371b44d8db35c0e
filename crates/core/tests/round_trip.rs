//! A normalised playbook, written as JSON, loads again into the same
//! playbook: `noetl exec retry` sends an inline playbook's normalised form
//! (the plan keeps no source text), so every example must survive it.

use std::path::PathBuf;

use noetl_core::load::load_playbook;

#[test]
fn every_example_playbook_loads_again_from_its_normalised_json() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../playbooks");
    let mut checked = 0;
    let files = [root.clone(), root.join("seeds")]
        .into_iter()
        .flat_map(|dir| std::fs::read_dir(dir).unwrap())
        .map(|entry| entry.unwrap().path());
    for path in files {
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.display().to_string();
        let Ok(first) = load_playbook(&text, &name) else {
            continue;
        };
        let json = serde_json::to_string(&first.playbook).unwrap();
        let again = load_playbook(&json, &name)
            .unwrap_or_else(|e| panic!("{name}: its normalised JSON does not load: {e}\n{json}"));
        assert_eq!(again.playbook, first.playbook, "{name}");
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} playbooks checked");
}
