use super::*;
use crate::state::{cursor, new_run};
use noetl_mesh::plan::PlanRecord;

fn plan(step: Value) -> PlanRecord {
    let playbook = json!({
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "t"},
        "workflow": [step],
    });
    PlanRecord::new(
        "e1".into(),
        "t.yaml".into(),
        serde_json::from_value(playbook).unwrap(),
        json!({}),
    )
}

fn tool_loop() -> PlanRecord {
    plan(
        json!({"step": "lp", "loop": {"in": "{{ [1, 2] }}", "iterator": "x"},
                "tool": [{"name": "t", "kind": "python", "code": "x = 1"}]}),
    )
}

fn at(plan: &PlanRecord) -> RunAt<'_> {
    RunAt {
        plan,
        step: &plan.playbook.workflow[0],
        srid: "r1",
    }
}

fn run(total: u64) -> LoopRun {
    let cmd = LoopCommand {
        trace_id: "tr".into(),
        deadline_ms: 9,
        deadline_of: "d".into(),
        ..Default::default()
    };
    new_run(&cmd, "lp", total, 2, json!({"a": 1}))
}

/// The event types and other effects, in publish order.
fn kinds(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .map(|e| match e {
            Effect::Emit(ev) => ev.event_type.clone(),
            Effect::Task { kind, .. } => format!("task:{kind}"),
            Effect::Command { kind, .. } => format!("command:{kind}"),
            Effect::Loop(_) => "loop".into(),
            Effect::Token(_) => "token".into(),
        })
        .collect()
}

fn ids(effects: &[Effect]) -> Vec<String> {
    effects.iter().map(|e| e.id().to_string()).collect()
}

#[test]
fn a_window_starts_each_iteration_then_sends_its_first_task() {
    let p = tool_loop();
    let items = [(3, json!("a")), (4, json!("b"))];
    let effects = iterations(at(&p), &run(5), &items, 1);
    assert_eq!(
        kinds(&effects),
        [
            "loop.iteration.started",
            "task:python",
            "loop.iteration.started",
            "task:python"
        ]
    );
    let Effect::Task { task, cmd, .. } = &effects[1] else {
        unreachable!()
    };
    assert_eq!((task.as_str(), cmd.step_run_id.as_str()), ("t", "r1"));
    assert_eq!((cmd.pc, cmd.attempt, cmd.deadline_ms), (0, 1, 9));
    let it = cmd.iteration.as_ref().expect("an iteration");
    assert_eq!(it.index, 3);
    let iter: Value = serde_json::from_slice(&it.iter_json).unwrap();
    assert_eq!(iter, json!({"x": "a", "index": 3}));
    // Every id differs, and building the window again gives the same ones
    // (a redelivery publishes nothing new).
    let first = ids(&effects);
    let mut unique = first.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 4);
    assert_eq!(ids(&iterations(at(&p), &run(5), &items, 1)), first);
    let Effect::Emit(started) = &effects[0] else {
        unreachable!()
    };
    assert_eq!(
        (started.step_run_id.as_str(), started.trace_id.as_str()),
        ("r1", "tr")
    );
}

#[test]
fn a_window_goes_out_in_batches_of_a_quarter_of_it_and_the_same_window_is_the_same_batches() {
    let p = tool_loop();
    let cmd = LoopCommand {
        trace_id: "tr".into(),
        ..Default::default()
    };
    // A window of 16: batches of 4 (at most `batch`).
    let run = new_run(&cmd, "lp", 100, 16, json!({"a": 1}));
    let items: Vec<(u64, Value)> = (0..10).map(|i| (i, json!(i * 10))).collect();
    let effects = iterations(at(&p), &run, &items, 16);
    assert_eq!(
        kinds(&effects),
        [
            "batch.accepted",
            "task:python",
            "batch.accepted",
            "task:python",
            "batch.accepted",
            "task:python"
        ]
    );
    let Effect::Task { cmd, .. } = &effects[5] else {
        unreachable!()
    };
    assert!(cmd.iteration.is_none());
    let indices: Vec<u64> = cmd.batch.iter().map(|it| it.index).collect();
    assert_eq!(indices, [8, 9]);
    let iter: Value = serde_json::from_slice(&cmd.batch[1].iter_json).unwrap();
    assert_eq!(iter, json!({"x": 90, "index": 9}));
    let Effect::Emit(accepted) = &effects[4] else {
        unreachable!()
    };
    let body: payloads::BatchAccepted = payloads::decode_typed(accepted).unwrap();
    assert_eq!(
        body.items.iter().map(|i| i.index).collect::<Vec<_>>(),
        [8, 9]
    );
    assert_eq!(ids(&iterations(at(&p), &run, &items, 16)), ids(&effects));
    // `batch` bounds the size; a group of one goes out on its own.
    let effects = iterations(at(&p), &run, &items[..3], 2);
    assert_eq!(
        kinds(&effects),
        [
            "batch.accepted",
            "task:python",
            "loop.iteration.started",
            "task:python"
        ]
    );
    // NOETL_LOOP_BATCH=1: every iteration on its own.
    assert_eq!(iterations(at(&p), &run, &items, 1).len(), 20);
}

