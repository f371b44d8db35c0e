//! Loop runs the loop bucket lost (an operator's purge, a storage fault),
//! written back from the event log: the run's record and its iterations'
//! claims are folded from the execution's events
//! ([`crate::state::from_log`]) and created (create-only: a record written
//! meanwhile stands), then the report or command that found them missing
//! goes on as if nothing had happened. The collection's chunks are written
//! back when a dispatch reads one ([`crate::collection::restore_chunk`]);
//! a cursor loop's frames (the rows of its claims) with its run.

mod streamed;

use noetl_mesh::{event_type::EventType, keys::Keys, kv, runtime::HandlerError, Mesh, MeshError};
use tokio::sync::Semaphore;

use crate::state::{
    batches,
    from_log::{batches_in, fold_run_in, own_events_in, FromLog, NotRebuilt, RunLog},
    Claim, LoopRun, RunAt,
};
pub(crate) use streamed::Streamed;

/// How many logs a loop-supervisor process reads at once to rebuild what
/// the loop bucket lost: every report of a lost run finds it missing, up
/// to the service's concurrency at once, and one read rebuilds it for all
/// (the others find it written when their turn comes).
static LOG_READS: Semaphore = Semaphore::const_new(1);

/// The run `at` written back from its events when the loop bucket has no
/// record of it; `None` when its loop never started (a first start goes
/// on as usual). A run its events cannot rebuild is refused, naming why;
/// one whose execution ended is not written back
/// ([`HandlerError::Over`]: its state was compacted).
pub(crate) async fn restore(mesh: &Mesh, at: RunAt<'_>) -> Result<Option<LoopRun>, HandlerError> {
    if !any_loop_started(mesh, at.eid()).await? {
        return Ok(None);
    }
    let _turn = LOG_READS.acquire().await;
    // Written back by another report while this one waited its turn.
    if let Some(run) = kv::get::<LoopRun>(mesh.loop_kv(), &at.key()).await? {
        return Ok(Some(run));
    }
    let log = Streamed::read(mesh, at.eid()).await?;
    // Compacted after its end: a late message, whose run stays removed.
    if noetl_mesh::fold::ended(log.events().0) {
        return Err(HandlerError::Over(format!(
            "loop run {} of execution {} (step {:?}): the execution ended and its state was removed",
            at.srid,
            at.eid(),
            at.step.step
        )));
    }
    Ok(restore_from(mesh, at, log).await?.map(|(run, _)| run))
}

/// [`restore`] from the execution's log, read already: the run as now
/// stored, and whether it was missing and written back.
pub(crate) async fn restore_from(
    mesh: &Mesh,
    at: RunAt<'_>,
    log: Streamed,
) -> Result<Option<(LoopRun, bool)>, HandlerError> {
    let (srid, step) = (at.srid.to_string(), at.step.clone());
    let rebuilt = log
        .fold(move |log| fold_run_in(log, &srid, &step).map(|f| (f, batches_in(log, &srid))))
        .await?;
    write_back(mesh, at, rebuilt).await
}

/// Write back the run `at` as its events gave it (`rebuilt`: the fold and
/// the batches its window went out in), its claims and frames first; the
/// run as now stored, and whether it was missing and written back.
async fn write_back(
    mesh: &Mesh,
    at: RunAt<'_>,
    rebuilt: Result<(FromLog, Vec<[u64; 2]>), NotRebuilt>,
) -> Result<Option<(LoopRun, bool)>, HandlerError> {
    let Some((mut rebuilt, sent)) = found(rebuilt, at)? else {
        return Ok(None);
    };
    let batch = crate::messages::step_batch(mesh.config().loop_batch, at.step);
    keep_batches(&mut rebuilt.run, sent, batch);
    write_claims(mesh, at, &rebuilt.claims).await?;
    write_frames(mesh, at, &rebuilt.frames).await?;
    let key = at.key();
    if kv::create(mesh.loop_kv(), &key, &rebuilt.run).await? {
        tracing::warn!(
            execution_id = %at.eid(), step = %at.step.step, loop_run = %at.srid,
            done = rebuilt.run.done, failed = rebuilt.run.failed,
            "loop run was missing from the loop bucket: rebuilt from its events"
        );
        return Ok(Some((rebuilt.run, true)));
    }
    let stored = kv::get(mesh.loop_kv(), &key).await?;
    Ok(Some((stored.unwrap_or(rebuilt.run), false)))
}

