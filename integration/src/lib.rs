//! End-to-end harness: a real `nats-server` (from `noetl-testkit`), the real
//! services as tokio tasks (any number of replicas each), and helpers to
//! submit playbooks, wait for the end and read the event log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{self, DeliverPolicy};
use futures::StreamExt;
use noetl_core::tool::Tool;
use noetl_mesh::{
    codec,
    runtime::ServiceParams,
    state::{ExecStatus, ExecSummary},
    Mesh, MeshConfig,
};
use noetl_testkit::TestServer;
use noetl_wire::{Event, ExecutionRequest};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub mod check;
pub mod gauge;
pub mod mix;
pub mod sink;
pub use gauge::Gauge;

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Replicas of every service.
    pub replicas: usize,
    /// Messages handled at once per replica.
    pub concurrency: usize,
    /// Subject prefix.
    pub prefix: String,
    /// Start executors with the other services (false: start them with
    /// [`Cluster::spawn_executor`], e.g. to crash one).
    pub executors: bool,
    /// Where large results go (`None`: `objects/` under the data dir).
    pub object_store: Option<noetl_mesh::objects::StoreLocation>,
    /// Every consumer handles every message twice, the second time after
    /// this delay ([`MeshConfig::deliver_twice`]).
    pub deliver_twice: Option<Duration>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            replicas: 1,
            concurrency: 16,
            prefix: "noetl".into(),
            executors: true,
            object_store: None,
            deliver_twice: None,
        }
    }
}

/// A running mesh on a private nats-server.
pub struct Cluster {
    /// The server (stopped and removed on drop).
    pub server: TestServer,
    /// A client-side mesh handle (for submitting and reading).
    pub mesh: Mesh,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    config: MeshConfig,
    concurrency: usize,
    /// The data dir (object store of large results), removed on drop.
    pub data_dir: tempfile::TempDir,
}

/// The repository root (for `playbooks/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration/ has a parent")
        .to_path_buf()
}

/// The tools every test executor serves: one of each built-in kind
/// ([`noetl_core::tool::KINDS`]).
pub fn all_tools() -> Vec<Arc<dyn Tool>> {
    noetl_core::tool::KINDS
        .iter()
        .map(|k| -> Arc<dyn Tool> {
            match k.name {
                "noop" => Arc::new(noetl_tool_noop::NoopTool),
                "python" => Arc::new(noetl_tool_python::PythonTool::default()),
                "playbook" => Arc::new(noetl_executor::PlaybookTool),
                "http" => Arc::new(noetl_tool_http::HttpTool::new()),
                "postgres" => Arc::new(noetl_tool_postgres::PostgresTool::new()),
                // Always served: without the engine its tasks fail with a
                // clear error instead of waiting for an executor.
                "duckdb" => Arc::new(noetl_tool_duckdb::DuckdbTool),
                other => panic!("integration::all_tools: no tool for built-in kind {other}"),
            }
        })
        .collect()
}

impl Cluster {
    /// Start a server and one replica of each service.
    pub async fn start() -> Self {
        Self::start_with(ClusterOptions::default()).await
    }

    /// Start a server and `opts.replicas` replicas of each service.
    pub async fn start_with(opts: ClusterOptions) -> Self {
        let server = TestServer::start();
        let data_dir = tempfile::Builder::new()
            .prefix("noetl-test-data-")
            .tempdir()
            .expect("data dir");
        let config = MeshConfig {
            nats_url: server.url(),
            data_dir: data_dir.path().to_path_buf(),
            object_store: opts.object_store.clone(),
            prefix: opts.prefix.clone(),
            ack_wait: Duration::from_secs(5),
            deliver_twice: opts.deliver_twice,
            ..MeshConfig::default()
        };
        let mesh = Mesh::connect(config.clone()).await.expect("connect mesh");
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        for _ in 0..opts.replicas {
            // Each replica has its own connection, like a separate process.
            let m = Mesh::connect(config.clone())
                .await
                .expect("connect replica");
            let params = ServiceParams {
                mesh: m,
                concurrency: opts.concurrency,
                shutdown: shutdown.clone(),
            };
            let p = params.clone();
            tasks.push(tokio::spawn(async move {
                noetl_router::serve(p).await.expect("router");
            }));
            let p = params.clone();
            tasks.push(tokio::spawn(async move {
                noetl_scheduler::serve(p).await.expect("scheduler");
            }));
            let p = params.clone();
            tasks.push(tokio::spawn(async move {
                noetl_loop_supervisor::serve(p)
                    .await
                    .expect("loop-supervisor");
            }));
            if opts.executors {
                let p = params.clone();
                tasks.push(tokio::spawn(async move {
                    noetl_executor::serve(noetl_executor::ExecutorParams {
                        service: p,
                        tools: all_tools(),
                    })
                    .await
                    .expect("executor");
                }));
            }
        }
        Self {
            server,
            mesh,
            shutdown,
            tasks,
            config,
            concurrency: opts.concurrency,
            data_dir,
        }
    }

    /// Start one more executor replica (all tools) on its own connection.
    /// Aborting the returned handle is a crash: nothing is acked or drained.
    pub async fn spawn_executor(&self) -> JoinHandle<()> {
        let m = Mesh::connect(self.config.clone())
            .await
            .expect("connect executor");
        let params = ServiceParams {
            mesh: m,
            concurrency: self.concurrency,
            shutdown: self.shutdown.clone(),
        };
        tokio::spawn(async move {
            let _ = noetl_executor::serve(noetl_executor::ExecutorParams {
                service: params,
                tools: all_tools(),
            })
            .await;
        })
    }

