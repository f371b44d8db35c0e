//! Test harness: a real nats-server, a connected mesh, executors serving
//! chosen tools (started as `noetl run` starts them, without the other
//! services: the tests play the router and scheduler), plans stored in
//! KV, commands published, events read back from the event stream.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::StreamExt;
use noetl_core::tool::Tool;
use noetl_inprocess::{InProcess, Options};
use noetl_mesh::{codec, events, keys::Keys, kv, plan::PlanRecord, Mesh, MeshConfig, MeshError};
use noetl_testkit::TestServer;
use noetl_tool_noop::NoopTool;
use noetl_tool_python::PythonTool;
use noetl_wire::{Event, IterationRef, TaskCommand};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// How long a test waits for an expected event.
pub const WAIT: Duration = Duration::from_secs(20);

/// One real server, a mesh and the executors started on it.
pub struct Harness {
    pub mesh: Mesh,
    services: InProcess,
    executors: Vec<JoinHandle<Result<(), MeshError>>>,
    _server: TestServer,
}

pub fn noop() -> Arc<dyn Tool> {
    Arc::new(NoopTool)
}

pub fn python() -> Arc<dyn Tool> {
    Arc::new(PythonTool::new())
}

impl Harness {
    /// A server and one executor replica serving noop and python.
    pub async fn start() -> Self {
        Self::with_replicas(vec![vec![noop(), python()]], 8).await
    }

    /// A server and one executor replica per tool list.
    pub async fn with_replicas(replicas: Vec<Vec<Arc<dyn Tool>>>, concurrency: usize) -> Self {
        Self::configured(replicas, concurrency, |_| {}).await
    }

    /// As [`Self::with_replicas`], the mesh's settings changed by `set`.
    pub async fn configured(
        replicas: Vec<Vec<Arc<dyn Tool>>>,
        concurrency: usize,
        set: impl FnOnce(&mut MeshConfig),
    ) -> Self {
        let server = TestServer::start();
        let mut config = MeshConfig {
            nats_url: server.url(),
            ..MeshConfig::default()
        };
        set(&mut config);
        let mesh = Mesh::connect(config.clone()).await.expect("mesh connects");
        let only_executors = Options {
            replicas: 0,
            concurrency,
            executors: false,
        };
        let services = InProcess::start(&config, &only_executors)
            .await
            .expect("no services to start");
        let mut executors = Vec::new();
        for tools in replicas {
            let e = services.spawn_executor(tools, concurrency).await;
            executors.push(e.expect("executor connects"));
        }
        Self {
            mesh,
            services,
            executors,
            _server: server,
        }
    }

    /// Store the plan of `eid`: `workflow` is the list of steps in the
    /// normalised form.
    pub async fn plan(&self, eid: &str, workflow: Value, workload: Value) {
        let playbook = serde_json::from_value(json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": format!("test-{eid}")},
            "workload": workload,
            "workflow": workflow,
        }))
        .expect("a valid normalised playbook");
        let mut record = PlanRecord::new(eid.to_string(), "test.yaml".into(), playbook, workload);
        record.trace_id = format!("trace-{eid}");
        kv::put(self.mesh.exec_kv(), &Keys::plan(eid), &record)
            .await
            .expect("plan stored");
    }

    /// Publish `cmd` on `<p>.task.<kind>` with message id `msg_id`.
    pub async fn send_as(&self, kind: &str, cmd: &TaskCommand, msg_id: &str) {
        self.mesh
            .publish(self.mesh.subjects().task(kind), msg_id, codec::encode(cmd))
            .await
            .expect("publish")
            .wait()
            .await
            .expect("ack");
    }

    /// Publish `cmd` on `<p>.task.<kind>` (message id = command id).
    pub async fn send(&self, kind: &str, cmd: &TaskCommand) {
        self.send_as(kind, cmd, &cmd.command_id.clone()).await
    }

    /// Read the events of `eid` from the event stream, from the start.
    pub async fn events(&self, eid: &str) -> EventLog {
        let stream = self
            .mesh
            .js()
            .get_stream(self.mesh.subjects().events_stream())
            .await
            .expect("events stream");
        let consumer = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: self.mesh.subjects().events_of(eid),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .expect("ordered consumer");
        EventLog {
            messages: consumer.messages().await.expect("messages"),
            seen: Vec::new(),
            unfolded: Default::default(),
        }
    }

    /// The stored `ctx` of `eid`.
    pub async fn ctx(&self, eid: &str) -> Value {
        self.mesh.exec_ctx(eid).await.expect("ctx")
    }

    /// The stored last result of `step`.
    pub async fn result(&self, eid: &str, step: &str) -> Option<Value> {
        kv::get(self.mesh.exec_kv(), &Keys::result(eid, step))
            .await
            .expect("result")
    }

    /// Cancel and drain the executors.
    pub async fn stop(self) {
        self.services.stop().await.expect("nothing else to stop");
        for e in self.executors {
            e.await.expect("executor task").expect("executor drained");
        }
    }
}

