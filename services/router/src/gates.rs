//! Concurrency of whole executions (`executor.spec.policy.concurrency`;
//! docs/operations.md, "Concurrency and rate limits"). An execution whose
//! playbook has it asks its key for a slot (in its own name, held until it
//! ends) after its plan and header are stored: acquired, its entry token
//! goes out; else it waits in line (its entry token live, not published,
//! `execution.queued` emitted), is refused (`reject`), or asks the oldest
//! holder to cancel and waits (`cancel-oldest`). Its end releases the slot
//! and starts the head of the line; a sweep every few seconds drops
//! holders that ended without releasing and starts promoted executions a
//! crash left unstarted. The decisions are [`noetl_mesh::gate`]'s.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use noetl_core::model::OnLimit;
use noetl_mesh::{
    event_type::EventType,
    events::{now_ms, EventDraft},
    gate::{self, Ask, ConcRecord, Entry, ExecutionQueued, Owner, Verdict},
    gates, kv,
    plan::PlanRecord,
    Mesh, MeshError,
};
use tokio_util::sync::CancellationToken;

use crate::entry::Initialized;

/// How often the sweep looks at the execution gates.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// What became of an execution that asked for its slot.
#[derive(Debug, PartialEq)]
pub(crate) enum Admitted {
    /// Start it (no limit, or a slot is its), with or without its
    /// `playbook.initialized` (an execution under a key emitted it before
    /// it asked).
    Go(Initialized),
    /// It waits in line.
    Queued,
    /// It must fail with this reason.
    Refused(String),
}

/// The execution's concurrency, its key rendered with its workload.
type Keyed = gates::ExecutionGate;

/// `None`: the playbook has no execution concurrency. `Err`: its key does
/// not render.
fn keyed(plan: &PlanRecord) -> Option<Result<Keyed, String>> {
    gates::execution_gate(plan)
}

/// Ask for the execution's slot (again, on a redelivered request: the same
/// id keeps its slot or its place).
pub(crate) async fn admit(mesh: &Mesh, plan: &PlanRecord) -> Result<Admitted, MeshError> {
    admit_as(mesh, plan, Asking::Start).await
}

/// Take a slot for a resumed execution (docs/operations.md, "Resume"):
/// it never waits in line (a promotion publishes an entry token, and a
/// resumed execution's tokens are others), so a full key refuses it.
pub(crate) async fn admit_resumed(mesh: &Mesh, plan: &PlanRecord) -> Result<Admitted, MeshError> {
    admit_as(mesh, plan, Asking::Resume).await
}

/// Who asks for a slot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asking {
    /// A new execution, before its entry.
    Start,
    /// A resumed one.
    Resume,
}

async fn admit_as(mesh: &Mesh, plan: &PlanRecord, asking: Asking) -> Result<Admitted, MeshError> {
    let Some(k) = keyed(plan) else {
        return Ok(Admitted::Go(Initialized::Emit));
    };
    if asking == Asking::Start {
        // In the log before it may wait or be refused: a queued execution
        // comes back from its events like any other, and a refused one's
        // log names its playbook and source, as its header does.
        crate::entry::emit_initialized(mesh, plan).await?;
    }
    let k = match k {
        Err(why) => return Ok(Admitted::Refused(why)),
        Ok(k) => k,
    };
    let eid = plan.execution_id.as_str();
    let store = mesh.gates_kv();
    let owner = Owner {
        execution_id: eid.to_string(),
        ..Default::default()
    };
    let limit = k.concurrency.limit;
    // The record is read (or rebuilt from the log) first; purged again
    // before the ask is written, it is rebuilt again, never started
    // afresh without the holders and the line the log holds.
    let mut decided = None;
    for _ in 0..kv::RESTORES {
        let holders = record(mesh, &k)
            .await?
            .map(|r| r.holders)
            .unwrap_or_default();
        let now = now_ms();
        let gone = ended(mesh, &holders, eid, now).await?;
        let ask = Ask {
            key: &k.key,
            id: eid,
            owner: &owner,
            limit,
            now_ms: now,
            lease_ms: 0,
            wait_ttl_ms: 0,
            queue: asking == Asking::Start && k.concurrency.on_limit != OnLimit::Reject,
            gone: &gone,
        };
        decided = gates::acquire_kept(store, &k.kv_key, &ask).await?;
        if decided.is_some() {
            break;
        }
    }
    let Some(d) = decided else {
        return Err(kv::conflict(store, &k.kv_key, kv::RESTORES));
    };
    start_promoted(mesh, &k.kv_key, &d.promoted).await?;
    match d.verdict {
        Verdict::Acquired => Ok(Admitted::Go(Initialized::Emitted)),
        Verdict::Rejected { held_by } => Ok(Admitted::Refused(format!(
            "concurrency key `{}` is at its limit of {limit}: held by executions {} ({})",
            k.key,
            labels(&held_by),
            match asking {
                Asking::Start => "executor.spec.policy.concurrency, on_limit: reject",
                Asking::Resume =>
                    "a resumed execution does not wait in line: resume it when a slot is free",
            }
        ))),
        Verdict::Wait {
            position, held_by, ..
        } => {
            queue(mesh, plan, &k, position, &held_by).await?;
            Ok(Admitted::Queued)
        }
    }
}

