//! Execution requests: validate, store the plan, publish the entry token.

use std::sync::Arc;

use async_nats::jetstream::Message;
use noetl_core::merge::deep_merge;
use noetl_mesh::{
    codec,
    events::{now_ms, now_rfc3339, EventDraft},
    handler::{Handle, Handled, Job},
    ids::is_valid_execution_id,
    keys::Keys,
    kv,
    payloads::ExecutionEnded,
    plan::PlanRecord,
    runtime::{self, BoxFuture, HandlerError},
    state::{ExecHeader, ExecStatus, TokenRecord},
    Mesh, MeshError,
};
use noetl_wire::ExecutionRequest;
use serde_json::Value;

/// Handles `<p>.exec.request`.
pub struct RequestHandler {
    /// The mesh.
    pub mesh: Mesh,
    /// Where the header it creates is remembered: the boundary handler's
    /// cache, so the execution's first boundary needs no read.
    pub headers: Arc<kv::RevisionCache<ExecHeader>>,
    /// Playbooks parsed before, by their text.
    pub parsed: crate::parsed::ParsedPlaybooks,
}

impl Handle for RequestHandler {
    type In = ExecutionRequest;
    /// The request makes the plan.
    type Plan = ();
    const NAME: &'static str = "execution.request";

    fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    fn span(&self, msg: &Message, req: &ExecutionRequest) -> tracing::Span {
        request_span(msg, req, sequence(msg))
    }

    fn handle(
        self: Arc<Self>,
        job: Job<ExecutionRequest, ()>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            let seq = sequence(&job.msg);
            start(&self, job.input, seq).await?;
            Ok(Handled::Done)
        })
    }
}

/// The request's stream sequence: the execution id of a request that
/// names none (`e<seq>`).
fn sequence(msg: &Message) -> u64 {
    msg.info().map(|i| i.stream_sequence).unwrap_or(0)
}

/// The span a request is started in. A request published with a
/// `traceparent` continues that trace (the consume span is its parent);
/// any other starts the execution's own, under the root span its ids are
/// derived from ([`noetl_telemetry::root`]), which the router exports when
/// the execution ends.
fn request_span(msg: &Message, req: &ExecutionRequest, seq: u64) -> tracing::Span {
    let eid = if req.execution_id.is_empty() {
        format!("e{seq}")
    } else {
        req.execution_id.clone()
    };
    let span = tracing::debug_span!("execution.request", execution_id = %eid);
    if noetl_telemetry::enabled() && runtime::trace_parent(msg).is_none() {
        let trace = noetl_mesh::ids::trace_id_for(&req.trace_id, &eid);
        if let Some(cx) = noetl_telemetry::root::context(&trace, &eid) {
            noetl_telemetry::propagation::set_parent(&span, cx);
        }
    }
    span
}

/// What a request's playbook is called in diagnostics and the header: its
/// `source_name`, else its catalog path, else `<inline>`.
fn source_name(req: &ExecutionRequest) -> String {
    if !req.source_name.is_empty() {
        req.source_name.clone()
    } else if !req.path.is_empty() {
        req.path.clone()
    } else {
        "<inline>".to_string()
    }
}

/// The request's playbook text and its source name (`path@vN` for a
/// catalog entry), or the source and why the request cannot run.
async fn playbook_text(
    mesh: &Mesh,
    req: &ExecutionRequest,
    source: String,
) -> Result<Result<(String, String), (String, String)>, MeshError> {
    if !req.playbook_yaml.is_empty() {
        return Ok(Ok((req.playbook_yaml.clone(), source)));
    }
    if req.path.is_empty() {
        let why = "the request carries no playbook: set `playbook` (YAML text) or `path`";
        return Ok(Err((source, why.to_string())));
    }
    // The version is resolved once, here: the plan stored keeps it for the
    // whole execution, whatever is registered later.
    let pinned = (req.version > 0).then_some(req.version);
    match mesh.catalog().get(&req.path, pinned).await {
        Ok(entry) => Ok(Ok((
            entry.yaml,
            format!("{}@v{}", entry.path, entry.version),
        ))),
        Err(noetl_mesh::catalog::CatalogError::Mesh(e)) => Err(e),
        Err(e) => Ok(Err((source, e.to_string()))),
    }
}

