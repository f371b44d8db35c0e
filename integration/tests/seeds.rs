//! Seed rules end to end (docs/dsl.md): a task's result by its name in the
//! same pipeline (across executors, large ones by reference), the seed
//! spelling of a parallel loop, the `loop` variable, a task of a kind
//! no executor serves, admission rules that read a step's result, and
//! `outcome.meta.trace_id`.

use std::time::Duration;

use noetl_integration::{Cluster, ClusterOptions};
use noetl_mesh::state::ExecStatus;
use noetl_wire::Event;
use serde_json::{json, Value};

fn payload(e: &Event) -> Value {
    serde_json::from_slice(&e.payload_json).unwrap_or(Value::Null)
}

/// `fetch` (python) makes 3,000 rows, above the 1,000-byte payload limit;
/// `use` (noop) and `check` (python) read it by name. With one executor
/// per kind, the rows travel from python to noop and back by reference.
const BY_NAME: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: by_name }
executor:
  spec: { limits: { max_payload_bytes: 1000 } }
workflow:
  - step: start
    tool:
      - name: fetch
        kind: python
        code: |
          result = {"rows": list(range(3000)), "label": "ok"}
      - name: use
        kind: noop
        result: { n: "{{ fetch.rows | length }}", label: "{{ fetch.label }}" }
        spec:
          policy:
            rules:
              - when: "{{ fetch.rows | length == 3000 and use.n == 3000 }}"
                then:
                  do: continue
                  set_ctx: { first: "{{ fetch.rows[0] }}", n: "{{ use.n }}" }
              - else:
                  then: { do: fail }
      - name: check
        kind: python
        args: { last: "{{ fetch.rows | last }}", label: "{{ use.label }}" }
        code: |
          result = {"last": last, "label": label}
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { last: "{{ check.last }}", label: "{{ check.label }}" } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_task_reads_an_earlier_tasks_result_by_name_across_executors() {
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        ..Default::default()
    })
    .await;
    let _py = cluster.spawn_executor_for(&["python"], 4).await;
    let _noop = cluster.spawn_executor_for(&["noop"], 4).await;
    let (eid, s) = cluster.completed(BY_NAME, json!({})).await;
    assert_eq!(
        s.ctx,
        json!({"first": 0, "n": 3000, "last": 2999, "label": "ok"}),
        "execution {eid}"
    );
    // The pipeline changed executors twice: python → noop → python.
    let evs = cluster.settled_events(&eid).await;
    let kinds: Vec<String> = evs
        .iter()
        .filter_map(noetl_mesh::attempt::attempt_started)
        .map(|s| s.kind)
        .collect();
    assert_eq!(kinds, ["python", "noop", "python"]);
    cluster.stop().await;
}

/// Eight iterations of 0.3 s with the seed's spelling of a parallel loop.
const SEED_PARALLEL: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: seed_parallel }
workflow:
  - step: start
    loop:
      in: "{{ range(8) | list }}"
      iterator: i
      spec:
        policy: { mode: parallel, max_in_flight: 3, exec: distributed }
    tool:
      - name: work
        kind: python
        args: { i: "{{ iter.i }}" }
        code: |
          import time
          time.sleep(0.3)
          result = i
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
"#;

/// The most iterations in flight at once, from the order of their events.
fn max_in_flight(evs: &[Event]) -> usize {
    let (mut now, mut max) = (0usize, 0usize);
    for e in evs {
        match e.event_type.as_str() {
            "loop.iteration.started" => {
                now += 1;
                max = max.max(now);
            }
            "loop.iteration.done" | "loop.iteration.failed" => now = now.saturating_sub(1),
            _ => {}
        }
    }
    max
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loop_spec_policy_parallel_runs_iterations_concurrently() {
    let cluster = Cluster::start().await;
    let (eid, _) = cluster.completed(SEED_PARALLEL, json!({})).await;
    let evs = cluster.settled_events(&eid).await;
    let started = evs
        .iter()
        .find(|e| e.event_type == "loop.started")
        .expect("loop.started");
    assert_eq!(payload(started)["max_in_flight"], 3);
    assert_eq!(payload(started)["mode"], "parallel");
    assert_eq!(
        max_in_flight(&evs),
        3,
        "iterations overlap, never more than max_in_flight"
    );
    let done = evs
        .iter()
        .filter(|e| e.event_type == "loop.iteration.done")
        .count();
    assert_eq!(done, 8);
    cluster.stop().await;
}

/// `loop` in a task's field, args and policy, per iteration.
const LOOP_VAR: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: loop_var }
workflow:
  - step: start
    loop:
      in: ["a", "b", "c"]
      iterator: letter
      spec:
        policy: { reducers: { seen: append, args: append } }
    tool:
      - name: shape
        kind: noop
        result: "{{ loop.index }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }}"
        spec:
          policy:
            rules:
              - when: "{{ loop.index < loop.length }}"
                then: { do: continue, set_ctx: { seen: "{{ iter.letter }}={{ shape }}" } }
      - name: py
        kind: python
        args: { n: "{{ loop.index }}", last: "{{ loop.last }}" }
        code: |
          result = {"n": n, "last": last}
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { args: "{{ outcome.result }}" } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_variable_is_set_in_every_iteration() {
    let cluster = Cluster::start().await;
    let (_, s) = cluster.completed(LOOP_VAR, json!({})).await;
    assert_eq!(
        s.ctx["seen"],
        json!(["a=0/3/true/false", "b=1/3/false/false", "c=2/3/false/true"])
    );
    assert_eq!(
        s.ctx["args"],
        json!([{"n": 0, "last": false}, {"n": 1, "last": false}, {"n": 2, "last": true}])
    );
    cluster.stop().await;
}

