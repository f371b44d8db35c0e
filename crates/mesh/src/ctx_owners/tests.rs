use super::*;
use crate::events::EventDraft;
use serde_json::json;

/// A `task.done` of task run `run` of loop run `srid` (step `fan`,
/// task `t`) with these payload fields.
fn done(srid: &str, run: &str, fields: Value) -> Event {
    let mut e = EventDraft {
        execution_id: "e1",
        step_run_id: srid,
        task_run_id: run,
        step: "fan",
        task: "t",
        ..Default::default()
    }
    .build_raw(
        EventType::TaskDone,
        crate::fold::tests::task_done_payload(fields),
    );
    e.task_run_id = run.into();
    e
}

fn loop_event(kind: EventType, srid: &str, payload: Value) -> Event {
    EventDraft {
        execution_id: "e1",
        step_run_id: srid,
        step: "fan",
        discriminator: kind.wire_name(),
        ..Default::default()
    }
    .build_raw(kind, payload)
}

#[test]
fn the_claims_of_a_loop_run_are_its_task_runs_that_wrote_set_ctx_in_log_order() {
    let log = [
        done(
            "r1",
            "a",
            json!({"set_ctx": {"x": 1, "y": "a"}, "index": 0}),
        ),
        // Another loop run (the step entered again) claims apart.
        done("r2", "z", json!({"set_ctx": {"x": 9}, "index": 0})),
        // Refused: nothing of it was claimed.
        done(
            "r1",
            "b",
            json!({"set_ctx": {"x": 2, "w": 2}, "index": 1, "ctx_refused": true}),
        ),
        // The same value from another task run: the first writer stays.
        done(
            "r1",
            "c",
            json!({"set_ctx": {"x": 1, "s": [1]}, "index": 2, "reduced": ["s"]}),
        ),
        // No set_ctx, or only reducer keys: no claim.
        done("r1", "d", json!({"index": 3})),
        done(
            "r1",
            "e",
            json!({"set_ctx": {"s": [2]}, "index": 4, "reduced": ["s"]}),
        ),
        // A task.done written before it carried the iteration.
        done("r1", "f", json!({"set_ctx": {"v": true}})),
    ];
    let owners = fold(&log, "r1").unwrap();
    assert_eq!(
        owners.keys().collect::<Vec<_>>(),
        ["v", "x", "y"],
        "{owners:?}"
    );
    assert_eq!(owners["x"].writer, r#"step "fan" iteration 0 task "t""#);
    assert_eq!(owners["x"].run, "a");
    assert_eq!(owners["x"].hash, value_hash(&json!(1)));
    assert_eq!(owners["v"].writer, r#"step "fan" task "t""#);
    assert_eq!(fold(&log, "r2").unwrap()["x"].run, "z");
    assert!(fold(&log, "r3").unwrap().is_empty());
}

#[test]
fn the_folded_claims_decide_as_the_live_ones() {
    // Live: iteration 0 claims x=1, iteration 1 writes x=2 and is refused.
    let live = |owners: Option<&CtxOwners>, v: Value, index: u64, run: &str| {
        let patch: Map<String, Value> = [("x".to_string(), v)].into_iter().collect();
        claim_ctx_keys(
            owners,
            &hashes(&patch),
            &writer("fan", Some(index), "t"),
            run,
        )
    };
    let CtxClaim::Write(live_owners) = live(None, json!(1), 0, "a") else {
        panic!("the first writer claims")
    };
    let CtxClaim::Conflict(live_refusal) = live(Some(&live_owners), json!(2), 1, "b") else {
        panic!("a different value is refused")
    };
    let log = [done("r1", "a", json!({"set_ctx": {"x": 1}, "index": 0}))];
    let folded = fold(&log, "r1").unwrap();
    assert_eq!(folded, live_owners);
    assert_eq!(
        live(Some(&folded), json!(2), 1, "b"),
        CtxClaim::Conflict(live_refusal)
    );
    // The same value from another run, and the owner's own run again, pass.
    assert_eq!(live(Some(&folded), json!(1), 1, "b"), CtxClaim::Held);
    assert_eq!(live(Some(&folded), json!(5), 0, "a"), CtxClaim::Held);
}

#[test]
fn a_write_that_was_let_through_after_a_loss_leaves_the_first_owner() {
    let log = [
        done("r1", "a", json!({"set_ctx": {"x": 1}, "index": 0})),
        done("r1", "b", json!({"set_ctx": {"x": 2, "y": 3}, "index": 1})),
    ];
    let owners = fold(&log, "r1").unwrap();
    assert_eq!(owners["x"].run, "a");
    // Its claim was refused as a whole, as live.
    assert!(!owners.contains_key("y"));
}

#[test]
fn a_patch_still_by_reference_is_refused_not_skipped() {
    let log = [done(
        "r1",
        "a",
        json!({"set_ctx_ref": {"key": "execution/e1/log/task-a"}, "index": 0}),
    )];
    let err = fold(&log, "r1").unwrap_err();
    assert!(err.to_string().contains("not hydrated"), "{err}");
}

#[test]
fn only_a_different_value_ctx_holds_may_change_a_claim() {
    let patch: Map<String, Value> = json!({"x": 1, "y": {"a": [1]}})
        .as_object()
        .unwrap()
        .clone();
    let h = hashes(&patch);
    assert!(differing(&json!({}), &h).is_empty());
    assert!(differing(&json!({"x": 1, "y": {"a": [1]}, "z": 0}), &h).is_empty());
    assert_eq!(differing(&json!({"x": 1, "y": {"a": [2]}}), &h), ["y"]);
    assert_eq!(
        differing(&json!({"x": "1", "y": {"a": [2]}}), &h),
        ["x", "y"]
    );
}

#[test]
fn the_open_parallel_runs_are_those_started_parallel_and_not_done() {
    let started = |srid: &str, mode: &str| {
        loop_event(
            EventType::LoopStarted,
            srid,
            json!({"total": 2, "max_in_flight": 2, "mode": mode}),
        )
    };
    let log = [
        started("p1", "parallel"),
        started("s1", "sequential"),
        started("p2", "parallel"),
        loop_event(EventType::LoopDone, "p2", json!({"status": "ok"})),
        started("p3", "parallel"),
        // An older loop.started without its mode is not known parallel.
        loop_event(
            EventType::LoopStarted,
            "p4",
            json!({"total": 1, "max_in_flight": 1}),
        ),
    ];
    assert_eq!(open_parallel_runs(&log).unwrap(), ["p1", "p3"]);
}
