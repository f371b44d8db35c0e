//! noetl-loop-supervisor: runs a loop step's pipeline once per element.
//!
//! - `loop-commands` on `<p>.loop.>`: renders `loop.in`, stores the
//!   collection, creates the loop-run state (create-only) and dispatches the
//!   first window of iterations (1 for `sequential`, `max_in_flight` for
//!   `parallel`) as task commands carrying an isolated `iter`.
//! - `loop-events` on `loop.iteration.done|failed`: counts each iteration
//!   once (an index leaves the in-flight window exactly once, under CAS),
//!   dispatches the next ones, and when nothing is left emits exactly one
//!   `loop.done` (deterministic id) — plus `step.failed` for a `fail_fast`
//!   loop with failures, or a loop whose reducers or collection failed.
//!   State is O(in-flight), not O(items).
//!
//! State is always written before the messages it implies are published;
//! a redelivered message whose state change is already stored publishes
//! them again (deterministic ids: JetStream drops what already went out),
//! so a crash or a failed publish in between never stalls a loop.

use std::sync::Arc;

use async_nats::jetstream::Message;
use noetl_core::{
    reduce::{self, ReducerOp},
    template::Scope,
    FailureMode, LoopMode, Step,
};
use noetl_mesh::{
    codec,
    commands::{self, FirstTask},
    event_type::EventType,
    events::{now_ms, types, EventDraft},
    keys::Keys,
    kv::{self, key_part, Cas},
    payloads::{
        self, IterationEnded, IterationStarted, LoopCounts, LoopDone, LoopStarted, LoopStatus,
        Status, StepEnded,
    },
    plan::PlanRecord,
    runtime::{self, BoxFuture, ConsumerLoop, Disposition, Handler, ServiceParams},
    scope,
    state::{ctx_applied, mark_ctx_applied},
    subjects::Parsed,
    topology::{ConsumerSpec, StreamKind},
    Batch, Mesh, MeshError,
};
use noetl_wire::{Event, LoopCommand};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Default bound of a parallel loop without `max_in_flight`.
pub const DEFAULT_MAX_IN_FLIGHT: u64 = 16;

/// Largest `ctx` object (JSON bytes) reducers may leave behind: a KV value
/// must fit in one NATS message (1 MiB by default). A loop whose reducer
/// results would make `ctx` larger fails, naming the reducer and key.
pub const MAX_CTX_BYTES: usize = 1_000_000;

mod commit;
mod cursor;

/// Run the loop-supervisor until `params.shutdown` is cancelled, then drain.
pub async fn serve(params: ServiceParams) -> Result<(), MeshError> {
    let mesh = params.mesh.clone();
    let s = mesh.subjects().clone();
    let commands = mesh
        .consumer(&ConsumerSpec {
            durable: "loop-commands".into(),
            stream: StreamKind::Work,
            filter_subjects: vec![s.loops_all()],
            max_ack_pending: 10_000,
        })
        .await?;
    let iterations = mesh
        .consumer(&ConsumerSpec {
            durable: "loop-events".into(),
            stream: StreamKind::Events,
            filter_subjects: vec![
                s.events_of_type(types::LOOP_ITERATION_DONE),
                s.events_of_type(types::LOOP_ITERATION_FAILED),
                s.events_of_type(types::LOOP_CLAIMED),
            ],
            max_ack_pending: 10_000,
        })
        .await?;
    let handler = Arc::new(LoopHandler::new(mesh.clone()));
    let a = runtime::run(
        mesh.clone(),
        ConsumerLoop {
            name: "loop-commands".into(),
            consumer: commands,
            concurrency: params.concurrency,
            handler: handler.clone(),
            shutdown: params.shutdown.clone(),
        },
    );
    let b = runtime::run(
        mesh.clone(),
        ConsumerLoop {
            name: "loop-events".into(),
            consumer: iterations,
            concurrency: params.concurrency,
            handler,
            shutdown: params.shutdown.clone(),
        },
    );
    let (ra, rb) = tokio::join!(a, b);
    ra.and(rb)
}

/// The state of one loop run, in the loop bucket under `<eid>.<step_run_id>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoopRun {
    /// Step name.
    pub step: String,
    /// Number of elements.
    pub total: u64,
    /// Bound of iterations in flight.
    pub max_in_flight: u64,
    /// Next index to dispatch.
    pub next: u64,
    /// Indices dispatched and not yet finished.
    pub in_flight: Vec<u64>,
    /// Finished successfully.
    pub done: u64,
    /// Failed.
    pub failed: u64,
    /// No more dispatching (fail_fast after a failure).
    pub stopped: bool,
    /// Step args (token inscription), carried to every iteration.
    pub args: Value,
    /// Trace id.
    pub trace_id: String,
    /// `loop.done` was published (stragglers do not publish it again).
    #[serde(default)]
    pub done_emitted: bool,
    /// Aggregates of the `sum` / `min` / `max` reducers so far (ctx key ->
    /// value), folded exactly once per iteration in the same
    /// compare-and-set that counts it. `append` / `extend` / `merge`
    /// contributions grow with the loop: they stay in per-iteration records
    /// (`<run>.it.<index>`) and are assembled at the end.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub reduced: serde_json::Map<String, Value>,
    /// Why the loop step fails whatever its failure mode (`{kind,
    /// message}`): a reducer that could not fold, or a collection chunk
    /// that is gone. Set once; no iteration is dispatched after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// The step-run's deadline (epoch ms; 0: none) and the setting that set
    /// it, from the loop command: every iteration carries them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deadline_ms: u64,
    /// See `deadline_ms`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub deadline_of: String,
    /// A cursor loop's claims and claimed rows (`None` for a loop over
    /// `in`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<cursor::CursorRun>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The `timeout` error of a loop run that ends past its step-run's
/// deadline with failed iterations (the executor cut them at the
/// deadline): the step fails with it, whatever its failure mode. It is
/// stored in the run the first time, so a repeated finish says the same.
pub fn timed_out(run: &LoopRun, now_ms: u64) -> Option<Value> {
    if run.deadline_ms == 0 || run.failed == 0 || now_ms < run.deadline_ms {
        return None;
    }
    let d = noetl_core::lifecycle::Deadline {
        at_ms: run.deadline_ms,
        what: run.deadline_of.clone(),
    };
    let mut e = noetl_core::lifecycle::timeout_error(&d, &run.step, None);
    e.message = format!(
        "{} ({} of {} iterations done, {} failed)",
        e.message, run.done, run.total, run.failed
    );
    Some(e.to_value())
}

/// How one iteration counted, decided by its first report (in the loop
/// bucket under `<run>.it.<index>`, create-only), for loops with growing
/// reducers: the contributions are read back from here at the end.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claim {
    /// The iteration failed (it contributes nothing).
    failed: bool,
    /// Its reducer contributions (ctx key -> partial aggregate).
    #[serde(default)]
    reduce: serde_json::Map<String, Value>,
}

/// Reducers whose aggregate grows with the number of iterations.
fn grows(op: ReducerOp) -> bool {
    matches!(op, ReducerOp::Append | ReducerOp::Extend | ReducerOp::Merge)
}

impl LoopRun {
    fn finished(&self) -> bool {
        self.in_flight.is_empty()
            && (self.stopped || self.next >= self.total)
            && self
                .cursor
                .as_ref()
                .is_none_or(|c| c.claims.is_empty() && (self.stopped || c.drained))
    }

    fn counts(&self) -> LoopCounts {
        LoopCounts {
            total: self.total,
            done: self.done,
            failed: self.failed,
        }
    }
}

