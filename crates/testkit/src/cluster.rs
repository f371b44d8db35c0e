//! A three-node JetStream cluster on loopback for failover tests: three
//! `nats-server` processes (the binary [`TestServer`](crate::TestServer)
//! uses), each with its own config file, store directory, client, cluster
//! and monitoring port. Nodes can be SIGKILLed and restarted on the same
//! ports and store; everything is stopped and removed on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use noetl_mesh::server::{NatsServerProcess, ServerError, ServerOptions, SyncPolicy};
use serde_json::Value;

/// Nodes in a [`TestCluster`] unless [`TestCluster::try_start_sized`] says.
pub const NODES: usize = 3;

/// The start of the cluster's name in every node's `cluster {}` block:
/// `noetl-test-<first route port>`. Each cluster's name is its own, so
/// nodes of two tests running at once never join one cluster: a route port
/// picked free and then taken by another test's node (the race a start
/// retries) reaches a node whose cluster name differs, and the route is
/// refused.
pub const CLUSTER_NAME: &str = "noetl-test";

/// How long [`TestCluster::start`] and [`TestCluster::restart`] wait for
/// JetStream to be healthy (a meta leader elected and the node current).
pub const HEALTHY_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a cluster could not be started or a node restarted.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The temporary directory or a config file could not be written.
    #[error("cannot prepare {path} for the test cluster: {source}")]
    Files {
        /// File or directory.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A node's process did not start.
    #[error("test cluster node {node}: {source}")]
    Node {
        /// Server name (`n1`..).
        node: String,
        /// Cause.
        #[source]
        source: ServerError,
    },
    /// JetStream did not become healthy in time.
    #[error("test cluster node {node} not healthy after {waited:?}: {last}\n{logs}")]
    NotHealthy {
        /// Server name.
        node: String,
        /// How long we waited.
        waited: Duration,
        /// The last `/healthz` answer (or why there was none).
        last: String,
        /// The end of every node's log.
        logs: String,
    },
}

struct Node {
    name: String,
    client_port: u16,
    http_port: u16,
    store: PathBuf,
    config: PathBuf,
    // `None` while killed.
    process: Option<NatsServerProcess>,
}

impl Node {
    fn start(&mut self) -> Result<(), ClusterError> {
        let process = NatsServerProcess::start_with_config(
            ServerOptions {
                store_dir: self.store.clone(),
                port: Some(self.client_port),
                binary: None,
            },
            &self.config,
        )
        .map_err(|source| ClusterError::Node {
            node: self.name.clone(),
            source,
        })?;
        self.process = Some(process);
        Ok(())
    }

    /// The last 20 lines of its log, without the `/healthz` polling noise.
    fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.store.join("nats-server.log")) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s
            .lines()
            .filter(|l| !l.contains("Healthcheck failed"))
            .collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// Three clustered `nats-server -js` processes on loopback. On drop the
/// processes stop and the directory is removed, unless the thread is
/// panicking: then the directory (configs, stores, each node's
/// `nats-server.log`) is kept and its path printed.
pub struct TestCluster {
    // Field order matters: the processes stop before the directory goes.
    nodes: Vec<Node>,
    dir: Option<tempfile::TempDir>,
}

impl TestCluster {
    /// Start the cluster and wait until JetStream is healthy on every node;
    /// panics with the reason.
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start the cluster and wait until JetStream is healthy on every node.
    /// Free ports are picked up front; a start that loses a port race, or
    /// whose nodes elect no meta leader in time, is retried with fresh
    /// ports and stores.
    pub fn try_start() -> Result<Self, ClusterError> {
        Self::try_start_with_sync(SyncPolicy::default())
    }

    /// [`Self::try_start`] with every node writing to disk as `sync` says
    /// (`sync_interval: always`: every write fsynced before its ack).
    pub fn try_start_with_sync(sync: SyncPolicy) -> Result<Self, ClusterError> {
        Self::try_start_sized(NODES, sync)
    }