/// The first command of a (non-loop) step-run.
pub fn command(eid: &str, step: &str, step_run_id: &str) -> TaskCommand {
    TaskCommand {
        command_id: format!("{step_run_id}-first"),
        execution_id: eid.to_string(),
        step: step.to_string(),
        step_run_id: step_run_id.to_string(),
        pc: 0,
        attempt: 1,
        args_json: Vec::new(),
        prev_json: Vec::new(),
        iteration: None,
        not_before_ms: 0,
        trace_id: format!("trace-{eid}"),
        steps_taken: 0,
        resume_outcome_json: Vec::new(),
        deadline_ms: 0,
        deadline_of: String::new(),
        results_json: Vec::new(),
        claim: None,
        handled_json: Vec::new(),
        batch: Vec::new(),
    }
}

/// The first command of iteration `index` of loop run `loop_run_id`.
pub fn iteration(eid: &str, step: &str, loop_run_id: &str, index: u64, iter: Value) -> TaskCommand {
    let mut cmd = command(eid, step, loop_run_id);
    cmd.command_id = format!("{loop_run_id}-iter-{index}");
    cmd.iteration = Some(IterationRef {
        loop_run_id: loop_run_id.to_string(),
        index,
        iter_json: codec::json_bytes(&iter),
        reduce_json: Vec::new(),
        total: 0,
    });
    cmd
}

/// Events of one execution as stored in the stream.
/// Read as every reader of the log reads it: a step's end that carries
/// its last task's `task.done` is the two events it stands for.
pub struct EventLog {
    messages: pull::Ordered,
    pub seen: Vec<Event>,
    unfolded: std::collections::VecDeque<Event>,
}

impl EventLog {
    async fn next(&mut self, timeout: Duration) -> Option<Event> {
        if let Some(ev) = self.unfolded.pop_front() {
            self.seen.push(ev.clone());
            return Some(ev);
        }
        match tokio::time::timeout(timeout, self.messages.next()).await {
            Ok(Some(Ok(m))) => {
                let ev: Event = noetl_mesh::events::decode(&m).expect("an event");
                self.unfolded.extend(noetl_mesh::events::unfold(ev));
                let ev = self.unfolded.pop_front().expect("one event at least");
                self.seen.push(ev.clone());
                Some(ev)
            }
            Ok(Some(Err(e))) => panic!("event stream failed: {e}"),
            Ok(None) | Err(_) => None,
        }
    }

    /// Read until an event of `event_type` arrives (panics after [`WAIT`]).
    pub async fn until(&mut self, event_type: &str) -> Event {
        self.until_where(|e| e.event_type == event_type, event_type)
            .await
    }

    /// Read until an event matches `pred` (panics after [`WAIT`]).
    pub async fn until_where(&mut self, pred: impl Fn(&Event) -> bool, what: &str) -> Event {
        if let Some(e) = self.seen.iter().find(|e| pred(e)) {
            return e.clone();
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(e) if pred(&e) => return e,
                Some(_) => {}
                None => panic!("no {what} within {WAIT:?}; saw {:#?}", self.summary()),
            }
        }
    }

    /// Read whatever else arrives until the stream is quiet for `quiet`.
    pub async fn settle(&mut self, quiet: Duration) {
        while self.next(quiet).await.is_some() {}
    }

    /// Every task attempt's start seen: its `task.started`, or the
    /// `task.done` of a quick attempt that records its start
    /// ([`noetl_mesh::attempt::attempt_started`]).
    pub fn starts(&self) -> Vec<&Event> {
        self.seen
            .iter()
            .filter(|e| noetl_mesh::attempt::attempt_started(e).is_some())
            .collect()
    }

    /// Events of `event_type` seen so far.
    pub fn of(&self, event_type: &str) -> Vec<&Event> {
        self.seen
            .iter()
            .filter(|e| e.event_type == event_type)
            .collect()
    }

    /// `(type, task, payload)` of every event seen, for failure messages.
    pub fn summary(&self) -> Vec<(String, String, Value)> {
        self.seen
            .iter()
            .map(|e| (e.event_type.clone(), e.task.clone(), events::payload(e)))
            .collect()
    }
}

/// The payload of an event.
pub fn payload(e: &Event) -> Value {
    events::payload(e)
}
