//! A loop run's record folded from its events (docs/architecture.md "The
//! event log"): when the loop bucket has lost it, the run is rebuilt from
//! `loop.started` (its size, window, deadline and collection), the
//! `token.created` of its step-run (its args) and its iterations' ends,
//! counted in stream order by the same [`count_in_place`] that counted
//! them live, so the rebuilt run is the one the live run wrote (plus any
//! window the live run had not published yet, which the loop-supervisor
//! then publishes, as after a crash). Live counts are concurrent, not
//! always in stream order: an iteration the log shows ran that the fold
//! had not sent is put in flight ([`dispatched`]). A cursor loop's claims are folded by
//! [`super::cursor_log`]. Pure: the caller reads the events and writes
//! what this returns.
//!
//! The log comes from a [`RunLog`]: the few events the fold looks up
//! (starts, tokens, resumes, the execution's end) held at once, and a
//! run's own events read anew for each pass over them. The loop-supervisor
//! streams them (`crate::rebuild`), a chunk of stored messages at a time,
//! so a fold holds one batch's events at once, never the run's (a resumed
//! loop of 100,000 items held about 3.8 KB per iteration when the log was
//! read unfolded, 0.45–0.8 KB when read whole as stored: docs/reliability.md
//! "Resume of a long loop"). A `batch.accepted` or `batch.completed`
//! stands for its iterations' events and is unfolded ([`noetl_mesh::events::Unfolder`]) when
//! reached; an unfolded log folds the same.

use noetl_core::Step;
#[cfg(test)]
use std::borrow::Cow;

#[cfg(test)]
use noetl_mesh::events::Unfolder;
use noetl_mesh::{
    event_type::EventType,
    payloads::{self, LoopStarted},
};
use noetl_wire::{Event, LoopCommand};
use serde_json::Value;

use super::ends::Ends;
pub(crate) use super::ends::FromLog;
use super::{new_run, LoopRun};

/// Why a loop run is not rebuilt from its events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotRebuilt {
    /// The log has no `loop.started` of the run: it never started (a first
    /// start goes on as usual).
    #[error("the log has no loop.started of it")]
    NotStarted,
    /// The log cannot say what the run was.
    #[error("{0}")]
    Cannot(String),
}

/// The log a run is folded from: the events the fold looks up held at
/// once, and each run's own events read anew whenever the fold goes over
/// them, so a source need not hold a long loop's iterations
/// (`crate::rebuild`'s streamed log, which `noetl admin rebuild` reads
/// too; a slice of the whole log in unit tests).
pub(crate) trait RunLog {
    /// The events the fold looks up, in stream order, and the sequence
    /// number of each: at least every `loop.started`, `token.created`,
    /// `next.selected`, `execution.resumed` and end of the execution
    /// ([`looked_up`]); a source may hold every event.
    fn events(&self) -> (&[Event], &[u64]);

    /// The events of step-run `srid` in stream order, each iteration's
    /// once, each with the sequence number of the message it was stored
    /// in; only those stored before sequence `before` when given, and
    /// only those of the stored messages `stored` takes (each unfolded
    /// only if taken).
    fn own(&self, srid: &str, before: Option<u64>, stored: Stored) -> Own<'_>;
}

/// Which of a run's stored messages a pass over its events reads
/// ([`RunLog::own`]).
pub(crate) type Stored = fn(&Event) -> bool;

/// A pass over a run's events ([`RunLog::own`]).
pub(crate) type Own<'a> = Box<dyn Iterator<Item = (u64, Event)> + 'a>;

/// Every stored message.
fn every(_: &Event) -> bool {
    true
}

/// The stored messages that start iterations: a `batch.accepted`, a
/// `loop.iteration.started` stored alone.
fn starting(e: &Event) -> bool {
    matches!(
        EventType::of(e),
        Some(EventType::BatchAccepted | EventType::LoopIterationStarted)
    )
}

/// Whether a fold of loop runs looks `ev` up ([`RunLog::events`]), or
/// `noetl admin rebuild` does to find the runs still open (`loop.done`):
/// a source that streams a run's own events holds only these.
pub(crate) fn looked_up(ev: &Event) -> bool {
    EventType::of(ev).is_some_and(|t| {
        matches!(
            t,
            EventType::LoopStarted
                | EventType::LoopDone
                | EventType::TokenCreated
                | EventType::NextSelected
                | EventType::ExecutionResumed
        ) || t.ends_execution()
    })
}

/// The whole log held in memory, as stored or unfolded (unit tests).
#[cfg(test)]
pub(crate) struct Slice<'a> {
    log: &'a [Event],
    seqs: Cow<'a, [u64]>,
}

#[cfg(test)]
impl<'a> Slice<'a> {
    /// `log`, each event at the sequence number of the same place in
    /// `seqs`.
    pub(crate) fn new(log: &'a [Event], seqs: &'a [u64]) -> Self {
        Self {
            log,
            seqs: Cow::Borrowed(seqs),
        }
    }