const UNSERVED_FIRST: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: unserved_first }
workflow:
  - step: start
    tool:
      - name: load
        kind: duckdb
        command: "SELECT 1"
"#;

const UNSERVED_HANDOFF: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: unserved_handoff }
workflow:
  - step: start
    tool:
      - name: prepare
        kind: noop
      - name: load
        kind: duckdb
        command: "SELECT 1"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_a_kind_no_executor_serves_fails_after_the_wait_naming_the_kind() {
    // Only a noop executor: nobody serves duckdb.
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        executor_wait: Duration::from_millis(1500),
        ..Default::default()
    })
    .await;
    let _noop = cluster.spawn_executor_for(&["noop"], 4).await;
    for (yaml, what) in [
        (UNSERVED_FIRST, "first task"),
        (UNSERVED_HANDOFF, "hand-off"),
    ] {
        let eid = cluster.submit(yaml, "unserved.yaml", json!({})).await;
        let s = cluster.wait(&eid, Duration::from_secs(30)).await;
        assert_eq!(s.status, ExecStatus::Failed, "{what}: {s:?}");
        let evs = cluster.settled_events(&eid).await;
        let timer = evs
            .iter()
            .find(|e| e.event_type == "task.unserved")
            .unwrap_or_else(|| panic!("{what}: no task.unserved timer"));
        assert_eq!(payload(timer)["kind"], "duckdb");
        let failed = evs
            .iter()
            .find(|e| e.event_type == "step.failed")
            .unwrap_or_else(|| panic!("{what}: no step.failed"));
        let error = &payload(failed)["error"];
        assert_eq!(error["kind"], "executor.unavailable", "{what}: {error}");
        assert_eq!(error["task"], "load");
        let m = error["message"].as_str().unwrap_or("");
        assert!(
            m.contains(
                "no executor serves kind `duckdb` (waited 1500 ms on subject noetl.task.duckdb)"
            ),
            "{what}: {m}"
        );
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_kind_starts_no_timer() {
    let cluster = Cluster::start_with(ClusterOptions {
        executor_wait: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let served = UNSERVED_HANDOFF.replace(
        "kind: duckdb\n        command: \"SELECT 1\"",
        "kind: python\n        code: \"result = 1\"",
    );
    assert!(served.contains("kind: python"));
    // The mesh starts its executors before it takes work, so even the
    // first run finds every kind it uses served.
    for _ in 0..2 {
        let (eid, _) = cluster.completed(&served, json!({})).await;
        let evs = cluster.settled_events(&eid).await;
        assert!(evs.iter().all(|e| e.event_type != "task.unserved"));
    }
    cluster.stop().await;
}

/// `check` (python) returns `{ok: true}`, `bad` returns `{ok: false}`;
/// `go` admits only when `check.ok`, `stop` only when `bad.ok`: the
/// scheduler renders admission with the step results the rules read
/// (docs/dsl.md "Admission"). Each task policy also keeps
/// `outcome.meta.trace_id`.
const ADMIT_READS_RESULT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: admit_reads_result }
workflow:
  - step: start
    tool:
      - name: check
        kind: python
        code: |
          result = {"ok": True}
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { trace: "{{ outcome.meta.trace_id }}" } }
    next: { arcs: [ { step: bad } ] }
  - step: bad
    tool: { kind: noop, result: { ok: false } }
    next:
      spec: { mode: inclusive }
      arcs: [ { step: go }, { step: stop } ]
  - step: go
    spec:
      policy:
        admit:
          rules:
            - when: "{{ start.ok and not bad.ok }}"
              then: { allow: true }
            - else:
                then: { allow: false }
    tool: { kind: noop, result: { ran: true } }
  - step: stop
    spec:
      policy:
        admit:
          rules:
            - when: "{{ bad.ok }}"
              then: { allow: true }
            - else:
                then: { allow: false }
    tool: { kind: noop, result: { ran: true } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_reads_step_results_and_policies_read_the_trace_id() {
    let cluster = Cluster::start().await;
    let (eid, s) = cluster.completed(ADMIT_READS_RESULT, json!({})).await;
    assert_eq!(s.steps.get("go").map(String::as_str), Some("done"), "{s:?}");
    assert_eq!(
        s.steps.get("stop").map(String::as_str),
        Some("skipped"),
        "{s:?}"
    );
    let evs = cluster.settled_events(&eid).await;
    let skipped: Vec<&Event> = evs
        .iter()
        .filter(|e| e.event_type == "step.skipped")
        .collect();
    assert_eq!(skipped.len(), 1, "only `stop` is refused");
    assert_eq!(skipped[0].step, "stop");
    // The trace id a policy reads is the execution's: every event's.
    let trace = s.ctx["trace"].as_str().unwrap_or_default().to_string();
    assert_eq!(trace.len(), 32, "a W3C trace id: {trace:?}");
    let traced: Vec<&str> = evs
        .iter()
        .filter(|e| e.event_type.starts_with("task.") || e.event_type.starts_with("step."))
        .map(|e| e.trace_id.as_str())
        .collect();
    assert!(traced.len() >= 8, "{traced:?}");
    assert!(traced.iter().all(|t| *t == trace), "{trace} vs {traced:?}");
    cluster.stop().await;
}
