//! The artifact tool against the mesh's object store on a local directory:
//! put, get by every form of reference, from another store on the same
//! directory (another service, another execution), and the failures.

use std::sync::Arc;

use noetl_core::tool::{Objects, Tool, ToolCall};
use noetl_core::{Outcome, OutcomeStatus};
use noetl_mesh::objects::{ResultStore, StoreLocation};
use noetl_tool_artifact::ArtifactTool;
use serde_json::{json, Value};

fn store(dir: &std::path::Path) -> Arc<dyn Objects> {
    Arc::new(ResultStore::open(StoreLocation::Local(dir.into())).unwrap())
}

async fn run(objects: &Arc<dyn Objects>, execution_id: &str, config: Value) -> Outcome {
    let call = ToolCall {
        execution_id: execution_id.into(),
        objects: Some(objects.clone()),
        ..ToolCall::new("artifact", config.as_object().cloned().unwrap())
    };
    ArtifactTool.call(call).await.outcome
}

fn err_kind(o: &Outcome) -> &str {
    o.error.as_ref().map(|e| e.kind.as_str()).unwrap_or("")
}

#[tokio::test]
async fn a_put_returns_a_reference_that_a_get_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let objects = store(dir.path());
    let data = json!({"rows": [{"id": 1}, {"id": 2}], "note": "é"});
    let put = run(&objects, "e1", json!({"action": "put", "data": data})).await;
    assert_eq!(put.status, OutcomeStatus::Ok, "{put:?}");
    let r = put.result.clone();
    let reference = r["ref"].as_str().unwrap();
    assert!(reference.starts_with("noetl://artifacts/e1/"), "{r}");
    assert_eq!(r["store"], "local");
    assert_eq!(r["size"], data.to_string().len());
    assert!(r["checksum"].as_str().unwrap().starts_with("sha256:"));
    // Not a result reference: templates leave it as it is.
    assert!(
        r.get("key").is_none() && !noetl_mesh::objects::is_ref(&r),
        "{r}"
    );
    // The object is in the store, under artifacts/.
    let file = dir
        .path()
        .join(format!("{}.json", reference.trim_start_matches("noetl://")));
    assert!(file.is_file(), "{}", file.display());

    for config in [
        json!({"action": "get", "result_ref": r}),
        json!({"result_ref": reference}),
        json!({"action": "get", "uri": reference}),
    ] {
        let got = run(&objects, "e1", config.clone()).await;
        assert_eq!(got.status, OutcomeStatus::Ok, "{config}: {got:?}");
        assert_eq!(
            got.result,
            json!({"data": data, "ref": reference, "size": data.to_string().len()})
        );
    }
}

/// Another execution, on another service with its own store on the same
/// directory (what a shared store is), reads an artifact by its `uri`.
#[tokio::test]
async fn an_artifact_put_under_a_uri_is_read_by_another_execution() {
    let dir = tempfile::tempdir().unwrap();
    let writer = store(dir.path());
    let reader = store(dir.path());
    let uri = "noetl://artifacts/reports/daily";
    let put = run(
        &writer,
        "e1",
        json!({"action": "put", "data": [1, 2, 3], "uri": uri}),
    )
    .await;
    assert_eq!(put.result["ref"], uri, "{put:?}");
    let got = run(&reader, "e2", json!({"uri": uri})).await;
    assert_eq!(got.result["data"], json!([1, 2, 3]), "{got:?}");
    // A put under the same uri replaces it.
    run(
        &writer,
        "e3",
        json!({"action": "put", "data": "v2", "uri": uri}),
    )
    .await;
    let got = run(&reader, "e4", json!({"uri": uri})).await;
    assert_eq!(got.result["data"], "v2", "{got:?}");
}

#[tokio::test]
async fn a_result_stored_by_reference_is_read_by_its_reference() {
    let dir = tempfile::tempdir().unwrap();
    let results = ResultStore::open(StoreLocation::Local(dir.path().into())).unwrap();
    let value = json!({"big": "x".repeat(100)});
    let reference = results
        .put(noetl_mesh::objects::PutParams {
            execution_id: "e9",
            step: "fetch",
            id: "r1",
            value: &value,
        })
        .await
        .unwrap();
    let objects: Arc<dyn Objects> = Arc::new(results);
    let got = run(&objects, "e1", json!({"result_ref": reference})).await;
    assert_eq!(got.result["data"], value, "{got:?}");
}

#[tokio::test]
async fn nothing_stored_is_artifact_missing_and_a_changed_object_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let objects = store(dir.path());
    let o = run(
        &objects,
        "e1",
        json!({"uri": "noetl://artifacts/none/here"}),
    )
    .await;
    assert_eq!(err_kind(&o), "artifact.missing", "{o:?}");
    assert!(!o.error.as_ref().unwrap().retryable);
    assert!(o
        .error
        .unwrap()
        .message
        .contains("artifacts/none/here.json"));

    let put = run(&objects, "e1", json!({"action": "put", "data": {"a": 1}})).await;
    let key = format!(
        "{}.json",
        put.result["ref"]
            .as_str()
            .unwrap()
            .trim_start_matches("noetl://")
    );
    std::fs::write(dir.path().join(key), br#"{"a":2}"#).unwrap();
    let o = run(&objects, "e1", json!({"result_ref": put.result})).await;
    assert_eq!(err_kind(&o), "artifact.store", "{o:?}");
    let e = o.error.unwrap();
    assert!(!e.retryable && e.message.contains("checksum"), "{e:?}");
    // Without a checksum to check, the object is read as it is.
    let o = run(&objects, "e1", json!({"result_ref": put.result["ref"]})).await;
    assert_eq!(o.result["data"], json!({"a": 2}), "{o:?}");
}

#[tokio::test]
async fn wrong_fields_and_no_store_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let objects = store(dir.path());
    let o = run(
        &objects,
        "e1",
        json!({"action": "put", "data": 1, "uri": "gs://b/x"}),
    )
    .await;
    assert_eq!(err_kind(&o), "artifact.config", "{o:?}");
    assert!(o.error.unwrap().message.contains("gs://b/x"));
    let call = ToolCall::new(
        "artifact",
        json!({"uri": "noetl://artifacts/x"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let o = ArtifactTool.call(call).await.outcome;
    assert_eq!(err_kind(&o), "artifact.unavailable", "{o:?}");
}
