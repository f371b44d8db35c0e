//! Stuck work never stays stuck: a step's `lifecycle.timeout_s`, a task's
//! `spec.timeout` and the execution's `executor.spec.limits.timeout_s` end
//! work as `step.failed` / `execution.failed` with a `timeout` error naming
//! the setting, whether the work is running (the executor enforces the
//! deadline) or waiting in a queue no executor serves (the router's timer).

use std::time::{Duration, Instant};

use noetl_integration::{Cluster, ClusterOptions};
use noetl_mesh::state::ExecStatus;
use noetl_wire::Event;
use serde_json::{json, Value};

fn payload(e: &Event) -> Value {
    serde_json::from_slice(&e.payload_json).unwrap_or(Value::Null)
}

/// The error of the (first) `step.failed` of `step`.
fn step_error(events: &[Event], step: &str) -> Value {
    let failed = events
        .iter()
        .find(|e| e.event_type == "step.failed" && e.step == step)
        .unwrap_or_else(|| {
            let types: Vec<String> = events
                .iter()
                .map(|e| format!("{} {}", e.event_type, e.step))
                .collect();
            panic!("no step.failed for {step}: {types:#?}")
        });
    payload(failed)["error"].clone()
}

const STEP_TIMEOUT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: step_timeout }
workflow:
  - step: start
    spec:
      policy:
        lifecycle: { timeout_s: 1 }
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(30)
          result = 'woke'
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: retry, attempts: 5 }
              - else:
                  then: { do: continue }
    next:
      arcs:
        - step: handled
          when: "{{ event.name == 'step.failed' and event.error.kind == 'timeout' }}"
  - step: handled
    tool:
      - name: note
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { handled: true } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_past_its_lifecycle_timeout_fails_with_timeout_and_arcs_can_route_it() {
    let cluster = Cluster::start().await;
    let started = Instant::now();
    let eid = cluster
        .submit(STEP_TIMEOUT, "step_timeout.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    let took = started.elapsed();
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["handled"], true, "{s:?}");
    assert_eq!(s.steps["start"], "failed", "{s:?}");
    // 1 s limit: not the 30 s nap, and no retry past the deadline.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let events = cluster.settled_events(&eid).await;
    let error = step_error(&events, "start");
    assert_eq!(error["kind"], "timeout", "{error}");
    assert_eq!(error["task"], "nap", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("lifecycle.timeout_s: 1"),
        "the error names the setting: {message}"
    );
    // The nap ran once: the policy's retry was not allowed past the deadline.
    let starts = events
        .iter()
        .filter(|e| e.event_type == "task.started" && e.task == "nap")
        .count();
    assert_eq!(starts, 1, "task.started of nap");
    cluster.stop().await;
}

