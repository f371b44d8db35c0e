//! `GET /api/executions`, `GET /api/executions/{id}`, `.../status`,
//! `POST .../cancel`, `GET .../results/{step}`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::{Extension, Json};
use noetl_mesh::keys::Keys;
use noetl_mesh::objects::is_ref;
use noetl_mesh::state::{ExecHeader, ExecStatus, StepRecord, StepStatus};
use noetl_mesh::{kv, kv_batch, Mesh};
use serde_json::Value;

use crate::audit::{audited, Change};
use crate::auth::Principal;
use crate::contract::executions::{
    CancelRequest, CancelResponse, ExecutionDetail, ExecutionStatus, ExecutionSummary,
    ListExecutionsQuery, StepResultResponse,
};
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::{ExecutionAndName, ExecutionId, OptionalBody, Params};
use crate::handlers::{absent_plan, header, plan_of};
use crate::read::{step_result, stored, Stored};
use crate::shape::events::execution_event;
use crate::shape::executions::{catalog_source, filter, select};
use crate::shape::status::{completed_steps, duration, progress, status_name, step_name};
use crate::state::AppState;

/// Events `GET /api/executions/{id}` returns at most (the last ones).
pub const MAX_EVENTS: usize = 2000;

/// Recent executions, newest first.
#[utoipa::path(get, path = "/api/executions", tag = "executions",
    params(ListExecutionsQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of executions", body = Vec<ExecutionSummary>),
        (status = 422, description = "A status that is not one", body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Params(q): Params<ListExecutionsQuery>,
) -> Result<Json<Vec<ExecutionSummary>>, ApiError> {
    let f = filter(&q)?;
    let mut headers = Vec::new();
    for (key, h) in state.mesh.listed_executions().await? {
        match h {
            Ok(h) => headers.push(h),
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "skipping an execution header that does not decode")
            }
        }
    }
    let mut page = select(&headers, &f);
    // What holds a running execution back, as `noetl exec why` says.
    if page.iter().any(|e| e.status == "RUNNING") {
        let paused = state.mesh.paused_executions().await?;
        let queued = state.mesh.queued_executions().await?;
        for e in page.iter_mut().filter(|e| e.status == "RUNNING") {
            e.is_paused = paused.contains(&e.execution_id);
            e.is_queued = queued.contains(&e.execution_id);
        }
    }
    Ok(Json(page))
}

