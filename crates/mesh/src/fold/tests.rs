use super::*;
use crate::events::EventDraft;
use crate::payloads::{LoopCounts, LoopStatus, Reduced, StepEnded};
use noetl_core::reduce::ReducerOp;
use serde_json::json;

/// An event of execution `e1` (`srid`: its step-run, `step`: its step).
fn ev(kind: EventType, step: &str, srid: &str, payload: Value) -> Event {
    EventDraft {
        execution_id: "e1",
        step_run_id: srid,
        step,
        ..Default::default()
    }
    .build_raw(kind, payload)
}

/// A whole `task.done` payload with `fields` over the defaults.
pub(crate) fn task_done_payload(fields: Value) -> Value {
    let mut p = json!({"status": "ok", "attempt": 1, "duration_ms": 0, "result": null,
                       "error": null, "action": "continue", "rule": null,
                       "set_ctx": null, "set_iter": null});
    for (k, v) in fields.as_object().unwrap() {
        p[k] = v.clone();
    }
    p
}

fn task_done(srid: &str, run: &str, fields: Value) -> Event {
    let mut e = ev(EventType::TaskDone, "s", srid, task_done_payload(fields));
    e.task_run_id = run.into();
    e
}

fn started() -> Event {
    ev(
        EventType::PlaybookInitialized,
        "",
        "",
        json!({"playbook": "p", "source": "p.yaml", "parent_execution_id": "",
               "workload": {"n": 3}}),
    )
}

fn token(step: &str, id: &str, parent: &str) -> Event {
    ev(
        EventType::TokenCreated,
        step,
        parent,
        json!({"token_id": id, "step": step}),
    )
}

fn done(step: &str, srid: &str) -> Event {
    ev(
        EventType::StepDone,
        step,
        srid,
        payloads::to_value(&StepEnded::done(json!(1), json!({}))),
    )
}

/// The router's answer to step-run `srid`'s boundary of type `on`.
fn answer(step: &str, srid: &str, on: &str) -> Event {
    ev(
        EventType::NextSelected,
        step,
        srid,
        json!({"on": on, "mode": "exclusive", "arcs": []}),
    )
}

fn fold(events: &[Event]) -> Folded {
    Folded::of(events.iter().enumerate().map(|(i, e)| (i as u64 + 1, e))).unwrap()
}

#[test]
fn a_completed_run_folds_to_its_header_steps_and_ctx() {
    let f = fold(&[
        started(),
        token("a", "t1", ""),
        task_done("t1", "tr1", json!({"status": "ok", "set_ctx": {"x": 1}})),
        done("a", "t1"),
        token("b", "t2", "t1"),
        ev(
            EventType::NextSelected,
            "a",
            "t1",
            json!({"on": "step.done", "mode": "exclusive", "arcs": [], "set_ctx": {"y": 2}}),
        ),
        done("b", "t2"),
        ev(
            EventType::ExecutionCompleted,
            "",
            "",
            json!({"status": "completed", "error": null}),
        ),
    ]);
    let h = f.header.as_ref().unwrap();
    assert_eq!(h.status, ExecStatus::Completed);
    assert!(h.live.is_empty() && h.terminal_emitted);
    assert_eq!((h.playbook.as_str(), h.source.as_str()), ("p", "p.yaml"));
    assert_eq!(f.workload, json!({"n": 3}));
    assert_eq!(f.steps["a"].status, StepStatus::Done);
    assert_eq!(f.steps["b"].last_step_run_id, "t2");
    assert_eq!(Value::Object(f.ctx.clone()), json!({"x": 1, "y": 2}));
    assert_eq!(f.origins.ctx["y"].event_type, "next.selected");
    assert_eq!(f.origins.steps["b"].seq, 7);
    assert_eq!((f.events, f.last_seq), (8, 8));
}

