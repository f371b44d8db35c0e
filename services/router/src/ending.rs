//! Ending an execution: the one compare-and-set that ends a running
//! execution, and its terminal event, emitted exactly once. Boundary
//! events, cancellations, dead letters and timers all end executions
//! through here.

use std::sync::Arc;

use noetl_mesh::{
    events::{now_rfc3339, EventDraft},
    keys::Keys,
    kv::{self, Cas, RevisionCache},
    payloads::ExecutionEnded,
    state::{ExecHeader, ExecStatus},
    Mesh, MeshError,
};

/// Emit `execution.completed` / `execution.failed` once the header is
/// terminal, exactly once (the flag is set after publishing; the event id is
/// deterministic, so a crash between the two only republishes a duplicate
/// that JetStream drops).
pub(crate) async fn emit_terminal(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    header: &ExecHeader,
    trace_id: &str,
) -> Result<(), MeshError> {
    if !header.status.is_terminal() || header.terminal_emitted {
        return Ok(());
    }
    let eid = header.execution_id.as_str();
    let status = match header.status {
        ExecStatus::Completed => ExecStatus::Completed,
        ExecStatus::Cancelled => ExecStatus::Cancelled,
        _ => ExecStatus::Failed,
    };
    // A resumed execution ends again: its n-th end is another event.
    let nth = if header.resumes > 0 {
        header.resumes.to_string()
    } else {
        String::new()
    };
    mesh.emit(
        &EventDraft {
            execution_id: eid,
            trace_id,
            discriminator: &nth,
            ..Default::default()
        }
        .build(&ExecutionEnded {
            status,
            error: header.error.clone(),
            source: None,
            stopped: header.stopped.clone(),
        }),
    )
    .await?
    .wait()
    .await?;
    // Before marking the end emitted: a crash here repeats both. Only a
    // child has a parent to resume (`<eid>.resume`): a root execution's
    // end reads nothing for it.
    if !header.parent_execution_id.is_empty() {
        if let Some(rec) = crate::children::restore_continuation(mesh, eid).await? {
            crate::children::resume_parent_with(mesh, eid, rec).await?;
        }
    }
    crate::gates::release(mesh, eid).await?;
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

/// End a running execution with `status` and `error` (one CAS: an ended
/// execution is left as it is). Returns the header as it now is; `None`
/// only when there is none and the events make none of a running
/// execution: a header purged while the execution runs is written back
/// from its events first ([`noetl_mesh::rebuild::running_header`]), so a
/// cancel, a dead letter or a deadline still ends it.
pub(crate) async fn end_running(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    eid: &str,
    status: ExecStatus,
    error: &str,
) -> Result<Option<Arc<ExecHeader>>, MeshError> {
    use noetl_mesh::{kv::RESTORES, rebuild::running_header};
    for _ in 0..=RESTORES {
        if let Some(h) = end_stored(mesh, headers, eid, status, error).await? {
            return Ok(Some(h));
        }
        if running_header(mesh, eid).await?.is_none() {
            return Ok(None);
        }
    }
    Err(kv::conflict(mesh.exec_kv(), &Keys::header(eid), RESTORES))
}

/// [`end_running`]'s compare-and-set on the stored header (`None`: none
/// stored).
async fn end_stored(
    mesh: &Mesh,
    headers: &RevisionCache<ExecHeader>,
    eid: &str,
    status: ExecStatus,
    error: &str,
) -> Result<Option<Arc<ExecHeader>>, MeshError> {
    kv::update_cached(
        mesh.exec_kv(),
        &Keys::header(eid),
        headers,
        |h: Option<&ExecHeader>| match h {
            Some(h) if h.status == ExecStatus::Running => {
                let mut h = h.clone();
                h.end(status, error, &now_rfc3339());
                Cas::Write(h)
            }
            _ => Cas::Keep,
        },
    )
    .await
}