#[test]
fn iterations_go_out_in_the_batches_their_run_recorded() {
    let p = tool_loop();
    let cmd = LoopCommand::default();
    // Recorded when they entered the window: 0..3, 3..5, 5 alone.
    let mut run = new_run(&cmd, "lp", 100, 16, json!({}));
    run.batches = vec![[0, 3], [3, 5], [5, 6]];
    let items: Vec<(u64, Value)> = (0..8).map(|i| (i, json!(i))).collect();
    let effects = iterations(at(&p), &run, &items, 16);
    let groups: Vec<Vec<u64>> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Task { cmd, .. } if cmd.batch.is_empty() => {
                Some(vec![cmd.iteration.as_ref().unwrap().index])
            }
            Effect::Task { cmd, .. } => Some(cmd.batch.iter().map(|it| it.index).collect()),
            _ => None,
        })
        .collect();
    // 6 and 7, recorded in none (an older loop-supervisor's window), are
    // cut as before.
    assert_eq!(groups, [vec![0, 1, 2], vec![3, 4], vec![5], vec![6, 7]]);
    // The same batches, with the same ids, whenever they go out again.
    let again = iterations(at(&p), &run, &items[..6], 16);
    assert_eq!(ids(&again), ids(&effects[..6]));
    // Each iteration's own command when asked for (`admin rebuild`).
    assert_eq!(iterations(at(&p), &run, &items, 1).len(), 16);
}

#[test]
fn a_step_whose_calls_wait_for_a_slot_is_not_batched() {
    let p = tool_loop();
    assert_eq!(batch_size(64, 16, &p.playbook.workflow[0]), 16);
    assert_eq!(batch_size(64, 8, &p.playbook.workflow[0]), 8);
    assert_eq!(batch_size(6, 16, &p.playbook.workflow[0]), 1);
    let gated = plan(
        json!({"step": "lp", "loop": {"in": "{{ [1, 2] }}", "iterator": "x"},
        "spec": {"policy": {"concurrency": {"key": "k", "limit": 2}}},
        "tool": [{"name": "t", "kind": "python", "code": "x = 1"}]}),
    );
    assert_eq!(batch_size(64, 16, &gated.playbook.workflow[0]), 1);
}

#[test]
fn a_loop_without_tasks_has_its_iterations_done_at_once() {
    let p = plan(json!({"step": "lp", "loop": {"in": "{{ [1] }}", "iterator": "x"}}));
    let effects = iterations(at(&p), &run(1), &[(0, json!(1))], 1);
    assert_eq!(
        kinds(&effects),
        ["loop.iteration.started", "loop.iteration.done"]
    );
    // A step without a loop starts none.
    let p = plan(json!({"step": "lp"}));
    assert!(iterations(at(&p), &run(1), &[(0, json!(1))], 1).is_empty());
}

#[test]
fn loop_started_tells_the_bounds_and_the_mode() {
    let p = tool_loop();
    let Effect::Emit(ev) = loop_started(at(&p), &run(5), Value::Null) else {
        unreachable!()
    };
    assert_eq!(ev.event_type, "loop.started");
    let body: LoopStarted = payloads::decode_typed(&ev).unwrap();
    assert_eq!((body.total, body.max_in_flight), (5, 2));
    assert_eq!(body.mode, Some(noetl_core::LoopMode::Sequential));
}

