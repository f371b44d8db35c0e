use noetl_core::OutcomeStatus;
use noetl_mesh::events::EventDraft;
use noetl_mesh::payloads::RetryAt;
use noetl_mesh::plan::PlanRecord;
use serde_json::{json, Map};

use super::*;

/// A loop step paging as docs/dsl.md shows it: `init` sets `iter.page`,
/// `fetch` calls the API, `paginate` jumps back with the next page while
/// `_prev` says there are more; `total` is a `sum` reducer.
fn plan() -> PlanRecord {
    PlanRecord::new(
        "e1".into(),
        "t.yaml".into(),
        serde_json::from_value(json!({
            "apiVersion": "noetl.io/v2", "kind": "Playbook",
            "metadata": {"name": "t"},
            "workflow": [{
                "step": "s",
                "loop": {"in": [1, 2], "iterator": "item",
                         "spec": {"policy": {"reducers": {"total": "sum"}}}},
                "tool": [
                    {"name": "init", "kind": "noop", "spec": {"policy": {"rules": [
                        {"else": true, "then": {"set_iter": {"page": 1}}}]}}},
                    {"name": "fetch", "kind": "http", "url": "http://x/{{ iter.page }}",
                     "spec": {"policy": {"rules": [
                        {"when": "{{ outcome.status == 'error' }}",
                         "then": {"do": "retry", "attempts": 3}},
                        {"else": true, "then": {"set_ctx": {"total": 1}}}]}}},
                    {"name": "paginate", "kind": "noop", "spec": {"policy": {"rules": [
                        {"when": "{{ _prev }}", "then": {"do": "jump", "to": "fetch",
                          "set_iter": {"page": "{{ iter.page + 1 }}"}}},
                        {"else": true, "then": {"do": "break"}}]}}},
                ],
            }],
        }))
        .unwrap(),
        json!({}),
    )
}

fn needs() -> (Step, StepNeeds) {
    let plan = plan();
    let step = plan.step("s").unwrap().clone();
    let needs = StepNeeds::of(&plan, &step);
    (step, needs)
}

fn start() -> Cursor {
    Cursor {
        pc: 0,
        attempt: 1,
        prev: Value::Null,
        iter: Map::new(),
        ctx: Value::Null,
        steps_taken: 0,
        reduce: Map::new(),
        resume: None,
        results: Map::new(),
        handled: Vec::new(),
    }
}

fn done(action: &str, result: Value) -> TaskDone {
    TaskDone {
        duration_ms: 1,
        ..TaskDone::ok(result, action)
    }
}

/// Builds the events the live pipeline wrote: each `task.done` under the
/// task run id of the cursor it ran at, the cursor moved as it moved.
struct Live {
    srid: String,
    index: String,
    cur: Cursor,
    log: Vec<Event>,
}

impl Live {
    fn new(srid: &str, index: &str) -> Self {
        Self {
            srid: srid.into(),
            index: index.into(),
            cur: start(),
            log: Vec::new(),
        }
    }

    /// Task `name` ran at the cursor and reported `td`; the cursor goes to
    /// `pc` (attempt `attempt`).
    fn ran(&mut self, name: &str, td: &TaskDone, pc: usize, attempt: u32) -> &mut Self {
        let id = task_run_id(&self.srid, &self.index, &self.cur);
        // The iteration, as the live pipeline records it.
        let td = &TaskDone {
            index: self.index.parse().ok(),
            ..td.clone()
        };
        self.log.push(
            EventDraft {
                execution_id: "e1",
                step_run_id: &self.srid,
                task_run_id: &id,
                step: "s",
                task: name,
                ..Default::default()
            }
            .build(td),
        );
        self.cur.steps_taken += 1;
        self.cur.pc = pc;
        self.cur.attempt = attempt;
        self
    }
}

fn set_iter(page: u64) -> Option<Map<String, Value>> {
    json!({ "page": page }).as_object().cloned()
}

fn init() -> TaskDone {
    TaskDone {
        set_iter: set_iter(1),
        rule: Some(0),
        ..done("continue", Value::Null)
    }
}

fn fetched(page: u64) -> TaskDone {
    TaskDone {
        rule: Some(1),
        set_ctx: json!({ "total": 1 }).as_object().cloned(),
        reduced: vec!["total".into()],
        ..done("continue", json!({ "page": page, "more": true }))
    }
}

fn jumped(next_page: u64) -> TaskDone {
    TaskDone {
        rule: Some(0),
        set_iter: set_iter(next_page),
        ..done("jump", json!(true))
    }
}

/// `init`, then pages 1 and 2 each fetched and paginated (jumping back).
fn two_pages(srid: &str, index: &str) -> Live {
    let mut live = Live::new(srid, index);
    live.ran("init", &init(), 1, 1)
        .ran("fetch", &fetched(1), 2, 1)
        .ran("paginate", &jumped(2), 1, 1)
        .ran("fetch", &fetched(2), 2, 1)
        .ran("paginate", &jumped(3), 1, 1);
    live
}