const TASK_TIMEOUT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: task_timeout }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(30)
          result = 'woke'
        spec: { timeout: 1 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_past_its_spec_timeout_fails_the_step_with_timeout() {
    let cluster = Cluster::start().await;
    let started = Instant::now();
    let eid = cluster
        .submit(TASK_TIMEOUT, "task_timeout.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let error = step_error(&cluster.settled_events(&eid).await, "start");
    assert_eq!(error["kind"], "timeout", "{error}");
    assert_eq!(error["task"], "nap", "{error}");
    let why = s.error.unwrap_or_default();
    assert!(why.contains("timeout"), "{why}");
    cluster.stop().await;
}

const EXECUTION_DEADLINE: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: execution_deadline }
executor:
  spec: { limits: { timeout_s: 2 } }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(30)
          result = 'woke'
    next:
      arcs:
        - step: after
          when: "{{ event.name == 'step.failed' }}"
  - step: after
    tool: { kind: noop }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_past_its_deadline_fails_naming_it_even_when_an_arc_handles_the_step() {
    let cluster = Cluster::start().await;
    let started = Instant::now();
    let eid = cluster
        .submit(EXECUTION_DEADLINE, "execution_deadline.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    let took = started.elapsed();
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let why = s.error.clone().unwrap_or_default();
    assert!(
        why.contains("timeout") && why.contains("executor.spec.limits.timeout_s: 2"),
        "the error names the deadline: {why}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // The running nap was cut at the deadline (by the executor), and the
    // arc that handles failures started nothing after it.
    let events = cluster.settled_events(&eid).await;
    let error = step_error(&events, "start");
    assert_eq!(error["kind"], "timeout", "{error}");
    assert!(
        !events
            .iter()
            .any(|e| e.event_type == "step.started" && e.step == "after"),
        "no step starts past the deadline"
    );
    cluster.stop().await;
}

const QUEUED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: queued }
executor:
  spec: { limits: { timeout_s: 6 } }
workflow:
  - step: start
    spec: { policy: { lifecycle: { timeout_s: 1 } } }
    tool:
      - name: never_served
        kind: python
        code: "result = 1"
    next:
      arcs:
        - step: waits
          when: "{{ event.name == 'step.failed' and event.error.kind == 'timeout' }}"
  - step: waits
    tool:
      - name: also_never_served
        kind: python
        code: "result = 2"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_waiting_in_a_queue_times_out_by_the_routers_timers() {
    // Only a noop executor: python commands wait in their queue forever.
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        ..Default::default()
    })
    .await;
    let _noop = cluster.spawn_executor_for(&["noop"], 4).await;
    let started = Instant::now();
    let eid = cluster.submit(QUEUED, "queued.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    let took = started.elapsed();
    // The step timer failed `start` (1 s + grace), its arc started
    // `waits`, and the execution's deadline (6 s) ended it.
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let why = s.error.clone().unwrap_or_default();
    assert!(
        why.contains("executor.spec.limits.timeout_s: 6"),
        "the error names the deadline: {why}"
    );
    assert!(
        took >= Duration::from_secs(6) && took < Duration::from_secs(25),
        "took {took:?}"
    );
    let events = cluster.settled_events(&eid).await;
    let error = step_error(&events, "start");
    assert_eq!(error["kind"], "timeout", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("lifecycle.timeout_s: 1"),
        "{error}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.event_type == "step.started" && e.step == "waits"),
        "the timeout was routed"
    );
    let failed = events
        .iter()
        .filter(|e| e.event_type == "execution.failed")
        .count();
    assert_eq!(failed, 1, "one terminal event");
    cluster.stop().await;
}

const LOOP_TIMEOUT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: loop_timeout }
workflow:
  - step: start
    spec:
      policy:
        lifecycle: { timeout_s: 1 }
        failure: { mode: best_effort }
    loop:
      in: "{{ [1, 2, 3] }}"
      iterator: n
      spec: { mode: parallel }
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(30)
          result = 'woke'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_step_past_its_timeout_fails_with_timeout_even_in_best_effort_mode() {
    let cluster = Cluster::start().await;
    let started = Instant::now();
    let eid = cluster
        .submit(LOOP_TIMEOUT, "loop_timeout.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    let took = started.elapsed();
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let events = cluster.settled_events(&eid).await;
    let error = step_error(&events, "start");
    assert_eq!(error["kind"], "timeout", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("lifecycle.timeout_s: 1"),
        "{error}"
    );
    // Every iteration was cut at the deadline, none ran its 30 s.
    let cut = events
        .iter()
        .filter(|e| {
            e.event_type == "loop.iteration.failed" && payload(e)["error"]["kind"] == "timeout"
        })
        .count();
    assert_eq!(cut, 3, "iterations cut by the deadline");
    cluster.stop().await;
}

const CHILD_TIMEOUT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: child_timeout }
workflow:
  - step: start
    spec: { policy: { lifecycle: { timeout_s: 1 } } }
    tool:
      - name: call
        kind: playbook
        playbook: |
          apiVersion: noetl.io/v2
          kind: Playbook
          metadata: { name: slow_child }
          workflow:
            - step: start
              tool:
                - name: nap
                  kind: python
                  code: |
                    import time
                    time.sleep(30)
                    result = 'woke'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waiting_on_a_child_times_out_and_the_child_is_cancelled() {
    let cluster = Cluster::start().await;
    let started = Instant::now();
    let eid = cluster
        .submit(CHILD_TIMEOUT, "child_timeout.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let error = step_error(&cluster.settled_events(&eid).await, "start");
    assert_eq!(error["kind"], "timeout", "{error}");
    // The child the step waited on is cancelled, naming why.
    let keys = noetl_mesh::kv::keys_under(cluster.mesh.exec_kv(), &format!("{eid}.child"))
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let child = keys[0].rsplit('.').next().unwrap().to_string();
    let c = cluster.wait(&child, Duration::from_secs(30)).await;
    assert_eq!(c.status, ExecStatus::Cancelled, "{c:?}");
    let why = c.error.unwrap_or_default();
    assert!(why.contains("ran out of time"), "{why}");
    cluster.stop().await;
}

/// The router's execution deadline, delivered again after a delivery that
/// wrote the execution's end (failed by the deadline) and stopped before
/// its terminal event: the end goes out now, where a header no longer
/// running used to make the timer do nothing, and the end was never told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_delivered_again_after_its_end_was_written_announces_that_end() {
    use noetl_core::lifecycle::{execution_timeout_message, Deadline};
    use noetl_mesh::events::{now_ms, now_rfc3339, EventDraft};
    use noetl_mesh::payloads::{DeadlineSet, ExecutionDeadlineSet};
    use noetl_mesh::state::{ExecHeader, TokenRecord};
    let cluster = Cluster::start().await;
    let eid = noetl_mesh::ids::new_execution_id();
    let deadline = Deadline {
        at_ms: now_ms() - 5_000,
        what: "executor.spec.limits.timeout_s: 1".into(),
    };
    let now = now_rfc3339();
    let mut header = ExecHeader {
        playbook: "timed".into(),
        source: "timed.yaml".into(),
        started_at: now.clone(),
        ..ExecHeader::running(eid.clone(), vec![TokenRecord::new("t1", "start")])
    };
    header.end(
        ExecStatus::Failed,
        &execution_timeout_message(&deadline),
        &now,
    );
    cluster.put_header(&header).await;
    let timer = EventDraft {
        execution_id: &eid,
        ..Default::default()
    }
    .build(&ExecutionDeadlineSet(DeadlineSet {
        at_ms: deadline.at_ms,
        what: deadline.what.clone(),
        args: None,
    }));
    cluster
        .mesh
        .emit(&timer)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let events = cluster
        .wait_for_event(&eid, "execution.failed", Duration::from_secs(20), |e| {
            e.event_type == "execution.failed"
        })
        .await;
    let end = events
        .iter()
        .find(|e| e.event_type == "execution.failed")
        .unwrap();
    let error = payload(end)["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        error.contains("executor.spec.limits.timeout_s: 1"),
        "the end names the deadline: {error}"
    );
    let s = cluster.wait(&eid, Duration::from_secs(10)).await;
    assert_eq!(s.status, ExecStatus::Failed);
    assert!(
        cluster
            .mesh
            .exec_header(&eid)
            .await
            .unwrap()
            .unwrap()
            .terminal_emitted,
        "the end is recorded as out"
    );
    cluster.stop().await;
}
