//! The gates bucket (`<p>_gates`): reading and writing the records of
//! [`crate::gate`] under compare-and-set. Each function reads the record,
//! runs the pure decision inside [`update`] (again when another writer
//! wrote first) and returns what was decided.
//!
//! Many task commands ask one key at the same moment (a parallel loop's
//! iterations): the compare-and-set is [`kv::Contention::Herd`]'s, whose
//! losers wait a random moment before they read again.

use async_nats::jetstream::kv::Store;
use serde::{de::DeserializeOwned, Serialize};

use crate::gate::{self, Ask, ConcRecord, Decision, Entry, RateAsk, RateRecord, Released, Verdict};
use crate::kv::{self, Cas};
use crate::MeshError;

/// One gate record, as listed by [`list`].
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// An execution key's (`exec.<hash>`).
    Execution(ConcRecord),
    /// A step key's concurrency (`conc.<hash>`).
    Task(ConcRecord),
    /// A step key's rate (`rate.<hash>`).
    Rate(RateRecord),
}

/// Ask for a slot of the concurrency record under `kv_key`.
pub async fn acquire(store: &Store, kv_key: &str, ask: &Ask<'_>) -> Result<Decision, MeshError> {
    let mut decided: Option<Decision> = None;
    update(store, kv_key, |cur: Option<&ConcRecord>| {
        let d = gate::acquire(cur, ask);
        let write = d.record.clone();
        decided = Some(d);
        Cas::Write(write)
    })
    .await?;
    decided.ok_or_else(|| MeshError::Invalid(format!("gate {kv_key}: no decision was made")))
}

/// [`acquire`] on a record that must be there (an execution key's, just
/// read or rebuilt from the log): `None`, deciding nothing, when it is
/// missing (purged since), so the caller rebuilds it again instead of
/// starting a record that forgets the holders and the line the log holds.
pub async fn acquire_kept(
    store: &Store,
    kv_key: &str,
    ask: &Ask<'_>,
) -> Result<Option<Decision>, MeshError> {
    let mut decided: Option<Decision> = None;
    update(store, kv_key, |cur: Option<&ConcRecord>| {
        decided = cur.map(|cur| gate::acquire(Some(cur), ask));
        match &decided {
            Some(d) => Cas::Write(d.record.clone()),
            None => Cas::Keep,
        }
    })
    .await?;
    Ok(decided)
}

/// Release `id`'s slot or place (`""`: none, a sweep) under `kv_key`,
/// dropping `gone`; returns the waiters promoted (nothing when there is no
/// record).
pub async fn release(
    store: &Store,
    kv_key: &str,
    id: &str,
    now_ms: u64,
    gone: &[String],
) -> Result<Vec<Entry>, MeshError> {
    Ok(release_kept(store, kv_key, id, now_ms, gone)
        .await?
        .unwrap_or_default())
}

/// [`release`], `None` when there is no record (purged since it was read
/// or rebuilt: the caller rebuilds it again, or the line would wait for a
/// release that never comes).
pub async fn release_kept(
    store: &Store,
    kv_key: &str,
    id: &str,
    now_ms: u64,
    gone: &[String],
) -> Result<Option<Vec<Entry>>, MeshError> {
    let mut promoted = Vec::new();
    let mut found = false;
    update(store, kv_key, |cur: Option<&ConcRecord>| {
        promoted.clear();
        found = cur.is_some();
        let Some(cur) = cur else {
            return Cas::Keep;
        };
        let Released {
            record,
            promoted: p,
            changed,
        } = gate::release(cur, id, now_ms, gone);
        if !changed {
            return Cas::Keep;
        }
        promoted = p;
        Cas::Write(record)
    })
    .await?;
    Ok(found.then_some(promoted))
}

/// Extend `lease` under `kv_key`, or claim it again when the record lost
/// it ([`gate::renew`]): true when it had to be claimed again.
pub async fn renew(
    store: &Store,
    kv_key: &str,
    lease: &gate::Lease<'_>,
    now_ms: u64,
) -> Result<bool, MeshError> {
    let mut reclaimed = false;
    update(
        store,
        kv_key,
        |cur: Option<&ConcRecord>| match gate::renew(cur, lease, now_ms) {
            gate::Renewed::Held(r) => {
                reclaimed = false;
                Cas::Write(r)
            }
            gate::Renewed::Reclaimed(r) => {
                reclaimed = true;
                Cas::Write(r)
            }
        },
    )
    .await?;
    Ok(reclaimed)
}

