//! Cursor loops (docs/dsl.md, "Cursor loops"): the iterations are the rows
//! `loop.cursor.claim` returns. The loop-supervisor runs no SQL: it asks
//! for a claim with a task command (a [`noetl_wire::ClaimRef`]) on the
//! claim's kind, the executor there runs it and reports the rows in a
//! `loop.claimed` event, and the rows become iterations.
//!
//! The window (`max_in_flight × frame.row_concurrency` iterations) is kept
//! full: a claim is issued while the iterations running, the rows waiting
//! and the claims in flight (each counted as `frame.max_rows` rows) leave
//! room. A claim is applied once, keyed by its sequence number under
//! compare-and-set (a redelivered `loop.claimed` changes nothing); its rows
//! are stored under `<run>.frame.<seq>` (create-only) before the run
//! counts them, and iteration indices are given in the order claims are
//! applied. An empty claim ends the loop when it was issued while nothing
//! ran or waited and no iteration ended since (so no row an iteration put
//! back can be missed); otherwise no claim is issued until an iteration
//! ends, or at once when nothing is left running.
//!
//! This module is the cursor part of a loop run's record and its pure
//! transitions; the claims are published with the window
//! (`crate::dispatch`) and applied by the `loop.claimed` report
//! (`crate::reports`).

use noetl_core::Loop;
use noetl_mesh::{
    payloads::{self, ClaimEnded, Status},
    scope,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::LoopRun;

/// The cursor part of a loop run's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CursorRun {
    /// Rows one claim asks for (`frame.max_rows`, `__frame_max_rows`).
    pub max_rows: u64,
    /// `frame.process: frame`: one iteration per claim, over its rows.
    #[serde(default)]
    pub per_frame: bool,
    /// Sequence number of the next claim.
    #[serde(default)]
    pub next_claim: u64,
    /// Claims issued and not yet applied.
    #[serde(default)]
    pub claims: Vec<ClaimSlot>,
    /// Claimed rows some of whose iterations are not counted yet.
    #[serde(default)]
    pub frames: Vec<Frame>,
    /// An empty claim came back while work ran: no claim until an
    /// iteration ends.
    #[serde(default)]
    pub starved: bool,
    /// A claim issued while nothing ran came back empty: no more claims.
    #[serde(default)]
    pub drained: bool,
}

/// A claim in flight.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClaimSlot {
    /// Its sequence number.
    pub seq: u64,
    /// Nothing ran or waited when it was issued.
    pub quiet: bool,
    /// Iterations ended (done + failed) when it was issued.
    pub ended: u64,
    /// The claim's identity (`__frame_claim`) when it is a claim of the
    /// stopped run this run continues, sent again: that claim's, so a
    /// claim that marks its rows takes the same rows. Empty: this run's
    /// own (`<run>.<seq>`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
}

/// The rows of one applied claim and the indices they were given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// The claim.
    pub seq: u64,
    /// Its first iteration index.
    pub base: u64,
    /// Its iterations (its rows; 1 with `process: frame`).
    pub len: u64,
}

/// What a claim gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    /// This many rows.
    Rows(u64),
    /// It failed: the loop step fails with this error.
    Failed(Value),
}

impl CursorRun {
    /// The claim whose rows iteration `index` runs, while its frame is
    /// kept.
    pub fn claim_of(&self, index: u64) -> Option<u64> {
        self.frames
            .iter()
            .find(|f| (f.base..f.base + f.len).contains(&index))
            .map(|f| f.seq)
    }

    /// Window slots one claim in flight stands for.
    fn per_claim(&self) -> u64 {
        if self.per_frame {
            1
        } else {
            self.max_rows.max(1)
        }
    }
}

/// Issue claims while the window has room (and the loop claims at all);
/// returns their sequence numbers.
pub fn refill_claims(run: &mut LoopRun) -> Vec<u64> {
    let quiet = run.in_flight.is_empty() && run.next >= run.total && run.redo.is_empty();
    let ended = run.done + run.failed;
    let stopped = run.stopped || run.error.is_some();
    let waiting =
        run.total.saturating_sub(run.next) + run.in_flight.len() as u64 + run.redo.len() as u64;
    let window = run.max_in_flight;
    let Some(c) = run.cursor.as_mut() else {
        return Vec::new();
    };
    let mut issued = Vec::new();
    if stopped || c.drained || c.starved {
        return issued;
    }
    while waiting + c.claims.len() as u64 * c.per_claim() < window {
        let seq = c.next_claim;
        c.next_claim += 1;
        c.claims.push(ClaimSlot {
            seq,
            quiet,
            ended,
            ..Default::default()
        });
        issued.push(seq);
    }
    issued
}