/// The stopped run `srid` of loop step `step` that a resumed execution's
/// new run continues, as the events give it now, and how many of its own
/// events it was folded from ([`own_events_in`]): what the new run's start
/// takes from it ([`crate::state::resumed`]) and names in its
/// `loop.started`, so a fold of the new run from the log starts from
/// the same state (an end of the stopped run stored after this read is the
/// new run's to run again, live as in the fold). Not written back. `None`
/// when the events cannot give it (it never started, or it continued an
/// earlier run by a loop-supervisor that did not name that run): the
/// caller takes the loop bucket's record, or runs every iteration again.
pub(crate) async fn stopped_run(
    mesh: &Mesh,
    eid: &str,
    srid: &str,
    step: &noetl_core::Step,
) -> Result<Option<(FromLog, u64)>, MeshError> {
    let _turn = LOG_READS.acquire().await;
    let log = Streamed::read(mesh, eid).await?;
    let (run, of) = (srid.to_string(), step.clone());
    let folded = log
        .fold(move |log| fold_run_in(log, &run, &of).map(|f| (f, own_events_in(log, &run))))
        .await?;
    match folded {
        Ok(folded) => Ok(Some(folded)),
        Err(NotRebuilt::NotStarted) => Ok(None),
        Err(NotRebuilt::Cannot(why)) => {
            tracing::warn!(execution_id = %eid, step = %step.step, loop_run = %srid, %why,
                "the stopped loop run a resume continues cannot be folded from its events: its loop bucket record is taken, if any");
            Ok(None)
        }
    }
}

/// Write back the claims that the loop bucket lost of each run `srids`
/// names at `at`'s step (a loop with growing reducers, whose
/// contributions are read from the claims at the end: the run and the runs
/// it continues that never ended counted more successful iterations than
/// their claims say), and return, run by run, every claim the events give,
/// for the caller to use as they are (the bucket may lose them again). The
/// log is read once for all of them.
pub(crate) async fn restore_claims(
    mesh: &Mesh,
    at: RunAt<'_>,
    srids: &[&str],
) -> Result<Vec<Vec<(u64, Claim)>>, HandlerError> {
    let _turn = LOG_READS.acquire().await;
    let log = Streamed::read(mesh, at.eid()).await?;
    let (runs, step): (Vec<String>, _) = (
        srids.iter().map(|s| s.to_string()).collect(),
        at.step.clone(),
    );
    let folds = log
        .fold(move |log| {
            (runs.iter())
                .map(|srid| fold_run_in(log, srid, &step))
                .collect::<Vec<_>>()
        })
        .await?;
    let mut out = Vec::with_capacity(srids.len());
    for (srid, rebuilt) in srids.iter().zip(folds) {
        let at = RunAt { srid, ..at };
        let Some(rebuilt) = found(rebuilt, at)? else {
            out.push(Vec::new());
            continue;
        };
        write_claims(mesh, at, &rebuilt.claims).await?;
        tracing::warn!(
            execution_id = %at.eid(), step = %at.step.step, loop_run = %at.srid,
            "iteration claims were missing from the loop bucket: rebuilt from the events"
        );
        out.push(rebuilt.claims);
    }
    Ok(out)
}

