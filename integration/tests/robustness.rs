//! Replicas, redelivery, bad input, plain-JSON requests.

use std::time::Duration;

use noetl_integration::{events_of, types, Cluster, ClusterOptions, Gauge};
use noetl_mesh::{codec, event_type::EventType};
use noetl_wire::Event;
use serde_json::{json, Value};

const FANOUT: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: fanout }
workload: { n: 5, nap: 0, log: /dev/null }
workflow:
  - step: start
    tool:
      - name: seed
        kind: noop
        result: "{{ workload.n }}"
    next:
      spec: { mode: inclusive }
      arcs:
        - step: left
          args: { v: 1 }
        - step: right
          args: { v: 2 }
  - step: left
    tool:
      - name: l
        kind: python
        args: { v: "{{ args.v }}", nap: "{{ workload.nap }}", log: "{{ workload.log }}" }
        code: |
          import time
          time.sleep(nap)
          with open(log, "a") as f:
              f.write("left\n")
          result = v * 10
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { left: "{{ outcome.result }}" } }
    next:
      arcs:
        - step: tail
  - step: right
    loop:
      in: "{{ range(workload.n) | list }}"
      iterator: i
      spec: { mode: parallel, max_in_flight: 2 }
    tool:
      - name: r
        kind: python
        args: { i: "{{ iter.i }}", log: "{{ workload.log }}" }
        code: |
          with open(log, "a") as f:
              f.write(f"right {i}\n")
          result = i
    next:
      arcs:
        - step: tail
          when: "{{ event.name == 'loop.done' }}"
  - step: tail
    tool:
      - name: t
        kind: noop
"#;

fn count(events: &[Event], t: &str) -> usize {
    events.iter().filter(|e| e.event_type == t).count()
}