/// Record that the execution waits: `execution.queued` (once per place),
/// and with `cancel-oldest` the cancellation of a holder, the oldest for
/// the first in line, the next oldest for the second...
async fn queue(
    mesh: &Mesh,
    plan: &PlanRecord,
    k: &Keyed,
    position: usize,
    held_by: &[Entry],
) -> Result<(), MeshError> {
    let eid = plan.execution_id.as_str();
    let mut oldest: Vec<&Entry> = held_by.iter().collect();
    oldest.sort_by_key(|h| h.since_ms);
    let cancelling = match k.concurrency.on_limit {
        OnLimit::CancelOldest if !oldest.is_empty() => {
            Some(oldest[(position - 1) % oldest.len()].id.clone())
        }
        _ => None,
    };
    let on_limit = match k.concurrency.on_limit {
        OnLimit::CancelOldest => "cancel-oldest",
        _ => "queue",
    };
    let queued = ExecutionQueued {
        key: k.key.clone(),
        limit: k.concurrency.limit,
        holders: held_by.iter().map(|h| h.id.clone()).collect(),
        position,
        on_limit: on_limit.to_string(),
        cancelling: cancelling.clone(),
        entry_step: plan
            .playbook
            .entry_step()
            .map(|s| s.step.clone())
            .unwrap_or_default(),
    };
    let place = position.to_string();
    let ev = EventDraft {
        execution_id: eid,
        trace_id: &plan.trace_id,
        discriminator: &place,
        ..Default::default()
    }
    .build(&queued);
    mesh.emit(&ev).await?.wait().await?;
    tracing::info!(execution_id = %eid, key = %k.key, limit = k.concurrency.limit, position, "execution queued behind its concurrency key");
    if let Some(victim) = cancelling {
        let reason = format!(
            "cancelled to make room under concurrency key `{}` (limit {}) for execution {eid} (on_limit: cancel-oldest)",
            k.key, k.concurrency.limit
        );
        mesh.request_cancel(&victim, &reason).await?;
    }
    Ok(())
}

/// Release the slot (or place in line) of an ended execution and start
/// the head of the line. Idempotent: the end is handled again after a
/// crash, and a slot released twice changes nothing.
pub(crate) async fn release(mesh: &Mesh, eid: &str) -> Result<(), MeshError> {
    let plan = match mesh.plans().get(mesh, eid).await {
        Ok(p) => p,
        // Lost with the rest of an ended execution's records: its events
        // still name its key, and the line behind it waits on this.
        Err(MeshError::NoPlan { .. }) => {
            match Box::pin(noetl_mesh::rebuild::logged_plan(mesh, eid)).await? {
                Some(plan) => Arc::new(plan),
                None => return Ok(()),
            }
        }
        Err(e) => return Err(e),
    };
    let Some(Ok(k)) = keyed(&plan) else {
        return Ok(());
    };
    let store = mesh.gates_kv();
    // Purged again between the read (or rebuild) and the release: rebuilt
    // again, or the line would wait for a release that never comes.
    for _ in 0..kv::RESTORES {
        let Some(rec) = record(mesh, &k).await? else {
            return Ok(());
        };
        let now = now_ms();
        let gone = ended(mesh, &rec.holders, eid, now).await?;
        if let Some(promoted) = gates::release_kept(store, &k.kv_key, eid, now, &gone).await? {
            return start_promoted(mesh, &k.kv_key, &promoted).await;
        }
    }
    Err(kv::conflict(store, &k.kv_key, kv::RESTORES))
}

/// The record of execution key `k`; a missing one (lost, or the key's
/// first use) is rebuilt from the log first
/// ([`gates::rebuild_execution`]), one rebuild per key at a time in this
/// process, so a burst of requests on a new key reads the log once.
async fn record(mesh: &Mesh, k: &Keyed) -> Result<Option<ConcRecord>, MeshError> {
    static REBUILDING: std::sync::OnceLock<
        std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    > = std::sync::OnceLock::new();
    let store = mesh.gates_kv();
    if let Some(rec) = gates::read(store, &k.kv_key).await? {
        return Ok(Some(rec));
    }
    let one = {
        let mut map = REBUILDING
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.entry(k.kv_key.clone()).or_default().clone()
    };
    let _one = one.lock().await;
    if let Some(rec) = gates::read(store, &k.kv_key).await? {
        return Ok(Some(rec));
    }
    // Boxed: the rare path's future (a fold of the log) stays out of the
    // request handler's, which every service task carries.
    Box::pin(gates::rebuild_execution(mesh, k)).await.map(Some)
}