/// What [`plan_of`] needs.
struct PlanOf<'a> {
    eid: &'a str,
    source: &'a str,
    playbook: Arc<noetl_core::Playbook>,
    /// The request's workload overrides (`null`: none).
    overrides: &'a Value,
    req: &'a ExecutionRequest,
    now_ms: u64,
}

/// The plan of a validated request: the playbook, its workload with the
/// request's overrides merged in, parent links, start time and trace id
/// (the execution id when the request gives none).
fn plan_of(p: PlanOf<'_>) -> PlanRecord {
    let mut workload = Value::Object(p.playbook.workload.clone());
    if !p.overrides.is_null() {
        deep_merge(&mut workload, p.overrides);
    }
    let mut plan = PlanRecord::sharing(
        p.eid.to_string(),
        p.source.to_string(),
        p.playbook,
        workload,
    );
    plan.parent_execution_id = p.req.parent_execution_id.clone();
    plan.started_ms = p.now_ms;
    plan.parent_iter = codec::json_value(&p.req.parent_iter_json).unwrap_or(Value::Null);
    plan.trace_id = noetl_mesh::ids::trace_id_for(&requested_trace(p.req), p.eid);
    plan.return_step = p.req.return_step.clone();
    bound_by_parent(&mut plan.playbook, p.req.timeout_s);
    plan
}

/// A child started by a `playbook` task with `timeout: N` ends within `N`
/// seconds: `N` becomes its `executor.spec.limits.timeout_s` when its own
/// is absent or later, so every limit counted from the execution's start
/// (its timer, the steps' deadlines) uses it.
fn bound_by_parent(playbook: &mut Arc<noetl_core::model::Playbook>, timeout_s: f64) {
    if !(timeout_s.is_finite() && timeout_s > 0.0) {
        return;
    }
    let own = noetl_core::lifecycle::execution_timeout_s(playbook);
    if own.is_some_and(|own| own <= timeout_s) {
        return;
    }
    // This execution's own copy: the shared playbook stays as parsed.
    let executor =
        Arc::make_mut(playbook)
            .executor
            .get_or_insert_with(|| noetl_core::model::Executor {
                kind: None,
                spec: Default::default(),
            });
    let limits = executor
        .spec
        .entry("limits")
        .or_insert_with(|| Value::Object(Default::default()));
    if !limits.is_object() {
        *limits = Value::Object(Default::default());
    }
    limits["timeout_s"] = Value::from(timeout_s);
}

/// The trace a request asks for: its `trace_id`, else the trace of the
/// `traceparent` it was published with (the consume span's), else none.
fn requested_trace(req: &ExecutionRequest) -> String {
    if req.trace_id.is_empty() {
        noetl_telemetry::propagation::current_trace_id().unwrap_or_default()
    } else {
        req.trace_id.clone()
    }
}

/// The execution id a request gets: its own, else `e<stream sequence>` (the
/// publisher reads the sequence from its JetStream ack).
fn execution_id(req: &ExecutionRequest, seq: u64) -> Result<String, HandlerError> {
    if req.execution_id.is_empty() {
        return Ok(format!("e{seq}"));
    }
    if is_valid_execution_id(&req.execution_id) {
        Ok(req.execution_id.clone())
    } else {
        Err(HandlerError::Refused(format!(
            "execution_id {:?} is not usable: use {}",
            req.execution_id,
            noetl_mesh::ids::NAME_RULE
        )))
    }
}

