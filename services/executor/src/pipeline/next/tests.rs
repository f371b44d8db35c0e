use std::time::Duration;

use super::*;
use serde_json::json;

const NOW: u64 = 1_000_000;

/// Step `s`: `fetch` (python), `check` (python), `store` (postgres).
fn step() -> Step {
    serde_json::from_value(json!({
        "step": "s",
        "tool": [
            {"name": "fetch", "kind": "python"},
            {"name": "check", "kind": "python"},
            {"name": "store", "kind": "postgres"},
        ],
    }))
    .unwrap()
}

fn python_only(kind: &str) -> bool {
    kind == "python"
}

fn at(pc: usize, attempt: u32) -> At {
    At { pc, attempt }
}

/// What follows `decision` on task `pc` (attempt 1), its outcome `outcome`.
fn after(step: &Step, pc: usize, outcome: Outcome, decision: Decision) -> Next {
    decide(input(step, at(pc, 1), Some(ran(outcome, decision)), None))
}

fn ran(outcome: Outcome, decision: Decision) -> Ran {
    Ran {
        outcome,
        decision,
        policy_error: None,
    }
}

fn input<'a>(
    step: &'a Step,
    at: At,
    ran: Option<Ran>,
    deadline: Option<&'a Deadline>,
) -> NextInput<'a> {
    NextInput {
        step,
        tasks: &step.tool,
        task_errors: &[],
        serves: &python_only,
        at,
        steps_taken: 1,
        ran,
        deadline,
        now_ms: NOW,
        stopped: false,
    }
}

