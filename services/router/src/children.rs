//! Child executions (`kind: playbook` tasks): when a child ends, its parent
//! continues at the task that started it, with the child's outcome.
//!
//! The child's request carries the parent's continuation command; the
//! router keeps it under `<child>.resume` from the start (so a child that
//! is refused before its first step resumes its parent too) and publishes
//! it, with the outcome filled in, once the child is terminal. The publish
//! has a deterministic message id, so doing it again after a crash is
//! harmless.

use base64::Engine as _;
use noetl_mesh::{codec, ids::derive_id, keys::Keys, kv, state::ExecStatus, Mesh, MeshError};
use noetl_wire::{ExecutionRequest, TaskCommand};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What `<child>.resume` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ResumeRecord {
    parent_execution_id: String,
    /// The parent's continuation (protobuf `TaskCommand`, base64).
    command: String,
}

/// The parent's index entry of one child ([`Keys::child`]).
#[derive(Debug, Serialize, Deserialize)]
struct ChildIndex {
    /// When the child was started.
    started_at: String,
}

/// Remember the parent's continuation of a child request (no-op for
/// executions without a parent).
pub async fn remember(mesh: &Mesh, eid: &str, req: &ExecutionRequest) -> Result<(), MeshError> {
    let Some(cmd) = &req.parent_resume else {
        return Ok(());
    };
    let rec = ResumeRecord {
        parent_execution_id: req.parent_execution_id.clone(),
        command: base64::engine::general_purpose::STANDARD.encode(codec::encode(cmd)),
    };
    kv::put(mesh.exec_kv(), &Keys::resume(eid), &rec).await?;
    // The parent's index of its children, for cancellation.
    kv::put(
        mesh.exec_kv(),
        &Keys::child(&req.parent_execution_id, eid),
        &ChildIndex {
            started_at: noetl_mesh::events::now_rfc3339(),
        },
    )
    .await?;
    Ok(())
}

/// Ask every child of `eid` to cancel (they pass it on to theirs).
pub async fn cancel_children(mesh: &Mesh, eid: &str) -> Result<(), MeshError> {
    cancel_children_where(
        mesh,
        eid,
        None,
        &format!("parent execution {eid} was cancelled"),
    )
    .await
}

/// Ask the children of `eid` to cancel with `why`: all of them, or only
/// those started by step-run `step_run_id` (read from each child's
/// continuation record).
pub async fn cancel_children_where(
    mesh: &Mesh,
    eid: &str,
    step_run_id: Option<&str>,
    why: &str,
) -> Result<(), MeshError> {
    for key in kv::keys_under(mesh.exec_kv(), &Keys::children(eid)).await? {
        let Some(child) = Keys::child_of(eid, &key) else {
            continue;
        };
        if let Some(srid) = step_run_id {
            let Some(rec) = kv::get::<ResumeRecord>(mesh.exec_kv(), &Keys::resume(child)).await?
            else {
                continue;
            };
            let started_by = base64::engine::general_purpose::STANDARD
                .decode(rec.command.as_bytes())
                .ok()
                .and_then(|b| codec::decode::<TaskCommand>("parent continuation", &b).ok())
                .map(|c| c.step_run_id);
            if started_by.as_deref() != Some(srid) {
                continue;
            }
        }
        mesh.request_cancel(child, why).await?;
    }
    Ok(())
}

/// If `eid` is a child, continue its parent with the child's outcome:
/// `ok` with the child's final `ctx` as result when it completed, a
/// `playbook.failed` error naming the child and its reason otherwise.
pub async fn resume_parent(mesh: &Mesh, eid: &str) -> Result<(), MeshError> {
    let Some(rec) = kv::get::<ResumeRecord>(mesh.exec_kv(), &Keys::resume(eid)).await? else {
        return Ok(());
    };
    let Some(summary) = mesh.exec_summary(eid).await? else {
        return Ok(());
    };
    if !summary.status.is_terminal() {
        return Ok(());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(rec.command.as_bytes())
        .map_err(|e| MeshError::Corrupt {
            bucket: mesh.exec_kv().name.clone(),
            key: Keys::resume(eid),
            message: format!("continuation is not base64: {e}"),
        })?;
    let mut cmd: TaskCommand = codec::decode("parent continuation", &bytes)?;
    let helper = json!({
        "execution_id": eid,
        "status": summary.status,
        "steps": summary.steps,
    });
    let outcome = if summary.status == ExecStatus::Completed {
        json!({"status": "ok", "result": summary.ctx, "playbook": helper})
    } else {
        let why = summary.error.clone().unwrap_or_else(|| "failed".into());
        json!({
            "status": "error",
            "result": null,
            "error": {
                "kind": "playbook.failed",
                "retryable": false,
                "message": format!("child execution {eid} ({}) failed: {why}", summary.playbook),
            },
            "playbook": helper,
        })
    };
    cmd.resume_outcome_json = codec::json_bytes(&outcome);
    cmd.command_id = derive_id(&["resume", eid]);
    // The task's kind is `playbook` (or a workbook call resolving to it);
    // executors serving `playbook` continue the pipeline.
    mesh.publish_for_execution(
        mesh.subjects().task("playbook"),
        &cmd.command_id,
        &rec.parent_execution_id,
        codec::encode(&cmd),
    )
    .await?
    .wait()
    .await?;
    tracing::info!(execution_id = %rec.parent_execution_id, child = %eid, "parent resumed");
    Ok(())
}
