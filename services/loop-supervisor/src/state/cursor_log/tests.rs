use super::super::cursor::{apply_claim, Claimed};
use super::super::{count_iteration, new_run, Arrival, Claim};
use super::*;
use noetl_mesh::payloads::{IterationEnded, Status};
use noetl_wire::LoopCommand;
use serde_json::json;

fn step(per_frame: bool) -> Step {
    let process = if per_frame { "frame" } else { "row" };
    serde_json::from_value(json!({
        "step": "lp",
        "loop": {
            "cursor": {"kind": "postgres", "claim": "UPDATE q SET s = 1 RETURNING id"},
            "iterator": "job",
            "spec": {
                "mode": "cursor",
                "max_in_flight": 2,
                "frame": {"max_rows": 2, "process": process},
                "policy": {"reducers": {"n": "sum"}}
            }
        },
        "tool": [{"name": "w", "kind": "noop"}]
    }))
    .expect("a cursor loop step")
}

/// The run `log` (its `loop.started` first, then its events) folds to,
/// as `from_log::fold_run` starts it.
fn fold_run(log: &[Event], _srid: &str, step: &Step) -> Result<FromLog, String> {
    let started: LoopStarted = payloads::decode(&log[0]).unwrap();
    let cmd = LoopCommand {
        trace_id: log[0].trace_id.clone(),
        ..Default::default()
    };
    let run = new_run(
        &cmd,
        "lp",
        started.total,
        started.max_in_flight,
        Value::Null,
    );
    let run = started_run(run, &started, step)?;
    fold_cursor(run, Vec::new(), &Ends::of(step), || {
        log[1..].iter().cloned()
    })
}

fn ev<P: payloads::EventPayload>(payload: &P) -> Event {
    noetl_mesh::events::EventDraft {
        execution_id: "e1",
        step_run_id: "sr1",
        step: "lp",
        trace_id: "tr",
        ..Default::default()
    }
    .build(payload)
}

fn loop_started() -> Event {
    ev(&LoopStarted {
        total: 0,
        max_in_flight: 2,
        mode: None,
        deadline_ms: 0,
        deadline_of: String::new(),
        collection: Value::Null,
        max_rows: 2,
        continues: String::new(),
        continued_events: None,
    })
}

fn claimed(seq: u64, rows: &[u64]) -> Event {
    ev(&ClaimEnded {
        loop_run_id: "sr1".into(),
        seq,
        status: Status::Ok,
        rows: json!(rows),
        count: rows.len() as u64,
        error: Value::Null,
    })
}

fn started(index: u64, claim: u64) -> Event {
    ev(&IterationStarted {
        loop_run_id: "sr1".into(),
        index,
        claim: Some(claim),
    })
}

fn ended(index: u64) -> Event {
    ev(&IterationEnded {
        loop_run_id: "sr1".into(),
        index,
        status: Status::Ok,
        result: Value::Null,
        iter: Value::Null,
        reduce: json!({"n": 1}).as_object().unwrap().clone(),
        error: Value::Null,
        handled: Vec::new(),
        last_task: None,
    })
}

/// The live run of `step(false)` as it starts.
fn live() -> LoopRun {
    let run = new_run(&LoopCommand::default(), "lp", 0, 2, Value::Null);
    cursor::start_run(run, 2, false)
}

fn count(run: &LoopRun, index: u64) -> LoopRun {
    let claim = Claim {
        failed: false,
        reduce: json!({"n": 1}).as_object().unwrap().clone(),
        handled: Vec::new(),
    };
    let reducers = vec![("n".to_string(), noetl_core::reduce::ReducerOp::Sum)];
    let a = Arrival {
        index,
        claim: &claim,
        fail_fast: true,
        reducers: &reducers,
        step: "lp",
        viewed: true,
    };
    count_iteration(run, &a).expect("in flight").0
}

fn cursor_of(run: &LoopRun) -> &cursor::CursorRun {
    run.cursor.as_ref().expect("a cursor run")
}

#[test]
fn a_run_folds_from_its_claims_and_ends_as_it_ran_live() {
    // Live: claim 0 gives rows 10, 11 (indices 0, 1); iteration 0 ends,
    // which issues claim 1; claim 1 gives row 12 (index 2).
    let r = live();
    assert_eq!(cursor_of(&r).claims.len(), 1);
    let r = apply_claim(&r, 0, &Claimed::Rows(2)).unwrap().run;
    let r = count(&r, 0);
    let r = apply_claim(&r, 1, &Claimed::Rows(1)).unwrap().run;
    let log = vec![
        loop_started(),
        claimed(0, &[10, 11]),
        started(0, 0),
        started(1, 0),
        ended(0),
        claimed(1, &[12]),
        started(2, 1),
    ];
    let got = fold_run(&log, "sr1", &step(false)).expect("rebuilt");
    let f = &got.run;
    assert_eq!((f.total, f.next, f.done), (r.total, r.next, r.done));
    assert_eq!(f.in_flight, r.in_flight);
    assert_eq!(f.reduced, r.reduced);
    assert_eq!(cursor_of(f).frames, cursor_of(&r).frames);
    assert_eq!(cursor_of(f).next_claim, cursor_of(&r).next_claim);
    assert_eq!((f.max_in_flight, f.trace_id.as_str()), (2, "tr"));
    // Index 1 (claim 0) and 2 (claim 1) still run: both frames are kept,
    // with the rows their reports carried.
    assert_eq!(got.frames, vec![(0, json!([10, 11])), (1, json!([12]))]);
    assert!(!f.finished());
}

