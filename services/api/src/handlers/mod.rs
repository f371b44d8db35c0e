//! The route handlers, one module per resource. Each reads (KV, the event
//! stream, the catalog), calls a pure function of `shape`, and answers;
//! each change is audited ([`crate::audit`]).

pub mod catalog;
pub mod credentials;
pub mod ehdb;
pub mod events;
pub mod execute;
pub mod executions;
pub mod health;
pub mod history;
pub mod lifecycle;
pub mod operate;

use noetl_mesh::state::ExecHeader;
use noetl_mesh::Mesh;

use crate::error::ApiError;

/// The header of execution `id`: 400 for what cannot be an execution id
/// (it would name another key, or a subject wildcard), 404 when there is
/// none (a running execution's header purged is the one its events give,
/// [`Mesh::header_or_running`]).
pub async fn header(mesh: &Mesh, id: &str) -> Result<ExecHeader, ApiError> {
    valid_id(id)?;
    match mesh.header_or_running(id).await? {
        Some(h) => Ok(h),
        None => Err(not_found(mesh, id).await),
    }
}

/// 404 for execution `id`: unknown, or (its events remain) ended with its
/// state removed, naming what still reads it.
pub async fn not_found(mesh: &Mesh, id: &str) -> ApiError {
    match mesh.is_known(id).await {
        Ok(true) => ApiError::NotFound(format!(
            "Execution not found: {id} (it ended and its state was removed by a cleanup; its events remain: GET /api/executions/{id}/state, POST /api/executions/{id}/rerun)"
        )),
        _ => ApiError::NotFound(format!("Execution not found: {id}")),
    }
}

/// The plan of execution `id`, `None` when it has none (refused before it
/// started, or purged). Any other failure is the API's error: 503 when
/// the read may pass, 500 naming the key when the stored plan is corrupt
/// (never "no plan": that would hide it).
pub async fn plan_of(
    mesh: &Mesh,
    id: &str,
) -> Result<Option<std::sync::Arc<noetl_mesh::plan::PlanRecord>>, ApiError> {
    absent_plan(mesh.plans().get(mesh, id).await)
}

/// A plan read with [`MeshError::NoPlan`](noetl_mesh::MeshError::NoPlan)
/// as `None` and every other error as the API's.
pub fn absent_plan<T>(read: Result<T, noetl_mesh::MeshError>) -> Result<Option<T>, ApiError> {
    match read {
        Ok(plan) => Ok(Some(plan)),
        Err(noetl_mesh::MeshError::NoPlan { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Refuse what is not an execution id (it could otherwise name another KV
/// key, or be a wildcard).
pub fn valid_id(id: &str) -> Result<(), ApiError> {
    crate::shape::params::execution_id(id).map_err(ApiError::BadRequest)
}
