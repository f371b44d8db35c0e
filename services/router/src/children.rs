//! Child executions (`kind: playbook` tasks): when a child ends, its parent
//! continues at the task that started it, with the child's outcome.
//!
//! The child's request carries the parent's continuation command; the
//! router keeps it under `<child>.resume` from the start (so a child that
//! is refused before its first step resumes its parent too) and publishes
//! it, with the outcome filled in, once the child is terminal. The publish
//! has a deterministic message id, so doing it again after a crash is
//! harmless.

use noetl_core::Outcome;
use noetl_mesh::{
    commands::{park_command, unpark_command, Continue},
    event_type::EventType,
    ids::derive_id,
    keys::Keys,
    kv,
    payloads::{self, PlaybookInitialized},
    state::{ExecStatus, ExecSummary},
    Mesh, MeshError,
};
use noetl_wire::ExecutionRequest;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What `<child>.resume` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ResumeRecord {
    parent_execution_id: String,
    /// The parent's continuation ([`park_command`]).
    command: String,
    /// The parent task's `return_step`: the step whose last result answers
    /// it (empty: the child's final `ctx` does).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    return_step: String,
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
        command: park_command(cmd),
        return_step: req.return_step.clone(),
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

/// The parent's continuation `<eid>.resume` keeps (parked), for the
/// child's `playbook.initialized`; `None` for an execution without one.
pub async fn parked_continuation(mesh: &Mesh, eid: &str) -> Result<Option<String>, MeshError> {
    Ok(kv::get::<ResumeRecord>(mesh.exec_kv(), &Keys::resume(eid))
        .await?
        .map(|r| r.command))
}

/// Write child `eid`'s `<eid>.resume` back from its `playbook.initialized`
/// when it is missing: lost (a purge, a storage fault) while the child
/// ran, it would leave the parent waiting forever. Called as a child ends,
/// before [`resume_parent_with`], which it returns the continuation for
/// (as stored, or as the log tells it: the record may be purged again
/// before it is read); a log without the continuation (a log from before
/// it was written there) leaves it missing.
pub async fn restore_continuation(
    mesh: &Mesh,
    eid: &str,
) -> Result<Option<ResumeRecord>, MeshError> {
    match kv::get::<ResumeRecord>(mesh.exec_kv(), &Keys::resume(eid)).await? {
        Some(rec) => Ok(Some(rec)),
        None => continuation_from_log(mesh, eid).await,
    }
}

/// `<eid>.resume` as the child's `playbook.initialized` tells it, written
/// back (create-only); `None` when the log has no continuation.
async fn continuation_from_log(mesh: &Mesh, eid: &str) -> Result<Option<ResumeRecord>, MeshError> {
    let subject = mesh
        .subjects()
        .event(eid, EventType::PlaybookInitialized.wire_name());
    let Some((_, Ok(mut ev))) = mesh
        .stored_events_from(&subject, None)
        .await?
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    noetl_mesh::replay::hydrate(mesh, &mut ev).await?;
    let init: PlaybookInitialized = payloads::decode_typed(&ev)?;
    let Some(command) = init.parent_command else {
        return Ok(None);
    };
    let rec = ResumeRecord {
        parent_execution_id: init.parent_execution_id,
        command,
        return_step: init.plan.map(|p| p.return_step).unwrap_or_default(),
    };
    if kv::create(mesh.exec_kv(), &Keys::resume(eid), &rec).await? {
        tracing::warn!(execution_id = %eid, parent = %rec.parent_execution_id,
            "a child's continuation of its parent was missing: rebuilt from the events");
    }
    Ok(Some(rec))
}

/// The children the log of `eid` says its `playbook` tasks started (of
/// step-run `step_run_id` only, when given): one per `task.started` of
/// kind `playbook`, [`noetl_mesh::ids::child_execution_id`] of its task
/// run.
async fn children_from_log(
    mesh: &Mesh,
    eid: &str,
    step_run_id: Option<&str>,
) -> Result<Vec<String>, MeshError> {
    // Read only for a playbook that can start children.
    let plan = match mesh.plans().get(mesh, eid).await {
        Ok(plan) => plan,
        // No plan: it never started a step, so no child either.
        Err(MeshError::NoPlan { .. }) => return Ok(Vec::new()),
        // Unread is not "none": a cancellation would miss children.
        Err(e) => return Err(e),
    };
    let workbook = plan.playbook.workbook.as_ref();
    let starts_children = plan.playbook.workflow.iter().any(|step| {
        step.tool
            .iter()
            .any(|t| noetl_core::workbook::effective_kind(workbook, t) == "playbook")
    });
    if !starts_children {
        return Ok(Vec::new());
    }
    let subject = mesh
        .subjects()
        .event(eid, EventType::TaskStarted.wire_name());
    let mut out = Vec::new();
    for (_, ev) in mesh.stored_events_from(&subject, None).await? {
        let Ok(ev) = ev else { continue };
        let kind = noetl_mesh::events::payload(&ev)["kind"].clone();
        if kind != "playbook" || step_run_id.is_some_and(|s| s != ev.step_run_id) {
            continue;
        }
        let child = noetl_mesh::ids::child_execution_id(&ev.task_run_id);
        if !out.contains(&child) {
            out.push(child);
        }
    }
    Ok(out)
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
    let indexed: Vec<String> = kv::keys_under(mesh.exec_kv(), &Keys::children(eid))
        .await?
        .iter()
        .filter_map(|k| Keys::child_of(eid, k).map(str::to_string))
        .collect();
    // The log names them too (the index is lost with a purge): each
    // `playbook` task run started the child its id derives.
    let logged = children_from_log(mesh, eid, step_run_id).await?;
    for child in &logged {
        if indexed.contains(child) || mesh.exec_header(child).await?.is_some() {
            mesh.request_cancel(child, why).await?;
        }
    }
    // The indexed ones the log did not name (a log read only for a plan
    // with a `playbook` task): by their continuation records.
    for child in indexed.iter().filter(|c| !logged.contains(c)) {
        if let Some(srid) = step_run_id {
            let Some(rec) = kv::get::<ResumeRecord>(mesh.exec_kv(), &Keys::resume(child)).await?
            else {
                continue;
            };
            let started_by = unpark_command(mesh, &Keys::resume(child), &rec.command)
                .ok()
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
    continue_parent(mesh, eid, rec, summary).await
}

/// [`resume_parent`] as child `eid` ends, with its continuation `rec`
/// ([`restore_continuation`]): its header missing (purged while it ends)
/// is an error to retry, not "nothing to resume", or the parent would
/// wait forever once the end is marked announced.
pub async fn resume_parent_with(
    mesh: &Mesh,
    eid: &str,
    rec: ResumeRecord,
) -> Result<(), MeshError> {
    let Some(summary) = mesh.exec_summary(eid).await? else {
        return Err(MeshError::Kv {
            bucket: mesh.exec_kv().name.clone(),
            key: Keys::header(eid),
            message: "the child's header is missing as it resumes its parent (written back from the events by its next reader)".into(),
        });
    };
    continue_parent(mesh, eid, rec, summary).await
}

/// Continue the parent of ended child `eid` (its continuation `rec`, its
/// `summary`) with the child's outcome.
async fn continue_parent(
    mesh: &Mesh,
    eid: &str,
    rec: ResumeRecord,
    summary: ExecSummary,
) -> Result<(), MeshError> {
    if !summary.status.is_terminal() {
        return Ok(());
    }
    // The step's last result, as stored (a large one stays a reference);
    // null when the step never ran or has no result (a routing step).
    let returned = match rec.return_step.as_str() {
        "" => None,
        step => Some(
            kv::get::<serde_json::Value>(mesh.exec_kv(), &Keys::result(eid, step))
                .await?
                .unwrap_or(serde_json::Value::Null),
        ),
    };
    let outcome = child_outcome(eid, &summary, returned);
    // The task's kind is `playbook` (or a workbook call resolving to it);
    // executors serving `playbook` continue the pipeline.
    mesh.continue_parked(Continue {
        parked: &rec.command,
        key: &Keys::resume(eid),
        kind: "playbook",
        outcome: payloads::to_value(&outcome),
        command_id: derive_id(&["resume", eid]),
    })
    .await?;
    tracing::info!(execution_id = %rec.parent_execution_id, child = %eid, "parent resumed");
    Ok(())
}

/// The `playbook` task's outcome once its child execution ended: when it
/// completed, the `returned` step result (the task has a `return_step`) or
/// else the child's final `ctx`; a `playbook.failed` error otherwise. The
/// `playbook` helper names the child, its status and its steps.
pub fn child_outcome(eid: &str, summary: &ExecSummary, returned: Option<Value>) -> Outcome {
    let outcome = if summary.status == ExecStatus::Completed {
        Outcome::ok(returned.unwrap_or_else(|| summary.ctx.clone()))
    } else {
        let why = summary.error.as_deref().unwrap_or("failed");
        let message = match summary.ended_before_start() {
            true => format!("child execution {eid} failed before its first step: {why}"),
            false => format!("child execution {eid} ({}) failed: {why}", summary.playbook),
        };
        Outcome::error("playbook.failed", message, false)
    };
    let helper = ChildHelper {
        execution_id: eid,
        status: summary.status,
        steps: &summary.steps,
    };
    outcome.with_helper("playbook", payloads::to_value(&helper))
}

/// `outcome.playbook` of a `playbook` task.
#[derive(serde::Serialize)]
struct ChildHelper<'a> {
    execution_id: &'a str,
    status: ExecStatus,
    steps: &'a std::collections::BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(status: ExecStatus) -> ExecSummary {
        ExecSummary {
            execution_id: "c1".into(),
            status,
            playbook: "child".into(),
            ctx: json!({"n": 3}),
            steps: [("only".to_string(), "done".to_string())].into(),
            error: (status != ExecStatus::Completed).then(|| "step only failed".into()),
            started_at: "t0".into(),
            ended_at: None,
            paused: None,
            queued: false,
        }
    }

    #[test]
    fn a_completed_child_hands_its_ctx_to_the_parent_task() {
        let o = child_outcome("c1", &summary(ExecStatus::Completed), None);
        assert!(o.is_ok());
        assert_eq!(o.result, json!({"n": 3}));
        // With `return_step`, that step's result instead (null if it never ran).
        let o = child_outcome(
            "c1",
            &summary(ExecStatus::Completed),
            Some(json!({"score": 7})),
        );
        assert_eq!(o.result, json!({"score": 7}));
        let o = child_outcome("c1", &summary(ExecStatus::Completed), Some(Value::Null));
        assert!(o.is_ok() && o.result.is_null());
        assert_eq!(
            o.helpers["playbook"],
            json!({"execution_id": "c1", "status": "completed", "steps": {"only": "done"}})
        );
    }

    #[test]
    fn a_failed_child_is_a_playbook_failed_error_naming_it() {
        let o = child_outcome("c1", &summary(ExecStatus::Failed), Some(json!(1)));
        let e = o.error.expect("an error");
        assert_eq!(e.kind, "playbook.failed");
        assert!(!e.retryable);
        assert_eq!(
            e.message,
            "child execution c1 (child) failed: step only failed"
        );
        assert_eq!(o.helpers["playbook"]["status"], "failed");
        // Refused before it planned a playbook: no empty name in parentheses.
        let mut refused = summary(ExecStatus::Failed);
        refused.playbook.clear();
        refused.error = Some("no catalog entry for playbook path \"w\"".into());
        let e = child_outcome("c1", &refused, None).error.expect("an error");
        assert_eq!(
            e.message,
            "child execution c1 failed before its first step: no catalog entry for playbook path \"w\""
        );
    }
}