/// Fill the window with claimed rows waiting for a slot; returns the
/// indices dispatched.
pub(crate) fn fill_window(r: &mut LoopRun) -> Vec<u64> {
    let mut newly = Vec::new();
    while !r.stopped && (r.in_flight.len() as u64) < r.max_in_flight {
        let index = if !r.redo.is_empty() {
            r.redo.remove(0)
        } else if r.next < r.total {
            r.next += 1;
            r.next - 1
        } else {
            break;
        };
        r.in_flight.push(index);
        newly.push(index);
    }
    newly
}

/// Drop the frames whose iterations are all counted (none in flight, none
/// to run again, none past `next`).
pub(crate) fn prune_frames(r: &mut LoopRun) {
    let (next, in_flight, redo) = (r.next, &r.in_flight, &r.redo);
    if let Some(c) = r.cursor.as_mut() {
        c.frames.retain(|f| {
            let end = f.base + f.len;
            end > next
                || in_flight
                    .iter()
                    .chain(redo)
                    .any(|i| (f.base..end).contains(i))
        });
    }
}

/// Whether `frames` place every index of `indices`: a stopped run's
/// frames can give a new run the rows it runs again.
pub(crate) fn covers(frames: &[Frame], mut indices: impl Iterator<Item = u64>) -> bool {
    indices.all(|i| frames.iter().any(|f| (f.base..f.base + f.len).contains(&i)))
}

/// The frames of `frames` that place an index of `indices`.
pub(crate) fn placing(frames: &[Frame], indices: &[u64]) -> Vec<Frame> {
    (frames.iter())
        .filter(|f| indices.iter().any(|i| (f.base..f.base + f.len).contains(i)))
        .cloned()
        .collect()
}

/// Make new cursor run `r` (its settings rendered anew) go on with the
/// claims of the stopped run `old` (run `old_srid`) that a resume runs
/// again: its frames `frames` (the rows of the iterations it runs again,
/// placed where they were), its numbering of claims, and its claims in
/// flight sent again under their own identity, so a claim that marks its
/// rows takes the same rows. The caller has set the run's counts and what
/// it runs again.
pub(crate) fn continue_claims(r: &mut LoopRun, old: &LoopRun, old_srid: &str, frames: &[Frame]) {
    let (Some(c), Some(o)) = (r.cursor.as_mut(), old.cursor.as_ref()) else {
        return;
    };
    c.frames = frames.to_vec();
    c.next_claim = o.next_claim;
    c.claims = (o.claims.iter())
        .map(|s| ClaimSlot {
            seq: s.seq,
            identity: if s.identity.is_empty() {
                noetl_mesh::ids::claim_identity(old_srid, s.seq)
            } else {
                s.identity.clone()
            },
            ..Default::default()
        })
        .collect();
    c.starved = false;
    c.drained = false;
}

/// After an iteration was counted (and the window refilled): it may have
/// put rows back, so an empty claim no longer holds claiming back; claim
/// again while there is room. No-op for other loops.
pub fn after_count(r: &mut LoopRun) {
    let Some(c) = r.cursor.as_mut() else {
        return;
    };
    c.starved = false;
    prune_frames(r);
    refill_claims(r);
}

/// The claims in `after` that were not in flight in `before`.
pub fn issued(before: &LoopRun, after: &LoopRun) -> Vec<u64> {
    issued_since(next_claim(before), after)
}

/// The sequence number a cursor loop's next claim gets (`None`: not a
/// cursor loop): what [`issued_since`] compares with.
pub fn next_claim(run: &LoopRun) -> Option<u64> {
    run.cursor.as_ref().map(|c| c.next_claim)
}

/// [`issued`], given the run before as its [`next_claim`].
pub fn issued_since(before: Option<u64>, after: &LoopRun) -> Vec<u64> {
    let (Some(next), Some(a)) = (before, &after.cursor) else {
        return Vec::new();
    };
    a.claims
        .iter()
        .map(|s| s.seq)
        .filter(|seq| *seq >= next)
        .collect()
}

