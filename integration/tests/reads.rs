//! Reads of the event log on a three-node cluster (docs/architecture.md,
//! "Reading the log"): the ordered consumer a read creates lands on any
//! replica of the events stream, so a read must not end before it has the
//! last event the stream's leader held when it began, even when its
//! replica lags behind.

use std::process::Command;
use std::time::Duration;

use noetl_mesh::{events::EventDraft, Mesh, MeshConfig};
use noetl_testkit::cluster::TestCluster;

/// Send `signal` (`STOP`, `CONT`) to node `i`'s process.
fn signal(c: &TestCluster, i: usize, signal: &str) {
    let pid = c.pid(i).expect("the node runs");
    let ok = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

/// Event `n` of execution `eid`.
fn event(eid: &str, n: u32) -> noetl_wire::Event {
    let d = n.to_string();
    EventDraft {
        execution_id: eid,
        step_run_id: "r1",
        step: "start",
        discriminator: &d,
        ..Default::default()
    }
    .build(&noetl_mesh::payloads::StepStarted::default())
}

/// Store event `n` of execution `eid` (waiting for its ack); its id.
async fn store(mesh: &Mesh, eid: &str, n: u32) -> String {
    let ev = event(eid, n);
    mesh.emit(&ev).await.unwrap().wait().await.unwrap();
    ev.event_id
}

/// Store `count` events of another execution, `at` onwards, a thousand
/// in flight at a time: what the paused node has to catch up on.
async fn backlog(mesh: &Mesh, at: u32, count: u32) {
    for chunk in (at..at + count).collect::<Vec<_>>().chunks(1000) {
        let mut acks = Vec::new();
        for &n in chunk {
            acks.push(mesh.emit(&event("backlog", n)).await.unwrap());
        }
        for ack in acks {
            ack.wait().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_placed_on_a_lagging_replica_waits_for_the_leaders_last_event() {
    let c = TestCluster::start();
    let data = tempfile::tempdir().unwrap();
    let config = MeshConfig {
        nats_url: c.urls(),
        data_dir: data.path().to_path_buf(),
        replicas: 3,
        ..MeshConfig::default()
    };
    // The streams, R3, created through every node.
    let created = Mesh::connect(config.clone()).await.expect("connect");
    let stream = created.subjects().events_stream();
    let leader = c
        .stream_leader(&stream)
        .expect("the events stream has a leader");
    let meta = c.meta_leader().expect("a meta leader");
    // A follower of the events stream that does not lead the meta layer
    // (consumers are created through it).
    let lagging = (0..c.len())
        .find(|&i| i != leader && i != meta)
        .expect("a third node");
    // Read and write through the leader's node: the paused node's client
    // connections would hang.
    let mesh = Mesh::attach(MeshConfig {
        nats_url: c.url(leader),
        ..config
    })
    .await
    .expect("connect to the leader's node");
    let filter = mesh.subjects().events_of("lagging-read");
    let (mut misses, mut answered, mut failed) = (0, 0, 0);
    // Every event of the execution read, acknowledged before the reads.
    let mut stored = Vec::new();
    for round in 0..3 {
        stored.push(store(&mesh, "lagging-read", round * 2).await);
        signal(&c, lagging, "STOP");
        // Stored on the leader and the other follower: acknowledged. The
        // paused node has a backlog to catch up on before it has `last`.
        backlog(&mesh, round * 20_000, 20_000).await;
        stored.push(store(&mesh, "lagging-read", round * 2 + 1).await);
        signal(&c, lagging, "CONT");
        // Several reads at once, so some consumers land on the node that
        // is catching up.
        let reads: Vec<_> = (0..6)
            .map(|_| {
                let (mesh, filter) = (mesh.clone(), filter.clone());
                tokio::spawn(async move { mesh.stored_events(&filter).await })
            })
            .collect();
        for read in reads {
            let read = tokio::time::timeout(Duration::from_secs(60), read)
                .await
                .expect("the read ends")
                .unwrap();
            // A read may fail as transient while the node was paused (its
            // consumer not created in time); one that answers must be
            // whole.
            let Ok(events) = read else {
                failed += 1;
                continue;
            };
            answered += 1;
            let ids: Vec<String> = events
                .into_iter()
                .filter_map(Result::ok)
                .map(|e| e.event_id)
                .collect();
            if !stored.iter().all(|id| ids.contains(id)) {
                eprintln!(
                    "round {round}: a read had {} of {} events",
                    ids.len(),
                    stored.len()
                );
                misses += 1;
            }
        }
    }
    eprintln!("reads: {answered} answered ({misses} without every stored event), {failed} failed");
    assert!(answered > 0, "no read answered");
    assert_eq!(
        misses, 0,
        "reads that answered without every acknowledged event"
    );
}