#[test]
fn a_finished_loop_is_done_and_fails_its_step_when_it_failed() {
    let p = tool_loop();
    let mut r = run(2);
    r.in_flight.clear();
    r.done = 2;
    let sum = vec![noetl_mesh::payloads::Reduced {
        key: "total".into(),
        op: noetl_core::reduce::ReducerOp::Sum,
        value: json!(3),
    }];
    let ok = loop_done(at(&p), &r, Carried::Inline(sum.clone()));
    assert_eq!(kinds(&ok), ["loop.done"]);
    let Effect::Emit(ev) = &ok[0] else {
        unreachable!()
    };
    let body: LoopDone = payloads::decode_typed(ev).unwrap();
    assert!(body.boundary);
    assert_eq!(body.reduce, sum, "the reducer results it folded into ctx");
    // A failure under fail_fast (the default): `loop.done` then the
    // `step.failed` that is the boundary.
    r.done = 1;
    r.failed = 1;
    let failed = loop_done(at(&p), &r, Carried::Inline(Vec::new()));
    assert_eq!(kinds(&failed), ["loop.done", "step.failed"]);
    assert_eq!(failed[0].id(), ok[0].id(), "one loop.done per loop run");
    let Effect::Emit(ev) = &failed[0] else {
        unreachable!()
    };
    assert!(!payloads::decode_typed::<LoopDone>(ev).unwrap().boundary);
    // Under best_effort it is only partial.
    let p = plan(
        json!({"step": "lp", "loop": {"in": "{{ [1] }}", "iterator": "x"},
                        "spec": {"failure": {"mode": "best_effort"}}}),
    );
    assert_eq!(
        kinds(&loop_done(at(&p), &r, Carried::Inline(Vec::new()))),
        ["loop.done"]
    );
}

#[test]
fn claim_commands_are_named_after_the_run_and_their_sequence() {
    let p = plan(json!({"step": "lp", "loop": {
        "cursor": {"kind": "postgres", "claim": "update t set x = 1 returning *"},
        "iterator": "row", "spec": {"mode": "cursor"}}}));
    let r = cursor::start_run(run(0), 50, false);
    let (kind, cmds) = claims(at(&p), &r, &[0, 1], Sending::New).expect("a cursor loop");
    assert_eq!(kind, "postgres");
    let got: Vec<(String, u64, u64)> = cmds
        .iter()
        .map(|c| {
            let claim = c.claim.as_ref().unwrap();
            (c.command_id.clone(), claim.seq, claim.max_rows)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (derive_id(&["r1", "claim", "0"]), 0, 50),
            (derive_id(&["r1", "claim", "1"]), 1, 50)
        ]
    );
    assert!(cmds.iter().all(|c| !c.claim.as_ref().unwrap().again));
    // Sent again: marked, so the executor looks for its report first.
    let (_, again) = claims(at(&p), &r, &[1], Sending::Again).unwrap();
    assert!(again[0].claim.as_ref().unwrap().again);
    assert_eq!(again[0].command_id, cmds[1].command_id);
    // A loop over `in` claims nothing.
    assert!(claims(at(&tool_loop()), &run(2), &[0], Sending::New).is_none());
}

#[test]
fn a_loop_that_cannot_start_fails_its_step() {
    let cmd = LoopCommand {
        execution_id: "e1".into(),
        step: "lp".into(),
        step_run_id: "r1".into(),
        args_json: codec::json_bytes(&json!({"a": 1})),
        ..Default::default()
    };
    let Effect::Emit(ev) = start_failed(&cmd, "no list".into()) else {
        unreachable!()
    };
    assert_eq!(
        (ev.event_type.as_str(), ev.step_run_id.as_str()),
        ("step.failed", "r1")
    );
    let body: StepEnded = payloads::decode_typed(&ev).unwrap();
    assert_eq!(body.error.unwrap()["kind"], "loop.in");
    assert_eq!(body.args, json!({"a": 1}));
}
