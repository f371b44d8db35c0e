//! Scanning a KV bucket (`kv::values_matching`, which the loop-supervisor
//! reads claims with): a record that does not decode is a `Corrupt` error
//! naming its bucket and key, dead-lettered, never retried as an outage;
//! the others still read.

use noetl_mesh::error::ErrorKind;
use noetl_mesh::{kv, Mesh, MeshConfig, MeshError};
use noetl_testkit::TestServer;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_does_not_decode_is_corrupt_and_the_others_read() {
    let server = TestServer::start();
    let mesh = Mesh::connect(MeshConfig {
        nats_url: server.url(),
        ..MeshConfig::default()
    })
    .await
    .expect("mesh connects (and creates its buckets)");
    let store = mesh.loop_kv();
    kv::put(store, "e1.lr1.it.0", &json!({"a": 1}))
        .await
        .unwrap();
    store
        .put("e1.lr1.it.1", "not json".into())
        .await
        .expect("a raw write");
    kv::put(store, "e1.lr1.it.2", &json!({"a": 2}))
        .await
        .unwrap();
    kv::put(store, "e1.other.it.0", &json!({"a": 9}))
        .await
        .unwrap();
    let found = kv::values_matching::<Value>(store, "e1.lr1.it.>")
        .await
        .expect("the scan itself succeeds");
    let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["e1.lr1.it.0", "e1.lr1.it.1", "e1.lr1.it.2"]);
    assert_eq!(found[0].1.as_ref().unwrap(), &json!({"a": 1}));
    assert_eq!(found[2].1.as_ref().unwrap(), &json!({"a": 2}));
    let bad = found[1].1.as_ref().unwrap_err();
    assert!(
        matches!(bad, MeshError::Corrupt { key, .. } if key == "e1.lr1.it.1"),
        "{bad:?}"
    );
    assert_eq!(bad.kind(), ErrorKind::Corrupt);
}
