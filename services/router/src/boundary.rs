//! Boundary events: evaluate `next.arcs` once per step-run and move tokens.

use std::sync::Arc;

use async_nats::jetstream::Message;
use noetl_core::{routing, template::Scope, Step};
use noetl_mesh::{
    codec,
    event_type::EventType,
    events::{self, now_ms, now_rfc3339, types, EventDraft},
    ids::derive_id,
    keys::Keys,
    kv::{self, Cas, RevisionCache},
    payloads::{
        self, BoundaryView, CancelRequested, DeadLettered, ExecutionEnded, NextSelected,
        SelectedArc, TokenCreated,
    },
    plan::PlanRecord,
    runtime::{self, BoxFuture, Disposition, Handler},
    scope,
    state::{ExecHeader, ExecStatus, StepRecord, StepStatus, TokenRecord},
    Batch, Mesh, MeshError,
};
use noetl_wire::{Event, Token};
use serde_json::{Map, Value};

/// Handles `step.done`, `step.failed`, `step.skipped` and boundary `loop.done`.
pub struct BoundaryHandler {
    mesh: Mesh,
    caches: Caches,
}

/// What a router process remembers of the KV entries it last wrote or read,
/// so the usual boundary writes without reading first.
#[derive(Clone)]
struct Caches {
    /// Execution headers (shared with the timers, which end executions).
    headers: Arc<RevisionCache<ExecHeader>>,
    /// Step records.
    records: Arc<RevisionCache<StepRecord>>,
}

impl BoundaryHandler {
    /// A handler; keeps the last header revision it wrote per execution.
    pub fn new(mesh: Mesh) -> Self {
        Self::sharing(mesh, Arc::new(RevisionCache::new(4096)))
    }

    /// A handler sharing its header cache with the other writers of headers
    /// in this process (the timers), so its cached copy is never stale
    /// because of them.
    pub fn sharing(mesh: Mesh, headers: Arc<RevisionCache<ExecHeader>>) -> Self {
        Self {
            mesh,
            caches: Caches {
                headers,
                records: Arc::new(RevisionCache::new(4096)),
            },
        }
    }
}

impl Handler for BoundaryHandler {
    fn handle(&self, msg: Arc<Message>) -> BoxFuture<'static, Disposition> {
        let mesh = self.mesh.clone();
        let caches = self.caches.clone();
        Box::pin(async move {
            let ev: Event = match runtime::decode_event(&msg) {
                Ok(e) => e,
                Err(e) => return runtime::disposition(Err(e)),
            };
            let span = tracing::debug_span!(
                "boundary",
                execution_id = %ev.execution_id,
                step = %ev.step,
                step_run_id = %ev.step_run_id,
                trace_id = %ev.trace_id,
                event = %ev.event_type,
            );
            runtime::disposition(
                tracing::Instrument::instrument(on_boundary(&mesh, &caches, ev), span).await,
            )
        })
    }
}

pub(crate) use noetl_mesh::runtime::HandlerError;

/// A step-run's boundary, as [`transition`] applies it to the header.
struct Boundary<'a> {
    /// The step-run whose token ends.
    step_run_id: &'a str,
    /// The tokens its arcs fired.
    tokens: &'a [TokenRecord],
    /// Set when it failed and nothing handled the failure: the execution
    /// fails with this message.
    failure: Option<&'a str>,
    /// The time, RFC 3339.
    now: &'a str,
    /// The status the step's record takes.
    status: StepStatus,
}

/// The header after boundary `b`, or `None` when its token is no longer
/// live (a redelivered boundary changes nothing). The step-run's token
/// ends; while the execution runs, an unhandled failure fails it (no token
/// stays live) and otherwise the fired tokens become live; with none live
/// left the execution is completed. A terminal execution only loses the
/// token.
fn transition(h: &ExecHeader, b: &Boundary<'_>) -> Option<ExecHeader> {
    if !h.is_live(b.step_run_id) {
        return None;
    }
    let mut h = h.clone();
    h.live.retain(|t| t.token_id != b.step_run_id);
    if h.status != ExecStatus::Running {
        return Some(h);
    }
    match b.failure {
        Some(message) => {
            h.status = ExecStatus::Failed;
            h.error = Some(message.to_string());
            h.live.clear();
            h.ended_at = Some(b.now.to_string());
        }
        None => {
            h.live.extend(b.tokens.iter().cloned());
            if h.live.is_empty() {
                h.status = ExecStatus::Completed;
                h.ended_at = Some(b.now.to_string());
            }
        }
    }
    Some(h)
}