/// The run as its events give it; `None` when it never started.
async fn folded(mesh: &Mesh, at: RunAt<'_>) -> Result<Option<FromLog>, HandlerError> {
    let _turn = LOG_READS.acquire().await;
    let log = Streamed::read(mesh, at.eid()).await?;
    let (srid, step) = (at.srid.to_string(), at.step.clone());
    let rebuilt = log.fold(move |log| fold_run_in(log, &srid, &step)).await?;
    found(rebuilt, at)
}

/// What the fold of run `at` gave: `None` when it never started; a run
/// the events cannot give is refused, naming why.
fn found<T>(rebuilt: Result<T, NotRebuilt>, at: RunAt<'_>) -> Result<Option<T>, HandlerError> {
    match rebuilt {
        Ok(rebuilt) => Ok(Some(rebuilt)),
        Err(NotRebuilt::NotStarted) => Ok(None),
        Err(NotRebuilt::Cannot(why)) => Err(HandlerError::Refused(format!(
            "loop run {} of execution {} (step {:?}) is missing from the loop bucket and cannot be rebuilt from its events: {why}",
            at.srid,
            at.eid(),
            at.step.step
        ))),
    }
}

/// `run` rebuilt with the batches its window went out in (`sent`, from
/// the log), and the iterations in flight the log has no start of (the
/// window the live run had not published) cut into batches of at most
/// `batch` as a live count would cut them.
fn keep_batches(run: &mut LoopRun, sent: Vec<[u64; 2]>, batch: usize) {
    run.batches = sent;
    let fresh: Vec<u64> = (run.in_flight.iter().copied())
        .filter(|i| batches::batch_of(run, *i).is_none())
        .collect();
    let size = crate::messages::window_batch(run.max_in_flight, batch);
    batches::record(run, &fresh, size);
}

/// Create the claims the bucket does not hold.
async fn write_claims(
    mesh: &Mesh,
    at: RunAt<'_>,
    claims: &[(u64, Claim)],
) -> Result<(), MeshError> {
    for (index, claim) in claims {
        kv::create(
            mesh.loop_kv(),
            &Keys::claim(at.eid(), at.srid, *index),
            claim,
        )
        .await?;
    }
    Ok(())
}

/// Write back the frames of cursor loop run `at` (the rows of the claims
/// whose iterations are not all counted) that the loop bucket lost while
/// the run itself stood (a partial purge, or one that reached the frames
/// after the run was written back), from the events; returns how many
/// were missing and written.
pub(crate) async fn restore_frames(mesh: &Mesh, at: RunAt<'_>) -> Result<usize, HandlerError> {
    let Some(rebuilt) = folded(mesh, at).await? else {
        return Ok(0);
    };
    let written = write_frames(mesh, at, &rebuilt.frames).await?;
    if written > 0 {
        tracing::warn!(
            execution_id = %at.eid(), step = %at.step.step, loop_run = %at.srid, frames = written,
            "cursor loop frames were missing from the loop bucket: rebuilt from the events"
        );
    }
    Ok(written)
}

/// Create the cursor loop's frame records (`<run>.frame.<seq>`, the rows
/// a claim gave) the bucket does not hold: a frame stored before stands
/// (the first stored rows of a claim are the ones its indices run).
/// Returns how many it created.
pub(crate) async fn write_frames(
    mesh: &Mesh,
    at: RunAt<'_>,
    frames: &[(u64, serde_json::Value)],
) -> Result<usize, MeshError> {
    let mut written = 0;
    for (seq, rows) in frames {
        if kv::create(mesh.loop_kv(), &Keys::frame(at.eid(), at.srid, *seq), rows).await? {
            written += 1;
        }
    }
    Ok(written)
}

/// True when some loop of `eid` has started (one direct read of the
/// stream's last `loop.started` of the execution): the cheap test that
/// keeps a first start from reading the log.
async fn any_loop_started(mesh: &Mesh, eid: &str) -> Result<bool, MeshError> {
    Ok(mesh
        .last_event_seq(eid, EventType::LoopStarted)
        .await?
        .is_some())
}
