use super::*;
use noetl_wire::LoopCommand;
use serde_json::json;

fn run(failed: u64, deadline_ms: u64) -> LoopRun {
    LoopRun {
        step: "lp".into(),
        total: 4,
        max_in_flight: 4,
        next: 4,
        in_flight: vec![],
        done: 4 - failed,
        failed,
        stopped: false,
        args: json!({}),
        trace_id: String::new(),
        done_emitted: false,
        reduced: Default::default(),
        error: None,
        handled: Vec::new(),
        deadline_ms,
        deadline_of: "step \"lp\" lifecycle.timeout_s: 1".into(),
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

/// A run of `total` items, `window` at a time, with `first` dispatched.
fn window(total: u64, window: u64) -> LoopRun {
    let first: Vec<u64> = (0..total.min(window)).collect();
    LoopRun {
        total,
        max_in_flight: window,
        next: first.len() as u64,
        in_flight: first,
        done: 0,
        failed: 0,
        ..run(0, 0)
    }
}

fn ok(reduce: Value) -> Claim {
    Claim {
        failed: false,
        reduce: reduce.as_object().cloned().unwrap_or_default(),
        handled: Vec::new(),
    }
}

fn failed() -> Claim {
    Claim {
        failed: true,
        reduce: Default::default(),
        handled: Vec::new(),
    }
}

#[test]
fn unreadable_items_fail_their_iterations_once() {
    let mut r = window(10, 4);
    r.in_flight = vec![4, 5, 6];
    let error = json!({"kind": "loop.items", "message": "gone"});
    let next = items_gone(&r, &[5, 6], &error).expect("recorded");
    assert_eq!(next.in_flight, vec![4]);
    assert_eq!(next.failed, 2);
    assert!(next.stopped);
    assert_eq!(next.error, Some(error.clone()));
    // The same report again changes nothing.
    assert!(items_gone(&next, &[5, 6], &error).is_none());
    // A later error keeps the first.
    let other = json!({"kind": "loop.items", "message": "other"});
    let again = items_gone(&next, &[4], &other).expect("recorded");
    assert_eq!(again.error, Some(error));
    assert_eq!(again.failed, 3);
}

fn arrive(r: &LoopRun, index: u64, claim: &Claim, fail_fast: bool) -> Option<(LoopRun, Vec<u64>)> {
    let reducers = vec![
        ("total".to_string(), ReducerOp::Sum),
        ("rows".to_string(), ReducerOp::Append),
    ];
    count_iteration(
        r,
        &Arrival {
            index,
            claim,
            fail_fast,
            reducers: &reducers,
            step: "lp",
            viewed: true,
        },
    )
}

#[test]
fn a_batch_counts_as_its_reports_would_one_by_one() {
    let reducers = vec![("total".to_string(), ReducerOp::Sum)];
    let claims = [
        (0, ok(json!({"total": 2}))),
        (1, failed()),
        (0, ok(json!({"total": 9}))), // a redelivery of 0
        (2, ok(json!({"total": 5}))),
        (7, ok(json!({"total": 1}))), // not in flight
    ];
    let arrivals: Vec<Arrival<'_>> = claims
        .iter()
        .enumerate()
        .map(|(k, (index, claim))| Arrival {
            index: *index,
            claim,
            fail_fast: false,
            reducers: &reducers,
            step: "lp",
            // Two handlers' reports: the first's two, the second's three.
            viewed: k == 1 || k == 4,
        })
        .collect();
    let start = window(6, 3);
    let (last, each) = count_batch(&start, &arrivals, 3);
    let mut cur = start.clone();
    for (a, c) in arrivals.iter().zip(&each) {
        match count_iteration(&cur, a) {
            Some((next, newly)) => {
                assert!(c.counted, "index {} counts", a.index);
                assert_eq!(c.newly, newly);
                cur = next;
            }
            None => assert!(!c.counted && c.newly.is_empty(), "index {}", a.index),
        }
        // Only a handler's last report carries the run, as it stands
        // after that report.
        assert_eq!(c.run.is_some(), a.viewed, "index {}", a.index);
        if let Some(run) = &c.run {
            assert_eq!(run.in_flight, cur.in_flight);
            assert_eq!((run.done, run.failed), (cur.done, cur.failed));
        }
    }
    let last = last.expect("some counted: one write");
    assert_eq!((last.done, last.failed), (2, 1));
    assert_eq!(last.reduced.get("total"), Some(&json!(7)));
    assert_eq!(last.in_flight, vec![3, 4, 5]);
    // The three the write put in flight go out as one batch, which every
    // report's handler sees (each publishes the whole batch).
    assert_eq!(last.batches, vec![[3, 6]]);
    assert!(each
        .iter()
        .filter_map(|c| c.run.as_ref())
        .all(|run| run.batches == last.batches));
    // Only redeliveries: nothing to write.
    let again = [Arrival {
        index: 0,
        claim: &claims[0].1,
        fail_fast: false,
        reducers: &reducers,
        step: "lp",
        viewed: true,
    }];
    assert!(count_batch(&last, &again, 3).0.is_none());
}

#[test]
fn a_counted_iteration_frees_its_slot_for_the_next_index() {
    let r = window(5, 2);
    let (r, newly) = arrive(&r, 0, &ok(json!({})), false).unwrap();
    assert_eq!((r.done, r.failed), (1, 0));
    assert_eq!(newly, vec![2]);
    assert_eq!(r.in_flight, vec![1, 2]);
    assert_eq!(r.next, 3);
}

#[test]
fn a_redelivered_report_counts_nothing() {
    let r = window(5, 2);
    let (r, _) = arrive(&r, 0, &ok(json!({})), false).unwrap();
    assert!(arrive(&r, 0, &ok(json!({})), false).is_none());
    // An index never dispatched is not counted either.
    assert!(arrive(&r, 4, &ok(json!({})), false).is_none());
}

#[test]
fn the_window_never_exceeds_max_in_flight_and_the_loop_finishes() {
    let mut r = window(7, 3);
    let mut dispatched: Vec<u64> = r.in_flight.clone();
    while let Some(&i) = r.in_flight.first() {
        let (next, newly) = arrive(&r, i, &ok(json!({})), false).unwrap();
        assert!(next.in_flight.len() as u64 <= next.max_in_flight);
        dispatched.extend(newly);
        r = next;
    }
    assert_eq!(dispatched, (0..7).collect::<Vec<_>>());
    assert_eq!((r.done, r.next), (7, 7));
    assert!(r.finished());
}

#[test]
fn a_failure_stops_dispatching_under_fail_fast_only() {
    let r = window(5, 2);
    let (stopped, newly) = arrive(&r, 0, &failed(), true).unwrap();
    assert!(stopped.stopped && newly.is_empty());
    assert_eq!((stopped.failed, stopped.in_flight.clone()), (1, vec![1]));
    // The one in flight still counts; then the loop is finished.
    let (end, newly) = arrive(&stopped, 1, &ok(json!({})), true).unwrap();
    assert!(newly.is_empty() && end.finished());
    assert_eq!((end.done, end.failed, end.next), (1, 1, 2));
    // best_effort goes on.
    let (on, newly) = arrive(&r, 0, &failed(), false).unwrap();
    assert!(!on.stopped);
    assert_eq!(newly, vec![2]);
}

#[test]
fn sums_fold_once_per_iteration_and_growing_reducers_wait_for_the_end() {
    let r = window(3, 3);
    let (r, _) = arrive(&r, 0, &ok(json!({"total": 2, "rows": [1]})), false).unwrap();
    let (r, _) = arrive(&r, 2, &ok(json!({"total": 5, "rows": [3]})), false).unwrap();
    assert_eq!(r.reduced.get("total"), Some(&json!(7)));
    assert_eq!(r.reduced.get("rows"), None, "append stays in the claims");
    // A failed iteration contributes nothing.
    let (r, _) = arrive(&r, 1, &failed(), false).unwrap();
    assert_eq!(r.reduced.get("total"), Some(&json!(7)));
    // Undeclared keys are ignored.
    let r2 = window(1, 1);
    let (r2, _) = arrive(&r2, 0, &ok(json!({"other": 1})), false).unwrap();
    assert!(r2.reduced.is_empty());
}

#[test]
fn a_reducer_that_cannot_fold_fails_the_loop_and_stops_it() {
    let r = window(4, 1);
    let (r, newly) = arrive(&r, 0, &ok(json!({"total": "three"})), false).unwrap();
    assert!(r.stopped && newly.is_empty());
    let e = r.error.clone().expect("reducer error");
    assert_eq!(e["kind"], "reducer");
    assert!(e["message"].as_str().unwrap().contains("\"lp\""), "{e}");
    assert!(r.finished(), "nothing in flight, stopped");
}

#[test]
fn a_new_run_puts_its_first_window_in_flight() {
    let cmd = LoopCommand {
        trace_id: "t".into(),
        deadline_ms: 9,
        deadline_of: "d".into(),
        ..Default::default()
    };
    let r = new_run(&cmd, "lp", 5, 2, json!({"a": 1}));
    assert_eq!((r.next, r.in_flight.clone()), (2, vec![0, 1]));
    assert_eq!((r.deadline_ms, r.trace_id.as_str()), (9, "t"));
    let small = new_run(&cmd, "lp", 1, 16, json!({}));
    assert_eq!((small.next, small.in_flight), (1, vec![0]));
    let empty = new_run(&cmd, "lp", 0, 16, json!({}));
    assert!(empty.finished());
}

#[test]
fn only_append_extend_and_merge_grow_with_the_loop() {
    use ReducerOp::*;
    for (op, grows_) in [
        (Append, true),
        (Extend, true),
        (Merge, true),
        (Sum, false),
        (Min, false),
        (Max, false),
    ] {
        assert_eq!(grows(op), grows_, "{op:?}");
    }
}

#[test]
fn a_finished_loop_is_ok_partial_or_failed() {
    assert_eq!(loop_end(&run(0, 0), true), (LoopStatus::Ok, None));
    assert_eq!(loop_end(&run(1, 0), false), (LoopStatus::Partial, None));
    let (status, error) = loop_end(&run(1, 0), true);
    assert_eq!(status, LoopStatus::Failed);
    assert_eq!(
        error,
        Some(json!({"kind": "loop.failed", "message": "1 of 4 iterations failed (fail_fast)"}))
    );
}

#[test]
fn a_recorded_error_fails_the_loop_whatever_its_failure_mode() {
    let mut r = run(0, 0);
    r.error = Some(json!({"kind": "reducer", "message": "bad"}));
    for fail_fast in [true, false] {
        assert_eq!(
            loop_end(&r, fail_fast),
            (LoopStatus::Failed, r.error.clone())
        );
    }
}

#[test]
fn a_loop_is_finished_when_nothing_is_in_flight_and_nothing_is_left() {
    let mut r = window(3, 2);
    assert!(!r.finished());
    r.in_flight.clear();
    assert!(!r.finished(), "index 2 is still to dispatch");
    r.stopped = true;
    assert!(r.finished(), "stopped: nothing more is dispatched");
    assert!(run(0, 0).finished());
}

#[test]
fn a_loop_past_its_deadline_with_failures_times_out() {
    let e = timed_out(&run(2, 1_000), 1_000).expect("timed out");
    assert_eq!(e["kind"], "timeout");
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("lifecycle.timeout_s: 1"), "{m}");
    assert!(m.contains("2 of 4 iterations done, 2 failed"), "{m}");
    // Before the deadline, without failures, or without a deadline: no.
    assert_eq!(timed_out(&run(2, 1_000), 999), None);
    assert_eq!(timed_out(&run(0, 1_000), 5_000), None);
    assert_eq!(timed_out(&run(2, 0), 5_000), None);
}

#[test]
fn failures_are_kept_by_index() {
    let r = window(10, 4);
    let (r, _) = arrive(&r, 1, &failed(), false).unwrap();
    let (r, _) = arrive(&r, 0, &ok(json!({"total": 2})), false).unwrap();
    assert_eq!((r.failed, r.failed_at.clone()), (1, vec![1]));
    let gone = items_gone(&r, &[2], &json!({"kind": "loop.items"})).unwrap();
    assert_eq!((gone.failed, gone.failed_at), (2, vec![1, 2]));
}

#[test]
fn a_resumed_run_takes_only_what_did_not_finish_failures_first() {
    // 10 items, 4 at a time, best effort: 1 and 6 failed, 9 never ran back
    // (the execution stopped), the rest finished.
    let mut old = window(10, 4);
    for (i, claim) in [
        (0, ok(json!({}))),
        (1, failed()),
        (2, ok(json!({}))),
        (3, ok(json!({}))),
    ] {
        old = arrive(&old, i, &claim, false).unwrap().0;
    }
    for (i, claim) in [
        (4, ok(json!({}))),
        (5, ok(json!({}))),
        (6, failed()),
        (7, ok(json!({}))),
        (8, ok(json!({}))),
    ] {
        old = arrive(&old, i, &claim, false).unwrap().0;
    }
    assert_eq!((old.next, old.in_flight.clone()), (10, vec![9]));
    old.reduced.insert("total".into(), json!(7));
    let r = resumed(window(10, 2), &old, "sr0", &[]);
    assert_eq!(r.in_flight, vec![1, 6], "the failures first, window of 2");
    assert_eq!((r.redo.clone(), r.next, r.done), (vec![9], 10, 7));
    assert_eq!(
        r.reduced.get("total"),
        Some(&json!(7)),
        "not folded yet: carried"
    );
    assert_eq!(
        (r.carried, r.claims_of.clone()),
        (0, vec!["sr0".to_string()]),
        "its growing contributions are in its claims"
    );
    // The three run, and the run is finished with every item done.
    let mut r = r;
    for i in [1, 6, 9] {
        r = arrive(&r, i, &ok(json!({})), false).unwrap().0;
    }
    assert!(r.finished());
    assert_eq!((r.done, r.failed), (10, 0));
    // A run that ended folded its aggregates already: nothing carried.
    old.done_emitted = true;
    let r = resumed(window(10, 2), &old, "sr0", &[]);
    assert!(r.reduced.is_empty());
    assert_eq!((r.carried, r.claims_of.len()), (7, 0), "all in ctx already");
}

#[test]
fn a_run_resumed_twice_still_runs_what_the_first_resume_had_left_to_redo() {
    // 10 items one at a time: 3 and 5 failed; the first resume runs 3
    // again, which fails again and stops the run (fail fast) before 5 went
    // out.
    let mut base = window(10, 1);
    base.next = 10;
    base.in_flight.clear();
    base.done = 8;
    (base.failed, base.failed_at) = (2, vec![3, 5]);
    let first = resumed(window(10, 1), &base, "sr0", &[]);
    assert_eq!(
        (first.in_flight.clone(), first.redo.clone()),
        (vec![3], vec![5])
    );
    let (first, _) = arrive(&first, 3, &failed(), true).unwrap();
    assert!(first.stopped && first.finished(), "{first:?}");
    assert_eq!(first.redo, vec![5]);
    // The second resume runs both: 5 never ran after the first failure.
    let second = resumed(window(10, 1), &first, "sr1", &[]);
    assert_eq!(
        (second.in_flight.clone(), second.redo.clone()),
        (vec![3], vec![5])
    );
    let mut r = second;
    for i in [3, 5] {
        r = arrive(&r, i, &ok(json!({})), false).unwrap().0;
    }
    assert!(r.finished());
    assert_eq!((r.done, r.failed), (10, 0));
}

#[test]
fn a_resumed_cursor_run_runs_again_the_rows_its_stopped_run_claimed_and_left() {
    use cursor::{apply_claim, start_run, ClaimSlot, Claimed, Frame};
    let cursor_run = || {
        let cmd = LoopCommand::default();
        start_run(new_run(&cmd, "lp", 0, 2, json!({})), 2, false)
    };
    let frame = |seq, base| Frame { seq, base, len: 2 };
    // Window 2, two rows a claim: claim 0 gives indices 0 and 1; 0 ends,
    // which issues claim 1; 1 fails, which stops the run (fail fast).
    let old = apply_claim(&cursor_run(), 0, &Claimed::Rows(2))
        .unwrap()
        .run;
    let (old, _) = arrive(&old, 0, &ok(json!({})), true).unwrap();
    let (stopped, _) = arrive(&old, 1, &failed(), true).unwrap();
    assert!(stopped.stopped && !stopped.finished(), "claim 1 is out");

    // Resumed while claim 1 is out: the failed row runs again first, and
    // claim 1 goes out again under its own identity; claims go on from
    // the stopped run's numbering.
    let r = resumed(cursor_run(), &stopped, "sr0", &[frame(0, 0)]);
    assert_eq!(r.in_flight, vec![1]);
    assert_eq!((r.next, r.total, r.done, r.failed), (2, 2, 1, 0));
    let c = r.cursor.clone().unwrap();
    assert_eq!(c.frames, [frame(0, 0)]);
    assert_eq!(
        c.claims,
        vec![ClaimSlot {
            seq: 1,
            identity: "sr0.1".into(),
            ..Default::default()
        }]
    );
    assert_eq!(c.next_claim, 2);
    // Claim 1's rows come: indices 2 and 3, after the stopped run's.
    let a = apply_claim(&r, 1, &Claimed::Rows(2)).unwrap();
    assert_eq!((a.run.total, a.newly.clone()), (4, vec![2]));
    // A twice-resumed run keeps the first identity of a claim it sends
    // again.
    let mut again = stopped.clone();
    again.cursor.as_mut().unwrap().claims[0].identity = "sr-first.1".into();
    let r2 = resumed(cursor_run(), &again, "sr0", &[frame(0, 0)]);
    assert_eq!(r2.cursor.unwrap().claims[0].identity, "sr-first.1");

    // Claim 1 comes back after the stop: its rows are placed (indices 2
    // and 3) and none runs; the resumed run runs them after the failed one.
    let old = apply_claim(&stopped, 1, &Claimed::Rows(2)).unwrap().run;
    assert_eq!((old.total, old.in_flight.len()), (4, 0));
    assert!(old.finished());
    let frames = [frame(0, 0), frame(1, 2)];
    let r = resumed(cursor_run(), &old, "sr0", &frames);
    assert_eq!((r.in_flight.clone(), r.next, r.total), (vec![1, 2], 3, 4));
    assert_eq!(r.cursor.clone().unwrap().frames, frames);
    assert!(r.cursor.unwrap().claims.is_empty(), "row 3 waits: no room");

    // Frames that do not place every row it runs again: everything anew.
    let anew = resumed(cursor_run(), &old, "sr0", &[frame(0, 0)]);
    assert_eq!(
        (anew.next, anew.done, anew.cursor),
        (0, 0, cursor_run().cursor)
    );
}

#[test]
fn a_run_that_cannot_say_what_finished_runs_everything_again() {
    let mut old = window(4, 4);
    old = arrive(&old, 0, &failed(), false).unwrap().0;
    old.failed_at.clear(); // recorded before failures were kept by index
    let fresh = window(4, 4);
    assert_eq!(
        resumed(fresh.clone(), &old, "sr0", &[]).in_flight,
        fresh.in_flight
    );
    let other_size = window(5, 4);
    assert_eq!(
        resumed(other_size.clone(), &window(4, 4), "sr0", &[]).next,
        other_size.next
    );
}

#[test]
fn handled_errors_of_counted_iterations_are_kept_once_each_and_counted() {
    use noetl_mesh::handled::HandledError;
    let zero = HandledError::new("risky", "python.exception", "ZeroDivisionError", "continue");
    let with = |e: &HandledError| Claim {
        handled: vec![e.clone()],
        ..ok(json!({}))
    };
    let r = window(5, 3);
    let (r, _) = arrive(&r, 0, &with(&zero), false).unwrap();
    let (r, _) = arrive(&r, 1, &ok(json!({})), false).unwrap();
    let (r, _) = arrive(&r, 2, &with(&zero), false).unwrap();
    assert_eq!(r.handled.len(), 1);
    assert_eq!(r.handled[0].times, 2);
    // A redelivered report adds nothing.
    assert!(arrive(&r, 2, &with(&zero), false).is_none());
    // A failed iteration's handled errors count too (it went on, then failed).
    let other = HandledError::new("risky", "python.exception", "KeyError", "continue");
    let failed_with = Claim {
        handled: vec![other],
        ..failed()
    };
    let (r, _) = arrive(&r, 3, &failed_with, false).unwrap();
    assert_eq!(r.handled.len(), 2);
}

#[test]
fn a_superseded_run_counts_no_report_and_starts_nothing() {
    let mut r = window(10, 2);
    r.superseded = true;
    assert!(arrive(&r, 0, &ok(json!({"total": 1})), false).is_none());
    r.superseded = false;
    let (r, newly) = arrive(&r, 0, &ok(json!({"total": 1})), false).unwrap();
    assert_eq!((r.done, newly), (1, vec![2]));
}
