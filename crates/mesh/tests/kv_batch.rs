//! Batched reads on a real server (`kv_batch::last_values`): one request
//! answers the last value of every key matching the patterns, deleted keys
//! left out, nothing matching is an empty list, and a bucket without
//! direct gets says so (`None`) instead of answering wrong.

use noetl_mesh::kv_batch::last_values;
use noetl_mesh::{kv, Mesh, MeshConfig};
use noetl_testkit::TestServer;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_reads_the_last_value_of_every_matching_key() {
    let server = TestServer::start();
    let mesh = Mesh::connect(MeshConfig {
        nats_url: server.url(),
        ..MeshConfig::default()
    })
    .await
    .expect("mesh connects (and creates its buckets)");
    let store = mesh.exec_kv();
    kv::put(store, "e1", &json!({"v": 1})).await.unwrap();
    let last = kv::put(store, "e1", &json!({"v": 2})).await.unwrap();
    kv::put(store, "e1.step.a", &json!("a")).await.unwrap();
    kv::put(store, "e1.step.b", &json!("b")).await.unwrap();
    kv::put(store, "e1.step.gone", &json!("x")).await.unwrap();
    store.delete("e1.step.gone").await.unwrap();
    kv::put(store, "e1.plan", &json!("not asked"))
        .await
        .unwrap();
    kv::put(store, "e2.step.a", &json!("other execution"))
        .await
        .unwrap();

    let patterns = ["e1".to_string(), "e1.step.>".to_string()];
    let got = last_values(mesh.client(), store, &patterns)
        .await
        .unwrap()
        .expect("a single-replica bucket allows direct gets");
    let mut keys: Vec<(String, String)> = got
        .iter()
        .map(|kv| (kv.key.clone(), String::from_utf8_lossy(&kv.value).into()))
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            ("e1".to_string(), r#"{"v":2}"#.to_string()),
            ("e1.step.a".to_string(), r#""a""#.to_string()),
            ("e1.step.b".to_string(), r#""b""#.to_string()),
        ]
    );
    let header = got.iter().find(|kv| kv.key == "e1").unwrap();
    assert_eq!(header.revision, last, "the revision is the key's last");

    let none = last_values(mesh.client(), store, &["e9".to_string()])
        .await
        .unwrap()
        .unwrap();
    assert!(none.is_empty(), "nothing matches: {none:?}");

    // Direct gets off (as on a replicated bucket): the caller is told to
    // read key by key.
    let js = mesh.js();
    let mut config = js
        .get_stream(&store.stream_name)
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    config.allow_direct = false;
    js.update_stream(config).await.unwrap();
    let leader_only = js.get_key_value(&store.name).await.unwrap();
    let refused = last_values(mesh.client(), &leader_only, &patterns)
        .await
        .unwrap();
    assert_eq!(refused, None);
}
