use super::explain::*;
use super::gates::GateWait;
use super::reason::{Reason, Wait};
use super::words::*;
use super::*;
use noetl_mesh::event_type::EventType;
use noetl_mesh::pause::PauseRecord;
use noetl_mesh::served::ConsumerCounts;
use noetl_mesh::served::QueueCounts;
use noetl_mesh::signal::Waiter;
use noetl_mesh::state::ExecHeader;
use noetl_mesh::state::TokenRecord;
use serde_json::json;
use serde_json::Value;
use std::time::Duration;

const PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: why}
workflow:
  - step: start
    tool:
      - {name: fetch, kind: http, url: "http://x"}
      - {name: store, kind: postgres, connection: "postgresql://u@db/app", command: "select 1"}
    next: {arcs: [{step: merge}]}
  - step: side
    tool: [{name: n, kind: noop}]
    next: {arcs: [{step: merge}]}
  - step: merge
    spec: {join: all}
    tool: [{name: m, kind: noop}]
"#;

fn ev(kind: &str, step: &str, run: &str, payload: Value) -> Event {
    let task = payload
        .get("task")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Event {
        event_id: noetl_mesh::ids::derive_id(&["e1", kind, run, "", ""]),
        event_type: kind.to_string(),
        execution_id: "e1".into(),
        step: step.into(),
        step_run_id: run.into(),
        task,
        ts_ms: noetl_mesh::events::now_ms(),
        payload_json: serde_json::to_vec(&payload).unwrap(),
        ..Default::default()
    }
}

fn header(live: &[(&str, &str)]) -> ExecHeader {
    ExecHeader::running(
        "e1",
        live.iter().map(|(t, s)| TokenRecord::new(*t, *s)).collect(),
    )
}

fn explain_of(
    live: &[(&str, &str)],
    events: &[Event],
    queues: &BTreeMap<String, Option<QueueCounts>>,
) -> Vec<Wait> {
    explain_with(live, &Tree::from_events("e1", events), events, queues)
}

/// [`explain_of`] with the tree given.
fn explain_with(
    live: &[(&str, &str)],
    tree: &Tree,
    events: &[Event],
    queues: &BTreeMap<String, Option<QueueCounts>>,
) -> Vec<Wait> {
    let pb = noetl_core::load::load_playbook(PLAYBOOK, "why.yaml")
        .expect("the playbook loads")
        .playbook;
    let h = header(live);
    explain(&Situation {
        header: &h,
        tree,
        events,
        playbook: Some(&pb),
        queues,
        paused: None,
        waiters: &[],
        gates: &[],
        now_ms: 0,
    })
}

fn queue(waiting: usize, busy: usize, pending: u64) -> Option<QueueCounts> {
    Some(QueueCounts {
        consumer: ConsumerCounts {
            waiting,
            ack_pending: busy,
            idle_for: Duration::from_secs(42),
        },
        pending,
    })
}

#[test]
fn a_token_not_yet_started_waits_for_the_scheduler() {
    let w = explain_of(&[("t1", "start")], &[], &BTreeMap::new());
    assert_eq!(w[0].reason, Reason::Scheduler);
    assert!(w[0].text.contains("scheduler"), "{}", w[0].text);
}

#[test]
fn a_failed_execution_names_its_error_and_exec_resume() {
    let mut h = header(&[("t2", "total")]);
    h.end(
        ExecStatus::Failed,
        "step total failed: boom",
        "2026-11-28T00:00:00Z",
    );
    let text = ended(&h);
    assert!(text.contains("has ended (failed)"), "{text}");
    assert!(text.contains("error: step total failed: boom"), "{text}");
    assert!(
        text.contains("noetl exec resume e1 (runs again: total)"),
        "{text}"
    );
    let mut done = header(&[]);
    done.end(ExecStatus::Completed, "", "2026-11-28T00:00:00Z");
    assert!(
        !ended(&done).contains("resume"),
        "a completed one has nothing to resume"
    );
}