fn folded(log: &[Event], index: &str) -> Result<Option<Cursor>, NotFolded> {
    let (step, needs) = needs();
    fold(
        FoldInput {
            step: &step,
            needs: &needs,
            srid: "sr1",
            index,
            log,
        },
        start(),
    )
}

#[test]
fn the_checkpoint_is_where_the_last_task_that_wrote_iter_left_the_cursor() {
    let live = two_pages("sr1", "0");
    let ck = folded(&live.log, "0").unwrap().expect("a checkpoint");
    assert_eq!((ck.pc, ck.attempt, ck.steps_taken), (1, 1, 5));
    assert_eq!(Value::Object(ck.iter), json!({ "page": 3 }));
    assert_eq!(ck.prev, json!(true), "_prev: paginate's result");
    assert_eq!(ck.reduce["total"], json!(2), "both pages' contributions");
}

#[test]
fn a_task_after_the_last_iter_write_is_not_in_the_checkpoint() {
    let mut live = two_pages("sr1", "0");
    live.ran("fetch", &fetched(3), 2, 1);
    let ck = folded(&live.log, "0").unwrap().unwrap();
    assert_eq!(
        ck.steps_taken, 5,
        "the live pipeline wrote none after page 3's fetch"
    );
    assert_eq!(ck.reduce["total"], json!(2));
}

#[test]
fn events_of_other_iterations_and_step_runs_are_not_this_ones() {
    let mut log = two_pages("sr1", "1").log;
    log.extend(two_pages("sr2", "0").log);
    let mut mine = Live::new("sr1", "0");
    mine.ran("init", &init(), 1, 1);
    log.extend(mine.log);
    let ck = folded(&log, "0").unwrap().unwrap();
    assert_eq!(ck.steps_taken, 1, "only init ran in iteration 0 of sr1");
    assert_eq!(Value::Object(ck.iter), json!({ "page": 1 }));
}

#[test]
fn no_iter_write_after_the_command_gives_no_checkpoint() {
    assert_eq!(folded(&[], "0").unwrap().map(|c| c.steps_taken), None);
    let (step, needs) = needs();
    let live = two_pages("sr1", "0");
    // A command already past every event: nothing ahead of it.
    let mut past = start();
    past.pc = 1;
    past.steps_taken = 5;
    let out = fold(
        FoldInput {
            step: &step,
            needs: &needs,
            srid: "sr1",
            index: "0",
            log: &live.log,
        },
        past,
    );
    assert!(matches!(out, Ok(None)));
}

/// A failed `fetch` its policy retries after `delay_ms` (0: at once).
fn retried(delay_ms: u64) -> TaskDone {
    TaskDone {
        status: OutcomeStatus::Error,
        rule: Some(0),
        retry: Some(RetryAt {
            delay_ms,
            next_attempt: 2,
        }),
        ..done("retry", Value::Null)
    }
}

#[test]
fn a_retry_at_once_is_followed_at_its_next_attempt() {
    let mut live = Live::new("sr1", "0");
    let failed = retried(0);
    live.ran("init", &init(), 1, 1)
        .ran("fetch", &failed, 1, 2)
        .ran("fetch", &fetched(1), 2, 1)
        .ran("paginate", &jumped(2), 1, 1);
    let ck = folded(&live.log, "0").unwrap().unwrap();
    assert_eq!((ck.pc, ck.steps_taken), (1, 4));
    assert_eq!(Value::Object(ck.iter), json!({ "page": 2 }));
}

#[test]
fn a_delayed_retry_continues_in_the_command_it_handed_off() {
    let mut live = Live::new("sr1", "0");
    let failed = retried(500);
    live.ran("init", &init(), 1, 1)
        .ran("fetch", &failed, 1, 2)
        .ran("fetch", &fetched(1), 2, 1)
        .ran("paginate", &jumped(2), 1, 1);
    let ck = folded(&live.log, "0").unwrap().unwrap();
    assert_eq!((ck.pc, ck.steps_taken), (1, 4));
}

#[test]
fn a_result_the_log_has_only_as_a_preview_is_refused_by_name() {
    let mut live = Live::new("sr1", "0");
    let big = noetl_core::limits::compact(&json!("x".repeat(10_000)), 4096);
    let jumped_big = TaskDone {
        result: big,
        ..jumped(2)
    };
    live.ran("init", &init(), 1, 1)
        .ran("fetch", &fetched(1), 2, 1)
        .ran("paginate", &jumped_big, 1, 1);
    match folded(&live.log, "0") {
        Err(NotFolded::Preview { task, size }) => {
            assert_eq!(task, "paginate");
            assert!(size > 10_000);
        }
        other => panic!("expected a preview refusal, got {other:?}"),
    }
    // A later checkpoint whose values are whole stands.
    live.ran("fetch", &fetched(2), 2, 1)
        .ran("paginate", &jumped(3), 1, 1);
    assert_eq!(folded(&live.log, "0").unwrap().unwrap().steps_taken, 5);
}

