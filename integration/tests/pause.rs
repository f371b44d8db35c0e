//! Pause and unpause on a real mesh: a paused execution starts no new
//! step and dispatches no new loop iteration while what runs finishes;
//! unpausing releases what the pause held, and the execution ends as a
//! clean run does, every iteration counted once.

use std::time::Duration;

use noetl_integration::{types, Cluster, ClusterOptions, NAP_IN_THE_MIDDLE};
use noetl_mesh::event_type::EventType;
use noetl_mesh::keys::Keys;
use noetl_mesh::kv;
use noetl_mesh::state::ExecStatus;
use noetl_wire::Event;
use serde_json::json;

const CHAIN: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: pause_chain }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(1.0)
          result = 'rested'
    next:
      arcs:
        - step: second
  - step: second
    tool:
      - { name: n, kind: noop }
"#;

const LOOP: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: pause_loop }
workflow:
  - step: start
    loop:
      in: "{{ range(30) | list }}"
      iterator: i
      spec: { mode: parallel, max_in_flight: 3 }
    tool:
      - name: work
        kind: python
        args: { i: "{{ iter.i }}" }
        code: |
          import time
          time.sleep(0.1)
          result = i
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
"#;

fn count(events: &[Event], kind: &str) -> usize {
    events.iter().filter(|e| e.event_type == kind).count()
}

fn position(events: &[Event], kind: &str, step: &str) -> Option<usize> {
    events
        .iter()
        .position(|e| e.event_type == kind && (step.is_empty() || e.step == step))
}

