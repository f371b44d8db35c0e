//! Publishes carry their message id whatever else they carry: JetStream
//! drops a second publish with the same id, which is what makes a
//! redelivered start or window send each command once.

use noetl_mesh::{Mesh, MeshConfig};
use noetl_testkit::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_republished_message_with_the_same_id_is_stored_once() {
    let server = TestServer::start();
    let mesh = Mesh::connect(MeshConfig {
        nats_url: server.url(),
        ..MeshConfig::default()
    })
    .await
    .expect("mesh connects");
    let subject = mesh.subjects().task("noop");
    for _ in 0..2 {
        // With the execution header (task commands) and without.
        mesh.publish_for_execution(subject.clone(), "cmd-1", "e1", "a".into())
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
        mesh.publish(subject.clone(), "cmd-2", "b".into())
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
    let mut stream = mesh
        .js()
        .get_stream(mesh.subjects().work_stream())
        .await
        .unwrap();
    let info = stream.info().await.unwrap().clone();
    assert_eq!(info.state.messages, 2, "one copy per message id");
    let first = stream
        .get_raw_message(info.state.first_sequence)
        .await
        .unwrap();
    let headers = first.headers;
    assert_eq!(
        headers
            .get(noetl_mesh::runtime::HEADER_EXECUTION_ID)
            .map(|v| v.to_string()),
        Some("e1".to_string())
    );
    assert_eq!(
        headers.get("Nats-Msg-Id").map(|v| v.to_string()),
        Some("cmd-1".to_string())
    );
}