// Over 80 lines on purpose: read, decide, write for one execution request; the decisions
// (source_name, playbook_text, plan_of) are functions with tests.
async fn start(h: &RequestHandler, req: ExecutionRequest, seq: u64) -> Result<(), HandlerError> {
    let (mesh, headers) = (&h.mesh, &*h.headers);
    let eid = execution_id(&req, seq)?;
    let source = source_name(&req);

    let started_ms = match accepted_already(mesh, headers, &eid, &req).await? {
        Found::Accepted => return Ok(()),
        Found::New => now_ms(),
        Found::PlanLost { started_ms } => started_ms,
    };
    if mesh.in_log(&eid).await? {
        return logged_already(mesh, headers, &eid, &req).await;
    }
    // A child: its parent's continuation is kept before anything can fail.
    // This also indexes the child under its parent, so a cancellation of
    // the parent from now on reaches it.
    crate::children::remember(mesh, &eid, &req).await?;
    // A cancellation of the parent before that point listed its children
    // without this one (its request was still in flight): nobody else
    // will cancel it, so it ends here, before its first step.
    if let Some(why) = parent_ended(mesh, &req).await? {
        return end_early(EarlyEnd {
            mesh,
            eid: &eid,
            source: &source,
            req: &req,
            status: ExecStatus::Cancelled,
            reason: why,
        })
        .await;
    }

    let overrides = match codec::json_value(&req.workload_json) {
        Ok(v) => v,
        Err(e) => return fail_early(mesh, &eid, &source, &req, format!("workload: {e}")).await,
    };
    let (yaml, source) = match playbook_text(mesh, &req, source).await? {
        Ok(found) => found,
        Err((source, why)) => return fail_early(mesh, &eid, &source, &req, why).await,
    };
    let playbook = match h.parsed.load(&yaml, &source) {
        Ok(p) => p,
        Err(e) => {
            return fail_early(mesh, &eid, &source, &req, format!("invalid playbook:\n{e}")).await
        }
    };
    if let Some(why) = unresolved_keychain(mesh, &playbook).await? {
        return fail_early(mesh, &eid, &source, &req, why).await;
    }
    let plan = Arc::new(plan_of(PlanOf {
        eid: &eid,
        source: &source,
        playbook,
        overrides: &overrides,
        req: &req,
        now_ms: started_ms,
    }));
    // Create-only: a plan stored by a delivery before this one (stopped
    // before its header, or still running beside this one) stands, with
    // its start time, so the header and the events agree with it.
    let plan = mesh.plans().create(mesh, plan).await?;
    let entry_token = crate::entry::entry_token_id(&eid);
    let entry_step = plan
        .playbook
        .entry_step()
        .map(|s| s.step.clone())
        .unwrap_or_default();
    let header = ExecHeader {
        playbook: plan.playbook.metadata.name.clone(),
        source: source.clone(),
        started_at: noetl_mesh::events::rfc3339_of_ms(plan.started_ms),
        parent_execution_id: req.parent_execution_id.clone(),
        ..ExecHeader::running(eid.clone(), vec![TokenRecord::new(entry_token, entry_step)])
    };
    let key = Keys::header(&eid);
    if let Some(revision) = kv::write_at(mesh.exec_kv(), &key, &header, None).await? {
        headers.remember(&key, header.clone(), revision);
        mesh.health().metrics().execution("started");
    }
    // The parent may have been cancelled while this request was checked:
    // if its cancellation asked this child to stop before the header above
    // existed, that request found nothing. Ask again, now that it counts.
    if let Some(why) = parent_ended(mesh, &req).await? {
        mesh.request_cancel(&eid, why.trim_start_matches("cancelled: "))
            .await?;
        return Ok(());
    }
    enter(mesh, headers, &plan).await?;
    tracing::info!(playbook = %header.playbook, "execution started");
    Ok(())
}

/// A request with no header under an id the log holds. Running by its
/// events: its header was purged, and this is a copy of the request that
/// started it (its first delivery may have stopped before the entry went
/// out): the header comes back from the events and the start goes on as
/// any redelivery's. Ended: its state was compacted, and a second run
/// under it would append a second history to the first one's events, so
/// the request goes to the dead letters instead.
async fn logged_already(
    mesh: &Mesh,
    headers: &kv::RevisionCache<ExecHeader>,
    eid: &str,
    req: &ExecutionRequest,
) -> Result<(), HandlerError> {
    // Written back with its entry token when that never went out
    // (`rebuild::with_entry_owed`).
    if noetl_mesh::rebuild::running_header(mesh, eid)
        .await?
        .is_none()
    {
        return Err(HandlerError::Refused(reused(eid)));
    }
    match accepted_already(mesh, headers, eid, req).await? {
        Found::Accepted => Ok(()),
        Found::New | Found::PlanLost { .. } => Err(HandlerError::Refused(reused(eid))),
    }
}

