//! The executor runtime against a real nats-server and a real python3: one
//! playbook step per test, one expectation about events and `ctx`.

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use noetl_mesh::{codec, event_type::EventType, keys::Keys};
use noetl_wire::TaskCommand;
use serde_json::{json, Value};
use support::{command, iteration, noop, payload, python, Harness};

fn tasks_of<'a>(events: &'a [&'a noetl_wire::Event]) -> Vec<&'a str> {
    events.iter().map(|e| e.task.as_str()).collect()
}

#[tokio::test]
async fn pipeline_threads_prev_through_tasks_and_ends_with_step_done() {
    let h = Harness::start().await;
    let eid = "e-prev";
    h.plan(
        eid,
        json!([{
            "step": "transform",
            "tool": [
                {"name": "seed", "kind": "noop", "result": {"n": "{{ workload.start }}"}},
                {"name": "bump", "kind": "python", "code": "result = {'n': _prev['n'] + 1}"},
                {"name": "pass", "kind": "noop"},
            ],
        }]),
        json!({"start": 41}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "transform", "run-1")).await;

    let done = log.until(EventType::StepDone.wire_name()).await;
    assert_eq!(payload(&done)["result"], json!({"n": 42}));
    assert_eq!(payload(&done)["status"], "ok");
    assert_eq!(done.step_run_id, "run-1");
    assert_eq!(done.trace_id, "trace-e-prev");
    let started = log.starts();
    assert_eq!(tasks_of(&started), ["seed", "bump", "pass"]);
    let finished = log.of(EventType::TaskDone.wire_name());
    assert_eq!(tasks_of(&finished), ["seed", "bump", "pass"]);
    let results: Vec<Value> = finished
        .iter()
        .map(|e| payload(e)["result"].clone())
        .collect();
    assert_eq!(
        results,
        [json!({"n": 41}), json!({"n": 42}), json!({"n": 42})]
    );
    for e in &finished {
        let p = payload(e);
        assert_eq!(
            (p["status"].as_str(), p["attempt"].as_u64()),
            (Some("ok"), Some(1))
        );
        assert_eq!(p["action"], "continue");
    }
    // task events pair up by task_run_id; ids are distinct per task run.
    let runs: HashSet<&str> = started.iter().map(|e| e.task_run_id.as_str()).collect();
    assert_eq!(runs.len(), 3);
    assert!(finished
        .iter()
        .all(|e| runs.contains(e.task_run_id.as_str())));
    // No template reads `transform` by name: its result travels in step.done
    // only, without a KV write on the hot path.
    assert_eq!(h.result(eid, "transform").await, None);
    h.stop().await;
}

#[tokio::test]
async fn templates_read_earlier_step_results_by_name() {
    let h = Harness::start().await;
    let eid = "e-results";
    h.plan(
        eid,
        json!([
            {"step": "fetch", "tool": [{"name": "f", "kind": "noop"}]},
            {"step": "later", "tool": [{"name": "l", "kind": "noop"}]},
            {"step": "use", "tool": [{"name": "u", "kind": "noop",
                "result": {"rows": "{{ fetch.rows }}", "later": "{{ later }}"}}]},
        ]),
        json!({}),
    )
    .await;
    noetl_mesh::kv::put(
        h.mesh.exec_kv(),
        &Keys::result(eid, "fetch"),
        &json!({"rows": [1, 2]}),
    )
    .await
    .unwrap();
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "use", "run-1")).await;
    let done = log.until(EventType::StepDone.wire_name()).await;
    // A step that has not run yet is undefined (null), not an error.
    assert_eq!(
        payload(&done)["result"],
        json!({"rows": [1, 2], "later": null})
    );
    h.stop().await;
}

