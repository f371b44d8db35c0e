//! Resuming a failed or cancelled execution where it stopped (`noetl exec
//! resume`, docs/operations.md "Resume"): the same execution id and trace
//! go on; finished steps and finished loop iterations stand (their results
//! and `ctx` writes too); the step-runs that were live when it stopped run
//! again, with fresh ids, and a loop among them takes only the iterations
//! that did not finish. `--from STEP` starts at a step instead, and the
//! steps reachable from it that ran are superseded (`step.superseded`).
//!
//! A client asks with `execution.resume_requested` ([`ResumeRequested`]);
//! the router, the only writer of headers, decides ([`decide`], pure) and
//! applies it under compare-and-set, conditioned on the resume count the
//! client saw, so two clients resuming at once resume it once.
//! [`prepare`] reads what the decision needs, for the router and for the
//! client's own check (a clear error before anything is asked).

use std::collections::{BTreeMap, BTreeSet};

use noetl_core::Playbook;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ids::derive_id;
use crate::keys::Keys;
pub use crate::payloads::Resumed;
use crate::plan::PlanRecord;
pub use crate::state::resumed_header;
use crate::state::{ExecHeader, ExecStatus, StepRecord, TokenRecord};
use crate::{kv, Mesh, MeshError};

/// `execution.resume_requested`: what a client asks.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ResumeRequested {
    /// The execution's resume count the client saw: the router resumes
    /// only while it is still that (a second request for the same stop
    /// changes nothing).
    pub expect_resumes: u32,
    /// Start at this step instead of where the execution stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Workload values to change (`--set k=v`), merged into the workload.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub set: Map<String, Value>,
    /// Resume under this catalog version of the playbook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub playbook_version: Option<u32>,
    /// Who asked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
}

/// `step.superseded`: a resume from an earlier step supersedes this step's
/// last run (its result stands until the step runs again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Superseded {
    /// The step-run superseded.
    pub step_run_id: String,
    /// The step the execution restarted at.
    pub from: String,
}

/// Under [`Keys::loop_carry`] (bucket loop): the run of the same loop step
/// that a resumed execution's new run continues (written by the router
/// when it resumes, read by the loop-supervisor when the new run starts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopCarry {
    /// The step-run id of the run that stopped.
    pub from: String,
}

/// Mark the stopped loop run `srid` of execution `eid`, which a resume
/// retires (a new run continues it, or a restart `--from` leaves it),
/// superseded (its loop-bucket record's `superseded`, the
/// loop-supervisor's `LoopRun::superseded`) before the execution runs
/// again: from then on that run counts no report and starts no iteration.
/// Written here, ahead of the header, because a run stopped by a cancel
/// only holds its dispatch while its execution is stopped: marked later
/// (by the new run's start), it went on starting iterations in the
/// moment between the resume and that start. Idempotent; nothing when the
/// record is missing or the run ended.
pub async fn supersede_loop_run(mesh: &Mesh, eid: &str, srid: &str) -> Result<(), MeshError> {
    kv::update(
        mesh.loop_kv(),
        &Keys::loop_run(eid, srid),
        |r: Option<&Value>| match superseded_record(r) {
            Some(v) => kv::Cas::Write(v),
            None => kv::Cas::Keep,
        },
    )
    .await?;
    Ok(())
}

/// A loop run record (`record`) marked superseded; `None` when there is
/// nothing to mark: missing, marked already, or ended (`done_emitted`).
fn superseded_record(record: Option<&Value>) -> Option<Value> {
    let Some(Value::Object(m)) = record else {
        return None;
    };
    let set = |k: &str| m.get(k) == Some(&Value::Bool(true));
    if set("superseded") || set("done_emitted") {
        return None;
    }
    let mut m = m.clone();
    m.insert("superseded".into(), Value::Bool(true));
    Some(Value::Object(m))
}

crate::payloads::payload_of! {
    ResumeRequested => ExecutionResumeRequested,
    Superseded => StepSuperseded,
}

