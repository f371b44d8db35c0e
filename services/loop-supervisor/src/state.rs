//! A loop run's record and its pure transitions: a new run, counting an
//! iteration (and a batch of them), folding reducer contributions, items
//! that are gone, and how a finished run ends. No I/O here: the handlers
//! read the record, call these, and write what they return under
//! compare-and-set.

pub(crate) mod batches;
pub mod cursor;
mod cursor_log;
mod ends;
pub(crate) mod from_log;

use noetl_core::reduce::{self, ReducerOp};
use noetl_core::Step;
use noetl_mesh::{
    handled::HandledError,
    keys::Keys,
    payloads::{self, LoopCounts, LoopStatus},
    plan::PlanRecord,
};
use noetl_wire::LoopCommand;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which loop run a message is about: its execution's plan, its step, and
/// the loop run's (step-run's) id.
#[derive(Clone, Copy)]
pub(crate) struct RunAt<'a> {
    /// The execution's plan.
    pub plan: &'a PlanRecord,
    /// The loop step.
    pub step: &'a Step,
    /// The loop run (its step-run) id.
    pub srid: &'a str,
}

impl RunAt<'_> {
    /// The execution id.
    pub fn eid(&self) -> &str {
        &self.plan.execution_id
    }

    /// The run's key in the loop bucket.
    pub fn key(&self) -> String {
        Keys::loop_run(self.eid(), self.srid)
    }
}

/// The state of one loop run, in the loop bucket under `<eid>.<step_run_id>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoopRun {
    /// Step name.
    pub step: String,
    /// Number of elements.
    pub total: u64,
    /// Bound of iterations in flight.
    pub max_in_flight: u64,
    /// Next index to dispatch.
    pub next: u64,
    /// Indices dispatched and not yet finished.
    pub in_flight: Vec<u64>,
    /// Finished successfully.
    pub done: u64,
    /// Failed.
    pub failed: u64,
    /// No more dispatching (fail_fast after a failure).
    pub stopped: bool,
    /// Step args (token inscription), carried to every iteration.
    pub args: Value,
    /// Trace id.
    pub trace_id: String,
    /// `loop.done` was published (stragglers do not publish it again).
    #[serde(default)]
    pub done_emitted: bool,
    /// Aggregates of the `sum` / `min` / `max` reducers so far (ctx key ->
    /// value), folded exactly once per iteration in the same
    /// compare-and-set that counts it. `append` / `extend` / `merge`
    /// contributions grow with the loop: they stay in per-iteration records
    /// (`<run>.it.<index>`) and are assembled at the end.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub reduced: serde_json::Map<String, Value>,
    /// Why the loop step fails whatever its failure mode (`{kind,
    /// message}`): a reducer that could not fold, or a collection chunk
    /// that is gone. Set once; no iteration is dispatched after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// Task errors a policy rule handled in its iterations (at most
    /// [`noetl_mesh::handled::KEPT`] distinct ones, each counted), for the
    /// loop step's record ([`noetl_mesh::handled::note`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handled: Vec<HandledError>,
    /// The step-run's deadline (epoch ms; 0: none) and the setting that set
    /// it, from the loop command: every iteration carries them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deadline_ms: u64,
    /// See `deadline_ms`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub deadline_of: String,
    /// Iterations in flight that a pause kept from being published
    /// (`dispatch::release_held` publishes them after the unpause).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<u64>,
    /// A cursor loop's claims and claimed rows (`None` for a loop over
    /// `in`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<cursor::CursorRun>,
    /// The indices of the iterations that failed (a resume runs them
    /// again, [`resumed`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_at: Vec<u64>,
    /// Indices below `next` still to dispatch, first: the iterations a
    /// resumed run takes again from the run that stopped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redo: Vec<u64>,
    /// The stopped run a resumed execution's run continues (its loop
    /// step's run when the execution stopped, named by the resume), as
    /// `loop.started` says: what a fold of this run from the events
    /// starts from ([`from_log`]). Empty for a run that continues none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub continues: String,
    /// How many of `continues`' own events the start folded it from
    /// ([`noetl_mesh::payloads::LoopStarted::continued_events`]); `None`
    /// when it was read from the loop bucket instead (its events could
    /// not give it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_events: Option<u64>,
    /// Successful iterations of the runs this one continues whose growing
    /// (`append` / `extend` / `merge`) contributions are in `ctx` already
    /// (their run ended and folded them): counted in `done`, not looked
    /// for in claims at the finish.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub carried: u64,
    /// The runs this one continues that never ended (a cancel, or another
    /// branch's failure, stopped them first), oldest first: their growing
    /// contributions are still only in their claims, which the finish
    /// folds before this run's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims_of: Vec<String>,
    /// A resume's new run continues this one (marked by the router's
    /// resume before the execution runs again,
    /// `noetl_mesh::resume::supersede_loop_run`, and by the new run's
    /// start): it counts no more reports, starts no more iterations and
    /// never finishes; the new run takes it as its events give it. A run
    /// stopped by a cancel otherwise went on once its execution was
    /// resumed, beside the new run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
    /// The batches the window went out in (`[first, end)` index ranges),
    /// cut in the write that put their iterations in flight and kept while
    /// one of them is ([`batches`]): a window sent again goes out in them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<[u64; 2]>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl LoopRun {
    /// Nothing is in flight and nothing is left to dispatch or claim.
    pub(crate) fn finished(&self) -> bool {
        self.in_flight.is_empty()
            && (self.stopped || (self.next >= self.total && self.redo.is_empty()))
            && self
                .cursor
                .as_ref()
                .is_none_or(|c| c.claims.is_empty() && (self.stopped || c.drained))
    }

    /// The run's counts, as `loop.done` reports them.
    pub(crate) fn counts(&self) -> LoopCounts {
        LoopCounts {
            total: self.total,
            done: self.done,
            failed: self.failed,
        }
    }
}

