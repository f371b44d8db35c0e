//! Hostile input at run time: limits that fail a step saying which limit,
//! large arguments and errors that travel by reference or preview (never
//! failing for size), and a message that keeps failing, which is
//! dead-lettered and fails its execution saying why.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use noetl_core::limits::MAX_EVENT_PAYLOAD_BYTES;
use noetl_integration::{types, Cluster};
use noetl_mesh::event_type::EventType;
use noetl_mesh::events;
use noetl_mesh::runtime::{self, BoxFuture, ConsumerLoop, Disposition, Handler};
use noetl_mesh::state::ExecStatus;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_above_max_loop_items_fails_its_step_naming_the_limit() {
    let cluster = Cluster::start().await;
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: too_many_items }
executor:
  spec:
    limits: { max_loop_items: 3 }
workflow:
  - step: start
    loop:
      in: "{{ workload.items }}"
      iterator: i
    tool:
      - name: t
        kind: noop
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'loop.done' }}"
        - step: cleanup
          when: "{{ event.name == 'step.failed' }}"
  - step: end
  - step: cleanup
"#;
    // Three items pass the limit...
    let ok = cluster
        .submit(yaml, "items.yaml", json!({"items": [1, 2, 3]}))
        .await;
    let s = cluster.wait(&ok, Duration::from_secs(30)).await;
    assert_eq!(s.steps["end"], "done", "{s:?}");
    // ...five do not: step.failed, routed to cleanup, naming the limit.
    let eid = cluster
        .submit(yaml, "items.yaml", json!({"items": [1, 2, 3, 4, 5]}))
        .await;
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.steps["start"], "failed", "{s:?}");
    assert_eq!(s.steps["cleanup"], "done", "{s:?}");
    let evs = cluster.settled_events(&eid).await;
    assert!(
        !types(&evs).contains(&EventType::LoopStarted.wire_name()),
        "no iteration ran"
    );
    let failed = evs
        .iter()
        .find(|e| e.event_type == EventType::StepFailed.wire_name() && e.step == "start")
        .expect("step.failed");
    let msg = events::payload(failed)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    for want in [
        "max_loop_items",
        "5 items",
        "of 3 items",
        "step \"start\"",
        "items.yaml",
        eid.as_str(),
    ] {
        assert!(msg.contains(want), "{want:?} missing from: {msg}");
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_arguments_travel_by_reference_and_event_payloads_stay_bounded() {
    let cluster = Cluster::start().await;
    // A 200 KB result passed on as an arc argument (the result itself is a
    // reference; a template reads it back whole, so the argument is large),
    // and a python error of 300 KB.
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: big_args }
executor:
  spec:
    limits: { max_payload_bytes: 1024 }
workflow:
  - step: start
    tool:
      - name: make
        kind: python
        code: "result = {'text': 'x' * 200000}"
    next:
      arcs:
        - step: measure
          args: { big: "{{ start.text }}", small: 7 }
  - step: measure
    tool:
      - name: len
        kind: python
        args: { big: "{{ args.big }}", small: "{{ args.small }}" }
        code: "result = {'n': len(big), 'small': small}"
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { n: "{{ outcome.result.n }}", small: "{{ outcome.result.small }}" } }
    next:
      arcs:
        - step: boom
  - step: boom
    tool:
      - name: raise
        kind: python
        code: "raise ValueError('y' * 300000)"
    next:
      arcs:
        - step: handled
          when: "{{ event.name == 'step.failed' }}"
  - step: handled
"#;
    let eid = cluster.submit(yaml, "big_args.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(60)).await;
    assert_eq!(s.status, ExecStatus::Completed, "{s:?}");
    // The argument arrived whole.
    assert_eq!(s.ctx["n"], 200000, "{s:?}");
    assert_eq!(s.ctx["small"], 7);
    assert_eq!(s.steps["boom"], "failed");
    assert_eq!(s.steps["handled"], "done");
    let evs = cluster.settled_events(&eid).await;
    // Every event is within the payload limit.
    for e in &evs {
        assert!(
            e.payload_json.len() <= MAX_EVENT_PAYLOAD_BYTES,
            "{} of step {} has {} bytes",
            e.event_type,
            e.step,
            e.payload_json.len()
        );
    }
    // The token's argument was a reference, not 200 KB inline.
    let started = evs
        .iter()
        .find(|e| e.event_type == EventType::StepDone.wire_name() && e.step == "measure")
        .expect("measure is done");
    let args = &events::payload(started)["args"];
    assert!(noetl_mesh::objects::is_ref(&args["big"]), "{args}");
    assert_eq!(args["small"], 7);
    // The error is kept as a preview, with its size.
    let failed = evs
        .iter()
        .find(|e| e.event_type == EventType::StepFailed.wire_name() && e.step == "boom")
        .expect("boom failed");
    let p = events::payload(failed);
    let text = p.to_string();
    assert!(
        text.contains("ValueError"),
        "{}",
        &text[..text.len().min(2000)]
    );
    assert!(
        text.contains("truncated"),
        "{}",
        &text[..text.len().min(2000)]
    );
    cluster.stop().await;
}

