//! End-to-end harness: a real `nats-server` (from `noetl-testkit`), the real
//! services as tokio tasks (any number of replicas each), and helpers to
//! submit playbooks, wait for the end and read the event log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use noetl_inprocess::InProcess;
use noetl_mesh::{
    codec,
    state::{ExecStatus, ExecSummary},
    Mesh, MeshConfig,
};
use noetl_testkit::{cluster::TestCluster, TestServer};
use noetl_wire::{Event, ExecutionRequest};
use serde_json::Value;
use tokio::task::JoinHandle;

pub mod api;
pub mod campaign;
pub mod check;
pub mod echo;
pub mod gauge;
pub mod mix;
pub mod procstat;
pub mod rows;
pub mod seeded;
pub mod sink;
pub mod timed;
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
    /// How events are published ([`MeshConfig::event_encoding`]).
    pub event_encoding: noetl_mesh::config::EventEncoding,
    /// How long a task waits for an executor of its kind
    /// ([`MeshConfig::executor_wait`]).
    pub executor_wait: Duration,
    /// How the private nats-server writes to disk (`noetl run --sync`).
    pub sync: noetl_mesh::server::SyncPolicy,
    /// nats-server nodes: 1, or 3 or 5 clustered with every stream and
    /// bucket replicated on all of them (R3, R5).
    pub nodes: usize,
    /// Most iterations of a loop window per command
    /// ([`MeshConfig::loop_batch`]; `noetl-bench --loop-batch`).
    pub loop_batch: usize,
    /// One node with a monitoring port ([`Nats::exchanged`]; `noetl-bench`).
    pub monitored: bool,
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
            event_encoding: Default::default(),
            executor_wait: noetl_mesh::config::DEFAULT_EXECUTOR_WAIT,
            sync: Default::default(),
            nodes: 1,
            loop_batch: noetl_mesh::config::DEFAULT_LOOP_BATCH,
            monitored: false,
        }
    }
}

/// A service task started apart ([`Cluster::spawn_executor`]): abort it to
/// crash it; it is cancelled with the rest on [`Cluster::stop`].
pub type Service = JoinHandle<Result<(), noetl_mesh::MeshError>>;

/// An executor replica on a runtime of its own
/// ([`Cluster::spawn_crashable_executor`]). Aborting an in-process
/// service's handle stops its consumer loop but leaves the jobs it
/// dispatched running; shutting its runtime down takes its in-flight jobs,
/// their in-progress acks and its NATS connection at once, as a crash does.
pub struct CrashableExecutor {
    runtime: tokio::runtime::Runtime,
    _service: Service,
}

impl CrashableExecutor {
    /// Crash it: every task of its runtime is dropped where it stands.
    pub fn crash(self) {
        self.runtime.shutdown_background();
    }
}

/// The private NATS a [`Cluster`] runs on: one server, or three or five
/// clustered.
pub enum Nats {
    /// One nats-server.
    One(TestServer),
    /// Three or five clustered nats-servers.
    Clustered(TestCluster),
}

impl Nats {
    /// The client URL (every node's, comma-separated, for three).
    pub fn url(&self) -> String {
        match self {
            Nats::One(s) => s.url(),
            Nats::Clustered(c) => c.urls(),
        }
    }

    /// The process ids of the servers.
    pub fn pids(&self) -> Vec<u32> {
        match self {
            Nats::One(s) => s.pid().into_iter().collect(),
            Nats::Clustered(c) => (0..c.len()).filter_map(|i| c.pid(i)).collect(),
        }
    }

    /// A connected client.
    pub async fn client(&self) -> async_nats::Client {
        match self {
            Nats::One(s) => s.client().await,
            Nats::Clustered(c) => c.client().await,
        }
    }

    /// The messages the server has taken in from its clients and sent out
    /// to them so far (its `/varz` `in_msgs`, `out_msgs`): one node
    /// started [`ClusterOptions::monitored`], else `None`.
    pub fn exchanged(&self) -> Option<(u64, u64)> {
        let Nats::One(s) = self else {
            return None;
        };
        let v = s.varz()?;
        Some((v["in_msgs"].as_u64()?, v["out_msgs"].as_u64()?))
    }
}

/// A running mesh on a private nats-server: the services as `noetl run`
/// starts them ([`InProcess`]), plus a client handle.
pub struct Cluster {
    /// The server or servers (stopped and removed on drop).
    pub server: Nats,
    /// A client-side mesh handle (for submitting and reading).
    pub mesh: Mesh,
    services: InProcess,
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

/// The tools every test executor serves: one of each built-in kind.
pub use noetl_inprocess::all_tools;

impl Cluster {
    /// Start a server and one replica of each service.
    pub async fn start() -> Self {
        Self::start_with(ClusterOptions::default()).await
    }

