//! What the executors report about a loop run: an iteration ended
//! (`loop.iteration.done` / `.failed`: count it once, dispatch the next
//! ones) or a cursor loop's claim ran (`loop.claimed`: apply it once, run
//! its rows). Either way the state change is written first, then the
//! messages it implies are published, then the loop finishes when nothing
//! is left.

use noetl_core::FailureMode;
use noetl_mesh::{
    handler::StepOf,
    keys::Keys,
    kv::{self, Cas},
    payloads::{self, BatchCompleted, ClaimEnded, IterationEnded, Status},
    runtime::HandlerError,
    Mesh,
};
use noetl_wire::Event;
use serde_json::Value;

use crate::collection::ChunkCache;
use crate::commit::{self, Counter};
use crate::dispatch::{dispatch, publish_claims, redispatch, Window};
use crate::finish::settle;
use crate::state::batches::Sending;
use crate::state::{
    batches,
    cursor::{apply_claim, claimed_of, Applied, Claimed},
    grows, reducers_of, Claim, Counted, LoopRun, RunAt,
};

/// A report being handled, and what its handler shares.
pub(crate) struct Reported<'a> {
    pub mesh: &'a Mesh,
    /// Collection chunks read lately.
    pub chunks: &'a ChunkCache,
    /// Iteration reports waiting for their loop run's write.
    pub counter: &'a Counter,
    /// The execution's plan and the report's step.
    pub at: &'a StepOf,
    /// The report.
    pub ev: &'a Event,
}

