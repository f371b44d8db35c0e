//! NoETL's playbooks register as written: a document in NoETL's dialect
//! sent to `/api/catalog/register` (or in a batch) is rewritten by the
//! `noetl migrate` code, stored canonical with the text as sent beside
//! it, and answered with what was rewritten; what the rewrite cannot make
//! canonical is refused with `noetl validate`'s diagnostics at the lines
//! of the text sent. Over a real mesh and real HTTP.

use serde_json::{json, Value};

mod support;
use support::{assert_error, Api, FLOW};

/// Our own playbook in NoETL's dialect (`input`, a bare workload name,
/// `output.data`, `next` as a list); it adds the workload's numbers.
const SUM: &str = include_str!("fixtures/noetl_dialect/sum.yaml");
/// NoETL's dialect with a step-level `case` on line 25, which migrate
/// cannot rewrite.
const CASE: &str = include_str!("fixtures/noetl_dialect/case.yaml");

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// The warnings of an answer, as strings.
fn warnings(v: &Value) -> Vec<String> {
    v["warnings"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|w| w.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_noetl_playbook_registers_as_written_and_runs_migrated() {
    let (api, keys) = Api::start().await;
    let (admin, viewer) = (Some(keys.admin.as_str()), Some(keys.viewer.as_str()));

    // As NoETL's client sends it: base64 of the file.
    let reg = api
        .post(
            "/api/catalog/register",
            admin,
            &json!({"content": base64_of(SUM), "resource_type": "Playbook"}),
        )
        .await;
    assert_eq!(reg.status, 200, "{}", reg.text);
    assert_eq!(reg.json["catalog_id"], "tests/noetl_dialect_sum@v1");
    assert_eq!(reg.json["migrated"], true, "{}", reg.text);
    // What was rewritten, at the lines of the text sent.
    let said = warnings(&reg.json);
    for want in [
        "<request>:18: migrated: task `total`: `input` → `args`",
        "<request>:19: migrated: ",
        "<request>:24: migrated: ",
    ] {
        assert!(
            said.iter().any(|w| w.starts_with(want)),
            "{want:?} missing: {said:#?}"
        );
    }

    // Stored canonical, with the text as sent beside it.
    let got = api
        .post(
            "/api/catalog/resource",
            viewer,
            &json!({"path": "tests/noetl_dialect_sum"}),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.json["original_content"], SUM);
    let content = got.json["content"].as_str().unwrap();
    assert!(content.contains("args:"), "{content}");
    assert!(content.contains("{{ workload.numbers }}"), "{content}");
    assert!(!content.contains("input:"), "{content}");
    assert_eq!(got.json["layout"][0]["step"], "start");

    // It runs as NoETL ran it: the sum, and the `set` into ctx.
    let id = api
        .execute(Some(&keys.operator), "tests/noetl_dialect_sum", json!({}))
        .await;
    api.wait_status(&id, viewer, "COMPLETED").await;
    let result = api
        .get(&format!("/api/executions/{id}/results/start"), viewer)
        .await;
    assert_eq!(result.json["result"], 6, "{}", result.text);
    let detail = api.get(&format!("/api/executions/{id}"), viewer).await;
    assert_eq!(detail.json["ctx"]["total"], 6, "{}", detail.text);

    // Registered again, the stored (canonical) text has nothing to migrate.
    let again = api.register(admin, content).await;
    assert_eq!(again["version"], 2);
    assert_eq!(again.get("migrated"), None, "{again}");
    let v2 = api
        .post(
            "/api/catalog/resource",
            viewer,
            &json!({"path": "tests/noetl_dialect_sum", "version": 2}),
        )
        .await;
    assert_eq!(v2.json.get("original_content"), None, "{}", v2.text);

    // Ours is stored as written.
    let ours = api.register(admin, FLOW).await;
    assert_eq!(ours.get("migrated"), None, "{ours}");

    // `migrate: false` takes the text as written, which does not load.
    let strict = api
        .post(
            "/api/catalog/register",
            admin,
            &json!({"content": SUM, "migrate": false}),
        )
        .await;
    assert_error(&strict, 422, "E005");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_migrate_cannot_rewrite_is_refused_at_the_line_sent() {
    let (api, keys) = Api::start().await;
    let admin = Some(keys.admin.as_str());
    let refused = api
        .post("/api/catalog/register", admin, &json!({"content": CASE}))
        .await;
    assert_error(&refused, 422, "<request>:25:");
    let error = refused.json["error"].as_str().unwrap();
    assert!(error.contains("refused: "), "{error}");
    assert!(error.contains("E013"), "{error}");
    // The diagnostics are `noetl validate --format json`'s, at line 25 of
    // the text sent (the migrated text has it lower down).
    let d = refused.json["diagnostics"].as_array().unwrap();
    let case = d.iter().find(|d| d["code"] == "E013").expect("E013");
    assert_eq!(case["line"], 25, "{case}");
    assert_eq!(case["file"], "<request>");
    assert!(case["message"].as_str().unwrap().contains("case"), "{case}");
    // Nothing was stored.
    let gone = api
        .post(
            "/api/catalog/resource",
            admin,
            &json!({"path": "tests/noetl_dialect_case"}),
        )
        .await;
    assert_eq!(gone.status, 404, "{}", gone.text);

    // NoETL's `catalog load`: each item migrated or refused alone.
    let batch = api
        .post(
            "/api/catalog/register/batch",
            admin,
            &json!({"items": [{"content": SUM}, {"content": CASE}, {"content": FLOW}]}),
        )
        .await;
    assert_eq!(batch.status, 200, "{}", batch.text);
    let b = &batch.json;
    assert_eq!(
        (b["registered"].as_u64(), b["failed"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(b["results"][0]["migrated"], true);
    assert!(!warnings(&b["results"][0]).is_empty());
    assert_eq!(b["results"][1]["status"], "error");
    let d = b["results"][1]["diagnostics"].as_array().unwrap();
    assert!(
        d.iter().any(|d| d["code"] == "E013" && d["line"] == 25),
        "{d:?}"
    );
    assert_eq!(b["results"][2].get("migrated"), None);
}
