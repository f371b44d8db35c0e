//! Ending a loop run: its reducers applied to `ctx`, its error recorded,
//! its terminal events published exactly once, its state pruned; and
//! failing a loop that cannot even start.

use noetl_mesh::{
    effects,
    events::now_ms,
    keys::Keys,
    kv::{self, Cas},
    patches,
    payloads::Reduced,
    runtime::HandlerError,
    Mesh, MeshError,
};
use noetl_wire::LoopCommand;
use serde_json::Value;

use crate::messages;
use crate::reducers::apply_reducers;
use crate::state::{timed_out, LoopRun, RunAt};

/// Finish `run` when nothing is left of it and its `loop.done` has not
/// gone out yet; prune it when it went out but the run is still stored (a
/// delivery that stopped between the two, delivered again).
pub(crate) async fn settle(mesh: &Mesh, at: RunAt<'_>, run: &LoopRun) -> Result<(), HandlerError> {
    if run.superseded {
        // A resume's new run continues it: that run ends for both.
        return Ok(());
    }
    if run.finished() && !run.done_emitted {
        finish(mesh, at, run).await?;
    } else if run.done_emitted {
        prune(mesh, at).await?;
    }
    Ok(())
}

/// Emit the loop's terminal events (deterministic ids: exactly one each).
/// Its result (the counts) is written first, `done_emitted` after they
/// went out.
async fn finish(mesh: &Mesh, at: RunAt<'_>, run: &LoopRun) -> Result<(), HandlerError> {
    let eid = at.eid();
    let mut run = run.clone();
    let mut reduced = Vec::new();
    if run.error.is_none() {
        (run.error, reduced) = final_error(mesh, at, &run).await?;
    }
    // The reducer results ride whole in `loop.done` (by reference when
    // large): the log's `ctx` patch of this loop.
    let reduced =
        patches::carry(mesh.results(), eid, &format!("loop-{}", at.srid), reduced).await?;
    kv::put(
        mesh.exec_kv(),
        &Keys::result(eid, &at.step.step),
        &run.counts(),
    )
    .await?;
    effects::apply(mesh, messages::loop_done(at, &run, reduced)).await?;
    kv::update(mesh.loop_kv(), &at.key(), |r: Option<&LoopRun>| match r {
        Some(r) if !r.done_emitted => {
            let mut r = r.clone();
            r.done_emitted = true;
            Cas::Write(r)
        }
        _ => Cas::Keep,
    })
    .await?;
    prune(mesh, at).await?;
    Ok(())
}

/// The error a loop ends with when it has none recorded yet: a reducer
/// that cannot fold into `ctx`, or the step-run's deadline. Recorded in
/// the run the first time, so a repeated finish reports the same. Also
/// the reducer results folded into `ctx`, if they were.
async fn final_error(
    mesh: &Mesh,
    at: RunAt<'_>,
    run: &LoopRun,
) -> Result<(Option<Value>, Vec<Reduced>), HandlerError> {
    let (error, reduced) = match apply_reducers(mesh, at, run).await? {
        Err(e) => (Some(e), Vec::new()),
        Ok(reduced) => (timed_out(run, now_ms()), reduced),
    };
    let Some(error) = error else {
        return Ok((None, reduced));
    };
    // The first recorded error stands (a repeated finish reports it).
    let stored = kv::update(mesh.loop_kv(), &at.key(), |r: Option<&LoopRun>| match r {
        Some(r) if r.error.is_none() => {
            let mut r = r.clone();
            r.error = Some(error.clone());
            Cas::Write(r)
        }
        _ => Cas::Keep,
    })
    .await?;
    Ok((stored.and_then(|r| r.error).or(Some(error)), reduced))
}

/// Drop what a finished loop needs no more, so state does not grow with
/// every loop run: the collection chunks, the iterations' checkpoints and
/// claims, and the write-once ctx claims. The run record itself stays (it
/// makes a redelivered report a no-op).
async fn prune(mesh: &Mesh, at: RunAt<'_>) -> Result<(), MeshError> {
    let (eid, srid) = (at.eid(), at.srid);
    let purged = kv::purge_under(mesh.loop_kv(), &Keys::loop_run(eid, srid)).await?;
    let owners = Keys::owners(eid, srid);
    if kv::get::<Value>(mesh.ctx_kv(), &owners).await?.is_some() {
        mesh.ctx_kv()
            .purge(&owners)
            .await
            .map_err(|e| MeshError::Kv {
                bucket: mesh.ctx_kv().name.clone(),
                key: owners.clone(),
                message: e.to_string(),
            })?;
    }
    tracing::debug!(execution_id = %eid, step = %at.step.step, purged, "loop state pruned");
    Ok(())
}

/// The loop could not even start: fail the step-run.
pub(crate) async fn fail_loop(
    mesh: &Mesh,
    cmd: &LoopCommand,
    message: String,
) -> Result<(), HandlerError> {
    // The playbook's error (`loop.in` not a list, a template that does not
    // render), told by the step's `step.failed`, as a task's failure is.
    tracing::info!(execution_id = %cmd.execution_id, step = %cmd.step, %message, "loop failed to start");
    effects::apply(mesh, vec![messages::start_failed(cmd, message)]).await?;
    Ok(())
}