impl<'a> Reported<'a> {
    /// The window of loop run `srid`.
    fn window(&self, srid: &'a str) -> Window<'a> {
        Window {
            mesh: self.mesh,
            chunks: self.chunks,
            at: RunAt {
                plan: &self.at.plan,
                step: self.at.step(),
                srid,
            },
        }
    }

    /// Loop run `srid` as stored, or rebuilt from its events when the loop
    /// bucket lost it ([`crate::rebuild::restore`]).
    async fn run(&self, srid: &'a str) -> Result<LoopRun, HandlerError> {
        let key = Keys::loop_run(&self.ev.execution_id, srid);
        if let Some(run) = kv::get::<LoopRun>(self.mesh.loop_kv(), &key).await? {
            return Ok(run);
        }
        crate::rebuild::restore(self.mesh, self.window(srid).at)
            .await?
            .ok_or_else(|| self.unknown_run(srid))
    }

    fn unknown_run(&self, srid: &str) -> HandlerError {
        HandlerError::Refused(format!(
            "{} for unknown loop run {srid} of execution {}",
            self.ev.event_type, self.ev.execution_id
        ))
    }
}

/// An iteration ended: count it once (in one write with the other reports
/// of its run handled now), publish the iterations and claims its count
/// started, and finish the loop when nothing is left.
pub(crate) async fn on_iteration(r: &Reported<'_>, failed: bool) -> Result<(), HandlerError> {
    let report: IterationEnded = payloads::decode_typed(r.ev)?;
    count_reports(r, vec![(report, failed)]).await
}

/// Iterations of a batch ended (`batch.completed`): each counted as its
/// own report would be, all in one write, and the iterations their counts
/// started published together (so they go out as batches again).
pub(crate) async fn on_batch(r: &Reported<'_>) -> Result<(), HandlerError> {
    // Read straight from the report: unfolding it would build each end's
    // event and split its last task's `task.done` out, only to drop both.
    let batch: BatchCompleted = payloads::decode_typed(r.ev)?;
    let refused = |why: String| {
        HandlerError::Refused(format!(
            "batch.completed {} of execution {} (step {:?}): {why}",
            r.ev.event_id, r.ev.execution_id, r.ev.step
        ))
    };
    let mut reports = Vec::with_capacity(batch.ends.len());
    for (k, end) in batch.ends.iter().enumerate() {
        let report = payloads::counted_end(&batch, end)
            .map_err(|e| refused(format!("its end {k} does not decode: {e}")))?;
        let failed = report.status == Status::Error;
        reports.push((report, failed));
    }
    if reports.is_empty() {
        return Err(refused("it reports no iteration's end".into()));
    }
    count_reports(r, reports).await
}

/// Count `reports` (each iteration's end and whether it failed) of one
/// loop run in one write, then publish what their counts started.
async fn count_reports(
    r: &Reported<'_>,
    reports: Vec<(IterationEnded, bool)>,
) -> Result<(), HandlerError> {
    let srid = r.ev.step_run_id.as_str();
    let step = r.at.step();
    let reducers = reducers_of(step);
    // Only loops with growing reducers look before the update (the update
    // reads the run itself: the common path reads it once).
    let growing = reducers.iter().any(|(_, op)| grows(*op));
    let mut claims = Vec::with_capacity(reports.len());
    for (report, failed) in reports {
        let claim = Claim {
            failed,
            reduce: if failed {
                serde_json::Map::new()
            } else {
                report.reduce
            },
            handled: report.handled,
        };
        let claim = if growing {
            first_claim(r, report.index, claim).await?
        } else {
            claim
        };
        claims.push((report.index, claim));
    }
    // Counted in one write with the other reports of this run handled
    // now (unknown run: `None`; counted already, a redelivery: `counted`
    // is false).
    let key = Keys::loop_run(&r.ev.execution_id, srid);
    let shared = commit::Run {
        key: &key,
        fail_fast: step.failure_mode() == FailureMode::FailFast,
        reducers: &reducers,
        step: &step.step,
        batch: crate::messages::step_batch(r.mesh.config().loop_batch, step),
    };
    // The loop bucket lost the run: rebuilt from its events (these
    // reports among them), the count finds them counted; purged again
    // before the count, rebuilt again.
    let mut counted = r.counter.count_many(r.mesh, &shared, &claims).await?;
    let mut restored = 0;
    while counted.is_none() && restored < kv::RESTORES {
        if crate::rebuild::restore(r.mesh, r.window(srid).at)
            .await?
            .is_none()
        {
            return Err(r.unknown_run(srid));
        }
        restored += 1;
        counted = r.counter.count_many(r.mesh, &shared, &claims).await?;
    }
    let Some(counted) = counted else {
        return Err(purged_again(r.mesh, &key, restored));
    };
    let (mut newly, mut started_claims, mut again) = (Vec::new(), Vec::new(), false);
    let mut last = None;
    for (c, (_, claim)) in counted.into_iter().zip(&claims) {
        let Counted {
            run,
            counted,
            newly: n,
            claims: cl,
        } = c;
        if counted {
            let event = if claim.failed { "failed" } else { "done" };
            r.mesh.health().metrics().iteration(event);
            newly.extend(n);
            started_claims.extend(cl);
        } else {
            again = true;
        }
        // The last report's view: the run after every report here
        // (`count_many` views each handler's last).
        if run.is_some() {
            last = run;
        }
    }
    let run = last.ok_or_else(|| r.unknown_run(srid))?;
    let window = r.window(srid);
    let run = if again {
        // Already counted: the write that counted it may have been followed
        // by a crash or a failed publish before its iterations went out.
        // Send the whole window again (deterministic ids: JetStream drops
        // the commands that did go out).
        redispatch(&window, run).await?
    } else {
        let run = dispatch(&window, run, &newly, Sending::New).await?;
        publish_claims(&window, &run, &started_claims, Sending::New).await?;
        run
    };
    settle(r.mesh, window.at, &run).await
}

/// How iteration `index` counts for a loop with growing reducers: the
/// first report of an index decides how it counts and what it contributes
/// (stored create-only; the contributions are read back at the end).
async fn first_claim(r: &Reported<'_>, index: u64, claim: Claim) -> Result<Claim, HandlerError> {
    let (eid, srid) = (r.ev.execution_id.as_str(), r.ev.step_run_id.as_str());
    let loop_kv = r.mesh.loop_kv();
    let current = r.run(srid).await?;
    if current.superseded || !current.in_flight.contains(&index) {
        return Ok(claim);
    }
    let ckey = Keys::claim(eid, srid, index);
    if kv::create(loop_kv, &ckey, &claim).await? {
        return Ok(claim);
    }
    Ok(kv::get::<Claim>(loop_kv, &ckey).await?.unwrap_or(claim))
}

/// A `loop.claimed` event: store the rows (create-only), apply the claim
/// once under compare-and-set, publish the iterations and claims it
/// started, and finish the loop when nothing is left.
pub(crate) async fn on_claimed(r: &Reported<'_>) -> Result<(), HandlerError> {
    let report: ClaimEnded = payloads::decode_typed(r.ev)?;
    let srid = report.loop_run_id.as_str();
    let window = r.window(srid);
    let key = window.at.key();
    let current = r.run(srid).await?;
    if current.done_emitted {
        return Ok(());
    }
    let claimed = claimed(&window, &current, &report).await?;
    let batch = crate::messages::step_batch(r.mesh.config().loop_batch, r.at.step());
    let (mut stored, mut applied) = apply_stored(r.mesh, &key, report.seq, &claimed, batch).await?;
    // The loop bucket lost the run since it was read: rebuilt from its
    // events (this report among them), the claim finds it applied; purged
    // again before the claim, rebuilt again.
    let mut restored = 0;
    while stored.is_none() && restored < kv::RESTORES {
        if crate::rebuild::restore(r.mesh, window.at).await?.is_none() {
            return Err(r.unknown_run(srid));
        }
        restored += 1;
        (stored, applied) = apply_stored(r.mesh, &key, report.seq, &claimed, batch).await?;
    }
    let Some(stored) = stored else {
        return Err(purged_again(r.mesh, &key, restored));
    };
    let run = match applied {
        Some(a) => {
            let run = dispatch(&window, a.run, &a.newly, Sending::New).await?;
            publish_claims(&window, &run, &a.claims, Sending::New).await?;
            run
        }
        // Applied before: what followed may not have gone out.
        None => redispatch(&window, stored).await?,
    };
    settle(r.mesh, window.at, &run).await
}

/// A loop run rebuilt `tries` times and purged again each time before a
/// report was counted: a retryable conflict (the report comes again), not
/// an unknown run (which dead-letters it).
fn purged_again(mesh: &Mesh, key: &str, tries: u32) -> HandlerError {
    kv::conflict(mesh.loop_kv(), key, tries).into()
}

/// Apply claim `seq` to the run stored under `key` (compare-and-set), the
/// iterations it puts in flight cut into batches of at most `batch`: the
/// run as stored after it (`None`: no run) and what applying did (`None`:
/// applied before).
async fn apply_stored(
    mesh: &Mesh,
    key: &str,
    seq: u64,
    claimed: &Claimed,
    batch: usize,
) -> Result<(Option<LoopRun>, Option<Applied>), HandlerError> {
    let mut applied: Option<Applied> = None;
    let stored = kv::update(mesh.loop_kv(), key, |run: Option<&LoopRun>| {
        applied = None;
        let Some(run) = run else { return Cas::Keep };
        match apply_claim(run, seq, claimed) {
            Some(mut a) => {
                let size = crate::messages::window_batch(a.run.max_in_flight, batch);
                batches::record(&mut a.run, &a.newly, size);
                let next = a.run.clone();
                applied = Some(a);
                Cas::Write(next)
            }
            None => Cas::Keep,
        }
    })
    .await?;
    Ok((stored, applied))
}

/// What claim `report` gave. Rows of a claim still in flight are stored
/// first (create-only): the first stored rows of a claim stand (a second
/// run of the same claim cannot change rows already given indices).
async fn claimed(
    w: &Window<'_>,
    current: &LoopRun,
    report: &ClaimEnded,
) -> Result<Claimed, HandlerError> {
    let mesh = w.mesh;
    let claimed = claimed_of(report);
    let in_flight = current
        .cursor
        .as_ref()
        .is_some_and(|c| c.claims.iter().any(|s| s.seq == report.seq));
    if !(in_flight && report.count > 0 && report.status == Status::Ok) {
        return Ok(claimed);
    }
    let fkey = Keys::frame(w.at.eid(), w.at.srid, report.seq);
    if kv::create(mesh.loop_kv(), &fkey, &report.rows).await? {
        return Ok(claimed);
    }
    if let Some(stored) = kv::get::<Value>(mesh.loop_kv(), &fkey).await? {
        if let Ok(Value::Array(rows)) = mesh.results().hydrate(stored).await {
            return Ok(Claimed::Rows(rows.len() as u64));
        }
    }
    Ok(claimed)
}
