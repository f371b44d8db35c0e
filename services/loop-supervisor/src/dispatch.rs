//! The window of a loop run's iterations in flight: publishing the
//! iterations a write put in flight (and, for a cursor loop, its claims),
//! and publishing again everything a stored run implies when its message
//! is redelivered.

use noetl_mesh::{
    codec,
    effects::{self, Effect},
    kv::{self, Cas},
    pause::Held,
    payloads,
    runtime::HandlerError,
    Mesh, MeshError,
};
use noetl_wire::LoopCommand;
use serde_json::Value;

use crate::collection::{ChunkCache, Elements, ItemError};
use crate::finish;
use crate::messages;
use crate::state::{
    batches::{self, Sending},
    items_gone, LoopRun, RunAt,
};

/// The loop run whose iterations are published, and what publishing
/// needs.
#[derive(Clone, Copy)]
pub(crate) struct Window<'a> {
    pub mesh: &'a Mesh,
    /// Collection chunks read lately.
    pub chunks: &'a ChunkCache,
    /// The loop run.
    pub at: RunAt<'a>,
}

/// Publish everything a stored loop run implies (idempotent: every id is
/// deterministic): `loop.started` (with `collection`, the list of its
/// stored chunks; `None`: read back from the loop bucket), the in-flight
/// window, and `loop.done` once it is finished. Used by a first start and
/// by every redelivery.
pub(crate) async fn resume(
    w: &Window<'_>,
    run: LoopRun,
    collection: Option<Value>,
) -> Result<(), HandlerError> {
    if run.done_emitted {
        return Ok(());
    }
    let collection = match collection {
        Some(c) => c,
        None if run.cursor.is_some() => Value::Null,
        None => {
            let at = Elements {
                mesh: w.mesh,
                eid: w.at.eid(),
                srid: w.at.srid,
            };
            let chunks = (run.total as usize).div_ceil(crate::collection::CHUNK);
            crate::collection::stored_list(w.mesh, at, chunks).await?
        }
    };
    effects::apply(w.mesh, vec![messages::loop_started(w.at, &run, collection)]).await?;
    let run = redispatch(w, run).await?;
    finish::settle(w.mesh, w.at, &run).await
}

/// Publish the task commands of every in-flight iteration and the
/// commands of every claim in flight (idempotent); returns the run as now
/// stored.
pub(crate) async fn redispatch(w: &Window<'_>, run: LoopRun) -> Result<LoopRun, HandlerError> {
    let indices = run.in_flight.clone();
    let run = dispatch(w, run, &indices, Sending::Again).await?;
    let seqs: Vec<u64> = run
        .cursor
        .as_ref()
        .map(|c| c.claims.iter().map(|s| s.seq).collect())
        .unwrap_or_default();
    publish_claims(w, &run, &seqs, Sending::Again).await?;
    Ok(run)
}