    /// Start a server and `opts.replicas` replicas of each service.
    pub async fn start_with(opts: ClusterOptions) -> Self {
        let (server, replicas) = match opts.nodes {
            1 if opts.monitored => (Nats::One(TestServer::start_monitored(opts.sync)), 1),
            1 => (Nats::One(TestServer::start_with_sync(opts.sync)), 1),
            n @ (3 | 5) => {
                let c = TestCluster::try_start_sized(n, opts.sync)
                    .unwrap_or_else(|e| panic!("start a {n}-node cluster: {e}"));
                (Nats::Clustered(c), n)
            }
            n => panic!("a cluster of {n} nats-server nodes: only 1, 3 or 5 are started"),
        };
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
            event_encoding: opts.event_encoding,
            executor_wait: opts.executor_wait,
            loop_batch: opts.loop_batch,
            replicas,
            ..MeshConfig::default()
        };
        let mesh = Mesh::connect(config.clone()).await.expect("connect mesh");
        let services = InProcess::start(
            &config,
            &noetl_inprocess::Options {
                replicas: opts.replicas,
                concurrency: opts.concurrency,
                executors: opts.executors,
            },
        )
        .await
        .expect("start the services");
        Self {
            server,
            mesh,
            services,
            data_dir,
        }
    }

    /// Start one more executor replica (all tools) on its own connection.
    /// Aborting the returned handle is a crash: nothing is acked or drained.
    pub async fn spawn_executor(&self) -> Service {
        let concurrency = self.services.concurrency();
        self.services
            .spawn_executor(all_tools(self.services.config()), concurrency)
            .await
            .expect("start an executor")
    }

    /// Start an executor replica that [`CrashableExecutor::crash`] stops the
    /// way a killed process stops. Call it from a multi-thread test runtime
    /// (it blocks this thread while the replica starts).
    pub fn spawn_crashable_executor(&self) -> CrashableExecutor {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the executor");
        let service = tokio::task::block_in_place(|| {
            std::thread::scope(|s| {
                s.spawn(|| runtime.block_on(self.spawn_executor()))
                    .join()
                    .expect("start the executor")
            })
        });
        CrashableExecutor {
            runtime,
            _service: service,
        }
    }