#[test]
fn a_patch_is_applied_once_per_task_run_and_reduced_or_refused_keys_are_not() {
    let f = fold(&[
        started(),
        task_done("t1", "tr1", json!({"status": "ok", "set_ctx": {"n": 1}})),
        // A copy of the same task run's event: applied already.
        task_done("t1", "tr1", json!({"status": "ok", "set_ctx": {"n": 5}})),
        task_done(
            "t1",
            "tr2",
            json!({"status": "ok", "set_ctx": {"m": 1, "total": 4}, "reduced": ["total"]}),
        ),
        task_done(
            "t1",
            "tr3",
            json!({"status": "error", "set_ctx": {"k": 1}, "ctx_refused": true}),
        ),
    ]);
    assert_eq!(Value::Object(f.ctx), json!({"n": 1, "m": 1}));
}

#[test]
fn a_loop_s_reducer_results_combine_with_ctx_once() {
    let loop_done = |boundary: bool| {
        ev(
            EventType::LoopDone,
            "lp",
            "t1",
            payloads::to_value(&LoopDone {
                boundary,
                status: LoopStatus::Ok,
                counts: LoopCounts {
                    total: 2,
                    done: 2,
                    failed: 0,
                },
                result: LoopCounts::default(),
                args: json!({}),
                error: None,
                handled: Vec::new(),
                reduce: vec![Reduced {
                    key: "total".into(),
                    op: ReducerOp::Sum,
                    value: json!(5),
                }],
                reduce_ref: None,
            }),
        )
    };
    let f = fold(&[
        started(),
        token("lp", "t1", ""),
        task_done(
            "t0",
            "tr0",
            json!({"status": "ok", "set_ctx": {"total": 10}}),
        ),
        loop_done(true),
        loop_done(true),
        answer("lp", "t1", "loop.done"),
    ]);
    assert_eq!(
        f.ctx["total"],
        json!(15),
        "folded onto the value before, once"
    );
    let rec = &f.steps["lp"];
    assert_eq!(rec.loop_counts.as_ref().unwrap()["done"], 2);
    assert!(f.header.unwrap().live.is_empty());
}

#[test]
fn a_failure_keeps_the_stopped_tokens_and_a_resume_runs_again() {
    let failed = ev(
        EventType::StepFailed,
        "a",
        "t1",
        payloads::to_value(&StepEnded::failed(
            json!({"kind": "python.exception", "message": "boom"}),
            json!({}),
        )),
    );
    let stopped = TokenRecord::new("t1", "a");
    let mut f = fold(&[
        started(),
        token("a", "t1", ""),
        failed,
        ev(
            EventType::ExecutionFailed,
            "",
            "",
            json!({"status": "failed", "error": "step \"a\" failed", "stopped": [stopped]}),
        ),
    ]);
    let h = f.header.clone().unwrap();
    assert_eq!(h.status, ExecStatus::Failed);
    assert_eq!(h.stopped, vec![stopped]);
    assert_eq!(
        f.steps["a"].error.as_deref(),
        Some("python.exception: boom")
    );
    f.apply(
        5,
        &ev(
            EventType::ExecutionResumed,
            "",
            "",
            json!({"resumes": 1, "steps": ["a"], "resumed_at_ms": 42}),
        ),
    )
    .unwrap();
    f.apply(6, &token("a", "t1-r1", "")).unwrap();
    let h = f.header.unwrap();
    assert_eq!(h.status, ExecStatus::Running);
    assert_eq!((h.resumes, h.resumed_at_ms), (1, 42));
    assert!(h.stopped.is_empty() && h.error.is_none());
    assert_eq!(h.live.len(), 1);
}