/// Publish the iterations `indices` of `run` (idempotent), in the batches
/// the run records for them, as `how` says ([`batches::to_send`]);
/// returns the run as now stored. An
/// iteration whose element cannot be read (its chunk is gone) is counted
/// as failed and fails the loop step, naming the chunk.
pub(crate) async fn dispatch(
    w: &Window<'_>,
    run: LoopRun,
    indices: &[u64],
    how: Sending,
) -> Result<LoopRun, HandlerError> {
    // A cancelled execution starts no more iterations, nor does a run a
    // resume's new run continues.
    if indices.is_empty() || run.superseded || w.mesh.still_stopped(w.at.eid()).await? {
        return Ok(run);
    }
    if w.mesh.pauses().await?.is_paused(w.at.eid()) {
        return hold(w, run, indices).await;
    }
    let whole = batches::to_send(&run, indices, how);
    let Read { items, mut gone } = read(w, &run, &whole).await?;
    if whole.len() != indices.len() {
        gone.retain(|(i, _)| indices.contains(i));
    }
    let started = messages::iterations(w.at, &run, &items, w.mesh.config().loop_batch);
    if run.cursor.is_some() {
        // A cursor loop's `loop.iteration.started` places its claim's rows
        // when the run is rebuilt from the log (docs/architecture.md "Loop
        // runs from the log"): stored before the iterations go out.
        let (events, work): (Vec<Effect>, Vec<Effect>) = started
            .into_iter()
            .partition(|e| matches!(e, Effect::Emit(_)));
        effects::apply(w.mesh, events).await?;
        effects::apply(w.mesh, work).await?;
    } else {
        effects::apply(w.mesh, started).await?;
    }
    for _ in &items {
        w.mesh.health().metrics().iteration("started");
    }
    if gone.is_empty() {
        return Ok(run);
    }
    let message = gone_message(&w.at.step.step, &gone);
    tracing::warn!(execution_id = %w.at.eid(), step = %w.at.step.step, %message, "loop collection unavailable");
    let error = payloads::error_body("loop.items", message);
    let gone: Vec<u64> = gone.into_iter().map(|(i, _)| i).collect();
    let stored = kv::update(w.mesh.loop_kv(), &w.at.key(), |r: Option<&LoopRun>| match r
        .and_then(|r| items_gone(r, &gone, &error))
    {
        Some(next) => Cas::Write(next),
        None => Cas::Keep,
    })
    .await?;
    match stored {
        Some(stored) => Ok(stored),
        // The run is gone too (purged since it was read), so nothing
        // records why these iterations did not go out: a transient error,
        // so the message comes again and finds the run written back from
        // the events, with its frames (docs/architecture.md "Loop runs
        // from the log"). Acked here, the iterations would never be sent.
        None => Err(HandlerError::Mesh(MeshError::Kv {
            bucket: w.mesh.loop_kv().name.clone(),
            key: w.at.key(),
            message: format!(
                "loop run {} of execution {} went missing while its iterations were read; retried",
                w.at.srid,
                w.at.eid()
            ),
        })),
    }
}

/// The command id of a loop command a pause held: its release dispatches
/// the run's held iterations ([`release_held`]). The unpause makes it
/// again when the held record is lost ([`noetl_mesh::held`]).
pub(crate) fn unpause_command_id(srid: &str) -> String {
    noetl_mesh::held::loop_release_command_id(srid)
}

/// The execution is paused: remember `indices` as held in the run (they
/// are in flight, not published), and hold the run's loop command until
/// the unpause, whose release publishes them ([`release_held`]). Claims of
/// a cursor loop go on: a pause stops iterations only.
async fn hold(w: &Window<'_>, run: LoopRun, indices: &[u64]) -> Result<LoopRun, HandlerError> {
    let stored = kv::update(w.mesh.loop_kv(), &w.at.key(), |r: Option<&LoopRun>| match r
        .and_then(|r| with_held(r, indices))
    {
        Some(next) => Cas::Write(next),
        None => Cas::Keep,
    })
    .await?;
    let again = LoopCommand {
        command_id: unpause_command_id(w.at.srid),
        execution_id: w.at.eid().to_string(),
        step: w.at.step.step.clone(),
        step_run_id: w.at.srid.to_string(),
        trace_id: run.trace_id.clone(),
        ..Default::default()
    };
    let held = Held::Loop {
        step_run_id: w.at.srid,
    };
    w.mesh.hold(w.at.eid(), held, codec::encode(&again)).await?;
    Ok(stored.unwrap_or(run))
}

/// `run` with `indices` added to its held iterations (`None`: all there).
fn with_held(run: &LoopRun, indices: &[u64]) -> Option<LoopRun> {
    let mut next = run.clone();
    for i in indices {
        if !next.held.contains(i) {
            next.held.push(*i);
        }
    }
    (next.held.len() != run.held.len()).then_some(next)
}

/// The unpause released the run's loop command: publish the iterations
/// the pause held (a pause since then holds them again) and forget them.
pub(crate) async fn release_held(w: &Window<'_>, run: LoopRun) -> Result<(), HandlerError> {
    let held = run.held.clone();
    if held.is_empty() || w.mesh.pauses().await?.is_paused(w.at.eid()) {
        return Ok(());
    }
    let run = dispatch(w, run, &held, Sending::Again).await?;
    kv::update(w.mesh.loop_kv(), &w.at.key(), |r: Option<&LoopRun>| match r
        .filter(|r| !r.held.is_empty())
    {
        Some(r) => {
            let mut next = r.clone();
            next.held.retain(|i| !held.contains(i));
            Cas::Write(next)
        }
        None => Cas::Keep,
    })
    .await?;
    finish::settle(w.mesh, w.at, &run).await
}