/// Record that the entries of `ids` were started (their entry published).
pub async fn mark_started(store: &Store, kv_key: &str, ids: &[String]) -> Result<(), MeshError> {
    update(store, kv_key, |cur: Option<&ConcRecord>| {
        match cur.and_then(|c| gate::mark_started(c, ids)) {
            Some(r) => Cas::Write(r),
            None => Cas::Keep,
        }
    })
    .await?;
    Ok(())
}

/// Ask for a token of the rate record under `kv_key`.
pub async fn take(store: &Store, kv_key: &str, ask: &RateAsk<'_>) -> Result<Verdict, MeshError> {
    let mut verdict = None;
    update(store, kv_key, |cur: Option<&RateRecord>| {
        // Now, not when the ask was made: a lost write waited meanwhile.
        let fresh = RateAsk {
            now_ms: crate::events::now_ms().max(ask.now_ms),
            ..*ask
        };
        let (r, v) = gate::take(cur, &fresh);
        verdict = Some(v);
        Cas::Write(r)
    })
    .await?;
    verdict.ok_or_else(|| MeshError::Invalid(format!("gate {kv_key}: no decision was made")))
}

/// The gates' compare-and-set: many task commands ask one key at the
/// same moment ([`kv::Contention::Herd`]).
async fn update<T, F>(store: &Store, key: &str, f: F) -> Result<Option<T>, MeshError>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(Option<&T>) -> Cas<T>,
{
    kv::update_under(store, key, kv::Contention::Herd, f).await
}

/// Read the concurrency record under `kv_key`.
pub async fn read(store: &Store, kv_key: &str) -> Result<Option<ConcRecord>, MeshError> {
    kv::get(store, kv_key).await
}

/// Every gate record with its KV key (the bucket is small: one record per
/// key in use). A record that does not decode is its error.
pub async fn list(store: &Store) -> Result<Vec<(String, Result<Record, MeshError>)>, MeshError> {
    let mut out = Vec::new();
    for (k, v) in kv::values_matching::<ConcRecord>(store, "exec.*").await? {
        out.push((k, v.map(Record::Execution)));
    }
    for (k, v) in kv::values_matching::<ConcRecord>(store, "conc.*").await? {
        out.push((k, v.map(Record::Task)));
    }
    for (k, v) in kv::values_matching::<RateRecord>(store, "rate.*").await? {
        out.push((k, v.map(Record::Rate)));
    }
    Ok(out)
}

/// The execution gate records only (what the router's sweep reads).
pub async fn executions(store: &Store) -> Result<Vec<(String, ConcRecord)>, MeshError> {
    let mut out = Vec::new();
    for (k, v) in kv::values_matching::<ConcRecord>(store, "exec.*").await? {
        match v {
            Ok(r) => out.push((k, r)),
            Err(e) => tracing::warn!(key = %k, error = %e, "gate record skipped"),
        }
    }
    Ok(out)
}