/// One execution: status, workload, `ctx` and its last 2,000 events.
#[utoipa::path(get, path = "/api/executions/{id}", tag = "executions",
    params(("id" = String, Path, description = "Execution id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The execution", body = ExecutionDetail),
        (status = 404, description = "No such execution", body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    ExecutionId(id): ExecutionId,
) -> Result<Json<ExecutionDetail>, ApiError> {
    let mesh = &state.mesh;
    let h = header(mesh, &id).await?;
    let workload = plan_of(mesh, &id).await?.map(|p| p.workload.clone());
    let (event_count, events) = stored(
        mesh,
        Stored {
            filter: mesh.subjects().events_of(&id),
            after: 0,
            keep_last: MAX_EVENTS,
        },
    )
    .await?;
    let (catalog_id, path) = catalog_source(&h.source);
    Ok(Json(ExecutionDetail {
        execution_id: h.execution_id.clone(),
        catalog_id,
        path,
        status: status_name(h.status).into(),
        is_paused: mesh.pauses().await?.is_paused(&id),
        is_queued: h.status == ExecStatus::Running && mesh.is_queued(&id).await?,
        started_at: h.started_at.clone(),
        completed_at: h.ended_at.clone(),
        parent_execution_id: Some(h.parent_execution_id.clone()).filter(|p| !p.is_empty()),
        workload,
        ctx: mesh.exec_ctx(&id).await?,
        error: h.error.clone(),
        event_count,
        events: events.iter().map(execution_event).collect(),
    }))
}

/// The step statuses of one execution: each step of its plan with its
/// latest status (none before the router stored the plan).
type Steps = std::sync::Arc<BTreeMap<String, Option<StepStatus>>>;

/// What a status answer is built from.
struct Snapshot {
    header: ExecHeader,
    steps: Steps,
    /// The workflow's steps in order.
    order: std::sync::Arc<Vec<String>>,
}

/// An execution's header, step statuses and steps' order: the keys from
/// this replica's view when it holds the execution ([`crate::view`]);
/// else, where the bucket allows direct gets, one batched request for the
/// header and every step record (which completes the view); else the
/// header, then the step records at once, reused per header revision.
/// The steps' order (the plan's, which names the steps) is kept per
/// execution; the plan is read beside the keys when it is not, so a
/// first read waits for one round trip, not two.
async fn snapshot(state: &AppState, id: &str) -> Result<Snapshot, ApiError> {
    crate::handlers::valid_id(id)?;
    let mesh = &state.mesh;
    let cached = state.step_order.get(id);
    let plan = async {
        match cached {
            Some(_) => None,
            None => Some(mesh.plans().get(mesh, id).await),
        }
    };
    let (keys, plan) = tokio::join!(exec_keys(state, id), plan);
    let Some(mut by_key) = keys? else {
        let Some((header, revision)) = header_at(mesh, id).await? else {
            return from_events(state, id, cached, plan).await;
        };
        let key = (id.to_string(), revision);
        let steps = match state.step_statuses.get(&key) {
            Some(steps) => steps,
            None => {
                let steps = std::sync::Arc::new(step_statuses(mesh, id).await?);
                state.step_statuses.insert(key, steps.clone());
                steps
            }
        };
        let order = order_of(state, &header, cached, plan).await?;
        return Ok(Snapshot {
            header,
            steps,
            order,
        });
    };
    let header_key = Keys::header(id);
    let header: ExecHeader = match by_key.remove(&header_key) {
        Some(bytes) => decode(mesh, &header_key, &bytes)?,
        None => return from_events(state, id, cached, plan).await,
    };
    let order = order_of(state, &header, cached, plan).await?;
    let mut steps = BTreeMap::new();
    for step in order.iter() {
        let key = Keys::step(id, step);
        let status = match by_key.get(&key) {
            Some(bytes) => Some(decode::<StepRecord>(mesh, &key, bytes)?.status),
            None => None,
        };
        steps.insert(step.clone(), status);
    }
    Ok(Snapshot {
        header,
        steps: std::sync::Arc::new(steps),
        order,
    })
}

/// Execution `id`'s header and step records by key: from this replica's
/// view, else one batched request (which completes the view); `None`
/// where the bucket does not allow direct gets.
async fn exec_keys(
    state: &AppState,
    id: &str,
) -> Result<Option<std::collections::HashMap<String, bytes::Bytes>>, ApiError> {
    if let Some(keys) = state.view.read(id) {
        return Ok(Some(keys.into_iter().map(|(k, (v, _))| (k, v)).collect()));
    }
    let mesh = &state.mesh;
    let generation = state.view.generation();
    let patterns = [Keys::header(id), Keys::steps_of(id)];
    let Some(values) = kv_batch::last_values(mesh.client(), mesh.exec_kv(), &patterns).await?
    else {
        return Ok(None);
    };
    let values: Vec<(String, bytes::Bytes, u64)> = values
        .into_iter()
        .map(|kv| (kv.key, kv.value, kv.revision))
        .collect();
    if let Some(g) = generation {
        state.view.complete(id, g, &values);
    }
    Ok(Some(values.into_iter().map(|(k, v, _)| (k, v)).collect()))
}

/// A KV value of the exec bucket, decoded.
fn decode<T: serde::de::DeserializeOwned>(
    mesh: &Mesh,
    key: &str,
    bytes: &[u8],
) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        noetl_mesh::MeshError::Corrupt {
            bucket: mesh.exec_kv().name.clone(),
            key: key.to_string(),
            message: e.to_string(),
        }
        .into()
    })
}

/// The snapshot of an execution whose header is missing: of a running
/// one, the header its events give (read only) with the step records
/// there are; else 404 ([`crate::handlers::header`]).
async fn from_events(
    state: &AppState,
    id: &str,
    cached: Option<(u32, std::sync::Arc<Vec<String>>)>,
    plan: Option<Result<std::sync::Arc<noetl_mesh::plan::PlanRecord>, noetl_mesh::MeshError>>,
) -> Result<Snapshot, ApiError> {
    let header = crate::handlers::header(&state.mesh, id).await?;
    let steps = std::sync::Arc::new(step_statuses(&state.mesh, id).await?);
    let order = order_of(state, &header, cached, plan).await?;
    Ok(Snapshot {
        header,
        steps,
        order,
    })
}

/// Each step of the execution's plan with its latest status (none before
/// the router stored the plan), read key by key: the step records at once.
async fn step_statuses(
    mesh: &Mesh,
    id: &str,
) -> Result<BTreeMap<String, Option<StepStatus>>, ApiError> {
    let Some(plan) = plan_of(mesh, id).await? else {
        return Ok(BTreeMap::new());
    };
    let reads = plan.playbook.workflow.iter().map(|step| async move {
        let rec: Option<StepRecord> = kv::get(mesh.exec_kv(), &Keys::step(id, &step.step)).await?;
        Ok::<_, noetl_mesh::MeshError>((step.step.clone(), rec.map(|r| r.status)))
    });
    let mut out = BTreeMap::new();
    for read in futures::future::join_all(reads).await {
        let (step, status) = read?;
        out.insert(step, status);
    }
    Ok(out)
}

