//! The event log is the truth: folding an execution's events gives every
//! record the engine keeps for it (header, step records, `ctx`), large
//! `ctx` values and reducer results included, and a record changed behind
//! the engine's back is reported with the event that should have produced
//! it (docs/architecture.md "The event log").

use noetl_integration::Cluster;
use noetl_mesh::{
    event_type::EventType,
    keys::Keys,
    kv,
    payloads::{self, LoopDone, PlaybookInitialized, TaskDone},
    state::StepRecord,
};
use noetl_wire::Event;
use serde_json::{json, Value};

const FLOW: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: replayed }
workload: { n: 4 }
workflow:
  - step: start
    tool:
      - name: big
        kind: python
        code: |
          result = "x" * 6000
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { blob: "{{ outcome.result }}", small: 1 } }
    next:
      arcs:
        - step: squares
          set_ctx: { routed: "{{ workload.n }}" }
  - step: squares
    loop:
      in: "{{ range(workload.n) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 2
        policy: { reducers: { total: sum, seen: append } }
    tool:
      - name: sq
        kind: python
        args: { i: "{{ iter.i }}" }
        code: |
          result = i * i
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { total: "{{ outcome.result }}", seen: "{{ iter.i }}" } }
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_replays_equal_and_a_changed_record_is_named_with_its_event() {
    let cluster = Cluster::start().await;
    let (eid, summary) = cluster.completed(FLOW, Value::Null).await;
    assert_eq!(summary.ctx["total"], json!(14));
    assert_eq!(summary.ctx["blob"].as_str().map(str::len), Some(6000));
    let events = cluster.settled_events(&eid).await;

    // The log carries what it changes whole: the plan and workload in the
    // first event, the large patch by reference (never a preview), the
    // reducer results in `loop.done`.
    let init = events
        .iter()
        .find(|e| e.event_type == EventType::PlaybookInitialized.wire_name())
        .expect("playbook.initialized");
    let init: PlaybookInitialized = payloads::decode_typed(init).unwrap();
    assert_eq!(init.workload, json!({"n": 4}));
    let plan = init.plan.expect("the plan's identity");
    assert!(plan.digest.starts_with("sha256:"), "{}", plan.digest);
    let stored_plan = cluster.mesh.plans().get(&cluster.mesh, &eid).await.unwrap();
    assert_eq!(
        plan.digest,
        noetl_mesh::patches::digest(&stored_plan.playbook)
    );
    let big = events
        .iter()
        .filter(|e| e.event_type == EventType::TaskDone.wire_name() && e.step == "start")
        .map(|e| payloads::decode_typed::<TaskDone>(e).unwrap())
        .next()
        .expect("task.done of start");
    assert!(big.set_ctx.is_none(), "a large patch is not inline");
    let whole: Value =
        noetl_mesh::patches::read(cluster.mesh.results(), big.set_ctx_ref.as_ref().unwrap())
            .await
            .unwrap();
    assert_eq!(whole["blob"].as_str().map(str::len), Some(6000));
    let done = events
        .iter()
        .find(|e| e.event_type == EventType::LoopDone.wire_name())
        .expect("loop.done");
    let done: LoopDone = payloads::decode_typed(done).unwrap();
    let keys: Vec<&str> = done.reduce.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["total", "seen"]);
    let sq_done = events
        .iter()
        .filter(|e| e.event_type == EventType::TaskDone.wire_name() && e.step == "squares")
        .map(|e| payloads::decode_typed::<TaskDone>(e).unwrap())
        .next()
        .unwrap();
    assert_eq!(
        sq_done.reduced.len(),
        2,
        "reducer keys are marked, not applied"
    );

    // Folded, the events give exactly what KV holds.
    let report = cluster.replay(&eid).await;
    assert!(report.equal, "{:?}", report.differences);
    assert!(report.events >= events.len());

    // A ctx value changed behind the engine's back is named, with the
    // loop.done that gave it.
    let mut ctx: Value = kv::get(cluster.mesh.ctx_kv(), &eid).await.unwrap().unwrap();
    ctx["total"] = json!(15);
    kv::put(cluster.mesh.ctx_kv(), &eid, &ctx).await.unwrap();
    let report = cluster.replay(&eid).await;
    assert_eq!(report.differences.len(), 1, "{:?}", report.differences);
    let d = &report.differences[0];
    assert_eq!(d.what, "ctx.total");
    assert_eq!(
        (d.from_events.clone(), d.stored.clone()),
        (json!(14), json!(15))
    );
    let origin = d.event.as_ref().expect("the event that gave it");
    assert_eq!(
        (origin.event_type.as_str(), origin.step.as_str()),
        ("loop.done", "squares")
    );

    // So is a step record, with its boundary event.
    ctx["total"] = json!(14);
    kv::put(cluster.mesh.ctx_kv(), &eid, &ctx).await.unwrap();
    let key = Keys::step(&eid, "start");
    let mut rec: StepRecord = kv::get(cluster.mesh.exec_kv(), &key)
        .await
        .unwrap()
        .unwrap();
    rec.last_step_run_id = "forged".into();
    kv::put(cluster.mesh.exec_kv(), &key, &rec).await.unwrap();
    let report = cluster.replay(&eid).await;
    let what: Vec<&str> = report.differences.iter().map(|d| d.what.as_str()).collect();
    assert_eq!(what, ["step \"start\""]);
    let origin = report.differences[0].event.as_ref().unwrap();
    assert_eq!(origin.event_type, EventType::StepDone.wire_name());
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_replays_with_its_stopped_tokens_and_the_state_at_any_event() {
    let cluster = Cluster::start().await;
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: fails }
workflow:
  - step: start
    tool:
      - name: one
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { first: 1 } }
    next:
      arcs:
        - step: boom
  - step: boom
    tool:
      - name: raise
        kind: python
        code: |
          raise ValueError("no")