/// The `timeout` error of a loop run that ends past its step-run's
/// deadline with failed iterations (the executor cut them at the
/// deadline): the step fails with it, whatever its failure mode. It is
/// stored in the run the first time, so a repeated finish says the same.
pub fn timed_out(run: &LoopRun, now_ms: u64) -> Option<Value> {
    if run.deadline_ms == 0 || run.failed == 0 || now_ms < run.deadline_ms {
        return None;
    }
    let d = noetl_core::lifecycle::Deadline {
        at_ms: run.deadline_ms,
        what: run.deadline_of.clone(),
    };
    let mut e = noetl_core::lifecycle::timeout_error(&d, &run.step, None);
    e.message = format!(
        "{} ({} of {} iterations done, {} failed)",
        e.message, run.done, run.total, run.failed
    );
    Some(e.to_value())
}

/// How one iteration counted, decided by its first report (in the loop
/// bucket under `<run>.it.<index>`, create-only), for loops with growing
/// reducers: the contributions are read back from here at the end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Claim {
    /// The iteration failed (it contributes nothing).
    pub failed: bool,
    /// Its reducer contributions (ctx key -> partial aggregate).
    #[serde(default)]
    pub reduce: serde_json::Map<String, Value>,
    /// Task errors a policy rule handled in the iteration (it went on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handled: Vec<HandledError>,
}

/// Reducers whose aggregate grows with the number of iterations.
pub(crate) fn grows(op: ReducerOp) -> bool {
    matches!(op, ReducerOp::Append | ReducerOp::Extend | ReducerOp::Merge)
}

/// The reducers `step`'s loop declares (ctx key, operation); none when it
/// has no loop or its declaration is bad (checked when the loop started:
/// it fails there).
pub(crate) fn reducers_of(step: &Step) -> Vec<(String, ReducerOp)> {
    step.loop_
        .as_ref()
        .and_then(|l| reduce::declared(l.spec.policy.as_ref()).ok())
        .unwrap_or_default()
}

/// The error of a loop step whose reducer failed.
pub(crate) fn reducer_error(step: &str, why: &str) -> Value {
    payloads::error_body("reducer", format!("loop step {step:?}: {why}"))
}