/// A handler that never succeeds: every delivery asks for a redelivery.
struct KeepsFailing {
    calls: Arc<AtomicU64>,
}

impl Handler for KeepsFailing {
    fn handle(&self, _msg: Arc<async_nats::jetstream::Message>) -> BoxFuture<'static, Disposition> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Disposition::Retry(Some(Duration::from_millis(10))) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_failing_is_dead_lettered_and_fails_its_execution_saying_why() {
    let cluster = Cluster::start().await;
    // Dead-lettered as soon as its deliveries are used up, whatever its
    // age (by default a message also has to be two minutes old).
    let m = noetl_mesh::Mesh::connect(noetl_mesh::config::MeshConfig {
        dead_letter_age: Duration::ZERO,
        ..cluster.mesh.config().clone()
    })
    .await
    .unwrap();
    let slow = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: slow }\nworkflow:\n  - step: start\n    tool:\n      - name: nap\n        kind: python\n        code: \"import time; time.sleep(3); result = 1\"\n";
    let eid = cluster.submit(slow, "slow.yaml", json!({})).await;

    // A consumer of the execution's work that fails every time.
    let stream = m
        .js()
        .create_stream(async_nats::jetstream::stream::Config {
            name: "HOSTILE_FLAKY".into(),
            subjects: vec!["hostile.flaky.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("flaky".into()),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let looped = tokio::spawn(runtime::run(
        m.clone(),
        ConsumerLoop {
            name: "flaky-test".into(),
            consumer,
            concurrency: 1,
            handler: Arc::new(KeepsFailing {
                calls: calls.clone(),
            }),
            shutdown: shutdown.clone(),
        },
    ));
    let mut dead = m
        .client()
        .subscribe(m.subjects().dead_letter("flaky-test"))
        .await
        .unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(runtime::HEADER_EXECUTION_ID, eid.as_str());
    m.js()
        .publish_with_headers("hostile.flaky.work", headers, "work".into())
        .await
        .unwrap()
        .await
        .unwrap();

    // It is dead-lettered after max_deliveries, with its origin and reason.
    let max = m.config().max_deliveries;
    let copy = tokio::time::timeout(Duration::from_secs(30), futures::StreamExt::next(&mut dead))
        .await
        .expect("dead-lettered in time")
        .unwrap();
    assert_eq!(&copy.payload[..], b"work");
    let h = copy.headers.as_ref().unwrap();
    assert_eq!(
        h.get(runtime::HEADER_ORIGINAL_SUBJECT).unwrap().as_str(),
        "hostile.flaky.work"
    );
    let reason = h.get(runtime::HEADER_REASON).unwrap().as_str().to_string();
    assert_eq!(
        reason,
        format!("delivered {} times without being handled", max + 1)
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        max as u64,
        "handled max_deliveries times"
    );

    // The execution fails (without waiting for its step) saying why.
    let s = cluster.wait(&eid, Duration::from_secs(30)).await;
    assert_eq!(s.status, ExecStatus::Failed, "{s:?}");
    let err = s.error.unwrap_or_default();
    for want in ["dead-lettered", "flaky-test", "hostile.flaky.work", &reason] {
        assert!(err.contains(want), "{want:?} missing from: {err}");
    }
    let evs = cluster.settled_events(&eid).await;
    let notice = evs
        .iter()
        .find(|e| e.event_type == EventType::MessageDeadLettered.wire_name())
        .expect("a dead-letter notice");
    assert_eq!(events::payload(notice)["reason"], Value::String(reason));
    shutdown.cancel();
    looped.await.unwrap().unwrap();
    cluster.stop().await;
}