/// The tasks' own record of what ran (one line per task run), sorted: the
/// effect, observed outside the engine.
fn effects(log: &std::path::Path) -> Vec<String> {
    let mut lines: Vec<String> = std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

fn expected_effects() -> Vec<String> {
    let mut v = vec!["left".to_string()];
    v.extend((0..5).map(|i| format!("right {i}")));
    v
}

async fn run_fanout(
    cluster: &Cluster,
    log: &std::path::Path,
) -> (noetl_mesh::state::ExecSummary, Vec<Event>) {
    let eid = cluster
        .submit(FANOUT, "fanout.yaml", json!({"log": log}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    (s, cluster.settled_events(&eid).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_of_every_service_give_the_same_result_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let one = Cluster::start().await;
    let (s1, e1) = run_fanout(&one, &dir.path().join("one.log")).await;
    one.stop().await;
    assert_eq!(effects(&dir.path().join("one.log")), expected_effects());
    let two = Cluster::start_with(ClusterOptions {
        replicas: 2,
        ..Default::default()
    })
    .await;
    let mut runs = Vec::new();
    for n in 0..3 {
        let log = dir.path().join(format!("two-{n}.log"));
        runs.push(run_fanout(&two, &log).await);
        // Every task ran exactly once although two replicas of every
        // service competed for its messages.
        assert_eq!(effects(&log), expected_effects(), "run {n}");
    }
    two.stop().await;
    assert_eq!(
        serde_json::to_value(s1.status).unwrap(),
        "completed",
        "{:?}",
        s1.error
    );
    for (s2, e2) in &runs {
        assert_eq!(s2.status, s1.status);
        assert_eq!(s2.ctx, s1.ctx);
        assert_eq!(s2.steps, s1.steps);
        for t in [
            EventType::StepDone.wire_name(),
            EventType::LoopDone.wire_name(),
            EventType::LoopIterationDone.wire_name(),
            EventType::TokenCreated.wire_name(),
            EventType::NextSelected.wire_name(),
            EventType::ExecutionCompleted.wire_name(),
        ] {
            assert_eq!(
                count(e2, t),
                count(&e1, t),
                "count of {t} differs between 1 and 2 replicas"
            );
        }
        // No duplicate step.done for one step-run.
        let mut runs_done: Vec<&str> = e2
            .iter()
            .filter(|e| e.event_type == EventType::StepDone.wire_name())
            .map(|e| e.step_run_id.as_str())
            .collect();
        let n = runs_done.len();
        runs_done.sort();
        runs_done.dedup();
        assert_eq!(runs_done.len(), n, "duplicate step.done for a step-run");
    }
    // tail is reached twice (once per incoming arc): two runs, both done.
    assert_eq!(
        count(&e1, EventType::StepDone.wire_name()),
        4,
        "start, left, tail twice"
    );
    assert_eq!(count(&e1, EventType::LoopIterationDone.wire_name()), 5);
    assert_eq!(s1.ctx["left"], 10);
}

/// `noetl admin compact` right after an execution completed, while the
/// copies of its messages are still to come (every message delivered a
/// second time, 5 s late): a late task command finds no header, and its
/// events say the execution ended, so it runs nothing; the log gets no
/// event after the end, and no copy writes its KV state back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_copies_of_a_compacted_execution_s_commands_run_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("effects.log");
    let cluster = Cluster::start_with(ClusterOptions {
        deliver_twice: Some(Duration::from_secs(5)),
        ..Default::default()
    })
    .await;
    let eid = cluster
        .submit(FANOUT, "fanout.yaml", json!({"log": log}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "completed");
    cluster.mesh.forget_execution(&eid).await.unwrap();
    let ended = cluster.events(&eid).await;
    // Every copy comes 5 s after its first delivery.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(effects(&log), expected_effects(), "every task ran once");
    let after = cluster.events(&eid).await;
    assert_eq!(types(&after), types(&ended), "nothing after the end");
    let m = &cluster.mesh;
    let mut left = Vec::new();
    for store in [m.exec_kv(), m.ctx_kv(), m.loop_kv()] {
        let mut keys = store.keys().await.unwrap();
        while let Some(k) = futures::StreamExt::next(&mut keys).await {
            let k = k.unwrap();
            if k.starts_with(&eid) {
                left.push(format!("{}:{k}", store.name));
            }
        }
    }
    assert_eq!(left, Vec::<String>::new(), "its state stays removed");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_boundary_event_has_no_duplicate_effect() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("effects.log");
    // `left` naps, so the redeliveries below land while the execution runs.
    let eid = cluster
        .submit(FANOUT, "fanout.yaml", json!({"log": log, "nap": 2}))
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (done, it) = loop {
        let evs = cluster.events(&eid).await;
        let done = evs
            .iter()
            .find(|e| e.event_type == EventType::StepDone.wire_name() && e.step == "start")
            .cloned();
        let it = evs
            .iter()
            .find(|e| e.event_type == EventType::LoopIterationDone.wire_name())
            .cloned();
        let left_running = evs
            .iter()
            .any(|e| e.event_type == EventType::StepStarted.wire_name() && e.step == "left");
        if let (Some(d), Some(i), true) = (done, it, left_running) {
            break (d, i);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fan-out never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let h = cluster.mesh.exec_header(&eid).await.unwrap().unwrap();
    assert_eq!(
        serde_json::to_value(h.status).unwrap(),
        "running",
        "the redelivery must land mid-run"
    );
    // Re-publish under NEW message ids, so JetStream cannot de-duplicate
    // them: only the services' idempotency can.
    for (n, ev) in [(1, &done), (2, &it)] {
        cluster
            .mesh
            .publish(
                cluster.mesh.subjects().event(&eid, &ev.event_type),
                &format!("redelivery-test-{n}"),
                codec::encode(ev),
            )
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "completed");
    let after = cluster.settled_events(&eid).await;
    let start_tokens: usize = after
        .iter()
        .filter(|e| e.step_run_id == done.step_run_id)
        .map(|e| noetl_mesh::payloads::tokens_created(e).unwrap().len())
        .sum();
    assert_eq!(start_tokens, 2, "start fired left and right once each");
    assert_eq!(
        count(&after, EventType::LoopDone.wire_name()),
        1,
        "exactly one loop.done"
    );
    assert_eq!(count(&after, EventType::ExecutionCompleted.wire_name()), 1);
    assert_eq!(effects(&log), expected_effects(), "each task ran once");
    let h = cluster.mesh.exec_header(&eid).await.unwrap().unwrap();
    assert!(h.live.is_empty());
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_dead_lettered_or_fails_its_execution_only() {
    let cluster = Cluster::start().await;
    let m = &cluster.mesh;
    // 1. Garbage on the request subject: dead-lettered with the reason.
    m.client()
        .publish(m.subjects().exec_request(), "{not json".into())
        .await
        .unwrap();
    // 2. An invalid playbook: execution.failed with the diagnostics.
    let bad = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: bad }\nworkflow:\n  - step: start\n    when: \"{{ true }}\"\n    tool: { kind: noop }\n";
    let bad_id = cluster.submit(bad, "bad.yaml", json!({})).await;
    // 3. A good execution at the same time is untouched.
    let good = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: good }\nworkflow:\n  - step: start\n    tool: { kind: noop, result: 42 }\n";
    let good_id = cluster.submit(good, "good.yaml", json!({})).await;

    let s = cluster.wait(&bad_id, Duration::from_secs(30)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "failed");
    let err = s.error.unwrap_or_default();
    assert!(
        err.contains("E010") && err.contains("bad.yaml:6"),
        "diagnostic names code and line: {err}"
    );
    let evs = cluster.settled_events(&bad_id).await;
    assert_eq!(types(&evs), vec!["execution.failed"]);

    let s = cluster.wait(&good_id, Duration::from_secs(30)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "completed");

    // The garbage went to the dead-letter stream with its subject and reason.
    let (reason, original) = last_dead_letter(m, "router-requests").await;
    assert!(
        reason.contains("cannot decode execution request"),
        "{reason}"
    );
    assert_eq!(original, Some(m.subjects().exec_request()));
    cluster.stop().await;
}

/// The reason and original subject of the last message consumer
/// `consumer` dead-lettered, waiting up to 10 s for one.
async fn last_dead_letter(m: &noetl_mesh::Mesh, consumer: &str) -> (String, Option<String>) {
    let stream = m.js().get_stream(m.subjects().dlq_stream()).await.unwrap();
    let dead = m.subjects().dead_letter(consumer);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let msg = loop {
        match stream.get_last_raw_message_by_subject(&dead).await {
            Ok(msg) => break msg,
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "nothing dead-lettered on {dead}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let header = |name: &str| msg.headers.get(name).map(|v| v.to_string());
    (
        header(noetl_mesh::runtime::HEADER_REASON).unwrap_or_default(),
        header(noetl_mesh::runtime::HEADER_ORIGINAL_SUBJECT),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_client_can_start_an_execution_with_plain_json() {
    let cluster = Cluster::start().await;
    let client = cluster.server.client().await;
    let js = async_nats::jetstream::new(client);
    let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: json }\nworkload: { x: 1 }\nworkflow:\n  - step: start\n    tool:\n      - name: t\n        kind: noop\n        spec:\n          policy:\n            rules:\n              - else:\n                  then: { set_ctx: { x: \"{{ workload.x }}\" } }\n";
    // With our own id.
    let body = json!({"execution_id": "json-1", "playbook": yaml, "workload": {"x": 7}});
    js.publish("noetl.exec.request", body.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let s = cluster.wait("json-1", Duration::from_secs(30)).await;
    assert_eq!(s.ctx["x"], 7);
    // Without an id: it is e<seq> from the publish ack.
    let body = json!({"playbook": yaml});
    let ack = js
        .publish("noetl.exec.request", body.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let eid = format!("e{}", ack.sequence);
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.ctx["x"], 1);
    assert_eq!(serde_json::to_value(s.status).unwrap(), "completed");
    let all = events_of(&cluster.mesh, &cluster.mesh.subjects().events_of(&eid)).await;
    assert_eq!(
        all.first().map(|e| e.event_type.as_str()),
        Some("playbook.initialized")
    );
    let _: Vec<Value> = Vec::new();
    cluster.stop().await;
}

/// An id whose state was compacted still names its execution: a request
/// published under it by hand (no client checked it first, and the
/// de-duplication window is long gone: no message id) is dead-lettered
/// with the reason, and the first run's log gets no second history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_under_a_compacted_execution_s_id_is_not_started_again() {
    let cluster = Cluster::start().await;
    let m = &cluster.mesh;
    let js = async_nats::jetstream::new(cluster.server.client().await);
    let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: again }\nworkflow:\n  - step: start\n    tool: { kind: noop, result: 1 }\n";
    let body = json!({"execution_id": "again-1", "playbook": yaml}).to_string();
    js.publish(m.subjects().exec_request(), body.clone().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let first = cluster.wait("again-1", Duration::from_secs(30)).await;
    assert_eq!(serde_json::to_value(first.status).unwrap(), "completed");
    let before = cluster.settled_events("again-1").await;
    m.forget_execution("again-1").await.unwrap();

    js.publish(m.subjects().exec_request(), body.into())
        .await
        .unwrap()
        .await
        .unwrap();
    let (reason, _) = last_dead_letter(m, "router-requests").await;
    assert!(
        reason.contains("execution again-1 exists already")
            && reason.contains("noetl exec retry again-1"),
        "{reason}"
    );
    assert!(
        m.exec_header("again-1").await.unwrap().is_none(),
        "no header written for the second request"
    );
    let after = cluster.events("again-1").await;
    assert_eq!(types(&after), types(&before), "no second run in its log");
    cluster.stop().await;
}

/// A copy of the request of a running execution whose header was purged
/// (its first delivery's ack lost to a router's or nats-server's crash) is
/// that execution's own request, not a reuse of its id: its header comes
/// back from the events and the start goes on as any redelivery's (the
/// copy makes sure the entry went out). It was dead-lettered as a reused
/// id, and an execution whose first delivery stopped before its entry went
/// out never ran (found by the chaos campaign: two executions left at
/// `playbook.initialized` and at their first `step.started`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_running_execution_s_request_with_its_header_purged_goes_on() {
    let cluster = Cluster::start().await;
    let m = &cluster.mesh;
    let js = async_nats::jetstream::new(cluster.server.client().await);
    let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: copied }\nworkflow:\n  - step: start\n    tool:\n      - name: t\n        kind: python\n        code: |\n          import time\n          time.sleep(1)\n          result = 1\n";
    let body = json!({"execution_id": "copy-1", "playbook": yaml}).to_string();
    let publish = || async {
        (js.publish(m.subjects().exec_request(), body.clone().into()))
            .await
            .unwrap()
            .await
            .unwrap();
    };
    publish().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while count(&cluster.events("copy-1").await, "step.started") == 0 {
        assert!(std::time::Instant::now() < deadline, "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    purge_header(&cluster, "copy-1").await;
    publish().await;
    let s = cluster.wait("copy-1", Duration::from_secs(30)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "completed");
    // The copy was handled, and not dead-lettered.
    cluster.drained("noetl-router-requests").await;
    let dlq = m.js().get_stream(m.subjects().dlq_stream()).await.unwrap();
    let dead = m.subjects().dead_letter("router-requests");
    let last = dlq.get_last_raw_message_by_subject(&dead).await;
    assert!(last.is_err(), "the copy was dead-lettered");
    let events = cluster.settled_events("copy-1").await;
    assert_eq!(count(&events, "step.started"), 1, "{:?}", types(&events));
    assert_eq!(count(&events, "execution.completed"), 1);
    cluster.stop().await;
}

const GATED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: gated }
executor: { spec: { policy: { concurrency: { key: one-at-a-time, limit: 1 } } } }
workload: { log: "" }
workflow:
  - step: start
    tool:
      - name: t
        kind: python
        args: { log: "{{ workload.log }}" }
        code: |
          import time
          with open(log, 'a') as f:
              f.write("ran\n")
          time.sleep(1)
          result = 1
"#;

/// An execution whose first delivery stopped after `playbook.initialized`
/// (before its entry went out or it was queued: its events say no entry
/// token) and whose header was purged: the copy of its request writes the
/// header back from the events and gives it its entry token, so it starts
/// when its slot is its. Without the token it was promoted, found nothing
/// waiting, and never ran (the chaos campaign's seed
/// `0x6c1a3f6965f75553`). Made here by a queued execution whose
/// `execution.queued` is deleted from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_request_whose_entry_never_went_out_starts_it() {
    let cluster = Cluster::start().await;
    let m = &cluster.mesh;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("effects.log");
    let js = async_nats::jetstream::new(cluster.server.client().await);
    let request = |eid: &str| {
        json!({"execution_id": eid, "playbook": GATED, "workload": {"log": log}}).to_string()
    };
    let publish = |body: String| async {
        (js.publish(m.subjects().exec_request(), body.into()))
            .await
            .unwrap()
            .await
            .unwrap();
    };
    publish(request("holder")).await;
    // The router takes requests concurrently: `next` is sent once
    // `holder` holds the slot, or it could be the one to run first.
    let started = |e: &Event| e.event_type == EventType::WorkflowInitialized.wire_name();
    cluster
        .wait_for_event("holder", "its start", Duration::from_secs(20), started)
        .await;
    publish(request("next")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let queued = loop {
        if let Some(seq) = m
            .last_event_seq("next", EventType::ExecutionQueued)
            .await
            .unwrap()
        {
            break seq;
        }
        assert!(std::time::Instant::now() < deadline, "never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let events = m
        .js()
        .get_stream(m.subjects().events_stream())
        .await
        .unwrap();
    assert!(events.delete_message(queued).await.unwrap());
    purge_header(&cluster, "next").await;
    publish(request("next")).await;
    for eid in ["holder", "next"] {
        let s = cluster.wait(eid, Duration::from_secs(30)).await;
        assert_eq!(
            serde_json::to_value(s.status).unwrap(),
            "completed",
            "{eid}"
        );
    }
    assert_eq!(effects(&log), ["ran", "ran"]);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_message_fails_its_execution_with_the_reason() {
    let cluster = Cluster::start().await;
    let m = &cluster.mesh;
    let slow = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: slow }\nworkflow:\n  - step: start\n    tool:\n      - name: nap\n        kind: python\n        code: \"import time; time.sleep(2); result = 1\"\n";
    let eid = cluster.submit(slow, "slow.yaml", json!({})).await;
    // Once the step is running, garbage on this execution's token subject:
    // the scheduler can never
    // handle it. Without the notice the execution would wait forever.
    let started = |e: &Event| e.event_type == EventType::TaskStarted.wire_name();
    cluster
        .wait_for_event(&eid, "task.started", Duration::from_secs(20), started)
        .await;
    m.js()
        .publish(m.subjects().token(&eid), vec![0xffu8; 8].into())
        .await
        .unwrap()
        .await
        .unwrap();
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    let seen = types(&cluster.events(&eid).await)
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "failed",
        "events: {seen:?}"
    );
    let err = s.error.unwrap_or_default();
    assert!(
        err.contains("dead-lettered") && err.contains(&m.subjects().token(&eid)),
        "the error names the message: {err}"
    );
    // Let the sleeping task finish: what it reports late changes nothing.
    let nap_done = |e: &Event| e.event_type == EventType::TaskDone.wire_name() && e.task == "nap";
    cluster
        .wait_for_event(&eid, "task.done of nap", Duration::from_secs(20), nap_done)
        .await;
    let evs = cluster.settled_events(&eid).await;
    let t = types(&evs);
    assert_eq!(
        t.iter()
            .filter(|t| **t == EventType::MessageDeadLettered.wire_name())
            .count(),
        1,
        "{t:?}"
    );
    assert_eq!(
        t.iter()
            .filter(|t| t.starts_with("execution."))
            .collect::<Vec<_>>(),
        vec![&"execution.failed"],
        "{t:?}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_bounds_a_replica_across_all_the_kinds_it_serves() {
    let (gauge, url) = Gauge::serve(Duration::from_millis(400)).await;
    // One http and one python task become runnable at once; an executor
    // with --concurrency 1 serving both kinds runs them one after the other.
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: two_kinds }
workflow:
  - step: start
    tool: { kind: noop }
    next:
      spec: { mode: inclusive }
      arcs:
        - step: by_http
        - step: by_python
  - step: by_http
    tool:
      - name: get
        kind: http
        url: "{{ workload.url }}"
  - step: by_python
    tool:
      - name: get
        kind: python
        args: { url: "{{ workload.url }}" }
        code: |
          import urllib.request
          result = urllib.request.urlopen(url).read().decode()
"#;
    let cluster = Cluster::start_with(ClusterOptions {
        concurrency: 1,
        ..Default::default()
    })
    .await;
    for _ in 0..2 {
        let eid = cluster
            .submit(yaml, "two_kinds.yaml", json!({"url": url}))
            .await;
        let s = cluster.wait(&eid, Duration::from_secs(60)).await;
        assert_eq!(
            serde_json::to_value(s.status).unwrap(),
            "completed",
            "{:?}",
            s.error
        );
    }
    cluster.stop().await;
    assert_eq!(gauge.total(), 4);
    assert_eq!(gauge.max(), 1, "two tasks ran at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_execution_runs_no_further_task_of_its_other_branches() {
    // `boom` fails unhandled while `busy` is inside its first task; the
    // execution fails, and `busy`'s second task (a side effect) must not run.
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: fail_stops_branches }
workflow:
  - step: start
    tool: { kind: noop }
    next:
      spec: { mode: inclusive }
      arcs:
        - step: boom
        - step: busy
  - step: boom
    tool:
      - name: wait_then_fail
        kind: python
        code: |
          import time
          time.sleep(0.5)
          raise RuntimeError("boom")
  - step: busy
    tool:
      - name: first
        kind: python
        args: { log: "{{ workload.log }}" }
        code: |
          import time
          with open(log, "a") as f:
              f.write("first\n")
          time.sleep(3)
          result = 1
      - name: second
        kind: python
        args: { log: "{{ workload.log }}" }
        code: |
          with open(log, "a") as f:
              f.write("second\n")
          result = 2
"#;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("effects.log");
    let cluster = Cluster::start().await;
    let eid = cluster
        .submit(yaml, "fail_stops_branches.yaml", json!({"log": log}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "failed");
    // Let `busy`'s first task finish and its pipeline decide.
    let first_done =
        |e: &Event| e.event_type == EventType::TaskDone.wire_name() && e.task == "first";
    cluster
        .wait_for_event(
            &eid,
            "task.done of first",
            Duration::from_secs(20),
            first_done,
        )
        .await;
    let events = cluster.settled_events(&eid).await;
    cluster.stop().await;
    assert_eq!(effects(&log), vec!["first".to_string()]);
    assert!(
        !events
            .iter()
            .any(|e| e.task == "second" && noetl_mesh::attempt::attempt_started(e).is_some()),
        "the second task started after the execution failed"
    );
}

/// A router stopped after writing a new execution's header and before its
/// first event, and the plan record was purged since: the redelivered
/// request finds the header but no plan and no event. It starts the
/// execution from the request, which alone still has the playbook (it was
/// acked and the execution lost: found by the chaos campaign).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_plan_was_lost_before_its_first_event_starts_from_the_request() {
    use noetl_mesh::state::{ExecHeader, ExecStatus, TokenRecord};
    let cluster = Cluster::start().await;
    let eid = noetl_mesh::ids::new_execution_id();
    // The header as the router writes it before the execution's events.
    let header = ExecHeader {
        playbook: "half_started".into(),
        source: "half_started.yaml".into(),
        started_at: noetl_mesh::events::now_rfc3339(),
        ..ExecHeader::running(
            eid.clone(),
            vec![TokenRecord::new(
                noetl_mesh::token::entry_token_id(&eid),
                "start",
            )],
        )
    };
    cluster.put_header(&header).await;
    let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: half_started }\nworkflow:\n  - step: start\n    tool:\n      - name: one\n        kind: noop\n        result: 1\n        spec:\n          policy:\n            rules:\n              - else:\n                  then: { set_ctx: { one: \"{{ outcome.result }}\" } }\n";
    cluster
        .submit_as(&eid, yaml, "half_started.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["one"], json!(1), "{s:?}");
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}

/// A request the router ended before a delivery stopped, its terminal event
/// not out yet: the header says the execution failed and the end is owed
/// (`terminal_emitted` unset). Delivered again, the request announces that
/// end instead of taking the header's word for it: a refused request (no
/// playbook ever planned) and one refused by its concurrency limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_ended_before_its_end_went_out_announces_it_when_delivered_again() {
    use noetl_mesh::state::{ExecHeader, ExecStatus};
    let cluster = Cluster::start().await;
    let now = noetl_mesh::events::now_rfc3339();
    let ended = |eid: &str, playbook: &str, error: &str| ExecHeader {
        playbook: playbook.into(),
        source: format!("{eid}.yaml"),
        status: ExecStatus::Failed,
        started_at: now.clone(),
        ended_at: Some(now.clone()),
        error: Some(error.into()),
        ..ExecHeader::running(eid.to_string(), Vec::new())
    };
    let refused = noetl_mesh::ids::new_execution_id();
    let limited = noetl_mesh::ids::new_execution_id();
    let cases = [
        (
            &refused,
            ended(&refused, "", "invalid playbook: workflow is empty"),
        ),
        (
            &limited,
            ended(&limited, "limited", "concurrency key `k` is full (limit 1)"),
        ),
    ];
    for (eid, header) in &cases {
        cluster.put_header(header).await;
        let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: limited }\nworkflow:\n  - step: start\n    tool: { kind: noop }\n";
        cluster
            .submit_as(eid, yaml, &header.source, json!({}))
            .await;
    }
    for (eid, header) in &cases {
        let events = cluster
            .wait_for_event(eid, "execution.failed", Duration::from_secs(30), |e| {
                e.event_type == "execution.failed"
            })
            .await;
        // The end as the header has it, and nothing run.
        assert_eq!(types(&events), ["execution.failed"], "{eid}");
        let p = noetl_mesh::events::payload(&events[0]);
        assert_eq!(p["error"], json!(header.error), "{eid}: {p}");
        let stored = cluster.wait(eid, Duration::from_secs(10)).await;
        assert_eq!(stored.status, ExecStatus::Failed, "{eid}");
        let h = cluster.mesh.exec_header(eid).await.unwrap().unwrap();
        assert!(h.terminal_emitted, "{eid}: the end is recorded as out");
    }
    // The refused one's log is whole (a limited one's starts with its
    // `playbook.initialized`, which this test does not write).
    cluster.assert_replays(&refused).await;
    // The refused one's event carries where it came from: its only event.
    let events = cluster.events(&refused).await;
    assert_eq!(
        noetl_mesh::events::payload(&events[0])["source"],
        json!(format!("{refused}.yaml"))
    );
    cluster.stop().await;
}

/// Stack a thread may use in [`a_mesh_runs_its_playbooks_within_three_quarters_of_a_threads_stack`]:
/// three quarters of the 2 MiB a test thread and a runtime worker get.
const STACK_HEADROOM: usize = 1536 * 1024;

/// A debug build keeps room in a function's stack frame for every future
/// it builds, so starting a mesh and running its handlers took most of a
/// test thread's 2 MiB (one test overflowed it; another was within 6 % of
/// it). Here the test's thread and every worker of its runtime get three
/// quarters of that: a change that eats the margin fails here, by name,
/// instead of overflowing some other test now and then.
#[test]
fn a_mesh_runs_its_playbooks_within_three_quarters_of_a_threads_stack() {
    let run = || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_stack_size(STACK_HEADROOM)
            .enable_all()
            .build()
            .expect("a runtime");
        // Not boxed: `#[tokio::test]` keeps its body on the stack too.
        runtime.block_on(async {
            let cluster = Cluster::start().await;
            for file in [
                "playbooks/hello.yaml",
                "playbooks/nested_loops.yaml",
                "playbooks/join.yaml",
                "playbooks/jump_break.yaml",
            ] {
                let (summary, events) = cluster.run_file(file, json!({})).await;
                assert_eq!(
                    summary.status,
                    noetl_mesh::state::ExecStatus::Completed,
                    "{file}: {summary:?}"
                );
                cluster.assert_replays(&events[0].execution_id).await;
            }
            cluster.stop().await;
        });
    };
    std::thread::Builder::new()
        .name("stack-headroom".into())
        .stack_size(STACK_HEADROOM)
        .spawn(run)
        .expect("a thread")
        .join()
        .expect("the playbooks ran");
}

/// A playbook whose one python task no executor serves: it waits in its
/// queue until something ends the execution.
fn unserved(name: &str, limits: &str) -> String {
    format!(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{ name: {name} }}\n{limits}workflow:\n  - step: start\n    tool:\n      - name: never_served\n        kind: python\n        code: \"result = 1\"\n"
    )
}

/// The header purged while an execution runs: a cancel and an execution
/// deadline that find it missing write it back from the events and end
/// the execution, instead of taking the purge for an execution that does
/// not exist (then the cancel did nothing and the deadline passed
/// silently: both executions waited for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_or_a_deadline_that_finds_the_header_purged_still_ends_the_execution() {
    use noetl_mesh::state::ExecStatus;
    // Only a noop executor: the python tasks wait in their queue.
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        ..Default::default()
    })
    .await;
    let _noop = cluster.spawn_executor_for(&["noop"], 2).await;
    let cancelled = cluster
        .submit(&unserved("to_cancel", ""), "to_cancel.yaml", json!({}))
        .await;
    let timed_out = cluster
        .submit(
            &unserved(
                "times_out",
                "executor: { spec: { limits: { timeout_s: 3 } } }\n",
            ),
            "times_out.yaml",
            json!({}),
        )
        .await;
    for eid in [&cancelled, &timed_out] {
        cluster
            .wait_for_event(eid, "the start step", Duration::from_secs(10), |e| {
                e.step == "start"
            })
            .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for eid in [&cancelled, &timed_out] {
        purge_header(&cluster, eid).await;
        assert!(cluster.mesh.exec_header(eid).await.unwrap().is_none());
    }
    cluster
        .mesh
        .request_cancel(&cancelled, "test says stop")
        .await
        .unwrap();
    let s = cluster.wait(&cancelled, Duration::from_secs(20)).await;
    assert_eq!(s.status, ExecStatus::Cancelled, "{s:?}");
    assert_eq!(s.error.as_deref(), Some("cancelled: test says stop"));
    let s = cluster.wait(&timed_out, Duration::from_secs(20)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let why = s.error.clone().unwrap_or_default();
    assert!(
        why.contains("timeout_s: 3"),
        "the error names the deadline: {why}"
    );
    for (eid, end) in [
        (&cancelled, "execution.cancelled"),
        (&timed_out, "execution.failed"),
    ] {
        let events = cluster.settled_events(eid).await;
        let ends = events.iter().filter(|e| e.event_type == end).count();
        assert_eq!(ends, 1, "{eid}: one {end}; events {:?}", types(&events));
    }
    cluster.stop().await;
}

/// An ended execution whose `ctx`, plan and step records were purged:
/// its summary is the one its events give, the same as before the purge,
/// and the records are there again after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_execution_s_summary_after_its_records_were_purged_is_the_events_one() {
    use noetl_mesh::keys::Keys;
    let cluster = Cluster::start().await;
    let eid = cluster.submit(FANOUT, "fanout.yaml", json!({})).await;
    let before = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert!(
        before.ctx.as_object().is_some_and(|c| !c.is_empty()),
        "{before:?}"
    );
    let store = cluster.mesh.exec_kv();
    let mut purged = vec![Keys::plan(&eid)];
    purged.extend(before.steps.keys().map(|s| Keys::step(&eid, s)));
    for key in &purged {
        store.purge(key).await.unwrap();
    }
    cluster.mesh.ctx_kv().purge(&eid).await.unwrap();
    cluster.mesh.plans().forget(&eid);
    let after = cluster.mesh.exec_summary(&eid).await.unwrap().unwrap();
    assert_eq!(after.status, before.status);
    assert_eq!(after.ctx, before.ctx);
    assert_eq!(after.steps, before.steps);
    for key in &purged {
        assert!(
            noetl_mesh::kv::get::<Value>(store, key)
                .await
                .unwrap()
                .is_some(),
            "{key} written back"
        );
    }
    let ctx = noetl_mesh::kv::get::<Value>(cluster.mesh.ctx_kv(), &eid).await;
    assert!(ctx.unwrap().is_some(), "ctx written back");
    cluster.stop().await;
}

/// Purge the header of `eid`, as a storage fault or a hand would.
async fn purge_header(cluster: &Cluster, eid: &str) {
    let key = noetl_mesh::keys::Keys::header(eid);
    cluster.mesh.exec_kv().purge(&key).await.unwrap();
}

/// Run `yaml` (saved as `source`) to its failure; its execution id.
async fn failed_run(cluster: &Cluster, yaml: &str, source: &str) -> String {
    let eid = cluster.submit(yaml, source, json!({})).await;
    let failed = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(
        failed.status,
        noetl_mesh::state::ExecStatus::Failed,
        "{failed:?}"
    );
    eid
}

/// Resume `eid` with `fixed=true` set (the cause of its failure fixed).
async fn resume_fixed(cluster: &Cluster, eid: &str) {
    cluster.resume_set(eid, json!({"fixed": true})).await;
}

const RESUMED_LOOP: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: resumed_loop }
workload: { fixed: false }
workflow:
  - step: start
    loop:
      in: "{{ range(30) | list }}"
      iterator: n
      spec:
        mode: parallel
        max_in_flight: 2
        policy: { reducers: { total: sum, count: sum } }
    tool:
      - name: work
        kind: python
        args: { n: "{{ iter.n }}", fixed: "{{ workload.fixed }}" }
        code: |
          import time
          time.sleep(0.05)
          if int(n) == 3 and str(fixed).lower() != 'true':
              raise RuntimeError('item 3 is bad')
          result = int(n)
        spec:
          policy:
            rules:
              - else: { then: { do: continue, set_ctx: { total: "{{ outcome.result }}", count: 1 } } }
"#;

/// A resumed execution's loop run, which continues the run that stopped,
/// purged from the loop bucket while it runs (with every other loop key
/// of the execution): it is folded back from the events, starting from
/// the stopped run its `loop.started` names, and the loop ends exactly as
/// a clean run (the old fold refused a run started after a resume: the
/// report was dead-lettered and the execution failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_loop_run_purged_while_it_runs_is_folded_from_the_run_it_continues() {
    use noetl_mesh::state::ExecStatus;
    let cluster = Cluster::start().await;
    let eid = failed_run(&cluster, RESUMED_LOOP, "resumed_loop.yaml").await;
    resume_fixed(&cluster, &eid).await;
    // The new run is under way: a few of its iterations started.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let events = cluster.events(&eid).await;
        let resumed = events
            .iter()
            .position(|e| e.event_type == "execution.resumed");
        let started = resumed.map_or(0, |at| {
            events[at..]
                .iter()
                .filter(|e| e.event_type == "loop.iteration.started")
                .count()
        });
        if started >= 4 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new run never ran: {:?}",
            types(&events)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = cluster.mesh.loop_kv();
    let keys = noetl_mesh::kv::keys_under(store, &eid).await.unwrap();
    assert!(!keys.is_empty());
    for key in &keys {
        store.purge(key).await.unwrap();
    }
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["total"], json!(435), "{s:?}");
    assert_eq!(s.ctx["count"], json!(30), "{s:?}");
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}

const SLOW_LAST: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: slow_last }
workload: { log: "" }
workflow:
  - step: start
    loop:
      in: "{{ range(4) | list }}"
      iterator: n
      spec:
        mode: parallel
        max_in_flight: 1
        policy: { reducers: { total: sum } }
    tool:
      - name: work
        kind: python
        args: { n: "{{ iter.n }}", log: "{{ workload.log }}" }
        code: |
          import time
          with open(log, 'a') as f:
              f.write(f"ran {n}\n")
          if int(n) == 3:
              time.sleep(3)
          result = int(n)
        spec:
          policy:
            rules:
              - else: { then: { do: continue, set_ctx: { total: "{{ outcome.result }}" } } }
"#;

/// Iterations whose ends are stored, sent again as a batch (a window sent
/// again, a batch redelivered after an executor's crash) while their loop
/// run is missing from the loop bucket (purged while the loop runs): they
/// run nothing. The executor took a missing run for "nothing counted"
/// and ran them a second time; it now asks the log which ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iterations_sent_again_after_their_loop_run_was_purged_run_nothing() {
    use noetl_mesh::state::ExecStatus;
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("effects.log");
    let eid = cluster
        .submit(SLOW_LAST, "slow_last.yaml", json!({"log": log}))
        .await;
    // 0, 1 and 2 ended (their ends stored) while 3 runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let ends = loop {
        let events = cluster.events(&eid).await;
        let ends: Vec<Event> = (events.iter())
            .filter(|e| e.event_type == EventType::LoopIterationDone.wire_name())
            .cloned()
            .collect();
        if ends.len() == 3 {
            break ends;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first three never ended: {:?}",
            types(&events)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let store = cluster.mesh.loop_kv();
    for key in noetl_mesh::kv::keys_under(store, &eid).await.unwrap() {
        store.purge(&key).await.unwrap();
    }
    let srid = ends[0].step_run_id.clone();
    let batch = (ends.iter().map(|e| codec::json_value(&e.payload_json)))
        .map(|p| {
            let p = p.unwrap();
            noetl_wire::IterationRef {
                loop_run_id: srid.clone(),
                index: p["index"].as_u64().unwrap(),
                iter_json: codec::json_bytes(&p["iter"]),
                total: 4,
                ..Default::default()
            }
        })
        .collect();
    let again = noetl_wire::TaskCommand {
        command_id: format!("{srid}-window-again"),
        execution_id: eid.clone(),
        step: "start".into(),
        step_run_id: srid.clone(),
        attempt: 1,
        args_json: codec::json_bytes(&json!({})),
        trace_id: ends[0].trace_id.clone(),
        batch,
        ..Default::default()
    };
    let ack = cluster
        .mesh
        .publish_command("python", &again)
        .await
        .unwrap();
    ack.wait().await.unwrap();
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["total"], json!(6), "{s:?}");
    // The window sent again is handled (acked) before its effects are read.
    cluster.drained("noetl-executor-python").await;
    assert_eq!(effects(&log), ["ran 0", "ran 1", "ran 2", "ran 3"]);
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}

const RESUMED_JOIN: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: resumed_join }
workload: { fixed: false }
workflow:
  - step: start
    tool: { kind: noop }
    next:
      spec: { mode: inclusive }
      arcs:
        - step: left
          args: { a: 1 }
        - step: right
          args: { b: 2 }
  - step: left
    tool: { kind: noop }
    next: { arcs: [ { step: merge, args: { a: "{{ args.a }}" } } ] }
  - step: right
    tool: { kind: noop }
    next: { arcs: [ { step: merge, args: { b: "{{ args.b }}" } } ] }
  - step: merge
    spec: { join: all }
    tool:
      - name: check
        kind: python
        args: { fixed: "{{ workload.fixed }}", a: "{{ args.a }}", b: "{{ args.b }}" }
        code: |
          if str(fixed).lower() != 'true':
              raise RuntimeError('not yet')
          result = int(a) + int(b)
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: fail }
              - else: { then: { do: continue, set_ctx: { merged: "{{ outcome.result }}" } } }