    /// `log`, its events numbered from 1.
    pub(crate) fn numbered(log: &'a [Event]) -> Self {
        Self {
            log,
            seqs: Cow::Owned((1..=log.len() as u64).collect()),
        }
    }
}

#[cfg(test)]
impl RunLog for Slice<'_> {
    fn events(&self) -> (&[Event], &[u64]) {
        (self.log, &self.seqs)
    }

    fn own(&self, srid: &str, before: Option<u64>, stored: Stored) -> Own<'_> {
        let srid = srid.to_string();
        let mut unfolder = Unfolder::default();
        Box::new(
            self.log
                .iter()
                .zip(self.seqs.iter().copied())
                .take_while(move |(_, seq)| before.is_none_or(|b| *seq < b))
                .filter(move |(e, _)| e.step_run_id == srid && stored(e))
                .flat_map(move |(e, seq)| {
                    unfolder
                        .unfold(e.clone())
                        .into_iter()
                        .map(move |u| (seq, u))
                }),
        )
    }
}

/// Which part of the log a fold reads: the looked-up events up to
/// `through` (an index into [`RunLog::events`]), and of the run folded
/// its first `limit` own events stored before `before`. A resumed run's
/// start read the run it continues up to some event
/// ([`LoopStarted::continued_events`]): the fold of that run reads the log
/// as it stood there.
#[derive(Debug, Clone, Copy)]
struct Cut {
    through: usize,
    before: Option<u64>,
    limit: Option<u64>,
}

impl Cut {
    /// All of `log`.
    fn whole(log: &dyn RunLog) -> Self {
        Self {
            through: log.events().0.len(),
            before: None,
            limit: None,
        }
    }
}

/// Run `srid`'s own events after its first `loop.started`, as `cut`
/// bounds them, each with its stored message's sequence number.
fn own_after_start<'l>(
    log: &'l dyn RunLog,
    srid: &'l str,
    cut: Cut,
) -> impl Iterator<Item = (u64, Event)> + 'l {
    let mut started = false;
    log.own(srid, cut.before, every)
        .skip_while(move |(_, e)| {
            let first = !started;
            started = started || EventType::of(e) == Some(EventType::LoopStarted);
            first
        })
        .take(cut.limit.map_or(usize::MAX, |n| n as usize))
}

/// The run `srid` of loop step `step` as its events give it (`log`: the
/// execution's events, in stream order).
#[cfg(test)]
pub(crate) fn fold_run(log: &[Event], srid: &str, step: &Step) -> Result<FromLog, NotRebuilt> {
    fold_run_in(&Slice::numbered(log), srid, step)
}

/// [`fold_run`] over any source of the log.
pub(crate) fn fold_run_in(
    log: &dyn RunLog,
    srid: &str,
    step: &Step,
) -> Result<FromLog, NotRebuilt> {
    fold_cut(log, Cut::whole(log), srid, step)
}

fn fold_cut(log: &dyn RunLog, cut: Cut, srid: &str, step: &Step) -> Result<FromLog, NotRebuilt> {
    use NotRebuilt::Cannot;
    let cannot = |why: &str| Cannot(why.to_string());
    let events = &log.events().0[..cut.through];
    let Some(at) = started_at(events, srid) else {
        return Err(NotRebuilt::NotStarted);
    };
    let started_ev = &events[at];
    let started: LoopStarted = payloads::decode(started_ev).map_err(|e| cannot(&e.to_string()))?;
    let args = events
        .iter()
        .flat_map(|e| payloads::tokens_created(e).unwrap_or_default())
        .find(|t| t.token_id == srid)
        .map(|t| t.args)
        .unwrap_or_default();
    let cmd = LoopCommand {
        trace_id: started_ev.trace_id.clone(),
        deadline_ms: started.deadline_ms,
        deadline_of: started.deadline_of.clone(),
        ..Default::default()
    };
    let fresh = new_run(&cmd, &step.step, started.total, started.max_in_flight, args);
    let cursor = step.loop_.as_ref().is_some_and(|l| l.cursor.is_some());
    let fresh = match cursor {
        true => super::cursor_log::started_run(fresh, &started, step).map_err(Cannot)?,
        false => fresh,
    };
    let (run, carried) = continued(log, at, fresh, &started, step).map_err(Cannot)?;
    let ends = Ends::of(step);
    let mut folded = if cursor {
        super::cursor_log::fold_cursor(run, carried, &ends, || {
            own_after_start(log, srid, cut).map(|(_, e)| e)
        })
        .map_err(Cannot)?
    } else {
        let mut folded = FromLog {
            run,
            claims: Vec::new(),
            frames: Vec::new(),
            again: Vec::new(),
        };
        for (_, ev) in own_after_start(log, srid, cut) {
            if let Some(index) = ran(&ev) {
                super::dispatched(&mut folded.run, index);
            }
            ends.take(&mut folded, &ev).map_err(Cannot)?;
        }
        folded
    };
    folded.run.superseded = !folded.run.done_emitted && continued_by_later(&events[at + 1..], srid);
    Ok(folded)
}