/// Once `start`'s nap ends in the paused chain, the token of `second` is
/// held (one held key) and `second` does not start.
async fn second_is_held_not_started(cluster: &Cluster, eid: &str) {
    cluster
        .wait_for_event(eid, "the nap to end", Duration::from_secs(30), |e| {
            e.event_type == EventType::StepDone.wire_name() && e.step == "start"
        })
        .await;
    let store = cluster.mesh.exec_kv();
    let mut held = Vec::new();
    for _ in 0..200 {
        held = kv::keys_under(store, &Keys::held_all(eid)).await.unwrap();
        if !held.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held.len(), 1, "the token of `second` is held: {held:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = cluster.events(eid).await;
    assert_eq!(
        position(&events, EventType::StepStarted.wire_name(), "second"),
        None,
        "{:?}",
        types(&events)
    );
}

/// The chain started and paused (with `reason`) while its first task naps.
async fn chain_paused_mid_nap(cluster: &Cluster, reason: &str) -> String {
    let eid = cluster.submit(CHAIN, "pause_chain.yaml", json!({})).await;
    cluster
        .wait_for_event(&eid, "the nap to start", Duration::from_secs(30), |e| {
            e.event_type == EventType::TaskStarted.wire_name()
        })
        .await;
    assert!(cluster.mesh.pause(&eid, "test", reason).await.unwrap());
    eid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_execution_starts_no_step_until_unpaused() {
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let eid = chain_paused_mid_nap(&cluster, "maintenance").await;
    assert!(
        !mesh.pause(&eid, "test", "again").await.unwrap(),
        "paused once"
    );

    // What runs finishes; the next step's token is held, not started.
    second_is_held_not_started(&cluster, &eid).await;
    let store = mesh.exec_kv();
    let header = mesh.exec_header(&eid).await.unwrap().unwrap();
    assert_eq!(header.status, ExecStatus::Running);

    // Unpause: the token goes on, the execution completes.
    assert_eq!(mesh.unpause(&eid, "test").await.unwrap(), 1);
    let done = cluster.wait(&eid, Duration::from_secs(30)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(done.status, ExecStatus::Completed);
    assert!(kv::keys_under(store, &Keys::held_all(&eid))
        .await
        .unwrap()
        .is_empty());
    let events = cluster.settled_events(&eid).await;
    let paused =
        position(&events, EventType::ExecutionPaused.wire_name(), "").expect("execution.paused");
    let unpaused = position(&events, EventType::ExecutionUnpaused.wire_name(), "")
        .expect("execution.unpaused");
    let second =
        position(&events, EventType::StepStarted.wire_name(), "second").expect("second started");
    assert!(
        paused < unpaused && unpaused < second,
        "{:?}",
        types(&events)
    );
    assert_eq!(count(&events, EventType::ExecutionPaused.wire_name()), 1);
    // Unpausing again finds nothing to release and says nothing.
    assert_eq!(mesh.unpause(&eid, "test").await.unwrap(), 0);
    cluster.stop().await;
}

/// An unpause that stopped after its event and the pause record's removal,
/// before it published what the pause held (its publish failed, or its
/// process stopped): the held token's record stays until it went out, so
/// the unpause asked again releases it, and the execution completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpause_stopped_before_its_release_releases_it_when_asked_again() {
    use noetl_mesh::events::EventDraft;
    use noetl_mesh::pause::{PauseChanged, Unpaused};
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let eid = chain_paused_mid_nap(&cluster, "maintenance").await;
    second_is_held_not_started(&cluster, &eid).await;
    // What the unpause did before its release: the event, the record gone.
    let unpaused = EventDraft {
        execution_id: &eid,
        discriminator: "stopped-unpause",
        ..EventDraft::default()
    }
    .build(&Unpaused(PauseChanged {
        by: "test".into(),
        reason: String::new(),
        released: Some(1),
    }));
    mesh.emit(&unpaused).await.unwrap().wait().await.unwrap();
    mesh.exec_kv().delete(Keys::paused(&eid)).await.unwrap();
    // Asked again: the token still held goes out, once.
    assert_eq!(mesh.unpause(&eid, "test").await.unwrap(), 1);
    let done = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(done.status, ExecStatus::Completed, "{done:?}");
    let events = cluster.settled_events(&eid).await;
    assert_eq!(
        events
            .iter()
            .filter(|e| e.event_type == EventType::StepStarted.wire_name() && e.step == "second")
            .count(),
        1,
        "{:?}",
        types(&events)
    );
    assert!(kv::keys_under(mesh.exec_kv(), &Keys::held_all(&eid))
        .await
        .unwrap()
        .is_empty());
    cluster.stop().await;
}

/// `pause_chain` with a third step that naps: the execution still runs
/// after `second`.
const CHAIN3: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: pause_chain3 }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(1.0)
          result = 'rested'
    next:
      arcs:
        - step: second
  - step: second
    tool:
      - { name: n, kind: noop }
    next:
      arcs:
        - step: third
  - step: third
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(2.0)
          result = 'rested'
"#;

/// A release cut short after its publish and before its delete leaves
/// the held token's record behind though the token went out and its
/// step-run started. The next unpause (here at once; it may come days
/// later, past JetStream's duplicate window, where a publish would start
/// the step-run a second time) removes the record and publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_record_left_by_a_release_cut_short_is_not_published_again() {
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let store = mesh.exec_kv();
    let eid = cluster.submit(CHAIN3, "pause_chain3.yaml", json!({})).await;
    cluster
        .wait_for_event(&eid, "the nap to start", Duration::from_secs(30), |e| {
            e.event_type == EventType::TaskStarted.wire_name()
        })
        .await;
    assert!(mesh.pause(&eid, "test", "").await.unwrap());
    second_is_held_not_started(&cluster, &eid).await;
    let key = kv::keys_under(store, &Keys::held_all(&eid)).await.unwrap()[0].clone();
    let held = store.get(&key).await.unwrap().expect("the held token");
    assert_eq!(mesh.unpause(&eid, "test").await.unwrap(), 1);
    cluster
        .wait_for_event(&eid, "`third` to start", Duration::from_secs(30), |e| {
            e.event_type == EventType::TaskStarted.wire_name() && e.step == "third"
        })
        .await;

    // What the cut-short release left: the record, its token handled.
    store.put(&key, held).await.unwrap();
    assert!(mesh.pause(&eid, "test", "").await.unwrap());
    assert_eq!(
        mesh.unpause(&eid, "test").await.unwrap(),
        0,
        "nothing published again"
    );
    assert!(kv::keys_under(store, &Keys::held_all(&eid))
        .await
        .unwrap()
        .is_empty());
    let done = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(done.status, ExecStatus::Completed, "{done:?}");
    let events = cluster.settled_events(&eid).await;
    assert_eq!(
        events
            .iter()
            .filter(|e| e.event_type == EventType::StepStarted.wire_name() && e.step == "second")
            .count(),
        1,
        "{:?}",
        types(&events)
    );
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_record_purged_while_paused_is_written_back_and_holds_still() {
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let eid = chain_paused_mid_nap(&cluster, "maintenance").await;
    // An operator's purge of the record (not an unpause): the services
    // that follow it see the purge, read the log and write it back.
    let store = mesh.exec_kv();
    store.purge(Keys::paused(&eid)).await.unwrap();
    let mut back = None;
    for _ in 0..250 {
        back = mesh.pause_record(&eid).await.unwrap();
        if back.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let back = back.expect("the pause record is written back from the events");
    assert_eq!(
        (back.by.as_str(), back.reason.as_str()),
        ("test", "maintenance")
    );

    // Still paused: the next step's token is held, not started.
    second_is_held_not_started(&cluster, &eid).await;

    // Unpausing deletes it (no write-back) and the execution completes.
    assert_eq!(mesh.unpause(&eid, "test").await.unwrap(), 1);
    let done = cluster.wait(&eid, Duration::from_secs(30)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(done.status, ExecStatus::Completed);
    assert_eq!(mesh.pause_record(&eid).await.unwrap(), None);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_token_purged_while_paused_is_published_again_from_the_log_at_the_unpause() {
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let eid = chain_paused_mid_nap(&cluster, "").await;
    second_is_held_not_started(&cluster, &eid).await;
    // The held token's record is lost: nothing in KV says `second` waits.
    let store = mesh.exec_kv();
    for key in kv::keys_under(store, &Keys::held_all(&eid)).await.unwrap() {
        store.purge(&key).await.unwrap();
    }
    assert!(kv::keys_under(store, &Keys::held_all(&eid))
        .await
        .unwrap()
        .is_empty());

    // The unpause finds it in the log (live, never scheduled) and
    // publishes it again: the execution completes, `second` ran once.
    assert_eq!(mesh.unpause(&eid, "test").await.unwrap(), 1);
    let done = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(done.status, ExecStatus::Completed);
    let events = cluster.events(&eid).await;
    let second_started = events
        .iter()
        .filter(|e| e.event_type == EventType::StepStarted.wire_name() && e.step == "second")
        .count();
    assert_eq!(second_started, 1, "{:?}", types(&events));
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}

/// Paused and unpaused while a step-run runs, the execution starts it no
/// second time: the step-runs the router starts itself (their
/// `step.started` carried in `next.selected`) and the entry's (carried in
/// `token.created`) are started, though no `step.*` event of theirs is
/// stored on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpause_while_a_step_runs_starts_it_no_second_time() {
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    for (yaml, step) in [(NAP_IN_THE_MIDDLE, "nap"), (CHAIN, "start")] {
        let eid = cluster.submit(yaml, "pause.yaml", json!({})).await;
        cluster
            .wait_for_event(&eid, "the nap to start", Duration::from_secs(30), |e| {
                e.event_type == EventType::TaskStarted.wire_name() && e.step == step
            })
            .await;
        assert!(mesh.pause(&eid, "test", "").await.unwrap());
        // Nothing was held, and nothing is owed: the step runs on.
        assert_eq!(mesh.unpause(&eid, "test").await.unwrap(), 0, "{step}");
        let done = cluster.wait(&eid, Duration::from_secs(30)).await;
        assert_eq!(done.status, ExecStatus::Completed);
        let events = cluster.settled_events(&eid).await;
        let started = events
            .iter()
            .filter(|e| e.event_type == EventType::StepStarted.wire_name() && e.step == step)
            .count();
        assert_eq!(started, 1, "{step}: {:?}", types(&events));
        cluster.assert_replays(&eid).await;
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_loop_dispatches_no_iteration_until_unpaused_and_counts_each_once() {
    paused_loop(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_loop_window_purged_while_paused_is_released_from_its_run_record() {
    paused_loop(true).await;
}

/// A loop paused mid-way and unpaused (its held window's record purged
/// first when `purge_held`): each of its 30 iterations done once.
async fn paused_loop(purge_held: bool) {
    let cluster = Cluster::start_with(ClusterOptions {
        concurrency: 8,
        ..Default::default()
    })
    .await;
    let mesh = cluster.mesh.clone();
    let eid = cluster.submit(LOOP, "pause_loop.yaml", json!({})).await;
    cluster
        .wait_for_event(&eid, "an iteration to end", Duration::from_secs(30), |e| {
            e.event_type == EventType::LoopIterationDone.wire_name()
        })
        .await;
    mesh.pause(&eid, "test", "").await.unwrap();
    // The iterations in flight finish; then nothing more starts.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let before = count(
        &cluster.events(&eid).await,
        EventType::LoopIterationStarted.wire_name(),
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let events = cluster.events(&eid).await;
    let after = count(&events, EventType::LoopIterationStarted.wire_name());
    assert_eq!(before, after, "no iteration dispatched while paused");
    assert!(after < 30, "the loop was paused before its end: {after}");
    assert_eq!(count(&events, EventType::LoopDone.wire_name()), 0);

    if purge_held {
        // The held window's record is lost: the loop run's record still
        // lists the iterations held, and the unpause releases them.
        let store = mesh.exec_kv();
        let held = kv::keys_under(store, &Keys::held_all(&eid)).await.unwrap();
        assert!(!held.is_empty(), "the loop's window is held");
        for key in held {
            store.purge(&key).await.unwrap();
        }
    }
    assert!(mesh.unpause(&eid, "test").await.unwrap() >= 1);
    let done = cluster.wait(&eid, Duration::from_secs(60)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(done.status, ExecStatus::Completed);
    let events = cluster.settled_events(&eid).await;
    let mut finished: Vec<u64> = events
        .iter()
        .filter(|e| e.event_type == EventType::LoopIterationDone.wire_name())
        .map(|e| noetl_mesh::events::payload(e)["index"].as_u64().unwrap())
        .collect();
    finished.sort_unstable();
    finished.dedup();
    assert_eq!(
        finished,
        (0..30).collect::<Vec<u64>>(),
        "every iteration done"
    );
    assert_eq!(count(&events, EventType::LoopDone.wire_name()), 1);
    cluster.stop().await;
}
