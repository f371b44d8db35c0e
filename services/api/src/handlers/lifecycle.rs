//! `POST /api/executions/{id}/rerun` (NoETL's `execute rerun`, this
//! engine's `noetl exec retry`: a new execution of the same playbook with
//! the same workload) and `POST /api/executions/cleanup` (the KV state of
//! executions that ended long enough ago removed; their events stay).

use axum::extract::State;
use axum::{Extension, Json};
use noetl_mesh::state::ExecHeader;
use noetl_mesh::{codec, ids::new_execution_id};

use crate::audit::{audited, Change};
use crate::auth::Principal;
use crate::contract::executions::{CleanupRequest, CleanupResponse, RerunRequest, RerunResponse};
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::{ExecutionId, OptionalBody};
use crate::handlers::execute::accepted;
use crate::handlers::valid_id;
use crate::shape::catalog::parse_catalog_id;
use crate::state::AppState;

/// Run an execution's playbook again, with its workload (and the body's
/// `workload` over it), as a new execution.
#[utoipa::path(post, path = "/api/executions/{id}/rerun", tag = "executions",
    params(("id" = String, Path, description = "Execution id")),
    request_body(content = RerunRequest, description = "Optional"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The new execution", body = RerunResponse),
        (status = 403, description = "Viewer", body = ErrorBody),
        (status = 404, description = "No such execution", body = ErrorBody),
        (status = 422, description = "It was refused before it started (no plan), or another resource kind", body = ErrorBody),
        (status = 500, description = "Its stored plan is corrupt (the key named)", body = ErrorBody)))]
pub async fn rerun(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ExecutionId(id): ExecutionId,
    OptionalBody(req): OptionalBody<RerunRequest>,
) -> Result<Json<RerunResponse>, ApiError> {
    let mesh = &state.mesh;
    let done = async {
        if let Some(kind) = req.resource_kind.as_deref() {
            if !kind.eq_ignore_ascii_case("playbook") {
                return Err(ApiError::invalid(format!(
                    "resource_kind {}: this engine reruns playbooks only",
                    crate::shape::params::shown(kind)
                )));
            }
        }
        valid_id(&id)?;
        // Its KV state compacted or purged: what its events give.
        let again = (mesh.run_again_of(&id).await?)
            .ok_or_else(|| ApiError::NotFound(format!("Execution not found: {id}")))?;
        let h = again.header;
        let plan = again.plan.ok_or_else(|| {
            ApiError::invalid(format!(
                "execution {id} has no stored plan (it was refused before it started: {}); start the playbook again",
                h.error.as_deref().unwrap_or("no error recorded")
            ))
        })?;
        let request = noetl_mesh::rerun::request(&h, &plan, &req.workload, new_execution_id())?;
        mesh.publish(
            mesh.subjects().exec_request(),
            &request.execution_id,
            codec::encode(&request),
        )
        .await?
        .wait()
        .await?;
        Ok((request.execution_id, parse_catalog_id(&h.source).map(|_| h.source)))
    }
    .await;
    let target = match &done {
        Ok((new, _)) => new.clone(),
        Err(_) => id.clone(),
    };
    let change = Change {
        principal: &principal,
        action: "execution.rerun",
        target: &target,
    };
    let (new_id, catalog_id) = audited(&state, change, done).await?;
    let taken = accepted(mesh, &[&new_id]).await;
    Ok(Json(RerunResponse {
        status: if taken.contains(&new_id) {
            "started"
        } else {
            "queued"
        }
        .into(),
        execution_id: new_id,
        source_execution_id: id,
        catalog_id,
    }))
}

/// Remove the KV state of executions that ended at least
/// `older_than_minutes` ago (with `dry_run`, only say which); their events
/// stay in the event stream.
#[utoipa::path(post, path = "/api/executions/cleanup", tag = "executions",
    request_body(content = CleanupRequest, description = "Optional"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "What was removed (or would be)", body = CleanupResponse),
        (status = 403, description = "Not admin", body = ErrorBody)))]
pub async fn cleanup(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    OptionalBody(req): OptionalBody<CleanupRequest>,
) -> Result<Json<CleanupResponse>, ApiError> {
    let mesh = &state.mesh;
    let headers: Vec<ExecHeader> = mesh
        .executions()
        .await?
        .into_iter()
        .filter_map(|(_, h)| h.ok())
        .collect();
    let older_than_ms = u64::from(req.older_than_minutes) * 60_000;
    let ids = noetl_mesh::cleanup::cleanable(&headers, noetl_mesh::events::now_ms(), older_than_ms);
    if !req.dry_run {
        for id in &ids {
            let done = mesh.forget_execution(id).await.map_err(ApiError::from);
            let change = Change {
                principal: &principal,
                action: "execution.cleanup",
                target: id,
            };
            audited(&state, change, done).await?;
        }
    }
    let (n, m) = (ids.len(), req.older_than_minutes);
    let message = if req.dry_run {
        format!("Would remove the KV state of {n} execution(s) that ended over {m} minute(s) ago; their events stay.")
    } else {
        format!("Removed the KV state of {n} execution(s) that ended over {m} minute(s) ago; their events stay.")
    };
    Ok(Json(CleanupResponse {
        status: "success".into(),
        dry_run: req.dry_run,
        older_than_minutes: m,
        cancelled_count: n,
        execution_ids: ids,
        message,
    }))
}
