//! Writing an execution's records back from its events (`noetl admin
//! rebuild`, docs/operations.md "Rebuild"): the header, the step records,
//! `ctx` (with the writes it holds, so a redelivered write is not applied
//! twice), the plan, the step results kept by name and, of a running
//! execution, its waiters, its pause and the `ctx` claims of its running
//! parallel loop runs, each as the fold of the log gives it
//! ([`crate::fold`], [`crate::ctx_owners`]).

use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::fold::Folded;
use crate::keys::Keys;
use crate::plan::PlanRecord;
use crate::replay::{fold_log, Logged, Until};
use crate::state::ExecHeader;
use crate::{kv, Mesh, MeshError};

/// Which records to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only records that are missing (what the services and `--running`
    /// do: a record that is there is the engine's, newer than any fold).
    Missing,
    /// Every record, over what is stored (`--force`).
    All,
}

/// What a rebuild wrote.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Rebuilt {
    /// The execution.
    pub execution_id: String,
    /// Events folded.
    pub events: usize,
    /// The header was written.
    pub header: bool,
    /// The plan was written.
    pub plan: bool,
    /// Step records written.
    pub steps: usize,
    /// Step results kept by name (those the plan's templates read) written.
    pub results: usize,
    /// `ctx` was written.
    pub ctx: bool,
    /// Waiters (`<eid>.wait.<signal>`) written.
    pub waiters: usize,
    /// The pause record was written.
    pub paused: bool,
    /// `ctx` claims of running parallel loop runs
    /// (`<eid>.owners.<loop_run>`) written.
    pub owners: usize,
    /// Why a record could not be rebuilt, if one could not.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The events say the execution is running (its loop runs and
    /// iteration checkpoints are owed too: `noetl admin rebuild` writes
    /// them through the loop-supervisor and the executor).
    #[serde(skip)]
    pub running: bool,
}

/// The plan the log names, read back: the playbook from the object store
/// (by its reference, checksum verified), the workload and the rest from
/// `playbook.initialized` or the last `execution.resumed` that names them.
/// `None` when the log does not name one (written before the log was
/// complete) or a resume written before resumes named their plan changed
/// it (`--set`, `--playbook-version`): the note says so.
pub async fn plan_of(
    mesh: &Mesh,
    eid: &str,
    folded: &Folded,
) -> Result<Result<PlanRecord, String>, MeshError> {
    let (Some(id), Some(h)) = (&folded.plan, &folded.header) else {
        return Ok(Err(format!(
            "the events of {eid} do not name its plan (no playbook.initialized with `plan`)"
        )));
    };
    if folded.plan_changed_by_resume {
        return Ok(Err(format!(
            "a resume of {eid} changed its plan (--set or --playbook-version), which its events (written before resumes named their plan) name only by key"
        )));
    }
    let playbook = crate::patches::read(mesh.results(), &id.playbook_ref).await?;
    let mut plan = PlanRecord::new(
        eid.to_string(),
        h.source.clone(),
        playbook,
        folded.workload.clone(),
    );
    plan.parent_execution_id = h.parent_execution_id.clone();
    plan.trace_id = folded.trace_id.clone();
    plan.started_ms = id.started_ms;
    plan.parent_iter = id.parent_iter.clone();
    plan.return_step = id.return_step.clone();
    Ok(Ok(plan))
}

/// Rebuild the records of `eid` from its events. `None` when it has no
/// events.
pub async fn rebuild(mesh: &Mesh, eid: &str, mode: Mode) -> Result<Option<Rebuilt>, MeshError> {
    let (folded, again) = fold_read_again(mesh, eid).await?;
    if folded.events == 0 {
        return Ok(None);
    }
    write_records(mesh, eid, &again, &folded, mode)
        .await
        .map(Some)
}

/// The fold of `eid`'s events, read one stored message at a time
/// ([`crate::replay::fold_stored`]), and the events [`write_records`]
/// reads again besides it ([`ReadAgain`]).
pub(crate) async fn fold_read_again(
    mesh: &Mesh,
    eid: &str,
) -> Result<(Folded, Vec<Logged>), MeshError> {
    let mut again = ReadAgain::default();
    crate::replay::fold_stored(mesh, eid, Until::End, &mut |e| again.keeps(e)).await
}

