//! Loops: order, bounded concurrency measured by the tasks themselves,
//! failure modes, exactly one loop.done.

use std::time::Duration;

use futures::StreamExt;

use noetl_integration::{types, Cluster, ClusterOptions};
use noetl_mesh::events::types as et;
use serde_json::json;

/// A loop whose python task records its own start/end times in a file, so
/// the test measures real concurrency (not the engine's counters).
fn timed_loop(mode: &str, mif: u32, n: u32, log: &str) -> String {
    format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: timed_loop }}
workflow:
  - step: start
    loop:
      in: "{{{{ range({n}) | list }}}}"
      iterator: i
      spec: {{ mode: {mode}, max_in_flight: {mif} }}
    tool:
      - name: work
        kind: python
        args: {{ i: "{{{{ iter.i }}}}" }}
        code: |
          import time, os
          t0 = time.time()
          time.sleep(0.05)
          with open({log:?}, "a") as f:
              f.write("%d %.6f %.6f\n" % (i, t0, time.time()))
          result = i
    next:
      arcs:
        - step: end
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: end
"#
    )
}

fn read_log(path: &str) -> Vec<(u32, f64, f64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            (
                p[0].parse().unwrap(),
                p[1].parse().unwrap(),
                p[2].parse().unwrap(),
            )
        })
        .collect()
}

