//! Every message twice: the whole playbook mix ([`noetl_integration::mix`])
//! on services whose every consumer hands each message back once after
//! handling it (`NOETL_DELIVER_TWICE`), so every handler runs twice on every
//! message — right after the first run, and a second later. The end state
//! must be the clean run's: status, `ctx` and reducers, step records, each
//! loop item counted once, the same events (none stored twice), no token
//! left live.

use std::collections::BTreeMap;
use std::time::Duration;

use noetl_integration::check::{check, Observed};
use noetl_integration::mix::{self, Case};
use noetl_integration::sink::Sink;
use noetl_integration::{Cluster, ClusterOptions};
use noetl_wire::Event;

/// What one mode ended with, per case: (summary JSON, event types by step).
type Ends = Vec<(serde_json::Value, BTreeMap<String, Vec<String>>)>;

/// Run the mix once; check each execution against its case; return what
/// each ended with, to compare across modes, and the deliveries of
/// execution requests the router handled.
async fn run_mix(mode: &str, deliver_twice: Option<Duration>, sink: &Sink) -> (Ends, u64) {
    let cluster = Cluster::start_with(ClusterOptions {
        deliver_twice,
        ..Default::default()
    })
    .await;
    noetl_integration::rows::register_credential(&cluster.mesh).await;
    let cases = mix::mix();
    let mut eids = Vec::new();
    for case in &cases {
        let eid = cluster
            .submit(
                &case.yaml,
                &format!("twice/{}", case.name),
                mix::workload(&sink.url),
            )
            .await;
        eids.push(eid);
    }
    for eid in &eids {
        cluster.wait(eid, Duration::from_secs(90)).await;
    }
    // The second copies come up to a second after the first: read the end
    // state only once every consumer has handled everything.
    quiesce(&cluster.mesh).await;
    let mut ends = Vec::new();
    for (case, eid) in cases.iter().zip(&eids) {
        let summary = cluster.wait(eid, Duration::from_secs(1)).await;
        let events = cluster.settled_events(eid).await;
        let header = cluster.mesh.exec_header(eid).await.unwrap();
        let calls = sink.calls.of(eid);
        let rows = noetl_integration::rows::of(eid).await;
        let verdict = check(
            case,
            &Observed {
                header: header.as_ref(),
                summary: Some(&summary),
                events: &events,
                calls: &calls,
                rows: &rows,
            },
        );
        assert!(
            verdict.anomalies.is_empty(),
            "{mode}: {} {eid}: {:#?}",
            case.name,
            verdict.anomalies
        );
        let mut end = end_state(case, &summary, &events);
        end.1
            .insert("~records".into(), record_shapes(&cluster, eid).await);
        ends.push(end);
    }
    // How many deliveries of execution requests (children's included) the
    // router handled: twice as many in the twice modes as in the clean run.
    let mesh = &cluster.mesh;
    let info = mesh
        .js()
        .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
            "noetl-router-requests",
            mesh.subjects().work_stream(),
        )
        .await
        .expect("the router's request consumer")
        .cached_info()
        .clone();
    cluster.stop().await;
    (ends, info.delivered.consumer_sequence)
}

/// The comparable end of one execution: its summary without id and times,
/// and the types of its events per step, sorted (ids and order differ).
fn end_state(
    case: &Case,
    summary: &noetl_mesh::state::ExecSummary,
    events: &[Event],
) -> (serde_json::Value, BTreeMap<String, Vec<String>>) {
    let mut s = serde_json::to_value(summary).unwrap();
    let o = s.as_object_mut().unwrap();
    for volatile in ["execution_id", "started_at", "ended_at", "duration_ms"] {
        o.remove(volatile);
    }
    o.insert("case".into(), case.name.into());
    let mut by_step: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Which of the two gated cases waits in line for the other depends on
    // which asks first, not on how often messages are delivered.
    // And whether an attempt's start has an event of its own depends on
    // whether it ran past the deferral (`TASK_START_DEFERRAL_MS`): its
    // `task.done` records it either way.
    use noetl_mesh::event_type::EventType;
    let timing = [
        EventType::ExecutionQueued.wire_name(),
        EventType::TaskStarted.wire_name(),
    ];
    for e in events
        .iter()
        .filter(|e| !timing.contains(&e.event_type.as_str()))
    {
        by_step
            .entry(e.step.clone())
            .or_default()
            .push(e.event_type.clone());
    }
    for types in by_step.values_mut() {
        types.sort();
    }
    (s, by_step)
}

/// Wait until no consumer of the work and event streams has a message
/// pending or unacknowledged.
async fn quiesce(mesh: &noetl_mesh::Mesh) {
    use futures::TryStreamExt;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut busy = Vec::new();
        for name in [
            mesh.subjects().work_stream(),
            mesh.subjects().events_stream(),
        ] {
            let stream = mesh.js().get_stream(&name).await.expect("stream");
            let infos: Vec<_> = stream.consumers().try_collect().await.expect("consumers");
            for i in infos {
                if i.num_pending > 0 || i.num_ack_pending > 0 {
                    busy.push(format!(
                        "{} ({} pending, {} unacked)",
                        i.name, i.num_pending, i.num_ack_pending
                    ));
                }
            }
        }
        if busy.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "consumers still busy: {busy:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The keys an execution left in the state buckets (execution, ctx, loop),
/// with its id and the ids derived from it masked: a record written by a
/// copy of a command that should have run nothing (a late checkpoint, say)
/// shows up here.
async fn record_shapes(cluster: &Cluster, eid: &str) -> Vec<String> {
    let m = &cluster.mesh;
    let mut shapes = Vec::new();
    for (bucket, store) in [
        ("exec", m.exec_kv()),
        ("ctx", m.ctx_kv()),
        ("loop", m.loop_kv()),
    ] {
        for key in noetl_mesh::kv::keys_under(store, eid).await.unwrap() {
            let key = key.replace(eid, "E");
            let masked: Vec<&str> = key
                .split('.')
                .map(|part| if part.len() >= 16 { "ID" } else { part })
                .collect::<Vec<_>>();
            shapes.push(format!("{bucket}:{}", masked.join(".")));
        }
    }
    shapes.sort();
    shapes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_message_twice_ends_as_a_clean_run() {
    let sink = Sink::start().await;
    let (clean, requests) = run_mix("clean", None, &sink).await;
    for (mode, delay) in [
        ("twice at once", Duration::from_millis(10)),
        ("twice, a second late", Duration::from_secs(1)),
    ] {
        let (twice, deliveries) = run_mix(mode, Some(delay), &sink).await;
        assert_eq!(
            deliveries,
            2 * requests,
            "{mode}: every request delivered twice"
        );
        for (c, t) in clean.iter().zip(&twice) {
            assert_eq!(
                c.0, t.0,
                "{mode}: the end state differs from the clean run's"
            );
            assert_eq!(
                c.1, t.1,
                "{mode}: {}: the events differ from the clean run's",
                c.0["case"]
            );
        }
    }
}