/// Elements per stored chunk of a loop collection: state stays small and a
/// dispatch reads one chunk, whatever the collection's size.
pub const CHUNK: usize = 1000;

/// A loop collection to store.
struct Collection<'a> {
    eid: &'a str,
    srid: &'a str,
    step: &'a str,
    items: &'a [Value],
    /// Chunks whose JSON is larger go to object storage; KV keeps the
    /// reference.
    limit: usize,
}

/// Store the collection in chunks of [`CHUNK`] elements: small chunks in
/// KV, large ones in object storage (KV holds their reference).
async fn store_items(mesh: &Mesh, c: Collection<'_>) -> Result<(), MeshError> {
    let mut batch = Vec::new();
    for (n, chunk) in c.items.chunks(CHUNK).enumerate() {
        let value = Value::Array(chunk.to_vec());
        let id = format!("{}.items.{n}", key_part(c.srid));
        let value = mesh
            .results()
            .offload(
                noetl_mesh::objects::PutParams {
                    execution_id: c.eid,
                    step: c.step,
                    id: &id,
                    value: &value,
                },
                c.limit,
            )
            .await?;
        batch.push((Keys::items(c.eid, c.srid, n), value));
    }
    let puts = batch.iter().map(|(k, v)| kv::put(mesh.loop_kv(), k, v));
    for r in futures::future::join_all(puts).await {
        r?;
    }
    Ok(())
}

/// A small cache of collection chunks (a loop dispatches from the same chunk
/// CHUNK times in a row). One per handler, so per mesh; keyed by bucket and
/// key all the same.
struct ChunkCache {
    inner: noetl_mesh::cache::Bounded<String, Arc<Vec<Value>>>,
}

impl Default for ChunkCache {
    fn default() -> Self {
        Self {
            inner: noetl_mesh::cache::Bounded::new(64),
        }
    }
}

/// An element of a stored collection could not be read.
#[derive(Debug, thiserror::Error)]
enum ItemError {
    /// Transient: retry the message.
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// The chunk is gone or corrupt: the loop cannot go on.
    #[error("{0}")]
    Gone(String),
}

impl ChunkCache {
    async fn item(
        &self,
        mesh: &Mesh,
        eid: &str,
        srid: &str,
        index: u64,
    ) -> Result<Value, ItemError> {
        let chunk = index as usize / CHUNK;
        let key = Keys::items(eid, srid, chunk);
        let cached = format!("{}/{key}", mesh.loop_kv().name);
        let hit = self.inner.get(&cached);
        let items = match hit {
            Some(v) => v,
            None => {
                let Some(stored) = kv::get::<Value>(mesh.loop_kv(), &key).await? else {
                    return Err(ItemError::Gone(format!(
                        "collection chunk {key} (items {}..) is missing from the loop bucket",
                        chunk * CHUNK
                    )));
                };
                let reference = noetl_mesh::objects::Reference::of(&stored).map(|r| r.reference);
                let named = || match &reference {
                    Some(r) => format!("collection chunk {key} ({r})"),
                    None => format!("collection chunk {key}"),
                };
                let v: Vec<Value> = match mesh.results().hydrate(stored).await {
                    Ok(Value::Array(a)) => a,
                    Ok(other) => {
                        return Err(ItemError::Gone(format!(
                            "{} holds {}, not a list",
                            named(),
                            codec::json_type(&other)
                        )))
                    }
                    Err(e) if e.is_permanent() => {
                        return Err(ItemError::Gone(format!("{}: {e}", named())))
                    }
                    Err(e) => return Err(MeshError::from(e).into()),
                };
                let v = Arc::new(v);
                self.inner.insert(cached, v.clone());
                v
            }
        };
        items.get(index as usize % CHUNK).cloned().ok_or_else(|| {
            ItemError::Gone(format!(
                "collection chunk {key} has {} items, item {index} is not there",
                items.len()
            ))
        })
    }
}

/// Handles loop commands and iteration events.
pub struct LoopHandler {
    mesh: Mesh,
    local: Arc<Local>,
}

/// What the handlers of one mesh share in this process.
#[derive(Default)]
struct Local {
    /// Collection chunks read lately.
    chunks: ChunkCache,
    /// Iteration reports waiting for their loop run's write.
    counter: commit::Counter,
}

impl LoopHandler {
    /// A handler on `mesh`, with its own chunk cache and report counter.
    pub fn new(mesh: Mesh) -> Self {
        Self {
            mesh,
            local: Arc::default(),
        }
    }
}

/// Why a loop message was not handled.
use noetl_mesh::runtime::HandlerError;

impl Handler for LoopHandler {
    fn handle(&self, msg: Arc<Message>) -> BoxFuture<'static, Disposition> {
        let mesh = self.mesh.clone();
        let local = self.local.clone();
        Box::pin(async move {
            let is_event = matches!(
                mesh.subjects().parse(msg.subject.as_str()),
                Some(Parsed::Event { .. })
            );
            use tracing::Instrument;
            let result = if is_event {
                match runtime::decode_event(&msg) {
                    Ok(ev) => {
                        let span = tracing::debug_span!(
                            "iteration",
                            execution_id = %ev.execution_id,
                            step = %ev.step,
                            step_run_id = %ev.step_run_id,
                            trace_id = %ev.trace_id,
                        );
                        match EventType::of(&ev).and_then(report_of) {
                            Some(Report::Claimed) => {
                                cursor::on_claimed(&mesh, &local, ev).instrument(span).await
                            }
                            Some(Report::Iteration { failed }) => {
                                on_iteration(&mesh, &local, ev, failed)
                                    .instrument(span)
                                    .await
                            }
                            None => Err(HandlerError::Refused(format!(
                                "{} of execution {} is not an iteration report",
                                ev.event_type, ev.execution_id
                            ))),
                        }
                    }
                    Err(e) => Err(e),
                }
            } else {
                match runtime::decode::<LoopCommand>("loop command", &msg) {
                    Ok(cmd) => {
                        let span = tracing::debug_span!(
                            "loop_start",
                            execution_id = %cmd.execution_id,
                            step = %cmd.step,
                            step_run_id = %cmd.step_run_id,
                            trace_id = %cmd.trace_id,
                        );
                        on_start(&mesh, &local.chunks, cmd).instrument(span).await
                    }
                    Err(e) => Err(e),
                }
            };
            runtime::disposition(result)
        })
    }
}

async fn plan_and_step(
    mesh: &Mesh,
    eid: &str,
    step: &str,
) -> Result<(Arc<PlanRecord>, usize), HandlerError> {
    let plan = mesh.plans().get(mesh, eid).await.map_err(|e| match e {
        MeshError::NoPlan { .. } => {
            HandlerError::Refused(format!("loop message for unknown execution {eid}"))
        }
        e => HandlerError::Mesh(e),
    })?;
    let idx = plan
        .playbook
        .workflow
        .iter()
        .position(|s| s.step == step)
        .ok_or_else(|| HandlerError::Refused(format!("execution {eid} has no step {step:?}")))?;
    Ok((plan, idx))
}