/// The events [`write_records`] reads besides the fold: whether tokens
/// were created ([`header_to_write`]), the parallel loop runs' starts and
/// ends ([`crate::ctx_owners::open_parallel_runs`]) and their iterations'
/// `task.done` that write `ctx` ([`crate::ctx_owners::fold`]). A loop's
/// other iteration events, nearly all of a long loop's log, are not kept.
#[derive(Debug, Default)]
struct ReadAgain {
    /// The parallel loop runs started so far.
    parallel: std::collections::HashSet<String>,
}

impl ReadAgain {
    fn keeps(&mut self, e: &noetl_wire::Event) -> bool {
        use crate::event_type::EventType as T;
        match T::of(e) {
            Some(T::TokenCreated | T::NextSelected | T::LoopDone) => true,
            Some(T::LoopStarted) => {
                let parallel = crate::payloads::decode::<crate::payloads::LoopStarted>(e)
                    .is_ok_and(|p| p.mode == Some(noetl_core::LoopMode::Parallel));
                if parallel {
                    self.parallel.insert(e.step_run_id.clone());
                }
                true
            }
            Some(T::TaskDone) if self.parallel.contains(&e.step_run_id) => {
                // What `ctx_owners::fold` claims from (one it cannot decode,
                // or that is not hydrated, is kept, for it to name).
                crate::payloads::decode::<crate::payloads::TaskDone>(e).map_or(true, |td| {
                    td.set_ctx_ref.is_some() || crate::ctx_owners::claimed_patch(&td).is_some()
                })
            }
            _ => false,
        }
    }
}

/// Write the records `folded` (the fold of `log`) gives.
async fn write_records(
    mesh: &Mesh,
    eid: &str,
    log: &[Logged],
    folded: &Folded,
    mode: Mode,
) -> Result<Rebuilt, MeshError> {
    let mut out = Rebuilt {
        execution_id: eid.to_string(),
        events: folded.events,
        running: folded.is_running(),
        ..Default::default()
    };
    let write = |key: String, value: Value, store: &async_nats::jetstream::kv::Store| {
        let store = store.clone();
        async move {
            match mode {
                Mode::All => kv::put(&store, &key, &value).await.map(|_| true),
                Mode::Missing => kv::create(&store, &key, &value).await,
            }
        }
    };
    let mut entry_step = None;
    match plan_of(mesh, eid, folded).await? {
        Ok(plan) => {
            entry_step = plan.playbook.entry_step().map(|s| s.step.clone());
            // The results templates read by name, as the executor and the
            // loop-supervisor keep them (`result_record`).
            for (step, result) in &folded.results {
                if plan.is_result_referenced(step)
                    && write(Keys::result(eid, step), result.clone(), mesh.exec_kv()).await?
                {
                    out.results += 1;
                }
            }
            out.plan = write(
                Keys::plan(eid),
                crate::payloads::to_value(&plan),
                mesh.exec_kv(),
            )
            .await?;
            if out.plan {
                mesh.plans().forget(eid);
            }
        }
        Err(note) => out.notes.push(note),
    }
    for (step, record) in &folded.steps {
        let key = Keys::step(eid, step);
        if write(key, crate::payloads::to_value(record), mesh.exec_kv()).await? {
            out.steps += 1;
        }
    }
    if !folded.ctx.is_empty() || !folded.applied_writes().is_empty() {
        out.ctx = write(
            eid.to_string(),
            crate::ctx_record::stored(folded),
            mesh.ctx_kv(),
        )
        .await?;
    }
    if folded.is_running() {
        // Create-only whatever the mode: a stored waiter may hold a
        // delivery its events do not have yet.
        for (signal, waiter) in folded.waits.all() {
            if waiter.command.is_empty() {
                out.notes.push(format!(
                    "the wait.started of {eid} for signal `{signal}` carries no command"
                ));
                continue;
            }
            if kv::create(mesh.exec_kv(), &Keys::wait(eid, signal), waiter).await? {
                out.waiters += 1;
            }
        }
        if let Some(record) = folded.pause.owed() {
            out.paused = kv::create(mesh.exec_kv(), &Keys::paused(eid), record).await?;
        }
        let events = || log.iter().map(|l| &l.event);
        for run in crate::ctx_owners::open_parallel_runs(events())? {
            if crate::ctx_owners::write_back(mesh, eid, &run, events())
                .await?
                .is_some()
            {
                out.owners += 1;
            }
        }
    }
    // The header last: readers wait on it, and a header marks the
    // execution as there.
    if let Some(h) = header_to_write(eid, log, folded, entry_step.as_deref()) {
        let value = crate::payloads::to_value(&h);
        out.header = write(Keys::header(eid), value, mesh.exec_kv()).await?;
    }
    Ok(out)
}

