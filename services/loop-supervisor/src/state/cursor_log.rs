//! A cursor loop's run folded from its events (docs/architecture.md "Loop
//! runs from the log"): `loop.started` gives its window and claim size
//! (`max_rows`), its `loop.claimed` events the claims and their rows,
//! applied in stream order by the same [`apply_claim`] that applied them
//! live, and its iterations' ends are counted as in any loop.
//!
//! Two things the stream order alone does not fix, because the live
//! loop-supervisor handles reports concurrently:
//!
//! - which indices a claim's rows were given (claims applied in another
//!   order than their reports are stored): every `loop.iteration.started`
//!   of a cursor loop names its claim, and iterations are dispatched in
//!   index order, so a claim with a started iteration begins at the first
//!   index that names it. Those claims are placed there, the others after
//!   them; a log whose starts do not fit its claims is refused.
//! - whether an empty claim ended the claiming (`drained`), which depends
//!   on what ran when the claim was issued: the rebuilt run never takes it
//!   as ended before `loop.done` is in the log. It claims once more, and
//!   that claim, issued while nothing waits, decides as live.
//!
//! A claim the log has a report of was issued, whatever the fold issued by
//! then. Pure: the caller reads the events and writes what this returns.

use std::collections::BTreeMap;

use noetl_core::{FrameProcess, Step};
use noetl_mesh::{
    event_type::EventType,
    payloads::{self, ClaimEnded, IterationStarted, LoopStarted},
};
use noetl_wire::Event;
use serde_json::Value;

use super::cursor::{self, apply_claim, claimed_of, ClaimSlot, Frame};
use super::ends::{Ends, FromLog};
use super::LoopRun;

/// A claim the fold applied with rows: its sequence number, how many
/// iterations it made, and its rows as its report carried them.
struct Applied {
    seq: u64,
    len: u64,
    rows: Value,
}

/// The cursor loop run `run` (new, as `loop.started` gives it) with its
/// claim size and its first claims, as the live start made it; or why its
/// `loop.started` cannot say.
pub(super) fn started_run(
    run: LoopRun,
    started: &LoopStarted,
    step: &Step,
) -> Result<LoopRun, String> {
    if started.max_rows == 0 {
        return Err(
            "its loop.started does not carry the claim size (max_rows): it was written before cursor loop runs were rebuilt"
                .into(),
        );
    }
    let per_frame = step
        .loop_
        .as_ref()
        .and_then(|l| l.spec.frame.as_ref())
        .is_some_and(|f| f.process == FrameProcess::Frame);
    Ok(cursor::start_run(run, started.max_rows, per_frame))
}

/// The cursor loop run `run` (as it started: [`started_run`], and, for a
/// resumed execution's run, what it continues, with `carried`, the rows
/// of the frames it took from the stopped run) after the events `events`
/// gives (the run's own, after its `loop.started`, in stream order; read
/// twice, each time anew, so the run's events are never held at once);
/// or why the log cannot say.
pub(super) fn fold_cursor<I: Iterator<Item = Event>>(
    run: LoopRun,
    carried: Vec<(u64, Value)>,
    ends: &Ends<'_>,
    events: impl Fn() -> I,
) -> Result<FromLog, String> {
    let start = Start {
        frames: (run.cursor.iter().flat_map(|c| c.frames.clone())).collect(),
        base: run.total,
    };
    let mut f = FromLog {
        run,
        claims: Vec::new(),
        frames: Vec::new(),
        again: Vec::new(),
    };
    let placed = placed(events())?;
    let mut applied = Vec::new();
    for ev in events() {
        if EventType::of(&ev) == Some(EventType::LoopIterationStarted) {
            let s: IterationStarted = payloads::decode(&ev).map_err(|e| e.to_string())?;
            super::dispatched(&mut f.run, s.index);
            continue;
        }
        if ends.take(&mut f, &ev)? || EventType::of(&ev) != Some(EventType::LoopClaimed) {
            continue;
        }
        let report: ClaimEnded = payloads::decode(&ev).map_err(|e| e.to_string())?;
        issue_up_to(&mut f.run, report.seq);
        let before = f.run.total;
        if let Some(a) = apply_claim(&f.run, report.seq, &claimed_of(&report)) {
            if a.run.total > before {
                applied.push(Applied {
                    seq: report.seq,
                    len: a.run.total - before,
                    rows: report.rows,
                });
            }
            f.run = a.run;
        }
    }
    place(&mut f.run, &applied, &placed, &start)?;
    let rows = |seq: u64| {
        (applied.iter().find(|a| a.seq == seq).map(|a| &a.rows))
            .or_else(|| carried.iter().find(|(s, _)| *s == seq).map(|(_, r)| r))
            .cloned()
    };
    let all: Vec<Frame> = (f.run.cursor.iter().flat_map(|c| c.frames.clone())).collect();
    f.again = (cursor::placing(&all, &super::rows_again(&f.run)).into_iter())
        .filter_map(|fr| rows(fr.seq).map(|r| (fr, r)))
        .collect();
    cursor::prune_frames(&mut f.run);
    f.frames = (f.run.cursor.iter().flat_map(|c| &c.frames))
        .filter_map(|fr| rows(fr.seq).map(|r| (fr.seq, r)))
        .collect();
    if !f.run.done_emitted {
        claim_again(&mut f.run);
    }
    Ok(f)
}