/// Why a request under `eid`, an id the event log holds already, is not
/// started.
fn reused(eid: &str) -> String {
    format!(
        "execution {eid} exists already (its state was removed; its events remain): \
         a request under its id is not started again; choose another id, or run it \
         again with `noetl exec retry {eid}`"
    )
}

/// What a delivery of a request finds of its execution
/// ([`accepted_already`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Accepted before: its entry went out (again, de-duplicated).
    Accepted,
    /// New: it starts now.
    New,
    /// Its header is there but its plan was lost before its first event
    /// was read back: it starts again from the request as of when it first
    /// started (the header's `started_at`, which the first delivery wrote
    /// with the plan's `started_ms`), so the plan written again is the one
    /// the events of the first delivery, if any got out, were made from.
    PlanLost {
        /// The first start, epoch ms.
        started_ms: u64,
    },
}

/// When an execution whose plan was lost first started: its header's
/// `started_at` (the first delivery writes it and the plan's
/// `started_ms` from one clock reading); `now_ms` when that does not
/// parse.
fn first_started_ms(header: &ExecHeader, now_ms: u64) -> u64 {
    noetl_mesh::events::ms_of_rfc3339(&header.started_at).unwrap_or(now_ms)
}

/// A redelivery of a request already accepted (its header is there): make
/// sure its entry token went out (same id, de-duplicated), and say so.
/// [`Found::New`] when it is new; [`Found::PlanLost`] when its plan was
/// lost before its first event (a router stopped between its header and
/// its events and the plan record was purged since, or a cluster that lost
/// its last writes answers with neither yet): nothing but the request can
/// give the plan back, so the execution starts from it again (the header
/// stays; every id and its start time are the same).
async fn accepted_already(
    mesh: &Mesh,
    headers: &kv::RevisionCache<ExecHeader>,
    eid: &str,
    req: &ExecutionRequest,
) -> Result<Found, HandlerError> {
    let Some(header) = mesh.exec_header(eid).await? else {
        return Ok(Found::New);
    };
    if header.status != ExecStatus::Running {
        // Ended (refused, or over its concurrency limit) by a delivery that
        // stopped before its terminal event went out: the event now, from
        // the header (same id: a duplicate is dropped).
        if !header.terminal_emitted {
            let trace_id = noetl_mesh::ids::trace_id_for(&requested_trace(req), eid);
            match header.ended_before_start() {
                true => emit_early_end(mesh, &header, &trace_id).await?,
                false => crate::ending::emit_terminal(mesh, headers, &header, &trace_id).await?,
            }
        }
        // A child refused before a crash may not have resumed its parent.
        crate::children::resume_parent(mesh, eid).await?;
        return Ok(Found::Accepted);
    }
    if let Some(plan) = accepted_plan(mesh, eid).await? {
        // A `ctx` purged since the first delivery comes back from the
        // events first: `enter` would create it empty, and nothing would
        // write back the keys the events hold.
        noetl_mesh::ctx_record::read(mesh, eid).await?;
        enter(mesh, headers, &plan).await?;
        return Ok(Found::Accepted);
    }
    tracing::warn!(execution_id = %eid, "plan missing before the execution's first event: starting it again from its request");
    Ok(Found::PlanLost {
        started_ms: first_started_ms(&header, now_ms()),
    })
}

/// The plan of an execution whose header is there: stored, or written
/// back from its events; `None` when neither has it (its events were never
/// written: only the request can give it).
async fn accepted_plan(mesh: &Mesh, eid: &str) -> Result<Option<Arc<PlanRecord>>, MeshError> {
    match mesh.plans().get(mesh, eid).await {
        Ok(plan) => Ok(Some(plan)),
        Err(MeshError::NoPlan { .. }) => noetl_mesh::rebuild::restore_plan(mesh, eid).await,
        Err(e) => Err(e),
    }
}

/// Create the empty `ctx` of a new execution, before its entry token
/// goes out: `ctx` exists from the start, so one missing later was lost
/// (and is written back from the events: docs/architecture.md "The event
/// log").
async fn create_ctx(mesh: &Mesh, eid: &str) -> Result<(), MeshError> {
    kv::create(mesh.ctx_kv(), eid, &Value::Object(Default::default())).await?;
    Ok(())
}