#[tokio::test]
async fn a_quick_attempt_records_its_start_in_its_end_and_a_slow_one_announces_it() {
    let h = Harness::start().await;
    let eid = "e-starts";
    h.plan(
        eid,
        json!([{
            "step": "s",
            "tool": [
                {"name": "quick", "kind": "noop"},
                {"name": "slow", "kind": "python", "code": "import time; time.sleep(0.4); result = 1"},
            ],
        }]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    let sent = noetl_mesh::events::now_ms();
    h.send("noop", &command(eid, "s", "run-1")).await;
    log.until(EventType::StepDone.wire_name()).await;
    // The quick one: no task.started; its task.done says where and when
    // it started.
    let started = log.of(EventType::TaskStarted.wire_name());
    assert_eq!(tasks_of(&started), ["slow"]);
    let done = log.of(EventType::TaskDone.wire_name());
    let quick = payload(done[0]);
    assert_eq!(
        (
            quick["started"]["pc"].as_u64(),
            quick["started"]["kind"].as_str()
        ),
        (Some(0), Some("noop")),
        "{quick}"
    );
    assert!(quick["started"]["at_ms"].as_u64().unwrap() >= sent);
    // The slow one: its task.started, written while it ran, carries the
    // time it started; its task.done does not repeat it.
    assert!(payload(done[1]).get("started").is_none());
    let slow = noetl_mesh::attempt::attempt_started(started[0]).unwrap();
    let ended = noetl_mesh::events::time_ms(done[1]);
    assert!(
        ended - slow.at_ms >= 400,
        "started {} ms before its end",
        ended - slow.at_ms
    );
    // Every attempt's start, either way.
    assert_eq!(tasks_of(&log.starts()), ["quick", "slow"]);
    h.stop().await;
}

#[tokio::test]
async fn a_step_run_s_last_task_done_is_stored_inside_its_end_and_read_back_as_its_own() {
    let h = Harness::start().await;
    let eid = "e-last-task";
    h.plan(
        eid,
        json!([{
            "step": "s",
            "tool": [
                {"name": "a", "kind": "noop", "spec": {"policy": {"rules": [
                    {"else": true, "then": {"do": "continue", "set_ctx": {"from_a": 1}}}]}}},
                {"name": "b", "kind": "noop", "spec": {"policy": {"rules": [
                    {"else": true, "then": {"do": "continue", "set_ctx": {"from_b": 2}}}]}}},
            ],
        }]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "s", "run-1")).await;
    let end = log.until(EventType::StepDone.wire_name()).await;
    // Read as every reader reads the log: both tasks' ends, the last one
    // just before the step's, with the ids it would have had alone.
    let done = log.of(EventType::TaskDone.wire_name());
    assert_eq!(tasks_of(&done), ["a", "b"]);
    let types: Vec<&str> = log.seen.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(&types[types.len() - 2..], ["task.done", "step.done"]);
    assert_eq!(payload(done[1])["set_ctx"], json!({"from_b": 2}));
    assert_eq!(
        (done[1].step_run_id.as_str(), done[1].parent_id.as_str()),
        (end.step_run_id.as_str(), end.parent_id.as_str())
    );
    assert!(payload(&end).get("last_task").is_none());
    // As stored: the first task's end alone, the last one inside the step's.
    let subjects = h.mesh.subjects();
    let alone = h
        .mesh
        .stored_events_from(&subjects.event(eid, "task.done"), None)
        .await
        .unwrap();
    let alone: Vec<String> = alone.into_iter().map(|(_, e)| e.unwrap().task).collect();
    assert_eq!(alone, ["a"]);
    let stream = h
        .mesh
        .js()
        .get_stream(subjects.events_stream())
        .await
        .unwrap();
    let raw = stream
        .get_last_raw_message_by_subject(&subjects.event(eid, "step.done"))
        .await
        .unwrap();
    let stored =
        noetl_mesh::events::decode_message(&raw.subject, Some(&raw.headers), &raw.payload).unwrap();
    let carried = payload(&stored)["last_task"].clone();
    assert_eq!(
        (
            carried["task"].as_str(),
            carried["set_ctx"]["from_b"].as_u64()
        ),
        (Some("b"), Some(2))
    );
    let unfolded: Vec<_> = noetl_mesh::events::unfold(stored).collect();
    assert_eq!(unfolded[0].event_id, done[1].event_id);
    h.stop().await;
}

#[tokio::test]
async fn a_step_without_tasks_is_done_at_once() {
    let h = Harness::start().await;
    let eid = "e-empty";
    h.plan(eid, json!([{"step": "route_only"}]), json!({}))
        .await;
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "route_only", "run-1")).await;
    let done = log.until(EventType::StepDone.wire_name()).await;
    assert_eq!(payload(&done)["result"], Value::Null);
    assert!(log.starts().is_empty());
    h.stop().await;
}