// Over 80 lines on purpose: read, decide, write for a loop command; its decisions (collection,
// max_in_flight, new_run) are functions with tests.
async fn on_start(mesh: &Mesh, chunks: &ChunkCache, cmd: LoopCommand) -> Result<(), HandlerError> {
    let eid = cmd.execution_id.as_str();
    let srid = cmd.step_run_id.as_str();
    let (plan, idx) = plan_and_step(mesh, eid, &cmd.step).await?;
    let step = &plan.playbook.workflow[idx];
    let Some(lp) = step.loop_.as_ref() else {
        return Err(HandlerError::Refused(format!(
            "step {:?} of execution {eid} has no loop",
            step.step
        )));
    };
    let window = Window {
        mesh,
        chunks,
        plan: &plan,
        step,
        srid,
    };
    let skey = Keys::loop_run(eid, srid);
    if let Some(run) = kv::get::<LoopRun>(mesh.loop_kv(), &skey).await? {
        // Redelivered start: the run was created, but what followed may not
        // have gone out (a crash, a failed publish): send it again.
        return resume(&window, run).await;
    }
    if lp.cursor.is_some() {
        return cursor::start(&window, &cmd, lp).await;
    }
    let args = codec::args(&cmd.args_json).map_err(|e| {
        HandlerError::Refused(format!(
            "loop command of execution {eid} step {:?}: {e}",
            cmd.step
        ))
    })?;

    let sc = loop_scope(mesh, &plan, lp, &args).await?;
    // `loop.in` may give a result reference: its collection is read from
    // object storage.
    let rendered = match noetl_core::template::render_value(&lp.in_, &sc) {
        Ok(v) if noetl_mesh::objects::is_ref(&v) => match mesh.results().hydrate(v).await {
            Ok(v) => Ok(v),
            Err(e) => {
                return fail_loop(mesh, &cmd, format!("loop.in of step {:?}: {e}", step.step)).await
            }
        },
        other => other,
    };
    let items = match collection(rendered, &step.step, &plan.source_name) {
        Ok(items) => items,
        Err(message) => return fail_loop(mesh, &cmd, message).await,
    };
    let limits = noetl_core::limits::Limits::from_spec_limits(
        plan.playbook
            .executor
            .as_ref()
            .and_then(|e| e.spec.get("limits")),
    );
    let place = format!(
        "loop.in of step {:?} in {}, execution {eid}",
        step.step, plan.source_name
    );
    if let Err(e) = limits.check_loop_items(items.len(), &place) {
        return fail_loop(mesh, &cmd, e.to_string()).await;
    }
    let rendered_max = lp
        .spec
        .max_in_flight
        .as_ref()
        .map(|v| noetl_core::template::render_value(v, &sc));
    let max_in_flight = match max_in_flight(lp.spec.mode, rendered_max, &step.step) {
        Ok(n) => n,
        Err(message) => return fail_loop(mesh, &cmd, message).await,
    };
    if let Err(e) = reduce::declared(lp.spec.policy.as_ref()) {
        return fail_loop(
            mesh,
            &cmd,
            format!("loop.spec.policy.reducers of step {:?}: {e}", step.step),
        )
        .await;
    }
    let total = items.len() as u64;
    store_items(
        mesh,
        Collection {
            eid,
            srid,
            step: &step.step,
            items: &items,
            limit: plan.max_payload_bytes(mesh.config().inline_limit),
        },
    )
    .await?;
    drop(items);
    let run = new_run(&cmd, &step.step, total, max_in_flight, args);
    let run = if kv::create(mesh.loop_kv(), &skey, &run).await? {
        run
    } else {
        kv::get(mesh.loop_kv(), &skey).await?.unwrap_or(run)
    };
    resume(&window, run).await
}

/// The scope `loop.in` and `max_in_flight` render in: workload, `ctx`, the
/// step's args, the step results they read, and in a child playbook the
/// parent's iteration as `iter.parent`.
async fn loop_scope(
    mesh: &Mesh,
    plan: &PlanRecord,
    lp: &noetl_core::Loop,
    args: &Value,
) -> Result<Scope, MeshError> {
    let mut all = scope::strings(&lp.in_);
    if let Some(m) = &lp.spec.max_in_flight {
        all.extend(scope::strings(m));
    }
    let frame = cursor::frame_templates(lp);
    all.extend(frame.iter().map(String::as_str));
    let mut sc = plan.template_scope(mesh, all, args).await?;
    if !plan.parent_iter.is_null() {
        sc = sc.iter(json!({"parent": plan.parent_iter}));
    }
    Ok(sc)
}

/// The loop's collection from its rendered `loop.in`, or why the loop
/// fails (not a list; the template failed).
fn collection<E: std::fmt::Display>(
    rendered: Result<Value, E>,
    step: &str,
    source: &str,
) -> Result<Vec<Value>, String> {
    match rendered {
        Ok(Value::Array(items)) => Ok(items),
        Ok(other) => Err(format!(
            "loop.in of step {step:?} must give a list, it gave {}",
            codec::json_type(&other)
        )),
        Err(e) => Err(format!("loop.in of step {step:?} failed in {source}: {e}")),
    }
}

/// Iterations in flight at most: 1 for a sequential loop; for a parallel
/// one its rendered `max_in_flight` (an integer >= 1, or such a string),
/// else [`DEFAULT_MAX_IN_FLIGHT`].
fn max_in_flight<E: std::fmt::Display>(
    mode: LoopMode,
    rendered: Option<Result<Value, E>>,
    step: &str,
) -> Result<u64, String> {
    match (mode, rendered) {
        (LoopMode::Sequential, _) => Ok(1),
        (LoopMode::Parallel, None) => Ok(DEFAULT_MAX_IN_FLIGHT),
        // NoETL's default: one claim worker.
        (LoopMode::Cursor, None) => Ok(1),
        (LoopMode::Parallel | LoopMode::Cursor, Some(Err(e))) => {
            Err(format!("loop.spec.max_in_flight of step {step:?}: {e}"))
        }
        (LoopMode::Parallel | LoopMode::Cursor, Some(Ok(v))) => {
            match v
                .as_u64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            {
                Some(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "loop.spec.max_in_flight of step {step:?} must be an integer >= 1, got {v}"
                )),
            }
        }
    }
}

/// A new loop run of `total` items with its first window in flight.
fn new_run(cmd: &LoopCommand, step: &str, total: u64, max_in_flight: u64, args: Value) -> LoopRun {
    let first = total.min(max_in_flight);
    LoopRun {
        step: step.to_string(),
        total,
        max_in_flight,
        next: first,
        in_flight: (0..first).collect(),
        done: 0,
        failed: 0,
        stopped: false,
        args,
        trace_id: cmd.trace_id.clone(),
        done_emitted: false,
        reduced: Default::default(),
        error: None,
        deadline_ms: cmd.deadline_ms,
        deadline_of: cmd.deadline_of.clone(),
        cursor: None,
    }
}

/// Publish everything a stored loop run implies (idempotent: every id is
/// deterministic): `loop.started`, the in-flight window, and `loop.done`
/// once it is finished. Used by a first start and by every redelivery.
async fn resume(w: &Window<'_>, run: LoopRun) -> Result<(), HandlerError> {
    let Window {
        mesh,
        plan,
        step,
        srid,
        ..
    } = *w;
    if run.done_emitted {
        return Ok(());
    }
    let mode = step.loop_.as_ref().map(|l| l.spec.mode);
    let started = EventDraft {
        event_type: types::LOOP_STARTED,
        execution_id: &plan.execution_id,
        step_run_id: srid,
        step: &step.step,
        trace_id: &run.trace_id,
        payload: payloads::to_value(&LoopStarted {
            total: run.total,
            max_in_flight: run.max_in_flight,
            mode,
        }),
        ..Default::default()
    }
    .build();
    mesh.emit(&started).await?.wait().await?;
    let run = redispatch(w, run).await?;
    if run.finished() && !run.done_emitted {
        return finish(mesh, plan, step, srid, &run).await;
    }
    Ok(())
}

