//! `kind: playbook`: child executions by catalog path, inline or in loops
//! (nested `iter.parent`), failures reaching the parent's policy.

use std::time::Duration;

use noetl_integration::Cluster;
use noetl_mesh::state::ExecStatus;
use serde_json::json;

/// Looks a city's hotels up: a loop of its own, that sees the parent
/// iteration as `iter.parent`.
const HOTELS: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: hotels, path: demo/hotels }
workflow:
  - step: start
    loop:
      in: "{{ iter.parent.city.hotels }}"
      iterator: hotel
      spec:
        mode: parallel
        max_in_flight: 4
        policy:
          reducers: { rooms: extend }
    tool:
      - name: rooms
        kind: python
        args:
          city: "{{ iter.parent.city.name }}"
          hotel: "{{ iter.hotel }}"
          index: "{{ iter.parent.index }}"
        code: "result = ['%s/%s/%d' % (city, hotel, n) for n in range(2)]"
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { rooms: "{{ outcome.result }}" } }
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
    tool:
      - name: e
        kind: noop
"#;

const CITIES: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: cities }
workload:
  cities:
    - { name: Paris, hotels: [ritz, crillon] }
    - { name: Rome, hotels: [hassler] }
    - { name: Oslo, hotels: [] }
workflow:
  - step: start
    loop:
      in: "{{ workload.cities }}"
      iterator: city
      spec:
        mode: parallel
        max_in_flight: 3
        policy:
          reducers: { rooms: extend, children: append }
    tool:
      - name: hotels
        kind: playbook
        path: demo/hotels
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'ok' }}"
                then:
                  do: continue
                  set_ctx:
                    rooms: "{{ outcome.result.rooms | default([]) }}"
                    children: "{{ outcome.playbook.execution_id }}"
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
    tool:
      - name: e
        kind: noop
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_loops_through_child_playbooks_see_iter_parent() {
    let cluster = Cluster::start().await;
    cluster
        .mesh
        .catalog()
        .register("demo/hotels", "hotels", HOTELS)
        .await
        .unwrap();
    let eid = cluster.submit(CITIES, "cities.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    let mut rooms: Vec<String> = serde_json::from_value(s.ctx["rooms"].clone()).unwrap();
    rooms.sort();
    assert_eq!(
        rooms,
        [
            "Paris/crillon/0",
            "Paris/crillon/1",
            "Paris/ritz/0",
            "Paris/ritz/1",
            "Rome/hassler/0",
            "Rome/hassler/1"
        ]
    );
    // Three children, each recording its parent.
    let children: Vec<String> = serde_json::from_value(s.ctx["children"].clone()).unwrap();
    assert_eq!(children.len(), 3);
    for c in &children {
        let h = cluster.mesh.exec_header(c).await.unwrap().unwrap();
        assert_eq!(h.parent_execution_id, eid);
        assert_eq!(h.status, ExecStatus::Completed);
    }
    // One W3C trace for the whole tree: every event of the parent and of
    // its children carries the same trace id.
    let parent_events = cluster.settled_events(&eid).await;
    let trace = parent_events[0].trace_id.clone();
    assert!(noetl_mesh::ids::is_w3c_trace_id(&trace), "{trace}");
    assert!(parent_events.iter().all(|e| e.trace_id == trace));
    for c in &children {
        let evs = cluster.settled_events(c).await;
        assert!(evs.iter().all(|e| e.trace_id == trace), "child {c}");
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_unknown_child_reaches_the_parent_policy() {
    let cluster = Cluster::start().await;
    let parent = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: parent }
workflow:
  - step: start
    tool:
      - name: bad
        kind: playbook
        playbook: |
          apiVersion: noetl.io/v2
          kind: Playbook
          metadata: { name: boom }
          workflow:
            - step: start
              tool:
                - name: raise
                  kind: python
                  code: "raise ValueError('child broke')"
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then:
                  do: continue
                  set_ctx:
                    kind: "{{ outcome.error.kind }}"
                    message: "{{ outcome.error.message }}"
      - name: missing
        kind: playbook
        path: no/such/playbook
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: continue, set_ctx: { missing: "{{ outcome.error.message }}" } }
"#;
    let eid = cluster.submit(parent, "parent.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["kind"], "playbook.failed");
    let message = s.ctx["message"].as_str().unwrap();
    assert!(message.contains("child broke"), "{message}");
    assert!(message.contains("(boom)"), "{message}");
    let missing = s.ctx["missing"].as_str().unwrap();
    assert!(missing.contains("\"no/such/playbook\""), "{missing}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_cancels_its_children_and_stops_their_work() {
    cancel_parent(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_whose_index_of_children_was_purged_still_cancels_them_from_its_log() {
    cancel_parent(true).await;
}

/// A parent cancelled while its child iterates (its index of children,
/// `<parent>.child.*`, purged first when `purge_index`): the child is
/// cancelled too and stops.
async fn cancel_parent(purge_index: bool) {
    let cluster = Cluster::start().await;
    let parent = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: parent }
workflow:
  - step: start
    tool:
      - name: slow_child
        kind: playbook
        playbook: |
          apiVersion: noetl.io/v2
          kind: Playbook
          metadata: { name: slow }
          workflow:
            - step: start
              loop:
                in: "{{ range(200) | list }}"
                iterator: i
                spec: { mode: sequential }
              tool:
                - name: nap
                  kind: python
                  code: "import time; time.sleep(0.02); result = 1"
      - name: after
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { reached: true } }
"#;
    let eid = cluster.submit(parent, "parent.yaml", json!({})).await;
    // Wait until the child is iterating.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let child = loop {
        let keys = noetl_mesh::kv::keys_under(cluster.mesh.exec_kv(), &format!("{eid}.child"))
            .await
            .unwrap();
        if let Some(k) = keys.first() {
            let child = k.rsplit('.').next().unwrap().to_string();
            let started = cluster
                .events(&child)
                .await
                .iter()
                .filter(|e| e.event_type == "loop.iteration.started")
                .count();
            if started >= 3 {
                break child;
            }
        }
        if std::time::Instant::now() > deadline {
            let all = cluster.events(&eid).await;
            panic!(
                "the child never iterated: keys {keys:?}; parent events {:?}",
                all.iter().map(|e| &e.event_type).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if purge_index {
        let store = cluster.mesh.exec_kv();
        for key in noetl_mesh::kv::keys_under(store, &format!("{eid}.child"))
            .await
            .unwrap()
        {
            store.purge(&key).await.unwrap();
        }
    }
    cluster
        .mesh
        .request_cancel(&eid, "test says stop")
        .await
        .unwrap();
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Cancelled, "{s:?}");
    assert_eq!(s.error.as_deref(), Some("cancelled: test says stop"));
    assert!(s.ctx.get("reached").is_none(), "the parent went on: {s:?}");
    let c = cluster.wait(&child, Duration::from_secs(30)).await;
    assert_eq!(c.status, ExecStatus::Cancelled, "{c:?}");
    assert_eq!(
        c.error.as_deref(),
        Some(format!("cancelled: parent execution {eid} was cancelled").as_str())
    );
    // The child stops iterating: what started stays far below 200.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = |evs: &[noetl_wire::Event]| {
        evs.iter()
            .filter(|e| e.event_type == "loop.iteration.started")
            .count()
    };
    let a = started(&cluster.events(&child).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = started(&cluster.events(&child).await);
    assert_eq!(a, b, "iterations kept starting after the cancel");
    assert!(b < 200, "{b}");
    let events = cluster.settled_events(&eid).await;
    assert!(events.iter().any(|e| e.event_type == "execution.cancelled"));
    cluster.stop().await;
}

/// The cancel race: the parent's cancellation lists its children before a
/// child's request, still in flight, was handled. The child must not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_requested_after_its_parent_was_cancelled_never_runs() {
    let cluster = Cluster::start().await;
    let parent = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: parent }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        code: "import time; time.sleep(1); result = 1"
"#;
    let eid = cluster.submit(parent, "parent.yaml", json!({})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cluster
        .events(&eid)
        .await
        .iter()
        .any(|e| e.event_type == "task.started")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the parent never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.mesh.request_cancel(&eid, "stop").await.unwrap();
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Cancelled, "{s:?}");

    // The request of a child its `playbook` task published just before.
    let child_id = format!("{eid}-late-child");
    let req = noetl_wire::ExecutionRequest {
        execution_id: child_id.clone(),
        parent_execution_id: eid.clone(),
        playbook_yaml: r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: late_child }
workflow:
  - step: start
    tool:
      - name: work
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { ran: true } }
"#
        .into(),
        source_name: "late_child.yaml".into(),
        parent_resume: Some(noetl_wire::TaskCommand {
            command_id: "resume-late".into(),
            execution_id: eid.clone(),
            step: "start".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    cluster
        .mesh
        .publish(
            cluster.mesh.subjects().exec_request(),
            &child_id,
            noetl_mesh::codec::encode(&req),
        )
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let c = cluster.wait(&child_id, Duration::from_secs(30)).await;
    assert_eq!(c.status, ExecStatus::Cancelled, "{c:?}");
    assert_eq!(
        c.error.as_deref(),
        Some(format!("cancelled: parent execution {eid} was cancelled").as_str())
    );
    assert!(c.ctx.get("ran").is_none(), "{c:?}");
    let events = cluster.settled_events(&child_id).await;
    let types = noetl_integration::types(&events);
    assert!(types.contains(&"execution.cancelled"), "{types:?}");
    assert!(
        !types
            .iter()
            .any(|t| t.starts_with("step.") || t.starts_with("task.")),
        "the child ran: {types:?}"
    );
    cluster.stop().await;
}

const LEAF: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: leaf, path: slots/leaf }
workflow:
  - step: start
    tool:
      - name: square
        kind: python
        args: { n: "{{ workload.n }}" }
        code: "result = n * n"
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { square: "{{ outcome.result }}" } }
"#;

const MIDDLE: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: middle, path: slots/middle }
workflow:
  - step: start
    tool:
      - name: before
        kind: python
        code: "result = 1"
      - name: leaf
        kind: playbook
        path: slots/leaf
        args: { n: "{{ workload.n }}" }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { square: "{{ outcome.result.square }}" } }