/// Why an execution cannot be resumed (as asked).
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// No such execution.
    #[error("execution {0} does not exist")]
    NotFound(String),
    /// It is running or completed.
    #[error("execution {eid} is {status}: only a failed or cancelled execution can be resumed")]
    NotStopped {
        /// Execution id.
        eid: String,
        /// Its status.
        status: String,
    },
    /// It failed before its plan was stored (bad playbook, missing
    /// credential...): there is nothing to resume.
    #[error("execution {eid} failed before its first step ({reason}); start it again with `noetl exec retry {eid}`")]
    NeverStarted {
        /// Execution id.
        eid: String,
        /// Why it failed.
        reason: String,
    },
    /// `--from` names no step of the playbook.
    #[error("execution {eid}: `--from {step}` names no step of {playbook}")]
    NoSuchStep {
        /// Execution id.
        eid: String,
        /// The step named.
        step: String,
        /// The playbook (and version) searched.
        playbook: String,
    },
    /// The version asked lacks a step the execution still has to run.
    #[error("execution {eid} cannot resume under {playbook}: it has no step {step:?}, which the execution still has to run")]
    StepGone {
        /// Execution id.
        eid: String,
        /// The missing step.
        step: String,
        /// The playbook version.
        playbook: String,
    },
    /// Nothing was live when it stopped (an execution stopped before this
    /// was recorded).
    #[error("execution {eid} stopped with no step-run to run again; name one with `--from STEP`")]
    NothingToRun {
        /// Execution id.
        eid: String,
    },
    /// `--playbook-version` for an execution not started from the catalog,
    /// or a version that does not load.
    #[error("execution {eid}: --playbook-version {version}: {why}")]
    Version {
        /// Execution id.
        eid: String,
        /// The version asked.
        version: u32,
        /// Why it cannot be used.
        why: String,
    },
    /// Its concurrency key has no free slot (a resumed execution does not
    /// wait in line).
    #[error("execution {eid} cannot resume now: {why}")]
    Busy {
        /// Execution id.
        eid: String,
        /// The key, its limit and its holders.
        why: String,
    },
    /// No router recorded the resume in time.
    #[error("no router recorded the resume of {eid} within {secs} s (is a router running?)")]
    NotRecorded {
        /// Execution id.
        eid: String,
        /// How long it waited.
        secs: u64,
    },
    /// Reading the mesh failed.
    #[error(transparent)]
    Mesh(#[from] MeshError),
}

/// What [`decide`] reads.
pub struct Decide<'a> {
    /// The execution's header.
    pub header: &'a ExecHeader,
    /// The playbook it resumes under.
    pub playbook: &'a Playbook,
    /// How that playbook is named in errors (`path@v3`).
    pub playbook_name: &'a str,
    /// Its step records, by step name.
    pub records: &'a BTreeMap<String, StepRecord>,
    /// `--from`.
    pub from: Option<&'a str>,
}

/// What a resume does.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The tokens that go live (fresh ids).
    pub tokens: Vec<TokenRecord>,
    /// The steps superseded by `--from` (step, its last step-run), in
    /// workflow order.
    pub superseded: Vec<(String, String)>,
    /// Loop steps whose new run continues the stopped one: (new step-run
    /// id, stopped step-run id).
    pub continues: Vec<(String, String)>,
    /// Join steps that fire again with the merged args of their stopped
    /// firing: (step, new token id, stopped token id).
    pub refires: Vec<(String, String, String)>,
    /// Every stopped token (step-run) id: none of them goes on, each loop
    /// run among them is marked superseded before the execution runs again
    /// ([`supersede_loop_run`]), whether a new run continues it or a
    /// restart `--from` leaves it.
    pub retired: Vec<String>,
}

/// The id of the token that runs `old` again at resume `n`.
pub fn again_id(old: &str, n: u32) -> String {
    derive_id(&[old, "resume", &n.to_string()])
}

/// The id of the token that restarts at `step` at resume `n` of `eid`.
pub fn from_id(eid: &str, step: &str, n: u32) -> String {
    derive_id(&[eid, "resume-from", step, &n.to_string()])
}