/// The header the fold of `log` gives, to write back: with its entry
/// token when that is owed ([`with_entry_owed`]).
fn header_to_write(
    eid: &str,
    log: &[Logged],
    folded: &Folded,
    entry_step: Option<&str>,
) -> Option<ExecHeader> {
    use crate::event_type::EventType;
    let folded = folded.header.as_ref()?;
    // Tokens are created by `token.created` and by the arcs of a
    // `next.selected`.
    let created = log.iter().any(|l| {
        matches!(
            EventType::of(&l.event),
            Some(EventType::TokenCreated | EventType::NextSelected)
        )
    });
    let h = with_entry_owed(folded, created, entry_step);
    if h.live.len() > folded.live.len() {
        tracing::warn!(execution_id = %eid, "header to write back given its entry token, which its events do not name");
    }
    Some(h)
}

/// The header to write back for `header`, the fold's: with its entry
/// token (for `entry_step`, the plan's) when the execution runs with
/// nothing live and no token of it was ever created (`created`: no
/// `token.created`, no `next.selected` in its log). The
/// events name the entry token only once it went out (`token.created`)
/// or the execution queued (`execution.queued`); a first delivery that
/// stopped between `playbook.initialized` and either left neither, and
/// without the token the execution, once started or promoted, waits with
/// nothing to run.
fn with_entry_owed(header: &ExecHeader, created: bool, entry_step: Option<&str>) -> ExecHeader {
    let mut h = header.clone();
    let owed = h.status == crate::state::ExecStatus::Running && h.live.is_empty() && !created;
    if let (true, Some(step)) = (owed, entry_step) {
        let entry = crate::token::entry_token_id(&h.execution_id);
        h.live.push(crate::state::TokenRecord::new(entry, step));
    }
    h
}

/// Write back the missing records of `eid` from `folded`, the fold of
/// its events, folded already by a caller that uses the fold itself (the
/// summary of an ended execution), with the events `log` of them
/// [`fold_read_again`] kept.
pub(crate) async fn write_folded(
    mesh: &Mesh,
    eid: &str,
    log: &[Logged],
    folded: &Folded,
) -> Result<Rebuilt, MeshError> {
    write_records(mesh, eid, log, folded, Mode::Missing).await
}

/// The plan of a running execution whose plan record is missing, written
/// back from its events (create-only: a plan written meanwhile wins) and
/// cached; `None` when its events do not say it is running or do not name
/// its plan.
pub async fn restore_plan(
    mesh: &Mesh,
    eid: &str,
) -> Result<Option<std::sync::Arc<PlanRecord>>, MeshError> {
    let folded = fold_log(mesh, eid, Until::End).await?;
    if !folded.is_running() {
        return Ok(None);
    }
    let plan = match plan_of(mesh, eid, &folded).await? {
        Ok(plan) => plan,
        Err(why) => {
            tracing::warn!(execution_id = %eid, %why, "plan missing and not rebuilt");
            return Ok(None);
        }
    };
    if kv::create(mesh.exec_kv(), &Keys::plan(eid), &plan).await? {
        tracing::warn!(execution_id = %eid, "plan was missing: rebuilt from the events");
    }
    mesh.plans().forget(eid);
    match mesh.plans().get(mesh, eid).await {
        // Purged again before it was read: an outage of the record, not
        // an execution without a plan (that would dead-letter the
        // message); the message comes again.
        Err(MeshError::NoPlan { .. }) => Err(MeshError::Kv {
            bucket: mesh.exec_kv().name.clone(),
            key: Keys::plan(eid),
            message: "written back from the events and purged again before it was read".into(),
        }),
        read => read.map(Some),
    }
}

