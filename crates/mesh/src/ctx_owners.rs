//! The write-once `ctx` claims of a parallel loop run (bucket ctx,
//! `<eid>.owners.<loop_run>`, [`CtxOwners`]) as the event log gives them,
//! for when the bucket lost the record (docs/architecture.md "The event
//! log"). A claim the executor made is in the `task.done` of its task run
//! (the patch it wrote, not refused): the fold takes those `task.done`
//! events of the loop run in stream order through the same
//! [`claim_ctx_keys`] that claimed them live, so it is not a second
//! interpreter.
//!
//! Live, the claims are kept in the order the compare-and-set took them;
//! two task runs that wrote the same value to one key (both allowed) may
//! be in the log in the other order, and then the fold names the other as
//! the key's writer in a later `ctx.conflict` message. Which values are
//! owned, and so which writes are refused, is the same.

use serde_json::{Map, Value};

use noetl_wire::Event;

use crate::event_type::EventType;
use crate::ids::derive_id;
use crate::keys::Keys;
use crate::payloads::{self, LoopStarted, TaskDone};
use crate::state::{claim_ctx_keys, CtxClaim, CtxOwners};
use crate::{kv, Mesh, MeshError};

/// The hash of a `ctx` value a claim keeps and compares.
pub fn value_hash(v: &Value) -> String {
    derive_id(&[&v.to_string()])
}

/// Each key of a `set_ctx` patch with the hash of its value, as a claim
/// takes them ([`claim_ctx_keys`]).
pub fn hashes(patch: &Map<String, Value>) -> Vec<(String, String)> {
    patch
        .iter()
        .map(|(k, v)| (k.clone(), value_hash(v)))
        .collect()
}

/// The writer of a `ctx` key as a `ctx.conflict` names it: the step, the
/// iteration (`None`: a `task.done` written before it carried one) and
/// the task.
pub fn writer(step: &str, index: Option<u64>, task: &str) -> String {
    match index {
        Some(i) => format!("step {step:?} iteration {i} task {task:?}"),
        None => format!("step {step:?} task {task:?}"),
    }
}

/// The keys of `hashes` that `ctx` (as users see it) holds with a value
/// other than the one being written: only such a key may be claimed
/// differently without the loop run's record than with it (a key `ctx`
/// does not hold, or holds with this value, is claimed alike).
pub fn differing<'h>(ctx: &Value, hashes: &'h [(String, String)]) -> Vec<&'h str> {
    hashes
        .iter()
        .filter(|(k, h)| ctx.get(k).is_some_and(|v| &value_hash(v) != h))
        .map(|(k, _)| k.as_str())
        .collect()
}

/// The claims of loop run `loop_run_id` as the execution's events give
/// them (`log`: in stream order, hydrated, i.e. a large `set_ctx` read back
/// from the object store, [`crate::replay::hydrate`]): each `task.done` of
/// the loop run that wrote its `set_ctx` (not `ctx_refused`; without the
/// keys in `reduced`, which went to the loop's reducers) claims its keys
/// as it did live. A `task.done` whose claim conflicts with an earlier
/// one (possible only where the rule was already lost, e.g. before this
/// fold existed) leaves the earlier owner.
pub fn fold<'e>(
    log: impl IntoIterator<Item = &'e Event>,
    loop_run_id: &str,
) -> Result<CtxOwners, MeshError> {
    let mut owners = CtxOwners::new();
    let of_run = log
        .into_iter()
        .filter(|e| e.step_run_id == loop_run_id && EventType::of(e) == Some(EventType::TaskDone));
    for e in of_run {
        let td: TaskDone = payloads::decode_typed(e)?;
        if td.ctx_refused {
            continue;
        }
        if td.set_ctx_ref.is_some() {
            return Err(MeshError::Invalid(format!(
                "task.done of task run {} carries its set_ctx by reference: the log was not hydrated",
                e.task_run_id
            )));
        }
        let Some(patch) = claimed_patch(&td) else {
            continue;
        };
        let w = writer(&e.step, td.index, &e.task);
        if let CtxClaim::Write(o) =
            claim_ctx_keys(Some(&owners), &hashes(&patch), &w, &e.task_run_id)
        {
            owners = o;
        }
    }
    Ok(owners)
}

