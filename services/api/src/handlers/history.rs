//! `GET /api/executions/{id}/state?at=SEQ|TIME`: time travel. The
//! execution's events up to `at`, folded ([`noetl_mesh::fold`]) into the
//! records they determine, with the timeline of every event for the
//! console's scrubber. Works as well for an execution whose KV state was
//! compacted: its events give its header. An id with neither a header in
//! KV nor one its events give is no execution (404), whatever events are
//! filed under it (the audit records of actions refused on it). A replica
//! reads [`crate::state::LOG_FOLDS`] logs at once; further requests wait.

use std::collections::VecDeque;

use axum::extract::State;
use axum::Json;
use noetl_mesh::fold::Folded;
use noetl_mesh::replay::{self, LogReader, Until};
use serde_json::{Map, Value};

use crate::contract::history::{ExecutionState, StateQuery, TimelineEntry};
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::{ExecutionId, Params};
use crate::shape::status::status_name;
use crate::state::AppState;

/// Timeline entries answered at most (the last ones).
pub const MAX_TIMELINE: usize = 2000;

/// An execution as of an event.
#[utoipa::path(get, path = "/api/executions/{id}/state", tag = "executions",
    params(("id" = String, Path, description = "Execution id"), StateQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The state its events up to `at` give, and its timeline", body = ExecutionState),
        (status = 404, description = "No such execution: no header in KV, none its events give", body = ErrorBody),
        (status = 422, description = "`at` is neither a sequence number nor an RFC 3339 time", body = ErrorBody),
        (status = 500, description = "A stored event does not decode (its sequence number named)", body = ErrorBody)))]
pub async fn state_at(
    State(state): State<AppState>,
    ExecutionId(id): ExecutionId,
    Params(q): Params<StateQuery>,
) -> Result<Json<ExecutionState>, ApiError> {
    let at = match q.at.as_deref() {
        None => Until::End,
        Some(s) => Until::parse(s).ok_or_else(|| {
            ApiError::invalid(format!(
                "at {}: give a sequence number (e.g. 1234) or an RFC 3339 time (e.g. 2026-11-28T10:00:00Z)",
                crate::shape::params::shown(s)
            ))
        })?,
    };
    let mesh = &state.mesh;
    let not_found = || ApiError::NotFound(format!("Execution not found: {id}"));
    // A header that cannot be read now is left to the log to give: time
    // travel reads the events, not KV.
    let known = matches!(mesh.exec_header(&id).await, Ok(Some(_)));
    // A few at once per replica; more wait here.
    let _fold = state.log_folds.acquire().await;
    let read = read(mesh, &id, at, !known)
        .await
        .map_err(|e| corrupt_event(&id, e))?;
    if read.events == 0 {
        return Err(not_found());
    }
    // No header in KV (compacted, or none ever): the execution is one when
    // its whole log gives a header (`at` may precede its start).
    if !known && read.upto.header.is_none() && !read.whole_has_header {
        return Err(not_found());
    }
    let timeline_truncated = read.events > MAX_TIMELINE;
    let timeline = read.timeline.into_iter().collect();
    let folded = read.upto;
    Ok(Json(answer(&id, folded, timeline, timeline_truncated)))
}

/// What one read of an execution's log gives the answer.
struct Read {
    /// The fold of the events up to `at`.
    upto: Folded,
    /// The whole log gives a header.
    whole_has_header: bool,
    /// The last [`MAX_TIMELINE`] events' entries.
    timeline: VecDeque<TimelineEntry>,
    /// Events in the whole log.
    events: usize,
}