#[test]
fn an_execution_resumed_after_the_step_run_started_is_refused() {
    let mut log = two_pages("sr1", "0").log;
    log.insert(
        2,
        Event {
            event_type: EventType::ExecutionResumed.wire_name().into(),
            execution_id: "e1".into(),
            ..Default::default()
        },
    );
    assert_eq!(folded(&log, "0").unwrap_err(), NotFolded::Resumed);
}

#[test]
fn copies_of_a_task_run_that_decided_alike_are_one_and_the_last_stands() {
    let mut live = two_pages("sr1", "0");
    // A later copy of the last `paginate` (outside the deduplication
    // window): same decision, another result.
    let mut copy = live.log[4].clone();
    copy.payload_json = noetl_wire::codec::json_bytes(&payloads::to_value(&TaskDone {
        result: json!("again"),
        ..jumped(3)
    }));
    live.log.push(copy);
    let ck = folded(&live.log, "0").unwrap().unwrap();
    assert_eq!((ck.steps_taken, ck.prev.clone()), (5, json!("again")));
    let mut other = live.log[2].clone();
    other.payload_json = noetl_wire::codec::json_bytes(&payloads::to_value(&TaskDone {
        rule: Some(1),
        ..done("break", json!(false))
    }));
    live.log.push(other);
    assert!(matches!(
        folded(&live.log, "0"),
        Err(NotFolded::Ambiguous(_))
    ));
}

#[test]
fn a_task_done_of_another_task_than_the_pipeline_has_there_is_a_mismatch() {
    let mut live = Live::new("sr1", "0");
    live.ran("fetch", &init(), 1, 1);
    assert!(matches!(
        folded(&live.log, "0"),
        Err(NotFolded::Mismatch(_))
    ));
}

/// What [`Wanted`] keeps of `log` for iterations `indices` of `sr1`.
fn wanted(log: &[Event], indices: &[u64]) -> Vec<Event> {
    let indices = indices.iter().copied().collect();
    let mut wanted = Wanted::new("sr1", &indices);
    log.iter().filter(|e| wanted.keeps(e)).cloned().collect()
}

/// Iterations 0 and 1 of `sr1` and iteration 0 of `sr2`, interleaved.
fn three_iterations() -> Vec<Event> {
    let (a, b, c) = (
        two_pages("sr1", "0").log,
        two_pages("sr1", "1").log,
        two_pages("sr2", "0").log,
    );
    let mut log = Vec::new();
    for i in 0..a.len() {
        log.extend([b[i].clone(), c[i].clone(), a[i].clone()]);
    }
    log
}

#[test]
fn what_is_kept_of_the_log_for_some_iterations_folds_as_the_whole_log() {
    let log = three_iterations();
    let kept = wanted(&log, &[0]);
    // The step-run's first event (iteration 1's), then iteration 0's.
    assert_eq!(kept.len(), 1 + 5, "{:?}", types(&kept));
    for index in ["0", "1"] {
        let of = |log: &[Event]| folded(log, index).map(|c| c.map(|c| (c.steps_taken, c.iter)));
        let whole = of(&log);
        assert_eq!(of(&wanted(&log, &[0, 1])), whole, "iteration {index}");
    }
    let whole = folded(&log, "0").unwrap().unwrap();
    let from_kept = folded(&kept, "0").unwrap().unwrap();
    assert_eq!(
        (from_kept.steps_taken, from_kept.iter, from_kept.reduce),
        (whole.steps_taken, whole.iter, whole.reduce)
    );
}

#[test]
fn a_resume_after_the_step_run_started_and_task_dones_naming_no_iteration_are_kept() {
    let resumed = |step_run_id: &str| Event {
        event_type: EventType::ExecutionResumed.wire_name().into(),
        execution_id: "e1".into(),
        step_run_id: step_run_id.into(),
        ..Default::default()
    };
    // Before the step-run's first event: not this run's concern.
    let mut log = vec![resumed("")];
    log.extend(three_iterations());
    log.push(resumed(""));
    let kept = wanted(&log, &[0]);
    assert_eq!(
        types(&kept)
            .iter()
            .filter(|t| **t == "execution.resumed")
            .count(),
        1,
        "{:?}",
        types(&kept)
    );
    assert_eq!(folded(&kept, "0").unwrap_err(), NotFolded::Resumed);
    // A `task.done` written before it recorded its iteration.
    let mut older = two_pages("sr1", "7").log;
    for e in &mut older {
        let mut td: TaskDone = payloads::decode(e).unwrap();
        td.index = None;
        e.payload_json = serde_json::to_vec(&td).unwrap();
    }
    assert_eq!(wanted(&older, &[0]).len(), older.len());
}

fn types(log: &[Event]) -> Vec<&str> {
    log.iter().map(|e| e.event_type.as_str()).collect()
}
