//! An execution's start: its start events (`playbook.initialized`,
//! `workflow.initialized`, the entry's `token.created`, the execution's
//! deadline timer) and its entry step-run's start (or its token, when the
//! scheduler must admit it), all under deterministic ids, so
//! publishing them again (a redelivered request, a queued execution
//! promoted again after a crash) changes nothing.

use noetl_mesh::{
    dispatch,
    effects::{self, Effect},
    events::{now_ms, EventDraft},
    patches,
    payloads::{
        DeadlineSet, ExecutionDeadlineSet, PlanIdentity, PlaybookInitialized, TokenCreated,
        WorkflowInitialized,
    },
    plan::PlanRecord,
    Mesh, MeshError,
};
use noetl_wire::Token;
use serde_json::Value;

/// `playbook.initialized` of `plan`: what a fold of the log needs to know
/// the plan whole (docs/architecture.md "The event log"): the normalised
/// playbook stored content-addressed, its digest, the catalog entry it came
/// from, the merged workload (by reference when large), a child's
/// continuation of its parent and the plan's other fields.
async fn initialized(mesh: &Mesh, plan: &PlanRecord) -> Result<PlaybookInitialized, MeshError> {
    let eid = plan.execution_id.as_str();
    let identity = identity(mesh, plan).await?;
    let workload = patches::carry(mesh.results(), eid, "workload", plan.workload.clone()).await?;
    // Only a child has a continuation (`children::remember` writes it for a
    // request that names its parent): a root execution skips the read.
    let parked = match plan.parent_execution_id.is_empty() {
        true => None,
        false => crate::children::parked_continuation(mesh, eid).await?,
    };
    let parent_command = match parked {
        Some(parked) => Some(patches::carry(mesh.results(), eid, "parent-command", parked).await?),
        None => None,
    };
    Ok(PlaybookInitialized {
        playbook: plan.playbook.metadata.name.clone(),
        path: plan.playbook.metadata.path.clone(),
        source: plan.source_name.clone(),
        parent_execution_id: plan.parent_execution_id.clone(),
        plan: Some(identity),
        workload_ref: workload.reference(),
        workload: workload.inline().unwrap_or(Value::Null),
        parent_command_ref: parent_command.as_ref().and_then(|c| c.reference()),
        parent_command: parent_command.and_then(|c| c.inline()),
    })
}

/// The identity of `plan` as an event names it: its normalised playbook
/// stored content-addressed (once per playbook), its digest, the catalog
/// entry it came from and the plan's other fields.
pub(crate) async fn identity(mesh: &Mesh, plan: &PlanRecord) -> Result<PlanIdentity, MeshError> {
    let (digest, playbook_ref) = patches::store_playbook(mesh.results(), &plan.playbook).await?;
    let (catalog_path, catalog_version) = match catalog_entry(&plan.source_name) {
        Some((path, version)) => (Some(path.to_string()), Some(version)),
        None => (None, None),
    };
    Ok(PlanIdentity {
        digest,
        playbook_ref,
        catalog_path,
        catalog_version,
        started_ms: plan.started_ms,
        parent_iter: plan.parent_iter.clone(),
        return_step: plan.return_step.clone(),
    })
}

/// The catalog path and version a source name `path@v<N>` names (the
/// router names a catalog playbook so), else `None`.
pub(crate) fn catalog_entry(source: &str) -> Option<(&str, u32)> {
    let (path, version) = source.rsplit_once("@v")?;
    let version: u32 = version.parse().ok()?;
    (!path.is_empty()).then_some((path, version))
}

/// The id of an execution's entry token.
pub(crate) fn entry_token_id(eid: &str) -> String {
    noetl_mesh::token::entry_token_id(eid)
}

/// Whether [`publish_entry`] emits `playbook.initialized` with the other
/// start events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Initialized {
    /// Emit it (an execution without a concurrency key, or one queued by
    /// a version that did not emit it before asking for its slot).
    Emit,
    /// It is in the log already ([`emit_initialized`]).
    Emitted,
}