/// The holders (other than `skip`) whose execution ended, or whose header
/// is missing for longer than [`gate::MISSING_GRACE_MS`].
async fn ended(
    mesh: &Mesh,
    holders: &[Entry],
    skip: &str,
    now: u64,
) -> Result<Vec<String>, MeshError> {
    let mut gone = Vec::new();
    for h in holders.iter().filter(|h| h.id != skip) {
        let over = match mesh.exec_header(&h.id).await? {
            Some(header) => header.status.is_terminal(),
            None => now.saturating_sub(h.since_ms) > gate::MISSING_GRACE_MS,
        };
        if over {
            gone.push(h.id.clone());
        }
    }
    Ok(gone)
}

/// Publish the entry of promoted executions still running with only their
/// entry token live (idempotent), then record them started.
async fn start_promoted(mesh: &Mesh, kv_key: &str, promoted: &[Entry]) -> Result<(), MeshError> {
    if promoted.is_empty() {
        return Ok(());
    }
    let mut started = Vec::new();
    for e in promoted {
        if let Some(plan) = still_queued(mesh, &e.id).await? {
            // Queued by a version that emitted it only at the start.
            let init = match mesh
                .last_event_seq(&e.id, EventType::PlaybookInitialized)
                .await?
            {
                Some(_) => Initialized::Emitted,
                None => Initialized::Emit,
            };
            crate::entry::publish_entry(mesh, &plan, init).await?;
            tracing::info!(execution_id = %e.id, "queued execution started");
        }
        started.push(e.id.clone());
    }
    gates::mark_started(mesh.gates_kv(), kv_key, &started).await
}

/// The plan of execution `eid` when it still waits for its entry (running,
/// its entry token its only live one); its header and plan are written
/// back from its events when they were lost.
async fn still_queued(mesh: &Mesh, eid: &str) -> Result<Option<Arc<PlanRecord>>, MeshError> {
    let mut header = mesh.exec_header(eid).await?;
    if header.is_none() && Box::pin(noetl_mesh::rebuild::restore_header(mesh, eid)).await? {
        header = mesh.exec_header(eid).await?;
    }
    let entry = crate::entry::entry_token_id(eid);
    let waiting = header.is_some_and(|h| {
        !h.status.is_terminal() && h.live.len() == 1 && h.live[0].token_id == entry
    });
    if !waiting {
        return Ok(None);
    }
    match mesh.plans().get(mesh, eid).await {
        Ok(plan) => Ok(Some(plan)),
        Err(MeshError::NoPlan { .. }) => {
            Box::pin(noetl_mesh::rebuild::restore_plan(mesh, eid)).await
        }
        Err(err) => Err(err),
    }
}

/// How many sweeps pass between two looks for lines whose record is gone
/// ([`restore_lost`]).
const RESTORE_EVERY: u64 = 6;

/// Rebuild from the log the record of every key an execution still waits
/// on, when that record is gone (a lost bucket, [`record`]): the sweep
/// walks the records there are, and an end released while its record
/// was gone starts nobody, so nothing else would start such an execution.
/// One listing of the stream's subjects (which executions queued and have
/// not ended) and one read of the records; then one header read for each
/// execution no record names ([`unlisted`]: none, unless records were lost).
pub async fn restore_lost(mesh: &Mesh) -> Result<(), MeshError> {
    let queued = noetl_mesh::rebuild::queued(mesh).await?;
    if queued.is_empty() {
        return Ok(());
    }
    let records = gates::executions(mesh.gates_kv()).await?;
    let mut looked = std::collections::HashSet::new();
    for eid in unlisted(queued, &records) {
        let Some(plan) = still_queued(mesh, &eid).await? else {
            continue;
        };
        let Some(Ok(k)) = keyed(&plan) else {
            continue;
        };
        if looked.insert(k.kv_key.clone()) {
            record(mesh, &k).await?;
        }
    }
    Ok(())
}

/// The executions of `queued` that no record of `records` names as a
/// holder or a waiter: only their records can be lost.
fn unlisted(queued: Vec<String>, records: &[(String, ConcRecord)]) -> Vec<String> {
    let named: std::collections::HashSet<&str> = records
        .iter()
        .flat_map(|(_, r)| r.holders.iter().chain(&r.waiting))
        .map(|e| e.id.as_str())
        .collect();
    queued
        .into_iter()
        .filter(|eid| !named.contains(eid.as_str()))
        .collect()
}

