//! The `nats` and `transfer` kinds as the validator sees them: their
//! fields come from `KINDS` like every built-in kind's.

use noetl_core::load::load_playbook;

fn task(fields: &str) -> String {
    format!(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: t\nworkflow:\n  - step: a\n    tool:\n      - name: t\n{fields}"
    )
}

/// `(code, line, col, message)` of every diagnostic.
fn diags(src: &str) -> Vec<(&'static str, usize, usize, String)> {
    let all = match load_playbook(src, "t.yaml") {
        Ok(l) => l.warnings.0,
        Err(e) => e.diagnostics.0,
    };
    all.into_iter()
        .map(|d| {
            let s = d.span.expect("positioned");
            (d.code.as_str(), s.line, s.col, d.message)
        })
        .collect()
}

#[test]
fn nats_and_transfer_tasks_with_their_fields_are_clean() {
    let nats = task(
        "        kind: nats\n        operation: kv_put\n        bucket: sessions\n        key: k\n        value: { a: 1 }\n        auth: nats_credential\n",
    );
    // `auth` names no keychain entry here; only what the kind reads matters.
    assert!(
        diags(&nats).iter().all(|d| d.0 != "E005" && d.0 != "E003"),
        "{:?}",
        diags(&nats)
    );
    let transfer = task(
        "        kind: transfer\n        source: { tool: http, url: \"http://x\" }\n        target: { tool: postgres, table: t, auth: pg }\n        mapping: { id: id }\n        chunk_size: 500\n        mode: upsert\n",
    );
    assert!(
        diags(&transfer)
            .iter()
            .all(|d| d.0 != "E005" && d.0 != "E003"),
        "{:?}",
        diags(&transfer)
    );
}

#[test]
fn a_misspelt_or_missing_field_is_named_at_its_place() {
    let d = diags(&task(
        "        kind: nats\n        operation: kv_get\n        buckett: b\n",
    ));
    let e = d.iter().find(|d| d.0 == "E005").expect("E005");
    assert_eq!((e.1, e.2), (11, 9));
    assert!(e.3.contains("bucket"), "{}", e.3);
    let d = diags(&task("        kind: nats\n        bucket: b\n"));
    let e = d.iter().find(|d| d.0 == "E003").expect("E003");
    assert!(e.3.contains("has no `operation`"), "{}", e.3);
    let d = diags(&task(
        "        kind: transfer\n        source: { tool: http, url: u }\n        chunk: 5\n",
    ));
    assert!(
        d.iter().any(|d| d.0 == "E003" && d.3.contains("`target`")),
        "{d:?}"
    );
    assert!(
        d.iter().any(|d| d.0 == "E005" && d.3.contains("`chunk`")),
        "{d:?}"
    );
    // A task's `name` is its label, so objects are named by `object`.
    let d = diags(&task("        kind: nats\n        operation: object_get\n        bucket: b\n        object: report.json\n"));
    assert!(d.iter().all(|d| d.0 != "E005"), "{d:?}");
}