"#;

/// A `playbook` task waiting on its child holds no executor slot: with one
/// executor per kind and one slot each (`noetl serve executor --kind K
/// --concurrency 1`), three parents' `playbook` tasks wait on children
/// whose own `playbook` tasks need that one playbook slot, and whose
/// python tasks need the one python slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_on_a_child_holds_no_executor_slot() {
    let cluster = Cluster::start_with(noetl_integration::ClusterOptions {
        executors: false,
        ..Default::default()
    })
    .await;
    for kind in ["python", "playbook", "noop"] {
        cluster.spawn_executor_for(&[kind], 1).await;
    }
    for (path, name, yaml) in [
        ("slots/leaf", "leaf", LEAF),
        ("slots/middle", "middle", MIDDLE),
    ] {
        cluster
            .mesh
            .catalog()
            .register(path, name, yaml)
            .await
            .unwrap();
    }
    let parent = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: top }
workflow:
  - step: start
    loop:
      in: [2, 3, 4]
      iterator: n
      spec:
        mode: parallel
        max_in_flight: 3
        policy:
          reducers: { squares: append }
    tool:
      - name: first
        kind: python
        code: "result = 0"
      - name: middle
        kind: playbook
        path: slots/middle
        args: { n: "{{ iter.n }}" }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { squares: "{{ outcome.result.square }}" } }
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
    tool:
      - name: e
        kind: noop