#[test]
fn claims_applied_live_in_another_order_than_stored_keep_their_indices() {
    // A window of 3 with one row per claim: claims 0, 1 and 2 go out at
    // the start. Their reports are stored 0 then 1, but the live run
    // applied 1 first: its row has index 0, claim 0's rows 1 and 2.
    let mut ls: LoopStarted = payloads::decode(&loop_started()).unwrap();
    ls.max_in_flight = 3;
    ls.max_rows = 1;
    let head = vec![ev(&ls), claimed(0, &[10, 11]), claimed(1, &[12])];
    let log = [head.clone(), vec![started(0, 1), started(1, 0)]].concat();
    let f = fold_run(&log, "sr1", &step(false)).expect("rebuilt").run;
    assert_eq!(
        cursor_of(&f).frames,
        vec![
            Frame {
                seq: 1,
                base: 0,
                len: 1
            },
            Frame {
                seq: 0,
                base: 1,
                len: 2
            }
        ]
    );
    assert_eq!((f.total, f.next), (3, 3));
    // Starts that do not fit the claims are refused, naming the claim.
    let log = [head, vec![started(0, 1), started(2, 0)]].concat();
    let err = fold_run(&log, "sr1", &step(false)).unwrap_err();
    assert!(
        err.to_string()
            .contains("place claim 0 at index 2, its claims at index 1"),
        "{err}"
    );
}

#[test]
fn an_empty_claim_is_not_taken_as_the_end_before_loop_done() {
    // Claim 0 was quiet and came back empty: live, the run is drained.
    let r = apply_claim(&live(), 0, &Claimed::Rows(0)).unwrap().run;
    assert!(cursor_of(&r).drained && r.finished());
    // Rebuilt, it claims once more (claim 1, quiet), which decides.
    let log = vec![loop_started(), claimed(0, &[])];
    let f = fold_run(&log, "sr1", &step(false)).expect("rebuilt").run;
    let c = cursor_of(&f);
    assert!(!c.drained && !f.finished());
    assert_eq!(c.claims.iter().map(|s| s.seq).collect::<Vec<_>>(), vec![1]);
    // With its loop.done in the log it stays ended.
    let done: payloads::LoopDone = serde_json::from_value(json!({
        "boundary": true, "status": "ok",
        "counts": {"total": 0, "done": 0, "failed": 0},
        "result": {"total": 0, "done": 0, "failed": 0}
    }))
    .unwrap();
    let done = ev(&done);
    let f = fold_run(&[log, vec![done]].concat(), "sr1", &step(false))
        .expect("rebuilt")
        .run;
    assert!(cursor_of(&f).drained && f.finished() && f.done_emitted);
}

#[test]
fn a_claim_reported_is_taken_as_issued() {
    // The fold had issued claim 0 only; claim 2's report says claims 1
    // and 2 went out: 2 is applied, 1 stays in flight.
    let log = vec![loop_started(), claimed(2, &[30])];
    let f = fold_run(&log, "sr1", &step(false)).expect("rebuilt").run;
    let c = cursor_of(&f);
    assert_eq!(
        c.frames,
        vec![Frame {
            seq: 2,
            base: 0,
            len: 1
        }]
    );
    let in_flight: Vec<u64> = c.claims.iter().map(|s| s.seq).collect();
    assert!(
        in_flight.contains(&0) && in_flight.contains(&1),
        "{in_flight:?}"
    );
    assert_eq!(f.in_flight, vec![0]);
}

#[test]
fn one_iteration_per_claim_with_process_frame() {
    let log = vec![loop_started(), claimed(0, &[1, 2]), started(0, 0)];
    let got = fold_run(&log, "sr1", &step(true)).expect("rebuilt");
    assert_eq!(got.run.total, 1);
    assert_eq!(got.frames, vec![(0, json!([1, 2]))]);
    assert!(cursor_of(&got.run).per_frame);
}

#[test]
fn what_an_older_log_does_not_carry_is_refused_by_name() {
    let mut ls: LoopStarted = payloads::decode(&loop_started()).unwrap();
    ls.max_rows = 0;
    let err = fold_run(&[ev(&ls)], "sr1", &step(false)).unwrap_err();
    assert!(err.to_string().contains("max_rows"), "{err}");
    let old = ev(&IterationStarted {
        loop_run_id: "sr1".into(),
        index: 0,
        claim: None,
    });
    let log = vec![loop_started(), claimed(0, &[1]), old];
    let err = fold_run(&log, "sr1", &step(false)).unwrap_err();
    assert!(err.to_string().contains("does not name its claim"), "{err}");
}

