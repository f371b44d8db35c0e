//! `GET /api/ehdb/executions`, `.../{id}` and `.../{id}/events`: NoETL's
//! read-only views (`noetl ehdb query`) of the executions' headers and
//! their events, as the mesh holds them.

use axum::extract::State;
use axum::Json;
use noetl_mesh::state::ExecHeader;

use crate::contract::ehdb::{
    EhdbEvents, EhdbEventsQuery, EhdbExecution, EhdbExecutionState, EhdbExecutions,
};
use crate::contract::executions::ListExecutionsQuery;
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::{ExecutionId, Params};
use crate::handlers::header;
use crate::read::{stored, Stored};
use crate::shape::events::execution_event;
use crate::shape::executions::{catalog_source, filter, select};
use crate::shape::status::status_name;
use crate::state::AppState;

/// Events per answer without `limit`.
pub const DEFAULT_EVENTS: u32 = 100;
/// Most events per answer.
pub const MAX_EVENTS: u32 = 1000;

/// An execution as NoETL's read model shows it.
fn row(h: &ExecHeader, event_count: Option<u64>) -> EhdbExecution {
    let (catalog_id, path) = catalog_source(&h.source);
    EhdbExecution {
        execution_id: h.execution_id.clone(),
        status: status_name(h.status).into(),
        terminal: h.status.is_terminal(),
        current_node: h.live.last().map(|t| t.step.clone()),
        path,
        catalog_id,
        parent_execution_id: Some(h.parent_execution_id.clone()).filter(|p| !p.is_empty()),
        event_count,
        started_at: h.started_at.clone(),
        completed_at: h.ended_at.clone(),
    }
}

/// Executions, newest first (filters and paging as `GET /api/executions`).
#[utoipa::path(get, path = "/api/ehdb/executions", tag = "ehdb",
    params(ListExecutionsQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of executions", body = EhdbExecutions),
        (status = 422, description = "A status that is not one", body = ErrorBody)))]
pub async fn executions(
    State(state): State<AppState>,
    Params(q): Params<ListExecutionsQuery>,
) -> Result<Json<EhdbExecutions>, ApiError> {
    let f = filter(&q)?;
    let headers: Vec<ExecHeader> = state
        .mesh
        .listed_executions()
        .await?
        .into_iter()
        .filter_map(|(_, h)| h.ok())
        .collect();
    let page = select(&headers, &f);
    let rows = page
        .iter()
        .filter_map(|s| headers.iter().find(|h| h.execution_id == s.execution_id))
        .map(|h| row(h, None))
        .collect();
    Ok(Json(EhdbExecutions { executions: rows }))
}

/// One execution's state, with the number of its events.
#[utoipa::path(get, path = "/api/ehdb/executions/{id}", tag = "ehdb",
    params(("id" = String, Path, description = "Execution id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Its state", body = EhdbExecutionState),
        (status = 404, description = "No such execution", body = ErrorBody)))]
pub async fn execution(
    State(state): State<AppState>,
    ExecutionId(id): ExecutionId,
) -> Result<Json<EhdbExecutionState>, ApiError> {
    let mesh = &state.mesh;
    let h = header(mesh, &id).await?;
    // Counted as listed: a step's end carrying its last task's `task.done`
    // is two events (docs/architecture.md "Events as stored").
    let (events, _) = stored(
        mesh,
        Stored {
            filter: mesh.subjects().events_of(&id),
            after: 0,
            keep_last: 0,
        },
    )
    .await?;
    let events = events as u64;
    Ok(Json(EhdbExecutionState {
        exists: true,
        execution_id: id,
        state: row(&h, Some(events)),
    }))
}

/// One execution's events, newest first: the last `limit` after `after`.
#[utoipa::path(get, path = "/api/ehdb/executions/{id}/events", tag = "ehdb",
    params(("id" = String, Path, description = "Execution id"), EhdbEventsQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Its events, newest first", body = EhdbEvents),
        (status = 404, description = "No such execution", body = ErrorBody)))]
pub async fn events(
    State(state): State<AppState>,
    ExecutionId(id): ExecutionId,
    Params(q): Params<EhdbEventsQuery>,
) -> Result<Json<EhdbEvents>, ApiError> {
    let mesh = &state.mesh;
    header(mesh, &id).await?;
    let limit = q.limit.unwrap_or(DEFAULT_EVENTS).min(MAX_EVENTS) as usize;
    let (_, seen) = stored(
        mesh,
        Stored {
            filter: mesh.subjects().events_of(&id),
            after: q.after.unwrap_or(0),
            keep_last: limit,
        },
    )
    .await?;
    Ok(Json(EhdbEvents {
        execution_id: id,
        events: seen.iter().rev().map(execution_event).collect(),
    }))
}