/// How many events of run `srid` `log` holds after its `loop.started`
/// (0 when it never started): what a resumed run's start folded the run
/// it continues from ([`LoopStarted::continued_events`]).
#[cfg(test)]
pub(crate) fn own_events(log: &[Event], srid: &str) -> u64 {
    own_events_in(&Slice::numbered(log), srid)
}

/// [`own_events`] over any source of the log.
pub(crate) fn own_events_in(log: &dyn RunLog, srid: &str) -> u64 {
    let (events, _) = log.events();
    if started_at(events, srid).is_none() {
        return 0;
    }
    own_after_start(log, srid, Cut::whole(log)).count() as u64
}

/// Where run `srid`'s `loop.started` is in `log`.
fn started_at(log: &[Event], srid: &str) -> Option<usize> {
    log.iter()
        .position(|e| e.step_run_id == srid && EventType::of(e) == Some(EventType::LoopStarted))
}

/// Whether a resume in `after` retires run `srid`: every
/// `execution.resumed` does (the router marked each stopped run superseded
/// before that resume went on, whether a new run continues it or a restart
/// `--from` leaves it), and so does a later run's `loop.started` naming it
/// as the one it continues ([`LoopRun::superseded`]). The caller asks only
/// of a run that had not ended, as both marks are made only on such a run.
fn continued_by_later(after: &[Event], srid: &str) -> bool {
    after.iter().any(|e| match EventType::of(e) {
        Some(EventType::LoopStarted) => {
            payloads::decode::<LoopStarted>(e).is_ok_and(|s| s.continues == srid)
        }
        Some(EventType::ExecutionResumed) => true,
        _ => false,
    })
}

/// The index of the iteration event `ev` says ran (its
/// `loop.iteration.started` or its end); `None` for any other event.
fn ran(ev: &Event) -> Option<u64> {
    match EventType::of(ev)? {
        EventType::LoopIterationStarted
        | EventType::LoopIterationDone
        | EventType::LoopIterationFailed => {}
        _ => return None,
    }
    // The index alone: an end's other fields are read where it is counted.
    payloads::decode::<payloads::IterationNamed>(ev)
        .ok()
        .map(|i| i.index)
}

/// The run as it started (`fresh`, from its `loop.started`, `started`,
/// at `at` in `log`'s looked-up events): the run a resumed execution's
/// run continues folded from the events before it, as the live start
/// read it ([`super::resumed`]), when `loop.started` names one; `fresh`
/// for a run of an execution never resumed before it started, or one
/// whose resume continued no run of its step. A run started after a
/// resume that continued its step, written before `loop.started` named
/// what it continues, is not rebuilt. With it, a cursor loop's rows of
/// the frames it took from the stopped run ([`super::continued_run`]).
fn continued(
    log: &dyn RunLog,
    at: usize,
    fresh: LoopRun,
    started: &LoopStarted,
    step: &Step,
) -> Result<(LoopRun, Vec<(u64, Value)>), String> {
    let (events, _) = log.events();
    if !started.continues.is_empty() {
        let cut = cut_before(log, at, &started.continues, started.continued_events);
        let (mut run, carried) = match fold_cut(log, cut, &started.continues, step) {
            Ok(old) => super::continued_run(fresh, old, &started.continues),
            // As the live start: a run its events cannot give is none.
            Err(_) => (fresh, Vec::new()),
        };
        run.continues = started.continues.clone();
        run.continued_events = started.continued_events;
        return Ok((run, carried));
    }
    let resumed = events[..at]
        .iter()
        .rev()
        .find(|e| EventType::of(e) == Some(EventType::ExecutionResumed));
    let Some(resumed) = resumed else {
        return Ok((fresh, Vec::new()));
    };
    let continues_step = payloads::decode::<payloads::Resumed>(resumed)
        .map_err(|e| e.to_string())?
        .continued_loops
        .contains(&step.step);
    if continues_step {
        return Err(
            "its execution was resumed before it started, continuing this step's stopped run, which its loop.started does not name (written before it did)"
                .into(),
        );
    }
    Ok((fresh, Vec::new()))
}

/// The log before the looked-up event at `at` up to run `srid`'s `n`-th
/// own event after its `loop.started`: the log as a resumed run's start
/// (at `at`) read it, for the run it continues. All of it when `n` is
/// `None` (a log written before starts counted them) or it holds no more.
fn cut_before(log: &dyn RunLog, at: usize, srid: &str, n: Option<u64>) -> Cut {
    let (_, seqs) = log.events();
    let before = Cut {
        through: at,
        before: Some(seqs[at]),
        limit: None,
    };
    let Some(n) = n else {
        return before;
    };
    // The message holding the first event past the `n`-th: the looked-up
    // events stored before it are the log as it stood.
    let cut_seq = own_after_start(log, srid, before)
        .nth(n as usize)
        .map(|(seq, _)| seq);
    Cut {
        through: cut_seq.map_or(at, |cut| seqs[..at].partition_point(|s| *s < cut)),
        before: before.before,
        limit: Some(n),
    }
}

