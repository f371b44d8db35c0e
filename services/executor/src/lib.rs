//! noetl-executor: the tool-executor service (docs/dsl.md, "The pipeline").
//!
//! One durable consumer per served tool kind (`executor-<kind>` on
//! `<p>.task.<kind>`). Each [`noetl_wire::TaskCommand`] runs the pipeline of
//! its step-run from task `pc`: tasks of served kinds run in place, with task
//! policy (`continue`, `retry`, `jump`, `break`, `fail`, `set_ctx`,
//! `set_iter`) applied after each; the first task of another kind, or a
//! retry with a delay, is handed off as a new command. The step-run ends
//! with `step.done` / `step.failed` (or `loop.iteration.done` /
//! `loop.iteration.failed`). Task policy never starts steps.
//!
//! A command whose `not_before_ms` lies in the future is NAKed with the
//! remaining delay, so delayed retries hold no slot and no handler sleeps.
//! While a command runs, the executor tells JetStream it is in progress, so
//! a long pipeline is not redelivered to another replica.

mod analysis;
mod call;
mod child;
mod claim;
mod gate;
pub mod keychain;
mod pipeline;
mod script;
pub mod secrets;
mod task;
mod wait;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::Message;
use noetl_core::tool::Tool;
use noetl_mesh::{
    handler::{Handle, Handled, Job, StepOf, Typed, WhenStopped},
    runtime::{self, BoxFuture, ConsumerLoop, Handler, ServiceParams},
    topology::{ConsumerSpec, StreamKind},
    Mesh, MeshError,
};
use noetl_wire::TaskCommand;

pub use child::PlaybookTool;
pub use pipeline::{
    checkpoints_log, rebuild_checkpoint, CheckpointRebuilt, Executor, HandlerError, MAX_TASK_RUNS,
};
pub use wait::WaitTool;

/// What an executor replica needs: the service parameters and the tools it
/// serves (it consumes only `<prefix>.task.<kind>` of those kinds).
pub struct ExecutorParams {
    /// Mesh, concurrency, shutdown.
    pub service: ServiceParams,
    /// Tool kinds served by this replica.
    pub tools: Vec<Arc<dyn Tool>>,
}

/// Run the executor until shutdown, then drain.
///
/// Fails at once when no tool is given, when two tools serve the same kind,
/// or when a kind cannot be used in a subject name.
pub async fn serve(params: ExecutorParams) -> Result<(), MeshError> {
    let ExecutorParams { service, tools } = params;
    let mesh = service.mesh.clone();
    let mut by_kind: HashMap<String, Arc<dyn Tool>> = HashMap::new();
    for tool in tools {
        let kind = tool.kind();
        if kind.is_empty()
            || !kind
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(MeshError::Config(format!(
                "tool kind {kind:?} must be non-empty and use only [A-Za-z0-9_-]"
            )));
        }
        if by_kind.insert(kind.to_string(), tool.clone()).is_some() {
            return Err(MeshError::Config(format!(
                "two tools serve the kind {kind:?}"
            )));
        }
    }
    if by_kind.is_empty() {
        return Err(MeshError::Config(
            "an executor must serve at least one tool kind".into(),
        ));
    }
    let mut kinds: Vec<String> = by_kind.keys().cloned().collect();
    kinds.sort();
    // `--concurrency` bounds the replica, whatever number of kinds it
    // serves, and the iterations of a batch count against it too.
    let slots = Arc::new(tokio::sync::Semaphore::new(service.concurrency.max(1)));
    let executor = Arc::new(Executor::new(mesh.clone(), by_kind, slots.clone()));
    let handler: Arc<dyn Handler> = Arc::new(Typed::new(TaskHandler { executor }));
    let mut loops = Vec::with_capacity(kinds.len());
    for kind in &kinds {
        let name = format!("executor-{kind}");
        let consumer = mesh
            .consumer(&ConsumerSpec {
                durable: name.clone(),
                stream: StreamKind::Work,
                filter_subjects: vec![mesh.subjects().task(kind)],
                max_ack_pending: 10_000,
            })
            .await?;
        loops.push(runtime::run_sharing(
            mesh.clone(),
            ConsumerLoop {
                name,
                consumer,
                concurrency: service.concurrency,
                handler: handler.clone(),
                shutdown: service.shutdown.clone(),
            },
            slots.clone(),
        ));
    }
    tracing::info!(kinds = ?kinds, concurrency = service.concurrency, "executor serving");
    futures::future::join_all(loops).await.into_iter().collect()
}