"#;

/// A join step that failed, resumed: the router gives the stopped firing
/// to the new token in the join's record, so it fires at once with the
/// merged args of both inputs, which do not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_join_fires_with_the_stopped_firing_s_args() {
    resumed_join(false).await;
}

/// The same with the join record purged before the execution is resumed:
/// the resumed token finds the record missing, and the fold of the log
/// gives back the stopped firing as the resume gave it to the new token
/// (`execution.resumed`, then the token's `token.created`), so it fires at
/// once (before, the record was rebuilt without it: the token waited for
/// inputs that had come long ago, and with nothing else live the
/// execution completed, the join step failed and its `ctx` write missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_join_whose_record_was_purged_fires_with_the_stopped_firing_s_args() {
    resumed_join(true).await;
}

async fn resumed_join(purged: bool) {
    use noetl_mesh::{keys::Keys, state::ExecStatus};
    let cluster = Cluster::start().await;
    let eid = failed_run(&cluster, RESUMED_JOIN, "resumed_join.yaml").await;
    let key = Keys::join(&eid, "merge");
    let store = cluster.mesh.exec_kv();
    assert!(noetl_mesh::kv::get::<Value>(store, &key)
        .await
        .unwrap()
        .is_some());
    if purged {
        store.purge(&key).await.unwrap();
    }
    resume_fixed(&cluster, &eid).await;
    let s = cluster.wait(&eid, Duration::from_secs(20)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["merged"], json!(3), "{s:?}");
    let events = cluster.settled_events(&eid).await;
    let left = events
        .iter()
        .filter(|e| e.event_type == "step.started" && e.step == "left")
        .count();
    assert_eq!(left, 1, "the join's inputs did not run again");
    let merged = events
        .iter()
        .filter(|e| e.event_type == "step.started" && e.step == "merge")
        .count();
    assert_eq!(merged, 2, "the join fired again once, for the resume");
    cluster.stop().await;
}