/// The batches iterations of run `srid` went out in, as the log (`log`,
/// as stored or unfolded, with each event's sequence number in `seqs`) gives them: the
/// iterations one stored `batch.accepted` started are read back at one
/// sequence number (a batch when their indices are consecutive), an
/// iteration started alone is a batch of its own. A rebuilt run keeps
/// them ([`super::batches`]), so a window it sends again goes out as it
/// went out.
#[cfg(test)]
pub(crate) fn batches_of(log: &[Event], seqs: &[u64], srid: &str) -> Vec<[u64; 2]> {
    batches_in(&Slice::new(log, seqs), srid)
}

/// [`batches_of`] over any source of the log.
pub(crate) fn batches_in(log: &dyn RunLog, srid: &str) -> Vec<[u64; 2]> {
    let mut out = Vec::new();
    let mut group: Option<(u64, Vec<u64>)> = None;
    for (seq, e) in log.own(srid, None, starting) {
        if EventType::of(&e) != Some(EventType::LoopIterationStarted) {
            continue;
        }
        let Ok(started) = payloads::decode::<payloads::IterationStarted>(&e) else {
            continue;
        };
        match &mut group {
            Some((at, indices)) if *at == seq => indices.push(started.index),
            _ => {
                if let Some((_, indices)) = group.take() {
                    close_group(indices, &mut out);
                }
                group = Some((seq, vec![started.index]));
            }
        }
    }
    if let Some((_, indices)) = group {
        close_group(indices, &mut out);
    }
    out.sort_unstable_by_key(|b| b[0]);
    out.dedup_by_key(|b| b[0]);
    out
}