/// What applying a claim did.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The run after it.
    pub run: LoopRun,
    /// Iterations it dispatched.
    pub newly: Vec<u64>,
    /// Claims it issued.
    pub claims: Vec<u64>,
}

/// The run after claim `seq` gave `claimed`; `None` when that claim is not
/// in flight (applied already: a redelivered report changes nothing).
pub fn apply_claim(run: &LoopRun, seq: u64, claimed: &Claimed) -> Option<Applied> {
    let mut r = run.clone();
    let c = r.cursor.as_mut()?;
    let at = c.claims.iter().position(|s| s.seq == seq)?;
    let slot = c.claims.remove(at);
    let ended = run.done + run.failed;
    let idle = run.in_flight.is_empty() && run.next >= run.total;
    match claimed {
        Claimed::Failed(error) => {
            r.error.get_or_insert_with(|| error.clone());
            r.stopped = true;
        }
        Claimed::Rows(n) if *n > 0 => {
            // A stopped run places the rows too, and runs none of them: a
            // resume runs them, and a fold places them whether the stop
            // was counted before the claim or after.
            let len = if c.per_frame { 1 } else { *n };
            c.frames.push(Frame {
                seq,
                base: r.total,
                len,
            });
            r.total += len;
        }
        Claimed::Rows(_) => {
            let others = !c.claims.is_empty();
            if slot.quiet && slot.ended == ended && idle && !others {
                c.drained = true;
            } else {
                // Nothing left running: claim again at once (that claim is
                // quiet); else wait for an iteration to end.
                c.starved = !idle || others;
            }
        }
    }
    let newly = fill_window(&mut r);
    let before = r.clone();
    prune_frames(&mut r);
    refill_claims(&mut r);
    let claims = issued(&before, &r);
    Some(Applied {
        run: r,
        newly,
        claims,
    })
}

/// What a claim report says the claim gave.
pub(crate) fn claimed_of(report: &ClaimEnded) -> Claimed {
    match report.status {
        Status::Ok => Claimed::Rows(report.count),
        Status::Error => Claimed::Failed(if report.error.is_null() {
            payloads::error_body("loop.cursor", "the claim failed")
        } else {
            report.error.clone()
        }),
    }
}

/// The first claim(s) of a new cursor loop run.
pub(crate) fn start_run(mut run: LoopRun, max_rows: u64, per_frame: bool) -> LoopRun {
    run.cursor = Some(CursorRun {
        max_rows,
        per_frame,
        ..Default::default()
    });
    refill_claims(&mut run);
    run
}

/// A frame setting that must be an integer >= 1 (default 1), rendered.
pub(crate) fn frame_number<E: std::fmt::Display>(
    rendered: Option<Result<Value, E>>,
    what: &str,
    step: &str,
) -> Result<u64, String> {
    match rendered {
        None => Ok(1),
        Some(Err(e)) => Err(format!("loop.spec.frame.{what} of step {step:?}: {e}")),
        Some(Ok(v)) => match v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        {
            Some(n) if n >= 1 => Ok(n),
            _ => Err(format!(
                "loop.spec.frame.{what} of step {step:?} must be an integer >= 1, got {v}"
            )),
        },
    }
}