"#;
    let eid = cluster.submit(yaml, "fails.yaml", Value::Null).await;
    let summary = cluster.wait(&eid, std::time::Duration::from_secs(30)).await;
    assert_eq!(summary.status, noetl_mesh::state::ExecStatus::Failed);
    let report = cluster.replay(&eid).await;
    assert!(report.equal, "{:?}", report.differences);
    let header = cluster.mesh.exec_header(&eid).await.unwrap().unwrap();
    assert_eq!(
        header.stopped.len(),
        1,
        "the failing step-run stays stopped"
    );

    // As of the event that wrote `first`, only `start` has run.
    let log = noetl_mesh::replay::read_log(&cluster.mesh, &eid, Default::default())
        .await
        .unwrap();
    let at = log
        .iter()
        .find(|l| l.event.event_type == EventType::TaskDone.wire_name())
        .unwrap()
        .seq;
    let then =
        noetl_mesh::replay::fold_log(&cluster.mesh, &eid, noetl_mesh::replay::Until::Seq(at))
            .await
            .unwrap();
    assert_eq!(Value::Object(then.ctx.clone()), json!({"first": 1}));
    assert!(then.steps.is_empty(), "no step had ended yet");
    assert_eq!(
        then.header.unwrap().status,
        noetl_mesh::state::ExecStatus::Running
    );
    cluster.stop().await;
}

/// The router's check for a boundary's answer in the log (read when a
/// redelivered boundary finds nothing of its own live: did the delivery
/// that wrote the header store its `next.selected` before it stopped?)
/// finds the answer to that step-run's end, not the `step.started` the
/// router's answer to the step before carries for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boundary_is_answered_by_its_own_next_selected_not_by_the_start_it_carries() {
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let eid = cluster
        .submit(
            noetl_integration::NAP_IN_THE_MIDDLE,
            "answered.yaml",
            json!({}),
        )
        .await;
    let events = cluster
        .wait_for_event(
            &eid,
            "the nap to start",
            std::time::Duration::from_secs(30),
            |e| e.event_type == EventType::TaskStarted.wire_name() && e.step == "nap",
        )
        .await;
    let of = |step: &str| {
        events
            .iter()
            .find(|e| e.event_type == EventType::StepStarted.wire_name() && e.step == step)
            .map(|e| e.step_run_id.clone())
            .unwrap_or_else(|| panic!("{step} started"))
    };
    let (start, nap) = (of("start"), of("nap"));
    assert!(mesh.boundary_answered(&eid, &start).await.unwrap());
    assert!(
        !mesh.boundary_answered(&eid, &nap).await.unwrap(),
        "nap runs: its end is not answered yet"
    );
    let done = cluster.wait(&eid, std::time::Duration::from_secs(30)).await;
    assert_eq!(done.status, noetl_mesh::state::ExecStatus::Completed);
    assert!(mesh.boundary_answered(&eid, &nap).await.unwrap());
    cluster.stop().await;
}