/// A resumed execution cancelled again after its header was purged: the
/// request is the resume's own (its id counts the resume the events
/// give), not a copy of the cancel before the resume that JetStream
/// drops, and the execution ends cancelled (before, the request went
/// nowhere and the step ran on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_execution_cancelled_again_with_its_header_purged_ends_cancelled() {
    use noetl_mesh::{resume::ResumeRequested, state::ExecStatus};
    let cluster = Cluster::start().await;
    let nap = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: long_nap }\nworkflow:\n  - step: start\n    tool:\n      - name: nap\n        kind: python\n        code: \"import time; time.sleep(60); result = 1\"\n";
    let eid = cluster.submit(nap, "long_nap.yaml", json!({})).await;
    let started = |evs: &[Event]| {
        evs.iter()
            .filter(|e| e.event_type == "task.started" || e.event_type == "step.started")
            .count()
    };
    cluster
        .wait_for_event(&eid, "the nap", Duration::from_secs(10), |e| {
            e.event_type == "task.started"
        })
        .await;
    cluster.mesh.request_cancel(&eid, "first").await.unwrap();
    let s = cluster.wait(&eid, Duration::from_secs(20)).await;
    assert_eq!(s.status, ExecStatus::Cancelled, "{s:?}");
    let before = started(&cluster.events(&eid).await);
    cluster
        .mesh
        .resume(&eid, ResumeRequested::default(), Duration::from_secs(10))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while started(&cluster.events(&eid).await) <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "the nap never ran again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    purge_header(&cluster, &eid).await;
    cluster.mesh.request_cancel(&eid, "second").await.unwrap();
    let s = cluster.wait(&eid, Duration::from_secs(20)).await;
    assert_eq!(s.status, ExecStatus::Cancelled, "{s:?}");
    assert_eq!(s.error.as_deref(), Some("cancelled: second"), "{s:?}");
    cluster.stop().await;
}

