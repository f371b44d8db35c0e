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
//!   loop with failures. State is O(in-flight), not O(items).

use std::sync::Arc;

use async_nats::jetstream::Message;
use noetl_core::{template::Scope, FailureMode, LoopMode, Step};
use noetl_mesh::{
    codec,
    events::{self, types, EventDraft},
    ids::derive_id,
    kv::{self, key_part, Cas},
    plan::PlanRecord,
    runtime::{self, retry_on, BoxFuture, ConsumerLoop, Disposition, Handler, ServiceParams},
    scope,
    state::result_key,
    topology::{ConsumerSpec, StreamKind},
    Batch, Mesh, MeshError,
};
use noetl_wire::{Event, IterationRef, LoopCommand, TaskCommand};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Default bound of a parallel loop without `max_in_flight`.
pub const DEFAULT_MAX_IN_FLIGHT: u64 = 16;

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
            ],
            max_ack_pending: 10_000,
        })
        .await?;
    let handler = Arc::new(LoopHandler { mesh: mesh.clone() });
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
    /// Reducer aggregates so far (ctx key -> value), folded exactly once per
    /// iteration in the same compare-and-set that counts it.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub reduced: serde_json::Map<String, Value>,
    /// The reduced ctx keys' values when the loop started: the final value
    /// is `reduce(base, aggregate)`, so writing it twice is harmless.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub reduce_base: serde_json::Map<String, Value>,
}

impl LoopRun {
    fn finished(&self) -> bool {
        self.in_flight.is_empty() && (self.stopped || self.next >= self.total)
    }

    fn counts(&self) -> Value {
        json!({"total": self.total, "done": self.done, "failed": self.failed})
    }
}

fn state_key(eid: &str, srid: &str) -> String {
    format!("{eid}.{}", key_part(srid))
}

/// Elements per stored chunk of a loop collection: state stays small and a
/// dispatch reads one chunk, whatever the collection's size.
pub const CHUNK: usize = 1000;

fn items_key(eid: &str, srid: &str, chunk: usize) -> String {
    format!("{eid}.{}.items.{chunk}", key_part(srid))
}

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
        batch.push((items_key(c.eid, c.srid, n), value));
    }
    let puts = batch.iter().map(|(k, v)| kv::put(mesh.loop_kv(), k, v));
    for r in futures::future::join_all(puts).await {
        r?;
    }
    Ok(())
}

/// A small cache of collection chunks (a loop dispatches from the same chunk
/// CHUNK times in a row).
#[derive(Default)]
struct ChunkCache {
    inner: std::sync::Mutex<std::collections::VecDeque<(String, Arc<Vec<Value>>)>>,
}

impl ChunkCache {
    async fn item(
        &self,
        mesh: &Mesh,
        eid: &str,
        srid: &str,
        index: u64,
    ) -> Result<Value, MeshError> {
        let chunk = index as usize / CHUNK;
        let key = items_key(eid, srid, chunk);
        let hit = self
            .inner
            .lock()
            .expect("chunk cache lock")
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone());
        let items = match hit {
            Some(v) => v,
            None => {
                let stored = kv::get::<Value>(mesh.loop_kv(), &key).await?;
                let v: Vec<Value> = match stored {
                    Some(v) => match mesh.results().hydrate(v).await? {
                        Value::Array(a) => a,
                        _ => Vec::new(),
                    },
                    None => Vec::new(),
                };
                let v = Arc::new(v);
                let mut g = self.inner.lock().expect("chunk cache lock");
                g.push_back((key, v.clone()));
                while g.len() > 64 {
                    g.pop_front();
                }
                v
            }
        };
        Ok(items
            .get(index as usize % CHUNK)
            .cloned()
            .unwrap_or(Value::Null))
    }
}

fn chunks() -> &'static ChunkCache {
    static CACHE: std::sync::OnceLock<ChunkCache> = std::sync::OnceLock::new();
    CACHE.get_or_init(ChunkCache::default)
}

/// Handles loop commands and iteration events.
pub struct LoopHandler {
    /// The mesh.
    pub mesh: Mesh,
}

enum LoopError {
    Mesh(MeshError),
    Refused(String),
}