/// An execution's header and its revision, if stored.
async fn header_at(mesh: &Mesh, id: &str) -> Result<Option<(ExecHeader, u64)>, ApiError> {
    Ok(kv::read::<ExecHeader>(mesh.exec_kv(), &Keys::header(id)).await?)
}

/// A read of an execution's `ctx` record, with the view's generation
/// taken before it (to complete the view's entry with it).
struct CtxRead {
    generation: Option<u64>,
    read: Option<(Value, u64)>,
}

async fn read_ctx(state: &AppState, id: &str) -> Result<CtxRead, ApiError> {
    let generation = state.ctx_view.generation();
    let read = kv::read::<Value>(state.mesh.ctx_kv(), id).await?;
    Ok(CtxRead { generation, read })
}

/// The `ctx` read a status answer will need, begun beside the header's
/// read when the view does not hold the execution (the first read of it):
/// one round trip instead of two in a row.
async fn ctx_early(state: &AppState, id: &str) -> Option<CtxRead> {
    if state.ctx_view.holds(id) {
        return None;
    }
    read_ctx(state, id).await.ok()
}

/// An execution's `ctx` as the status answer shows it (`variables`):
/// from the replica's view of the ctx records while it runs, else one
/// read (`early`, when it was begun beside the header's), which completes
/// the view's entry. The view may trail the header's end by the watch's
/// delay, so an ended execution's `ctx` comes from a read made after that
/// end (marked in the entry by `ended_at`): an early read, begun before
/// the header was seen ended, is not used for it.
async fn variables(
    state: &AppState,
    id: &str,
    ended_at: Option<&str>,
    early: Option<CtxRead>,
) -> Result<Value, ApiError> {
    let store = state.mesh.ctx_kv();
    let end_mark = format!("{id}.ended");
    let held = state.ctx_view.read(id).filter(|keys| match ended_at {
        None => true,
        Some(end) => keys
            .get(&end_mark)
            .is_some_and(|(v, _)| v.as_ref() == end.as_bytes()),
    });
    let stored = match held {
        Some(keys) => keys
            .get(id)
            .map(|(bytes, _)| serde_json::from_slice::<Value>(bytes))
            .transpose()
            .map_err(|e| noetl_mesh::MeshError::Corrupt {
                bucket: store.name.clone(),
                key: id.to_string(),
                message: e.to_string(),
            })?,
        None => {
            let CtxRead { generation, read } = match early {
                Some(early) if ended_at.is_none() => early,
                _ => read_ctx(state, id).await?,
            };
            if let Some(g) = generation {
                let mut values: Vec<(String, bytes::Bytes, u64)> = read
                    .iter()
                    .map(|(v, revision)| (id.to_string(), v.to_string().into(), *revision))
                    .collect();
                if let Some(end) = ended_at {
                    // A later end (after a resume) replaces the mark.
                    let at = noetl_mesh::events::ms_of_rfc3339(end).unwrap_or(0);
                    values.push((end_mark, end.to_string().into(), at));
                }
                state.ctx_view.complete(id, g, &values);
            }
            read.map(|(v, _)| v)
        }
    };
    Ok(noetl_mesh::state::user_ctx(
        stored.unwrap_or_else(|| Value::Object(Default::default())),
    ))
}

/// The workflow's steps in order: `cached` when it was read at the
/// header's resume count; else from the plan (`plan`, when its read was
/// begun beside the header's), kept for that resume count; none when
/// there is no plan (yet); an error when it cannot be read.
async fn order_of(
    state: &AppState,
    h: &ExecHeader,
    cached: Option<(u32, std::sync::Arc<Vec<String>>)>,
    plan: Option<Result<std::sync::Arc<noetl_mesh::plan::PlanRecord>, noetl_mesh::MeshError>>,
) -> Result<std::sync::Arc<Vec<String>>, ApiError> {
    if let Some((_, order)) = cached.filter(|(resumes, _)| *resumes == h.resumes) {
        return Ok(order);
    }
    let plan = match plan {
        Some(read) => read,
        None => state.mesh.plans().get(&state.mesh, &h.execution_id).await,
    };
    let Some(plan) = absent_plan(plan)? else {
        return Ok(std::sync::Arc::new(Vec::new()));
    };
    let order = std::sync::Arc::new(
        plan.playbook
            .workflow
            .iter()
            .map(|s| s.step.clone())
            .collect::<Vec<_>>(),
    );
    state
        .step_order
        .insert(h.execution_id.clone(), (h.resumes, order.clone()));
    Ok(order)
}

/// An execution's status and step counts (what NoETL's clients poll).
#[utoipa::path(get, path = "/api/executions/{id}/status", tag = "executions",
    params(("id" = String, Path, description = "Execution id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Its status", body = ExecutionStatus),
        (status = 404, description = "No such execution", body = ErrorBody),
        (status = 500, description = "A stored record (its header, plan, a step) is corrupt (the key named)", body = ErrorBody)))]