/// A running execution whose header was purged while a long task runs:
/// its summary (`noetl exec status`, the API) is the fold of its events,
/// running, not "no such execution" until its next event writes the
/// header back; an id with no events is still unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_execution_s_summary_with_its_header_purged_is_the_events_one() {
    use noetl_mesh::state::ExecStatus;
    let cluster = Cluster::start().await;
    let nap = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: short_nap }\nworkflow:\n  - step: start\n    tool:\n      - name: one\n        kind: noop\n        result: 1\n        spec:\n          policy:\n            rules:\n              - else:\n                  then: { do: continue, set_ctx: { one: \"{{ outcome.result }}\" } }\n    next: { arcs: [ { step: nap } ] }\n  - step: nap\n    tool:\n      - name: nap\n        kind: python\n        code: \"import time; time.sleep(3); result = 1\"\n";
    let eid = cluster.submit(nap, "short_nap.yaml", json!({})).await;
    cluster
        .wait_for_event(&eid, "the nap", Duration::from_secs(10), |e| {
            e.event_type == "task.started" && e.step == "nap"
        })
        .await;
    purge_header(&cluster, &eid).await;
    let s = cluster.mesh.exec_summary(&eid).await.unwrap();
    let s = s.expect("a running execution is known from its events");
    assert_eq!(s.status, ExecStatus::Running, "{s:?}");
    assert_eq!(s.ctx["one"], json!(1), "{s:?}");
    assert_eq!(s.steps["start"], "done", "{s:?}");
    assert_eq!(s.steps["nap"], "not_run", "{s:?}");
    // What the API's execution routes read.
    let h = cluster.mesh.header_or_running(&eid).await.unwrap();
    assert_eq!(h.map(|h| h.status), Some(ExecStatus::Running));
    assert!(
        cluster.mesh.exec_header(&eid).await.unwrap().is_none(),
        "read only"
    );
    let unknown = noetl_mesh::ids::new_execution_id();
    assert!(cluster.mesh.exec_summary(&unknown).await.unwrap().is_none());
    assert!(cluster
        .mesh
        .header_or_running(&unknown)
        .await
        .unwrap()
        .is_none());
    let s = cluster.wait(&eid, Duration::from_secs(20)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    cluster.stop().await;
}

const RESUMED_TWICE: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: resumed_twice }
workload: { fixed: false, again: false }
workflow:
  - step: start
    tool:
      - name: first
        kind: python
        args: { fixed: "{{ workload.fixed }}" }
        code: |
          if str(fixed).lower() != 'true':
              raise RuntimeError('not fixed')
          result = 1
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: fail }
              - else: { then: { do: continue, set_ctx: { fixed_seen: "{{ workload.fixed }}" } } }
      - name: again
        kind: python
        args: { again: "{{ workload.again }}", fixed: "{{ workload.fixed }}" }
        code: |
          if str(again).lower() != 'true':
              raise RuntimeError('not again')
          result = str(fixed).lower()
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: fail }
              - else: { then: { do: continue, set_ctx: { second_saw: "{{ outcome.result }}" } } }
