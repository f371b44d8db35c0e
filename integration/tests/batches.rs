//! Loop windows in batches (docs/architecture.md "Loop windows in
//! batches"): a window's iterations go out as one command and come back as
//! one report, the log stores one event per batch each way, and every
//! reader still sees each iteration's own start and end.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::TryStreamExt;

use noetl_integration::timed::{max_overlap, read_log, timed_loop, timed_loop_of};
use noetl_integration::{types, Cluster, ClusterOptions};
use noetl_mesh::{event_type::EventType, events::EventDraft, payloads};
use serde_json::json;

const BATCHED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: batched }
workflow:
  - step: start
    next:
      arcs:
        - step: fan
  - step: fan
    loop:
      in: "{{ range(40) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 16
        policy:
          reducers: { total: sum, items: append }
    tool:
      - name: first
        kind: noop
      - name: emit
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then:
                    set_ctx:
                      total: "{{ iter.i }}"
                      items: "{{ iter.i }}"
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
"#;

/// The events stream.
async fn events_stream(cluster: &Cluster) -> async_nats::jetstream::stream::Stream {
    let subjects = cluster.mesh.subjects();
    cluster
        .mesh
        .js()
        .get_stream(subjects.events_stream())
        .await
        .unwrap()
}

/// How many events of `eid` are stored under each type, as stored (not
/// unfolded).
async fn stored_counts(cluster: &Cluster, eid: &str) -> std::collections::HashMap<String, usize> {
    let subjects = cluster.mesh.subjects();
    let stream = events_stream(cluster).await;
    let prefix = subjects.event(eid, "");
    let mut info = stream
        .info_with_subjects(format!("{prefix}>"))
        .await
        .unwrap();
    let mut counts = std::collections::HashMap::new();
    while let Some((subject, n)) = info.try_next().await.unwrap() {
        counts.insert(subject.trim_start_matches(&prefix).to_string(), n);
    }
    counts
}