fn failed_kind(next: &Next) -> String {
    match &next.then {
        Then::End(End::Failed(e)) => e["kind"].as_str().unwrap_or("").to_string(),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn continue_runs_the_next_task_here_with_the_result_as_prev() {
    let next = after(&step(), 0, Outcome::ok(json!(1)), Decision::Continue);
    assert_eq!(
        next.moved,
        Some(Moved {
            at: at(1, 1),
            prev: Some(json!(1)),
        })
    );
    assert_eq!(next.then, Then::Run);
}

#[test]
fn a_task_of_another_kind_continues_in_a_command_of_that_kind() {
    let next = after(&step(), 1, Outcome::ok(json!(2)), Decision::Continue);
    assert_eq!(next.moved.as_ref().map(|m| m.at), Some(at(2, 1)));
    assert_eq!(
        next.then,
        Then::Command(Handoff {
            kind: "postgres".into(),
            task: "store".into(),
            at: at(2, 1),
            not_before_ms: 0,
            retry: false,
        })
    );
}

#[test]
fn the_last_task_ends_the_step_with_its_result() {
    let s = step();
    let mut i = input(
        &s,
        at(2, 1),
        Some(ran(Outcome::ok(json!("last")), Decision::Continue)),
        None,
    );
    i.serves = &|_| true;
    let next = decide(i);
    assert_eq!(
        next.moved,
        Some(Moved {
            at: at(3, 1),
            prev: Some(json!("last")),
        })
    );
    // Done, its result the `_prev` the cursor now holds.
    assert_eq!(next.then, Then::Finished);
}

#[test]
fn a_retry_with_backoff_is_a_command_due_after_the_delay() {
    let retry = Decision::Retry {
        delay: Duration::from_millis(500),
        next_attempt: 2,
    };
    let next = after(&step(), 0, Outcome::error("http", "503", true), retry);
    // The cursor stays: the retry runs in its own command, later.
    assert_eq!(next.moved, None);
    assert_eq!(
        next.then,
        Then::Command(Handoff {
            kind: "python".into(),
            task: "fetch".into(),
            at: at(0, 2),
            not_before_ms: NOW + 500,
            retry: true,
        })
    );
}

#[test]
fn a_retry_without_delay_runs_again_here_keeping_prev() {
    let retry = Decision::Retry {
        delay: Duration::ZERO,
        next_attempt: 3,
    };
    let next = after(&step(), 1, Outcome::error("x", "y", true), retry);
    assert_eq!(
        next.moved,
        Some(Moved {
            at: at(1, 3),
            prev: None,
        })
    );
    assert_eq!(next.then, Then::Run);
}

#[test]
fn a_retry_that_would_start_after_the_deadline_fails_the_step_now() {
    let s = step();
    let d = Deadline {
        at_ms: NOW + 100,
        what: "lifecycle.timeout_s: 1".into(),
    };
    let retry = Decision::Retry {
        delay: Duration::from_millis(500),
        next_attempt: 2,
    };
    let outcome = Outcome::error("http", "503", true);
    let next = decide(input(&s, at(0, 1), Some(ran(outcome, retry)), Some(&d)));
    assert_eq!(failed_kind(&next), lifecycle::TIMEOUT);
    let Then::End(End::Failed(e)) = &next.then else {
        unreachable!()
    };
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("a retry in 500 ms"), "{message}");
    assert!(message.contains("last error: http: 503"), "{message}");
    assert_eq!(e["task"], "fetch");
}

#[test]
fn a_jump_moves_the_cursor_to_the_named_task() {
    let jump = Decision::Jump { to: "fetch".into() };
    let next = after(&step(), 1, Outcome::ok(json!({"page": 2})), jump);
    assert_eq!(
        next.moved,
        Some(Moved {
            at: at(0, 1),
            prev: Some(json!({"page": 2})),
        })
    );
    assert_eq!(next.then, Then::Run);
}

#[test]
fn a_jump_to_no_task_of_the_step_fails_it() {
    let jump = Decision::Jump {
        to: "nowhere".into(),
    };
    let next = after(&step(), 0, Outcome::ok(json!(1)), jump);
    assert_eq!(next.moved, None);
    assert_eq!(failed_kind(&next), "policy");
}

#[test]
fn break_ends_the_step_done_with_the_task_s_result() {
    let next = after(&step(), 0, Outcome::ok(json!([1, 2])), Decision::Break);
    assert_eq!(next.moved, None);
    assert_eq!(next.then, Then::End(End::Done(json!([1, 2]))));
}

#[test]
fn fail_ends_the_step_failed_with_the_reason_and_last_error() {
    let fail = Decision::Fail {
        reason: "gave up".into(),
    };
    let next = after(&step(), 0, Outcome::error("http", "503", false), fail);
    assert_eq!(failed_kind(&next), "http");
    let Then::End(End::Failed(e)) = &next.then else {
        unreachable!()
    };
    assert_eq!(e["message"], "gave up; last error: http: 503");
    assert_eq!(e["task"], "fetch");
}

#[test]
fn a_passed_deadline_fails_the_step_before_its_next_task() {
    let s = step();
    let d = Deadline {
        at_ms: NOW,
        what: "lifecycle.timeout_s: 2".into(),
    };
    // At the start of a command that waited in a queue...
    let next = decide(input(&s, at(0, 1), None, Some(&d)));
    assert_eq!(next.moved, None);
    assert_eq!(failed_kind(&next), lifecycle::TIMEOUT);
    // ...and after a task that used the time up.
    let next = decide(input(
        &s,
        at(0, 1),
        Some(ran(Outcome::ok(json!(1)), Decision::Continue)),
        Some(&d),
    ));
    assert_eq!(next.moved.as_ref().map(|m| m.at), Some(at(1, 1)));
    assert_eq!(failed_kind(&next), lifecycle::TIMEOUT);
    // A deadline still ahead lets the task run.
    let later = Deadline {
        at_ms: NOW + 1,
        ..d
    };
    assert_eq!(
        decide(input(&s, at(0, 1), None, Some(&later))).then,
        Then::Run
    );
}

#[test]
fn a_stopped_execution_runs_nothing_more_and_reports_nothing() {
    let s = step();
    let mut i = input(&s, at(0, 1), None, None);
    i.stopped = true;
    assert_eq!(decide(i).then, Then::Stop);
}

#[test]
fn a_broken_workbook_call_or_a_jump_loop_fails_the_step() {
    let s = step();
    let errors = [None, Some("no workbook task `x`".to_string())];
    let mut i = input(&s, at(1, 1), None, None);
    i.task_errors = &errors;
    assert_eq!(failed_kind(&decide(i)), "workbook");
    let mut i = input(&s, at(0, 1), None, None);
    i.steps_taken = MAX_TASK_RUNS;
    assert_eq!(failed_kind(&decide(i)), "pipeline.limit");
}