/// A log longer than the fold reads at once (a thousand stored messages,
/// `replay::LogReader`) folds to what the whole log, read and unfolded
/// at once, folds to: up to its end and up to an event in its middle; the
/// log read a chunk at a time (`read_log`) gives one whole read's events,
/// in its order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_read_in_chunks_folds_as_the_whole_log_read_at_once() {
    use noetl_mesh::fold::Folded;
    use noetl_mesh::replay::{fold_log, hydrated_log, read_log, read_stored_log, Until};
    let cluster = Cluster::start().await;
    // One iteration at a time: each its own batch, about two stored
    // messages an iteration.
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: long_log }
workflow:
  - step: each
    loop:
      in: "{{ range(1500) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 1
        policy: { reducers: { total: sum } }
    tool:
      - name: one
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { total: 1 } }
"#;
    let eid = cluster.submit(yaml, "long_log.yaml", Value::Null).await;
    let summary = cluster
        .wait(&eid, std::time::Duration::from_secs(120))
        .await;
    assert_eq!(summary.status, noetl_mesh::state::ExecStatus::Completed);
    let stored = read_stored_log(&cluster.mesh, &eid).await.unwrap();
    assert!(stored.len() > 2_000, "{} messages stored", stored.len());
    let (mesh, id) = (&cluster.mesh, eid.as_str());
    let whole = |until| async move {
        let log = hydrated_log(mesh, id, until).await.unwrap();
        Folded::of(log.iter().map(|l| (l.seq, &l.event))).unwrap()
    };
    let folded = fold_log(&cluster.mesh, &eid, Until::End).await.unwrap();
    assert_eq!(folded.ctx.get("total"), Some(&json!(1500)));
    assert_eq!(folded, whole(Until::End).await);
    let middle = stored[stored.len() / 2 + 7].seq;
    assert_eq!(
        fold_log(&cluster.mesh, &eid, Until::Seq(middle))
            .await
            .unwrap(),
        whole(Until::Seq(middle)).await
    );
    // Read event by event, a chunk at a time: the events of one read of
    // the whole log, in its order.
    let whole_read = mesh
        .stored_events_from(&mesh.subjects().events_of(id), None)
        .await
        .unwrap();
    let read = read_log(mesh, id, Until::End).await.unwrap();
    assert_eq!(read.len(), whole_read.len());
    for (a, (seq, event)) in read.iter().zip(&whole_read) {
        assert_eq!((a.seq, &a.event), (*seq, event.as_ref().unwrap()));
    }
    // Through a sequence past the first chunk: the events up to it, each
    // of its message's.
    let mut through = noetl_mesh::replay::LogReader::of(mesh, id).through(middle);
    let mut upto = Vec::new();
    while let Some(l) = through.next().await.unwrap() {
        upto.push(l.seq);
    }
    let expected: Vec<u64> = read
        .iter()
        .map(|l| l.seq)
        .filter(|s| *s <= middle)
        .collect();
    assert_eq!(upto, expected);
    // Only the messages of a type never carried, passed over unfolded
    // otherwise: the events of that type of the whole read, and the read
    // ends where it does.
    let mut starts = noetl_mesh::replay::LogReader::of(mesh, id)
        .stored_where(|e| e.event_type == EventType::LoopStarted.wire_name());
    let mut given = Vec::new();
    while let Some(l) = starts.next().await.unwrap() {
        given.push((l.seq, l.event));
    }
    let expected: Vec<(u64, Event)> = (read.iter())
        .filter(|l| l.event.event_type == EventType::LoopStarted.wire_name())
        .map(|l| (l.seq, l.event.clone()))
        .collect();
    assert_eq!(given.len(), 1);
    assert_eq!(given, expected);
    assert_eq!(starts.read_through(), read.last().unwrap().seq);
    let report = cluster.replay(&eid).await;
    assert!(report.equal, "{:?}", report.differences);
    cluster.stop().await;
}

