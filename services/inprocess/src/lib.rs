//! The whole mesh in one process: router, scheduler, loop-supervisor and
//! executors as tokio tasks, each on its own NATS connection exactly as
//! separate processes would be. `noetl run` starts the mesh this way, and
//! so do the test harnesses, so what the tests run is what users run.
//!
//! The tool registry ([`tool`], [`all_tools`]) is here too: one tool of
//! each built-in kind ([`noetl_core::tool::KINDS`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use noetl_core::tool::Tool;
use noetl_mesh::{runtime::ServiceParams, Mesh, MeshConfig, MeshError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long [`InProcess::stop`] waits for each service to drain.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// How long [`InProcess::spawn_executor`] waits for the executor to serve
/// its kinds.
const READY_WAIT: Duration = Duration::from_secs(10);

/// Every tool kind this build can serve: the built-in kinds.
pub fn known_kinds() -> impl Iterator<Item = &'static str> {
    noetl_core::tool::KINDS.iter().map(|k| k.name)
}

/// A new tool serving `kind`, if it is a built-in kind, for an executor
/// of the mesh `mesh` describes (the `nats` tool's default server and
/// protected prefix). Tools are made only for the kinds a process serves
/// (the python tool starts warm interpreters as soon as it exists).
pub fn tool(kind: &str, mesh: &MeshConfig) -> Option<Arc<dyn Tool>> {
    let tool: Arc<dyn Tool> = match kind {
        "noop" => Arc::new(noetl_tool_noop::NoopTool),
        "python" => Arc::new(noetl_tool_python::PythonTool::new()),
        "playbook" => Arc::new(noetl_executor::PlaybookTool),
        "wait" => Arc::new(noetl_executor::WaitTool),
        "http" => Arc::new(noetl_tool_http::HttpTool::new()),
        "postgres" => Arc::new(noetl_tool_postgres::PostgresTool::new()),
        // Always served: without the engine its tasks fail with a clear
        // error instead of waiting for an executor that never comes.
        "duckdb" => Arc::new(noetl_tool_duckdb::DuckdbTool),
        "nats" => Arc::new(noetl_tool_nats::NatsTool::new(
            noetl_tool_nats::MeshServer::from_config(mesh),
        )),
        "transfer" => Arc::new(noetl_tool_transfer::TransferTool::new()),
        "shell" => Arc::new(noetl_tool_shell::ShellTool::new()),
        "artifact" => Arc::new(noetl_tool_artifact::ArtifactTool),
        _ => return None,
    };
    Some(tool)
}

/// One tool of every built-in kind, for an executor of `mesh`.
pub fn all_tools(mesh: &MeshConfig) -> Vec<Arc<dyn Tool>> {
    known_kinds().filter_map(|k| tool(k, mesh)).collect()
}

/// A kind that is not built in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tool kind {kind:?} (known: {known})")]
pub struct UnknownKind {
    /// The kind asked for.
    pub kind: String,
    /// The built-in kinds, comma-separated.
    pub known: String,
}

/// One tool for each of `kinds`, for an executor of `mesh`.
pub fn tools_for(kinds: &[&str], mesh: &MeshConfig) -> Result<Vec<Arc<dyn Tool>>, UnknownKind> {
    kinds
        .iter()
        .map(|k| {
            tool(k, mesh).ok_or_else(|| UnknownKind {
                kind: k.to_string(),
                known: known_kinds().collect::<Vec<_>>().join(", "),
            })
        })
        .collect()
}

/// What [`InProcess::start`] starts.
#[derive(Debug, Clone)]
pub struct Options {
    /// Replicas of every service.
    pub replicas: usize,
    /// Messages each replica handles at once.
    pub concurrency: usize,
    /// Start executors (one per replica, every tool) with the other
    /// services; false to start them apart with [`InProcess::spawn_executor`].
    pub executors: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            replicas: 1,
            concurrency: noetl_mesh::config::DEFAULT_CONCURRENCY,
            executors: true,
        }
    }
}

/// The services running as tokio tasks in this process.
pub struct InProcess {
    config: MeshConfig,
    concurrency: usize,
    shutdown: CancellationToken,
    tasks: Vec<(Service, JoinHandle<Result<(), MeshError>>)>,
}

/// Services that did not stop cleanly ([`InProcess::stop`]).
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.failures))]
pub struct StopError {
    /// Each service (by name) that did not stop cleanly, and how.
    pub failures: Vec<(&'static str, StopFailure)>,
}

/// How one service did not stop cleanly.
#[derive(Debug)]
pub enum StopFailure {
    /// It stopped with this error (or its task panicked).
    Failed(String),
    /// It was still draining (a tool call in flight) when the wait ended.
    NotDrained(Duration),
}

impl StopError {
    /// True when every service that did not stop was only still draining.
    pub fn only_draining(&self) -> bool {
        self.failures
            .iter()
            .all(|(_, f)| matches!(f, StopFailure::NotDrained(_)))
    }
}

fn describe(failures: &[(&'static str, StopFailure)]) -> String {
    let lines: Vec<String> = failures
        .iter()
        .map(|(name, f)| match f {
            StopFailure::Failed(e) => format!("{name}: {e}"),
            StopFailure::NotDrained(d) => format!("{name}: not drained within {d:?}"),
        })
        .collect();
    lines.join("; ")
}

/// A service of the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Router,
    Scheduler,
    LoopSupervisor,
    Executor,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::Router => "router",
            Service::Scheduler => "scheduler",
            Service::LoopSupervisor => "loop-supervisor",
            Service::Executor => "executor",
        }
    }
}

