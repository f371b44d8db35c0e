//! Waiting for a signal on a real mesh: a `wait` step holds no executor
//! while it waits; a signal whose data fits its schema continues it with
//! the data as the task's result (consumed once: a second signal finds no
//! waiter); data that does not fit is refused, naming where; without a
//! signal the timeout fails the task with kind `timeout`.

use std::time::Duration;

use noetl_integration::Cluster;
use noetl_mesh::event_type::EventType;
use noetl_mesh::signal::SignalError;
use noetl_mesh::state::ExecStatus;
use serde_json::json;

const APPROVAL: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: approval }
workflow:
  - step: start
    tool:
      - name: approve
        kind: wait
        signal: approval
        schema:
          type: object
          required: [approved, by]
          properties:
            approved: { type: boolean }
            by: { type: string }
            comment: { type: string }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { approved: "{{ outcome.result.approved }}", by: "{{ outcome.result.by }}" } }
"#;

const TIMED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: timed_wait }
workflow:
  - step: start
    tool:
      - { name: hold, kind: wait, signal: go, timeout_s: 1 }
    next:
      arcs:
        - step: timed_out
          when: "{{ event.name == 'step.failed' and event.error.kind == 'timeout' }}"
  - step: timed_out
"#;

async fn waiting(cluster: &Cluster, eid: &str) {
    for _ in 0..500 {
        if !cluster.mesh.waiters(eid).await.unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("execution {eid}: no waiter within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_that_fits_continues_the_wait_once_with_its_data() {
    let cluster = Cluster::start().await;
    let mesh = cluster.mesh.clone();
    let eid = cluster.submit(APPROVAL, "approval.yaml", json!({})).await;
    waiting(&cluster, &eid).await;
    // No such signal, and data that does not fit: refused, nothing taken.
    let none = mesh
        .signal(&eid, "other", json!({}), "test")
        .await
        .unwrap_err();
    assert!(matches!(none, SignalError::NoWaiter { .. }), "{none}");
    // A name no step can ever wait for: said so, not "nobody waits now".
    let malformed = mesh
        .signal(&eid, "approval.v2", json!({}), "test")
        .await
        .unwrap_err();
    assert!(
        matches!(malformed, SignalError::BadName { .. })
            && malformed.to_string().contains("1-128 characters"),
        "{malformed}"
    );
    let bad = mesh
        .signal(
            &eid,
            "approval",
            json!({"approved": "yes", "by": "ann"}),
            "test",
        )
        .await
        .unwrap_err();
    assert!(
        bad.to_string().contains("$.approved: expected boolean"),
        "{bad}"
    );
    assert_eq!(mesh.waiters(&eid).await.unwrap().len(), 1, "still waiting");

    let w = mesh
        .signal(
            &eid,
            "approval",
            json!({"approved": true, "by": "ann"}),
            "test",
        )
        .await
        .unwrap();
    assert_eq!((w.step.as_str(), w.task.as_str()), ("start", "approve"));
    let again = mesh
        .signal(
            &eid,
            "approval",
            json!({"approved": true, "by": "bo"}),
            "test",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(again, SignalError::NoWaiter { .. }),
        "consumed once: {again}"
    );

    let done = cluster.wait(&eid, Duration::from_secs(30)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(done.status, ExecStatus::Completed, "{done:?}");
    assert_eq!(done.ctx["approved"], true);
    assert_eq!(done.ctx["by"], "ann");
    let events = cluster.settled_events(&eid).await;
    let received = events
        .iter()
        .filter(|e| e.event_type == EventType::SignalReceived.wire_name())
        .count();
    assert_eq!(received, 1);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_signal_the_timeout_fails_the_task_with_kind_timeout() {
    let cluster = Cluster::start().await;
    let eid = cluster.submit(TIMED, "timed_wait.yaml", json!({})).await;
    let done = cluster.wait(&eid, Duration::from_secs(30)).await;
    cluster.assert_replays(&eid).await;
    assert_eq!(done.status, ExecStatus::Completed, "{done:?}");
    assert_eq!(done.steps["timed_out"], "done", "{done:?}");
    assert!(cluster.mesh.waiters(&eid).await.unwrap().is_empty());
    // A signal after the timeout finds nothing to continue.
    let late = cluster
        .mesh
        .signal(&eid, "go", json!({}), "test")
        .await
        .unwrap_err();
    assert!(matches!(late, SignalError::NoWaiter { .. }), "{late}");
    cluster.stop().await;
}
