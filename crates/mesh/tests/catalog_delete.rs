//! Deleting catalog versions on a real server: "latest" then means the
//! highest version still stored, a deleted version is gone for good, and a
//! later registration never reuses a number.

use noetl_mesh::catalog::CatalogError;
use noetl_mesh::{Mesh, MeshConfig};
use noetl_testkit::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_versions_moves_latest_and_never_reuses_a_number() {
    let server = TestServer::start();
    let data = tempfile::tempdir().unwrap();
    let mesh = Mesh::connect(MeshConfig {
        nats_url: server.url(),
        data_dir: data.path().to_path_buf(),
        ..MeshConfig::default()
    })
    .await
    .expect("mesh connects");
    let c = mesh.catalog();
    for i in 1..=3 {
        c.register("flows/load", "load", &format!("text {i}"))
            .await
            .unwrap();
    }
    c.register("flows/other", "other", "x").await.unwrap();
    let latest = |c: &noetl_mesh::catalog::Catalog| {
        let c = c.clone();
        async move { c.get("flows/load", None).await.map(|e| e.version) }
    };

    // A middle version: latest stays.
    assert_eq!(c.delete("flows/load", Some(2)).await.unwrap(), [2]);
    assert_eq!(latest(&c).await.unwrap(), 3);
    let gone = c.get("flows/load", Some(2)).await.unwrap_err();
    assert!(
        matches!(
            gone,
            CatalogError::NotFound {
                version: Some(2),
                ..
            }
        ),
        "{gone}"
    );
    // The latest: the highest one left, skipping the deleted one.
    assert_eq!(c.delete("flows/load", Some(3)).await.unwrap(), [3]);
    assert_eq!(latest(&c).await.unwrap(), 1);
    let listed: Vec<(String, u32)> = c
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.path, e.version))
        .collect();
    assert_eq!(
        listed,
        [
            ("flows/load".to_string(), 1),
            ("flows/other".to_string(), 1)
        ]
    );
    // Deleting what is not there removes nothing.
    assert!(c.delete("flows/load", Some(3)).await.unwrap().is_empty());
    assert!(c.delete("flows/load", Some(9)).await.unwrap().is_empty());
    assert!(c.delete("flows/none", None).await.unwrap().is_empty());
    // Every version: the path is gone from `get` and `list`...
    assert_eq!(c.delete("flows/load", None).await.unwrap(), [1]);
    assert!(matches!(
        latest(&c).await,
        Err(CatalogError::NotFound { version: None, .. })
    ));
    assert_eq!(c.list().await.unwrap().len(), 1);
    // ...and the next registration takes a new number.
    assert_eq!(
        c.register("flows/load", "load", "again")
            .await
            .unwrap()
            .version,
        4
    );
    assert_eq!(latest(&c).await.unwrap(), 4);
    assert_eq!(c.get("flows/load", None).await.unwrap().yaml, "again");
}