    /// [`Self::try_start_with_sync`] with `nodes` servers (3 or 5: streams
    /// R3 or R5).
    pub fn try_start_sized(nodes: usize, sync: SyncPolicy) -> Result<Self, ClusterError> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(nodes, sync) {
                Ok(c) => return Ok(c),
                Err(e @ ClusterError::Node { .. }) => last = Some(e),
                // Seen on a loaded CI host: no meta leader within the
                // timeout, the nodes' routes refused and dropped as
                // duplicates. A fresh cluster (new ports, new stores)
                // forms; the failed one's reason is printed first.
                Err(e @ ClusterError::NotHealthy { .. }) => {
                    eprintln!("{e}\n(starting a fresh test cluster)");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    fn start_once(count: usize, sync: SyncPolicy) -> Result<Self, ClusterError> {
        let dir = tempfile::Builder::new()
            .prefix("noetl-test-cluster-")
            .tempdir()
            .map_err(|source| ClusterError::Files {
                path: std::env::temp_dir().display().to_string(),
                source,
            })?;
        let ports = free_ports(3 * count);
        let cluster_ports = &ports[count..2 * count];
        let routes: Vec<String> = cluster_ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect();
        let cluster_name = format!("{CLUSTER_NAME}-{}", cluster_ports[0]);
        let mut nodes = Vec::new();
        for i in 0..count {
            let name = format!("n{}", i + 1);
            let store = dir.path().join(&name);
            let config = dir.path().join(format!("{name}.conf"));
            // The store directory is the `-sd` flag (ServerOptions); a
            // `jetstream { store_dir }` here would be refused as a duplicate.
            let jetstream = sync.config_text().unwrap_or("jetstream: enabled\n");
            let text = format!(
                "server_name: {name}\n\
                 http: 127.0.0.1:{http}\n\
                 {jetstream}\
                 cluster {{\n  name: {cluster_name}\n  listen: 127.0.0.1:{cport}\n  routes: [{routes}]\n}}\n",
                http = ports[2 * count + i],
                cport = cluster_ports[i],
                routes = routes.join(", "),
            );
            std::fs::write(&config, text).map_err(|source| ClusterError::Files {
                path: config.display().to_string(),
                source,
            })?;
            nodes.push(Node {
                name,
                client_port: ports[i],
                http_port: ports[2 * count + i],
                store,
                config,
                process: None,
            });
        }
        let mut cluster = Self {
            nodes,
            dir: Some(dir),
        };
        for node in &mut cluster.nodes {
            node.start()?;
        }
        cluster.wait_healthy(HEALTHY_TIMEOUT)?;
        Ok(cluster)
    }

    /// How many nodes it has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never: a cluster has nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The process id of node `i` (`None` while it is killed).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].process.as_ref().and_then(|p| p.pid())
    }

    /// The client URLs of all nodes, comma-separated (`--nats` form).
    pub fn urls(&self) -> String {
        (0..self.len())
            .map(|i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client URL of node `i` (0-based), running or not.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].client_port)
    }