impl From<MeshError> for LoopError {
    fn from(e: MeshError) -> Self {
        LoopError::Mesh(e)
    }
}

impl Handler for LoopHandler {
    fn handle(&self, msg: Arc<Message>) -> BoxFuture<'static, Disposition> {
        let mesh = self.mesh.clone();
        Box::pin(async move {
            let is_event = msg.subject.as_str().contains(".evt.");
            let result = if is_event {
                match codec::decode::<Event>("event", &msg.payload) {
                    Ok(ev) => on_iteration(&mesh, ev).await,
                    Err(e) => Err(LoopError::Refused(format!("{e} (subject {})", msg.subject))),
                }
            } else {
                match codec::decode::<LoopCommand>("loop command", &msg.payload) {
                    Ok(cmd) => on_start(&mesh, cmd).await,
                    Err(e) => Err(LoopError::Refused(format!("{e} (subject {})", msg.subject))),
                }
            };
            match result {
                Ok(()) => Disposition::Ack,
                Err(LoopError::Mesh(e)) => retry_on(&e),
                Err(LoopError::Refused(r)) => Disposition::DeadLetter(r),
            }
        })
    }
}

async fn plan_and_step(
    mesh: &Mesh,
    eid: &str,
    step: &str,
) -> Result<(Arc<PlanRecord>, usize), LoopError> {
    let plan = mesh.plans().get(mesh, eid).await.map_err(|e| match e {
        MeshError::Kv { ref message, .. } if message.contains("no plan") => {
            LoopError::Refused(format!("loop message for unknown execution {eid}"))
        }
        e => LoopError::Mesh(e),
    })?;
    let idx = plan
        .playbook
        .workflow
        .iter()
        .position(|s| s.step == step)
        .ok_or_else(|| LoopError::Refused(format!("execution {eid} has no step {step:?}")))?;
    Ok((plan, idx))
}