/// Publish the task commands of every in-flight iteration (idempotent);
/// returns the run as now stored.
async fn redispatch(w: &Window<'_>, run: LoopRun) -> Result<LoopRun, HandlerError> {
    let indices = run.in_flight.clone();
    let run = dispatch(w, run, &indices).await?;
    cursor::republish(w, &run).await?;
    Ok(run)
}

/// The loop run whose iterations [`dispatch`] publishes.
#[derive(Clone, Copy)]
struct Window<'a> {
    mesh: &'a Mesh,
    chunks: &'a ChunkCache,
    plan: &'a PlanRecord,
    step: &'a Step,
    /// The loop run (its step-run) id.
    srid: &'a str,
}

// Over 80 lines on purpose: publishes a window of iterations; its decision for unreadable
// items is `items_gone`, tested.
/// Publish the iterations `indices` of `run` (idempotent); returns the run
/// as now stored. An iteration whose element cannot be read (its chunk is
/// gone) is counted as failed and fails the loop step, naming the chunk.
async fn dispatch(w: &Window<'_>, run: LoopRun, indices: &[u64]) -> Result<LoopRun, HandlerError> {
    let Window {
        mesh,
        chunks,
        plan,
        step,
        srid,
    } = *w;
    let eid = plan.execution_id.as_str();
    // A cancelled execution starts no more iterations.
    if indices.is_empty() || mesh.cancellations().is_stopped(eid) {
        return Ok(run);
    }
    let lp = step.loop_.as_ref().expect("loop step");
    let mut batch = Batch::new();
    let mut gone: Vec<(u64, String)> = Vec::new();
    for &i in indices {
        let item = match &run.cursor {
            Some(c) => cursor::item(mesh, chunks, eid, srid, c, i).await,
            None => chunks.item(mesh, eid, srid, i).await,
        };
        let item = match item {
            Ok(item) => item,
            Err(ItemError::Mesh(e)) => return Err(e.into()),
            Err(ItemError::Gone(why)) => {
                gone.push((i, why));
                continue;
            }
        };
        let iter = json!({ lp.iterator.clone(): item, "index": i });
        let event = |event_type, payload| IterationEvent {
            event_type,
            plan,
            step: &step.step,
            srid,
            trace_id: &run.trace_id,
            index: i,
            payload,
        };
        let started = IterationStarted {
            loop_run_id: srid.to_string(),
            index: i,
        };
        let started = event(types::LOOP_ITERATION_STARTED, payloads::to_value(&started));
        batch.push(mesh.emit(&started.build()).await?);
        mesh.health().metrics().iteration("started");
        let Some(first) = step.tool.first() else {
            // A loop without tasks: every iteration is done at once.
            let done = IterationEnded {
                loop_run_id: srid.to_string(),
                index: i,
                status: Status::Ok,
                result: Value::Null,
                iter: Value::Null,
                reduce: Default::default(),
                error: Value::Null,
            };
            let done = event(types::LOOP_ITERATION_DONE, payloads::to_value(&done));
            batch.push(mesh.emit(&done.build()).await?);
            continue;
        };
        let cmd = commands::first_task(FirstTask {
            execution_id: eid,
            step: &step.step,
            step_run_id: srid,
            args: &run.args,
            trace_id: &run.trace_id,
            deadline: (run.deadline_ms, &run.deadline_of),
            iteration: Some((i, &iter)),
            total: run.total,
        });
        batch.push(mesh.publish_task(plan, first, &cmd).await?);
    }
    batch.wait().await?;
    if gone.is_empty() {
        return Ok(run);
    }
    let message = format!(
        "loop.in of step {:?}: item {} cannot be read: {}",
        step.step, gone[0].0, gone[0].1
    );
    tracing::warn!(execution_id = %eid, step = %step.step, %message, "loop collection unavailable");
    let error = payloads::error_body("loop.items", message);
    let gone: Vec<u64> = gone.into_iter().map(|(i, _)| i).collect();
    let stored = kv::update(
        mesh.loop_kv(),
        &Keys::loop_run(eid, srid),
        |r: Option<&LoopRun>| match r.and_then(|r| items_gone(r, &gone, &error)) {
            Some(next) => Cas::Write(next),
            None => Cas::Keep,
        },
    )
    .await?;
    Ok(stored.unwrap_or(run))
}

/// Iterations whose items cannot be read (`gone`) fail the loop run: they
/// leave `in_flight` counted as failed, the run stops dispatching and
/// keeps the first `error`. `None` when that is already recorded.
pub fn items_gone(run: &LoopRun, gone: &[u64], error: &Value) -> Option<LoopRun> {
    let mut r = run.clone();
    let before = r.in_flight.len();
    r.in_flight.retain(|i| !gone.contains(i));
    if r.in_flight.len() == before && r.error.is_some() {
        return None;
    }
    r.failed += (before - r.in_flight.len()) as u64;
    r.stopped = true;
    r.error.get_or_insert_with(|| error.clone());
    Some(r)
}

/// A `loop.iteration.*` event the loop-supervisor writes itself.
struct IterationEvent<'a> {
    event_type: &'static str,
    plan: &'a PlanRecord,
    step: &'a str,
    srid: &'a str,
    trace_id: &'a str,
    index: u64,
    payload: Value,
}

impl IterationEvent<'_> {
    fn build(self) -> Event {
        let idx = self.index.to_string();
        EventDraft {
            event_type: self.event_type,
            execution_id: &self.plan.execution_id,
            step_run_id: self.srid,
            step: self.step,
            trace_id: self.trace_id,
            discriminator: &idx,
            payload: self.payload,
            ..Default::default()
        }
        .build()
    }
}

// Over 80 lines on purpose: read, decide, write for one iteration report; the decisions
// (count_iteration, fold) are functions with tests.
/// What the loop-supervisor hears from the executors about a loop run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    /// An iteration ended (`loop.iteration.done` / `.failed`).
    Iteration {
        /// It failed.
        failed: bool,
    },
    /// A cursor loop's claim ran (`loop.claimed`).
    Claimed,
}

/// The report an event of type `kind` is, if any (every type named: a new
/// one does not compile until it is placed).
fn report_of(kind: EventType) -> Option<Report> {
    use EventType as T;
    match kind {
        T::LoopIterationDone => Some(Report::Iteration { failed: false }),
        T::LoopIterationFailed => Some(Report::Iteration { failed: true }),
        T::LoopClaimed => Some(Report::Claimed),
        T::MessageDeadLettered
        | T::PlaybookInitialized
        | T::WorkflowInitialized
        | T::TokenCreated
        | T::StepScheduled
        | T::StepStarted
        | T::StepSkipped
        | T::TaskStarted
        | T::TaskDone
        | T::StepDone
        | T::StepFailed
        | T::NextSelected
        | T::LoopStarted
        | T::LoopIterationStarted
        | T::LoopDone
        | T::ExecutionCompleted
        | T::ExecutionFailed
        | T::ExecutionCancelRequested
        | T::ExecutionCancelled
        | T::ExecutionDeadline
        | T::StepDeadline
        | T::TaskUnserved => None,
    }
}