/// The header of an execution whose header is missing, written back
/// (with its other missing records) from all its events. A boundary the
/// router has not answered yet (its `next.selected` is not in the log:
/// the one being handled, or another handled at the same moment) leaves
/// its token live in the fold ([`crate::fold`]), so whichever boundary of
/// the execution writes the header back first, each boundary still finds
/// its own token live until it is routed; a redelivered boundary already
/// answered finds it ended. Returns whether a header was written.
pub async fn restore_header(mesh: &Mesh, eid: &str) -> Result<bool, MeshError> {
    Ok(restore_header_found(mesh, eid).await? == HeaderFound::Written)
}

/// What [`restore_header_found`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderFound {
    /// The events make no header: there is none to read.
    None,
    /// Written back from the events.
    Written,
    /// The events make one, and one written meanwhile stands: it is
    /// there now, unless purged again since (a reader reads again).
    There,
    /// The events say the execution ended: their header, not written
    /// back (its state was compacted, or purged after the end). A late
    /// message of it is answered from this, and its state stays removed.
    Ended(Box<ExecHeader>),
}

/// [`restore_header`], saying whether the events make a header at all:
/// a reader that finds the header missing after it was written back
/// (purged again) must write it back again, not take it for none. An
/// ended execution's header is not written back ([`HeaderFound::Ended`]).
pub async fn restore_header_found(mesh: &Mesh, eid: &str) -> Result<HeaderFound, MeshError> {
    restore_header_of(mesh, eid, false).await
}

/// The plan execution `eid`'s events name, read back and not written (an
/// ended execution's records are not written back): for a reader that
/// needs only what the plan says (its concurrency key) once the record is
/// gone. `None` when the log names none.
pub async fn logged_plan(mesh: &Mesh, eid: &str) -> Result<Option<PlanRecord>, MeshError> {
    let folded = fold_log(mesh, eid, Until::End).await?;
    Ok(plan_of(mesh, eid, &folded).await?.ok())
}

/// The header of execution `eid`. When it is missing and the events say
/// the execution runs, it is written back from them first (again when it
/// is purged again before it is read, [`kv::RESTORES`] times, then a
/// retryable conflict): what a cancel, a dead letter or a deadline reads
/// before it ends the execution, which must not take a purge for an
/// execution that does not exist. `None`: no header, and the events make
/// none of a running execution (an ended execution's records are not
/// written back for it).
pub async fn running_header(mesh: &Mesh, eid: &str) -> Result<Option<ExecHeader>, MeshError> {
    for _ in 0..=kv::RESTORES {
        if let Some(h) = mesh.exec_header(eid).await? {
            return Ok(Some(h));
        }
        if restore_header_of(mesh, eid, true).await? == HeaderFound::None {
            return Ok(None);
        }
    }
    Err(kv::conflict(
        mesh.exec_kv(),
        &Keys::header(eid),
        kv::RESTORES,
    ))
}

/// [`restore_header_found`]; `running_only`: `None` too when the events
/// say the execution ended.
async fn restore_header_of(
    mesh: &Mesh,
    eid: &str,
    running_only: bool,
) -> Result<HeaderFound, MeshError> {
    let (folded, log) = fold_read_again(mesh, eid).await?;
    let Some(header) = &folded.header else {
        return Ok(HeaderFound::None);
    };
    if !folded.is_running() {
        return Ok(match running_only {
            true => HeaderFound::None,
            false => HeaderFound::Ended(Box::new(header.clone())),
        });
    }
    let written = write_records(mesh, eid, &log, &folded, Mode::Missing).await?;
    if written.header {
        tracing::warn!(execution_id = %eid, events = folded.events, "header was missing: rebuilt from the events");
        return Ok(HeaderFound::Written);
    }
    Ok(HeaderFound::There)
}

