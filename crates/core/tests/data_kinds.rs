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

#[test]
fn transfer_sides_of_s3_and_gcs_are_clean_and_wrong_sides_are_refused_at_their_field() {
    let clean = task(
        "        kind: transfer\n        source: { tool: s3, url: \"s3://{{ workload.bucket }}/in/rows.csv\", auth: s3_main }\n        target: { type: gcs, url: \"gs://out/rows.jsonl\", mapping: { id: id } }\n        mode: replace\n",
    );
    let d = diags(&clean);
    assert!(
        d.iter()
            .all(|d| !["E003", "E004", "E005", "E007"].contains(&d.0)),
        "{d:?}"
    );
    let d = diags(&task(
        "        kind: transfer\n        source:\n          tool: s3\n          url: \"gs://b/rows.jsonl\"\n        target: { tool: snowflake, table: t }\n",
    ));
    let url = d
        .iter()
        .find(|d| d.3.contains("`source.url`"))
        .expect("source.url");
    assert_eq!((url.0, url.1, url.2), ("E004", 12, 16), "{d:?}");
    assert!(
        url.3.contains(
            "\"gs://b/rows.jsonl\" is not an object of source `s3`: write s3://bucket/key"
        ),
        "{}",
        url.3
    );
    let tool = d
        .iter()
        .find(|d| d.3.contains("`target.tool`"))
        .expect("target.tool");
    assert_eq!((tool.0, tool.1), ("E007", 13), "{d:?}");
    let d = diags(&task(
        "        kind: transfer\n        source: { tool: postgres, query: q }\n        target: { tool: gcs, url: \"gs://b/rows\" }\n        mode: upsert\n",
    ));
    let codes: Vec<(&str, String)> = d
        .iter()
        .filter(|d| d.3.contains("transfer task"))
        .map(|d| (d.0, d.3.split(' ').next().unwrap_or("").to_string()))
        .collect();
    assert_eq!(
        codes,
        [
            ("E003", "`target.format`".to_string()),
            ("E004", "`mode`".to_string())
        ],
        "{d:?}"
    );
}