#[test]
fn a_paused_execution_holds_tokens_not_yet_started_and_says_so() {
    let pb = noetl_core::load::load_playbook(PLAYBOOK, "why.yaml")
        .unwrap()
        .playbook;
    let h = header(&[("t1", "start")]);
    let tree = Tree::from_events("e1", &[]);
    let pause = PauseRecord {
        by: "cli:ann".into(),
        reason: "db maintenance".into(),
        at: "2026-11-26T10:00:00Z".into(),
    };
    let w = explain(&Situation {
        header: &h,
        tree: &tree,
        events: &[],
        playbook: Some(&pb),
        queues: &BTreeMap::new(),
        paused: Some(&pause),
        waiters: &[],
        gates: &[],
        now_ms: 0,
    });
    assert!(matches!(&w[0].reason, Reason::Paused { by, .. } if by == "cli:ann"));
    assert!(w[0].text.contains("held by a pause"), "{}", w[0].text);
    let n = notes(&h, &[], Some(&pause));
    assert!(
        n[0].contains("paused by cli:ann") && n[0].contains("db maintenance"),
        "{n:?}"
    );
}

#[test]
fn a_started_step_waits_for_its_next_task_in_the_kind_queue() {
    let started = ev(EventType::StepStarted.wire_name(), "start", "t1", json!({}));
    let none = explain_of(
        &[("t1", "start")],
        std::slice::from_ref(&started),
        &BTreeMap::new(),
    );
    assert!(
        matches!(&none[0].reason, Reason::Queued { task, tool, queue: None } if task == "fetch" && tool == "http")
    );
    assert!(
        none[0]
            .text
            .contains("no executor of kind http has ever started"),
        "{}",
        none[0].text
    );

    let fetched = ev(
        EventType::TaskDone.wire_name(),
        "start",
        "t1",
        json!({"task": "fetch", "status": "ok", "attempt": 1}),
    );
    let busy: BTreeMap<_, _> = [("postgres".to_string(), queue(0, 4, 7))].into();
    let w = explain_of(&[("t1", "start")], &[started.clone(), fetched], &busy);
    assert!(
        matches!(&w[0].reason, Reason::Queued { task, tool, .. } if task == "store" && tool == "postgres")
    );
    assert!(
        w[0].text
            .contains("busy (4 task(s) in progress), 7 waiting"),
        "{}",
        w[0].text
    );

    let unbound: BTreeMap<_, _> = [("http".to_string(), queue(0, 0, 1))].into();
    let w = explain_of(&[("t1", "start")], &[started], &unbound);
    assert!(
        w[0].text.contains("no executor of kind http is bound now"),
        "{}",
        w[0].text
    );
}

#[test]
fn a_running_task_and_a_loop_say_so() {
    let started = ev(EventType::StepStarted.wire_name(), "start", "t1", json!({}));
    let task = ev(
        EventType::TaskStarted.wire_name(),
        "start",
        "t1",
        json!({"task": "fetch", "attempt": 2}),
    );
    let w = explain_of(&[("t1", "start")], &[started, task], &BTreeMap::new());
    assert!(
        matches!(&w[0].reason, Reason::Running { task, tool, .. } if task == "fetch" && tool == "http"),
        "{:?}",
        w[0]
    );

    let looped = vec![
        ev(EventType::StepStarted.wire_name(), "side", "t2", json!({})),
        ev(
            EventType::LoopStarted.wire_name(),
            "side",
            "t2",
            json!({"total": 10, "max_in_flight": 3, "mode": "parallel"}),
        ),
    ];
    let mut events = looped;
    for i in 0..5u64 {
        events.push(ev(
            EventType::LoopIterationStarted.wire_name(),
            "side",
            "t2",
            json!({"loop_run_id": "lr", "index": i}),
        ));
    }
    events.push(ev(
        EventType::LoopIterationDone.wire_name(),
        "side",
        "t2",
        json!({"loop_run_id": "lr", "index": 0, "status": "ok"}),
    ));
    let w = explain_of(&[("t2", "side")], &events, &BTreeMap::new());
    assert_eq!(
        w[0].reason,
        Reason::Loop {
            total: 10,
            in_flight: 4,
            done: 1,
            failed: 0
        },
        "{}",
        w[0].text
    );
    assert!(w[0].text.contains("4 in flight of 10"), "{}", w[0].text);
}