/// The integers of a `ctx` list (an `append` reducer's), sorted.
fn sorted_ints(v: &serde_json::Value) -> Vec<i64> {
    let mut out: Vec<i64> = (v.as_array().unwrap().iter())
        .map(|v| v.as_i64().unwrap())
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_window_travels_in_batches_and_reads_back_as_its_iterations() {
    let cluster = Cluster::start().await;
    let eid = cluster.submit(BATCHED, "batched.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    assert_eq!(s.ctx["total"], (0..40).sum::<i64>());
    assert_eq!(sorted_ints(&s.ctx["items"]), (0..40).collect::<Vec<_>>());
    cluster.assert_replays(&eid).await;

    // Stored: batches of four (a quarter of the window), no iteration's
    // start or end on its own.
    let counts = stored_counts(&cluster, &eid).await;
    let accepted = counts.get("batch.accepted").copied().unwrap_or(0);
    let completed = counts.get("batch.completed").copied().unwrap_or(0);
    assert!((10..=40).contains(&accepted), "{counts:?}");
    assert!(accepted < 40 && completed < 40, "{counts:?}");
    assert!(!counts.contains_key("loop.iteration.started"), "{counts:?}");
    assert!(!counts.contains_key("loop.iteration.done"), "{counts:?}");

    // Read: every iteration's start and end, with the ids they would have
    // had stored alone, and the first task's end in between.
    let evs = cluster.settled_events(&eid).await;
    let count = |t: EventType| types(&evs).iter().filter(|x| **x == t.wire_name()).count();
    assert_eq!(count(EventType::LoopIterationStarted), 40);
    assert_eq!(count(EventType::LoopIterationDone), 40);
    assert_eq!(count(EventType::TaskDone), 80, "two tasks an iteration");
    assert_eq!(count(EventType::BatchCompleted), 0, "read unfolded");
    let srid = evs
        .iter()
        .find(|e| e.event_type == "loop.started")
        .unwrap()
        .step_run_id
        .clone();
    let mut seen = BTreeSet::new();
    for e in evs.iter().filter(|e| e.event_type == "loop.iteration.done") {
        let done: payloads::IterationEnded = payloads::decode_typed(e).unwrap();
        // Restored whole from the batch's compact end.
        assert_eq!(done.loop_run_id, srid);
        let index = done.index.to_string();
        let alone = EventDraft {
            execution_id: &eid,
            step_run_id: &srid,
            discriminator: &index,
            ..Default::default()
        }
        .build(&done);
        assert_eq!(e.event_id, alone.event_id, "iteration {index}");
        assert_eq!(
            e.parent_id,
            noetl_mesh::commands::iteration_command_id(&srid, done.index)
        );
        seen.insert(done.index);
    }
    assert_eq!(seen.len(), 40);
    for e in evs.iter().filter(|e| e.event_type == "task.done") {
        let done: payloads::TaskDone = payloads::decode_typed(e).unwrap();
        assert!(done.index.is_some_and(|i| i < 40), "{e:?}");
        assert_eq!((done.attempt, done.action.as_str()), (1, "continue"));
    }

    // Every batch report sent again under a new message id: nothing is
    // counted twice.
    let subjects = cluster.mesh.subjects();
    let stream = events_stream(&cluster).await;
    // Read them all first: what is sent again lands on the same subject.
    let (mut raws, mut seq) = (Vec::new(), 0);
    while let Ok(raw) = stream
        .raw_message_builder()
        .sequence(seq + 1)
        .next_by_subject(subjects.event(&eid, "batch.completed"))
        .send()
        .await
    {
        seq = raw.sequence;
        // Its ends are compact: the loop run is named once.
        let stored = noetl_mesh::events::decode_message(
            raw.subject.as_str(),
            Some(&raw.headers),
            &raw.payload,
        )
        .unwrap();
        let text = String::from_utf8(stored.payload_json).unwrap();
        assert_eq!(text.matches(srid.as_str()).count(), 1, "{text}");
        assert!(!text.contains("null"), "{text}");
        raws.push(raw);
    }
    let n = raws.len();
    for (k, raw) in raws.into_iter().enumerate() {
        cluster
            .mesh
            .publish(raw.subject.to_string(), &format!("again-{k}"), raw.payload)
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
    assert_eq!(n, completed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = cluster.mesh.exec_ctx(&eid).await.unwrap();
    assert_eq!(after, s.ctx, "a batch reported again is not counted again");
    let evs = cluster.events(&eid).await;
    assert_eq!(
        types(&evs)
            .iter()
            .filter(|t| **t == EventType::LoopDone.wire_name())
            .count(),
        1
    );

    // A batch command sent again after its iterations were counted (a
    // window sent again after a crash) runs none of them.
    let before = cluster.events(&eid).await.len();
    let iters: Vec<serde_json::Value> = (0..3).map(|i| json!({"i": i, "index": i})).collect();
    let items: Vec<(u64, &serde_json::Value)> = iters
        .iter()
        .enumerate()
        .map(|(i, v)| (i as u64, v))
        .collect();
    let again = noetl_mesh::commands::first_batch(
        noetl_mesh::commands::FirstTask {
            execution_id: &eid,
            step: "fan",
            step_run_id: &srid,
            args: &json!({}),
            trace_id: "",
            deadline: (0, ""),
            iteration: None,
            total: 40,
        },
        &items,
    );
    cluster
        .mesh
        .publish_command("noop", &again)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        cluster.events(&eid).await.len(),
        before,
        "nothing ran again"
    );
    assert_eq!(cluster.mesh.exec_ctx(&eid).await.unwrap(), s.ctx);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_s_concurrency_bounds_the_iterations_of_its_batches() {
    // Batches of four (a window of 16), executors of three slots each.
    let cluster = Cluster::start_with(ClusterOptions {
        concurrency: 3,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("spans").to_str().unwrap().to_string();
    let eid = cluster
        .submit(
            &timed_loop("parallel", 16, 24, &log),
            "bounded.yaml",
            json!({}),
        )
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    let spans = read_log(&log);
    assert_eq!(spans.len(), 24);
    let overlap = max_overlap(&spans);
    assert!(overlap <= 3, "{overlap} python calls at once on 3 slots");
    assert!(
        overlap >= 2,
        "a batch's iterations run side by side: {overlap}"
    );
    let counts = stored_counts(&cluster, &eid).await;
    assert!(counts.contains_key("batch.completed"), "{counts:?}");
    cluster.stop().await;
}

/// A loop whose python task logs each call (index and attempt) to `log`,
/// fails the first attempt of every third index (retried alone, after
/// 0.5 s) and takes 0.2 s: the window is in flight in batches that are no
/// longer whole when it is sent again.
fn resent_loop(log: &str) -> String {
    format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: resent }}
workflow:
  - step: start
    next:
      arcs:
        - step: fan
  - step: fan
    loop:
      in: "{{{{ range(24) | list }}}}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 12
        policy:
          reducers: {{ seen: append }}
    tool:
      - name: work
        kind: python
        args: {{ i: "{{{{ iter.i }}}}", attempt: "{{{{ _attempt }}}}" }}
        code: |
          import time
          with open({log:?}, "a") as f:
              f.write("%d %d\n" % (i, attempt))
          time.sleep(0.2)
          if i % 3 == 1 and attempt == 1:
              raise ValueError("first try")
          result = i
        spec:
          policy:
            rules:
              - when: "{{{{ outcome.status == 'error' }}}}"
                then: {{ do: retry, attempts: 3, delay: 0.5 }}
              - else:
                  then: {{ set_ctx: {{ seen: "{{{{ iter.i }}}}" }} }}
    next:
      arcs:
        - step: end
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: end
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_sent_again_mid_loop_goes_out_in_the_batches_it_went_out_in() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.log");
    let log = log.to_str().unwrap();
    let eid = cluster
        .submit(&resent_loop(log), "resent.yaml", json!({}))
        .await;

    // Once the first report is stored, the loop's start command comes
    // again (a redelivery) while the rest of the window runs: the run
    // exists, so the loop-supervisor sends its whole window again, as after
    // a crash between a count and its publish. Some of its batches are no
    // longer whole by then: an iteration of each waits for its retry, and
    // the others were counted.
    let subjects = cluster.mesh.subjects();
    let stream = events_stream(&cluster).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let srid = loop {
        if let Ok(raw) = stream
            .raw_message_builder()
            .sequence(1)
            .next_by_subject(subjects.event(&eid, "batch.completed"))
            .send()
            .await
        {
            let report = noetl_mesh::events::decode_message(
                raw.subject.as_str(),
                Some(&raw.headers),
                &raw.payload,
            )
            .unwrap();
            break report.step_run_id;
        }
        assert!(std::time::Instant::now() < deadline, "no batch reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let again = noetl_wire::LoopCommand {
        command_id: "start-again".into(),
        execution_id: eid.clone(),
        step: "fan".into(),
        step_run_id: srid,
        ..Default::default()
    };
    noetl_mesh::effects::apply(
        &cluster.mesh,
        vec![noetl_mesh::effects::Effect::Loop(again)],
    )
    .await
    .unwrap();

    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    assert_eq!(sorted_ints(&s.ctx["seen"]), (0..24).collect::<Vec<_>>());

    // The window went out again in the batches it went out in first, which
    // JetStream dropped: no iteration ran twice, none was reported twice.
    let mut calls: Vec<(u32, u32)> = std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| {
            let (i, a) = l.split_once(' ').unwrap();
            (i.parse().unwrap(), a.parse().unwrap())
        })
        .collect();
    calls.sort();
    let expected: Vec<(u32, u32)> = (0..24)
        .flat_map(|i| {
            if i % 3 == 1 {
                vec![(i, 1), (i, 2)]
            } else {
                vec![(i, 1)]
            }
        })
        .collect();
    assert_eq!(calls, expected, "each call once");
    let evs = cluster.settled_events(&eid).await;
    let mut ids = BTreeSet::new();
    for e in &evs {
        assert!(
            ids.insert(e.event_id.as_str()),
            "event {} ({} {}) stored twice",
            e.event_id,
            e.event_type,
            e.step
        );
    }
    let ends = types(&evs)
        .iter()
        .filter(|t| **t == EventType::LoopIterationDone.wire_name())
        .count();
    assert_eq!(ends, 24);
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_busy_with_a_batch_asks_for_no_work_until_it_started_them_all() {
    // One python replica of two slots and one batch of sixteen 0.8 s
    // iterations (a window of 64 sends batches of sixteen): eight rounds
    // of two. A slot an iteration frees passes to the batch's next one, so
    // the replica asks for no new message until its last round ends: once
    // the pull that brought the batch has expired (it waits at the server
    // for what it has not received, up to 5 s), no pull request of it
    // waits there, where it would take work a replica with idle slots
    // should. When the last round starts, the slots of the fourteen that
    // ended would idle: the batch reports their ends, then the last two.
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        ..Default::default()
    })
    .await;
    let _python = cluster.spawn_executor_for(&["python"], 2).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("spans").to_str().unwrap().to_string();
    let yaml = timed_loop_of("parallel", 64, 16, 0.8, &log);
    let stream = cluster
        .mesh
        .js()
        .get_stream(cluster.mesh.subjects().work_stream())
        .await
        .unwrap();
    let consumer = format!("{}-executor-python", cluster.mesh.subjects().prefix());
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn({
        let done = done.clone();
        async move {
            let mut samples = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let info = stream.consumer_info(&consumer).await.unwrap();
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs_f64();
                samples.push((now, info.num_waiting));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            samples
        }
    });
    let eid = cluster.submit(&yaml, "busy.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    let mut spans = read_log(&log);
    assert_eq!(spans.len(), 16);
    spans.sort_by(|a, b| a.1.total_cmp(&b.1));
    assert!(
        spans[2].1 >= spans[0].2.min(spans[1].2) - 0.01,
        "two at a time: {spans:?}"
    );
    // From when the pull that brought the batch has surely expired to the
    // last round's first end.
    let from = spans[0].1 + 5.3;
    let to = spans[14].2.min(spans[15].2) - 0.05;
    let within: Vec<_> = samples
        .iter()
        .filter(|(t, _)| (from..to).contains(t))
        .collect();
    assert!(
        within.len() >= 5,
        "sampled while the batch held every slot: {within:?} of {samples:?}"
    );
    assert!(
        within.iter().all(|(_, waiting)| *waiting == 0),
        "pull requests waiting while the batch still held the replica: {within:?}"
    );
    let counts = stored_counts(&cluster, &eid).await;
    assert_eq!(counts.get("batch.accepted"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("batch.completed"), Some(&2), "{counts:?}");
    cluster.assert_replays(&eid).await;
    cluster.stop().await;
}
