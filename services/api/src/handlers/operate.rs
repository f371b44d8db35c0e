//! `POST /api/executions/{id}/pause` and `.../unpause`: hold new steps and
//! loop iterations of a running execution, and go on
//! ([`noetl_mesh::pause`]); `POST /api/executions/{id}/signals/{name}`:
//! continue a `wait` task ([`noetl_mesh::signal`]); `POST
//! /api/executions/{id}/resume`: a failed or cancelled execution goes on
//! where it stopped ([`noetl_mesh::resume`]).

use axum::extract::State;
use axum::{Extension, Json};

use crate::audit::{audited, Change};
use crate::auth::Principal;
use crate::contract::executions::{
    PauseRequest, PauseResponse, ResumeRequest, ResumeResponse, SignalResponse,
};
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::{AnyJson, ExecutionAndSignal, ExecutionId, OptionalBody};
use crate::handlers::header;
use crate::shape::status::status_name;
use crate::state::AppState;

/// Pause a running execution: no new step or loop iteration starts; what
/// runs finishes.
#[utoipa::path(post, path = "/api/executions/{id}/pause", tag = "executions",
    params(("id" = String, Path, description = "Execution id")),
    request_body(content = PauseRequest, description = "Optional"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Paused (or paused already)", body = PauseResponse),
        (status = 403, description = "Viewer", body = ErrorBody),
        (status = 404, description = "No such execution", body = ErrorBody),
        (status = 422, description = "It has ended", body = ErrorBody)))]
pub async fn pause(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ExecutionId(id): ExecutionId,
    OptionalBody(req): OptionalBody<PauseRequest>,
) -> Result<Json<PauseResponse>, ApiError> {
    let done = async {
        let h = header(&state.mesh, &id).await?;
        if h.status.is_terminal() {
            return Err(ApiError::invalid(format!(
                "Cannot pause execution in {} state",
                status_name(h.status)
            )));
        }
        Ok(state.mesh.pause(&id, &principal.name, &req.reason).await?)
    }
    .await;
    let change = Change {
        principal: &principal,
        action: "execution.pause",
        target: &id,
    };
    let changed = audited(&state, change, done).await?;
    Ok(Json(PauseResponse {
        execution_id: id,
        paused: true,
        changed: Some(changed),
        released: None,
    }))
}

/// Unpause an execution: what its pause held goes on (idempotent).
#[utoipa::path(post, path = "/api/executions/{id}/unpause", tag = "executions",
    params(("id" = String, Path, description = "Execution id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Unpaused", body = PauseResponse),
        (status = 403, description = "Viewer", body = ErrorBody),
        (status = 404, description = "No such execution", body = ErrorBody)))]
pub async fn unpause(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ExecutionId(id): ExecutionId,
) -> Result<Json<PauseResponse>, ApiError> {
    let done = async {
        header(&state.mesh, &id).await?;
        Ok(state.mesh.unpause(&id, &principal.name).await?)
    }
    .await;
    let change = Change {
        principal: &principal,
        action: "execution.unpause",
        target: &id,
    };
    let released = audited(&state, change, done).await?;
    Ok(Json(PauseResponse {
        execution_id: id,
        paused: false,
        changed: None,
        released: Some(released),
    }))
}

/// Send a signal: the body (any JSON; `{}` when empty) is the waiting
/// `wait` task's result, when it fits the task's schema.
#[utoipa::path(post, path = "/api/executions/{id}/signals/{name}", tag = "executions",
    params(("id" = String, Path, description = "Execution id"),
           ("name" = String, Path, description = "The signal: 1-128 characters of [A-Za-z0-9_-]")),
    request_body(content = serde_json::Value, description = "The data (optional)"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Delivered: the step goes on", body = SignalResponse),
        (status = 403, description = "Viewer", body = ErrorBody),
        (status = 404, description = "No such execution, or no step waits for the signal", body = ErrorBody),
        (status = 422, description = "The data does not fit the wait's schema", body = ErrorBody)))]
pub async fn signal(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ExecutionAndSignal(id, name): ExecutionAndSignal,
    AnyJson(data): AnyJson,
) -> Result<Json<SignalResponse>, ApiError> {
    use noetl_mesh::signal::SignalError;
    let data = if data.is_null() {
        serde_json::json!({})
    } else {
        data
    };
    let done = async {
        header(&state.mesh, &id).await?;
        state
            .mesh
            .signal(&id, &name, data, &principal.name)
            .await
            .map_err(|e| match e {
                SignalError::NoWaiter { .. } => ApiError::NotFound(e.to_string()),
                SignalError::Invalid { .. } => ApiError::invalid(e.to_string()),
                SignalError::BadName { .. } => ApiError::BadRequest(e.to_string()),
                SignalError::Mesh(m) => m.into(),
            })
    }
    .await;
    let change = Change {
        principal: &principal,
        action: "execution.signal",
        target: &id,
    };
    let w = audited(&state, change, done).await?;
    Ok(Json(SignalResponse {
        execution_id: id,
        signal: name,
        step: w.step,
        task: w.task,
    }))
}

/// Resume a failed or cancelled execution where it stopped (docs/operations.md
/// "Resume where it stopped"); answers once a router has recorded it.
#[utoipa::path(post, path = "/api/executions/{id}/resume", tag = "executions",
    params(("id" = String, Path, description = "Execution id")),
    request_body(content = ResumeRequest, description = "Optional"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Resumed", body = ResumeResponse),
        (status = 403, description = "Viewer", body = ErrorBody),
        (status = 404, description = "No such execution", body = ErrorBody),
        (status = 422, description = "It cannot be resumed (the reason)", body = ErrorBody),
        (status = 503, description = "No router recorded it in time", body = ErrorBody)))]
pub async fn resume(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ExecutionId(id): ExecutionId,
    OptionalBody(req): OptionalBody<ResumeRequest>,
) -> Result<Json<ResumeResponse>, ApiError> {
    use noetl_mesh::resume::{ResumeError, ResumeRequested};
    let done = async {
        let ask = ResumeRequested {
            expect_resumes: 0, // set from the header `resume` reads
            from: req.from,
            set: req.set,
            playbook_version: req.playbook_version,
            by: principal.name.clone(),
        };
        let within = std::time::Duration::from_secs(30);
        let prepared = state.mesh.resume(&id, ask, within).await;
        let p = prepared.map_err(|e| match e {
            ResumeError::Mesh(m) => m.into(),
            // As every route words an unknown execution.
            ResumeError::NotFound(_) => ApiError::NotFound(format!("Execution not found: {id}")),
            ResumeError::NotRecorded { .. } => ApiError::Unavailable(e.to_string()),
            other => ApiError::invalid(other.to_string()),
        })?;
        Ok((p.header.resumes + 1, p.decision))
    }
    .await;
    let change = Change {
        principal: &principal,
        action: "execution.resume",
        target: &id,
    };
    let (resumes, d) = audited(&state, change, done).await?;
    Ok(Json(ResumeResponse {
        execution_id: id,
        resumes,
        steps: d.tokens.into_iter().map(|t| t.step).collect(),
        superseded: d.superseded.into_iter().map(|(s, _)| s).collect(),
    }))
}
