//! Reads of the event log and scans of KV buckets on a three-node cluster
//! (docs/architecture.md, "Reading the log"): the ordered consumer a read
//! creates lands on any replica of its stream, so a read must not end
//! before it has the last message the stream's leader held when it began,
//! even when its replica lags behind.

use std::future::Future;
use std::process::Command;
use std::time::Duration;

use noetl_mesh::{events::EventDraft, kv, Mesh, MeshConfig};
use noetl_testkit::cluster::TestCluster;

/// Messages the paused node has to catch up on, per round.
const BACKLOG: u32 = 20_000;

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

/// A three-node cluster with the mesh's streams R3, a mesh connected to
/// the node leading `stream` (of the mesh's, named from its subjects),
/// and a follower of it that does not lead the meta layer (consumers are
/// created through the meta leader): the node the test pauses.
struct Lagging {
    cluster: TestCluster,
    mesh: Mesh,
    node: usize,
    _data: tempfile::TempDir,
}

async fn lagging(stream: impl Fn(&Mesh) -> String) -> Lagging {
    let cluster = TestCluster::start();
    let data = tempfile::tempdir().unwrap();
    let config = MeshConfig {
        nats_url: cluster.urls(),
        data_dir: data.path().to_path_buf(),
        replicas: 3,
        ..MeshConfig::default()
    };
    let created = Mesh::connect(config.clone()).await.expect("connect");
    let name = stream(&created);
    let leader = cluster
        .stream_leader(&name)
        .expect("the stream has a leader");
    let meta = cluster.meta_leader().expect("a meta leader");
    let node = (0..cluster.len())
        .find(|&i| i != leader && i != meta)
        .expect("a third node");
    // Read and write through the leader's node: the paused node's client
    // connections would hang.
    let mesh = Mesh::attach(MeshConfig {
        nats_url: cluster.url(leader),
        ..config
    })
    .await
    .expect("connect to the leader's node");
    Lagging {
        cluster,
        mesh,
        node,
        _data: data,
    }
}

impl Lagging {
    /// Three rounds: pause the node, `write(round)` (acknowledged by the
    /// leader and the other follower: a backlog, then what the reads must
    /// see), resume it and `read` six times at once, so some consumers
    /// land on the node catching up. Each read that answers must hold
    /// everything written up to its round (`whole(round, read)`). A read
    /// may fail as transient (its replica not caught up in time). Returns
    /// (answered, not whole).
    async fn rounds<W, R, T>(
        &self,
        write: impl Fn(Mesh, u32) -> W,
        read: impl Fn(Mesh) -> R,
        whole: impl Fn(u32, &T) -> bool,
    ) -> (usize, usize)
    where
        W: Future<Output = ()>,
        R: Future<Output = Result<T, noetl_mesh::MeshError>> + Send + 'static,
        T: Send + 'static,
    {
        let (mut answered, mut misses, mut failed) = (0, 0, 0);
        for round in 0..3 {
            signal(&self.cluster, self.node, "STOP");
            write(self.mesh.clone(), round).await;
            signal(&self.cluster, self.node, "CONT");
            let reads: Vec<_> = (0..6)
                .map(|_| tokio::spawn(read(self.mesh.clone())))
                .collect();
            for r in reads {
                let r = tokio::time::timeout(Duration::from_secs(60), r)
                    .await
                    .expect("the read ends")
                    .unwrap();
                match r {
                    Err(_) => failed += 1,
                    Ok(v) => {
                        answered += 1;
                        if !whole(round, &v) {
                            eprintln!("round {round}: a read without everything written");
                            misses += 1;
                        }
                    }
                }
            }
        }
        eprintln!("reads: {answered} answered ({misses} not whole), {failed} failed");
        (answered, misses)
    }
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

/// Publish on `subject(n)` for every `n` of `range`, a thousand in flight
/// at a time, each acknowledged.
async fn backlog(mesh: &Mesh, range: std::ops::Range<u32>, subject: impl Fn(u32) -> String) {
    let items: Vec<u32> = range.collect();
    for chunk in items.chunks(1000) {
        let mut acks = Vec::new();
        for &n in chunk {
            acks.push(
                mesh.js()
                    .publish(subject(n), "{}".into())
                    .await
                    .expect("publish"),
            );
        }
        for ack in acks {
            ack.await.expect("acknowledged");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_placed_on_a_lagging_replica_waits_for_the_leaders_last_event() {
    let l = lagging(|m| m.subjects().events_stream()).await;
    let filter = l.mesh.subjects().events_of("lagging-read");
    let ids: Vec<String> = (0..3).map(|n| event("lagging-read", n).event_id).collect();
    let (answered, misses) = l
        .rounds(
            |mesh, round| async move {
                let at = round * BACKLOG;
                backlog(&mesh, at..at + BACKLOG, |n| {
                    mesh.subjects()
                        .event(&format!("backlog-{n}"), "step.started")
                })
                .await;
                mesh.emit(&event("lagging-read", round))
                    .await
                    .unwrap()
                    .wait()
                    .await
                    .unwrap();
            },
            move |mesh| {
                let filter = filter.clone();
                async move { mesh.stored_events(&filter).await }
            },
            // Round r's reads must have the events of rounds 0..=r.
            |round, events: &Vec<Result<noetl_wire::Event, _>>| {
                let got: Vec<&str> = events
                    .iter()
                    .filter_map(|e| e.as_ref().ok())
                    .map(|e| e.event_id.as_str())
                    .collect();
                ids[..=round as usize]
                    .iter()
                    .all(|id| got.contains(&id.as_str()))
            },
        )
        .await;
    assert!(answered > 0, "no read answered");
    assert_eq!(
        misses, 0,
        "reads that answered without every acknowledged event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_placed_on_a_lagging_replica_waits_for_the_leaders_last_record() {
    let l = lagging(|m| m.exec_kv().stream_name.clone()).await;
    let (answered, misses) = l
        .rounds(
            |mesh, round| async move {
                let at = round * BACKLOG;
                let prefix = mesh.exec_kv().prefix.clone();
                backlog(&mesh, at..at + BACKLOG, |n| format!("{prefix}backlog.{n}")).await;
                kv::put(mesh.exec_kv(), &format!("lagging.{round}"), &round)
                    .await
                    .unwrap();
            },
            |mesh| async move { kv::keys_under(mesh.exec_kv(), "lagging").await },
            // Round r's scans must have the keys of rounds 0..=r.
            |round, keys: &Vec<String>| (0..=round).all(|r| keys.contains(&format!("lagging.{r}"))),
        )
        .await;
    assert!(answered > 0, "no scan answered");
    assert_eq!(
        misses, 0,
        "scans that answered without every acknowledged record"
    );
}