/// What `td` claims of `ctx` in [`fold`]: its `set_ctx` without the keys
/// that went to the loop's reducers; `None` when it was refused or that
/// leaves nothing.
pub(crate) fn claimed_patch(td: &TaskDone) -> Option<Map<String, Value>> {
    let mut patch = td.set_ctx.clone().filter(|_| !td.ctx_refused)?;
    patch.retain(|k, _| !td.reduced.contains(k));
    (!patch.is_empty()).then_some(patch)
}

/// The parallel loop runs the log says are running: a `loop.started` of
/// mode `parallel` and no `loop.done` of the same step-run (the
/// loop-supervisor drops a run's claims when it ends).
pub fn open_parallel_runs<'e>(
    log: impl IntoIterator<Item = &'e Event>,
) -> Result<Vec<String>, MeshError> {
    let mut open: Vec<String> = Vec::new();
    for e in log {
        match EventType::of(e) {
            Some(EventType::LoopStarted) => {
                let p: LoopStarted = payloads::decode_typed(e)?;
                if p.mode == Some(noetl_core::LoopMode::Parallel) && !open.contains(&e.step_run_id)
                {
                    open.push(e.step_run_id.clone());
                }
            }
            Some(EventType::LoopDone) => open.retain(|r| r != &e.step_run_id),
            _ => {}
        }
    }
    Ok(open)
}

/// What [`restore`] found.
#[derive(Debug, Default)]
pub struct Restored {
    /// The owners written back (`None`: nothing was).
    pub written: Option<CtxOwners>,
    /// The log holds claims of the running loop run: a record of them is
    /// there now (written back, or written meanwhile), unless purged
    /// again since. A missing record is the run's first claim only when
    /// this is false.
    pub held: bool,
}

/// The claims of a running parallel loop run (`loop_run_id` of `eid`)
/// whose record is missing, folded from the events ([`fold`]) and written
/// back create-only (another replica may have written it meanwhile; then
/// that one stands). Nothing is written when the log holds no claim or
/// the loop run ended.
pub async fn restore(mesh: &Mesh, eid: &str, loop_run_id: &str) -> Result<Restored, MeshError> {
    // Only the loop run's claims and end are kept of the log as it is read.
    let log = crate::replay::hydrated_where(mesh, eid, |e| {
        e.step_run_id == loop_run_id
            && matches!(
                EventType::of(e),
                Some(EventType::TaskDone | EventType::LoopDone)
            )
    })
    .await?;
    if log
        .iter()
        .any(|e| EventType::of(e) == Some(EventType::LoopDone))
    {
        return Ok(Restored::default());
    }
    let owners = fold(&log, loop_run_id)?;
    if owners.is_empty() {
        return Ok(Restored::default());
    }
    let written = kv::create(mesh.ctx_kv(), &Keys::owners(eid, loop_run_id), &owners).await?;
    Ok(Restored {
        written: written.then_some(owners),
        held: true,
    })
}

/// Fold loop run `loop_run_id`'s claims from `log` ([`fold`]) and write
/// them create-only: the owners written, `None` when the log holds no
/// claim or the record was there (claims only grow, and a stored record
/// may hold one whose `task.done` is not in the log yet).
pub async fn write_back<'e>(
    mesh: &Mesh,
    eid: &str,
    loop_run_id: &str,
    log: impl IntoIterator<Item = &'e Event>,
) -> Result<Option<CtxOwners>, MeshError> {
    let owners = fold(log, loop_run_id)?;
    if owners.is_empty() {
        return Ok(None);
    }
    let written = kv::create(mesh.ctx_kv(), &Keys::owners(eid, loop_run_id), &owners).await?;
    Ok(written.then_some(owners))
}

#[cfg(test)]
mod tests;