#[test]
fn a_wait_task_names_its_signal_and_timeout() {
    let pb = noetl_core::load::load_playbook(PLAYBOOK, "why.yaml")
        .unwrap()
        .playbook;
    let h = header(&[("t1", "start")]);
    let events = [
        ev(EventType::StepStarted.wire_name(), "start", "t1", json!({})),
        ev(
            EventType::TaskStarted.wire_name(),
            "start",
            "t1",
            json!({"task": "fetch", "attempt": 1}),
        ),
    ];
    let tree = Tree::from_events("e1", &events);
    let waiter = Waiter {
        signal: "approval".into(),
        step: "start".into(),
        step_run_id: "t1".into(),
        task: "fetch".into(),
        task_run_id: "tr1".into(),
        since: "2026-11-26T10:00:00Z".into(),
        timeout_at_ms: Some(0),
        schema: None,
        command: String::new(),
        delivered: None,
    };
    let w = explain(&Situation {
        header: &h,
        tree: &tree,
        events: &events,
        playbook: Some(&pb),
        queues: &BTreeMap::new(),
        paused: None,
        waiters: std::slice::from_ref(&waiter),
        gates: &[],
        now_ms: 0,
    });
    assert!(matches!(&w[0].reason, Reason::Signal { signal, .. } if signal == "approval"));
    assert!(
        w[0].text.contains("waits for signal `approval`")
            && w[0].text.contains("times out at 1970-01-01"),
        "{}",
        w[0].text
    );
}

#[test]
fn a_delayed_retry_says_when_until_it_is_due() {
    let started = ev(EventType::StepStarted.wire_name(), "start", "t1", json!({}));
    let failed = ev(
        EventType::TaskDone.wire_name(),
        "start",
        "t1",
        json!({"task": "fetch", "status": "error", "attempt": 1, "action": "retry",
                   "retry": {"delay_ms": 60_000, "next_attempt": 2}}),
    );
    let w = explain_of(
        &[("t1", "start")],
        &[started.clone(), failed.clone()],
        &BTreeMap::new(),
    );
    assert!(
        matches!(&w[0].reason, Reason::Retry { task, attempt: 2, .. } if task == "fetch"),
        "{:?}",
        w[0]
    );
    assert!(
        w[0].text.contains("retried (attempt 2) at"),
        "{}",
        w[0].text
    );
}

#[test]
fn a_join_waiting_names_the_arcs_it_misses_until_it_starts() {
    let arrival = ev(
        EventType::StepSkipped.wire_name(),
        "merge",
        "t3",
        json!({"reason": "join.waiting", "arrived": 1, "inputs": 2}),
    );
    let w = explain_of(&[], std::slice::from_ref(&arrival), &BTreeMap::new());
    assert_eq!(
        w[0].reason,
        Reason::Join {
            arrived: 1,
            inputs: 2
        }
    );
    assert!(
        w[0].text.contains("1 more arc(s) (1 of 2 arrived)"),
        "{}",
        w[0].text
    );
    let fired = ev(
        EventType::StepStarted.wire_name(),
        "merge",
        "t4",
        json!({"loop": false}),
    );
    assert!(explain_of(&[], &[arrival, fired], &BTreeMap::new()).is_empty());
}