/// The scope values of a cursor loop's frame settings, for the loop scope.
pub(crate) fn frame_templates(lp: &Loop) -> Vec<String> {
    let Some(f) = &lp.spec.frame else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for v in [&f.max_rows, &f.row_concurrency].into_iter().flatten() {
        out.extend(scope::strings(v).into_iter().map(str::to_string));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::new_run;
    use super::*;
    use noetl_wire::LoopCommand;
    use serde_json::json;

    /// A cursor run with `window` slots and `max_rows` per claim, started.
    fn started(window: u64, max_rows: u64) -> LoopRun {
        let cmd = LoopCommand::default();
        let run = new_run(&cmd, "lp", 0, window, json!({}));
        start_run(run, max_rows, false)
    }

    fn seqs(r: &LoopRun) -> Vec<u64> {
        r.cursor
            .as_ref()
            .unwrap()
            .claims
            .iter()
            .map(|s| s.seq)
            .collect()
    }

    /// Count iteration `i` as done, as the loop-supervisor does.
    fn end(r: &LoopRun, i: u64) -> LoopRun {
        let mut r = r.clone();
        assert!(r.in_flight.contains(&i), "{i} in flight");
        r.in_flight.retain(|x| *x != i);
        r.done += 1;
        fill_window(&mut r);
        after_count(&mut r);
        r
    }

    #[test]
    fn a_new_run_claims_enough_to_fill_its_window() {
        // One row per claim: one claim per slot.
        assert_eq!(seqs(&started(4, 1)), vec![0, 1, 2, 3]);
        // 50 rows per claim, window 1 (NoETL's frame at a time): one claim.
        assert_eq!(seqs(&started(1, 50)), vec![0]);
        // 3 rows per claim, window 8: three claims reserve 9 slots.
        assert_eq!(seqs(&started(8, 3)), vec![0, 1, 2]);
        let r = started(2, 1);
        assert!(r
            .cursor
            .unwrap()
            .claims
            .iter()
            .all(|s| s.quiet && s.ended == 0));
        assert!(!started(2, 1).finished(), "claims in flight");
    }

    #[test]
    fn claimed_rows_become_iterations_and_the_window_bounds_them() {
        let r = started(2, 5);
        assert_eq!(seqs(&r), vec![0]);
        let a = apply_claim(&r, 0, &Claimed::Rows(3)).unwrap();
        assert_eq!(a.newly, vec![0, 1]);
        assert_eq!((a.run.total, a.run.next), (3, 2));
        assert!(a.claims.is_empty(), "a row waits: no room to claim");
        let c = a.run.cursor.clone().unwrap();
        assert_eq!(
            c.frames,
            vec![Frame {
                seq: 0,
                base: 0,
                len: 3
            }]
        );
        // The same report again: nothing.
        assert!(apply_claim(&a.run, 0, &Claimed::Rows(3)).is_none());
        // Iteration 0 ends: row 2 takes its slot, still no room to claim.
        let r = end(&a.run, 0);
        assert_eq!((r.in_flight.clone(), r.next), (vec![1, 2], 3));
        assert!(seqs(&r).is_empty());
        // Iteration 1 ends: one slot, no row waiting: claim 1.
        let r = end(&r, 1);
        assert_eq!(seqs(&r), vec![1]);
        assert!(!r.cursor.as_ref().unwrap().claims[0].quiet, "2 still runs");
    }

    #[test]
    fn a_quiet_empty_claim_drains_the_loop() {
        let r = started(1, 1);
        let a = apply_claim(&r, 0, &Claimed::Rows(0)).unwrap();
        assert!(a.run.cursor.as_ref().unwrap().drained);
        assert!(a.claims.is_empty());
        assert!(a.run.finished());
        assert_eq!((a.run.total, a.run.done), (0, 0));
    }

    #[test]
    fn an_empty_claim_while_work_runs_waits_for_an_iteration_to_end() {
        let r = started(2, 1);
        assert_eq!(seqs(&r), vec![0, 1]);
        let a = apply_claim(&r, 0, &Claimed::Rows(1)).unwrap();
        assert_eq!(a.newly, vec![0]);
        // Claim 1 was quiet when issued, but iteration 0 runs now: the
        // table may get rows back from it.
        let b = apply_claim(&a.run, 1, &Claimed::Rows(0)).unwrap();
        let c = b.run.cursor.clone().unwrap();
        assert!(c.starved && !c.drained);
        assert!(b.claims.is_empty(), "no claim while starved");
        assert!(!b.run.finished());
        // Iteration 0 ends: claim again, quiet this time.
        let r = end(&b.run, 0);
        assert_eq!(seqs(&r), vec![2, 3]);
        assert!(r.cursor.as_ref().unwrap().claims.iter().all(|s| s.quiet));
        let r = apply_claim(&r, 2, &Claimed::Rows(0)).unwrap().run;
        assert!(!r.finished(), "claim 3 is in flight");
        let r = apply_claim(&r, 3, &Claimed::Rows(0)).unwrap().run;
        assert!(r.cursor.as_ref().unwrap().drained);
        assert!(r.finished());
        assert_eq!((r.total, r.done), (1, 1));
    }

    #[test]
    fn an_empty_claim_issued_while_work_ran_claims_again_once_nothing_runs() {
        let r = started(1, 1);
        let r = apply_claim(&r, 0, &Claimed::Rows(1)).unwrap().run;
        let r = end(&r, 0);
        // Claim 1 was issued after iteration 0 ended: quiet.
        assert_eq!(seqs(&r), vec![1]);
        assert!(r.cursor.as_ref().unwrap().claims[0].quiet);
        // A claim that was not quiet and came back empty with nothing left
        // running is followed by a new claim at once.
        let mut r2 = r.clone();
        r2.cursor.as_mut().unwrap().claims[0].quiet = false;
        let a = apply_claim(&r2, 1, &Claimed::Rows(0)).unwrap();
        assert_eq!(a.claims, vec![2]);
        assert!(!a.run.cursor.as_ref().unwrap().starved);
        assert!(!a.run.finished());
    }

    #[test]
    fn a_failed_claim_stops_the_loop_with_its_error() {
        let r = started(2, 1);
        let error = json!({"kind": "postgres.sql", "message": "boom"});
        let a = apply_claim(&r, 0, &Claimed::Failed(error.clone())).unwrap();
        assert!(a.run.stopped && a.claims.is_empty());
        assert_eq!(a.run.error, Some(error));
        assert!(!a.run.finished(), "claim 1 still in flight");
        // Its rows are placed (a resume runs them) and not run: the loop
        // is stopping.
        let b = apply_claim(&a.run, 1, &Claimed::Rows(2)).unwrap();
        assert!(b.newly.is_empty() && b.run.in_flight.is_empty());
        assert_eq!((b.run.total, b.run.next), (2, 0));
        assert!(b.run.finished());
    }

    #[test]
    fn process_frame_makes_one_iteration_per_claim() {
        let cmd = LoopCommand::default();
        let r = start_run(new_run(&cmd, "lp", 0, 2, json!({})), 10, true);
        assert_eq!(seqs(&r), vec![0, 1], "a claim takes one slot");
        let a = apply_claim(&r, 0, &Claimed::Rows(7)).unwrap();
        assert_eq!((a.run.total, a.newly.clone()), (1, vec![0]));
    }

    #[test]
    fn frames_are_dropped_once_their_iterations_are_counted() {
        let r = started(2, 2);
        let r = apply_claim(&r, 0, &Claimed::Rows(2)).unwrap().run;
        let r = end(&r, 0);
        assert_eq!(r.cursor.as_ref().unwrap().frames.len(), 1);
        let r = end(&r, 1);
        assert!(r.cursor.as_ref().unwrap().frames.is_empty());
    }

    #[test]
    fn frame_settings_are_integers_of_at_least_one() {
        assert_eq!(frame_number::<String>(None, "max_rows", "lp"), Ok(1));
        assert_eq!(
            frame_number(Some(Ok::<_, String>(json!(50))), "max_rows", "lp"),
            Ok(50)
        );
        assert_eq!(
            frame_number(Some(Ok::<_, String>(json!("7"))), "max_rows", "lp"),
            Ok(7)
        );
        let e = frame_number(Some(Ok::<_, String>(json!(0))), "max_rows", "lp").unwrap_err();
        assert!(
            e.contains("frame.max_rows of step \"lp\" must be an integer >= 1"),
            "{e}"
        );
    }

    #[test]
    fn a_claim_gives_its_rows_or_fails_with_its_error() {
        let ok = ClaimEnded {
            loop_run_id: "r1".into(),
            seq: 0,
            status: Status::Ok,
            count: 3,
            rows: json!([1, 2, 3]),
            error: Value::Null,
        };
        assert_eq!(claimed_of(&ok), Claimed::Rows(3));
        let failed = ClaimEnded {
            status: Status::Error,
            count: 0,
            ..ok.clone()
        };
        assert_eq!(
            claimed_of(&failed),
            Claimed::Failed(json!({"kind": "loop.cursor", "message": "the claim failed"}))
        );
        let error = json!({"kind": "postgres.sql", "message": "boom"});
        let said = ClaimEnded {
            error: error.clone(),
            ..failed
        };
        assert_eq!(claimed_of(&said), Claimed::Failed(error));
    }

    #[test]
    fn issued_names_the_claims_a_write_added() {
        let before = started(1, 1);
        let mut after = before.clone();
        after.cursor.as_mut().unwrap().claims.clear();
        after.cursor.as_mut().unwrap().next_claim = 1;
        let mut again = after.clone();
        let fresh = refill_claims(&mut again);
        assert_eq!(fresh, vec![1]);
        assert_eq!(issued(&before, &again), vec![1]);
        assert!(issued(&before, &before).is_empty());
    }
}
