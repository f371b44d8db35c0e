//! Events published as JSON (`NOETL_EVENT_ENCODING=json`): every service
//! reads them as it reads protobuf ones, and a plain NATS subscriber sees
//! readable JSON with the payload inline.

use std::time::Duration;

use futures::StreamExt;
use noetl_integration::{Cluster, ClusterOptions};
use noetl_mesh::{config::EventEncoding, state::ExecStatus};
use serde_json::{json, Value};

const LOOP: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: json_events }
workflow:
  - step: start
    loop:
      in: "{{ range(5) | list }}"
      iterator: i
      spec:
        mode: parallel
        policy: { reducers: { total: sum } }
    tool:
      - name: one
        kind: noop
        spec:
          policy:
            rules:
              - else: { then: { set_ctx: { total: "{{ iter.i }}" } } }
    next:
      arcs:
        - step: done
          when: "{{ event.name == 'loop.done' }}"
  - step: done
    tool: { kind: noop }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_publishing_json_events_runs_and_any_subscriber_can_read_them() {
    let cluster = Cluster::start_with(ClusterOptions {
        event_encoding: EventEncoding::Json,
        ..ClusterOptions::default()
    })
    .await;
    let mut raw = cluster
        .mesh
        .client()
        .subscribe("noetl.evt.>")
        .await
        .unwrap();
    cluster.mesh.client().flush().await.unwrap();
    let (eid, s) = cluster.completed(LOOP, json!({})).await;
    assert_eq!(s.status, ExecStatus::Completed);
    assert_eq!(
        s.ctx["total"], 10,
        "loop reports (JSON events) counted once each"
    );

    // What `nats sub 'noetl.evt.>'` prints: JSON objects, payload inline.
    let mut seen = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), raw.next()).await {
        let v: Value = serde_json::from_slice(&m.payload).expect("every event is JSON text");
        if v["execution_id"] == eid.as_str() {
            seen.push(v);
        }
    }
    let done = seen
        .iter()
        .find(|v| v["event_type"] == "execution.completed")
        .expect("execution.completed seen");
    assert!(done["payload"].is_object(), "{done}");
    assert!(seen
        .iter()
        .any(|v| v["event_type"] == "loop.done" && v["payload"]["counts"]["done"] == 5));
    // The event log reads back the same way as protobuf events: a step's
    // end that carries its last task's `task.done` as the two events, a
    // `next.selected` with the `step.started` of each step-run the router
    // started (the entry's `token.created` with the entry step-run's), a
    // batch of iterations as each iteration's.
    let events = cluster.settled_events(&eid).await;
    let carrying = |end: &Value| 1 + usize::from(end.get("last_task").is_some());
    let stands_for = |v: &Value| match v["event_type"].as_str() {
        // Its items: runs `[first, count(, claim)]` and single items.
        Some("batch.accepted") => v["payload"]["items"].as_array().map_or(0, |items| {
            items
                .iter()
                .map(|i| i.get(1).and_then(Value::as_u64).map_or(1, |n| n as usize))
                .sum()
        }),
        // An end of a batch names its last task by its place in the
        // batch's `tasks` (a batch written before carried it inside).
        Some("batch.completed") => v["payload"]["ends"].as_array().map_or(0, |ends| {
            ends.iter()
                .map(|e| carrying(&e["end"]) + usize::from(e.get("t").is_some()))
                .sum()
        }),
        Some("next.selected") => {
            let arcs = v["payload"]["arcs"].as_array();
            1 + arcs.map_or(0, |arcs| {
                arcs.iter().filter(|a| a.get("started").is_some()).count()
            })
        }
        Some("token.created") => 1 + usize::from(v["payload"].get("started").is_some()),
        _ => carrying(&v["payload"]),
    };
    let unfolded: usize = seen.iter().map(stands_for).sum();
    assert!(
        unfolded > seen.len(),
        "a step's end carries its last task's end"
    );
    assert_eq!(events.len(), unfolded);
    cluster.stop().await;
}