/// The executions whose events say they are running: started
/// (`playbook.initialized`) and not ended more often than resumed.
pub async fn running(mesh: &Mesh) -> Result<Vec<String>, MeshError> {
    not_ended_with(mesh, "playbook.initialized").await
}

/// The executions that queued for their concurrency key
/// (`execution.queued`) and, by their events, have not ended.
pub async fn queued(mesh: &Mesh) -> Result<Vec<String>, MeshError> {
    not_ended_with(mesh, "execution.queued").await
}

/// The executions with an event of type `kind` that are not ended more
/// often than resumed.
async fn not_ended_with(mesh: &Mesh, kind: &str) -> Result<Vec<String>, MeshError> {
    use std::collections::BTreeMap;
    let kinds: &[&str] = match kind.starts_with("execution.") {
        true => &["execution.>"],
        false => &[kind, "execution.>"],
    };
    // (of `kind`, ended, resumed) per execution.
    let mut seen: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for (eid, logged, count) in logged_kinds(mesh, kinds).await? {
        let entry = seen.entry(eid).or_default();
        match logged.as_str() {
            k if k == kind => entry.0 += count,
            "execution.completed" | "execution.failed" | "execution.cancelled" => entry.1 += count,
            "execution.resumed" => entry.2 += count,
            _ => {}
        }
    }
    Ok(seen
        .into_iter()
        .filter(|(_, (with, ended, resumed))| *with > 0 && ended <= resumed)
        .map(|(eid, _)| eid)
        .collect())
}

/// `(execution, event type, events stored)` of every execution's events of
/// the types `kinds` (subject tails, wildcards allowed), from the events
/// stream's subjects: one listing per kind, no event read.
async fn logged_kinds(
    mesh: &Mesh,
    kinds: &[&str],
) -> Result<Vec<(String, String, usize)>, MeshError> {
    let failed = |e: &dyn std::fmt::Display| MeshError::Consume {
        consumer: "rebuild: the events stream's subjects".into(),
        message: e.to_string(),
    };
    let stream = mesh
        .js()
        .get_stream(mesh.subjects().events_stream())
        .await
        .map_err(|e| failed(&e))?;
    let prefix = mesh.subjects().events_of("*");
    let prefix = prefix.trim_end_matches(".>");
    let mut out = Vec::new();
    for kind in kinds {
        let mut subjects = stream
            .info_with_subjects(format!("{prefix}.{kind}"))
            .await
            .map_err(|e| failed(&e))?;
        while let Some(s) = subjects.next().await {
            let (subject, count) = s.map_err(|e| failed(&e))?;
            if let Some((eid, kind)) = crate::subjects::event_parts(&subject) {
                out.push((eid.to_string(), kind.to_string(), count));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ExecStatus, TokenRecord};

    #[test]
    fn only_a_running_header_with_nothing_live_and_no_token_created_gets_its_entry() {
        let entry = crate::token::entry_token_id("e1");
        let h = ExecHeader::running("e1".to_string(), Vec::new());
        let given = with_entry_owed(&h, false, Some("start"));
        assert_eq!(given.live, [TokenRecord::new(entry, "start")]);
        assert!(
            with_entry_owed(&h, true, Some("start")).live.is_empty(),
            "a token went out"
        );
        assert!(
            with_entry_owed(&h, false, None).live.is_empty(),
            "no plan to name the step"
        );
        let mut live = h.clone();
        live.live.push(TokenRecord::new("t", "next"));
        assert_eq!(
            with_entry_owed(&live, false, Some("start")).live.len(),
            1,
            "a token is live"
        );
        let mut ended = h.clone();
        ended.status = ExecStatus::Completed;
        assert!(
            with_entry_owed(&ended, false, Some("start"))
                .live
                .is_empty(),
            "ended"
        );
    }
}