/// A new loop run of `total` items with its first window in flight.
pub(crate) fn new_run(
    cmd: &LoopCommand,
    step: &str,
    total: u64,
    max_in_flight: u64,
    args: Value,
) -> LoopRun {
    let first = total.min(max_in_flight);
    LoopRun {
        step: step.to_string(),
        total,
        max_in_flight,
        next: first,
        in_flight: (0..first).collect(),
        done: 0,
        failed: 0,
        stopped: false,
        args,
        trace_id: cmd.trace_id.clone(),
        done_emitted: false,
        reduced: Default::default(),
        error: None,
        handled: Vec::new(),
        deadline_ms: cmd.deadline_ms,
        deadline_of: cmd.deadline_of.clone(),
        held: Vec::new(),
        cursor: None,
        failed_at: Vec::new(),
        redo: Vec::new(),
        continues: String::new(),
        continued_events: None,
        carried: 0,
        claims_of: Vec::new(),
        superseded: false,
        batches: Vec::new(),
    }
}

/// The run of a resumed execution's loop step that continues `old` (its
/// run `old_srid` that stopped, over as many items): the iterations that
/// finished successfully there are not run again (counted as done; their
/// contributions were folded into `ctx` when `old` ended, or, when it
/// never ended, are carried here: `sum` / `min` / `max` in `reduced`, the
/// growing ones by naming `old`'s claims in `claims_of`); the ones that failed or never
/// finished (those `old`, itself resumed, had still to run again among
/// them) are dispatched first, then the ones never started.
///
/// A cursor loop goes on with `old`'s claims: `frames` are the stopped
/// run's frames that place the rows it runs again, and no others
/// ([`rows_again`], from its events: `FromLog::again`), and its claims in
/// flight are sent again under their own identity
/// ([`cursor::continue_claims`]); then it claims anew. `fresh` unchanged
/// when `old` cannot say which iterations finished (another item count, a
/// cursor run whose frames do not place every row it runs again, a run
/// recorded before failures were kept by index): every iteration runs
/// again.
pub(crate) fn resumed(
    fresh: LoopRun,
    old: &LoopRun,
    old_srid: &str,
    frames: &[cursor::Frame],
) -> LoopRun {
    let known = old.failed_at.len() as u64 == old.failed;
    let cursor = match (&old.cursor, &fresh.cursor) {
        (Some(_), Some(_)) => true,
        (None, None) if old.total == fresh.total => false,
        _ => return fresh,
    };
    if !known {
        return fresh;
    }
    if cursor && !cursor::covers(frames, rows_again(old).into_iter()) {
        return fresh;
    }
    let mut r = fresh;
    r.in_flight.clear();
    r.next = old.next;
    r.done = old.done;
    r.redo = run_again(old);
    if cursor {
        r.total = old.total;
        cursor::continue_claims(&mut r, old, old_srid, frames);
    }
    if old.done_emitted {
        r.carried = old.done;
    } else {
        r.reduced = old.reduced.clone();
        r.carried = old.carried;
        r.claims_of = old.claims_of.clone();
        r.claims_of.push(old_srid.to_string());
    }
    cursor::fill_window(&mut r);
    if cursor {
        cursor::refill_claims(&mut r);
    }
    r
}

/// The new run `fresh` as it continues `old`, the stopped run `old_srid`
/// folded from its events ([`resumed`]), and the rows of the
/// frames a cursor loop's new run took from it (for its
/// `<run>.frame.<seq>` records): what a resumed run's live start and its
/// fold both make of the run they continue.
pub(crate) fn continued_run(
    fresh: LoopRun,
    old: from_log::FromLog,
    old_srid: &str,
) -> (LoopRun, Vec<(u64, Value)>) {
    let frames: Vec<_> = old.again.iter().map(|(f, _)| f.clone()).collect();
    let run = resumed(fresh, &old.run, old_srid, &frames);
    let kept = |seq: u64| {
        run.cursor
            .iter()
            .any(|c| c.frames.iter().any(|f| f.seq == seq))
    };
    let carried = (old.again.into_iter())
        .filter(|(f, _)| kept(f.seq))
        .map(|(f, rows)| (f.seq, rows))
        .collect();
    (run, carried)
}