"#;
    let eid = cluster.submit(parent, "top.yaml", json!({})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let h = cluster.mesh.exec_header(&eid).await.unwrap();
        if h.is_some_and(|h| h.status != ExecStatus::Running) {
            break;
        }
        if std::time::Instant::now() > deadline {
            // Where it is stuck: every execution of the tree and its events.
            let mut report = String::new();
            let mut todo = vec![eid.clone()];
            while let Some(e) = todo.pop() {
                let kids =
                    noetl_mesh::kv::keys_under(cluster.mesh.exec_kv(), &format!("{e}.child"))
                        .await
                        .unwrap();
                let evs = cluster.events(&e).await;
                report.push_str(&format!(
                    "\n{e}: {:?}",
                    evs.iter()
                        .map(|x| format!("{} {}/{}", x.event_type, x.step, x.task))
                        .collect::<Vec<_>>()
                ));
                todo.extend(
                    kids.iter()
                        .map(|k| k.rsplit('.').next().unwrap().to_string()),
                );
            }
            panic!("stuck with one slot per kind:{report}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = cluster.wait(&eid, Duration::from_secs(5)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    let mut squares: Vec<i64> = serde_json::from_value(s.ctx["squares"].clone()).unwrap();
    squares.sort();
    assert_eq!(squares, [4, 9, 16]);
    cluster.stop().await;
}

/// NoETL's `return_step` and `timeout` of a `playbook` task: the task's
/// result is the named child step's result; a child past the task's
/// `timeout` is stopped and the task fails with `playbook.failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_step_answers_the_parent_and_timeout_bounds_the_child() {
    let cluster = Cluster::start().await;
    let scorer = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: scorer, path: demo/scorer }
workload: { years: 0 }
workflow:
  - step: start
    tool:
      - name: compute
        kind: python
        args: { years: "{{ workload.years }}" }
        code: "result = {'score': years * 10}"
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { seen: true } }
    next:
      arcs:
        - step: finish
  - step: finish
    tool:
      - name: shape
        kind: python
        args: { s: "{{ start.score }}" }
        code: "result = {'profile_score': s}"
  - step: never