pub async fn status(
    State(state): State<AppState>,
    ExecutionId(id): ExecutionId,
) -> Result<Json<ExecutionStatus>, ApiError> {
    let (snap, early) = tokio::join!(snapshot(&state, &id), ctx_early(&state, &id));
    let Snapshot {
        header: h,
        steps,
        order,
    } = snap?;
    let live: Vec<String> = h.live.iter().map(|t| t.step.clone()).collect();
    let now_ms = noetl_mesh::events::now_ms();
    let took = duration(&h.started_at, h.ended_at.as_deref(), now_ms);
    use noetl_mesh::state::ExecStatus;
    Ok(Json(ExecutionStatus {
        completed: h.status.is_terminal(),
        failed: matches!(h.status, ExecStatus::Failed | ExecStatus::Cancelled),
        completed_steps: completed_steps(&order, &steps),
        variables: variables(&state, &id, h.ended_at.as_deref(), early).await?,
        start_time: h.started_at.clone(),
        end_time: h.ended_at.clone(),
        duration_seconds: took.as_ref().map(|t| t.0),
        duration_human: took.map(|t| t.1),
        execution_id: h.execution_id.clone(),
        status: status_name(h.status).into(),
        current_step: live.last().cloned(),
        progress: progress(&steps, &live),
        is_cancelled: h.status == noetl_mesh::state::ExecStatus::Cancelled,
        is_paused: state.mesh.pauses().await?.is_paused(&id),
        error: h.error.clone(),
        steps: steps
            .iter()
            .map(|(k, v)| (k.clone(), step_name(*v).to_string()))
            .collect(),
    }))
}

/// Ask the router to cancel a running execution and its children (the
/// body, with a `reason`, is optional).
#[utoipa::path(post, path = "/api/executions/{id}/cancel", tag = "executions",
    params(("id" = String, Path, description = "Execution id")),
    request_body(content = CancelRequest, description = "Optional"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Cancellation requested", body = CancelResponse),
        (status = 403, description = "Viewer", body = ErrorBody),
        (status = 404, description = "No such execution", body = ErrorBody),
        (status = 422, description = "It has ended already", body = ErrorBody)))]
pub async fn cancel(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ExecutionId(id): ExecutionId,
    OptionalBody(req): OptionalBody<CancelRequest>,
) -> Result<Json<CancelResponse>, ApiError> {
    let done = async {
        let h = header(&state.mesh, &id).await?;
        if h.status.is_terminal() {
            return Err(ApiError::invalid(format!(
                "Cannot cancel execution in {} state",
                status_name(h.status)
            )));
        }
        state.mesh.request_cancel(&id, &req.reason).await?;
        let mut ids = vec![id.clone()];
        for key in kv::keys_under(state.mesh.exec_kv(), &Keys::children(&id)).await? {
            if let Some(child) = Keys::child_of(&id, &key) {
                ids.push(child.to_string());
            }
        }
        Ok(ids)
    }
    .await;
    let change = Change {
        principal: &principal,
        action: "execution.cancel",
        target: &id,
    };
    let cancelled_executions = audited(&state, change, done).await?;
    Ok(Json(CancelResponse {
        execution_id: id,
        status: "cancelled".into(),
        message: "Execution cancellation requested".into(),
        cancelled_executions,
    }))
}

/// A step's last result; one stored by reference is read from the object
/// store (its checksum verified).
#[utoipa::path(get, path = "/api/executions/{id}/results/{step}", tag = "executions",
    params(("id" = String, Path, description = "Execution id"),
           ("step" = String, Path, description = "Step name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The result", body = StepResultResponse),
        (status = 404, description = "No such execution or step, no result yet, or its object is gone", body = ErrorBody)))]
pub async fn result(
    State(state): State<AppState>,
    ExecutionAndName(id, step): ExecutionAndName,
) -> Result<Json<StepResultResponse>, ApiError> {
    let mesh = &state.mesh;
    header(mesh, &id).await?;
    if let Some(plan) = plan_of(mesh, &id).await? {
        if !plan.playbook.workflow.iter().any(|s| s.step == step) {
            return Err(ApiError::NotFound(format!(
                "execution {id} has no step `{step}`"
            )));
        }
    }
    let stored = step_result(mesh, &id, &step).await?.ok_or_else(|| {
        ApiError::NotFound(format!(
            "step `{step}` of execution {id} has no result (not run, not done yet, or it ended without one)"
        ))
    })?;
    let by_reference = is_ref(&stored);
    let truncated = !by_reference && stored.get("truncated") == Some(&Value::Bool(true));
    let result = mesh.results().hydrate(stored).await?;
    Ok(Json(StepResultResponse {
        execution_id: id,
        step,
        result,
        by_reference,
        truncated,
    }))
}