#[test]
fn a_resume_that_names_its_plan_changes_the_folded_plan_and_an_older_one_marks_it_unknown() {
    let identity = |started_ms: u64| {
        json!({"digest": "sha256:ab", "playbook_ref": {"key": "plans/ab"},
               "started_ms": started_ms})
    };
    let mut init = started();
    let mut p = crate::events::payload(&init);
    p["plan"] = identity(10);
    init.payload_json = crate::codec::json_bytes(&p);
    let resumed = |n: u32, fields: Value| {
        let mut p = json!({"resumes": n, "steps": ["a"], "resumed_at_ms": 50});
        for (k, v) in fields.as_object().unwrap() {
            p[k] = v.clone();
        }
        ev(EventType::ExecutionResumed, "", "", p)
    };
    let failed = || {
        ev(
            EventType::ExecutionFailed,
            "",
            "",
            json!({"status": "failed", "error": "x"}),
        )
    };
    // A resume that named its plan: its start, and (hydrated) its workload.
    let f = fold(&[
        init.clone(),
        failed(),
        resumed(
            1,
            json!({"set": ["n"], "plan": identity(50), "workload": {"n": 4}}),
        ),
    ]);
    assert_eq!(f.plan.as_ref().map(|p| p.started_ms), Some(50));
    assert_eq!(f.workload, json!({"n": 4}));
    assert!(!f.plan_changed_by_resume);
    // A plain resume names its plan too: the workload stays.
    let f = fold(&[
        init.clone(),
        failed(),
        resumed(1, json!({"plan": identity(50)})),
    ]);
    assert_eq!(
        (f.plan.as_ref().map(|p| p.started_ms), &f.workload),
        (Some(50), &json!({"n": 3}))
    );
    assert!(!f.plan_changed_by_resume);
    // An older resume that changed it by key only, or a reference not
    // read back: unknown, until a later resume names it whole.
    let older = resumed(1, json!({"set": ["n"]}));
    assert!(fold(&[init.clone(), failed(), older.clone()]).plan_changed_by_resume);
    let unread = resumed(
        1,
        json!({"plan": identity(50), "workload_ref": {"key": "w"}}),
    );
    assert!(fold(&[init.clone(), failed(), unread]).plan_changed_by_resume);
    let whole = resumed(2, json!({"plan": identity(90), "workload": {"n": 5}}));
    let f = fold(&[init.clone(), failed(), older, failed(), whole]);
    assert!(!f.plan_changed_by_resume);
    assert_eq!(f.workload, json!({"n": 5}));
    // Another catalog version: the source from then on.
    let mut v2 = identity(50);
    v2["catalog_path"] = json!("demo/p");
    v2["catalog_version"] = json!(2);
    let versioned = resumed(
        1,
        json!({"playbook_version": 2, "plan": v2, "workload": {"n": 3}}),
    );
    let f = fold(&[init, failed(), versioned]);
    assert_eq!(f.header.unwrap().source, "demo/p@v2");
}

#[test]
fn a_boundary_of_a_token_not_live_or_a_join_s_absorbed_token_writes_no_record() {
    let f = fold(&[
        started(),
        token("j", "t1", ""),
        token("j", "t2", ""),
        done("x", "not-a-token"),
        ev(
            EventType::StepSkipped,
            "j",
            "t1",
            json!({"reason": "join.waiting", "join": true}),
        ),
        answer("x", "not-a-token", "step.done"),
        answer("j", "t1", "step.skipped"),
    ]);
    assert!(f.steps.is_empty(), "{:?}", f.steps);
    let live: Vec<&str> = f
        .header
        .as_ref()
        .unwrap()
        .live
        .iter()
        .map(|t| t.token_id.as_str())
        .collect();
    assert_eq!(live, ["t2"]);
}

#[test]
fn a_request_refused_before_it_started_is_its_terminal_event_alone() {
    let f = fold(&[ev(
        EventType::ExecutionFailed,
        "",
        "",
        json!({"status": "failed", "error": "invalid playbook", "source": "bad.yaml"}),
    )]);
    let h = f.header.unwrap();
    assert_eq!(h.status, ExecStatus::Failed);
    assert_eq!(h.source, "bad.yaml");
    assert!(h.terminal_emitted && h.playbook.is_empty());
}

