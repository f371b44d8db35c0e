//! `POST /api/execute` and `POST /api/execute/batch`: publish execution
//! requests on `<p>.exec.request` (as `noetl exec start` does), under the
//! execution id as message id, so a request sent twice starts one
//! execution; then wait briefly for the router to take them.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::{Extension, Json};
use noetl_mesh::{codec, Mesh};
use noetl_wire::ExecutionRequest;
use serde_json::Value;

use crate::audit::{audited, Change};
use crate::auth::Principal;
use crate::contract::execute::{
    BatchExecuteRequest, BatchExecuteResponse, BatchItemResult, ExecuteRequest, ExecuteResponse,
};
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::Body;
use crate::shape::catalog::{catalog_id, execution_id, target};
use crate::state::AppState;

/// Most requests in one batch (as NoETL).
pub const MAX_BATCH: usize = 1000;

/// How long a request waits for the router to take what it published.
const ACCEPT_WAIT: Duration = Duration::from_secs(2);

/// One request published (or found already started).
struct Requested {
    execution_id: String,
    path: String,
    version: u32,
    duplicate: bool,
}

/// Resolve the catalog version, pick the execution id and publish the
/// request, unless that execution exists already.
async fn request(mesh: &Mesh, req: &ExecuteRequest) -> Result<Requested, ApiError> {
    let (path, version) = target(req)?;
    let eid = execution_id(req)?;
    let entry = mesh.catalog().get(&path, version).await?;
    let out = Requested {
        execution_id: eid.clone(),
        path: entry.path.clone(),
        version: entry.version,
        // An id the caller chose (or a dedup key's): its header, or (its
        // KV state compacted) its events, so it never starts a second run.
        // A fresh id has neither: its header alone is read, as before.
        duplicate: match req.execution_id.is_some() || req.dedup.is_some() {
            true => mesh.is_known(&eid).await?,
            false => mesh.exec_header(&eid).await?.is_some(),
        },
    };
    if out.duplicate {
        return Ok(out);
    }
    let request = ExecutionRequest {
        execution_id: eid.clone(),
        path: entry.path,
        version: entry.version,
        workload_json: codec::json_bytes(&Value::Object(req.payload.clone())),
        ..Default::default()
    };
    mesh.publish(
        mesh.subjects().exec_request(),
        &eid,
        codec::encode(&request),
    )
    .await?
    .wait()
    .await?;
    Ok(out)
}

/// Which of `ids` the router has taken (their header exists) within
/// [`ACCEPT_WAIT`].
pub(crate) async fn accepted(mesh: &Mesh, ids: &[&str]) -> HashSet<String> {
    let deadline = Instant::now() + ACCEPT_WAIT;
    let mut seen = HashSet::new();
    loop {
        let waiting: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| !seen.contains(*id))
            .collect();
        for id in waiting {
            if matches!(mesh.exec_header(id).await, Ok(Some(_))) {
                seen.insert(id.to_string());
            }
        }
        if seen.len() == ids.len() || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What an audit record of a request names: its execution id, if it got
/// one.
fn target_of(done: &Result<Requested, ApiError>) -> String {
    match done {
        Ok(r) => r.execution_id.clone(),
        Err(_) => "<request>".into(),
    }
}

/// The status word of a request: `duplicate`, `started` (taken) or `queued`.
fn status_of(r: &Requested, taken: &HashSet<String>) -> &'static str {
    if r.duplicate {
        "duplicate"
    } else if taken.contains(&r.execution_id) {
        "started"
    } else {
        "queued"
    }
}

/// Start a registered playbook by `path` (and `version`) or `catalog_id`.
#[utoipa::path(post, path = "/api/execute", tag = "executions",
    request_body = ExecuteRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Requested", body = ExecuteResponse),
        (status = 403, description = "Viewer", body = ErrorBody),
        (status = 404, description = "No such catalog path or version", body = ErrorBody),
        (status = 422, description = "Neither or both of `path` and `catalog_id`, or a bad id", body = ErrorBody)))]
pub async fn execute(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(req): Body<ExecuteRequest>,
) -> Result<Json<ExecuteResponse>, ApiError> {
    let done = request(&state.mesh, &req).await;
    let target = target_of(&done);
    let start = Change {
        principal: &principal,
        action: "execution.start",
        target: &target,
    };
    let r = audited(&state, start, done).await?;
    let taken = accepted(&state.mesh, &[&r.execution_id]).await;
    Ok(Json(ExecuteResponse {
        status: status_of(&r, &taken).into(),
        catalog_id: catalog_id(&r.path, r.version),
        execution_id: r.execution_id,
        path: r.path,
        version: r.version,
    }))
}

/// Start up to 1,000 playbooks; each request succeeds or fails alone.
#[utoipa::path(post, path = "/api/execute/batch", tag = "executions",
    request_body = BatchExecuteRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One result per request", body = BatchExecuteResponse),
        (status = 422, description = "Empty, or over 1,000 requests", body = ErrorBody)))]
pub async fn execute_batch(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(batch): Body<BatchExecuteRequest>,
) -> Result<Json<BatchExecuteResponse>, ApiError> {
    let n = batch.executions.len();
    if n == 0 || n > MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "execute batch needs 1-{MAX_BATCH} requests in 'executions'; it has {n}"
        )));
    }
    let mut outcomes = Vec::with_capacity(n);
    for req in &batch.executions {
        let done = request(&state.mesh, &req.0).await;
        let target = target_of(&done);
        let start = Change {
            principal: &principal,
            action: "execution.start",
            target: &target,
        };
        outcomes.push(audited(&state, start, done).await);
    }
    let ids: Vec<&str> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .map(|r| r.execution_id.as_str())
        .collect();
    let taken = accepted(&state.mesh, &ids).await;
    Ok(Json(batch_response(&outcomes, &taken)))
}

/// The answer to a batch from each request's outcome.
fn batch_response(
    outcomes: &[Result<Requested, ApiError>],
    taken: &HashSet<String>,
) -> BatchExecuteResponse {
    let results: Vec<BatchItemResult> = outcomes
        .iter()
        .enumerate()
        .map(|(index, o)| match o {
            Ok(r) => BatchItemResult {
                index,
                status: status_of(r, taken).into(),
                execution_id: Some(r.execution_id.clone()),
                error: None,
            },
            Err(e) => BatchItemResult {
                index,
                status: "error".into(),
                execution_id: None,
                error: Some(e.to_string()),
            },
        })
        .collect();
    let count = |s: &str| results.iter().filter(|r| r.status == s).count();
    BatchExecuteResponse {
        count: results.len(),
        started: count("started") + count("queued"),
        duplicates: count("duplicate"),
        failed: count("error"),
        results,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requested(id: &str, duplicate: bool) -> Result<Requested, ApiError> {
        Ok(Requested {
            execution_id: id.into(),
            path: "p".into(),
            version: 1,
            duplicate,
        })
    }

    #[test]
    fn a_batch_counts_each_request_by_what_became_of_it() {
        let outcomes = vec![
            requested("a", false),
            requested("b", true),
            Err(ApiError::NotFound("no catalog entry".into())),
            requested("c", false),
        ];
        let taken: HashSet<String> = ["a".to_string()].into();
        let r = batch_response(&outcomes, &taken);
        let statuses: Vec<&str> = r.results.iter().map(|x| x.status.as_str()).collect();
        assert_eq!(statuses, ["started", "duplicate", "error", "queued"]);
        assert_eq!((r.count, r.started, r.duplicates, r.failed), (4, 2, 1, 1));
        assert_eq!(r.results[2].error.as_deref(), Some("no catalog entry"));
    }
}