async fn on_iteration(
    mesh: &Mesh,
    local: &Local,
    ev: Event,
    failed: bool,
) -> Result<(), HandlerError> {
    let report: IterationEnded = payloads::decode_typed(&ev)?;
    let eid = ev.execution_id.as_str();
    let srid = ev.step_run_id.as_str();
    let index = report.index;
    let (plan, idx) = plan_and_step(mesh, eid, &ev.step).await?;
    let step = &plan.playbook.workflow[idx];
    let fail_fast = step.failure_mode() == FailureMode::FailFast;
    // Checked when the loop started (it fails there).
    let reducers = step
        .loop_
        .as_ref()
        .and_then(|l| reduce::declared(l.spec.policy.as_ref()).ok())
        .unwrap_or_default();
    let contributions = if failed {
        serde_json::Map::new()
    } else {
        report.reduce
    };
    let skey = Keys::loop_run(eid, srid);
    let mut claim = Claim {
        failed,
        reduce: contributions,
    };
    // Only loops with growing reducers look before the update (the update
    // reads the run itself: the common path reads it once).
    if reducers.iter().any(|(_, op)| grows(*op)) {
        let Some(current) = kv::get::<LoopRun>(mesh.loop_kv(), &skey).await? else {
            return Err(HandlerError::Refused(format!(
                "{} for unknown loop run {srid} of execution {eid}",
                ev.event_type
            )));
        };
        if current.in_flight.contains(&index) {
            // The first report of an index decides how it counts and what
            // it contributes; the contributions are read back at the end.
            let ckey = Keys::claim(eid, srid, index);
            if !kv::create(mesh.loop_kv(), &ckey, &claim).await? {
                if let Some(first) = kv::get::<Claim>(mesh.loop_kv(), &ckey).await? {
                    claim = first;
                }
            }
        }
    }
    // Counted in one write with the other reports of this run handled
    // now (unknown run: `None`; counted already, a redelivery: `counted`
    // is false).
    let shared = commit::Run {
        key: &skey,
        fail_fast,
        reducers: &reducers,
        step: &step.step,
    };
    let Some(Counted {
        run,
        counted,
        newly,
        claims,
    }) = local.counter.count(mesh, &shared, index, &claim).await?
    else {
        return Err(HandlerError::Refused(format!(
            "{} for unknown loop run {srid} of execution {eid}",
            ev.event_type
        )));
    };
    if counted {
        let event = if failed { "failed" } else { "done" };
        mesh.health().metrics().iteration(event);
    }
    let window = Window {
        mesh,
        chunks: &local.chunks,
        plan: &plan,
        step,
        srid,
    };
    let run = if counted {
        let run = dispatch(&window, run, &newly).await?;
        cursor::publish_claims(&window, &run, &claims).await?;
        run
    } else {
        // Already counted: the write that counted it may have been followed
        // by a crash or a failed publish before its iterations went out.
        // Send the whole window again (deterministic ids: JetStream drops
        // the commands that did go out).
        redispatch(&window, run).await?
    };
    if run.finished() && !run.done_emitted {
        finish(mesh, &plan, step, srid, &run).await?;
    }
    Ok(())
}

/// One iteration's report, as [`count_iteration`] needs it.
struct Arrival<'a> {
    /// The iteration's index.
    index: u64,
    /// How it counts (the first report of the index decides).
    claim: &'a Claim,
    /// `fail_fast`: a failure stops dispatching.
    fail_fast: bool,
    /// The loop's reducers (ctx key, operation).
    reducers: &'a [(String, ReducerOp)],
    /// Step name, for a reducer's error.
    step: &'a str,
}

/// The loop run after iteration `a.index` is counted, and the indices the
/// window now dispatches; `None` when that index is not in flight (counted
/// already: a redelivered report changes nothing). A failure stops
/// dispatching under `fail_fast`; `sum`/`min`/`max` contributions are
/// folded here, growing ones are left in the claim; a reducer that cannot
/// fold records the step's error and stops the loop. The window refills up
/// to `max_in_flight` while not stopped.
fn count_iteration(run: &LoopRun, a: &Arrival<'_>) -> Option<(LoopRun, Vec<u64>)> {
    if !run.in_flight.contains(&a.index) {
        return None;
    }
    let mut r = run.clone();
    r.in_flight.retain(|i| *i != a.index);
    if a.claim.failed {
        r.failed += 1;
        r.stopped |= a.fail_fast;
    } else {
        r.done += 1;
        if r.error.is_none() {
            fold(&mut r, a);
        }
    }
    let mut newly = Vec::new();
    while !r.stopped && r.next < r.total && (r.in_flight.len() as u64) < r.max_in_flight {
        r.in_flight.push(r.next);
        newly.push(r.next);
        r.next += 1;
    }
    cursor::after_count(&mut r);
    Some((r, newly))
}

/// What counting one report did, seen by its handler.
#[derive(Debug, Clone)]
struct Counted {
    /// The run as stored after this report was applied.
    run: LoopRun,
    /// The report counted its index (false: counted already).
    counted: bool,
    /// The indices its count dispatched.
    newly: Vec<u64>,
    /// The claims its count issued (cursor loops).
    claims: Vec<u64>,
}