#[test]
fn a_payload_that_does_not_decode_is_an_error_naming_the_event() {
    let bad = ev(EventType::TokenCreated, "a", "", json!({"token_id": 7}));
    let e = Folded::of([(1, &started()), (2, &bad)]).unwrap_err();
    assert!(
        e.to_string().contains("token.created of execution e1"),
        "{e}"
    );
}

#[test]
fn a_handled_task_error_of_the_boundary_event_is_in_the_step_record_and_a_later_run_clears_it() {
    let handled = crate::handled::HandledError::new(
        "calc",
        "python.exception",
        "NameError: name 'totl' is not defined",
        "continue",
    );
    let done_handling = |srid: &str| {
        ev(
            EventType::StepDone,
            "compute",
            srid,
            payloads::to_value(&StepEnded {
                handled: vec![handled.clone()],
                ..StepEnded::done(json!(null), json!({}))
            }),
        )
    };
    let f = fold(&[
        started(),
        token("compute", "t1", ""),
        task_done(
            "t1",
            "tr1",
            json!({"status": "error", "action": "continue",
                   "error": {"kind": "python.exception", "message": "NameError: name 'totl' is not defined"}}),
        ),
        done_handling("t1"),
        answer("compute", "t1", "step.done"),
    ]);
    let rec = &f.steps["compute"];
    assert_eq!(rec.status, StepStatus::Done, "the step went on: done");
    assert_eq!(rec.handled, vec![handled.clone()]);
    // What the router writes for the same event is the same record.
    let boundary = done_handling("t1");
    let view: BoundaryView = payloads::decode(&boundary).unwrap();
    assert_eq!(
        &step_record(
            &boundary,
            Some(EventType::StepDone),
            &view,
            StepStatus::Done
        ),
        rec
    );
    // The next run of the step, without handled errors, clears them.
    let f = fold(&[
        started(),
        token("compute", "t1", ""),
        done_handling("t1"),
        token("compute", "t2", "t1"),
        answer("compute", "t1", "step.done"),
        done("compute", "t2"),
        answer("compute", "t2", "step.done"),
    ]);
    assert!(f.steps["compute"].handled.is_empty(), "{:?}", f.steps);
}

#[test]
fn a_boundary_ends_its_token_once_the_router_answered_it() {
    // Two boundaries: the first answered (`next.selected`), the second not
    // yet, as when a router replica writes the header back while another
    // handles the second: its token stays live, so it is still routed.
    let mut events = vec![
        started(),
        token("a", "t1", ""),
        done("a", "t1"),
        token("b", "t2", "t1"),
        answer("a", "t1", "step.done"),
        done("b", "t2"),
    ];
    let f = fold(&events);
    let live: Vec<&str> = f
        .header
        .as_ref()
        .unwrap()
        .live
        .iter()
        .map(|t| t.token_id.as_str())
        .collect();
    assert_eq!(live, ["t2"]);
    assert_eq!(f.steps.keys().collect::<Vec<_>>(), ["a"]);
    // A step-run timed out (`step.failed`) and then done: the answer names
    // the boundary the router took.
    events.push(ev(
        EventType::StepFailed,
        "b",
        "t2",
        payloads::to_value(&StepEnded::failed(json!("timed out"), json!({}))),
    ));
    events.push(answer("b", "t2", "step.failed"));
    let f = fold(&events);
    assert!(f.header.as_ref().unwrap().live.is_empty());
    assert_eq!(f.steps["b"].status, StepStatus::Failed);
}