    /// Start an executor replica serving only `kinds`, with its own
    /// `concurrency` — like `noetl serve executor --kind K --concurrency N`.
    pub async fn spawn_executor_for(&self, kinds: &[&str], concurrency: usize) -> JoinHandle<()> {
        let m = Mesh::connect(self.config.clone())
            .await
            .expect("connect executor");
        let params = ServiceParams {
            mesh: m,
            concurrency,
            shutdown: self.shutdown.clone(),
        };
        let tools: Vec<Arc<dyn Tool>> = all_tools()
            .into_iter()
            .filter(|t| kinds.contains(&t.kind()))
            .collect();
        assert_eq!(tools.len(), kinds.len(), "unknown kind in {kinds:?}");
        tokio::spawn(async move {
            let _ = noetl_executor::serve(noetl_executor::ExecutorParams {
                service: params,
                tools,
            })
            .await;
        })
    }

    /// Submit a playbook (YAML text) with workload overrides; returns its id.
    pub async fn submit(&self, yaml: &str, source: &str, workload: Value) -> String {
        let eid = noetl_mesh::ids::new_execution_id();
        self.submit_as(&eid, yaml, source, workload).await;
        eid
    }

    /// Submit with a chosen execution id.
    pub async fn submit_as(&self, eid: &str, yaml: &str, source: &str, workload: Value) {
        let req = ExecutionRequest {
            execution_id: eid.to_string(),
            playbook_yaml: yaml.to_string(),
            source_name: source.to_string(),
            workload_json: codec::json_bytes(&workload),
            ..Default::default()
        };
        self.mesh
            .publish(
                self.mesh.subjects().exec_request(),
                eid,
                codec::encode(&req),
            )
            .await
            .expect("publish request")
            .wait()
            .await
            .expect("request ack");
    }

    /// Wait until the execution is terminal; panics after `timeout`.
    pub async fn wait(&self, eid: &str, timeout: Duration) -> ExecSummary {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(h) = self.mesh.exec_header(eid).await.expect("read header") {
                if h.status != ExecStatus::Running {
                    return self
                        .mesh
                        .exec_summary(eid)
                        .await
                        .expect("summary")
                        .expect("summary exists");
                }
            }
            if Instant::now() > deadline {
                let events = self.events(eid).await;
                let types: Vec<String> = events
                    .iter()
                    .map(|e| format!("{} {}", e.event_type, e.step))
                    .collect();
                panic!(
                    "execution {eid} did not finish within {timeout:?}; events so far: {types:#?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Run a playbook file from the repository and wait for the end.
    pub async fn run_file(&self, rel: &str, workload: Value) -> (ExecSummary, Vec<Event>) {
        let path = repo_root().join(rel);
        let yaml = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let eid = self.submit(&yaml, rel, workload).await;
        let summary = self.wait(&eid, Duration::from_secs(60)).await;
        // Terminal events are emitted with the header update; give the
        // stream a moment to hold every event of the run.
        let events = self.settled_events(&eid).await;
        (summary, events)
    }

    /// Every event of an execution currently in the stream, in order.
    pub async fn events(&self, eid: &str) -> Vec<Event> {
        events_of(&self.mesh, &self.mesh.subjects().events_of(eid)).await
    }

    /// Events of a finished execution, once the terminal event is there.
    pub async fn settled_events(&self, eid: &str) -> Vec<Event> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let evs = self.events(eid).await;
            let terminal = evs.iter().any(|e| {
                e.event_type == "execution.completed" || e.event_type == "execution.failed"
            });
            if terminal || Instant::now() > deadline {
                // Allow stragglers from still-draining branches.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return self.events(eid).await;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stop the services (graceful drain) and the server.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

/// Every message currently in the events stream under `filter`, decoded.
pub async fn events_of(mesh: &Mesh, filter: &str) -> Vec<Event> {
    let stream = mesh
        .js()
        .get_stream(mesh.subjects().events_stream())
        .await
        .expect("events stream");
    let info = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: filter.to_string(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .expect("ordered consumer");
    let mut consumer = info;
    let name = consumer.cached_info().name.clone();
    let pending = consumer.info().await.expect("consumer info").num_pending;
    let mut out = Vec::new();
    if pending == 0 {
        let _ = stream.delete_consumer(&name).await;
        return out;
    }
    let mut messages = consumer.messages().await.expect("messages");
    while let Some(m) = messages.next().await {
        let m = m.expect("event message");
        out.push(codec::decode::<Event>("event", &m.payload).expect("decode event"));
        if m.info().map(|i| i.pending).unwrap_or(0) == 0 {
            break;
        }
    }
    // Tests poll: do not leave an ephemeral consumer per call behind.
    drop(messages);
    let _ = stream.delete_consumer(&name).await;
    out
}

/// Event types in order.
pub fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

/// True when `needle` appears in `hay` as a subsequence.
pub fn is_subsequence(hay: &[&str], needle: &[&str]) -> bool {
    let mut it = hay.iter();
    needle.iter().all(|n| it.any(|h| h == n))
}