fn flaky(succeed_on: u32, retry: Value) -> Value {
    json!({
        "name": "flaky",
        "kind": "python",
        "args": {"attempt": "{{ _attempt }}"},
        "code": format!(
            "def main(a):\n    if a['attempt'] < {succeed_on}:\n        raise ConnectionError('try again')\n    return a['attempt']\n"
        ),
        "spec": {"policy": {"rules": [
            {"when": "{{ outcome.status == 'error' and outcome.py.exception_type == 'ConnectionError' }}",
             "then": retry},
            {"when": "{{ outcome.status == 'error' }}", "then": {"do": "fail"}},
            {"else": true, "then": {"do": "continue"}},
        ]}},
    })
}

#[tokio::test]
async fn retry_in_place_counts_attempts_until_success() {
    let h = Harness::start().await;
    let eid = "e-retry-ok";
    h.plan(
        eid,
        json!([{"step": "s", "tool": [flaky(3, json!({"do": "retry", "attempts": 5, "delay": 0}))]}]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("python", &command(eid, "s", "run-1")).await;
    let done = log.until(EventType::StepDone.wire_name()).await;
    assert_eq!(payload(&done)["result"], json!(3));
    let attempts: Vec<u64> = log
        .of(EventType::TaskDone.wire_name())
        .iter()
        .map(|e| payload(e)["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2, 3]);
    let actions: Vec<Value> = log
        .of(EventType::TaskDone.wire_name())
        .iter()
        .map(|e| payload(e)["action"].clone())
        .collect();
    assert_eq!(actions, [json!("retry"), json!("retry"), json!("continue")]);
    let first = payload(log.of(EventType::TaskDone.wire_name())[0]);
    assert_eq!(first["error"]["kind"], "python.exception");
    assert_eq!(first["rule"], 0);
    h.stop().await;
}

#[tokio::test]
async fn exhausted_retries_fail_the_step() {
    let h = Harness::start().await;
    let eid = "e-retry-exhausted";
    h.plan(
        eid,
        json!([{"step": "s", "tool": [
            flaky(99, json!({"do": "retry", "attempts": 3, "delay": 0})),
            {"name": "never", "kind": "noop"},
        ]}]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("python", &command(eid, "s", "run-1")).await;
    let failed = log.until(EventType::StepFailed.wire_name()).await;
    let p = payload(&failed);
    assert_eq!(p["status"], "error");
    assert_eq!(p["error"]["kind"], "python.exception");
    assert_eq!(p["error"]["task"], "flaky");
    let message = p["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("retry attempts exhausted (3)"),
        "{message}"
    );
    assert!(message.contains("ConnectionError: try again"), "{message}");
    assert_eq!(log.starts().len(), 3);
    assert!(log.of(EventType::StepDone.wire_name()).is_empty());
    assert!(!tasks_of(&log.starts()).contains(&"never"));
    assert_eq!(h.result(eid, "s").await, None);
    h.stop().await;
}

#[tokio::test]
async fn delayed_retry_waits_in_the_queue_without_holding_a_slot() {
    // One slot only: while the retry waits, another step-run must get it.
    let h = Harness::with_replicas(vec![vec![noop(), python()]], 1).await;
    let eid = "e-delay";
    h.plan(
        eid,
        json!([
            {"step": "slow", "tool": [flaky(2, json!({"do": "retry", "attempts": 2, "delay": 1.5}))]},
            {"step": "quick", "tool": [{"name": "q", "kind": "python", "code": "result = 'quick'"}]},
        ]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("python", &command(eid, "slow", "run-slow")).await;
    let first = log
        .until_where(
            |e| e.event_type == EventType::TaskDone.wire_name() && payload(e)["attempt"] == 1,
            "first attempt",
        )
        .await;
    let failed_at = Instant::now();
    let p = payload(&first);
    assert_eq!(p["action"], "retry");
    assert_eq!(p["retry"], json!({"delay_ms": 1500, "next_attempt": 2}));

    h.send("python", &command(eid, "quick", "run-quick")).await;
    let quick = log
        .until_where(
            |e| e.event_type == EventType::StepDone.wire_name() && e.step == "quick",
            "quick step.done",
        )
        .await;
    assert_eq!(payload(&quick)["result"], "quick");
    assert!(
        failed_at.elapsed() < Duration::from_millis(1200),
        "the waiting retry must not hold the only slot ({:?})",
        failed_at.elapsed()
    );
    let retry = log
        .until_where(
            |e| noetl_mesh::attempt::attempt_started(e).is_some_and(|s| s.attempt == 2),
            "second attempt",
        )
        .await;
    assert!(
        failed_at.elapsed() >= Duration::from_millis(1300),
        "retry ran after {:?}, before its delay",
        failed_at.elapsed()
    );
    let order: Vec<&str> = log.seen.iter().map(|e| e.event_type.as_str()).collect();
    let quick_done = log
        .seen
        .iter()
        .position(|e| e.step == "quick" && e.event_type == EventType::StepDone.wire_name());
    let retry_pos = log.seen.iter().position(|e| e.event_id == retry.event_id);
    assert!(quick_done < retry_pos, "{order:?}");
    let done = log
        .until_where(
            |e| e.event_type == EventType::StepDone.wire_name() && e.step == "slow",
            "slow done",
        )
        .await;
    assert_eq!(payload(&done)["result"], json!(2));
    h.stop().await;
}

#[tokio::test]
async fn jump_and_break_drive_an_iter_pagination_loop() {
    let h = Harness::start().await;
    let eid = "e-paginate";
    h.plan(
        eid,
        json!([{"step": "pages", "tool": [
            {"name": "init", "kind": "noop", "spec": {"policy": {"rules": [
                {"else": true, "then": {"do": "continue", "set_iter": {"page": 1}}}]}}},
            {"name": "fetch", "kind": "python",
             "args": {"page": "{{ iter.page }}"},
             "code": "result = {'page': page, 'items': [page * 10, page * 10 + 1]}"},
            {"name": "paginate", "kind": "noop", "spec": {"policy": {"rules": [
                {"when": "iter.page < 3",
                 "then": {"do": "jump", "to": "fetch", "set_iter": {"page": "{{ iter.page + 1 }}"}}},
                {"else": true, "then": {"do": "break"}}]}}},
            {"name": "after_break", "kind": "noop", "result": "must not run"},
        ]}]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "pages", "run-1")).await;
    let done = log.until(EventType::StepDone.wire_name()).await;
    assert_eq!(
        payload(&done)["result"],
        json!({"page": 3, "items": [30, 31]})
    );
    let fetched: Vec<Value> = log
        .of(EventType::TaskDone.wire_name())
        .iter()
        .filter(|e| e.task == "fetch")
        .map(|e| payload(e)["result"]["page"].clone())
        .collect();
    assert_eq!(fetched, [json!(1), json!(2), json!(3)]);
    let actions: Vec<(String, Value)> = log
        .of(EventType::TaskDone.wire_name())
        .iter()
        .filter(|e| e.task == "paginate")
        .map(|e| (e.task.clone(), payload(e)["action"].clone()))
        .collect();
    assert_eq!(
        actions.iter().map(|a| a.1.clone()).collect::<Vec<_>>(),
        [json!("jump"), json!("jump"), json!("break")]
    );
    assert!(!tasks_of(&log.starts()).contains(&"after_break"));
    // Every task run has its own id, even when a jump revisits a task.
    let ids: HashSet<&str> = log
        .starts()
        .iter()
        .map(|e| e.task_run_id.as_str())
        .collect();
    assert_eq!(ids.len(), log.starts().len());
    h.stop().await;
}

#[tokio::test]
async fn fail_action_and_unhandled_errors_fail_the_step() {
    let h = Harness::start().await;
    let eid = "e-fail";
    h.plan(
        eid,
        json!([
            {"step": "by_policy", "tool": [
                {"name": "check", "kind": "noop", "result": {"valid": false},
                 "spec": {"policy": {"rules": [
                    {"when": "{{ outcome.result.valid }}", "then": {"do": "continue"}},
                    {"else": true, "then": {"do": "fail"}}]}}},
                {"name": "never", "kind": "noop"},
            ]},
            {"step": "by_error", "tool": [
                {"name": "boom", "kind": "python", "code": "raise ValueError('bad input')"},
            ]},
            {"step": "by_template", "tool": [
                {"name": "typo", "kind": "noop", "result": "{{ wrokload.x }}"},
            ]},
        ]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "by_policy", "run-1")).await;
    h.send("python", &command(eid, "by_error", "run-2")).await;
    h.send("noop", &command(eid, "by_template", "run-3")).await;
    let mut errors = Vec::new();
    for step in ["by_policy", "by_error", "by_template"] {
        let failed = log
            .until_where(
                |e| e.event_type == EventType::StepFailed.wire_name() && e.step == step,
                step,
            )
            .await;
        errors.push(payload(&failed)["error"].clone());
    }
    assert_eq!(errors[0]["kind"], "policy.fail");
    assert_eq!(errors[0]["task"], "check");
    assert_eq!(errors[1]["kind"], "python.exception");
    assert_eq!(errors[1]["message"], "ValueError: bad input");
    assert_eq!(errors[2]["kind"], "template");
    let msg = errors[2]["message"].as_str().unwrap();
    assert!(
        msg.contains("wrokload") && msg.contains("typo") && msg.contains("by_template"),
        "{msg}"
    );
    assert!(!tasks_of(&log.starts()).contains(&"never"));
    h.stop().await;
}

#[tokio::test]
async fn set_ctx_is_stored_and_seen_by_later_tasks() {
    let h = Harness::start().await;
    let eid = "e-ctx";
    h.plan(
        eid,
        json!([{"step": "s", "tool": [
            {"name": "mark", "kind": "noop", "result": 7, "spec": {"policy": {"rules": [
                {"else": true, "then": {"do": "continue",
                    "set_ctx": {"store_ok": true, "count": "{{ outcome.result }}", "who": "{{ workload.user }}"}}}]}}},
            {"name": "read_py", "kind": "python", "code": "result = [ctx['who'], ctx['count']]"},
            {"name": "read_tpl", "kind": "noop", "result": "{{ ctx.count + 1 }}"},
        ]}]),
        json!({"user": "ana"}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "s", "run-1")).await;
    let done = log.until(EventType::StepDone.wire_name()).await;
    assert_eq!(payload(&done)["result"], json!(8));
    assert_eq!(
        h.ctx(eid).await,
        json!({"store_ok": true, "count": 7, "who": "ana"})
    );
    let by_task = |t: &str| {
        payload(
            log.of(EventType::TaskDone.wire_name())
                .into_iter()
                .find(|e| e.task == t)
                .unwrap(),
        )
    };
    // The patch is event-sourced in task.done.
    assert_eq!(
        by_task("mark")["set_ctx"],
        json!({"store_ok": true, "count": 7, "who": "ana"})
    );
    assert_eq!(by_task("read_py")["result"], json!(["ana", 7]));
    h.stop().await;
}

#[tokio::test]
async fn loop_iterations_keep_their_own_iter_and_report_it() {
    let h = Harness::start().await;
    let eid = "e-loop";
    h.plan(
        eid,
        json!([{"step": "each", "loop": {"in": "{{ workload.items }}", "iterator": "item"}, "tool": [
            {"name": "tag", "kind": "noop", "spec": {"policy": {"rules": [
                {"else": true, "then": {"do": "continue", "set_iter": {"tag": "{{ iter.item }}-{{ iter.index }}"}}}]}}},
            {"name": "use", "kind": "python",
             "code": "if iter['item'] == 'bad':\n    raise RuntimeError('bad item')\nresult = {'tag': iter['tag'], 'saw_other': 'other' in iter}"},
            {"name": "other", "kind": "noop", "spec": {"policy": {"rules": [
                {"else": true, "then": {"do": "continue", "set_iter": {"other": true}}}]}}},
        ]}]),
        json!({"items": ["a", "b", "bad"]}),
    )
    .await;
    let mut log = h.events(eid).await;
    for (i, item) in ["a", "b", "bad"].iter().enumerate() {
        let it = iteration(
            eid,
            "each",
            "loop-1",
            i as u64,
            json!({"item": item, "index": i}),
        );
        h.send("noop", &it).await;
    }
    for i in 0..2u64 {
        let done = log
            .until_where(
                |e| {
                    e.event_type == EventType::LoopIterationDone.wire_name()
                        && payload(e)["index"] == i
                },
                "iteration done",
            )
            .await;
        let p = payload(&done);
        let item = ["a", "b"][i as usize];
        assert_eq!(p["loop_run_id"], "loop-1");
        assert_eq!(p["status"], "ok");
        assert_eq!(
            p["result"],
            json!({"tag": format!("{item}-{i}"), "saw_other": false})
        );
        assert_eq!(
            p["iter"],
            json!({"item": item, "index": i, "tag": format!("{item}-{i}"), "other": true})
        );
        assert_eq!(done.step_run_id, "loop-1");
    }
    let failed = log.until(EventType::LoopIterationFailed.wire_name()).await;
    let p = payload(&failed);
    assert_eq!(p["index"], 2);
    assert_eq!(p["error"]["kind"], "python.exception");
    assert_eq!(p["error"]["task"], "use");
    assert_eq!(p["iter"]["tag"], "bad-2");
    log.settle(Duration::from_millis(300)).await;
    // Iterations do not emit step boundaries (the loop-supervisor does).
    assert!(
        log.of(EventType::StepDone.wire_name()).is_empty()
            && log.of(EventType::StepFailed.wire_name()).is_empty()
    );
    // The three iterations' task runs are distinct.
    let ids: HashSet<&str> = log
        .starts()
        .iter()
        .map(|e| e.task_run_id.as_str())
        .collect();
    assert_eq!(ids.len(), 8);
    h.stop().await;
}

#[tokio::test]
async fn kinds_hand_off_between_replicas_carrying_prev_and_iter() {
    // Two replicas: one serves noop only, the other python only.
    let h = Harness::with_replicas(vec![vec![noop()], vec![python()]], 4).await;
    let eid = "e-handoff";
    h.plan(
        eid,
        json!([{"step": "mixed", "tool": [
            {"name": "start", "kind": "noop", "result": [1, 2],
             "spec": {"policy": {"rules": [{"else": true, "then": {"set_iter": {"cursor": "c1"}}}]}}},
            {"name": "py", "kind": "python", "code": "result = {'sum': sum(_prev), 'cursor': iter['cursor']}"},
            {"name": "end", "kind": "noop", "result": "{{ _prev.sum }}-{{ iter.cursor }}"},
        ]}]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "mixed", "run-1")).await;
    let done = log.until(EventType::StepDone.wire_name()).await;
    assert_eq!(payload(&done)["result"], "3-c1");
    assert_eq!(
        tasks_of(&log.of(EventType::TaskDone.wire_name())),
        ["start", "py", "end"]
    );
    h.stop().await;
}

#[tokio::test]
async fn a_kind_not_served_here_is_forwarded_to_its_subject() {
    let h = Harness::with_replicas(vec![vec![noop()]], 4).await;
    let eid = "e-forward";
    h.plan(
        eid,
        json!([{"step": "s", "tool": [
            {"name": "first", "kind": "noop", "result": {"rows": 2}},
            {"name": "second", "kind": "python", "code": "result = _prev"},
        ]}]),
        json!({}),
    )
    .await;
    // Read what lands on <p>.task.python (nobody serves it here).
    let stream = h
        .mesh
        .js()
        .get_stream(h.mesh.subjects().work_stream())
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("test-python".into()),
            filter_subject: h.mesh.subjects().task("python"),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut cmd = command(eid, "s", "run-1");
    cmd.args_json = codec::json_bytes(&json!({"from": "arc"}));
    let mut log = h.events(eid).await;
    h.send("noop", &cmd).await;
    log.until_where(
        |e| e.event_type == EventType::TaskDone.wire_name() && e.task == "first",
        "first done",
    )
    .await;
    let mut msgs = consumer.messages().await.unwrap();
    let msg = tokio::time::timeout(support::WAIT, msgs.next())
        .await
        .expect("a forwarded command")
        .unwrap()
        .unwrap();
    let fwd: TaskCommand = codec::decode("task command", &msg.payload).unwrap();
    assert_eq!((fwd.pc, fwd.attempt, fwd.steps_taken), (1, 1, 1));
    assert_eq!(fwd.step_run_id, "run-1");
    assert_eq!(fwd.step, "s");
    assert_eq!(
        codec::json_value(&fwd.prev_json).unwrap(),
        json!({"rows": 2})
    );
    assert_eq!(
        codec::json_value(&fwd.args_json).unwrap(),
        json!({"from": "arc"})
    );
    assert_eq!(fwd.trace_id, cmd.trace_id);
    assert!(fwd.iteration.is_none());
    assert_eq!(fwd.not_before_ms, 0);
    log.settle(Duration::from_millis(300)).await;
    assert!(
        log.of(EventType::StepDone.wire_name()).is_empty(),
        "the step-run goes on elsewhere"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_redelivered_command_emits_no_duplicate_events() {
    let h = Harness::start().await;
    let eid = "e-redeliver";
    h.plan(
        eid,
        json!([{"step": "s", "tool": [
            {"name": "a", "kind": "noop", "result": 1, "spec": {"policy": {"rules": [
                {"else": true, "then": {"set_ctx": {"a": "{{ outcome.result }}"}}}]}}},
            {"name": "b", "kind": "python", "code": "result = _prev + 1"},
        ]}]),
        json!({}),
    )
    .await;
    // Every copy of step.done published, duplicates included.
    let mut live = h
        .mesh
        .client()
        .subscribe(
            h.mesh
                .subjects()
                .event(eid, EventType::StepDone.wire_name()),
        )
        .await
        .unwrap();
    let cmd = command(eid, "s", "run-1");
    h.send_as("noop", &cmd, "copy-1").await;
    let first = tokio::time::timeout(support::WAIT, live.next())
        .await
        .unwrap()
        .unwrap();
    // The same command delivered again (as after a crash before the ack).
    h.send_as("noop", &cmd, "copy-2").await;
    let second = tokio::time::timeout(support::WAIT, live.next())
        .await
        .unwrap()
        .unwrap();
    let ids = |m: &async_nats::Message| noetl_mesh::events::decode(m).unwrap().event_id;
    assert_eq!(
        ids(&first),
        ids(&second),
        "the redelivery re-emits the same ids"
    );

    let mut log = h.events(eid).await;
    log.until(EventType::StepDone.wire_name()).await;
    log.settle(Duration::from_millis(500)).await;
    let distinct: HashSet<&str> = log.seen.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(distinct.len(), log.seen.len(), "{:#?}", log.summary());
    assert_eq!(log.of(EventType::StepDone.wire_name()).len(), 1);
    assert_eq!(log.starts().len(), 2);
    assert_eq!(log.of(EventType::TaskDone.wire_name()).len(), 2);
    assert_eq!(h.ctx(eid).await, json!({"a": 1}));
    h.stop().await;
}

#[tokio::test]
async fn a_jump_loop_without_exit_is_stopped() {
    let h = Harness::start().await;
    let eid = "e-runaway";
    h.plan(
        eid,
        json!([{"step": "spin", "tool": [
            {"name": "again", "kind": "noop", "spec": {"policy": {"rules": [
                {"else": true, "then": {"do": "jump", "to": "again"}}]}}},
        ]}]),
        json!({}),
    )
    .await;
    let mut log = h.events(eid).await;
    // Start close to the bound so the test stays fast.
    let mut cmd = command(eid, "spin", "run-1");
    cmd.steps_taken = noetl_executor::MAX_TASK_RUNS - 5;
    h.send("noop", &cmd).await;
    let failed = log.until(EventType::StepFailed.wire_name()).await;
    let error = &payload(&failed)["error"];
    assert_eq!(error["kind"], "pipeline.limit");
    assert!(
        error["message"].as_str().unwrap().contains("100000"),
        "{error}"
    );
    assert_eq!(log.starts().len(), 5);
    h.stop().await;
}

#[tokio::test]
async fn bad_commands_are_dead_lettered_with_the_reason() {
    let h = Harness::start().await;
    let dlq = h.mesh.subjects().dead_letter("executor-noop");
    let mut dead = h.mesh.client().subscribe(dlq).await.unwrap();
    // Not a TaskCommand at all.
    h.mesh
        .publish(
            h.mesh.subjects().task("noop"),
            "garbage-1",
            vec![0xff, 0xff, 0xff].into(),
        )
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let m = tokio::time::timeout(support::WAIT, dead.next())
        .await
        .unwrap()
        .unwrap();
    let reason = m
        .headers
        .as_ref()
        .unwrap()
        .get(noetl_mesh::runtime::HEADER_REASON)
        .unwrap()
        .to_string();
    assert!(
        reason.contains("task command") && reason.contains("task.noop"),
        "{reason}"
    );

    // A step the plan does not have.
    h.plan("e-dead", json!([{"step": "s", "tool": []}]), json!({}))
        .await;
    h.send("noop", &command("e-dead", "nope", "run-1")).await;
    let m = tokio::time::timeout(support::WAIT, dead.next())
        .await
        .unwrap()
        .unwrap();
    let reason = m
        .headers
        .as_ref()
        .unwrap()
        .get(noetl_mesh::runtime::HEADER_REASON)
        .unwrap()
        .to_string();
    assert!(
        reason.contains("e-dead") && reason.contains("\"nope\""),
        "{reason}"
    );
    h.stop().await;
}

/// A command read before its execution's plan reached this reader (a
/// stream leader that changed right after the write) is retried while it
/// is young, not dead-lettered: it runs once the plan is there.
#[tokio::test]
async fn a_command_that_arrives_before_its_plan_runs_once_the_plan_is_there() {
    let h = Harness::start().await;
    let eid = "e-early";
    let dlq = h.mesh.subjects().dead_letter("executor-noop");
    let mut dead = h.mesh.client().subscribe(dlq).await.unwrap();
    let mut log = h.events(eid).await;
    h.send("noop", &command(eid, "s", "run-1")).await;
    // Delivered and found unknown at least once before the plan is stored.
    tokio::time::sleep(Duration::from_millis(800)).await;
    h.plan(
        eid,
        json!([{"step": "s", "tool": [{"name": "t", "kind": "noop", "result": 7}]}]),
        json!({}),
    )
    .await;
    let done = log.until(EventType::StepDone.wire_name()).await;
    assert_eq!(payload(&done)["result"], json!(7));
    let none = tokio::time::timeout(Duration::from_millis(300), dead.next()).await;
    assert!(
        none.is_err(),
        "dead-lettered: {:?}",
        none.ok().flatten().map(|m| m.headers)
    );
    h.stop().await;
}

/// A copy of an iteration's command that comes after the iteration's end
/// is stored, while its loop run is missing from the loop bucket (purged:
/// here never written), is acked without running: the log says the
/// iteration ended, so its tool calls do not run twice.
#[tokio::test]
async fn a_late_copy_of_an_ended_iteration_whose_loop_run_is_lost_does_not_run_again() {
    // One task at a time, and a copy that waited past 100 ms in the queue
    // is read as one that may be stale.
    let h = Harness::configured(vec![vec![noop(), python()]], 1, |c| {
        c.executor_wait = Duration::from_millis(100)
    })
    .await;
    let eid = "e-late-copy";
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    h.plan(
        eid,
        json!([{"step": "each", "loop": {"in": "{{ workload.items }}", "iterator": "item"}, "tool": [
            {"name": "work", "kind": "python", "args": {"path": runs.to_str().unwrap()},
             "code": "import time\nopen(path, 'a').write('x')\ntime.sleep(0.5)\nresult = 1"},
        ]}]),
        json!({"items": ["a"]}),
    )
    .await;
    let mut log = h.events(eid).await;
    let it = iteration(eid, "each", "loop-1", 0, json!({"item": "a", "index": 0}));
    h.send_as("python", &it, "copy-1").await;
    // Waits behind the first, which stores the iteration's end.
    h.send_as("python", &it, "copy-2").await;
    log.until(EventType::LoopIterationDone.wire_name()).await;
    log.settle(Duration::from_millis(1500)).await;
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "x",
        "the tool ran once"
    );
    assert_eq!(log.of(EventType::LoopIterationDone.wire_name()).len(), 1);
    h.stop().await;
}