/// Start a running execution within its playbook's concurrency limit
/// ([`crate::gates`]): publish its entry when a slot is its, leave it
/// queued (its entry token live, not published), or fail it naming the
/// key, the limit and the executions holding it.
async fn enter(
    mesh: &Mesh,
    headers: &kv::RevisionCache<ExecHeader>,
    plan: &PlanRecord,
) -> Result<(), HandlerError> {
    create_ctx(mesh, &plan.execution_id).await?;
    match crate::gates::admit(mesh, plan).await? {
        crate::gates::Admitted::Go(init) => crate::entry::publish_entry(mesh, plan, init).await?,
        crate::gates::Admitted::Queued => {}
        crate::gates::Admitted::Refused(reason) => {
            let eid = plan.execution_id.as_str();
            tracing::warn!(execution_id = %eid, %reason, "execution refused by its concurrency limit");
            let ended =
                crate::ending::end_running(mesh, headers, eid, ExecStatus::Failed, &reason).await?;
            if let Some(h) = ended {
                crate::ending::emit_terminal(mesh, headers, &h, &plan.trace_id).await?;
            }
        }
    }
    Ok(())
}

/// The request cannot run: record a failed execution with the reason, emit
/// `execution.failed`, and let the message go (nothing is lost: the reason is
/// in the event and in the header).
async fn fail_early(
    mesh: &Mesh,
    eid: &str,
    source: &str,
    req: &ExecutionRequest,
    reason: String,
) -> Result<(), HandlerError> {
    // Bad input, not a fault of the mesh: the reason is in the header and
    // the terminal event, which is what `noetl run` and the API show.
    tracing::info!(execution_id = %eid, source, %reason, "execution refused");
    end_early(EarlyEnd {
        mesh,
        eid,
        source,
        req,
        status: ExecStatus::Failed,
        reason,
    })
    .await?;
    // A refused child still answers its parent's task.
    crate::children::resume_parent(mesh, eid).await?;
    Ok(())
}

/// An execution that ends before its first step.
struct EarlyEnd<'a> {
    mesh: &'a Mesh,
    eid: &'a str,
    source: &'a str,
    req: &'a ExecutionRequest,
    /// `Failed` (refused) or `Cancelled` (its parent ended first).
    status: ExecStatus,
    /// The header's error and the terminal event's.
    reason: String,
}

/// Record the terminal header of an execution that never started, then
/// emit its terminal event ([`emit_early_end`]). The header says the event
/// is owed until it went out: a delivery that stops between the two leaves
/// it to the redelivery ([`accepted_already`]).
async fn end_early(e: EarlyEnd<'_>) -> Result<(), HandlerError> {
    let now = now_rfc3339();
    let header = ExecHeader {
        execution_id: e.eid.to_string(),
        status: e.status,
        playbook: String::new(),
        source: e.source.to_string(),
        live: Vec::new(),
        terminal_emitted: false,
        started_at: now.clone(),
        ended_at: Some(now),
        error: Some(e.reason.clone()),
        parent_execution_id: e.req.parent_execution_id.clone(),
        stopped: Vec::new(),
        resumes: 0,
        resumed_at_ms: 0,
    };
    if kv::create(e.mesh.exec_kv(), &Keys::header(e.eid), &header).await? {
        let ended = match e.status {
            ExecStatus::Cancelled => "cancelled",
            _ => "failed",
        };
        e.mesh.health().metrics().execution(ended);
    }
    let trace_id = noetl_mesh::ids::trace_id_for(&requested_trace(e.req), e.eid);
    emit_early_end(e.mesh, &header, &trace_id).await?;
    if e.status == ExecStatus::Cancelled {
        tracing::info!(execution_id = %e.eid, reason = %e.reason, "execution cancelled before it started");
    }
    Ok(())
}