async fn on_start(mesh: &Mesh, cmd: LoopCommand) -> Result<(), LoopError> {
    let eid = cmd.execution_id.as_str();
    let srid = cmd.step_run_id.as_str();
    let (plan, idx) = plan_and_step(mesh, eid, &cmd.step).await?;
    let step = &plan.playbook.workflow[idx];
    let Some(lp) = step.loop_.as_ref() else {
        return Err(LoopError::Refused(format!(
            "step {:?} of execution {eid} has no loop",
            step.step
        )));
    };
    let skey = state_key(eid, srid);
    if let Some(run) = kv::get::<LoopRun>(mesh.loop_kv(), &skey).await? {
        // Redelivered start: make sure the in-flight window went out.
        return redispatch(mesh, &plan, step, srid, &run).await;
    }
    let args = codec::json_value(&cmd.args_json).unwrap_or(Value::Null);
    let args = if args.is_null() { json!({}) } else { args };

    let templates = scope::strings(&lp.in_);
    let mut all = templates.clone();
    if let Some(m) = &lp.spec.max_in_flight {
        all.extend(scope::strings(m));
    }
    let roots = scope::roots(all);
    let names: Vec<&str> = plan
        .playbook
        .workflow
        .iter()
        .map(|s| s.step.as_str())
        .collect();
    let loaded = scope::load(mesh, eid, &roots, &names).await?;
    let mut sc = Scope::new()
        .workload(plan.workload.clone())
        .ctx(loaded.ctx)
        .args(args.clone())
        .execution_id(eid.to_string());
    for name in &names {
        sc = sc.declare(*name);
    }
    for (name, result) in loaded.steps {
        sc = sc.step_result(name, result);
    }
    // In a child playbook, `loop.in` may read the parent's iteration.
    if !plan.parent_iter.is_null() {
        sc = sc.iter(json!({"parent": plan.parent_iter}));
    }
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
    let items = match rendered {
        Ok(Value::Array(items)) => items,
        Ok(other) => {
            return fail_loop(
                mesh,
                &cmd,
                format!(
                    "loop.in of step {:?} must give a list, it gave {}",
                    step.step,
                    codec::json_type(&other)
                ),
            )
            .await
        }
        Err(e) => {
            return fail_loop(
                mesh,
                &cmd,
                format!(
                    "loop.in of step {:?} failed in {}: {e}",
                    step.step, plan.source_name
                ),
            )
            .await
        }
    };
    let max_in_flight = match lp.spec.mode {
        LoopMode::Sequential => 1,
        LoopMode::Parallel => match lp.spec.max_in_flight.as_ref() {
            None => DEFAULT_MAX_IN_FLIGHT,
            Some(v) => match noetl_core::template::render_value(v, &sc) {
                Ok(v) => match v
                    .as_u64()
                    .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                {
                    Some(n) if n >= 1 => n,
                    _ => {
                        return fail_loop(
                            mesh,
                            &cmd,
                            format!(
                            "loop.spec.max_in_flight of step {:?} must be an integer >= 1, got {v}",
                            step.step
                        ),
                        )
                        .await
                    }
                },
                Err(e) => {
                    return fail_loop(
                        mesh,
                        &cmd,
                        format!("loop.spec.max_in_flight of step {:?}: {e}", step.step),
                    )
                    .await
                }
            },
        },
    };
    let reducers = match noetl_core::reduce::declared(lp.spec.policy.as_ref()) {
        Ok(r) => r,
        Err(e) => {
            return fail_loop(
                mesh,
                &cmd,
                format!("loop.spec.policy.reducers of step {:?}: {e}", step.step),
            )
            .await
        }
    };
    let mut reduce_base = serde_json::Map::new();
    if !reducers.is_empty() {
        let ctx = mesh.exec_ctx(eid).await?;
        for (k, _) in &reducers {
            if let Some(v) = ctx.get(k) {
                reduce_base.insert(k.clone(), v.clone());
            }
        }
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
    let first = total.min(max_in_flight);
    let run = LoopRun {
        step: step.step.clone(),
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
        reduce_base,
    };
    let run = if kv::create(mesh.loop_kv(), &skey, &run).await? {
        run
    } else {
        kv::get(mesh.loop_kv(), &skey).await?.unwrap_or(run)
    };
    let started = EventDraft {
        event_type: types::LOOP_STARTED,
        execution_id: eid,
        step_run_id: srid,
        step: &step.step,
        trace_id: &cmd.trace_id,
        payload: json!({"total": total, "max_in_flight": max_in_flight, "mode": lp.spec.mode}),
        ..Default::default()
    }
    .build();
    mesh.emit(&started).await?.wait().await?;
    if run.finished() && !run.done_emitted {
        return finish(mesh, &plan, step, srid, &run).await;
    }
    redispatch(mesh, &plan, step, srid, &run).await
}

/// Publish the task commands of every in-flight iteration (idempotent).
async fn redispatch(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    srid: &str,
    run: &LoopRun,
) -> Result<(), LoopError> {
    dispatch(mesh, plan, step, srid, run, &run.in_flight).await
}

async fn dispatch(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    srid: &str,
    run: &LoopRun,
    indices: &[u64],
) -> Result<(), LoopError> {
    let eid = plan.execution_id.as_str();
    // A cancelled execution starts no more iterations.
    if indices.is_empty() || mesh.cancellations().is_cancelled(eid) {
        return Ok(());
    }
    let lp = step.loop_.as_ref().expect("loop step");
    let mut batch = Batch::new();
    for &i in indices {
        let item = chunks().item(mesh, eid, srid, i).await?;
        let iter = json!({ lp.iterator.clone(): item, "index": i });
        let idx = i.to_string();
        batch.push(
            mesh.emit(
                &EventDraft {
                    event_type: types::LOOP_ITERATION_STARTED,
                    execution_id: eid,
                    step_run_id: srid,
                    step: &step.step,
                    trace_id: &run.trace_id,
                    discriminator: &idx,
                    payload: json!({"loop_run_id": srid, "index": i}),
                    ..Default::default()
                }
                .build(),
            )
            .await?,
        );
        let Some(first) = step.tool.first() else {
            // A loop without tasks: every iteration is done at once.
            batch.push(
                mesh.emit(
                    &EventDraft {
                        event_type: types::LOOP_ITERATION_DONE,
                        execution_id: eid,
                        step_run_id: srid,
                        step: &step.step,
                        trace_id: &run.trace_id,
                        discriminator: &idx,
                        payload: json!({"loop_run_id": srid, "index": i, "result": null}),
                        ..Default::default()
                    }
                    .build(),
                )
                .await?,
            );
            continue;
        };
        let cmd = TaskCommand {
            command_id: derive_id(&[srid, "iter", &idx]),
            execution_id: eid.to_string(),
            step: step.step.clone(),
            step_run_id: srid.to_string(),
            pc: 0,
            attempt: 1,
            args_json: codec::json_bytes(&run.args),
            prev_json: Vec::new(),
            iteration: Some(IterationRef {
                loop_run_id: srid.to_string(),
                index: i,
                iter_json: codec::json_bytes(&iter),
                reduce_json: Vec::new(),
            }),
            not_before_ms: 0,
            trace_id: run.trace_id.clone(),
            steps_taken: 0,
            resume_outcome_json: Vec::new(),
        };
        batch.push(
            // The header names the execution: a dead-lettered command
            // must still fail it.
            mesh.publish_for_execution(
                mesh.subjects().task(&noetl_core::workbook::effective_kind(
                    plan.playbook.workbook.as_ref(),
                    first,
                )),
                &cmd.command_id,
                &cmd.execution_id,
                codec::encode(&cmd),
            )
            .await?,
        );
    }
    batch.wait().await?;
    Ok(())
}

async fn on_iteration(mesh: &Mesh, ev: Event) -> Result<(), LoopError> {
    let payload = events::payload(&ev);
    let eid = ev.execution_id.as_str();
    let srid = ev.step_run_id.as_str();
    let Some(index) = payload.get("index").and_then(Value::as_u64) else {
        return Err(LoopError::Refused(format!(
            "{} of execution {eid} step {:?} carries no iteration index",
            ev.event_type, ev.step
        )));
    };
    let (plan, idx) = plan_and_step(mesh, eid, &ev.step).await?;
    let step = &plan.playbook.workflow[idx];
    let failed = ev.event_type == types::LOOP_ITERATION_FAILED;
    let fail_fast = step.failure_mode() == FailureMode::FailFast;
    let reducers = step
        .loop_
        .as_ref()
        .and_then(|l| noetl_core::reduce::declared(l.spec.policy.as_ref()).ok())
        .unwrap_or_default();
    let contributions = match payload.get("reduce") {
        Some(Value::Object(m)) if !failed => m.clone(),
        _ => serde_json::Map::new(),
    };
    let mut newly: Vec<u64> = Vec::new();
    let run = kv::update(
        mesh.loop_kv(),
        &state_key(eid, srid),
        |r: Option<&LoopRun>| {
            newly.clear();
            let Some(r) = r else { return Cas::Keep };
            if !r.in_flight.contains(&index) {
                return Cas::Keep; // already counted (redelivery)
            }
            let mut r = r.clone();
            r.in_flight.retain(|i| *i != index);
            if failed {
                r.failed += 1;
                if fail_fast {
                    r.stopped = true;
                }
            } else {
                r.done += 1;
            }
            for (k, part) in &contributions {
                if let Some((_, op)) = reducers.iter().find(|(name, _)| name == k) {
                    match noetl_core::reduce::combine(*op, k, r.reduced.get(k), part) {
                        Ok(v) => {
                            r.reduced.insert(k.clone(), v);
                        }
                        Err(e) => tracing::warn!(execution_id = %eid, error = %e, "reducer skipped a contribution"),
                    }
                }
            }
            while !r.stopped && r.next < r.total && (r.in_flight.len() as u64) < r.max_in_flight {
                r.in_flight.push(r.next);
                newly.push(r.next);
                r.next += 1;
            }
            Cas::Write(r)
        },
    )
    .await?;
    let Some(run) = run else {
        return Err(LoopError::Refused(format!(
            "{} for unknown loop run {srid} of execution {eid}",
            ev.event_type
        )));
    };
    if !newly.is_empty() {
        dispatch(mesh, &plan, step, srid, &run, &newly).await?;
    }
    if run.finished() && !run.done_emitted {
        finish(mesh, &plan, step, srid, &run).await?;
    }
    Ok(())
}

/// Emit the loop's terminal events (deterministic ids: exactly one each).
async fn finish(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    srid: &str,
    run: &LoopRun,
) -> Result<(), LoopError> {
    let eid = plan.execution_id.as_str();
    let fail_fast = step.failure_mode() == FailureMode::FailFast;
    let loop_failed = run.failed > 0 && fail_fast;
    kv::put(mesh.exec_kv(), &result_key(eid, &step.step), &run.counts()).await?;
    if !run.reduced.is_empty() {
        let reducers = step
            .loop_
            .as_ref()
            .and_then(|l| noetl_core::reduce::declared(l.spec.policy.as_ref()).ok())
            .unwrap_or_default();
        let mut finals = serde_json::Map::new();
        for (k, acc) in &run.reduced {
            if let Some((_, op)) = reducers.iter().find(|(name, _)| name == k) {
                let v = noetl_core::reduce::combine(*op, k, run.reduce_base.get(k), acc)
                    .unwrap_or_else(|_| acc.clone());
                finals.insert(k.clone(), v);
            }
        }
        kv::update(mesh.ctx_kv(), eid, |cur: Option<&Value>| {
            let mut obj = match cur {
                Some(Value::Object(m)) => m.clone(),
                _ => serde_json::Map::new(),
            };
            if finals.iter().all(|(k, v)| obj.get(k) == Some(v)) && cur.is_some() {
                return Cas::Keep;
            }
            for (k, v) in &finals {
                obj.insert(k.clone(), v.clone());
            }
            Cas::Write(Value::Object(obj))
        })
        .await?;
    }
    let mut batch = Batch::new();
    let status = if run.failed == 0 {
        "ok"
    } else if loop_failed {
        "failed"
    } else {
        "partial"
    };
    batch.push(
        mesh.emit(
            &EventDraft {
                event_type: types::LOOP_DONE,
                execution_id: eid,
                step_run_id: srid,
                step: &step.step,
                trace_id: &run.trace_id,
                payload: json!({
                    "boundary": !loop_failed,
                    "status": status,
                    "counts": run.counts(),
                    "result": run.counts(),
                    "args": run.args,
                }),
                ..Default::default()
            }
            .build(),
        )
        .await?,
    );
    if loop_failed {
        batch.push(
            mesh.emit(
                &EventDraft {
                    event_type: types::STEP_FAILED,
                    execution_id: eid,
                    step_run_id: srid,
                    step: &step.step,
                    trace_id: &run.trace_id,
                    payload: json!({
                        "status": "error",
                        "counts": run.counts(),
                        "args": run.args,
                        "error": {
                            "kind": "loop.failed",
                            "message": format!("{} of {} iterations failed (fail_fast)", run.failed, run.total),
                        },
                    }),
                    ..Default::default()
                }
                .build(),
            )
            .await?,
        );
    }
    batch.wait().await?;
    kv::update(
        mesh.loop_kv(),
        &state_key(eid, srid),
        |r: Option<&LoopRun>| match r {
            Some(r) if !r.done_emitted => {
                let mut r = r.clone();
                r.done_emitted = true;
                Cas::Write(r)
            }
            _ => Cas::Keep,
        },
    )
    .await?;
    // The collection chunks and the iterations' checkpoints are needed no
    // more: drop them so state does not grow with every loop run. The run
    // record itself stays (it makes a redelivered report a no-op).
    let purged = kv::purge_under(mesh.loop_kv(), &state_key(eid, srid)).await?;
    tracing::debug!(execution_id = %eid, step = %step.step, purged, "loop state pruned");
    Ok(())
}

/// The loop could not even start: fail the step-run.
async fn fail_loop(mesh: &Mesh, cmd: &LoopCommand, message: String) -> Result<(), LoopError> {
    tracing::warn!(execution_id = %cmd.execution_id, step = %cmd.step, %message, "loop failed to start");
    let args = codec::json_value(&cmd.args_json).unwrap_or(Value::Null);
    let ev = EventDraft {
        event_type: types::STEP_FAILED,
        execution_id: &cmd.execution_id,
        step_run_id: &cmd.step_run_id,
        step: &cmd.step,
        trace_id: &cmd.trace_id,
        payload: json!({"status": "error", "args": args, "error": {"kind": "loop.in", "message": message}}),
        ..Default::default()
    }
    .build();
    mesh.emit(&ev).await?.wait().await?;
    Ok(())
}