/// What resuming `d.header` does, or why it cannot: a failed or cancelled
/// execution runs its stopped tokens again (fresh ids, same args), each of
/// whose steps must exist in `d.playbook`; with `from`, one token at that
/// step, superseding every step reachable from it that has a record.
pub fn decide(d: &Decide<'_>) -> Result<Decision, ResumeError> {
    let h = d.header;
    let eid = h.execution_id.as_str();
    if !matches!(h.status, ExecStatus::Failed | ExecStatus::Cancelled) {
        return Err(ResumeError::NotStopped {
            eid: eid.to_string(),
            status: format!("{:?}", h.status).to_lowercase(),
        });
    }
    let n = h.resumes + 1;
    if let Some(from) = d.from {
        if d.playbook.step(from).is_none() {
            return Err(ResumeError::NoSuchStep {
                eid: eid.to_string(),
                step: from.to_string(),
                playbook: d.playbook_name.to_string(),
            });
        }
        // The stopped token of that step, if any, gives its args.
        let args = (h.stopped.iter())
            .find(|t| t.step == from)
            .map(|t| t.args.clone())
            .unwrap_or(Value::Null);
        let token = TokenRecord {
            args,
            ..TokenRecord::new(from_id(eid, from, n), from)
        };
        let reach = reachable(d.playbook, from);
        let superseded = (d.playbook.workflow.iter())
            .filter(|s| reach.contains(s.step.as_str()))
            .filter_map(|s| {
                let r = d.records.get(&s.step)?;
                Some((s.step.clone(), r.last_step_run_id.clone()))
            })
            .collect();
        return Ok(Decision {
            tokens: vec![token],
            superseded,
            continues: Vec::new(),
            refires: Vec::new(),
            retired: retired(h),
        });
    }
    if h.stopped.is_empty() {
        return Err(ResumeError::NothingToRun {
            eid: eid.to_string(),
        });
    }
    let mut out = Decision {
        tokens: Vec::new(),
        superseded: Vec::new(),
        continues: Vec::new(),
        refires: Vec::new(),
        retired: retired(h),
    };
    for old in &h.stopped {
        let Some(step) = d.playbook.step(&old.step) else {
            return Err(ResumeError::StepGone {
                eid: eid.to_string(),
                step: old.step.clone(),
                playbook: d.playbook_name.to_string(),
            });
        };
        let token = TokenRecord {
            token_id: again_id(&old.token_id, n),
            ..old.clone()
        };
        if step.loop_.is_some() {
            out.continues
                .push((token.token_id.clone(), old.token_id.clone()));
        }
        out.refires.push((
            old.step.clone(),
            token.token_id.clone(),
            old.token_id.clone(),
        ));
        out.tokens.push(token);
    }
    Ok(out)
}

/// The ids of `h`'s stopped tokens.
fn retired(h: &ExecHeader) -> Vec<String> {
    h.stopped.iter().map(|t| t.token_id.clone()).collect()
}

/// The steps reachable from `from` along arcs (itself included).
fn reachable<'p>(playbook: &'p Playbook, from: &'p str) -> BTreeSet<&'p str> {
    let mut seen = BTreeSet::from([from]);
    let mut todo = vec![from];
    while let Some(name) = todo.pop() {
        let Some(step) = playbook.step(name) else {
            continue;
        };
        for arc in step.next.iter().flat_map(|n| &n.arcs) {
            if seen.insert(arc.step.as_str()) {
                todo.push(arc.step.as_str());
            }
        }
    }
    seen
}