/// Spawn router, scheduler or loop-supervisor on `params`. Not async: a
/// debug build reserves room for a service's whole future in the frame of
/// the function that builds it, and [`InProcess::start`] runs deep (it
/// connects and creates the mesh under it).
fn spawn_service(service: Service, params: ServiceParams) -> JoinHandle<Result<(), MeshError>> {
    tokio::spawn(async move {
        let r = match service {
            Service::Router => noetl_router::serve(params).await,
            Service::Scheduler => noetl_scheduler::serve(params).await,
            _ => noetl_loop_supervisor::serve(params).await,
        };
        if let Err(e) = &r {
            let service = service.name();
            tracing::error!(service, error = %e, "service stopped with an error");
        }
        r
    })
}

/// Spawn an executor on `params` (not async, as [`spawn_service`]).
fn spawn_executor(params: noetl_executor::ExecutorParams) -> JoinHandle<Result<(), MeshError>> {
    tokio::spawn(async move {
        let r = noetl_executor::serve(params).await;
        if let Err(e) = &r {
            tracing::error!(error = %e, "executor stopped with an error");
        }
        r
    })
}

impl InProcess {
    /// Start `opts.replicas` replicas of router, scheduler and
    /// loop-supervisor (and of an executor with every tool, unless
    /// `opts.executors` is false), each on its own connection. With no
    /// replicas, nothing runs until [`InProcess::spawn_executor`] (a test of
    /// executors alone).
    pub async fn start(config: &MeshConfig, opts: &Options) -> Result<Self, MeshError> {
        let mut me = Self {
            config: config.clone(),
            concurrency: opts.concurrency,
            shutdown: CancellationToken::new(),
            tasks: Vec::new(),
        };
        for _ in 0..opts.replicas {
            for service in [Service::Router, Service::Scheduler, Service::LoopSupervisor] {
                let params = me.params(opts.concurrency).await?;
                me.tasks.push((service, spawn_service(service, params)));
            }
            if opts.executors {
                let task = me
                    .spawn_executor(all_tools(&me.config), opts.concurrency)
                    .await?;
                me.tasks.push((Service::Executor, task));
            }
        }
        Ok(me)
    }

    /// Start one more executor replica serving `tools`, on its own
    /// connection, handling `concurrency` messages at once (like
    /// `noetl serve executor --kind K --concurrency N`). It is cancelled
    /// with the others; the caller awaits the returned handle for its
    /// result, and aborting it is a crash (nothing is acked or drained).
    pub async fn spawn_executor(
        &self,
        tools: Vec<Arc<dyn Tool>>,
        concurrency: usize,
    ) -> Result<JoinHandle<Result<(), MeshError>>, MeshError> {
        let service = self.params(concurrency).await?;
        let mesh = service.mesh.clone();
        let kinds: Vec<String> = tools.iter().map(|t| t.kind().to_string()).collect();
        let handle = spawn_executor(noetl_executor::ExecutorParams { service, tools });
        // Serving before this returns: a first command of its kinds then
        // finds it, instead of starting a `task.unserved` timer.
        let ready = Instant::now() + READY_WAIT;
        for kind in &kinds {
            while !mesh.kind_served(kind, false).await.unwrap_or(false)
                && Instant::now() < ready
                && !handle.is_finished()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(handle)
    }

    /// The configuration the services connect with.
    pub fn config(&self) -> &MeshConfig {
        &self.config
    }

    /// Messages each replica started by [`InProcess::start`] handles at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    async fn params(&self, concurrency: usize) -> Result<ServiceParams, MeshError> {
        Ok(ServiceParams {
            mesh: Mesh::connect(self.config.clone()).await?,
            concurrency,
            shutdown: self.shutdown.clone(),
        })
    }

    /// Cancel every service started by [`InProcess::start`] and wait (up
    /// to 30 s each) for it to drain; the error names each service that
    /// failed or did not drain in time.
    pub async fn stop(self) -> Result<(), StopError> {
        self.stop_within(DRAIN_WAIT).await
    }

    /// [`InProcess::stop`], waiting up to `wait` for each service.
    pub async fn stop_within(mut self, wait: Duration) -> Result<(), StopError> {
        self.shutdown.cancel();
        let mut failures = Vec::new();
        for (service, t) in std::mem::take(&mut self.tasks) {
            let failure = match tokio::time::timeout(wait, t).await {
                Ok(Ok(Ok(()))) => continue,
                Ok(Ok(Err(e))) => StopFailure::Failed(e.to_string()),
                Ok(Err(e)) => StopFailure::Failed(format!("task ended: {e}")),
                Err(_) => StopFailure::NotDrained(wait),
            };
            failures.push((service.name(), failure));
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(StopError { failures })
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        // Dropped without `stop` (a test that panicked): the services stop
        // at their next pull instead of outliving their owner.
        self.shutdown.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_kind_has_a_tool_of_that_kind() {
        let mesh = MeshConfig::default();
        for k in known_kinds() {
            let t = tool(k, &mesh).unwrap_or_else(|| panic!("no tool for built-in kind {k}"));
            assert_eq!(t.kind(), k);
            assert_eq!(t.raw_fields(), noetl_core::tool::raw_fields(k));
        }
        assert_eq!(all_tools(&mesh).len(), noetl_core::tool::KINDS.len());
        assert!(tool("ftp", &mesh).is_none());
    }

    #[test]
    fn an_unknown_kind_is_named_with_the_known_ones() {
        let mesh = MeshConfig::default();
        let e = tools_for(&["noop", "ftp"], &mesh).err().expect("refused");
        assert_eq!(e.kind, "ftp");
        assert!(e.to_string().contains("known: noop"), "{e}");
        assert_eq!(tools_for(&["noop", "http"], &mesh).unwrap().len(), 2);
    }
}