#[test]
fn a_queued_execution_and_a_task_behind_a_key_or_a_rate_say_so() {
    let pb = noetl_core::load::load_playbook(PLAYBOOK, "why.yaml")
        .expect("the playbook loads")
        .playbook;
    let queued = [GateWait::Execution {
        key: "cust-a".into(),
        limit: 2,
        held_by: vec!["e7".into(), "e8".into()],
        position: 3,
    }];
    let h = header(&[("t1", "start")]);
    let tree = Tree::from_events("e1", &[]);
    let queues = BTreeMap::new();
    let situation = |gates| Situation {
        header: &h,
        tree: &tree,
        events: &[],
        playbook: Some(&pb),
        queues: &queues,
        paused: None,
        waiters: &[],
        gates,
        now_ms: 0,
    };
    let w = explain(&situation(&queued));
    assert!(matches!(
        &w[0].reason,
        Reason::ConcurrencyQueue { position: 3, .. }
    ));
    assert_eq!(
            w[0].text,
            "step `start`: the execution is queued behind concurrency key `cust-a` (limit 2) held by executions e7, e8; position 3"
        );
    let json = serde_json::to_value(&w[0]).unwrap();
    assert_eq!(json["reason"]["kind"], "concurrency_queue");
    assert_eq!(json["reason"]["held_by"], json!(["e7", "e8"]));

    let events = [
        ev("step.scheduled", "start", "t1", json!({})),
        ev("step.started", "start", "t1", json!({})),
    ];
    let tree = Tree::from_events("e1", &events);
    let gates = [GateWait::Task {
        step_run_id: "t1".into(),
        key: "api".into(),
        limit: 1,
        held_by: vec!["e9 (step start)".into()],
    }];
    let mut s = situation(&gates);
    s.tree = &tree;
    s.events = &events;
    let w = explain(&s);
    assert_eq!(
        w[0].text,
        "step `start`: task `fetch` waits: concurrency key `api` (limit 1) held by e9 (step start)"
    );
    let gates = [GateWait::Rate {
        step_run_id: "t1".into(),
        key: "api".into(),
        due_ms: 1_000,
    }];
    s.gates = &gates;
    let w = explain(&s);
    assert!(matches!(&w[0].reason, Reason::Rate { .. }));
    assert_eq!(
        w[0].text,
        "step `start`: task `fetch` waits: rate limit `api` until 1970-01-01T00:00:01.000Z"
    );
}

#[test]
fn what_why_keeps_of_a_log_explains_and_notes_as_the_whole_log() {
    let e = |kind: EventType, step: &str, run: &str, payload: Value| {
        ev(kind.wire_name(), step, run, payload)
    };
    let log = vec![
        e(EventType::StepStarted, "start", "t1", json!({})),
        e(
            EventType::TaskStarted,
            "start",
            "t1",
            json!({"task": "fetch"}),
        ),
        e(
            EventType::TaskDone,
            "start",
            "t1",
            json!({"task": "fetch", "status": "error", "attempt": 1, "action": "retry",
                   "retry": {"delay_ms": 60_000, "next_attempt": 2}}),
        ),
        e(EventType::StepStarted, "side", "t2", json!({})),
        e(EventType::TaskDone, "side", "t2", json!({"task": "n"})),
        e(EventType::StepDone, "side", "t2", json!({})),
        e(
            EventType::StepSkipped,
            "merge",
            "t3",
            json!({"reason": "join.waiting", "arrived": 1, "inputs": 2}),
        ),
        e(
            EventType::ExecutionDeadline,
            "",
            "",
            json!({"at_ms": 86_400_000}),
        ),
        e(EventType::ExecutionCancelRequested, "", "", json!({})),
    ];
    let mut kept = Kept::new("e1");
    for ev in log.clone() {
        kept.apply(ev);
    }
    let (tree, events) = kept.finish();
    assert!(events.len() < log.len(), "{events:?}");
    let h = header(&[("t1", "start")]);
    let waits = explain_with(&[("t1", "start")], &tree, &events, &BTreeMap::new());
    let whole = explain_of(&[("t1", "start")], &log, &BTreeMap::new());
    assert_eq!(waits, whole);
    assert!(
        waits
            .iter()
            .any(|w| matches!(w.reason, Reason::Retry { .. }))
            && waits
                .iter()
                .any(|w| matches!(w.reason, Reason::Join { .. })),
        "{waits:?}"
    );
    assert_eq!(notes(&h, &events, None), notes(&h, &log, None));
    assert_eq!(notes(&h, &events, None).len(), 2);
}