/// The scope arc conditions and args render in: workload, `ctx`, the step's
/// args, `event`, and the step results `templates` read.
async fn arc_scope(
    mesh: &Mesh,
    plan: &PlanRecord,
    ev: &Event,
    (payload, view): (&Value, &BoundaryView),
    templates: &[&str],
) -> Result<Scope, MeshError> {
    let args = view
        .args
        .clone()
        .unwrap_or_else(|| Value::Object(Map::new()));
    let sc = plan
        .template_scope(mesh, templates.iter().copied(), &args)
        .await?;
    Ok(sc.event(event_scope(ev, payload)))
}

/// The `event` arcs' conditions see: the boundary event's payload plus its
/// `name`, `step` and `step_run_id`.
fn event_scope(ev: &Event, payload: &Value) -> Value {
    let mut event = match payload {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    event.insert("name".into(), Value::String(ev.event_type.clone()));
    event.insert("step".into(), Value::String(ev.step.clone()));
    event.insert("step_run_id".into(), Value::String(ev.step_run_id.clone()));
    Value::Object(event)
}

/// What the router's boundary consumer does with an event of type `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handling {
    /// A step-run ended: route it, its record taking this status.
    Ended(StepStatus),
    /// A message of the execution was dead-lettered: fail the execution.
    DeadLetter,
    /// A client asked to cancel.
    Cancel,
    /// Not an event this consumer subscribes to.
    Foreign,
}

/// How the boundary consumer handles `kind` (every type named: a new one
/// does not compile until it is placed).
fn handling_of(kind: EventType) -> Handling {
    use EventType as T;
    match kind {
        T::StepDone | T::LoopDone => Handling::Ended(StepStatus::Done),
        T::StepFailed => Handling::Ended(StepStatus::Failed),
        T::StepSkipped => Handling::Ended(StepStatus::Skipped),
        T::MessageDeadLettered => Handling::DeadLetter,
        T::ExecutionCancelRequested => Handling::Cancel,
        T::PlaybookInitialized
        | T::WorkflowInitialized
        | T::TokenCreated
        | T::StepScheduled
        | T::StepStarted
        | T::TaskStarted
        | T::TaskDone
        | T::NextSelected
        | T::LoopStarted
        | T::LoopIterationStarted
        | T::LoopIterationDone
        | T::LoopIterationFailed
        | T::LoopClaimed
        | T::ExecutionCompleted
        | T::ExecutionFailed
        | T::ExecutionCancelled
        | T::ExecutionDeadline
        | T::StepDeadline
        | T::TaskUnserved => Handling::Foreign,
    }
}

/// What the arcs decided for one boundary event.
struct Decision {
    tokens: Vec<TokenRecord>,
    unhandled_failure: bool,
    error: Option<String>,
    /// The `ctx` writes of the fired arcs, already applied.
    set_ctx: Option<Map<String, Value>>,
}

async fn on_boundary(mesh: &Mesh, caches: &Caches, ev: Event) -> Result<(), HandlerError> {
    let headers = caches.headers.as_ref();
    let kind = EventType::of(&ev);
    let status = match kind.map(handling_of) {
        Some(Handling::DeadLetter) => return on_dead_letter(mesh, headers, &ev).await,
        Some(Handling::Cancel) => return on_cancel(mesh, headers, &ev).await,
        Some(Handling::Ended(status)) => status,
        Some(Handling::Foreign) | None => {
            return Err(HandlerError::Refused(format!(
                "{} of execution {} is not a boundary event",
                ev.event_type, ev.execution_id
            )))
        }
    };
    let loop_done = kind == Some(EventType::LoopDone);
    let payload = events::payload(&ev);
    let view: BoundaryView = payloads::decode(&ev)?;
    if loop_done && view.boundary != Some(true) {
        return Ok(()); // informational: the failing loop's boundary is step.failed
    }
    let eid = ev.execution_id.as_str();
    let srid = ev.step_run_id.as_str();
    let plan = boundary_plan(mesh, &ev).await?;
    let Some(step) = plan.step(&ev.step) else {
        return Err(HandlerError::Refused(format!(
            "{} names step {:?} which execution {eid} does not have",
            ev.event_type, ev.step
        )));
    };

    // 1. The decision (pure: arcs over event, ctx, workload, args, results).
    let mut decision = decide(mesh, &plan, step, &ev, (&payload, &view)).await?;
    // Past the execution's deadline no arc fires: the execution fails,
    // naming the deadline (its timer would end it a moment later).
    if let Some(error) =
        crate::deadline::stops_routing(&plan, !decision.tokens.is_empty(), now_ms())
    {
        decision.tokens.clear();
        decision.unhandled_failure = true;
        decision.error = Some(error);
    }

    // 2. One compare-and-set: applied only while this step-run's token is
    //    live, so a redelivered event changes nothing the second time.
    let failure = decision
        .unhandled_failure
        .then(|| failure_message(&ev, view.error.as_ref(), decision.error.as_deref()));
    let now = now_rfc3339();
    let boundary = Boundary {
        step_run_id: srid,
        tokens: &decision.tokens,
        failure: failure.as_deref(),
        now: &now,
        status,
    };
    let (header, applied) = record_and_apply(mesh, caches, &ev, &view, &boundary).await?;

    // 3. Publish the tokens this step-run fired that are still live (on a
    //    redelivery: the same ones, same ids), and the events.
    publish_fired(Fired {
        mesh,
        ev: &ev,
        step,
        header: &header,
        applied,
        error: decision.error.clone(),
        set_ctx: decision.set_ctx.clone(),
    })
    .await?;

    // 4. The terminal event, exactly once (flag set after publishing).
    emit_terminal(mesh, headers, &header, &ev.trace_id).await?;
    Ok(())
}