/// A playbook of one noop step.
const ONE_NOOP: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: one_noop }
workflow:
  - step: start
    tool:
      - name: one
        kind: noop
"#;

/// A request whose earlier delivery stored its plan and then stopped
/// before its header (or is still running beside this one) starts from
/// that plan: the first start time stands in the plan, the header and the
/// events, so the log replays equal (the fault campaign once found a plan
/// started 149 ms after its `playbook.initialized`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_starts_from_the_plan_an_earlier_delivery_of_it_stored() {
    let cluster = Cluster::start().await;
    let yaml = ONE_NOOP;
    // The plan a first delivery of the request made, 5 s ago: the plan of
    // another execution of the playbook, under the new id.
    let done = cluster.submit(yaml, "planned.yaml", Value::Null).await;
    cluster
        .wait(&done, std::time::Duration::from_secs(30))
        .await;
    let mut plan: Value = kv::get(cluster.mesh.exec_kv(), &Keys::plan(&done))
        .await
        .unwrap()
        .unwrap();
    let eid = noetl_mesh::ids::new_execution_id();
    let first = noetl_mesh::events::now_ms() - 5_000;
    plan["execution_id"] = json!(eid);
    plan["started_ms"] = json!(first);
    kv::put(cluster.mesh.exec_kv(), &Keys::plan(&eid), &plan)
        .await
        .unwrap();
    cluster
        .submit_as(&eid, yaml, "planned.yaml", Value::Null)
        .await;
    let summary = cluster.wait(&eid, std::time::Duration::from_secs(30)).await;
    assert_eq!(summary.status, noetl_mesh::state::ExecStatus::Completed);
    let stored: Value = kv::get(cluster.mesh.exec_kv(), &Keys::plan(&eid))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored["started_ms"], json!(first), "the first plan stands");
    let header = cluster.mesh.exec_header(&eid).await.unwrap().unwrap();
    assert_eq!(
        noetl_mesh::events::ms_of_rfc3339(&header.started_at),
        Some(first)
    );
    let report = cluster.replay(&eid).await;
    assert!(report.equal, "{:?}", report.differences);
    cluster.stop().await;
}

/// Whether the log holds an execution (`Mesh::in_log`, what a request
/// under a chosen id asks first): not for an id never used, nor for one
/// with only an audit record or a signal under it; from its start on, and
/// still when a later event that says nothing of a start is its last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_holds_an_execution_from_its_start_and_not_for_other_events_under_its_id() {
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let signal = |eid: &str| {
        noetl_mesh::events::EventDraft {
            execution_id: eid,
            discriminator: "go",
            ..Default::default()
        }
        .build(&noetl_mesh::waiter::SignalReceived {
            signal: "go".into(),
            by: "test".into(),
            task_run_id: String::new(),
        })
    };
    assert!(!mesh.in_log("never-used").await.unwrap());
    let audit = noetl_mesh::audit::Audit {
        principal: "test".into(),
        role: "local".into(),
        action: "execution.cancel".into(),
        object: "audited-only".into(),
        outcome: "no such execution".into(),
    };
    mesh.audit(Some("audited-only"), &audit).await.unwrap();
    assert!(!mesh.in_log("audited-only").await.unwrap());
    mesh.emit(&signal("signalled-only"))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert!(!mesh.in_log("signalled-only").await.unwrap());

    let eid = cluster.submit(ONE_NOOP, "held.yaml", Value::Null).await;
    cluster.wait(&eid, std::time::Duration::from_secs(30)).await;
    assert!(mesh.in_log(&eid).await.unwrap());
    mesh.emit(&signal(&eid))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert!(
        mesh.in_log(&eid).await.unwrap(),
        "a signal stored after its end leaves it in the log"
    );
    cluster.stop().await;
}