"#;

/// An execution resumed with `--set`, failed again, then compacted (every
/// record of it purged): its plan comes back from its events as the
/// resume changed it (the workload `--set` changed, read back from the
/// object store, and the resume's start, from which its deadline counts:
/// a plan rebuilt with the first start would end a resumed execution at
/// its first deadline), so a second resume runs on with it. Before, `execution.resumed` named
/// the change by key only: the plan was not rebuilt and the resume was
/// refused as of an execution that never started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_execution_s_changed_plan_comes_back_from_its_events() {
    use noetl_mesh::state::ExecStatus;
    use noetl_mesh::{keys::Keys, plan::PlanRecord, replay, resume::ResumeRequested};
    let cluster = Cluster::start().await;
    let eid = failed_run(&cluster, RESUMED_TWICE, "resumed_twice.yaml").await;
    let first: PlanRecord = noetl_mesh::kv::get(cluster.mesh.exec_kv(), &Keys::plan(&eid))
        .await
        .unwrap()
        .unwrap();
    resume_fixed(&cluster, &eid).await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    assert_eq!(s.ctx["fixed_seen"], json!(true), "{s:?}");
    // The plan the events name is the stored one: the resume's workload
    // and start (replay compares them).
    cluster.assert_replays(&eid).await;
    let stored: PlanRecord = noetl_mesh::kv::get(cluster.mesh.exec_kv(), &Keys::plan(&eid))
        .await
        .unwrap()
        .unwrap();
    assert!(stored.started_ms > first.started_ms);
    let events = cluster.settled_events(&eid).await;
    let resumed = events.iter().find(|e| e.event_type == "execution.resumed");
    let payload = noetl_mesh::events::payload(resumed.unwrap());
    assert!(payload["workload_ref"].is_object(), "{payload}");
    assert!(
        payload.get("workload").is_none(),
        "values stay out: {payload}"
    );

    // Compacted: every record of it gone.
    let store = cluster.mesh.exec_kv();
    for key in noetl_mesh::kv::keys_under(store, &eid).await.unwrap() {
        store.purge(&key).await.unwrap();
    }
    cluster.mesh.ctx_kv().purge(&eid).await.unwrap();
    cluster.mesh.plans().forget(&eid);
    let folded = replay::fold_log(&cluster.mesh, &eid, replay::Until::End)
        .await
        .unwrap();
    let rebuilt = noetl_mesh::rebuild::plan_of(&cluster.mesh, &eid, &folded)
        .await
        .unwrap()
        .expect("the plan comes back from the events");
    assert_eq!(rebuilt.workload, stored.workload);
    assert_eq!(rebuilt.started_ms, stored.started_ms);

    let mut set = serde_json::Map::new();
    set.insert("again".into(), json!(true));
    let req = ResumeRequested {
        set,
        ..Default::default()
    };
    cluster
        .mesh
        .resume(&eid, req, Duration::from_secs(10))
        .await
        .unwrap();
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["second_saw"], json!("true"), "{s:?}");
    assert_eq!(s.ctx["fixed_seen"], json!(true), "{s:?}");
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}