impl crate::Mesh {
    /// Whether running execution `eid` waits in line behind its playbook's
    /// concurrency key now: no read for a playbook without one (its plan
    /// is cached), else one read of its key's record. A status read asks
    /// this; a list asks [`Self::queued_executions`] once for its page.
    pub async fn is_queued(&self, eid: &str) -> Result<bool, MeshError> {
        let plan = match self.plans().get(self, eid).await {
            Ok(plan) => plan,
            Err(MeshError::NoPlan { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let Some(Ok(gate)) = execution_gate(&plan) else {
            return Ok(false);
        };
        let now = crate::events::now_ms();
        Ok(read(self.gates_kv(), &gate.kv_key).await?.is_some_and(|r| {
            r.waiting
                .iter()
                .any(|w| w.owner.execution_id == eid && !w.expired(now))
        }))
    }

    /// The executions waiting in line behind their playbook's concurrency
    /// key now (one read of the execution gate records).
    pub async fn queued_executions(&self) -> Result<std::collections::HashSet<String>, MeshError> {
        let now = crate::events::now_ms();
        Ok(executions(self.gates_kv())
            .await?
            .into_iter()
            .flat_map(|(_, r)| r.waiting)
            .filter(|w| !w.expired(now))
            .map(|w| w.owner.execution_id)
            .collect())
    }
}

/// An execution's concurrency (`executor.spec.policy.concurrency`), its
/// key rendered with the execution's workload.
pub struct ExecutionGate {
    /// The policy.
    pub concurrency: noetl_core::model::ExecutionConcurrency,
    /// The key as rendered.
    pub key: String,
    /// Its record's KV key.
    pub kv_key: String,
}

/// The execution gate of `plan`: `None` when its playbook has no execution
/// concurrency, `Err` when its key does not render.
pub fn execution_gate(plan: &crate::plan::PlanRecord) -> Option<Result<ExecutionGate, String>> {
    use noetl_core::concurrency::{default_execution_key, render_key};
    let concurrency = plan.playbook.executor.as_ref()?.concurrency()?;
    let scope = noetl_core::template::Scope::new()
        .workload(plan.workload.clone())
        .execution_id(plan.execution_id.clone());
    let default = || default_execution_key(&plan.playbook);
    Some(
        match render_key(concurrency.key.as_deref(), default, &scope) {
            Ok(key) => Ok(ExecutionGate {
                kv_key: crate::keys::Keys::gate_execution(&key),
                key,
                concurrency,
            }),
            Err(e) => Err(format!(
                "`executor.spec.policy.concurrency.key` does not render: {e}"
            )),
        },
    )
}

/// Whether the log of `eid` shows its entry's work taken up: a
/// `task.started`, or a `step.started` stored on its own (the scheduler's;
/// the router's rides in other events). Two direct reads.
async fn entry_taken_up(mesh: &crate::Mesh, eid: &str) -> Result<bool, MeshError> {
    use crate::event_type::EventType;
    for kind in [EventType::TaskStarted, EventType::StepStarted] {
        if mesh.last_event_seq(eid, kind).await?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The record of execution key `gate` as the log of the running executions
/// under it determines it ([`gate::from_log`]), written create-only: a
/// record written meanwhile stands and is returned. Used when the record
/// is missing (lost, or the key's first use: records are never deleted,
/// so that happens once per key). Reads the events stream's subjects
/// (which executions run: [`crate::rebuild::running`]), each running
/// execution's plan (cached; written back from its events when lost) and,
/// for those under the key, one or two direct reads of their last
/// `workflow.initialized` / `execution.queued`.
pub async fn rebuild_execution(
    mesh: &crate::Mesh,
    gate: &ExecutionGate,
) -> Result<ConcRecord, MeshError> {
    use crate::event_type::EventType;
    let mut logged = Vec::new();
    for eid in crate::rebuild::running(mesh).await? {
        let plan = match mesh.plans().get(mesh, &eid).await {
            Ok(plan) => plan,
            Err(MeshError::NoPlan { .. }) => {
                match crate::rebuild::restore_plan(mesh, &eid).await? {
                    Some(plan) => plan,
                    None => continue,
                }
            }
            Err(e) => return Err(e),
        };
        if !matches!(execution_gate(&plan), Some(Ok(g)) if g.key == gate.key) {
            continue;
        }
        let (started, last) = match mesh
            .last_event(&eid, EventType::WorkflowInitialized)
            .await?
        {
            Some(last) => (true, last),
            None => match mesh.last_event(&eid, EventType::ExecutionQueued).await? {
                Some(last) => (false, last),
                // Asking for its slot right now: its ask adds it.
                None => continue,
            },
        };
        let taken_up = started && entry_taken_up(mesh, &eid).await?;
        logged.push(gate::Logged {
            execution_id: eid,
            started,
            taken_up,
            seq: last.0,
            at_ms: last.1.ts_ms,
        });
    }
    let rec = gate::from_log(&gate.key, gate.concurrency.limit, &logged);
    let store = mesh.gates_kv();
    if kv::create(store, &gate.kv_key, &rec).await? {
        if !logged.is_empty() {
            tracing::warn!(key = %gate.key, holders = rec.holders.len(), waiting = rec.waiting.len(), "execution concurrency record was missing: rebuilt from the events");
        }
        return Ok(rec);
    }
    Ok(read(store, &gate.kv_key).await?.unwrap_or(rec))
}