/// Emit `playbook.initialized` alone, and wait for it to be stored: an
/// execution under a concurrency key does so before it asks for its slot,
/// so one that waits in line is in the log from its start, and its plan
/// and its place come back from the log (docs/architecture.md, "The event
/// log"). Idempotent.
pub(crate) async fn emit_initialized(mesh: &Mesh, plan: &PlanRecord) -> Result<(), MeshError> {
    let ev = EventDraft {
        execution_id: &plan.execution_id,
        trace_id: &plan.trace_id,
        ..Default::default()
    }
    .build(&initialized(mesh, plan).await?);
    mesh.emit(&ev).await?.wait().await
}

/// Emit the start events, then start the entry step (all idempotent): its
/// step-run at once when its admission reads nothing and the execution is
/// not paused (`noetl_mesh::dispatch::start_unadmitted`, as for the tokens
/// a boundary fires), else its token, for the scheduler.
pub(crate) async fn publish_entry(
    mesh: &Mesh,
    plan: &PlanRecord,
    init: Initialized,
) -> Result<(), MeshError> {
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
    // The entry step-run starts here when its admission reads nothing
    // and the execution is not paused; its `step.started` then rides in
    // the entry's `token.created` (read back as its own event,
    // `noetl_mesh::events::unfold`), and its work goes out once the start
    // events are stored (cause before effect, `noetl_mesh::effects::apply`):
    // a lost `playbook.initialized` must not leave a running entry step
    // that no fold of the log knows.
    let unadmitted = match mesh.pauses().await?.is_paused(eid) {
        true => None,
        false => dispatch::start_unadmitted(plan, &token, Value::Null, now_ms()),
    };
    let (started, work) = match unadmitted {
        Some(u) => (Some(u.started), u.then),
        None => (None, vec![Effect::Token(token.clone())]),
    };
    let mut effects = Vec::with_capacity(work.len() + 4);
    let draft = || EventDraft {
        execution_id: eid,
        trace_id: &plan.trace_id,
        ..Default::default()
    };
    if init == Initialized::Emit {
        let initialized = initialized(mesh, plan).await?;
        effects.push(Effect::Emit(draft().build(&initialized)));
    }
    effects.push(Effect::Emit(draft().build(&WorkflowInitialized {
        entry_step: entry.clone(),
        steps: plan.playbook.workflow.len(),
    })));
    let mut created = draft().build(&TokenCreated {
        token_id: token.token_id,
        step: entry.clone(),
        arc: None,
        args: Value::Null,
        parent: String::new(),
        started,
    });
    created.step = entry;
    effects.push(Effect::Emit(created));
    // The execution's deadline is a timer the router itself handles when
    // due (`crate::timers`), so work waiting in a queue cannot outlive it.
    let deadline = (plan.started_ms > 0)
        .then(|| noetl_core::lifecycle::execution_deadline(&plan.playbook, plan.started_ms))
        .flatten();
    if let Some(d) = deadline {
        effects.push(Effect::Emit(draft().build(&ExecutionDeadlineSet(
            DeadlineSet {
                at_ms: d.at_ms,
                what: d.what.clone(),
                args: None,
            },
        ))));
    }
    effects.extend(work);
    effects::apply(mesh, effects).await
}

#[cfg(test)]
mod tests {
    use super::catalog_entry;

    #[test]
    fn a_catalog_source_names_its_path_and_version_and_a_file_does_not() {
        assert_eq!(catalog_entry("etl/load@v3"), Some(("etl/load", 3)));
        assert_eq!(catalog_entry("a@v1@v12"), Some(("a@v1", 12)));
        assert_eq!(catalog_entry("playbooks/hello.yaml"), None);
        assert_eq!(catalog_entry("x@vnext.yaml"), None);
        assert_eq!(catalog_entry("@v2"), None);
    }
}
