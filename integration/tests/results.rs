//! Results by reference: large results go to object storage and travel as
//! references; templates, `_prev` and `loop.in` read through them.

use noetl_mesh::keys::Keys;
use std::time::Duration;

use noetl_integration::{Cluster, ClusterOptions};
use noetl_mesh::{kv, objects, state::ExecStatus};
use serde_json::{json, Value};

/// 300 rows of ~30 bytes: far above the playbook's 1 KiB limit.
const BIG: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: big-results }
executor:
  spec:
    limits: { max_payload_bytes: 1024 }
workflow:
  - step: start
    tool:
      - name: make
        kind: python
        code: "result = {'rows': [{'i': i, 'name': 'row-%05d' % i} for i in range(300)]}"
      # Another kind in between: `_prev` is handed over by reference.
      - name: pass
        kind: noop
      - name: check
        kind: python
        code: "result = {'rows': _prev['rows'], 'n': len(_prev['rows'])}"
    next:
      arcs:
        - step: summarise
  - step: summarise
    tool:
      - name: sum
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then:
                    do: continue
                    set_ctx:
                      n: "{{ start.n }}"
                      last: "{{ start.rows[-1].name }}"
    next:
      arcs:
        - step: each
  - step: each
    loop:
      in: "{{ start.rows }}"
      iterator: row
      spec:
        mode: parallel
        max_in_flight: 8
        policy:
          reducers: { total: sum }
    tool:
      - name: one
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { total: "{{ iter.row.i }}" } }
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
    tool:
      - name: e
        kind: noop
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_results_travel_by_reference_and_read_back_everywhere() {
    let cluster = Cluster::start().await;
    let eid = cluster.submit(BIG, "big.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(120)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    // Templates read into the referenced result...
    assert_eq!(s.ctx["n"], 300);
    assert_eq!(s.ctx["last"], "row-00299");
    // ...and loop.in iterated its whole collection.
    assert_eq!(s.ctx["total"], (0..300).sum::<i64>());

    // KV holds the reference, not the rows.
    let stored: Value = kv::get(cluster.mesh.exec_kv(), &Keys::result(&eid, "start"))
        .await
        .unwrap()
        .expect("start's result is stored: summarise reads it");
    assert!(objects::is_ref(&stored), "{stored}");
    assert_eq!(stored["store"], "local");
    assert!(stored["ref"]
        .as_str()
        .unwrap()
        .starts_with(&format!("noetl://execution/{eid}/result/start/")));
    assert!(stored["size"].as_u64().unwrap() > 5_000);
    let file = cluster
        .data_dir
        .path()
        .join("objects")
        .join(stored["key"].as_str().unwrap());
    assert!(file.is_file(), "{}", file.display());

    // The step.done event carries the reference too: events stay compact.
    let events = cluster.settled_events(&eid).await;
    let done = events
        .iter()
        .find(|e| e.event_type == "step.done" && e.step == "start")
        .expect("step.done of start");
    let payload: Value = serde_json::from_slice(&done.payload_json).unwrap();
    assert_eq!(payload["result"]["ref"], stored["ref"]);
    assert!(
        done.payload_json.len() < 2048,
        "{}",
        done.payload_json.len()
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_object_fails_the_execution_naming_the_key() {
    let cluster = Cluster::start().await;
    let yaml = BIG.replace("kind: noop\n      - name: check", "kind: python\n        code: \"import time; time.sleep(0.5); result = _prev\"\n      - name: check");
    let eid = cluster.submit(&yaml, "big.yaml", json!({})).await;
    // Remove every stored object while the pipeline runs.
    let objects_dir = cluster.data_dir.path().join("objects");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let s = loop {
        if let Ok(rd) = std::fs::read_dir(objects_dir.join("execution").join(&eid)) {
            drop(rd);
            let _ = std::fs::remove_dir_all(objects_dir.join("execution").join(&eid));
        }
        if let Some(h) = cluster.mesh.exec_header(&eid).await.unwrap() {
            if h.status != ExecStatus::Running {
                break cluster.mesh.exec_summary(&eid).await.unwrap().unwrap();
            }
        }
        if std::time::Instant::now() > deadline {
            let evs = cluster.events(&eid).await;
            let t: Vec<String> = evs
                .iter()
                .map(|e| {
                    format!(
                        "{} {} {}",
                        e.event_type,
                        e.step,
                        String::from_utf8_lossy(&e.payload_json)
                            .chars()
                            .take(300)
                            .collect::<String>()
                    )
                })
                .collect();
            panic!("did not end: {t:#?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let err = s.error.unwrap_or_default();
    assert!(err.contains("object store (local)"), "{err}");
    assert!(err.contains(&format!("execution/{eid}/result/")), "{err}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_by_reference_on_an_s3_server() {
    let s3 = noetl_testkit::S3Server::start("noetl-results");
    let cluster = Cluster::start_with(ClusterOptions {
        object_store: Some(objects::StoreLocation::S3(objects::S3Location {
            bucket: s3.bucket().to_string(),
            prefix: "runs".into(),
            endpoint: Some(s3.endpoint()),
            region: "us-east-1".into(),
            access_key_id: Some(noetl_testkit::s3::ACCESS_KEY.into()),
            secret_access_key: Some(noetl_testkit::s3::SECRET_KEY.into()),
        })),
        ..Default::default()
    })
    .await;
    let eid = cluster.submit(BIG, "big.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(120)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["n"], 300);
    assert_eq!(s.ctx["total"], (0..300).sum::<i64>());
    let stored: Value = kv::get(cluster.mesh.exec_kv(), &Keys::result(&eid, "start"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored["store"], "s3");
    // The object is in the bucket, under the configured prefix.
    let file = s3
        .dir()
        .join(s3.bucket())
        .join("runs")
        .join(stored["key"].as_str().unwrap());
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(text.len() as u64, stored["size"].as_u64().unwrap());
    // Nothing landed in the local directory.
    assert!(!cluster.data_dir.path().join("objects/execution").exists());
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_keys_can_come_from_the_keychain() {
    let s3 = noetl_testkit::S3Server::start("noetl-keys");
    let cluster = Cluster::start().await;
    cluster
        .mesh
        .vault()
        .put(&noetl_mesh::credentials::Credential {
            name: "minio".into(),
            kind: "secret".into(),
            data: json!({"access_key_id": noetl_testkit::s3::ACCESS_KEY,
                         "secret_access_key": noetl_testkit::s3::SECRET_KEY}),
        })
        .await
        .unwrap();
    let location = objects::StoreLocation::S3(objects::S3Location {
        bucket: s3.bucket().to_string(),
        prefix: String::new(),
        endpoint: Some(s3.endpoint()),
        region: "us-east-1".into(),
        access_key_id: None,
        secret_access_key: None,
    });
    let config = noetl_mesh::MeshConfig {
        nats_url: cluster.server.url(),
        data_dir: cluster.data_dir.path().to_path_buf(),
        object_store: Some(location.clone()),
        s3_credential: Some("minio".into()),
        ..Default::default()
    };
    let mesh = noetl_mesh::Mesh::connect(config.clone()).await.unwrap();
    let value = json!({"rows": vec!["x"; 100]});
    let r = mesh
        .results()
        .put(objects::PutParams {
            execution_id: "e1",
            step: "s",
            id: "r",
            value: &value,
        })
        .await
        .unwrap();
    assert_eq!(mesh.results().hydrate(r).await.unwrap(), value);
    assert!(s3
        .dir()
        .join("noetl-keys/execution/e1/result/s/r.json")
        .is_file());
    // A missing credential stops the service at start, naming it.
    let err = noetl_mesh::Mesh::connect(noetl_mesh::MeshConfig {
        s3_credential: Some("nope".into()),
        ..config
    })
    .await
    .err()
    .expect("must refuse")
    .to_string();
    assert!(err.contains("NOETL_S3_CREDENTIAL=nope"), "{err}");
    cluster.stop().await;
}
