//! Error kinds decide what a consumer does: a corrupt record is
//! dead-lettered at once, naming its key (docs/architecture.md, "Error
//! kinds"); it is never retried as if NATS were down.

use std::time::{Duration, Instant};

use noetl_integration::{types, Cluster};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_dead_lettered_at_once_naming_its_key() {
    let cluster = Cluster::start().await;
    let m = &cluster.mesh;
    let slow = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: slow }\nworkflow:\n  - step: start\n    tool:\n      - name: nap\n        kind: python\n        code: \"import time; time.sleep(1); result = 1\"\n";
    let eid = cluster.submit(slow, "slow.yaml", json!({})).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !types(&cluster.events(&eid).await).contains(&"task.started") {
        assert!(Instant::now() < deadline, "the step never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // While the step runs, its execution's header stops being a header:
    // the router's boundary handler reads it when step.done arrives.
    m.exec_kv()
        .put(eid.as_str(), "{not a header".into())
        .await
        .unwrap();
    let corrupted_at = Instant::now();
    let stream = m.js().get_stream(m.subjects().dlq_stream()).await.unwrap();
    let subject = m.subjects().dead_letter("router-events");
    let reason = loop {
        if let Ok(msg) = stream.get_last_raw_message_by_subject(&subject).await {
            break msg
                .headers
                .get(noetl_mesh::runtime::HEADER_REASON)
                .map(|v| v.to_string())
                .unwrap_or_default();
        }
        assert!(
            corrupted_at.elapsed() < Duration::from_secs(15),
            "no dead letter on {subject}: a corrupt record must not be retried"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        reason.contains("corrupt") && reason.contains(&format!("/{eid}")),
        "the reason names the record: {reason}"
    );
    assert!(
        !reason.contains("{not a header"),
        "the reason carries no stored bytes: {reason}"
    );
    cluster.stop().await;
}