    /// The monitoring address of node `i` (`http://127.0.0.1:<port>`).
    pub fn monitor_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.nodes[i].http_port)
    }

    /// The server name of node `i` (`n1`, `n2`, `n3`).
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The node whose server name is `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Whether node `i` is running (not killed).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].process.is_some()
    }

    /// The directory holding the configs and store directories.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.as_ref().expect("present until drop").path()
    }

    /// SIGKILL node `i`: no shutdown, no leadership hand-off.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.nodes[i].process.take() {
            p.stop();
        }
    }

    /// Start node `i` again on the same ports with the same store, and wait
    /// until it is healthy (current with the meta leader and its streams).
    pub fn restart(&mut self, i: usize) -> Result<(), ClusterError> {
        self.kill(i);
        self.nodes[i].start()?;
        self.wait_node_healthy(i, HEALTHY_TIMEOUT)
    }

    /// Wait until every running node reports JetStream healthy.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<(), ClusterError> {
        for i in 0..self.len() {
            if self.is_running(i) {
                self.wait_node_healthy(i, timeout)?;
            }
        }
        Ok(())
    }

    fn wait_node_healthy(&self, i: usize, timeout: Duration) -> Result<(), ClusterError> {
        let node = &self.nodes[i];
        let t0 = Instant::now();
        loop {
            let last = match http_get(node.http_port, "/healthz") {
                Some(v) if v["status"] == "ok" => return Ok(()),
                Some(v) => v.to_string(),
                None => "no answer from the monitoring port".to_string(),
            };
            if t0.elapsed() > timeout {
                let logs = self
                    .nodes
                    .iter()
                    .map(|n| format!("--- {} log ---\n{}", n.name, n.log_tail()))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(ClusterError::NotHealthy {
                    node: node.name.clone(),
                    waited: t0.elapsed(),
                    last,
                    logs,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The node that is the JetStream meta leader, as a running node sees it.
    pub fn meta_leader(&self) -> Option<usize> {
        self.running_jsz("/jsz").find_map(|v| {
            v["meta_cluster"]["leader"]
                .as_str()
                .and_then(|name| self.index_of(name))
        })
    }

    /// The node leading stream `stream` (of the default account), as a
    /// running node sees it.
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        self.running_jsz(JSZ_STREAMS)
            .find_map(|v| stream_leader_in(&v, stream))
            .and_then(|name| self.index_of(&name))
    }

    fn running_jsz<'a>(&'a self, path: &'a str) -> impl Iterator<Item = Value> + 'a {
        self.nodes
            .iter()
            .filter(|n| n.process.is_some())
            .filter_map(move |n| http_get(n.http_port, path))
    }

    /// The last lines of node `i`'s log.
    pub fn log_tail(&self, i: usize) -> String {
        self.nodes[i].log_tail()
    }

    /// A client given every node's URL: it fails over to another node when
    /// the one it is connected to goes away.
    pub async fn client(&self) -> async_nats::Client {
        let addrs: Vec<async_nats::ServerAddr> = (0..self.len())
            .map(|i| self.url(i).parse().expect("a loopback URL parses"))
            .collect();
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(addrs)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.urls()))
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for i in 0..self.len() {
            self.kill(i);
        }
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                eprintln!("test cluster files kept in {}", dir.keep().display());
            }
        }
    }
}

/// The monitoring path whose answer [`stream_leader_in`] reads.
pub const JSZ_STREAMS: &str = "/jsz?accounts=true&streams=true";

/// The server name of the leader of `stream` in a [`JSZ_STREAMS`] answer.
pub fn stream_leader_in(jsz: &Value, stream: &str) -> Option<String> {
    jsz["account_details"]
        .as_array()?
        .iter()
        .filter_map(|a| a["stream_detail"].as_array())
        .flatten()
        .find(|s| s["name"] == stream)
        .and_then(|s| s["cluster"]["leader"].as_str().map(str::to_string))
}

/// `n` distinct free loopback ports (all held at once while choosing).
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("bound address").port())
        .collect()
}

/// GET a monitoring endpoint; the JSON body whatever the status code
/// (`/healthz` answers 503 with a reason while unhealthy).
fn http_get(port: u16, path: &str) -> Option<Value> {
    monitor_get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path)
}

/// GET `path` from a nats-server's monitoring port at `addr` (1 s to
/// connect, 5 s to answer): the JSON body whatever the status code, `None`
/// when there is no answer.
pub fn monitor_get(addr: std::net::SocketAddr, path: &str) -> Option<Value> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (_, body) = buf.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::{self, stream};

    /// Publish with a message id until JetStream acks it (an election may
    /// be under way); the id makes a retried publish a duplicate, not a copy.
    async fn publish_acked(js: &jetstream::Context, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let sent = js
                .send_publish(
                    "r3.x",
                    jetstream::message::PublishMessage::build()
                        .payload(format!("{i}").into())
                        .message_id(format!("m{i}")),
                )
                .await;
            let err = match sent {
                Ok(ack) => match ack.await {
                    Ok(_) => return,
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "message {i} not acked within 60 s: {err}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_r3_stream_survives_its_leader_being_killed() {
        let mut cluster = TestCluster::start();
        assert_eq!(cluster.urls().split(',').count(), 3);
        assert!(cluster.meta_leader().is_some(), "no meta leader");
        let client = cluster.client().await;
        let js = jetstream::new(client.clone());
        let info = js
            .create_stream(stream::Config {
                name: "R3".into(),
                subjects: vec!["r3.>".into()],
                num_replicas: 3,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .expect("create R3 stream")
            .info()
            .await
            .expect("stream info")
            .clone();
        assert_eq!(info.config.num_replicas, 3);
        let cl = info.cluster.expect("a clustered stream has cluster info");
        assert_eq!(cl.replicas.len(), 2, "two followers: {:?}", cl.replicas);
        for i in 0..20 {
            publish_acked(&js, i).await;
        }

        // Kill the stream leader; the leader the monitoring port reports is
        // the one JetStream reports.
        let leader = cluster.stream_leader("R3").expect("R3 has a leader");
        assert_eq!(Some(cluster.name(leader)), cl.leader.as_deref());
        // A client connected to the node we kill, with the others listed
        // after it (in that order).
        let direct = async_nats::ConnectOptions::new()
            .retain_servers_order()
            .connect(
                [leader, (leader + 1) % NODES, (leader + 2) % NODES]
                    .map(|i| cluster.url(i).parse::<async_nats::ServerAddr>().unwrap())
                    .as_slice(),
            )
            .await
            .expect("connect leader first");
        assert_eq!(direct.server_info().server_name, cluster.name(leader));
        let djs = jetstream::new(direct.clone());
        cluster.kill(leader);
        assert!(!cluster.is_running(leader));

        // Publishing goes on through the other nodes.
        for i in 20..40 {
            publish_acked(&djs, i).await;
        }
        assert_ne!(
            direct.server_info().server_name,
            cluster.name(leader),
            "the client failed over"
        );
        let mut s = djs.get_stream("R3").await.expect("stream after failover");
        let info = s.info().await.expect("info after failover");
        assert_eq!(info.state.messages, 40, "no message lost or duplicated");
        let new_leader = info.cluster.as_ref().and_then(|c| c.leader.clone());
        assert!(
            new_leader.is_some() && new_leader.as_deref() != Some(cluster.name(leader)),
            "a new leader: {new_leader:?}"
        );

        // The killed node comes back on the same ports and store and catches
        // up: it holds all 40 messages.
        cluster.restart(leader).expect("restart");
        let back = async_nats::connect(cluster.url(leader)).await.unwrap();
        assert_eq!(back.server_info().server_name, cluster.name(leader));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let held = http_get(
                cluster.nodes[leader].http_port,
                "/jsz?accounts=true&streams=true",
            )
            .and_then(|v| {
                v["account_details"].as_array()?.iter().find_map(|a| {
                    a["stream_detail"]
                        .as_array()?
                        .iter()
                        .find(|s| s["name"] == "R3")
                        .and_then(|s| s["state"]["messages"].as_u64())
                })
            });
            if held == Some(40) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "restarted node holds {held:?} messages, not 40"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let dir = cluster.dir().to_path_buf();
        drop(cluster);
        assert!(!dir.exists(), "cluster dir must be removed on drop");
    }
}