/// One pass over the execution gates: drop holders that ended without
/// releasing (a crash), give their slots to the line, and start promoted
/// executions not yet started. Reads one header per holder.
pub async fn sweep(mesh: &Mesh) -> Result<(), MeshError> {
    let store = mesh.gates_kv();
    for (kv_key, rec) in gates::executions(store).await? {
        if rec.holders.is_empty() && rec.waiting.is_empty() {
            continue;
        }
        let now = now_ms();
        let gone = ended(mesh, &rec.holders, "", now).await?;
        let room = rec.holders.len() < rec.limit as usize && !rec.waiting.is_empty();
        let mut pending: Vec<Entry> = rec
            .holders
            .iter()
            .filter(|h| h.pending_start && !gone.contains(&h.id))
            .cloned()
            .collect();
        if !gone.is_empty() || room {
            pending.extend(gates::release(store, &kv_key, "", now, &gone).await?);
        }
        start_promoted(mesh, &kv_key, &pending).await?;
    }
    Ok(())
}

/// Sweep every [`SWEEP_EVERY`] until `shutdown`; a failed pass is logged
/// and the next one tries again.
pub async fn sweep_loop(mesh: Mesh, shutdown: CancellationToken) -> Result<(), MeshError> {
    for pass in 0u64.. {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        if pass % RESTORE_EVERY == 0 {
            if let Err(e) = restore_lost(&mesh).await {
                tracing::warn!(error = %e, "looking for lost execution gates failed; trying again");
            }
        }
        if let Err(e) = sweep(&mesh).await {
            tracing::warn!(error = %e, "execution gates sweep failed; trying again");
        }
    }
    Ok(())
}

/// The ids of `entries`, comma-separated.
fn labels(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(Entry::label)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(executor: serde_json::Value, workload: serde_json::Value) -> PlanRecord {
        let playbook: noetl_core::Playbook = serde_json::from_value(json!({
            "apiVersion": "noetl.io/v2", "kind": "Playbook",
            "metadata": {"name": "p", "path": "t/p"},
            "executor": executor,
            "workflow": [{"step": "start"}],
        }))
        .unwrap();
        PlanRecord::new("e1".into(), "p.yaml".into(), playbook, workload)
    }

    #[test]
    fn an_execution_key_renders_from_the_workload_or_defaults_to_the_path() {
        let p = plan(
            json!({"spec": {"policy": {"concurrency": {"key": "c-{{ workload.customer }}", "limit": 2}}}}),
            json!({"customer": "a"}),
        );
        let k = keyed(&p).unwrap().unwrap();
        assert_eq!(k.key, "c-a");
        assert_eq!(k.kv_key, noetl_mesh::keys::Keys::gate_execution("c-a"));
        assert_eq!(k.concurrency.on_limit, OnLimit::Queue);
        let p = plan(
            json!({"spec": {"policy": {"concurrency": {"limit": 1, "on_limit": "reject"}}}}),
            json!({}),
        );
        let k = keyed(&p).unwrap().unwrap();
        assert_eq!(k.key, "t/p");
        assert_eq!(k.concurrency.on_limit, OnLimit::Reject);
        assert!(keyed(&plan(json!({"spec": {}}), json!({}))).is_none());
        let p = plan(
            json!({"spec": {"policy": {"concurrency": {"key": "{{ workload. }}", "limit": 1}}}}),
            json!({}),
        );
        assert!(keyed(&p).unwrap().is_err());
    }

    fn entry(id: &str) -> Entry {
        Entry {
            id: id.into(),
            owner: Owner {
                execution_id: id.into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn holders_are_named_in_order() {
        assert_eq!(labels(&[entry("e1"), entry("e2")]), "e1, e2");
    }

    #[test]
    fn only_queued_executions_no_record_names_are_looked_at() {
        let rec = |holders: &[&str], waiting: &[&str]| ConcRecord {
            key: "k".into(),
            limit: 1,
            holders: holders.iter().map(|id| entry(id)).collect(),
            waiting: waiting.iter().map(|id| entry(id)).collect(),
            ..Default::default()
        };
        let records = vec![
            ("a".to_string(), rec(&["e1"], &["e2", "e3"])),
            ("b".to_string(), rec(&["e4"], &[])),
        ];
        let queued = ["e2", "e5", "e4", "e6"].map(String::from).to_vec();
        assert_eq!(unlisted(queued.clone(), &records), ["e5", "e6"]);
        assert_eq!(unlisted(queued.clone(), &[]), queued, "a lost bucket");
    }
}