#[test]
fn a_queued_execution_keeps_its_entry_token_live_until_its_entry_goes_out() {
    let queued = ev(
        EventType::ExecutionQueued,
        "",
        "",
        json!({"key": "k", "limit": 1, "holders": ["e0"], "position": 1,
               "on_limit": "queue", "entry_step": "start"}),
    );
    let entry = crate::token::entry_token_id("e1");
    let f = fold(&[started(), queued.clone()]);
    let h = f.header.as_ref().unwrap();
    assert_eq!(h.status, ExecStatus::Running);
    assert_eq!(h.live, [TokenRecord::new(entry.clone(), "start")]);
    // Promoted: its token.created keeps the one token; asked again (a
    // redelivered request) it is not doubled.
    let f = fold(&[
        started(),
        queued.clone(),
        token("start", &entry, ""),
        queued,
    ]);
    assert_eq!(f.header.unwrap().live, [TokenRecord::new(entry, "start")]);
    // Written by an older version (no entry step): nothing is made up.
    let old = ev(
        EventType::ExecutionQueued,
        "",
        "",
        json!({"key": "k", "limit": 1, "holders": [], "position": 1, "on_limit": "queue"}),
    );
    assert!(fold(&[started(), old]).header.unwrap().live.is_empty());
}

/// A `next.selected` that names the tokens its arcs fired folds as the
/// older log did with a `token.created` per token before it.
#[test]
fn the_tokens_an_answer_names_are_live_as_a_token_created_made_them() {
    // Step a's run t1 ended; then the router's events.
    let after_a = |routed: Vec<Event>| {
        let mut log = vec![started(), token("a", "t1", ""), done("a", "t1")];
        log.extend(routed);
        fold(&log)
    };
    let selected = |arcs: Value| {
        ev(
            EventType::NextSelected,
            "a",
            "t1",
            json!({"on": "step.done", "mode": "exclusive", "arcs": arcs}),
        )
    };
    let older = after_a(vec![
        ev(
            EventType::TokenCreated,
            "b",
            "t1",
            json!({"token_id": "t2", "step": "b", "arc": 0, "args": {"k": 1}}),
        ),
        answer("a", "t1", "step.done"),
    ]);
    let newer = after_a(vec![selected(
        json!([{"arc": 0, "step": "b", "token_id": "t2", "args": {"k": 1}}]),
    )]);
    for f in [&older, &newer] {
        let h = f.header.as_ref().unwrap();
        assert_eq!(h.live.len(), 1, "{:?}", h.live);
        let t = &h.live[0];
        assert_eq!((t.token_id.as_str(), t.step.as_str()), ("t2", "b"));
        assert_eq!((t.parent.as_str(), t.arc), ("t1", 0));
        assert_eq!(t.args, json!({"k": 1}));
        assert_eq!(f.steps["a"].status, StepStatus::Done);
    }
    assert_eq!(
        older.header.as_ref().unwrap().live,
        newer.header.as_ref().unwrap().live
    );
    // An arc without a token (a log from before) creates none.
    let bare = after_a(vec![selected(json!([{"arc": 0, "step": "b"}]))]);
    assert!(bare.header.unwrap().live.is_empty());
}

#[test]
fn an_execution_ended_when_its_last_end_or_resume_is_an_end() {
    let of = |kinds: &[EventType]| -> Vec<Event> {
        kinds.iter().map(|k| ev(*k, "", "", json!({}))).collect()
    };
    use EventType as T;
    assert!(!ended(&of(&[])), "no events");
    assert!(!ended(&of(&[T::PlaybookInitialized, T::StepDone])), "runs");
    assert!(ended(&of(&[T::PlaybookInitialized, T::ExecutionCompleted])));
    assert!(
        ended(&of(&[T::ExecutionFailed])),
        "refused before it started"
    );
    let resumed = [
        T::PlaybookInitialized,
        T::ExecutionFailed,
        T::ExecutionResumed,
    ];
    assert!(!ended(&of(&resumed)), "resumed: runs again");
    let cancelled = [
        T::ExecutionFailed,
        T::ExecutionResumed,
        T::ExecutionCancelled,
    ];
    assert!(ended(&of(&cancelled)), "ended again");
    let asked = [T::ExecutionCancelled, T::ExecutionCancelRequested];
    assert!(
        ended(&of(&asked)),
        "a later request ends nothing and resumes nothing"
    );
}
