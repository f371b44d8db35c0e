//! An execution's start: its start events (`playbook.initialized`,
//! `workflow.initialized`, the entry's `token.created`, the execution's
//! deadline timer) and its entry token, all under deterministic ids, so
//! publishing them again (a redelivered request, a queued execution
//! promoted again after a crash) changes nothing.

use noetl_mesh::{
    events::{types, EventDraft},
    ids::derive_id,
    payloads::{self, DeadlineSet, PlaybookInitialized, TokenCreated, WorkflowInitialized},
    plan::PlanRecord,
    Batch, Mesh, MeshError,
};
use noetl_wire::Token;
use serde_json::Value;

/// The id of an execution's entry token.
pub(crate) fn entry_token_id(eid: &str) -> String {
    derive_id(&[eid, "entry"])
}

// Over 80 lines on purpose: the start events and entry token of an execution, each idempotent,
// in the order readers rely on.
/// Emit the start events and publish the entry token (all idempotent).
pub(crate) async fn publish_entry(mesh: &Mesh, plan: &PlanRecord) -> Result<(), MeshError> {
    let eid = plan.execution_id.as_str();
    let entry = plan
        .playbook
        .entry_step()
        .map(|s| s.step.clone())
        .unwrap_or_default();
    let token = Token {
        token_id: entry_token_id(eid),
        execution_id: eid.to_string(),
        step: entry.clone(),
        args_json: Vec::new(),
        trace_id: plan.trace_id.clone(),
        parent_step_run_id: String::new(),
        parent_step: String::new(),
    };
    let mut batch = Batch::new();
    let ev = |t: &'static str, payload: Value| {
        EventDraft {
            event_type: t,
            execution_id: eid,
            trace_id: &plan.trace_id,
            payload,
            ..Default::default()
        }
        .build()
    };
    batch.push(
        mesh.emit(&ev(
            types::PLAYBOOK_INITIALIZED,
            payloads::to_value(&PlaybookInitialized {
                playbook: plan.playbook.metadata.name.clone(),
                path: plan.playbook.metadata.path.clone(),
                source: plan.source_name.clone(),
                parent_execution_id: plan.parent_execution_id.clone(),
            }),
        ))
        .await?,
    );
    batch.push(
        mesh.emit(&ev(
            types::WORKFLOW_INITIALIZED,
            payloads::to_value(&WorkflowInitialized {
                entry_step: entry.clone(),
                steps: plan.playbook.workflow.len(),
            }),
        ))
        .await?,
    );
    let mut created = ev(
        types::TOKEN_CREATED,
        payloads::to_value(&TokenCreated {
            token_id: token.token_id.clone(),
            step: entry.clone(),
            arc: None,
        }),
    );
    created.step = entry.clone();
    batch.push(mesh.emit(&created).await?);
    batch.push(mesh.publish_token(&token).await?);
    // The execution's deadline is a timer the router itself handles when
    // due (`crate::timers`), so work waiting in a queue cannot outlive it.
    let deadline = (plan.started_ms > 0)
        .then(|| noetl_core::lifecycle::execution_deadline(&plan.playbook, plan.started_ms))
        .flatten();
    if let Some(d) = deadline {
        batch.push(
            mesh.emit(&ev(
                types::EXECUTION_DEADLINE,
                payloads::to_value(&DeadlineSet {
                    at_ms: d.at_ms,
                    what: d.what.clone(),
                    args: None,
                }),
            ))
            .await?,
        );
    }
    batch.wait().await
}