/// The batches the iterations started in one message (`indices`) make:
/// one when they are consecutive, else one each.
fn close_group(mut indices: Vec<u64>, out: &mut Vec<[u64; 2]>) {
    indices.sort_unstable();
    indices.dedup();
    let (first, last) = (indices[0], indices[indices.len() - 1]);
    if last - first + 1 == indices.len() as u64 {
        out.push([first, last + 1]);
    } else {
        out.extend(indices.iter().map(|i| [*i, i + 1]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use noetl_mesh::payloads::{IterationEnded, Status};
    use serde_json::{json, Value};

    fn step() -> Step {
        serde_json::from_value(json!({
            "step": "each",
            "loop": {
                "in": "{{ [1, 2, 3, 4, 5] }}",
                "iterator": "x",
                "spec": {
                    "mode": "parallel",
                    "max_in_flight": 2,
                    "policy": {"reducers": {"total": "sum", "seen": "append"}}
                }
            },
            "tool": [{"name": "t", "kind": "noop"}]
        }))
        .expect("a step")
    }

    fn ev(kind: EventType, payload: Value) -> Event {
        Event {
            event_type: kind.wire_name().to_string(),
            execution_id: "e1".into(),
            step_run_id: "sr1".into(),
            step: "each".into(),
            trace_id: "tr".into(),
            payload_json: serde_json::to_vec(&payload).unwrap(),
            ..Default::default()
        }
    }

    fn started() -> Event {
        ev(
            EventType::LoopStarted,
            json!({"total": 5, "max_in_flight": 2, "deadline_ms": 99, "deadline_of": "step.timeout"}),
        )
    }

    fn ended(index: u64, ok: bool, n: i64) -> Event {
        let kind = if ok {
            EventType::LoopIterationDone
        } else {
            EventType::LoopIterationFailed
        };
        ev(kind, payloads::to_value(&report(index, ok, n)))
    }

    fn report(index: u64, ok: bool, n: i64) -> IterationEnded {
        let status = if ok { Status::Ok } else { Status::Error };
        IterationEnded {
            loop_run_id: "sr1".into(),
            index,
            status,
            result: Value::Null,
            iter: Value::Null,
            reduce: json!({"total": n, "seen": [n]})
                .as_object()
                .unwrap()
                .clone(),
            error: Value::Null,
            handled: Vec::new(),
            last_task: None,
        }
    }

    fn token() -> Event {
        let mut e = ev(
            EventType::TokenCreated,
            json!({"token_id": "sr1", "step": "each", "args": {"a": 1}}),
        );
        e.step_run_id = "parent".into();
        e
    }

    fn iteration_started(index: u64) -> Event {
        ev(
            EventType::LoopIterationStarted,
            json!({"loop_run_id": "sr1", "index": index}),
        )
    }

    #[test]
    fn the_batches_a_window_went_out_in_are_read_back_from_their_sequence_numbers() {
        // Seq 7: a batch.accepted of 0..3, read back as three starts; 8: 3
        // alone; 9: a batch of 4 and 6 (not consecutive: each alone); 10:
        // 0..3 again (a window sent again after the dedup window).
        let log: Vec<Event> = [0, 1, 2, 3, 4, 6, 0, 1, 2]
            .into_iter()
            .map(iteration_started)
            .chain([started()])
            .collect();
        let seqs = [7, 7, 7, 8, 9, 9, 10, 10, 10, 11];
        assert_eq!(
            batches_of(&log, &seqs, "sr1"),
            vec![[0, 3], [3, 4], [4, 5], [6, 7]]
        );
        assert!(batches_of(&log, &seqs, "other").is_empty());
    }

    #[test]
    fn a_run_is_counted_from_its_ends_as_it_was_live() {
        let log = vec![
            token(),
            started(),
            ended(1, true, 10),
            ended(0, false, 0),
            ended(1, true, 10), // a redelivered end counts once
            ended(2, true, 20),
        ];
        let got = fold_run(&log, "sr1", &step()).expect("rebuilt");
        let r = &got.run;
        assert_eq!((r.total, r.max_in_flight), (5, 2));
        assert_eq!((r.done, r.failed), (2, 1));
        assert_eq!(r.failed_at, vec![0]);
        // The failure stopped the window (`fail_fast`, the default): 2 was
        // in flight then, nothing after it.
        assert!(r.stopped);
        assert_eq!(r.next, 3);
        assert!(r.in_flight.is_empty() && r.finished());
        assert_eq!(r.reduced.get("total"), Some(&json!(30)));
        assert_eq!(r.args, json!({"a": 1}));
        assert_eq!(
            (r.deadline_ms, r.deadline_of.as_str()),
            (99, "step.timeout")
        );
        assert_eq!(r.trace_id, "tr");
        assert!(!r.done_emitted);
        let indices: Vec<u64> = got.claims.iter().map(|(i, _)| *i).collect();
        assert_eq!(indices, vec![1, 0, 2]);
        assert!(got.claims[1].1.failed && got.claims[1].1.reduce.is_empty());
    }

    /// `started()` over `total` items.
    fn started_over(total: u64) -> Event {
        ev(
            EventType::LoopStarted,
            json!({"total": total, "max_in_flight": 2}),
        )
    }

    /// The log of run sr1 over 10 items whose 3 failed while 2 ran, and
    /// whose reports were counted live in another order than the stream's:
    /// 2's success first (which sent 4), then 3's failure (which stopped
    /// the window), while the stream has 3's failure before 2's success.
    fn counted_out_of_order() -> Vec<Event> {
        let mut log = vec![token(), started_over(10)];
        log.extend([0, 1].map(iteration_started));
        log.extend([ended(0, true, 0), ended(1, true, 1)]);
        log.extend([2, 3].map(iteration_started));
        log.extend([ended(3, false, 0), ended(2, true, 2)]);
        log.extend([iteration_started(4), ended(4, true, 4)]);
        log.push(ev(EventType::LoopDone, json!({"boundary": false, "status": "failed", "counts": {"total": 10, "done": 4, "failed": 1}, "result": {"total": 10, "done": 4, "failed": 1}})));
        log
    }

    #[test]
    fn a_run_is_folded_as_it_ran_whatever_order_its_reports_were_counted_in() {
        // The fold counts 3's failure first: 2's success then sends
        // nothing, yet 4 ran and its end counts (it was dropped as an end
        // of an iteration never sent, and the run folded one short).
        let r = fold_run(&counted_out_of_order(), "sr1", &step())
            .expect("rebuilt")
            .run;
        assert_eq!((r.done, r.failed, r.next), (4, 1, 5), "{r:?}");
        assert_eq!(r.failed_at, vec![3]);
        assert!(r.finished() && r.done_emitted, "{r:?}");
        assert_eq!(r.reduced.get("total"), Some(&json!(7)));
    }

    #[test]
    fn a_resumed_run_is_folded_from_its_stopped_run_as_it_ran() {
        // The resume continues sr1 as the live record had it (4 done: 3
        // again first, then 5 on); sr2 ran 3 and 5, and sent 6 and 7.
        let mut log = counted_out_of_order();
        let mut continues = of_run("sr2", started_over(10));
        let mut payload: Value = serde_json::from_slice(&continues.payload_json).unwrap();
        payload["continues"] = json!("sr1");
        continues.payload_json = serde_json::to_vec(&payload).unwrap();
        log.extend([resumed_event(&["each"]), of_run("sr2", token()), continues]);
        for e in [
            iteration_started(3),
            iteration_started(5),
            ended(3, true, 3),
            ended(5, true, 5),
            iteration_started(6),
            iteration_started(7),
        ] {
            log.push(of_run("sr2", e));
        }
        let r = fold_run(&log, "sr2", &step()).expect("rebuilt").run;
        // Before: the fold's sr1 had 4 never sent, so sr2 took 4 again,
        // and the rebuilt run sent it a second time (its sum counted 4
        // twice).
        assert_eq!((r.done, r.failed, r.next), (6, 0, 8), "{r:?}");
        assert_eq!(r.in_flight, vec![6, 7]);
        assert!(r.redo.is_empty(), "{r:?}");
        // sr1 published its contributions at its end: sr2 carries its own.
        assert_eq!(r.reduced.get("total"), Some(&json!(8)));
    }

    #[test]
    fn an_iteration_that_ran_is_put_in_flight_where_the_fold_had_not_sent_it() {
        let mut r = crate::state::new_run(&LoopCommand::default(), "each", 10, 2, Value::Null);
        r.in_flight = vec![1];
        r.next = 3;
        r.redo = vec![0, 2];
        // From redo; then past `next`: every one before it went out too.
        crate::state::dispatched(&mut r, 2);
        assert_eq!((r.in_flight.clone(), r.redo.clone()), (vec![1, 2], vec![0]));
        crate::state::dispatched(&mut r, 5);
        assert_eq!(r.in_flight, vec![1, 2, 0, 3, 4, 5]);
        assert_eq!((r.next, r.redo.len()), (6, 0));
        // Counted already (below `next`, neither in flight nor to redo),
        // in flight, or past the items: nothing changes.
        r.in_flight.retain(|i| *i != 0);
        let before = serde_json::to_value(&r).unwrap();
        for index in [0, 1, 10] {
            crate::state::dispatched(&mut r, index);
        }
        assert_eq!(serde_json::to_value(&r).unwrap(), before);
    }

    #[test]
    fn a_run_not_yet_finished_keeps_its_window_in_flight() {
        let log = vec![started(), ended(1, true, 1), ended(0, true, 1)];
        let r = fold_run(&log, "sr1", &step()).expect("rebuilt").run;
        assert_eq!((r.done, r.next), (2, 4));
        assert_eq!(r.in_flight, vec![2, 3]);
        assert!(!r.finished());
    }

    #[test]
    fn a_finished_run_is_marked_done_and_others_runs_are_ignored() {
        let mut other = ended(3, true, 1);
        other.step_run_id = "sr2".into();
        let mut log = vec![started(), other];
        for i in 0..5 {
            log.push(ended(i, true, 1));
        }
        log.push(ev(EventType::LoopDone, json!({"boundary": true, "status": "ok", "counts": {"total": 5, "done": 5, "failed": 0}, "result": {"total": 5, "done": 5, "failed": 0}})));
        let r = fold_run(&log, "sr1", &step()).expect("rebuilt").run;
        assert_eq!(r.done, 5);
        assert!(r.in_flight.is_empty() && r.finished() && r.done_emitted);
    }

    #[test]
    fn what_the_log_cannot_say_is_refused_by_name() {
        assert_eq!(
            fold_run(&[token()], "sr1", &step()).unwrap_err(),
            NotRebuilt::NotStarted
        );
        // Started after a resume that continued its step, by a
        // loop-supervisor that did not yet name the run continued.
        let resumed = resumed_event(&["each"]);
        let err = fold_run(&[resumed, started()], "sr1", &step()).unwrap_err();
        assert!(err.to_string().contains("resumed"), "{err}");
        // A resume that continued no run of the step: a fresh run.
        let log = [resumed_event(&[]), started(), ended(0, true, 1)];
        let r = fold_run(&log, "sr1", &step()).expect("rebuilt").run;
        assert_eq!((r.done, r.next), (1, 3));
        assert!(r.continues.is_empty());
    }

    #[test]
    fn a_cursor_run_a_later_run_continues_folds_as_superseded() {
        // A rebuilt superseded run must not claim and run rows beside the
        // run that continues it.
        let step: Step = serde_json::from_value(json!({
            "step": "each",
            "loop": {
                "cursor": {"kind": "postgres", "claim": "UPDATE q SET s = 1 RETURNING id"},
                "iterator": "job",
                "spec": {"mode": "cursor", "max_in_flight": 2, "frame": {"max_rows": 2}}
            },
            "tool": [{"name": "t", "kind": "noop"}]
        }))
        .expect("a cursor loop step");
        let begun = ev(
            EventType::LoopStarted,
            json!({"total": 0, "max_in_flight": 2, "max_rows": 2}),
        );
        let mut log = vec![token(), begun.clone()];
        let first = fold_run(&log, "sr1", &step).expect("rebuilt").run;
        assert!(first.cursor.is_some() && !first.superseded);
        let mut continues = of_run("sr2", begun);
        let mut payload: Value = serde_json::from_slice(&continues.payload_json).unwrap();
        payload["continues"] = json!("sr1");
        continues.payload_json = serde_json::to_vec(&payload).unwrap();
        log.extend([resumed_event(&["each"]), of_run("sr2", token()), continues]);
        let first = fold_run(&log, "sr1", &step).expect("rebuilt").run;
        assert!(first.cursor.is_some() && first.superseded);
        let second = fold_run(&log, "sr2", &step).expect("rebuilt").run;
        assert!(!second.superseded && second.continues == "sr1");
    }

    /// sr1's `loop.done`, failed (as a `fail_fast` failure ends it).
    fn loop_done() -> Event {
        ev(
            EventType::LoopDone,
            json!({"boundary": true, "status": "failed", "counts": {"total": 5, "done": 1, "failed": 1}, "result": {"total": 5, "done": 1, "failed": 1}}),
        )
    }

    fn resumed_event(continued: &[&str]) -> Event {
        ev(
            EventType::ExecutionResumed,
            json!({"resumes": 1, "steps": ["each"], "continued_loops": continued}),
        )
    }

    /// `e` as an event of run `srid`.
    fn of_run(srid: &str, mut e: Event) -> Event {
        e.step_run_id = srid.into();
        let mut payload: Value = serde_json::from_slice(&e.payload_json).unwrap();
        if payload.get("loop_run_id").is_some() {
            payload["loop_run_id"] = json!(srid);
        }
        if payload.get("token_id").is_some() {
            payload["token_id"] = json!(srid);
            e.step_run_id = "parent".into();
        }
        e.payload_json = serde_json::to_vec(&payload).unwrap();
        e
    }

    #[test]
    fn a_run_started_after_a_resume_starts_from_the_stopped_run_its_loop_started_names() {
        // sr1: 1 done (10), 0 failed, 2 in flight when the failure stopped it.
        let mut log = vec![token(), started(), ended(1, true, 10), ended(0, false, 0)];
        let stopped = fold_run(&log, "sr1", &step()).expect("rebuilt").run;
        assert_eq!((stopped.done, stopped.failed, stopped.next), (1, 1, 3));
        assert!(stopped.stopped);
        // Resumed: sr2 continues sr1, takes 0 and 2 again first, then 3, 4.
        let mut continues = of_run("sr2", started());
        let mut payload: Value = serde_json::from_slice(&continues.payload_json).unwrap();
        payload["continues"] = json!("sr1");
        continues.payload_json = serde_json::to_vec(&payload).unwrap();
        log.extend([resumed_event(&["each"]), of_run("sr2", token()), continues]);
        for (i, n) in [(0, 1), (2, 2), (3, 3), (4, 4)] {
            log.push(of_run("sr2", ended(i, true, n)));
        }
        let r = fold_run(&log, "sr2", &step()).expect("rebuilt").run;
        assert_eq!(r.continues, "sr1");
        assert_eq!((r.total, r.done, r.failed), (5, 5, 0));
        assert!(r.finished() && !r.stopped, "{r:?}");
        // The stopped run's contribution (10) and the new run's (1+2+3+4).
        assert_eq!(r.reduced.get("total"), Some(&json!(20)));
        assert!(!r.superseded);
        // sr2's loop.started names sr1: folded now, sr1 is superseded.
        assert!(fold_run(&log, "sr1", &step()).unwrap().run.superseded);
        assert!(!stopped.superseded, "not before the resume");
        // Marked by the resume itself, before sr2 starts.
        assert!(fold_run(&log[..5], "sr1", &step()).unwrap().run.superseded);
        // So does a restart `--from` that continues none.
        let restart = [&log[..4], &[resumed_event(&[])]].concat();
        assert!(fold_run(&restart, "sr1", &step()).unwrap().run.superseded);
        // A run that had ended stays as it is.
        let ended_run = [&log[..4], &[loop_done()], &[resumed_event(&[])]].concat();
        assert!(!fold_run(&ended_run, "sr1", &step()).unwrap().run.superseded);
        // As the live start made it: the same fold before the new ends.
        let at_start = fold_run(&log[..7], "sr2", &step()).expect("rebuilt").run;
        assert_eq!(
            serde_json::to_value(&at_start).unwrap(),
            serde_json::to_value(live_start(&stopped, None)).unwrap()
        );
    }

    /// The run sr2 as the live start makes it from sr1 as it read it
    /// (`stopped`, folded from `seen` of its events).
    fn live_start(stopped: &LoopRun, seen: Option<u64>) -> LoopRun {
        let fresh = crate::state::new_run(
            &LoopCommand {
                trace_id: "tr".into(),
                deadline_ms: 99,
                deadline_of: "step.timeout".into(),
                ..Default::default()
            },
            "each",
            5,
            2,
            json!({"a": 1}),
        );
        LoopRun {
            continues: "sr1".into(),
            continued_events: seen,
            ..crate::state::resumed(fresh, stopped, "sr1", &[])
        }
    }

    #[test]
    fn an_end_of_the_stopped_run_stored_after_the_start_read_it_is_the_new_runs() {
        // The start read sr1 with its two ends: 1 done, 0 failed, 2 in
        // flight; then 2's end was stored, before sr2's loop.started.
        let mut log = vec![token(), started(), ended(1, true, 10), ended(0, false, 0)];
        let read = fold_run(&log, "sr1", &step()).expect("rebuilt").run;
        assert_eq!(own_events(&log, "sr1"), 2);
        log.push(ended(2, true, 5));
        let mut continues = of_run("sr2", started());
        let mut payload: Value = serde_json::from_slice(&continues.payload_json).unwrap();
        payload["continues"] = json!("sr1");
        payload["continued_events"] = json!(2);
        continues.payload_json = serde_json::to_vec(&payload).unwrap();
        log.extend([resumed_event(&["each"]), of_run("sr2", token()), continues]);
        let folded = fold_run(&log, "sr2", &step()).expect("rebuilt").run;
        let live = live_start(&read, Some(2));
        // Its window: 0 and 2 again first.
        assert_eq!((live.done, live.in_flight.clone()), (1, vec![0, 2]));
        assert_eq!(
            serde_json::to_value(&folded).unwrap(),
            serde_json::to_value(&live).unwrap(),
            "the fold starts from sr1 as the start read it"
        );
        // Folded from every event before sr2 instead, 2 would count done
        // and never run in sr2, which live ran it.
        payload["continued_events"] = Value::Null;
        let last = log.len() - 1;
        log[last].payload_json = serde_json::to_vec(&payload).unwrap();
        let all = fold_run(&log, "sr2", &step()).expect("rebuilt").run;
        assert_eq!((all.done, all.in_flight), (2, vec![0, 3]));
    }

    /// The `batch.accepted` of iterations `first..first + count` of sr1.
    fn accepted(first: u64, count: u64) -> Event {
        ev(
            EventType::BatchAccepted,
            json!({"loop_run_id": "sr1", "items": [[first, count]]}),
        )
    }

    /// The `batch.completed` of sr1 reporting `ends` (index, ok, reduced).
    fn completed(ends: &[(u64, bool, i64)]) -> Event {
        let batched: Vec<_> = (ends.iter())
            .map(|(i, ok, n)| noetl_mesh::events::BatchedEnd {
                index: *i,
                at_ms: 1_000 + i,
                end: payloads::compact_end("sr1", 1_000 + i, &report(*i, *ok, *n)),
            })
            .collect();
        let draft = noetl_mesh::events::EventDraft {
            execution_id: "e1",
            step_run_id: "sr1",
            step: "each",
            trace_id: "tr",
            ..Default::default()
        };
        let mut out = noetl_mesh::events::batch_completed(draft, &batched);
        assert_eq!(out.len(), 1);
        out.remove(0)
    }

    #[test]
    fn a_log_as_stored_folds_as_its_events_unfolded() {
        // 0..4 went out in one batch and ended in two; 4 alone. Stored,
        // the run's events are three messages, unfolded nine.
        let stored = vec![
            token(),
            started(),
            accepted(0, 4),
            completed(&[(1, true, 10), (0, true, 20)]),
            completed(&[(2, false, 0), (3, true, 40)]),
            iteration_started(4),
        ];
        let seqs: Vec<u64> = (1..=stored.len() as u64).collect();
        let (useqs, unfolded): (Vec<u64>, Vec<Event>) = (stored.iter().zip(&seqs))
            .flat_map(|(e, seq)| noetl_mesh::events::unfold(e.clone()).map(|u| (*seq, u)))
            .unzip();
        assert_eq!(unfolded.len(), 2 + 4 + 4 + 1);
        let of = |log: &[Event], srid| {
            let f = fold_run(log, srid, &step()).expect("rebuilt");
            (
                serde_json::to_value(&f.run).unwrap(),
                serde_json::to_value(&f.claims).unwrap(),
            )
        };
        assert_eq!(of(&stored, "sr1"), of(&unfolded, "sr1"));
        let (run, _) = of(&stored, "sr1");
        assert_eq!(
            (run["done"].clone(), run["failed"].clone()),
            (json!(3), json!(1))
        );
        assert_eq!(own_events(&stored, "sr1"), 9);
        assert_eq!(own_events(&unfolded, "sr1"), 9);
        assert_eq!(
            batches_of(&stored, &seqs, "sr1"),
            batches_of(&unfolded, &useqs, "sr1")
        );
        assert_eq!(batches_of(&stored, &seqs, "sr1"), vec![[0, 4], [4, 5]]);
        // A resumed run that read sr1 up to an end inside the first
        // batch.completed (4 starts and one end): the stored log is cut
        // inside that message as the unfolded one is cut between events.
        let mut continues = of_run("sr2", started());
        let mut payload: Value = serde_json::from_slice(&continues.payload_json).unwrap();
        payload["continues"] = json!("sr1");
        payload["continued_events"] = json!(5);
        continues.payload_json = serde_json::to_vec(&payload).unwrap();
        let later = [resumed_event(&["each"]), of_run("sr2", token()), continues];
        let stored: Vec<Event> = stored.into_iter().chain(later.clone()).collect();
        let unfolded: Vec<Event> = unfolded.into_iter().chain(later).collect();
        let (sr2, _) = of(&stored, "sr2");
        assert_eq!(sr2, of(&unfolded, "sr2").0);
        // Only 1's end was read: 0, 2 and 3 run again in sr2.
        assert_eq!(sr2["done"], json!(1), "{sr2}");
    }
}