/// The plan the execution runs under from now on: `playbook` and its
/// catalog name (`path@v<N>`) when a version was asked (its workload
/// defaults under the execution's workload), `set` merged into the
/// workload, and its start (from which the execution's deadline counts)
/// now.
pub fn resumed_plan(
    old: &PlanRecord,
    playbook: Option<(Playbook, String)>,
    set: &Map<String, Value>,
    now_ms: u64,
) -> PlanRecord {
    let mut plan = old.clone();
    if let Some((p, name)) = playbook {
        let mut workload = Value::Object(p.workload.clone());
        noetl_core::merge::deep_merge(&mut workload, &old.workload);
        plan.workload = workload;
        plan.playbook = std::sync::Arc::new(p);
        plan.source_name = name;
    }
    if !set.is_empty() {
        noetl_core::merge::deep_merge(&mut plan.workload, &Value::Object(set.clone()));
    }
    plan.started_ms = now_ms;
    // A fresh record: the step index and references are computed again.
    plan.without_derived()
}

/// What [`prepare`] read and decided.
pub struct Prepared {
    /// The header as read.
    pub header: ExecHeader,
    /// The plan as it will be stored.
    pub plan: PlanRecord,
    /// The decision.
    pub decision: Decision,
}

/// Read what resuming `eid` as `req` asks and decide it (no write).
pub async fn prepare(
    mesh: &Mesh,
    eid: &str,
    req: &ResumeRequested,
) -> Result<Prepared, ResumeError> {
    let header = stopped_header(mesh, eid)
        .await?
        .ok_or_else(|| ResumeError::NotFound(eid.to_string()))?;
    let old: PlanRecord = match kv::get(mesh.exec_kv(), &Keys::plan(eid)).await? {
        Some(p) => p,
        None if header.status.is_terminal() => {
            return Err(ResumeError::NeverStarted {
                eid: eid.to_string(),
                reason: header.error.clone().unwrap_or_default(),
            })
        }
        None => {
            return Err(ResumeError::Mesh(MeshError::NoPlan {
                execution_id: eid.to_string(),
            }))
        }
    };
    let (playbook, name) = match req.playbook_version {
        Some(v) => {
            let (p, name) = versioned(mesh, &old, v).await?;
            (Some(p), name)
        }
        None => (None, old.source_name.clone()),
    };
    let runs_under = playbook.as_ref().unwrap_or(&old.playbook);
    // Step records by name (keys encode names: matched to the steps').
    let names: BTreeMap<String, &str> = (runs_under.workflow.iter())
        .chain(&old.playbook.workflow)
        .map(|s| (Keys::step(eid, &s.step), s.step.as_str()))
        .collect();
    let mut records = BTreeMap::new();
    for (key, value) in
        kv::values_matching::<StepRecord>(mesh.exec_kv(), &Keys::steps_of(eid)).await?
    {
        if let Some(name) = names.get(&key) {
            records.insert(name.to_string(), value?);
        }
    }
    let decision = decide(&Decide {
        header: &header,
        playbook: runs_under,
        playbook_name: &name,
        records: &records,
        from: req.from.as_deref(),
    })?;
    let playbook = playbook.map(|p| (p, name));
    let plan = resumed_plan(&old, playbook, &req.set, crate::events::now_ms());
    Ok(Prepared {
        header,
        plan,
        decision,
    })
}

/// The header of `eid`, with the records a resume reads (plan, step
/// records, `ctx`) written back from the events first when it is missing
/// or stopped: lost since the stop (a purge, a storage fault), a finished
/// step's record would make the resume run that step again, and a
/// missing header or plan would refuse the resume as of an execution that
/// does not exist or never started. Create-only, as `noetl admin rebuild`
/// writes (docs/operations.md "Rebuild"): a record that is there stands.
async fn stopped_header(mesh: &Mesh, eid: &str) -> Result<Option<ExecHeader>, MeshError> {
    let header = mesh.exec_header(eid).await?;
    if header.as_ref().is_some_and(|h| !h.status.is_terminal()) {
        return Ok(header);
    }
    let Some(rebuilt) = crate::rebuild::rebuild(mesh, eid, crate::rebuild::Mode::Missing).await?
    else {
        return Ok(header);
    };
    if rebuilt.header || rebuilt.plan || rebuilt.steps > 0 || rebuilt.ctx {
        tracing::warn!(execution_id = %eid, header = rebuilt.header, plan = rebuilt.plan,
            steps = rebuilt.steps, ctx = rebuilt.ctx,
            "records of a stopped execution were missing: rebuilt from the events before its resume");
        mesh.plans().forget(eid);
    }
    mesh.exec_header(eid).await
}