    /// Start an executor replica serving only `kinds`, with its own
    /// `concurrency` — like `noetl serve executor --kind K --concurrency N`.
    pub async fn spawn_executor_for(&self, kinds: &[&str], concurrency: usize) -> Service {
        let tools =
            noetl_inprocess::tools_for(kinds, self.services.config()).expect("built-in kinds");
        self.services
            .spawn_executor(tools, concurrency)
            .await
            .expect("start an executor")
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

    /// Submit a playbook and wait (up to 30 s) for it to complete; panics
    /// naming its error if it ends otherwise. Returns its id and summary.
    pub async fn completed(&self, yaml: &str, workload: Value) -> (String, ExecSummary) {
        let eid = self.submit(yaml, "test.yaml", workload).await;
        let s = self.wait(&eid, Duration::from_secs(30)).await;
        assert_eq!(
            s.status,
            ExecStatus::Completed,
            "execution {eid}: {:?}",
            s.error
        );
        (eid, s)
    }

    /// Resume failed or cancelled execution `eid` with workload values
    /// `set` (a JSON object), as `noetl exec resume --set` does; panics
    /// when the resume is refused.
    pub async fn resume_set(&self, eid: &str, set: Value) {
        let req = noetl_mesh::resume::ResumeRequested {
            set: set.as_object().cloned().unwrap_or_default(),
            ..Default::default()
        };
        self.mesh
            .resume(eid, req, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("resume of {eid}: {e}"));
    }

    /// Wait until the execution is terminal and the router has done what
    /// follows its end (its terminal event, a gate slot released, a parent
    /// resumed: the header's `terminal_emitted`), so what a test reads next
    /// does not race the router; panics after `timeout`. An end not marked
    /// emitted within [`END_SETTLES`] of the header turning terminal (a
    /// router stopped by the test) is returned as it is.
    pub async fn wait(&self, eid: &str, timeout: Duration) -> ExecSummary {
        let deadline = Instant::now() + timeout;
        let mut terminal_since = None;
        loop {
            if let Some(h) = self.mesh.exec_header(eid).await.expect("read header") {
                let settled = h.status != ExecStatus::Running
                    && (h.terminal_emitted
                        || terminal_since.get_or_insert_with(Instant::now).elapsed()
                            >= END_SETTLES);
                if settled {
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

    /// Fold the execution's events and compare them with its stored
    /// records (`noetl exec replay`).
    pub async fn replay(&self, eid: &str) -> noetl_mesh::replay::Report {
        noetl_mesh::replay::check(&self.mesh, eid)
            .await
            .unwrap_or_else(|e| panic!("replay of {eid}: {e}"))
    }

    /// [`Self::replay`] of a finished execution, given up to 5 s for its
    /// last writes (the terminal event's flag, stragglers) to land: the
    /// first report that is equal, else the last one.
    pub async fn replay_settled(&self, eid: &str) -> noetl_mesh::replay::Report {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let report = self.replay(eid).await;
            if report.equal || Instant::now() >= deadline {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Assert that a finished execution's events give every record stored
    /// for it (`noetl exec replay` reports equal, [`Self::replay_settled`]).
    pub async fn assert_replays(&self, eid: &str) {
        let report = self.replay_settled(eid).await;
        assert!(
            report.equal,
            "execution {eid}: its events and its records differ: {}",
            serde_json::to_string_pretty(&report.differences).unwrap()
        );
    }

    /// Write `header` as its execution's record, the way a router stopped
    /// mid-way would have left it (tests of what a redelivery finds).
    pub async fn put_header(&self, header: &noetl_mesh::state::ExecHeader) {
        noetl_mesh::kv::put(
            self.mesh.exec_kv(),
            &noetl_mesh::keys::Keys::header(&header.execution_id),
            header,
        )
        .await
        .expect("write the header");
    }

    /// Every event of an execution currently in the stream, in order.
    pub async fn events(&self, eid: &str) -> Vec<Event> {
        events_of(&self.mesh, &self.mesh.subjects().events_of(eid)).await
    }

    /// Wait until durable consumer `name` of the work stream has nothing
    /// pending or unacked (what it was sent is handled); panics after
    /// 10 s, naming it.
    pub async fn drained(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stream = (self.mesh.js())
                .get_stream(self.mesh.subjects().work_stream())
                .await
                .expect("the work stream");
            let info = stream.consumer_info(name).await.expect("the consumer");
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "consumer {name} did not drain");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until an event of `eid` matches `pred` and return the events
    /// so far; panics after `timeout`, naming `what` it waited for.
    pub async fn wait_for_event(
        &self,
        eid: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Event) -> bool,
    ) -> Vec<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            let evs = self.events(eid).await;
            if evs.iter().any(&pred) {
                return evs;
            }
            assert!(
                Instant::now() < deadline,
                "execution {eid}: no {what} within {timeout:?}; events: {:?}",
                types(&evs)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
        // A tool call still running (a long sleep a test left behind) is
        // not waited for; a service that failed is a test failure.
        match self.services.stop_within(Duration::from_secs(10)).await {
            Ok(()) => {}
            Err(e) if e.only_draining() => {}
            Err(e) => panic!("services did not stop cleanly: {e}"),
        }
    }
}

/// Every message currently in the events stream under `filter`, decoded.
pub async fn events_of(mesh: &Mesh, filter: &str) -> Vec<Event> {
    mesh.stored_events(filter)
        .await
        .expect("read the events stream")
        .into_iter()
        .map(|e| e.expect("decode event"))
        .collect()
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

/// Every message of every stream of the server (events, KV buckets, work
/// queue, dead letters, object store) as text.
pub async fn every_stream(mesh: &noetl_mesh::Mesh) -> String {
    use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
    use futures::StreamExt;
    let js = mesh.js();
    let names: Vec<String> = js
        .stream_names()
        .map(|n| n.unwrap())
        .collect::<Vec<_>>()
        .await;
    let mut out = String::new();
    for name in names {
        let mut stream = js.get_stream(&name).await.unwrap();
        if stream.info().await.unwrap().state.messages == 0 {
            continue;
        }
        // The work queue refuses a consumer overlapping its own: what it
        // held was consumed (and so deleted) anyway.
        let Ok(consumer) = stream
            .create_consumer(OrderedConfig {
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
        else {
            out.push_str(&format!("\n[{name}: not readable]"));
            continue;
        };
        let cname = consumer.cached_info().name.clone();
        let mut messages = consumer.messages().await.unwrap();
        while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(2), messages.next()).await
        {
            let m = m.unwrap();
            out.push_str(&format!("\n[{name} {}] ", m.subject));
            out.push_str(&String::from_utf8_lossy(&m.payload));
            if m.info().map(|i| i.pending).unwrap_or(0) == 0 {
                break;
            }
        }
        drop(messages);
        let _ = stream.delete_consumer(&cname).await;
    }
    out
}

/// How long [`Cluster::wait`] gives a terminal execution's router to mark
/// its end emitted before returning without it.
pub const END_SETTLES: Duration = Duration::from_secs(5);

/// A three-step chain whose middle step, `nap`, runs a python task for a
/// second: the router starts it itself, so its `step.started` rides in
/// the router's answer to `start` (`next.selected`), for tests of what
/// reads the log while such a step-run runs.
pub const NAP_IN_THE_MIDDLE: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: nap_in_the_middle }
workflow:
  - step: start
    tool:
      - { name: n, kind: noop }
    next:
      arcs:
        - step: nap
  - step: nap
    tool:
      - name: sleep
        kind: python
        code: |
          import time
          time.sleep(1.0)
          result = 'rested'
    next:
      arcs:
        - step: last
  - step: last
    tool:
      - { name: n, kind: noop }
"#;