fn max_overlap(spans: &[(u32, f64, f64)]) -> usize {
    let mut points: Vec<(f64, i32)> = Vec::new();
    for (_, a, b) in spans {
        points.push((*a, 1));
        points.push((*b, -1));
    }
    points.sort_by(|x, y| x.partial_cmp(y).unwrap().then(x.1.cmp(&y.1)));
    let (mut cur, mut max) = (0i32, 0i32);
    for (_, d) in points {
        cur += d;
        max = max.max(cur);
    }
    max as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_loops_never_exceed_max_in_flight_and_sequential_keeps_order() {
    let cluster = Cluster::start_with(ClusterOptions {
        replicas: 2,
        concurrency: 16,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();

    let log = dir.path().join("par.log").display().to_string();
    let eid = cluster
        .submit(&timed_loop("parallel", 3, 12, &log), "par.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    let spans = read_log(&log);
    assert_eq!(spans.len(), 12, "each item exactly once");
    let mut items: Vec<u32> = spans.iter().map(|s| s.0).collect();
    items.sort();
    assert_eq!(items, (0..12).collect::<Vec<_>>());
    let overlap = max_overlap(&spans);
    assert!(
        overlap <= 3,
        "observed {overlap} iterations at once, max_in_flight is 3"
    );
    assert!(
        overlap >= 2,
        "a parallel loop should overlap (observed {overlap})"
    );
    let events = cluster.settled_events(&eid).await;
    assert_eq!(
        types(&events)
            .iter()
            .filter(|t| **t == et::LOOP_DONE)
            .count(),
        1
    );

    let log = dir.path().join("seq.log").display().to_string();
    let eid = cluster
        .submit(&timed_loop("sequential", 5, 6, &log), "seq.yaml", json!({}))
        .await;
    cluster.wait(&eid, Duration::from_secs(60)).await;
    let spans = read_log(&log);
    assert_eq!(max_overlap(&spans), 1, "sequential runs one at a time");
    let order: Vec<u32> = spans.iter().map(|s| s.0).collect();
    assert_eq!(
        order,
        (0..6).collect::<Vec<_>>(),
        "sequential runs in order"
    );
    cluster.stop().await;
}

fn failing_loop(mode: &str) -> String {
    format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: failing_loop }}
workflow:
  - step: start
    spec:
      failure: {{ mode: {mode} }}
    loop:
      in: [1, 2, 3, 4, 5, 6]
      iterator: x
    tool:
      - name: check
        kind: python
        args: {{ x: "{{{{ iter.x }}}}" }}
        code: |
          if x == 2:
              raise ValueError("two")
          result = x
    next:
      arcs:
        - step: ok
          when: "{{{{ event.name == 'loop.done' }}}}"
        - step: cleanup
          when: "{{{{ event.name == 'step.failed' }}}}"
  - step: ok
  - step: cleanup
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_stops_dispatching_and_best_effort_runs_everything() {
    let cluster = Cluster::start().await;
    let eid = cluster
        .submit(&failing_loop("fail_fast"), "ff.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "completed");
    assert_eq!(s.steps["start"], "failed");
    assert_eq!(s.steps["cleanup"], "done");
    assert_eq!(s.steps["ok"], "not_run");
    let events = cluster.settled_events(&eid).await;
    let t = types(&events);
    // Sequential: items 1 and 2 ran, 2 failed, nothing after it.
    assert_eq!(
        t.iter().filter(|x| **x == et::LOOP_ITERATION_DONE).count(),
        1
    );
    assert_eq!(
        t.iter()
            .filter(|x| **x == et::LOOP_ITERATION_FAILED)
            .count(),
        1
    );
    assert_eq!(t.iter().filter(|x| **x == et::LOOP_DONE).count(), 1);

    let eid = cluster
        .submit(&failing_loop("best_effort"), "be.yaml", json!({}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.steps["start"], "done");
    assert_eq!(s.steps["ok"], "done");
    assert_eq!(s.steps["cleanup"], "not_run");
    let events = cluster.settled_events(&eid).await;
    let done = events
        .iter()
        .find(|e| e.event_type == et::LOOP_DONE)
        .unwrap();
    let p = noetl_mesh::events::payload(done);
    assert_eq!(p["counts"], json!({"total": 6, "done": 5, "failed": 1}));
    cluster.stop().await;
}

const REDUCERS: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: reducers }
workflow:
  - step: start
    tool:
      - name: init
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { total: 1000 } }
    next:
      arcs:
        - step: fan
  - step: fan
    loop:
      in: "{{ range(20) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 5
        policy:
          reducers: { total: sum, items: append, biggest: max, same: sum }
    tool:
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
                      biggest: "{{ iter.i }}"
                      same: 1
                      constant: "everyone writes this"
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reducers_are_exact_and_survive_redelivery() {
    let cluster = Cluster::start_with(ClusterOptions {
        replicas: 2,
        ..Default::default()
    })
    .await;
    let eid = cluster.submit(REDUCERS, "reducers.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    assert_eq!(
        s.ctx["total"],
        1000 + 190,
        "sum onto the value before the loop"
    );
    assert_eq!(s.ctx["biggest"], 19);
    assert_eq!(s.ctx["same"], 20);
    assert_eq!(
        s.ctx["constant"], "everyone writes this",
        "identical rewrites are allowed"
    );
    let mut items: Vec<i64> = s.ctx["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    items.sort();
    assert_eq!(items, (0..20).collect::<Vec<_>>());

    // Redeliver every iteration event under new message ids: nothing changes.
    let events = cluster.settled_events(&eid).await;
    for (n, e) in events
        .iter()
        .filter(|e| e.event_type == et::LOOP_ITERATION_DONE)
        .enumerate()
    {
        cluster
            .mesh
            .publish(
                cluster.mesh.subjects().event(&eid, et::LOOP_ITERATION_DONE),
                &format!("again-{n}"),
                noetl_mesh::codec::encode(e),
            )
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = cluster.mesh.exec_ctx(&eid).await.unwrap();
    assert_eq!(
        after, s.ctx,
        "redelivered iterations must not be counted twice"
    );
    let evs = cluster.events(&eid).await;
    assert_eq!(
        types(&evs).iter().filter(|t| **t == et::LOOP_DONE).count(),
        1
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_different_ctx_write_in_a_parallel_loop_is_a_named_conflict() {
    let cluster = Cluster::start().await;
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: conflict }
workflow:
  - step: start
    loop:
      in: [1, 2, 3]
      iterator: x
      spec: { mode: parallel, max_in_flight: 1 }
    tool:
      - name: write
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { winner: "{{ iter.x }}" } }
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
  - step: end
"#;
    let eid = cluster.submit(yaml, "conflict.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(serde_json::to_value(s.status).unwrap(), "failed");
    assert_eq!(s.ctx["winner"], 1, "the first write stands");
    let events = cluster.settled_events(&eid).await;
    let failed = events
        .iter()
        .find(|e| e.event_type == et::LOOP_ITERATION_FAILED)
        .expect("an iteration fails");
    let msg = noetl_mesh::events::payload(failed)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("ctx.conflict") && msg.contains("\"winner\""),
        "{msg}"
    );
    assert!(
        msg.contains("iteration 0") && msg.contains("iteration 1"),
        "names both writers: {msg}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_waits_for_every_input_and_runs_once() {
    let cluster = Cluster::start_with(ClusterOptions {
        replicas: 2,
        ..Default::default()
    })
    .await;
    for _ in 0..3 {
        let (s, events) = cluster.run_file("playbooks/join.yaml", json!({})).await;
        assert_eq!(
            serde_json::to_value(s.status).unwrap(),
            "completed",
            "{:?}",
            s.error
        );
        assert_eq!(s.ctx["merged"], "L+R");
        let merge_runs = events
            .iter()
            .filter(|e| e.event_type == et::STEP_STARTED && e.step == "merge")
            .count();
        assert_eq!(merge_runs, 1, "the join fires once");
        let absorbed = events
            .iter()
            .filter(|e| e.event_type == et::STEP_SKIPPED && e.step == "merge")
            .count();
        assert_eq!(absorbed, 1, "the first arrival waits");
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagination_resumes_from_its_recorded_iter_after_an_executor_crash() {
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("pages.log").display().to_string();
    let yaml = format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: crash_pagination }}
workflow:
  - step: start
    loop:
      in: [a, b]
      iterator: item
      spec: {{ mode: parallel, max_in_flight: 2 }}
    tool:
      - name: init
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: {{ set_iter: {{ page: 1 }} }}
      - name: fetch_page
        kind: python
        args: {{ item: "{{{{ iter.item }}}}", page: "{{{{ iter.page }}}}" }}
        code: |
          import time
          with open({log:?}, "a") as f:
              f.write("%s %d\n" % (item, page))
          time.sleep(0.15)
          result = page < 8
      - name: paginate
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{{{ _prev }}}}"
                then: {{ do: jump, to: fetch_page, set_iter: {{ page: "{{{{ iter.page + 1 }}}}" }} }}
              - else:
                  then: {{ do: break }}
    next:
      arcs:
        - step: end
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: end
"#
    );
    let first = cluster.spawn_executor().await;
    let eid = cluster.submit(&yaml, "crash.yaml", json!({})).await;
    // Let a few pages go by, then crash the executor mid-stream.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n = std::fs::read_to_string(&log)
            .map(|s| s.lines().count())
            .unwrap_or(0);
        if n >= 6 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "pages did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.abort();
    let _ = first.await;
    let before = std::fs::read_to_string(&log).unwrap();
    // A new replica picks the commands up when they are redelivered.
    let _second = cluster.spawn_executor().await;
    let s = cluster.wait(&eid, Duration::from_secs(90)).await;
    assert_eq!(
        serde_json::to_value(s.status).unwrap(),
        "completed",
        "{:?}",
        s.error
    );
    let all = std::fs::read_to_string(&log).unwrap();
    for item in ["a", "b"] {
        let pages: Vec<u32> = all
            .lines()
            .filter(|l| l.starts_with(item))
            .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
            .collect();
        let mut distinct = pages.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct,
            (1..=8).collect::<Vec<_>>(),
            "item {item}: every page fetched"
        );
        assert_eq!(
            pages.iter().filter(|p| **p == 1).count(),
            1,
            "item {item}: did not restart from page 1: {pages:?}"
        );
        // At most the page in flight at the crash is fetched twice.
        assert!(
            pages.len() <= 9,
            "item {item}: pages {pages:?}\nbefore crash:\n{before}"
        );
    }
    // After loop.done the checkpoints and collection chunks are pruned; only
    // the loop run's own record stays.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let keys: Vec<String> = cluster
            .mesh
            .loop_kv()
            .keys()
            .await
            .unwrap()
            .filter_map(|k| async move { k.ok() })
            .filter(|k| std::future::ready(k.starts_with(eid.as_str())))
            .collect()
            .await;
        if keys.len() == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "loop state not pruned: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop().await;
}
