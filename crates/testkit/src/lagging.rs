//! A three-node cluster with a follower that lags: the replica a read's
//! ordered consumer may land on while it catches up (docs/architecture.md,
//! "Reading the log"). Tests pause the follower (`SIGSTOP`), write a
//! backlog and what the reads must see, resume it and read at once.

use std::future::Future;
use std::process::Command;
use std::time::Duration;

use noetl_mesh::{Mesh, MeshConfig};

use crate::cluster::TestCluster;

/// Messages the paused node has to catch up on, per round.
pub const BACKLOG: u32 = 20_000;

/// Send `signal` (`STOP`, `CONT`) to node `i`'s process.
pub fn signal(c: &TestCluster, i: usize, signal: &str) {
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
pub struct Lagging {
    /// The cluster.
    pub cluster: TestCluster,
    /// A mesh connected to the node leading the stream.
    pub mesh: Mesh,
    /// That node's URL.
    pub url: String,
    /// The follower the rounds pause.
    pub node: usize,
    _data: tempfile::TempDir,
}

/// Start the cluster, create the mesh's streams and buckets, and find
/// the node to pause: a follower of `stream` (named from the mesh's
/// subjects) that does not lead the meta layer.
pub async fn lagging(stream: impl Fn(&Mesh) -> String) -> Lagging {
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
    let url = cluster.url(leader);
    let mesh = Mesh::attach(MeshConfig {
        nats_url: url.clone(),
        ..config
    })
    .await
    .expect("connect to the leader's node");
    Lagging {
        cluster,
        mesh,
        url,
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
    pub async fn rounds<W, R, T>(
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

/// Publish on `subject(n)` for every `n` of `range`, a thousand in flight
/// at a time, each acknowledged. A publish whose ack fails (the stream's
/// leader between terms while a follower is paused answers "no
/// responders") is sent again under the same message id, so JetStream
/// stores it once.
pub async fn backlog(mesh: &Mesh, range: std::ops::Range<u32>, subject: impl Fn(u32) -> String) {
    let items: Vec<u32> = range.collect();
    for chunk in items.chunks(1000) {
        let mut pending: Vec<u32> = chunk.to_vec();
        for attempt in 0.. {
            let mut acks = Vec::new();
            for &n in &pending {
                let subject = subject(n);
                let ack = mesh.publish(subject.clone(), &subject, "{}".into()).await;
                acks.push((n, ack));
            }
            let mut failed = Vec::new();
            for (n, ack) in acks {
                let result = match ack {
                    Ok(ack) => ack.wait().await,
                    Err(e) => Err(e),
                };
                if let Err(e) = result {
                    assert!(attempt < RETRIES, "publish {n} not acknowledged: {e}");
                    failed.push(n);
                }
            }
            if failed.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            pending = failed;
        }
    }
}

/// How many times a test write is sent again before the test fails.
const RETRIES: u32 = 120;

/// A round of writes of the event-log tests: `scale × BACKLOG` events of
/// other executions (`step.started` of `backlog-<n>`), then `event`, each
/// acknowledged.
pub async fn events_round(mesh: &Mesh, round: u32, scale: u32, event: &noetl_wire::Event) {
    let at = round * scale * BACKLOG;
    backlog(mesh, at..at + scale * BACKLOG, |n| {
        mesh.subjects()
            .event(&format!("backlog-{n}"), "step.started")
    })
    .await;
    // Sent again on a failed ack like the backlog (the event id is the
    // message id).
    for attempt in 0.. {
        let result = match mesh.emit(event).await {
            Ok(ack) => ack.wait().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => break,
            Err(e) => assert!(attempt < RETRIES, "the event not acknowledged: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