/// Iteration `index` ran live: put it in flight in `r` (the fold) when the
/// fold had not dispatched it. Live reports are counted concurrently, so
/// not always in stream order, and a window refills (or a failure stops
/// it) at the count that comes first: the fold, counting in stream order,
/// can be behind the live dispatch (an iteration live sent after a
/// success the fold counts after the failure that stopped it). Live
/// dispatch takes `redo` first, then `next` on: an index at or past
/// `next` means every one before it went out too. An index below `next`
/// and neither in flight nor to redo was counted already.
pub(crate) fn dispatched(r: &mut LoopRun, index: u64) {
    if index >= r.total || r.in_flight.contains(&index) {
        return;
    }
    if let Some(at) = r.redo.iter().position(|i| *i == index) {
        r.redo.remove(at);
        r.in_flight.push(index);
    } else if index >= r.next {
        r.in_flight.append(&mut r.redo);
        r.in_flight.extend(r.next..=index);
        r.next = index + 1;
    }
}

/// The iterations of a cursor loop's stopped run `old` whose rows a run
/// continuing it runs: those it runs again ([`run_again`]) and those
/// whose rows were claimed and never started.
pub(crate) fn rows_again(old: &LoopRun) -> Vec<u64> {
    let mut rows = run_again(old);
    rows.extend(old.next..old.total);
    rows
}

/// The iterations of stopped run `old` that a run continuing it runs
/// again, in index order: those that failed, were in flight or held, or
/// that `old` had still to run again; not those never started.
pub(crate) fn run_again(old: &LoopRun) -> Vec<u64> {
    let mut redo: Vec<u64> = (old.failed_at.iter())
        .chain(&old.in_flight)
        .chain(&old.held)
        .chain(&old.redo)
        .copied()
        .filter(|i| *i < old.next)
        .collect();
    redo.sort_unstable();
    redo.dedup();
    redo
}

/// Iterations whose items cannot be read (`gone`) fail the loop run: they
/// leave `in_flight` counted as failed, the run stops dispatching and
/// keeps the first `error`. `None` when that is already recorded.
pub fn items_gone(run: &LoopRun, gone: &[u64], error: &Value) -> Option<LoopRun> {
    let mut r = run.clone();
    let before = r.in_flight.len();
    r.in_flight.retain(|i| !gone.contains(i));
    if r.in_flight.len() == before && r.error.is_some() {
        return None;
    }
    r.failed += (before - r.in_flight.len()) as u64;
    r.failed_at
        .extend(gone.iter().filter(|i| run.in_flight.contains(i)));
    r.stopped = true;
    r.error.get_or_insert_with(|| error.clone());
    Some(r)
}

/// One iteration's report, as [`count_in_place`] needs it.
pub(crate) struct Arrival<'a> {
    /// The iteration's index.
    pub index: u64,
    /// How it counts (the first report of the index decides).
    pub claim: &'a Claim,
    /// `fail_fast`: a failure stops dispatching.
    pub fail_fast: bool,
    /// The loop's reducers (ctx key, operation).
    pub reducers: &'a [(String, ReducerOp)],
    /// Step name, for a reducer's error.
    pub step: &'a str,
    /// Its handler reads the run as it stands after it (the last of the
    /// handler's reports in a shared write): [`count_batch`] copies the
    /// run for these only.
    pub viewed: bool,
}

/// Count iteration `a.index` into loop run `r`: the indices the window
/// now dispatches; `None` (and `r` unchanged) when that index is not in
/// flight (counted already: a redelivered report changes nothing) or the
/// run is superseded. A
/// failure stops dispatching under `fail_fast`; `sum`/`min`/`max`
/// contributions are folded here, growing ones are left in the claim; a
/// reducer that cannot fold records the step's error and stops the loop.
/// The window refills up to `max_in_flight` while not stopped.
pub(crate) fn count_in_place(r: &mut LoopRun, a: &Arrival<'_>) -> Option<Vec<u64>> {
    if r.superseded || !r.in_flight.contains(&a.index) {
        return None;
    }
    r.in_flight.retain(|i| *i != a.index);
    for e in &a.claim.handled {
        noetl_mesh::handled::note(&mut r.handled, e.clone());
    }
    if a.claim.failed {
        r.failed += 1;
        r.failed_at.push(a.index);
        r.stopped |= a.fail_fast;
    } else {
        r.done += 1;
        if r.error.is_none() {
            fold(r, a);
        }
    }
    let newly = cursor::fill_window(r);
    cursor::after_count(r);
    Some(newly)
}