/// Emit the terminal event of an execution that ended before its first
/// step, as its header tells it (its source rides along: the event is the
/// execution's only one), then record in the header that it went out.
async fn emit_early_end(mesh: &Mesh, header: &ExecHeader, trace_id: &str) -> Result<(), MeshError> {
    let eid = header.execution_id.as_str();
    let ev = EventDraft {
        execution_id: eid,
        trace_id,
        ..Default::default()
    }
    .build(&ExecutionEnded {
        status: match header.status {
            ExecStatus::Cancelled => ExecStatus::Cancelled,
            _ => ExecStatus::Failed,
        },
        error: header.error.clone(),
        source: Some(header.source.clone()),
        stopped: Vec::new(),
    });
    mesh.emit(&ev).await?.wait().await?;
    kv::update(
        mesh.exec_kv(),
        &Keys::header(eid),
        |h: Option<&ExecHeader>| match h {
            Some(h) if !h.terminal_emitted => {
                let mut h = h.clone();
                h.terminal_emitted = true;
                kv::Cas::Write(h)
            }
            _ => kv::Cas::Keep,
        },
    )
    .await?;
    Ok(())
}

/// `Some(reason)` when the request is a child whose parent is no longer
/// running (cancelled, or ended some other way): the child must not run.
async fn parent_ended(mesh: &Mesh, req: &ExecutionRequest) -> Result<Option<String>, MeshError> {
    let parent = req.parent_execution_id.as_str();
    if parent.is_empty() {
        return Ok(None);
    }
    let Some(h) = mesh.exec_header(parent).await? else {
        return Ok(None);
    };
    Ok(match h.status {
        ExecStatus::Running => None,
        ExecStatus::Cancelled => Some(format!(
            "cancelled: parent execution {parent} was cancelled"
        )),
        ExecStatus::Completed => Some(format!(
            "cancelled: parent execution {parent} had already completed"
        )),
        ExecStatus::Failed => Some(format!(
            "cancelled: parent execution {parent} had already failed"
        )),
    })
}

/// Every credential the playbook's `keychain` declares must be stored, with
/// the declared kind, before the first step runs. `Some(reason)` otherwise,
/// naming every missing entry (never a value).
async fn unresolved_keychain(
    mesh: &Mesh,
    playbook: &noetl_core::model::Playbook,
) -> Result<Option<String>, MeshError> {
    if playbook.keychain.is_empty() {
        return Ok(None);
    }
    let mut problems = Vec::new();
    for entry in &playbook.keychain {
        // Resolved when used; the credentials it names (`auth`...), when
        // plain names, must be stored.
        if noetl_core::validate::SERVICE_KEYCHAIN_KINDS.contains(&entry.kind.as_str()) {
            for field in noetl_core::validate::credential_fields(&entry.kind) {
                let named = entry.extra.get(*field).and_then(serde_json::Value::as_str);
                if let Some(cred) = named.filter(|a| !noetl_core::template::is_template(a)) {
                    if stored_kind(mesh, cred).await?.is_none() {
                        problems.push(format!(
                            "`{}` ({}) names `{field}: {cred}`, which is not stored; add it with `noetl credential put {cred} --kind secret --from-file FILE.json`",
                            entry.name, entry.kind
                        ));
                    }
                }
            }
            continue;
        }
        match stored_kind(mesh, &entry.name).await? {
            Some(kind) if kind == entry.kind => {}
            Some(kind) => problems.push(format!(
                "`{}` is declared as {} but stored as {kind}",
                entry.name, entry.kind
            )),
            None => problems.push(format!(
                "`{}` ({}) is not stored; add it with `noetl credential put {} --kind {} --from-file FILE.json`",
                entry.name, entry.kind, entry.name, entry.kind
            )),
        }
    }
    Ok((!problems.is_empty())
        .then(|| format!("keychain cannot be resolved: {}", problems.join("; "))))
}

