//! The playbook catalog: executions by path, latest or pinned version; a
//! running execution keeps the version it started with.

use std::time::{Duration, Instant};

use noetl_integration::Cluster;
use noetl_mesh::{codec, state::ExecStatus};
use noetl_wire::ExecutionRequest;
use serde_json::json;

/// Version `v` of `demo/versioned`: records its version in ctx; the
/// first step waits a moment so a test can register a newer version while
/// it runs.
fn versioned(v: u32) -> String {
    format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: versioned, path: demo/versioned }}
workflow:
  - step: start
    tool:
      - name: wait
        kind: python
        code: "import time; time.sleep(0.3); result = {v}"
        spec:
          policy:
            rules:
              - else:
                  then: {{ do: continue, set_ctx: {{ version: "{{{{ outcome.result }}}}" }} }}
"#
    )
}

async fn start_by_path(cluster: &Cluster, path: &str, version: u32) -> String {
    let eid = noetl_mesh::ids::new_execution_id();
    let req = ExecutionRequest {
        execution_id: eid.clone(),
        path: path.to_string(),
        version,
        ..Default::default()
    };
    cluster
        .mesh
        .publish(
            cluster.mesh.subjects().exec_request(),
            &eid,
            codec::encode(&req),
        )
        .await
        .expect("publish")
        .wait()
        .await
        .expect("ack");
    eid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_start_by_catalog_path_latest_or_pinned() {
    let cluster = Cluster::start().await;
    let catalog = cluster.mesh.catalog();
    let v1 = catalog
        .register("demo/versioned", "versioned", &versioned(1))
        .await
        .unwrap();
    assert_eq!(v1.version, 1);

    // Started at v1; v2 is registered while it runs.
    let first = start_by_path(&cluster, "demo/versioned", 0).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster
        .events(&first)
        .await
        .iter()
        .any(|e| e.event_type == "task.started")
    {
        assert!(
            Instant::now() < deadline,
            "the first execution never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v2 = catalog
        .register("demo/versioned", "versioned", &versioned(2))
        .await
        .unwrap();
    assert_eq!(v2.version, 2);
    let s = cluster.wait(&first, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(
        s.ctx["version"],
        json!(1),
        "kept the version it started with"
    );

    let latest = start_by_path(&cluster, "demo/versioned", 0).await;
    let s = cluster.wait(&latest, Duration::from_secs(30)).await;
    assert_eq!(s.ctx["version"], json!(2), "latest is v2");

    let pinned = start_by_path(&cluster, "demo/versioned", 1).await;
    let s = cluster.wait(&pinned, Duration::from_secs(30)).await;
    assert_eq!(s.ctx["version"], json!(1), "pinned to v1");

    // Any NATS client: plain JSON naming the path and version.
    let js = async_nats::jetstream::new(cluster.server.client().await);
    let body = json!({"execution_id": "by-path-json", "path": "demo/versioned", "version": 1});
    js.publish("noetl.exec.request", body.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let s = cluster.wait("by-path-json", Duration::from_secs(30)).await;
    assert_eq!(s.ctx["version"], json!(1), "plain JSON by path, pinned");

    let listed = catalog.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].path.as_str(), listed[0].version),
        ("demo/versioned", 2)
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_path_or_version_fails_the_execution_clearly() {
    let cluster = Cluster::start().await;
    let eid = start_by_path(&cluster, "no/such", 0).await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Failed);
    let err = s.error.unwrap_or_default();
    assert!(err.contains("\"no/such\""), "{err}");
    assert!(err.contains("noetl playbook register"), "{err}");

    cluster
        .mesh
        .catalog()
        .register("demo/versioned", "versioned", &versioned(1))
        .await
        .unwrap();
    let eid = start_by_path(&cluster, "demo/versioned", 7).await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Failed);
    let err = s.error.unwrap_or_default();
    assert!(err.contains("version 7"), "{err}");
    cluster.stop().await;
}