"#;
    cluster
        .mesh
        .catalog()
        .register("demo/scorer", "scorer", scorer)
        .await
        .unwrap();
    let parent = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: parent }
workflow:
  - step: start
    tool:
      - name: score
        kind: playbook
        path: demo/scorer
        return_step: finish
        args: { years: 4 }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { score: "{{ outcome.result }}" } }
      - name: whole
        kind: playbook
        path: demo/scorer
        args: { years: 1 }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { whole: "{{ outcome.result }}" } }
      - name: unrun
        kind: playbook
        path: demo/scorer
        return_step: never
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { unrun: "{{ outcome.result }}" } }
      - name: slow
        kind: playbook
        timeout: 1
        playbook: |
          apiVersion: noetl.io/v2
          kind: Playbook
          metadata: { name: sleeper }
          workflow:
            - step: start
              tool:
                - name: nap
                  kind: python
                  code: "import time; time.sleep(60); result = 1"
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then:
                  do: continue
                  set_ctx:
                    slow_kind: "{{ outcome.error.kind }}"
                    slow_message: "{{ outcome.error.message }}"
                    slow_child: "{{ outcome.playbook.execution_id }}"
"#;
    let eid = cluster.submit(parent, "parent.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(90)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["score"], json!({"profile_score": 40}));
    assert_eq!(s.ctx["whole"], json!({"seen": true}), "no return_step: ctx");
    assert_eq!(s.ctx["unrun"], json!(null), "a step that never ran: null");
    assert_eq!(s.ctx["slow_kind"], "playbook.failed");
    let message = s.ctx["slow_message"].as_str().unwrap();
    assert!(message.contains("timeout"), "{message}");
    assert!(message.contains("timeout_s: 1"), "{message}");
    let child = s.ctx["slow_child"].as_str().unwrap();
    let c = cluster.wait(child, Duration::from_secs(30)).await;
    assert_eq!(c.status, ExecStatus::Failed, "{c:?}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_continuation_was_purged_still_answers_its_parent_from_the_log() {
    use noetl_mesh::{event_type::EventType, keys::Keys, kv};
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let parent = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: asks_a_child }
workflow:
  - step: start
    tool:
      - name: ask
        kind: playbook
        playbook: |
          apiVersion: noetl.io/v2
          kind: Playbook
          metadata: { name: waits_for_go }
          workflow:
            - step: start
              tool:
                - name: hold
                  kind: wait
                  signal: go
                  spec:
                    policy:
                      rules:
                        - else:
                            then: { do: continue, set_ctx: { got: "{{ outcome.result.n }}" } }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { answer: "{{ outcome.result.got }}" } }
"#;
    let eid = cluster.submit(parent, "asks_a_child.yaml", json!({})).await;
    // The child, once it waits.
    let mut child = None;
    for _ in 0..500 {
        let keys = kv::keys_under(mesh.exec_kv(), &Keys::children(&eid))
            .await
            .unwrap();
        child = keys
            .iter()
            .find_map(|k| Keys::child_of(&eid, k).map(str::to_string));
        if child.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let child = child.expect("the parent started its child");
    cluster
        .wait_for_event(&child, "the child to wait", Duration::from_secs(30), |e| {
            e.event_type == EventType::WaitStarted.wire_name()
        })
        .await;
    // Its first event carries the parent's continuation.
    let events = cluster.events(&child).await;
    let init = noetl_mesh::events::payload(&events[0]);
    assert_eq!(events[0].event_type, "playbook.initialized");
    assert!(init["parent_command"].is_string(), "{init}");
    assert_eq!(init["parent_execution_id"], eid.as_str());

    // The record the router resumes the parent from is lost.
    mesh.exec_kv().purge(Keys::resume(&child)).await.unwrap();
    let delivered = mesh.signal(&child, "go", json!({"n": 7}), "test").await;
    assert!(delivered.is_ok(), "{delivered:?}");

    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    assert_eq!(s.ctx["answer"], json!(7));
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}