/// The plan of the execution a boundary event belongs to; an event of an
/// execution without a plan is refused.
async fn boundary_plan(mesh: &Mesh, ev: &Event) -> Result<Arc<PlanRecord>, HandlerError> {
    match mesh.plans().get(mesh, &ev.execution_id).await {
        Ok(p) => Ok(p),
        Err(MeshError::NoPlan { .. }) => Err(HandlerError::Refused(format!(
            "{} for unknown execution {} (step {})",
            ev.event_type, ev.execution_id, ev.step
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The step's record (its status, last step-run, loop counts, error) and
/// the header's compare-and-set. The record is written only while this
/// step-run's token is live (a redelivery after the header moved on must
/// not overwrite a later run's record; a token absorbed by a join says
/// nothing about the step's status), and before the header can turn
/// terminal, so whoever sees the execution end also sees how its last step
/// ended: the two writes go out together, and a transition that would end
/// the execution is held back until the record is written. A crash between
/// them repeats both, with the same content. Returns the header now stored
/// and whether this event changed it.
///
/// The usual boundary needs no read ([`apply_from_cache`]); the header is
/// read first only when this process's copy cannot decide.
async fn record_and_apply(
    mesh: &Mesh,
    caches: &Caches,
    ev: &Event,
    view: &BoundaryView,
    boundary: &Boundary<'_>,
) -> Result<(ExecHeader, bool), HandlerError> {
    if !view.join {
        let from_cache = apply_from_cache(FromCache {
            mesh,
            caches,
            ev,
            record: step_record(ev, view, boundary.status),
            boundary,
        })
        .await?;
        if let Some(header) = from_cache {
            return Ok((header, true));
        }
    }
    let headers = caches.headers.as_ref();
    let key = Keys::header(&ev.execution_id);
    match kv::read::<ExecHeader>(mesh.exec_kv(), &key).await? {
        // Not live (a redelivery after the header moved on): the header
        // just read is the answer; `transition` would change nothing.
        Some((h, _)) if !h.is_live(&ev.step_run_id) => return Ok((h, false)),
        Some((h, rev)) => headers.remember(&key, h, rev),
        // No header: nothing to record; refused, naming the event.
        None => {
            apply_boundary(mesh, headers, ev, boundary, Ending::Allowed).await?;
        }
    }
    if view.join {
        let done = apply_boundary(mesh, headers, ev, boundary, Ending::Allowed).await?;
        return Ok((done.header, done.applied));
    }
    let (written, first) = tokio::join!(
        write_step_record(mesh, caches, ev, step_record(ev, view, boundary.status)),
        apply_boundary(mesh, headers, ev, boundary, Ending::HeldBack)
    );
    written?;
    let first = first?;
    if !first.held_back {
        return Ok((first.header, first.applied));
    }
    let done = apply_boundary(mesh, headers, ev, boundary, Ending::Allowed).await?;
    Ok((done.header, done.applied))
}

/// What [`apply_from_cache`] needs.
struct FromCache<'a> {
    mesh: &'a Mesh,
    caches: &'a Caches,
    ev: &'a Event,
    /// The step's record after this boundary.
    record: StepRecord,
    boundary: &'a Boundary<'a>,
}

/// A boundary applied without reading the header first: when this process
/// holds the header as it last wrote or read it, with the step-run's token
/// live, and the boundary does not end the execution, the step's record
/// and the header are written together, each only if still at the
/// revision this process saw last. Returns the header now stored, or
/// `None` (the header not written) when the copy cannot decide or the
/// header had moved on: the caller then reads it and decides again.
///
/// Within one router process the copy is never stale (every header write
/// of the process goes through it), so the outcome is the read's. With
/// several router replicas, a copy made stale by an execution another
/// replica ended (cancelled, failed, timed out) may write the record of a
/// step that did end before the header write is refused: the record is
/// then true, but later than the end.
async fn apply_from_cache(c: FromCache<'_>) -> Result<Option<ExecHeader>, HandlerError> {
    let FromCache {
        mesh,
        caches,
        ev,
        record,
        boundary,
    } = c;
    let header_key = Keys::header(&ev.execution_id);
    let Some((cached, revision)) = caches.headers.cached(&header_key) else {
        return Ok(None);
    };
    let Some(next) = transition(&cached, boundary).filter(|h| !h.status.is_terminal()) else {
        return Ok(None); // not live here, or the end: read, then hold the end back
    };
    let record_key = Keys::step(&ev.execution_id, &ev.step);
    let record_revision = caches.records.cached(&record_key).map(|(_, r)| r);
    let store = mesh.exec_kv();
    let (recorded, applied) = tokio::join!(
        kv::write_at(store, &record_key, &record, record_revision),
        kv::write_at(store, &header_key, &next, Some(revision)),
    );
    let recorded = recorded?;
    let Some(header_revision) = applied? else {
        caches.headers.forget(&header_key);
        match recorded {
            Some(r) => caches.records.remember(&record_key, record, r),
            None => caches.records.forget(&record_key),
        }
        return Ok(None);
    };
    caches
        .headers
        .remember(&header_key, next.clone(), header_revision);
    match recorded {
        Some(r) => caches.records.remember(&record_key, record, r),
        // The record moved on (written by an earlier run this process does
        // not remember): the token was live, so this boundary's is the
        // step's latest record.
        None => write_step_record(mesh, caches, ev, record).await?,
    }
    Ok(Some(next))
}

/// The step's record after boundary `ev`.
fn step_record(ev: &Event, view: &BoundaryView, status: StepStatus) -> StepRecord {
    StepRecord {
        status,
        last_step_run_id: ev.step_run_id.clone(),
        loop_counts: view
            .counts
            .filter(|_| EventType::of(ev) == Some(EventType::LoopDone))
            .map(|c| payloads::to_value(&c)),
        error: view.error.as_ref().map(error_text),
    }
}

/// Write the step's record for `ev`, whatever its revision.
async fn write_step_record(
    mesh: &Mesh,
    caches: &Caches,
    ev: &Event,
    record: StepRecord,
) -> Result<(), MeshError> {
    let key = Keys::step(&ev.execution_id, &ev.step);
    let revision = kv::put(mesh.exec_kv(), &key, &record).await?;
    caches.records.remember(&key, record, revision);
    Ok(())
}

/// Whether a header write may end the execution.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    Allowed,
    /// Not yet (the step's record is being written): keep the header and
    /// say so.
    HeldBack,
}

/// What [`apply_boundary`] did.
struct Applied {
    /// The header now stored.
    header: ExecHeader,
    /// This event changed it.
    applied: bool,
    /// It would have ended the execution, and was held back.
    held_back: bool,
}

/// The header compare-and-set of a boundary: applied only while the
/// step-run's token is live ([`transition`]), so a redelivered event
/// changes nothing the second time.
async fn apply_boundary(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    ev: &Event,
    boundary: &Boundary<'_>,
    ending: Ending,
) -> Result<Applied, HandlerError> {
    let mut applied = false;
    let mut held_back = false;
    let header = kv::update_cached(
        mesh.exec_kv(),
        &Keys::header(&ev.execution_id),
        headers,
        |h: Option<&ExecHeader>| {
            applied = false;
            held_back = false;
            match h.and_then(|h| transition(h, boundary)) {
                Some(next) if ending == Ending::HeldBack && next.status.is_terminal() => {
                    held_back = true;
                    Cas::Keep
                }
                Some(next) => {
                    applied = true;
                    Cas::Write(next)
                }
                None => Cas::Keep,
            }
        },
    )
    .await?;
    match header {
        Some(header) => Ok(Applied {
            header,
            applied,
            held_back,
        }),
        None => Err(HandlerError::Refused(format!(
            "{} for execution {} which has no header",
            ev.event_type, ev.execution_id
        ))),
    }
}

/// What [`publish_fired`] needs.
struct Fired<'a> {
    mesh: &'a Mesh,
    ev: &'a Event,
    step: &'a Step,
    header: &'a ExecHeader,
    /// This delivery applied the boundary (a redelivery did not).
    applied: bool,
    /// Why routing failed, if it did.
    error: Option<String>,
    /// The `ctx` writes of the fired arcs.
    set_ctx: Option<Map<String, Value>>,
}

// Over 80 lines on purpose: publishes a boundary's tokens and events; what fired is decided
// before, by `transition` and `decide`.
/// Publish the tokens the step-run's boundary fired that are still live,
/// their `token.created`, and `next.selected` (deterministic ids: a
/// redelivery republishes the same messages, JetStream drops the copies).
async fn publish_fired(f: Fired<'_>) -> Result<(), MeshError> {
    let Fired {
        mesh,
        ev,
        step,
        header,
        applied,
        error,
        set_ctx,
    } = f;
    let (eid, srid) = (ev.execution_id.as_str(), ev.step_run_id.as_str());
    let fired: Vec<&TokenRecord> = header.live.iter().filter(|t| t.parent == srid).collect();
    // The events first, then the tokens: a token's step can only start after
    // its `token.created` and this boundary's `next.selected` are in the
    // stream, so the stream keeps cause before effect across services.
    let mut batch = Batch::new();
    for t in &fired {
        batch.push(
            mesh.emit(
                &EventDraft {
                    event_type: types::TOKEN_CREATED,
                    execution_id: eid,
                    step_run_id: srid,
                    step: &t.step,
                    trace_id: &ev.trace_id,
                    parent_id: &ev.event_id,
                    discriminator: &t.token_id,
                    payload: payloads::to_value(&TokenCreated {
                        token_id: t.token_id.clone(),
                        step: t.step.clone(),
                        arc: Some(t.arc),
                    }),
                    ..Default::default()
                }
                .build(),
            )
            .await?,
        );
    }
    if (applied || !fired.is_empty()) && EventType::of(ev) != Some(EventType::StepSkipped) {
        let arcs: Vec<SelectedArc> = fired
            .iter()
            .map(|t| SelectedArc {
                arc: t.arc,
                step: t.step.clone(),
            })
            .collect();
        let mode = step.next.as_ref().map(|n| n.spec.mode).unwrap_or_default();
        batch.push(
            mesh.emit(
                &EventDraft {
                    event_type: types::NEXT_SELECTED,
                    execution_id: eid,
                    step_run_id: srid,
                    step: &ev.step,
                    trace_id: &ev.trace_id,
                    parent_id: &ev.event_id,
                    payload: payloads::to_value(&NextSelected {
                        on: ev.event_type.clone(),
                        mode,
                        arcs,
                        error,
                        set_ctx,
                    }),
                    ..Default::default()
                }
                .build(),
            )
            .await?,
        );
    }
    for t in &fired {
        let token = Token {
            token_id: t.token_id.clone(),
            execution_id: eid.to_string(),
            step: t.step.clone(),
            args_json: codec::json_bytes(&t.args),
            trace_id: ev.trace_id.clone(),
            parent_step_run_id: srid.to_string(),
            parent_step: ev.step.clone(),
        };
        batch.push(mesh.publish_token(&token).await?);
    }
    batch.wait().await?;
    Ok(())
}

/// Emit `execution.completed` / `execution.failed` once the header is
/// terminal, exactly once (the flag is set after publishing; the event id is
/// deterministic, so a crash between the two only republishes a duplicate
/// that JetStream drops).
pub(crate) async fn emit_terminal(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    header: &ExecHeader,
    trace_id: &str,
) -> Result<(), HandlerError> {
    if !header.status.is_terminal() || header.terminal_emitted {
        return Ok(());
    }
    let eid = header.execution_id.as_str();
    let (t, status) = match header.status {
        ExecStatus::Completed => (types::EXECUTION_COMPLETED, ExecStatus::Completed),
        ExecStatus::Cancelled => (types::EXECUTION_CANCELLED, ExecStatus::Cancelled),
        _ => (types::EXECUTION_FAILED, ExecStatus::Failed),
    };
    mesh.emit(
        &EventDraft {
            event_type: t,
            execution_id: eid,
            trace_id,
            payload: payloads::to_value(&ExecutionEnded {
                status,
                error: header.error.clone(),
                source: None,
            }),
            ..Default::default()
        }
        .build(),
    )
    .await?
    .wait()
    .await?;
    // Before marking the end emitted: a crash here repeats both.
    crate::children::resume_parent(mesh, eid).await?;
    kv::update_cached(
        mesh.exec_kv(),
        &Keys::header(eid),
        headers,
        |h: Option<&ExecHeader>| match h {
            Some(h) if !h.terminal_emitted => {
                let mut h = h.clone();
                h.terminal_emitted = true;
                Cas::Write(h)
            }
            _ => Cas::Keep,
        },
    )
    .await?;
    headers.forget(&Keys::header(eid));
    let ended = match status {
        ExecStatus::Completed => "completed",
        ExecStatus::Cancelled => "cancelled",
        _ => "failed",
    };
    mesh.health().metrics().execution(ended);
    if root_span_is_ours(header, trace_id) {
        let now = std::time::SystemTime::now();
        let started = noetl_mesh::events::parse_rfc3339(&header.started_at).unwrap_or(now);
        noetl_telemetry::root::export(&noetl_telemetry::root::ExecutionSpan {
            execution_id: eid,
            trace_id,
            playbook: &header.playbook,
            status: ended,
            error: header.error.as_deref(),
            started,
            ended: now,
        });
    }
    tracing::info!(execution_id = %eid, status = ?status, "execution finished");
    Ok(())
}

/// Whether the router exports the execution's root span: when the trace is
/// the execution's own (no parent execution, and its request carried no
/// trace, so every service parented its first hop to the derived root).
fn root_span_is_ours(header: &ExecHeader, trace_id: &str) -> bool {
    header.parent_execution_id.is_empty()
        && trace_id == noetl_mesh::ids::trace_id_for("", &header.execution_id)
}

/// One of the execution's messages was dead-lettered: nothing will ever
/// finish that work, so the execution fails now, naming the message, instead
/// of waiting forever.
async fn on_dead_letter(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    ev: &Event,
) -> Result<(), HandlerError> {
    let eid = ev.execution_id.as_str();
    let dl: DeadLettered = payloads::decode_typed(ev)?;
    let error = format!(
        "internal: message on {} was dead-lettered by {}: {}",
        dl.subject, dl.consumer, dl.reason
    );
    let header = end_running(mesh, headers, eid, ExecStatus::Failed, &error).await?;
    match header {
        Some(h) => emit_terminal(mesh, headers, &h, &ev.trace_id).await,
        None => Ok(()), // no such execution: the DLQ copy is all there is
    }
}

/// End a running execution with `status` and `error` (one CAS: an ended
/// execution is left as it is). Returns the header as it now is.
pub(crate) async fn end_running(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    eid: &str,
    status: ExecStatus,
    error: &str,
) -> Result<Option<ExecHeader>, MeshError> {
    kv::update_cached(
        mesh.exec_kv(),
        &Keys::header(eid),
        headers,
        |h: Option<&ExecHeader>| match h {
            Some(h) if h.status == ExecStatus::Running => {
                let mut h = h.clone();
                h.status = status;
                h.error = Some(error.to_string());
                h.live.clear();
                h.ended_at = Some(now_rfc3339());
                Cas::Write(h)
            }
            _ => Cas::Keep,
        },
    )
    .await
}

/// A client asked to cancel: the execution ends `cancelled` (no new step
/// starts; boundary events of step-runs already running are ignored), and
/// the cancellation goes on to its child executions.
async fn on_cancel(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    ev: &Event,
) -> Result<(), HandlerError> {
    let eid = ev.execution_id.as_str();
    let request: CancelRequested = payloads::decode_typed(ev)?;
    let reason = request.reason.trim().to_string();
    let error = if reason.is_empty() {
        "cancelled".to_string()
    } else {
        format!("cancelled: {reason}")
    };
    let header = end_running(mesh, headers, eid, ExecStatus::Cancelled, &error).await?;
    let Some(h) = header else {
        return Ok(()); // no such execution
    };
    if h.status == ExecStatus::Cancelled {
        emit_terminal(mesh, headers, &h, &ev.trace_id).await?;
        crate::children::cancel_children(mesh, eid).await?;
    }
    Ok(())
}

/// Evaluate the step's arcs for this boundary event.
async fn decide(
    mesh: &Mesh,
    plan: &PlanRecord,
    step: &Step,
    ev: &Event,
    (payload, view): (&Value, &BoundaryView),
) -> Result<Decision, MeshError> {
    let mut record = Decision {
        tokens: Vec::new(),
        unhandled_failure: false,
        error: None,
        set_ctx: None,
    };
    if EventType::of(ev) == Some(EventType::StepSkipped) {
        return Ok(record);
    }
    let next = step.next.as_ref();
    let templates: Vec<&str> = next
        .map(|n| {
            n.arcs
                .iter()
                .flat_map(|a| {
                    let mut v: Vec<&str> = a.when.as_deref().into_iter().collect();
                    for x in a.args.iter().chain(&a.set_ctx).flat_map(|m| m.values()) {
                        v.extend(scope::strings(x));
                    }
                    v
                })
                .collect()
        })
        .unwrap_or_default();
    let selected = if templates.is_empty() && next.map(|n| n.arcs.is_empty()).unwrap_or(true) {
        Ok(Vec::new())
    } else {
        let sc = arc_scope(mesh, plan, ev, (payload, view), &templates).await?;
        routing::select_arcs(next, &sc).map_err(|e| {
            format!(
                "routing of step {:?} failed in {}: {e}",
                ev.step, plan.source_name
            )
        })
    };
    match selected {
        Ok(arcs) => {
            let patch = arc_ctx_patch(&arcs);
            if !patch.is_empty() {
                apply_arc_ctx(mesh, &ev.execution_id, &ev.step_run_id, &patch).await?;
                record.set_ctx = Some(patch);
            }
            let limit = plan.max_payload_bytes(mesh.config().inline_limit);
            for a in arcs {
                let token_id = derive_id(&[&ev.step_run_id, "arc", &a.index.to_string()]);
                // Large arguments travel by reference, like large results.
                let args = scope::offload_args(
                    mesh,
                    scope::OffloadArgs {
                        execution_id: &ev.execution_id,
                        step: &a.step,
                        token_id: &token_id,
                        args: &Value::Object(a.args),
                    },
                    limit,
                )
                .await?;
                record.tokens.push(TokenRecord {
                    token_id,
                    step: a.step,
                    args,
                    arc: a.index,
                    parent: ev.step_run_id.clone(),
                });
            }
            record.unhandled_failure =
                EventType::of(ev) == Some(EventType::StepFailed) && record.tokens.is_empty();
        }
        Err(message) => {
            tracing::warn!(execution_id = %ev.execution_id, step = %ev.step, %message, "routing failed");
            record.error = Some(message);
            record.unhandled_failure = true;
        }
    }
    Ok(record)
}

/// The `ctx` writes of the arcs that fire, in arc order (a later arc's
/// value for a key wins, as if applied one after the other).
fn arc_ctx_patch(arcs: &[routing::SelectedArc]) -> Map<String, Value> {
    let mut patch = Map::new();
    for a in arcs {
        patch.extend(a.set_ctx.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    patch
}

/// Merge the arcs' `ctx` writes of step-run `step_run_id` into the
/// execution's `ctx` (compare-and-set), before their tokens are placed. The
/// write is recorded under the step-run's id in the same compare-and-set,
/// so a redelivered boundary event (whose patch may render differently,
/// e.g. `ctx.n + 1`) does not apply it again.
async fn apply_arc_ctx(
    mesh: &Mesh,
    eid: &str,
    step_run_id: &str,
    patch: &Map<String, Value>,
) -> Result<(), MeshError> {
    use noetl_mesh::state::{ctx_applied, mark_ctx_applied};
    let id = format!("arcs:{step_run_id}");
    kv::update(mesh.ctx_kv(), eid, |current: Option<&Value>| {
        let mut obj = match current {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        if ctx_applied(&obj, &id) {
            return Cas::Keep;
        }
        obj.extend(patch.iter().map(|(k, v)| (k.clone(), v.clone())));
        mark_ctx_applied(&mut obj, &id);
        Cas::Write(Value::Object(obj))
    })
    .await?;
    Ok(())
}

fn error_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(m) => match (m.get("kind"), m.get("message")) {
            (Some(k), Some(Value::String(msg))) => {
                format!("{}: {msg}", k.as_str().unwrap_or("error"))
            }
            (_, Some(Value::String(msg))) => msg.clone(),
            _ => v.to_string(),
        },
        other => other.to_string(),
    }
}

fn failure_message(ev: &Event, error: Option<&Value>, routing_error: Option<&str>) -> String {
    if let Some(e) = routing_error {
        return e.to_string();
    }
    match error {
        Some(e) => format!("step {:?} failed: {}", ev.step, error_text(e)),
        None => format!("step {:?} failed", ev.step),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn token(id: &str, parent: &str) -> TokenRecord {
        TokenRecord {
            token_id: id.into(),
            step: format!("step-{id}"),
            args: Value::Null,
            arc: 0,
            parent: parent.into(),
        }
    }

    fn header(status: ExecStatus, live: &[&str]) -> ExecHeader {
        ExecHeader {
            status,
            ..ExecHeader::running(
                "e1",
                live.iter().map(|t| TokenRecord::new(*t, "s")).collect(),
            )
        }
    }

    fn boundary<'a>(
        srid: &'a str,
        tokens: &'a [TokenRecord],
        failure: Option<&'a str>,
    ) -> Boundary<'a> {
        Boundary {
            step_run_id: srid,
            tokens,
            failure,
            now: "t1",
            status: StepStatus::Done,
        }
    }

    #[test]
    fn a_boundary_replaces_its_token_by_the_fired_ones() {
        let fired = [token("a", "s1"), token("b", "s1")];
        let h = transition(
            &header(ExecStatus::Running, &["s1", "s2"]),
            &boundary("s1", &fired, None),
        )
        .expect("applied");
        let live: Vec<&str> = h.live.iter().map(|t| t.token_id.as_str()).collect();
        assert_eq!(live, vec!["s2", "a", "b"]);
        assert_eq!((h.status, h.ended_at), (ExecStatus::Running, None));
    }

    #[test]
    fn the_last_token_ending_completes_the_execution() {
        let h = transition(
            &header(ExecStatus::Running, &["s1"]),
            &boundary("s1", &[], None),
        )
        .unwrap();
        assert_eq!(h.status, ExecStatus::Completed);
        assert_eq!(h.ended_at.as_deref(), Some("t1"));
        assert!(h.live.is_empty() && h.error.is_none());
    }

    #[test]
    fn an_unhandled_failure_fails_the_execution_and_ends_every_token() {
        let fired = [token("a", "s1")];
        let h = transition(
            &header(ExecStatus::Running, &["s1", "s2"]),
            &boundary("s1", &fired, Some("step s failed: boom")),
        )
        .unwrap();
        assert_eq!(h.status, ExecStatus::Failed);
        assert_eq!(h.error.as_deref(), Some("step s failed: boom"));
        assert!(h.live.is_empty());
        assert_eq!(h.ended_at.as_deref(), Some("t1"));
    }

    #[test]
    fn a_redelivered_boundary_changes_nothing() {
        let h = header(ExecStatus::Running, &["s2"]);
        assert_eq!(
            transition(&h, &boundary("s1", &[token("a", "s1")], None)),
            None
        );
    }

    #[test]
    fn a_terminal_execution_only_loses_the_token() {
        for status in [
            ExecStatus::Cancelled,
            ExecStatus::Failed,
            ExecStatus::Completed,
        ] {
            let h = transition(
                &header(status, &["s1"]),
                &boundary("s1", &[token("a", "s1")], Some("x")),
            )
            .unwrap();
            assert_eq!(h.status, status);
            assert!(h.live.is_empty(), "{status:?}: no token fired");
            assert_eq!((h.error, h.ended_at), (None, None));
        }
    }

    fn event(event_type: &str) -> Event {
        Event {
            event_type: event_type.into(),
            execution_id: "e1".into(),
            step_run_id: "sr1".into(),
            step: "fetch".into(),
            ..Default::default()
        }
    }

    #[test]
    fn arcs_see_the_payload_with_the_event_name_step_and_step_run() {
        let e = event_scope(
            &event(types::STEP_FAILED),
            &json!({"status": "error", "name": "payload's own"}),
        );
        assert_eq!(
            e,
            json!({"status": "error", "name": "step.failed", "step": "fetch", "step_run_id": "sr1"})
        );
        assert_eq!(
            event_scope(&event(types::STEP_DONE), &Value::Null)["name"],
            "step.done"
        );
    }

    #[test]
    fn errors_read_as_kind_and_message() {
        assert_eq!(error_text(&json!("plain")), "plain");
        assert_eq!(
            error_text(&json!({"kind": "http.status", "message": "503"})),
            "http.status: 503"
        );
        assert_eq!(error_text(&json!({"message": "no kind"})), "no kind");
        assert_eq!(error_text(&json!({"code": 7})), r#"{"code":7}"#);
        assert_eq!(error_text(&json!(42)), "42");
    }

    #[test]
    fn a_failure_message_names_the_step_or_the_routing_error() {
        let ev = event(types::STEP_FAILED);
        let boom = json!({"kind": "python.exception", "message": "boom"});
        assert_eq!(
            failure_message(&ev, Some(&boom), None),
            r#"step "fetch" failed: python.exception: boom"#
        );
        assert_eq!(failure_message(&ev, None, None), r#"step "fetch" failed"#);
        assert_eq!(
            failure_message(&ev, Some(&boom), Some("routing of step \"fetch\" failed")),
            "routing of step \"fetch\" failed"
        );
    }

    #[test]
    fn boundary_events_give_their_step_status() {
        let status = |t| handling_of(t);
        assert_eq!(
            status(EventType::StepFailed),
            Handling::Ended(StepStatus::Failed)
        );
        assert_eq!(
            status(EventType::StepSkipped),
            Handling::Ended(StepStatus::Skipped)
        );
        assert_eq!(
            status(EventType::StepDone),
            Handling::Ended(StepStatus::Done)
        );
        assert_eq!(
            status(EventType::LoopDone),
            Handling::Ended(StepStatus::Done)
        );
        assert_eq!(status(EventType::MessageDeadLettered), Handling::DeadLetter);
        assert_eq!(
            status(EventType::ExecutionCancelRequested),
            Handling::Cancel
        );
        // Nothing else is a boundary: an event the consumer should never
        // get is refused, not recorded as a finished step.
        assert_eq!(status(EventType::TaskDone), Handling::Foreign);
    }
}