impl Mesh {
    /// Resume `eid` as `req` asks: checked ([`prepare`], and a free slot of
    /// its concurrency key; a refusal is an error naming the reason), asked
    /// of the router with `execution.resume_requested`, and waited for until
    /// a router has recorded it (at most `within`). The request expects the
    /// resume count of the header read here (`req.expect_resumes` is set).
    /// Returns what the resume does; it is the header's resume number
    /// `prepared.header.resumes + 1`.
    pub async fn resume(
        &self,
        eid: &str,
        mut req: ResumeRequested,
        within: std::time::Duration,
    ) -> Result<Prepared, ResumeError> {
        let prepared = prepare(self, eid, &req).await?;
        req.expect_resumes = prepared.header.resumes;
        // Here only: the router takes the slot itself, under compare-and-set.
        if let Some(why) = busy(self, &prepared.plan).await? {
            return Err(ResumeError::Busy {
                eid: eid.to_string(),
                why,
            });
        }
        let ev = crate::events::EventDraft {
            execution_id: eid,
            discriminator: &req.expect_resumes.to_string(),
            ..Default::default()
        }
        .build(&req);
        self.emit(&ev).await?.wait().await?;
        let deadline = std::time::Instant::now() + within;
        loop {
            match self.exec_header(eid).await? {
                Some(h) if h.resumes > req.expect_resumes => return Ok(prepared),
                _ if std::time::Instant::now() > deadline => {
                    return Err(ResumeError::NotRecorded {
                        eid: eid.to_string(),
                        secs: within.as_secs(),
                    })
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    }
}

/// Why the execution's concurrency key has no slot for it now (its other
/// holders still running fill it), or `None`.
async fn busy(mesh: &Mesh, plan: &PlanRecord) -> Result<Option<String>, MeshError> {
    let Some(Ok(g)) = crate::gates::execution_gate(plan) else {
        return Ok(None);
    };
    let Some(rec) = crate::gates::read(mesh.gates_kv(), &g.kv_key).await? else {
        return Ok(None);
    };
    let mut running = Vec::new();
    for h in rec.holders.iter().filter(|h| h.id != plan.execution_id) {
        if mesh
            .exec_header(&h.id)
            .await?
            .is_some_and(|h| !h.status.is_terminal())
        {
            running.push(h.id.clone());
        }
    }
    let limit = g.concurrency.limit as usize;
    Ok((running.len() >= limit).then(|| {
        format!(
            "concurrency key `{}` is at its limit of {limit}: held by executions {}; resume it when a slot is free",
            g.key,
            running.join(", ")
        )
    }))
}

/// Version `version` of the catalog entry the execution was started from,
/// loaded and normalised, and its name (`path@vN`).
async fn versioned(
    mesh: &Mesh,
    old: &PlanRecord,
    version: u32,
) -> Result<(Playbook, String), ResumeError> {
    let eid = old.execution_id.as_str();
    let err = |why: String| ResumeError::Version {
        eid: eid.to_string(),
        version,
        why,
    };
    let path = (old.playbook.metadata.path.clone())
        .or_else(|| {
            let (path, v) = old.source_name.rsplit_once("@v")?;
            v.parse::<u32>().is_ok().then(|| path.to_string())
        })
        .ok_or_else(|| err("it was not started from the catalog (no path)".into()))?;
    let entry = match mesh.catalog().get(&path, Some(version)).await {
        Ok(e) => e,
        Err(crate::catalog::CatalogError::Mesh(e)) => return Err(e.into()),
        Err(e) => return Err(err(e.to_string())),
    };
    let name = format!("{}@v{}", entry.path, entry.version);
    let loaded = noetl_core::load::load_playbook(&entry.yaml, &name)
        .map_err(|e| err(format!("{name} does not load:\n{e}")))?;
    Ok((loaded.playbook, name))
}

#[cfg(test)]
mod tests;
