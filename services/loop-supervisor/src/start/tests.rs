use super::*;
use serde_json::json;

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

/// Start `plan`'s loop step with an empty scope.
fn starting<'a>(plan: &'a PlanRecord, cmd: &'a LoopCommand) -> Starting<'a> {
    let step = &plan.playbook.workflow[0];
    Starting {
        cmd,
        plan,
        step,
        lp: step.loop_.as_ref().unwrap(),
        sc: Scope::new(),
        args: json!({"a": 1}),
    }
}

#[test]
fn a_sequential_loop_runs_one_at_a_time_and_a_parallel_one_its_bound() {
    let ok = |v: Value| Some(Ok::<Value, String>(v));
    assert_eq!(
        max_in_flight(LoopMode::Sequential, ok(json!(8)), "lp"),
        Ok(1)
    );
    assert_eq!(
        max_in_flight::<String>(LoopMode::Parallel, None, "lp"),
        Ok(DEFAULT_MAX_IN_FLIGHT)
    );
    assert_eq!(max_in_flight(LoopMode::Parallel, ok(json!(8)), "lp"), Ok(8));
    assert_eq!(
        max_in_flight(LoopMode::Parallel, ok(json!(" 3 ")), "lp"),
        Ok(3)
    );
}

#[test]
fn a_bad_max_in_flight_fails_the_loop_naming_the_step() {
    for bad in [json!(0), json!(-1), json!("many"), json!(1.5)] {
        let e = max_in_flight(
            LoopMode::Parallel,
            Some(Ok::<Value, String>(bad.clone())),
            "lp",
        )
        .unwrap_err();
        assert!(
            e.contains(r#"step "lp" must be an integer >= 1"#),
            "{bad}: {e}"
        );
    }
    let e = max_in_flight(LoopMode::Parallel, Some(Err("undefined `n`")), "lp").unwrap_err();
    assert_eq!(e, r#"loop.spec.max_in_flight of step "lp": undefined `n`"#);
}

#[test]
fn loop_in_must_give_a_list() {
    assert_eq!(
        collection(Ok::<Value, String>(json!([1, 2])), "lp", "p.yaml"),
        Ok(vec![json!(1), json!(2)])
    );
    let e = collection(Ok::<Value, String>(json!({"a": 1})), "lp", "p.yaml").unwrap_err();
    assert!(e.contains("must give a list, it gave"), "{e}");
    let e = collection(Err::<Value, _>("boom"), "lp", "p.yaml").unwrap_err();
    assert_eq!(e, r#"loop.in of step "lp" failed in p.yaml: boom"#);
}

#[test]
fn a_cursor_loop_window_is_its_workers_times_their_rows_and_it_claims_at_once() {
    let p = plan(json!({"step": "lp", "loop": {
        "cursor": {"claim": "update t set x = 1 returning *"},
        "iterator": "row",
        "spec": {"mode": "cursor", "max_in_flight": 2,
                 "frame": {"row_concurrency": 3, "max_rows": 10}}}}));
    let cmd = LoopCommand::default();
    let run = cursor_run(&starting(&p, &cmd)).unwrap();
    assert_eq!((run.total, run.max_in_flight), (0, 6));
    let c = run.cursor.expect("a cursor run");
    assert_eq!((c.max_rows, c.claims.len()), (10, 1));
    assert_eq!(run.args, json!({"a": 1}));
}

#[test]
fn bad_reducers_or_frame_settings_fail_a_cursor_loop() {
    let p = plan(json!({"step": "lp", "loop": {
        "cursor": {"claim": "select 1"},
        "iterator": "row",
        "spec": {"mode": "cursor", "policy": {"reducers": {"n": "nope"}}}}}));
    let cmd = LoopCommand::default();
    let e = cursor_run(&starting(&p, &cmd)).unwrap_err();
    assert!(
        e.starts_with(r#"loop.spec.policy.reducers of step "lp": "#),
        "{e}"
    );
    let p = plan(json!({"step": "lp", "loop": {
        "cursor": {"claim": "select 1"},
        "iterator": "row",
        "spec": {"mode": "cursor", "frame": {"max_rows": 0}}}}));
    let e = cursor_run(&starting(&p, &cmd)).unwrap_err();
    assert!(e.contains("frame.max_rows of step \"lp\""), "{e}");
}

#[test]
fn a_loop_over_more_items_than_its_limit_fails() {
    let p = plan(json!({"step": "lp", "loop": {"in": [1], "iterator": "x",
                                             "spec": {"mode": "parallel", "max_in_flight": 4}}}));
    let cmd = LoopCommand::default();
    assert_eq!(in_bounds(&starting(&p, &cmd), 3), Ok(4));
    let e = in_bounds(&starting(&p, &cmd), usize::MAX).unwrap_err();
    assert!(
        e.contains(r#"loop.in of step "lp" in t.yaml, execution e1"#),
        "{e}"
    );
}