/// What a cursor run's fold starts from: the frames a resumed execution's
/// run took from the run it continues, and the first index of its own
/// claims' rows.
struct Start {
    frames: Vec<Frame>,
    base: u64,
}

/// Where each claim's rows begin, as its iterations' starts say (claim ->
/// its lowest started index).
fn placed(events: impl Iterator<Item = Event>) -> Result<BTreeMap<u64, u64>, String> {
    let mut at: BTreeMap<u64, u64> = BTreeMap::new();
    for ev in events {
        if EventType::of(&ev) != Some(EventType::LoopIterationStarted) {
            continue;
        }
        let s: IterationStarted = payloads::decode(&ev).map_err(|e| e.to_string())?;
        let Some(seq) = s.claim else {
            return Err(format!(
                "its loop.iteration.started of index {} does not name its claim: it was written before cursor loop runs were rebuilt",
                s.index
            ));
        };
        let base = at.entry(seq).or_insert(s.index);
        *base = (*base).min(s.index);
    }
    Ok(at)
}

/// Claim `seq` was issued (its report is in the log): issue every claim
/// up to it that the fold has not.
fn issue_up_to(run: &mut LoopRun, seq: u64) {
    let ended = run.done + run.failed;
    let Some(c) = run.cursor.as_mut() else {
        return;
    };
    while c.next_claim <= seq {
        c.claims.push(ClaimSlot {
            seq: c.next_claim,
            quiet: false,
            ended,
            ..Default::default()
        });
        c.next_claim += 1;
    }
}

/// Give the applied claims' rows their indices as the live run did: the
/// claims with started iterations where those started, the others after
/// them in the order they were applied, all after the frames the run
/// started with (`start`), which stay where they are. Frames are not
/// pruned here.
fn place(
    run: &mut LoopRun,
    applied: &[Applied],
    placed: &BTreeMap<u64, u64>,
    start: &Start,
) -> Result<(), String> {
    let carried = |seq: &u64| start.frames.iter().any(|f| f.seq == *seq);
    if let Some(seq) = placed
        .keys()
        .find(|s| !carried(s) && !applied.iter().any(|a| a.seq == **s))
    {
        return Err(format!(
            "an iteration runs claim {seq}, which the log has no rows of"
        ));
    }
    let mut order: Vec<&Applied> = applied.iter().collect();
    order.sort_by_key(|a| placed.get(&a.seq).copied().unwrap_or(u64::MAX));
    let mut frames = start.frames.clone();
    let mut base = start.base;
    for a in order {
        if let Some(at) = placed.get(&a.seq) {
            if *at != base {
                return Err(format!(
                    "its iterations place claim {} at index {at}, its claims at index {base}",
                    a.seq
                ));
            }
        }
        frames.push(Frame {
            seq: a.seq,
            base,
            len: a.len,
        });
        base += a.len;
    }
    if let Some(c) = run.cursor.as_mut() {
        c.frames = frames;
    }
    Ok(())
}

/// Claiming goes on until an empty claim issued while nothing ran says
/// the table is drained: what ran when a claim was issued live is not in
/// the log, so the rebuilt run takes no earlier claim as that one.
fn claim_again(run: &mut LoopRun) {
    let Some(c) = run.cursor.as_mut() else {
        return;
    };
    c.drained = false;
    c.starved = false;
    for s in &mut c.claims {
        s.quiet = false;
    }
    cursor::refill_claims(run);
}

#[cfg(test)]
mod tests;