/// [`count_in_place`] on a copy of `run`: the run after the count, and
/// the indices it dispatched.
#[cfg(test)]
pub(crate) fn count_iteration(run: &LoopRun, a: &Arrival<'_>) -> Option<(LoopRun, Vec<u64>)> {
    let mut r = run.clone();
    let newly = count_in_place(&mut r, a)?;
    Some((r, newly))
}

/// What counting one report did, seen by its handler.
#[derive(Debug, Clone)]
pub(crate) struct Counted {
    /// The run as stored after this report was applied (`None` unless the
    /// report's [`Arrival::viewed`]: its handler reads a later one).
    pub run: Option<LoopRun>,
    /// The report counted its index (false: counted already).
    pub counted: bool,
    /// The indices its count dispatched.
    pub newly: Vec<u64>,
    /// The claims its count issued (cursor loops).
    pub claims: Vec<u64>,
}

/// [`count_in_place`] for several reports of one run, in their order:
/// for each, what it did and, for a report [`Arrival::viewed`], the run
/// right after it (what its handler would have seen had it written
/// alone); `Some` of the final run when any
/// counted (that is the one write). The iterations the write puts in
/// flight are cut into batches of at most `size` ([`batches::cut`]),
/// which every report's view carries: each handler publishes the whole
/// batches its own iterations are in.
pub(crate) fn count_batch(
    run: &LoopRun,
    arrivals: &[Arrival<'_>],
    size: usize,
) -> (Option<LoopRun>, Vec<Counted>) {
    let mut cur = run.clone();
    let mut changed = false;
    let mut out = Vec::with_capacity(arrivals.len());
    for a in arrivals {
        // Counted in place, and copied only where a handler reads the run
        // (a handler's last report): a copy per report was a large part of
        // counting a batch's ends.
        let view = |cur: &LoopRun| a.viewed.then(|| cur.clone());
        let before = cursor::next_claim(&cur);
        let Some(newly) = count_in_place(&mut cur, a) else {
            out.push(Counted {
                run: view(&cur),
                counted: false,
                newly: Vec::new(),
                claims: Vec::new(),
            });
            continue;
        };
        changed = true;
        out.push(Counted {
            claims: cursor::issued_since(before, &cur),
            run: view(&cur),
            counted: true,
            newly,
        });
    }
    if !changed {
        return (None, out);
    }
    let newly: Vec<u64> = out.iter().flat_map(|c| c.newly.iter().copied()).collect();
    batches::record(&mut cur, &newly, size);
    for run in out.iter_mut().filter_map(|c| c.run.as_mut()) {
        run.batches.clone_from(&cur.batches);
    }
    (Some(cur), out)
}

/// Fold a successful iteration's non-growing reducer contributions into
/// the run's aggregates.
fn fold(r: &mut LoopRun, a: &Arrival<'_>) {
    for (k, part) in &a.claim.reduce {
        let Some((_, op)) = a.reducers.iter().find(|(name, _)| name == k) else {
            continue;
        };
        if grows(*op) {
            continue; // kept in the claim, assembled at the end
        }
        match reduce::combine(*op, k, r.reduced.get(k), part) {
            Ok(v) => {
                r.reduced.insert(k.clone(), v);
            }
            Err(e) => {
                r.error = Some(reducer_error(a.step, &e.to_string()));
                r.stopped = true;
                return;
            }
        }
    }
}

/// How a finished loop ended, and the error that fails its step (then its
/// `loop.done` is not the boundary; the `step.failed` is): a recorded
/// error (reducer, collection, deadline) whatever the failure mode, or a
/// failed iteration under `fail_fast`. Otherwise `ok`, or `partial` when
/// some iterations failed under `best_effort`.
pub(crate) fn loop_end(run: &LoopRun, fail_fast: bool) -> (LoopStatus, Option<Value>) {
    if let Some(e) = &run.error {
        return (LoopStatus::Failed, Some(e.clone()));
    }
    match (run.failed, fail_fast) {
        (0, _) => (LoopStatus::Ok, None),
        (_, true) => (
            LoopStatus::Failed,
            Some(payloads::error_body(
                "loop.failed",
                format!(
                    "{} of {} iterations failed (fail_fast)",
                    run.failed, run.total
                ),
            )),
        ),
        (_, false) => (LoopStatus::Partial, None),
    }
}

#[cfg(test)]
mod tests;