/// [`count_iteration`] for several reports of one run, in their order:
/// for each, the run right after it (what its handler would have seen had
/// it written alone) and what it did; `Some` of the final run when any
/// counted (that is the one write).
fn count_batch(run: &LoopRun, arrivals: &[Arrival<'_>]) -> (Option<LoopRun>, Vec<Counted>) {
    let mut cur = run.clone();
    let mut changed = false;
    let mut out = Vec::with_capacity(arrivals.len());
    for a in arrivals {
        match count_iteration(&cur, a) {
            Some((next, newly)) => {
                let claims = cursor::issued(&cur, &next);
                cur = next;
                changed = true;
                out.push(Counted {
                    run: cur.clone(),
                    counted: true,
                    newly,
                    claims,
                });
            }
            None => out.push(Counted {
                run: cur.clone(),
                counted: false,
                newly: Vec::new(),
                claims: Vec::new(),
            }),
        }
    }
    (changed.then_some(cur), out)
}

/// Fold a successful iteration's non-growing reducer contributions into
/// the run's aggregates.
fn fold(r: &mut LoopRun, a: &Arrival<'_>) {
    for (k, part) in &a.claim.reduce {
        let Some((_, op)) = a.reducers.iter().find(|(name, _)| name == k) else {
            continue;
        };
        if grows(*op) {
            continue; // kept in the claim, assembled at the end
        }
        match reduce::combine(*op, k, r.reduced.get(k), part) {
            Ok(v) => {
                r.reduced.insert(k.clone(), v);
            }
            Err(e) => {
                r.error = Some(reducer_error(a.step, &e.to_string()));
                r.stopped = true;
                return;
            }
        }
    }
}

/// The error of a loop step whose reducer failed.
fn reducer_error(step: &str, why: &str) -> Value {
    payloads::error_body("reducer", format!("loop step {step:?}: {why}"))
}

/// Every iteration claim of a loop run, by index.
async fn read_claims(mesh: &Mesh, eid: &str, srid: &str) -> Result<Vec<(u64, Claim)>, MeshError> {
    let claims = Keys::claims(eid, srid);
    let found =
        noetl_mesh::kv::values_matching::<Claim>(mesh.loop_kv(), &format!("{claims}.>")).await?;
    let mut out = Vec::with_capacity(found.len());
    for (key, claim) in found {
        // A claim that does not decode is corrupt (dead-lettered naming its
        // key), not a KV outage to retry.
        let claim = claim?;
        if let Some(index) = Keys::claim_index(&claims, &key) {
            out.push((index, claim));
        }
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out)
}

/// Fold the loop run's reducer aggregates into `ctx`, once: the loop run
/// is recorded as applied in the same compare-and-set, so a repeated
/// `finish` changes nothing, and the aggregate lands on the key's current
/// value (a concurrent write to the key is never lost). Returns the error
/// that fails the step, if a reducer cannot fold or `ctx` would grow past
/// [`MAX_CTX_BYTES`].
async fn apply_reducers(
    mesh: &Mesh,
    eid: &str,
    step: &Step,
    srid: &str,
    run: &LoopRun,
) -> Result<Option<Value>, HandlerError> {
    let reducers = step
        .loop_
        .as_ref()
        .and_then(|l| reduce::declared(l.spec.policy.as_ref()).ok())
        .unwrap_or_default();
    let mut aggregates: Vec<(String, ReducerOp, Value)> = Vec::new();
    for (k, op) in reducers.iter().filter(|(_, op)| !grows(*op)) {
        if let Some(v) = run.reduced.get(k) {
            aggregates.push((k.clone(), *op, v.clone()));
        }
    }
    if run.done > 0 && reducers.iter().any(|(_, op)| grows(*op)) {
        let claims = read_claims(mesh, eid, srid).await?;
        for (k, op) in reducers.iter().filter(|(_, op)| grows(*op)) {
            let mut acc: Option<Value> = None;
            for (_, c) in claims.iter().filter(|(_, c)| !c.failed) {
                if let Some(part) = c.reduce.get(k) {
                    match reduce::combine(*op, k, acc.as_ref(), part) {
                        Ok(v) => acc = Some(v),
                        Err(e) => return Ok(Some(reducer_error(&step.step, &e.to_string()))),
                    }
                }
            }
            if let Some(acc) = acc {
                aggregates.push((k.clone(), *op, acc));
            }
        }
    }
    if aggregates.is_empty() {
        return Ok(None);
    }
    let marker = format!("loop:{srid}");
    let mut failure: Option<String> = None;
    kv::update(mesh.ctx_kv(), eid, |cur: Option<&Value>| {
        failure = None;
        let mut obj = match cur {
            Some(Value::Object(m)) => m.clone(),
            _ => serde_json::Map::new(),
        };
        if ctx_applied(&obj, &marker) {
            return Cas::Keep; // applied before (a repeated finish)
        }
        for (k, op, acc) in &aggregates {
            match reduce::combine(*op, k, obj.get(k), acc) {
                Ok(v) => {
                    obj.insert(k.clone(), v);
                }
                Err(e) => {
                    failure = Some(e.to_string());
                    return Cas::Keep;
                }
            }
        }
        mark_ctx_applied(&mut obj, &marker);
        let size = serde_json::to_vec(&obj).map(|b| b.len()).unwrap_or(0);
        if size > MAX_CTX_BYTES {
            let (k, op, bytes) = aggregates
                .iter()
                .map(|(k, op, _)| (k, op, serde_json::to_vec(&obj[k]).map(|b| b.len()).unwrap_or(0)))
                .max_by_key(|(_, _, n)| *n)
                .expect("aggregates is not empty");
            failure = Some(format!(
                "reducer `{}` of ctx key `{k}` gives {bytes} bytes, and ctx would be {size} bytes, above the limit of {MAX_CTX_BYTES} (keep large aggregates in step results or storage)",
                op.name()
            ));
            return Cas::Keep;
        }
        Cas::Write(Value::Object(obj))
    })
    .await?;
    Ok(failure.map(|why| reducer_error(&step.step, &why)))
}

/// How a finished loop ended, and the error that fails its step (then its
/// `loop.done` is not the boundary; the `step.failed` is): a recorded
/// error (reducer, collection, deadline) whatever the failure mode, or a
/// failed iteration under `fail_fast`. Otherwise `ok`, or `partial` when
/// some iterations failed under `best_effort`.
fn loop_end(run: &LoopRun, fail_fast: bool) -> (LoopStatus, Option<Value>) {
    if let Some(e) = &run.error {
        return (LoopStatus::Failed, Some(e.clone()));
    }
    match (run.failed, fail_fast) {
        (0, _) => (LoopStatus::Ok, None),
        (_, true) => (
            LoopStatus::Failed,
            Some(payloads::error_body(
                "loop.failed",
                format!(
                    "{} of {} iterations failed (fail_fast)",
                    run.failed, run.total
                ),
            )),
        ),
        (_, false) => (LoopStatus::Partial, None),
    }
}

/// Emit the loop's terminal events (deterministic ids: exactly one each).
async fn finish(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    srid: &str,
    run: &LoopRun,
) -> Result<(), HandlerError> {
    let eid = plan.execution_id.as_str();
    let skey = Keys::loop_run(eid, srid);
    let mut run = run.clone();
    if run.error.is_none() {
        run.error = final_error(mesh, plan, step, srid, &run).await?;
    }
    let (status, failure) = loop_end(&run, step.failure_mode() == FailureMode::FailFast);
    let loop_failed = failure.is_some();
    kv::put(
        mesh.exec_kv(),
        &Keys::result(eid, &step.step),
        &run.counts(),
    )
    .await?;
    let mut batch = Batch::new();
    batch.push(
        mesh.emit(
            &EventDraft {
                event_type: types::LOOP_DONE,
                execution_id: eid,
                step_run_id: srid,
                step: &step.step,
                trace_id: &run.trace_id,
                payload: payloads::to_value(&LoopDone {
                    boundary: !loop_failed,
                    status,
                    counts: run.counts(),
                    result: run.counts(),
                    args: run.args.clone(),
                    error: run.error.clone(),
                }),
                ..Default::default()
            }
            .build(),
        )
        .await?,
    );
    if let Some(error) = failure {
        batch.push(
            mesh.emit(
                &EventDraft {
                    event_type: types::STEP_FAILED,
                    execution_id: eid,
                    step_run_id: srid,
                    step: &step.step,
                    trace_id: &run.trace_id,
                    payload: payloads::to_value(&StepEnded {
                        counts: Some(run.counts()),
                        ..StepEnded::failed(error, run.args.clone())
                    }),
                    ..Default::default()
                }
                .build(),
            )
            .await?,
        );
    }
    batch.wait().await?;
    kv::update(mesh.loop_kv(), &skey, |r: Option<&LoopRun>| match r {
        Some(r) if !r.done_emitted => {
            let mut r = r.clone();
            r.done_emitted = true;
            Cas::Write(r)
        }
        _ => Cas::Keep,
    })
    .await?;
    prune(mesh, eid, step, srid).await?;
    Ok(())
}

/// The error a loop ends with when it has none recorded yet: a reducer
/// that cannot fold into `ctx`, or the step-run's deadline. Recorded in
/// the run the first time, so a repeated finish reports the same.
async fn final_error(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    srid: &str,
    run: &LoopRun,
) -> Result<Option<Value>, HandlerError> {
    let eid = plan.execution_id.as_str();
    let error = match apply_reducers(mesh, eid, step, srid, run).await? {
        Some(e) => Some(e),
        None => timed_out(run, now_ms()),
    };
    let Some(error) = error else {
        return Ok(None);
    };
    // The first recorded error stands (a repeated finish reports it).
    let stored = kv::update(
        mesh.loop_kv(),
        &Keys::loop_run(eid, srid),
        |r: Option<&LoopRun>| match r {
            Some(r) if r.error.is_none() => {
                let mut r = r.clone();
                r.error = Some(error.clone());
                Cas::Write(r)
            }
            _ => Cas::Keep,
        },
    )
    .await?;
    Ok(stored.and_then(|r| r.error).or(Some(error)))
}

/// Drop what a finished loop needs no more, so state does not grow with
/// every loop run: the collection chunks, the iterations' checkpoints and
/// claims, and the write-once ctx claims. The run record itself stays (it
/// makes a redelivered report a no-op).
async fn prune(mesh: &Mesh, eid: &str, step: &Step, srid: &str) -> Result<(), MeshError> {
    let purged = kv::purge_under(mesh.loop_kv(), &Keys::loop_run(eid, srid)).await?;
    let owners = Keys::owners(eid, srid);
    if kv::get::<Value>(mesh.ctx_kv(), &owners).await?.is_some() {
        mesh.ctx_kv()
            .purge(&owners)
            .await
            .map_err(|e| MeshError::Kv {
                bucket: mesh.ctx_kv().name.clone(),
                key: owners.clone(),
                message: e.to_string(),
            })?;
    }
    tracing::debug!(execution_id = %eid, step = %step.step, purged, "loop state pruned");
    Ok(())
}

/// The loop could not even start: fail the step-run.
async fn fail_loop(mesh: &Mesh, cmd: &LoopCommand, message: String) -> Result<(), HandlerError> {
    tracing::warn!(execution_id = %cmd.execution_id, step = %cmd.step, %message, "loop failed to start");
    // Only reached after the start decoded them (`on_start` refuses bad ones).
    let args = codec::args(&cmd.args_json).unwrap_or_default();
    let ev = EventDraft {
        event_type: types::STEP_FAILED,
        execution_id: &cmd.execution_id,
        step_run_id: &cmd.step_run_id,
        step: &cmd.step,
        trace_id: &cmd.trace_id,
        payload: payloads::to_value(&StepEnded::failed(
            payloads::error_body("loop.in", message),
            args,
        )),
        ..Default::default()
    }
    .build();
    mesh.emit(&ev).await?.wait().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_reports_and_claims_are_told_apart_and_nothing_else_is_one() {
        assert_eq!(
            report_of(EventType::LoopIterationFailed),
            Some(Report::Iteration { failed: true })
        );
        assert_eq!(
            report_of(EventType::LoopIterationDone),
            Some(Report::Iteration { failed: false })
        );
        assert_eq!(report_of(EventType::LoopClaimed), Some(Report::Claimed));
        assert_eq!(report_of(EventType::StepDone), None);
    }

    fn run(failed: u64, deadline_ms: u64) -> LoopRun {
        LoopRun {
            step: "lp".into(),
            total: 4,
            max_in_flight: 4,
            next: 4,
            in_flight: vec![],
            done: 4 - failed,
            failed,
            stopped: false,
            args: json!({}),
            trace_id: String::new(),
            done_emitted: false,
            reduced: Default::default(),
            error: None,
            deadline_ms,
            deadline_of: "step \"lp\" lifecycle.timeout_s: 1".into(),
            cursor: None,
        }
    }

    /// A run of `total` items, `window` at a time, with `first` dispatched.
    fn window(total: u64, window: u64) -> LoopRun {
        let first: Vec<u64> = (0..total.min(window)).collect();
        LoopRun {
            total,
            max_in_flight: window,
            next: first.len() as u64,
            in_flight: first,
            done: 0,
            failed: 0,
            ..run(0, 0)
        }
    }

    fn ok(reduce: Value) -> Claim {
        Claim {
            failed: false,
            reduce: reduce.as_object().cloned().unwrap_or_default(),
        }
    }

    fn failed() -> Claim {
        Claim {
            failed: true,
            reduce: Default::default(),
        }
    }

    #[test]
    fn unreadable_items_fail_their_iterations_once() {
        let mut r = window(10, 4);
        r.in_flight = vec![4, 5, 6];
        let error = json!({"kind": "loop.items", "message": "gone"});
        let next = items_gone(&r, &[5, 6], &error).expect("recorded");
        assert_eq!(next.in_flight, vec![4]);
        assert_eq!(next.failed, 2);
        assert!(next.stopped);
        assert_eq!(next.error, Some(error.clone()));
        // The same report again changes nothing.
        assert!(items_gone(&next, &[5, 6], &error).is_none());
        // A later error keeps the first.
        let other = json!({"kind": "loop.items", "message": "other"});
        let again = items_gone(&next, &[4], &other).expect("recorded");
        assert_eq!(again.error, Some(error));
        assert_eq!(again.failed, 3);
    }

    fn arrive(
        r: &LoopRun,
        index: u64,
        claim: &Claim,
        fail_fast: bool,
    ) -> Option<(LoopRun, Vec<u64>)> {
        let reducers = vec![
            ("total".to_string(), ReducerOp::Sum),
            ("rows".to_string(), ReducerOp::Append),
        ];
        count_iteration(
            r,
            &Arrival {
                index,
                claim,
                fail_fast,
                reducers: &reducers,
                step: "lp",
            },
        )
    }

    #[test]
    fn a_batch_counts_as_its_reports_would_one_by_one() {
        let reducers = vec![("total".to_string(), ReducerOp::Sum)];
        let claims = [
            (0, ok(json!({"total": 2}))),
            (1, failed()),
            (0, ok(json!({"total": 9}))), // a redelivery of 0
            (2, ok(json!({"total": 5}))),
            (7, ok(json!({"total": 1}))), // not in flight
        ];
        let arrivals: Vec<Arrival<'_>> = claims
            .iter()
            .map(|(index, claim)| Arrival {
                index: *index,
                claim,
                fail_fast: false,
                reducers: &reducers,
                step: "lp",
            })
            .collect();
        let start = window(6, 3);
        let (last, each) = count_batch(&start, &arrivals);
        let mut cur = start.clone();
        for (a, c) in arrivals.iter().zip(&each) {
            match count_iteration(&cur, a) {
                Some((next, newly)) => {
                    assert!(c.counted, "index {} counts", a.index);
                    assert_eq!(c.newly, newly);
                    cur = next;
                }
                None => assert!(!c.counted && c.newly.is_empty(), "index {}", a.index),
            }
            assert_eq!(c.run.in_flight, cur.in_flight);
            assert_eq!((c.run.done, c.run.failed), (cur.done, cur.failed));
        }
        let last = last.expect("some counted: one write");
        assert_eq!((last.done, last.failed), (2, 1));
        assert_eq!(last.reduced.get("total"), Some(&json!(7)));
        assert_eq!(last.in_flight, vec![3, 4, 5]);
        // Only redeliveries: nothing to write.
        let again = [Arrival {
            index: 0,
            claim: &claims[0].1,
            fail_fast: false,
            reducers: &reducers,
            step: "lp",
        }];
        assert!(count_batch(&last, &again).0.is_none());
    }

    #[test]
    fn a_counted_iteration_frees_its_slot_for_the_next_index() {
        let r = window(5, 2);
        let (r, newly) = arrive(&r, 0, &ok(json!({})), false).unwrap();
        assert_eq!((r.done, r.failed), (1, 0));
        assert_eq!(newly, vec![2]);
        assert_eq!(r.in_flight, vec![1, 2]);
        assert_eq!(r.next, 3);
    }

    #[test]
    fn a_redelivered_report_counts_nothing() {
        let r = window(5, 2);
        let (r, _) = arrive(&r, 0, &ok(json!({})), false).unwrap();
        assert!(arrive(&r, 0, &ok(json!({})), false).is_none());
        // An index never dispatched is not counted either.
        assert!(arrive(&r, 4, &ok(json!({})), false).is_none());
    }

    #[test]
    fn the_window_never_exceeds_max_in_flight_and_the_loop_finishes() {
        let mut r = window(7, 3);
        let mut dispatched: Vec<u64> = r.in_flight.clone();
        while let Some(&i) = r.in_flight.first() {
            let (next, newly) = arrive(&r, i, &ok(json!({})), false).unwrap();
            assert!(next.in_flight.len() as u64 <= next.max_in_flight);
            dispatched.extend(newly);
            r = next;
        }
        assert_eq!(dispatched, (0..7).collect::<Vec<_>>());
        assert_eq!((r.done, r.next), (7, 7));
        assert!(r.finished());
    }

    #[test]
    fn a_failure_stops_dispatching_under_fail_fast_only() {
        let r = window(5, 2);
        let (stopped, newly) = arrive(&r, 0, &failed(), true).unwrap();
        assert!(stopped.stopped && newly.is_empty());
        assert_eq!((stopped.failed, stopped.in_flight.clone()), (1, vec![1]));
        // The one in flight still counts; then the loop is finished.
        let (end, newly) = arrive(&stopped, 1, &ok(json!({})), true).unwrap();
        assert!(newly.is_empty() && end.finished());
        assert_eq!((end.done, end.failed, end.next), (1, 1, 2));
        // best_effort goes on.
        let (on, newly) = arrive(&r, 0, &failed(), false).unwrap();
        assert!(!on.stopped);
        assert_eq!(newly, vec![2]);
    }

    #[test]
    fn sums_fold_once_per_iteration_and_growing_reducers_wait_for_the_end() {
        let r = window(3, 3);
        let (r, _) = arrive(&r, 0, &ok(json!({"total": 2, "rows": [1]})), false).unwrap();
        let (r, _) = arrive(&r, 2, &ok(json!({"total": 5, "rows": [3]})), false).unwrap();
        assert_eq!(r.reduced.get("total"), Some(&json!(7)));
        assert_eq!(r.reduced.get("rows"), None, "append stays in the claims");
        // A failed iteration contributes nothing.
        let (r, _) = arrive(&r, 1, &failed(), false).unwrap();
        assert_eq!(r.reduced.get("total"), Some(&json!(7)));
        // Undeclared keys are ignored.
        let r2 = window(1, 1);
        let (r2, _) = arrive(&r2, 0, &ok(json!({"other": 1})), false).unwrap();
        assert!(r2.reduced.is_empty());
    }

    #[test]
    fn a_reducer_that_cannot_fold_fails_the_loop_and_stops_it() {
        let r = window(4, 1);
        let (r, newly) = arrive(&r, 0, &ok(json!({"total": "three"})), false).unwrap();
        assert!(r.stopped && newly.is_empty());
        let e = r.error.clone().expect("reducer error");
        assert_eq!(e["kind"], "reducer");
        assert!(e["message"].as_str().unwrap().contains("\"lp\""), "{e}");
        assert!(r.finished(), "nothing in flight, stopped");
    }

    #[test]
    fn a_sequential_loop_runs_one_at_a_time_and_a_parallel_one_its_bound() {
        let ok = |v: Value| Some(Ok::<Value, String>(v));
        assert_eq!(
            max_in_flight(LoopMode::Sequential, ok(json!(8)), "lp"),
            Ok(1)
        );
        assert_eq!(
            max_in_flight::<String>(LoopMode::Parallel, None, "lp"),
            Ok(DEFAULT_MAX_IN_FLIGHT)
        );
        assert_eq!(max_in_flight(LoopMode::Parallel, ok(json!(8)), "lp"), Ok(8));
        assert_eq!(
            max_in_flight(LoopMode::Parallel, ok(json!(" 3 ")), "lp"),
            Ok(3)
        );
    }

    #[test]
    fn a_bad_max_in_flight_fails_the_loop_naming_the_step() {
        for bad in [json!(0), json!(-1), json!("many"), json!(1.5)] {
            let e = max_in_flight(
                LoopMode::Parallel,
                Some(Ok::<Value, String>(bad.clone())),
                "lp",
            )
            .unwrap_err();
            assert!(
                e.contains(r#"step "lp" must be an integer >= 1"#),
                "{bad}: {e}"
            );
        }
        let e = max_in_flight(LoopMode::Parallel, Some(Err("undefined `n`")), "lp").unwrap_err();
        assert_eq!(e, r#"loop.spec.max_in_flight of step "lp": undefined `n`"#);
    }

    #[test]
    fn loop_in_must_give_a_list() {
        assert_eq!(
            collection(Ok::<Value, String>(json!([1, 2])), "lp", "p.yaml"),
            Ok(vec![json!(1), json!(2)])
        );
        let e = collection(Ok::<Value, String>(json!({"a": 1})), "lp", "p.yaml").unwrap_err();
        assert!(e.contains("must give a list, it gave"), "{e}");
        let e = collection(Err::<Value, _>("boom"), "lp", "p.yaml").unwrap_err();
        assert_eq!(e, r#"loop.in of step "lp" failed in p.yaml: boom"#);
    }

    #[test]
    fn a_new_run_puts_its_first_window_in_flight() {
        let cmd = LoopCommand {
            trace_id: "t".into(),
            deadline_ms: 9,
            deadline_of: "d".into(),
            ..Default::default()
        };
        let r = new_run(&cmd, "lp", 5, 2, json!({"a": 1}));
        assert_eq!((r.next, r.in_flight.clone()), (2, vec![0, 1]));
        assert_eq!((r.deadline_ms, r.trace_id.as_str()), (9, "t"));
        let small = new_run(&cmd, "lp", 1, 16, json!({}));
        assert_eq!((small.next, small.in_flight), (1, vec![0]));
        let empty = new_run(&cmd, "lp", 0, 16, json!({}));
        assert!(empty.finished());
    }

    #[test]
    fn only_append_extend_and_merge_grow_with_the_loop() {
        use ReducerOp::*;
        for (op, grows_) in [
            (Append, true),
            (Extend, true),
            (Merge, true),
            (Sum, false),
            (Min, false),
            (Max, false),
        ] {
            assert_eq!(grows(op), grows_, "{op:?}");
        }
    }

    #[test]
    fn a_finished_loop_is_ok_partial_or_failed() {
        assert_eq!(loop_end(&run(0, 0), true), (LoopStatus::Ok, None));
        assert_eq!(loop_end(&run(1, 0), false), (LoopStatus::Partial, None));
        let (status, error) = loop_end(&run(1, 0), true);
        assert_eq!(status, LoopStatus::Failed);
        assert_eq!(
            error,
            Some(json!({"kind": "loop.failed", "message": "1 of 4 iterations failed (fail_fast)"}))
        );
    }

    #[test]
    fn a_recorded_error_fails_the_loop_whatever_its_failure_mode() {
        let mut r = run(0, 0);
        r.error = Some(json!({"kind": "reducer", "message": "bad"}));
        for fail_fast in [true, false] {
            assert_eq!(
                loop_end(&r, fail_fast),
                (LoopStatus::Failed, r.error.clone())
            );
        }
    }

    #[test]
    fn a_loop_is_finished_when_nothing_is_in_flight_and_nothing_is_left() {
        let mut r = window(3, 2);
        assert!(!r.finished());
        r.in_flight.clear();
        assert!(!r.finished(), "index 2 is still to dispatch");
        r.stopped = true;
        assert!(r.finished(), "stopped: nothing more is dispatched");
        assert!(run(0, 0).finished());
    }

    #[test]
    fn a_loop_past_its_deadline_with_failures_times_out() {
        let e = timed_out(&run(2, 1_000), 1_000).expect("timed out");
        assert_eq!(e["kind"], "timeout");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains("lifecycle.timeout_s: 1"), "{m}");
        assert!(m.contains("2 of 4 iterations done, 2 failed"), "{m}");
        // Before the deadline, without failures, or without a deadline: no.
        assert_eq!(timed_out(&run(2, 1_000), 999), None);
        assert_eq!(timed_out(&run(0, 1_000), 5_000), None);
        assert_eq!(timed_out(&run(2, 0), 5_000), None);
    }
}