/// The kind credential `name` is stored as, `None` when it is not stored.
/// A read that fails is an error (the request is delivered again), never
/// taken for a credential that is missing: that would fail the execution.
async fn stored_kind(mesh: &Mesh, name: &str) -> Result<Option<String>, MeshError> {
    mesh.vault().kind_of(name).await.map_err(|e| MeshError::Kv {
        bucket: mesh.subjects().credentials_bucket(),
        key: name.to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str) -> ExecutionRequest {
        ExecutionRequest {
            execution_id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_execution_is_named_by_its_request_or_its_stream_sequence() {
        assert_eq!(execution_id(&request(""), 42).unwrap(), "e42");
        assert_eq!(
            execution_id(&request("nightly-2026_11"), 42).unwrap(),
            "nightly-2026_11"
        );
    }

    #[test]
    fn a_request_s_source_is_its_name_its_path_or_inline() {
        let mut r = request("");
        assert_eq!(source_name(&r), "<inline>");
        r.path = "examples/hotels".into();
        assert_eq!(source_name(&r), "examples/hotels");
        r.source_name = "hotels.yaml".into();
        assert_eq!(source_name(&r), "hotels.yaml");
    }

    #[test]
    fn a_parent_task_s_timeout_bounds_the_child_unless_its_own_is_earlier() {
        let playbook = |limits: serde_json::Value| -> Arc<noetl_core::model::Playbook> {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "noetl.io/v2", "kind": "Playbook", "metadata": {"name": "c"},
                "executor": {"spec": {"limits": limits}},
                "workflow": [{"step": "start"}],
            }))
            .unwrap()
        };
        let own = |p: &noetl_core::model::Playbook| noetl_core::lifecycle::execution_timeout_s(p);
        let mut p = playbook(serde_json::json!({"max_loop_items": 5}));
        let shared = p.clone();
        bound_by_parent(&mut p, 30.0);
        assert_eq!(own(&shared), None, "the shared playbook is not changed");
        assert_eq!(own(&p), Some(30.0));
        assert_eq!(
            p.executor.as_ref().unwrap().spec["limits"]["max_loop_items"],
            5
        );
        let mut p = playbook(serde_json::json!({"timeout_s": 10}));
        bound_by_parent(&mut p, 30.0);
        assert_eq!(own(&p), Some(10.0), "the child's own earlier limit stays");
        let mut p = playbook(serde_json::json!({"timeout_s": 60}));
        bound_by_parent(&mut p, 30.0);
        assert_eq!(own(&p), Some(30.0));
        let mut p = playbook(serde_json::json!({}));
        bound_by_parent(&mut p, 0.0);
        assert_eq!(own(&p), None, "no timeout asked: no limit added");
    }

    #[test]
    fn a_plan_merges_the_request_workload_and_defaults_its_trace_to_the_execution() {
        let playbook: noetl_core::Playbook = serde_json::from_value(serde_json::json!({
            "apiVersion": "noetl.io/v2",
            "kind": "Playbook",
            "metadata": {"name": "p"},
            "workload": {"a": 1, "nested": {"x": 1, "y": 2}},
            "workflow": [{"step": "start"}],
        }))
        .unwrap();
        let mut req = request("e9");
        req.parent_execution_id = "parent".into();
        let overrides = serde_json::json!({"nested": {"y": 3}, "b": true});
        let plan = plan_of(PlanOf {
            eid: "e9",
            source: "p.yaml",
            playbook: Arc::new(playbook),
            overrides: &overrides,
            req: &req,
            now_ms: 42,
        });
        assert_eq!(
            plan.workload,
            serde_json::json!({"a": 1, "nested": {"x": 1, "y": 3}, "b": true})
        );
        assert_eq!(plan.started_ms, 42);
        assert_eq!(plan.trace_id, noetl_mesh::ids::trace_id_for("", "e9"));
        assert_eq!(plan.parent_execution_id, "parent");
        assert!(plan.parent_iter.is_null());
    }

    #[test]
    fn a_plan_started_again_from_its_request_keeps_the_first_start() {
        // The first delivery writes the header's start and the plan's from
        // one reading: read back, the plan written again is the same.
        let header = ExecHeader {
            started_at: noetl_mesh::events::rfc3339_of_ms(1_796_390_088_688),
            ..ExecHeader::running("e1".to_string(), Vec::new())
        };
        assert_eq!(first_started_ms(&header, 7), 1_796_390_088_688);
        let unreadable = ExecHeader {
            started_at: "soon".into(),
            ..header
        };
        assert_eq!(first_started_ms(&unreadable, 7), 7);
    }

    #[test]
    fn an_unusable_execution_id_is_refused_naming_it() {
        for bad in ["a.b", "a b", "x>", &"x".repeat(129)] {
            match execution_id(&request(bad), 1) {
                Err(HandlerError::Refused(r)) => assert!(r.contains("is not usable"), "{r}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