/// Read execution `id`'s log once, event by event ([`LogReader`]): fold
/// the events up to `at` (each hydrated), keep the timeline's last
/// entries, and, with `whole`, fold the whole log beside (not hydrated)
/// for whether it gives a header. What is held is a chunk of the log and the folds,
/// never the log (a loop of 100,000 iterations is 300,000 events).
async fn read(
    mesh: &noetl_mesh::Mesh,
    id: &str,
    at: Until,
    whole: bool,
) -> Result<Read, noetl_mesh::MeshError> {
    let mut upto = Folded::default();
    let mut whole = whole.then(Folded::default);
    let mut timeline = VecDeque::with_capacity(MAX_TIMELINE);
    let mut events = 0;
    let mut log = LogReader::of(mesh, id);
    while let Some(mut l) = log.next().await? {
        events += 1;
        if timeline.len() == MAX_TIMELINE {
            timeline.pop_front();
        }
        timeline.push_back(TimelineEntry {
            seq: l.seq,
            event_type: l.event.event_type.clone(),
            step: l.event.step.clone(),
            ts: l.event.ts.clone(),
        });
        // Only whether the whole log gives a header is asked of it: its
        // events are not read back, and one that does not fold past `at`
        // does not fail the answer.
        if let Some(whole) = &mut whole {
            whole.apply(l.seq, &l.event).ok();
        }
        if at.keeps(&l) {
            if replay::carries_reference(&l.event) {
                replay::hydrate(mesh, &mut l.event).await?;
            }
            upto.apply(l.seq, &l.event)?;
        }
    }
    Ok(Read {
        upto,
        whole_has_header: whole.is_some_and(|w| w.header.is_some()),
        timeline,
        events,
    })
}

/// A stored event of execution `id` that does not decode (or whose payload
/// does not) is a corrupt record: 500 naming it, not the caller's 422.
fn corrupt_event(id: &str, e: noetl_mesh::MeshError) -> ApiError {
    use noetl_mesh::error::ErrorKind;
    match e.kind() {
        ErrorKind::Invalid => {
            ApiError::Internal(format!("a stored event of execution {id} is corrupt: {e}"))
        }
        _ => e.into(),
    }
}

/// The answer for `folded` (a plain function).
fn answer(
    id: &str,
    folded: Folded,
    timeline: Vec<TimelineEntry>,
    timeline_truncated: bool,
) -> ExecutionState {
    let steps: Map<String, Value> = folded
        .steps
        .iter()
        .map(|(name, r)| (name.clone(), noetl_mesh::payloads::to_value(r)))
        .collect();
    let h = folded.header.as_ref();
    ExecutionState {
        execution_id: id.to_string(),
        at_seq: folded.last_seq,
        events: folded.events,
        status: h.map(|h| status_name(h.status).to_string()),
        error: h.and_then(|h| h.error.clone()),
        live: h
            .map(|h| h.live.iter().map(|t| t.step.clone()).collect())
            .unwrap_or_default(),
        steps,
        ctx: folded.ctx,
        timeline,
        timeline_truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_mesh::state::{ExecHeader, ExecStatus, StepRecord, StepStatus};
    use serde_json::json;

    #[test]
    fn an_event_that_does_not_decode_is_a_corrupt_record_naming_the_execution() {
        let e = corrupt_event(
            "e1",
            noetl_mesh::MeshError::Invalid("event seq 7 under p.events.e1.>: bad".into()),
        );
        assert_eq!(e.status().as_u16(), 500);
        assert!(e.to_string().contains("execution e1"), "{e}");
        assert!(e.to_string().contains("seq 7"), "{e}");
        let unavailable = corrupt_event(
            "e1",
            noetl_mesh::MeshError::Consume {
                consumer: "c".into(),
                message: "gone".into(),
            },
        );
        assert_eq!(unavailable.status().as_u16(), 503);
    }

    #[test]
    fn the_answer_names_status_steps_ctx_and_live_steps() {
        let mut folded = Folded::default();
        folded.header = Some(ExecHeader {
            status: ExecStatus::Running,
            ..ExecHeader::running("e1", Vec::new())
        });
        folded.steps.insert(
            "start".into(),
            StepRecord {
                status: StepStatus::Done,
                last_step_run_id: "r1".into(),
                loop_counts: None,
                error: None,
                handled: Vec::new(),
            },
        );
        folded.ctx.insert("n".into(), json!(1));
        folded.last_seq = 9;
        folded.events = 4;
        let a = answer("e1", folded, Vec::new(), false);
        assert_eq!(a.status.as_deref(), Some("RUNNING"));
        assert_eq!(a.at_seq, 9);
        assert_eq!(a.steps["start"]["status"], json!("done"));
        assert_eq!(a.ctx["n"], json!(1));
        assert!(a.live.is_empty());
    }
}