/// Handles task commands for every kind a replica serves.
pub struct TaskHandler {
    /// The shared executor state.
    pub executor: Arc<Executor>,
}

impl Handle for TaskHandler {
    type In = TaskCommand;
    type Plan = StepOf;
    const NAME: &'static str = "execute";
    /// Cancelled: run nothing more.
    const WHEN_STOPPED: WhenStopped = WhenStopped::Ack;
    /// Pipelines run longer than the ack-wait.
    const HEARTBEAT: bool = true;

    fn mesh(&self) -> &Mesh {
        self.executor.mesh()
    }

    fn handle(
        self: Arc<Self>,
        job: Job<TaskCommand, StepOf>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            let Job {
                msg,
                input: cmd,
                plan,
            } = job;
            if let Some(wait) = pipeline::remaining(cmd.not_before_ms) {
                return Ok(Handled::NotYet(wait));
            }
            // A copy that comes after its work was reported runs nothing;
            // so does a command that waited in the queue past the executor
            // wait (a `task.unserved` timer may have failed its step-run).
            let executor = &self.executor;
            let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
            let redelivered = delivered > 1;
            // So is a claim the loop-supervisor sent again (a first
            // delivery): running a claim twice can take rows nothing will
            // process.
            let again = cmd.claim.as_ref().is_some_and(|c| c.again);
            if again || redelivered_or_waited(&msg, executor.mesh().config().executor_wait) {
                if let Some(why) = executor.ended(&cmd, again || redelivered).await? {
                    tracing::info!(execution_id = %cmd.execution_id, step = %cmd.step,
                        command_id = %cmd.command_id, %why, "stale task command acked without running");
                    return Ok(Handled::Done);
                }
            }
            let max = executor.mesh().config().max_deliveries;
            // Near the delivery limit, a command that waits for a slot or
            // a token goes back as a fresh copy instead of being NAKed.
            let copy = (delivered + 2 >= max).then(|| cmd.clone());
            match (executor.execute(cmd, &plan, redelivered).await?, copy) {
                (Handled::NotYet(wait), Some(copy)) => {
                    requeue(executor.mesh(), &msg, copy, wait).await?;
                    Ok(Handled::Done)
                }
                (handled, _) => Ok(handled),
            }
        })
    }
}

/// Publish `cmd` again on its subject, due after `wait`, under a message
/// id made of its command id and this message's stream sequence (a
/// redelivery of this message publishes the same copy). The command id is
/// kept, so the copy keeps its place in line or its reserved token.
async fn requeue(
    mesh: &Mesh,
    msg: &Message,
    mut cmd: TaskCommand,
    wait: Duration,
) -> Result<(), MeshError> {
    let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
    let msg_id = format!("{}.wait.{seq}", cmd.command_id);
    cmd.not_before_ms = noetl_mesh::events::now_ms() + wait.as_millis() as u64;
    tracing::debug!(execution_id = %cmd.execution_id, step = %cmd.step, ?wait, "waiting task command requeued");
    mesh.publish_for_execution(
        msg.subject.to_string(),
        &msg_id,
        &cmd.execution_id.clone(),
        noetl_mesh::codec::encode(&cmd),
    )
    .await?
    .wait()
    .await
}

/// True when `msg` is a redelivery, or waited in the stream longer than
/// `wait` before this delivery: its work may be over.
fn redelivered_or_waited(msg: &Message, wait: Duration) -> bool {
    let Ok(info) = msg.info() else {
        return false;
    };
    let published = std::time::SystemTime::from(info.published);
    let waited = std::time::SystemTime::now()
        .duration_since(published)
        .is_ok_and(|age| age > wait);
    info.delivered > 1 || waited
}