#[test]
fn a_resumed_run_folds_from_the_frames_it_took_of_the_run_it_continues() {
    // The stopped run: claim 0 gives rows 10, 11; iteration 0 ends (which
    // issues claim 1), iteration 1 fails (fail fast: the run stops).
    let mut failed = payloads::decode::<IterationEnded>(&ended(1)).unwrap();
    (failed.status, failed.error) = (Status::Error, json!({"message": "bad row"}));
    let log = vec![
        loop_started(),
        claimed(0, &[10, 11]),
        started(0, 0),
        started(1, 0),
        ended(0),
        ev(&failed),
    ];
    let old = fold_run(&log, "sr1", &step(false)).expect("rebuilt");
    assert!(old.run.stopped);
    // Both rows are counted, so no frame is kept; the failed row's frame
    // is what a resumed run runs again.
    assert!(old.frames.is_empty());
    let frame = Frame {
        seq: 0,
        base: 0,
        len: 2,
    };
    assert_eq!(old.again, vec![(frame.clone(), json!([10, 11]))]);

    // The new run takes it (its start, live and in a fold alike): row 1
    // runs again, claim 1 goes out again under the stopped run's identity.
    let fresh = started_run(
        new_run(&LoopCommand::default(), "lp", 0, 2, Value::Null),
        &payloads::decode(&loop_started()).unwrap(),
        &step(false),
    )
    .unwrap();
    let (run, carried) = super::super::continued_run(fresh, old, "sr1");
    assert_eq!(carried, vec![(0, json!([10, 11]))]);
    assert_eq!((run.in_flight.clone(), run.next, run.done), (vec![1], 2, 1));
    let c = cursor_of(&run);
    assert_eq!(
        c.claims
            .iter()
            .map(|s| (s.seq, s.identity.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, "sr1.1")]
    );
    // Live: claim 1 gives row 12 (index 2), which ends.
    let live = apply_claim(&run, 1, &Claimed::Rows(1)).unwrap().run;
    let live = count(&live, 2);
    // Its own events (iteration 1 of claim 0, claim 1, iteration 2) fold
    // from the same start to the same run, with the taken frame's rows.
    let own = [started(1, 0), claimed(1, &[12]), started(2, 1), ended(2)];
    let got = fold_cursor(run, carried, &Ends::of(&step(false)), || {
        own.iter().cloned()
    })
    .expect("rebuilt");
    let f = &got.run;
    assert_eq!(
        (f.total, f.next, f.done, f.in_flight.clone()),
        (live.total, live.next, live.done, live.in_flight.clone())
    );
    assert_eq!((f.total, f.done), (3, 2));
    assert_eq!(cursor_of(f).frames, cursor_of(&live).frames);
    assert_eq!(cursor_of(f).frames, vec![frame]);
    assert_eq!(got.frames, vec![(0, json!([10, 11]))]);
}

#[test]
fn a_success_counted_live_before_a_failure_stored_first_keeps_what_it_dispatched() {
    // Live, reports are counted concurrently: iteration 0's success is
    // counted first and dispatches index 2 (the waiting row), then 1's
    // failure stops the run; 2 runs and ends.
    let mut ls: LoopStarted = payloads::decode(&loop_started()).unwrap();
    ls.max_rows = 3;
    let r = cursor::start_run(
        new_run(&LoopCommand::default(), "lp", 0, 2, Value::Null),
        3,
        false,
    );
    let r = apply_claim(&r, 0, &Claimed::Rows(3)).unwrap().run;
    let r = count(&r, 0);
    assert_eq!(r.in_flight, vec![1, 2]);
    let fail = Claim {
        failed: true,
        reduce: Default::default(),
        handled: Vec::new(),
    };
    let a = Arrival {
        index: 1,
        claim: &fail,
        fail_fast: true,
        reducers: &[],
        step: "lp",
        viewed: true,
    };
    let r = count_iteration(&r, &a).expect("in flight").0;
    let live = count(&r, 2);
    assert!(live.stopped && live.finished());
    // The log stored the failure before the success: the fold stops first,
    // and takes index 2 as dispatched from its start.
    let mut failed = payloads::decode::<IterationEnded>(&ended(1)).unwrap();
    failed.status = Status::Error;
    let log = vec![
        ev(&ls),
        claimed(0, &[10, 11, 12]),
        started(0, 0),
        started(1, 0),
        ev(&failed),
        ended(0),
        started(2, 0),
        ended(2),
    ];
    let f = fold_run(&log, "sr1", &step(false)).expect("rebuilt").run;
    assert_eq!(
        (f.done, f.failed, f.next, f.in_flight.clone()),
        (live.done, live.failed, live.next, live.in_flight.clone())
    );
    assert_eq!((f.done, f.failed), (2, 1));
}