/// The elements of the iterations a dispatch publishes.
pub(crate) struct Read {
    /// Index and element of each iteration whose element was read.
    pub items: Vec<(u64, Value)>,
    /// Index of each whose element cannot be read, and why.
    pub gone: Vec<(u64, String)>,
}

/// Read the elements of iterations `indices` (an element that cannot be
/// read is `gone`; a transient error fails the whole read).
pub(crate) async fn read(
    w: &Window<'_>,
    run: &LoopRun,
    indices: &[u64],
) -> Result<Read, HandlerError> {
    let mut read = Read {
        items: Vec::with_capacity(indices.len()),
        gone: Vec::new(),
    };
    read_into(w, run, indices, &mut read).await?;
    // A cursor loop's frames lost while its run stood are in its events:
    // written back, then read again.
    if !read.gone.is_empty()
        && run.cursor.is_some()
        && crate::rebuild::restore_frames(w.mesh, w.at).await? > 0
    {
        let again: Vec<u64> = std::mem::take(&mut read.gone)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        read_into(w, run, &again, &mut read).await?;
        read.items.sort_by_key(|(i, _)| *i);
    }
    Ok(read)
}

/// Read the elements of `indices` into `read`.
async fn read_into(
    w: &Window<'_>,
    run: &LoopRun,
    indices: &[u64],
    read: &mut Read,
) -> Result<(), HandlerError> {
    let at = Elements {
        mesh: w.mesh,
        eid: w.at.eid(),
        srid: w.at.srid,
    };
    for &i in indices {
        match w.chunks.element(at, run.cursor.as_ref(), i).await {
            Ok(item) => read.items.push((i, item)),
            Err(ItemError::Mesh(e)) => return Err(e.into()),
            Err(ItemError::Gone(why)) => read.gone.push((i, why)),
        }
    }
    Ok(())
}

/// Why a loop step whose elements are `gone` (index, why; not empty)
/// fails: it names the first.
fn gone_message(step: &str, gone: &[(u64, String)]) -> String {
    format!(
        "loop.in of step {step:?}: item {} cannot be read: {}",
        gone[0].0, gone[0].1
    )
}

/// Publish the commands of claims `seqs` of `run` (idempotent: their ids
/// are derived from the loop run and the sequence number), marked sent
/// again when `how` is [`Sending::Again`]. Not as
/// [`noetl_mesh::effects::Effect::Task`]s: a claim's kind has no `task.unserved` timer.
pub(crate) async fn publish_claims(
    w: &Window<'_>,
    run: &LoopRun,
    seqs: &[u64],
    how: Sending,
) -> Result<(), HandlerError> {
    let eid = w.at.eid();
    if seqs.is_empty() || w.mesh.still_stopped(eid).await? {
        return Ok(());
    }
    let Some((kind, cmds)) = messages::claims(w.at, run, seqs, how) else {
        return Ok(());
    };
    let claims = cmds
        .into_iter()
        .map(|cmd| Effect::Command {
            kind: kind.to_string(),
            cmd,
        })
        .collect();
    effects::apply(w.mesh, claims).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_of_unreadable_items_names_the_first() {
        let gone = [(5, "chunk gone".to_string()), (6, "chunk gone".to_string())];
        assert_eq!(
            gone_message("lp", &gone),
            r#"loop.in of step "lp": item 5 cannot be read: chunk gone"#
        );
    }

    #[test]
    fn held_iterations_are_added_once_and_nothing_new_writes_nothing() {
        let cmd = LoopCommand::default();
        let mut run = crate::state::new_run(&cmd, "each", 10, 3, serde_json::Value::Null);
        run.held = vec![1];
        let next = with_held(&run, &[1, 2, 2]).expect("2 is new");
        assert_eq!(next.held, [1, 2]);
        assert!(with_held(&next, &[2, 1]).is_none());
        assert_eq!(unpause_command_id("sr1"), "sr1-unpaused");
    }
}
