//! The executions' floor: how many five-step executions a second this
//! machine's nats-server carries when an execution exchanges with it only
//! what any design keeping the engine's guarantees must, and nothing else
//! runs. Raw JetStream, no engine: a request in a work queue; a header
//! created in a KV bucket; then per step a command in the work queue
//! delivered to an executor, an event its end publishes delivered to a
//! router, and the header's compare-and-set that moves the execution on
//! (the next command, or its end). So per step three stored messages and
//! two deliveries, each publish acknowledged and each delivery acked after
//! its effect is stored (cause before effect), on streams and a bucket
//! with the mesh's settings, with the engine's handler concurrency
//! (`DEFAULT_CONCURRENCY`) per consumer and its derived message ids.
//!
//! The engine stores 34 messages per five-step execution against this
//! shape's 17 (docs/performance.md, "The executions' floor"): the ratio
//! of the engine's rate to this one is what its own choices cost, and this
//! one over the throughput floor is the most any design with a command and
//! an event per step can reach on the machine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, kv, stream, Context};
use bytes::Bytes;
use futures::StreamExt;
use noetl_mesh::ids::derive_id;
use noetl_mesh::Mesh;
use tokio::sync::Notify;

use crate::cpu::Cpu;
use crate::throughput::{pipelined, BODY_BYTES, WINDOW};

/// The work queue of requests and commands, and its subjects' prefix.
const WORK: &str = "BENCH_EXEC_WORK";
/// The events of every execution.
const EVENTS: &str = "BENCH_EXEC_EVENTS";
/// The headers.
const BUCKET: &str = "bench_exec";

/// How long the floor's executions may take in all before the run fails.
const TIMEOUT: Duration = Duration::from_secs(300);

/// What is run.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Executions started at once.
    pub executions: usize,
    /// Steps of each.
    pub steps: usize,
    /// Messages each consumer handles at once.
    pub concurrency: usize,
    /// One command runs every step of an execution: the executor publishes
    /// each step's end and goes on to the next itself, and the router only
    /// moves the header (the shape of an executor that continues an
    /// unconditional chain; docs/performance.md "The executions' floor").
    pub chained: bool,
}

/// `executions` five-step executions at once, each consumer handling as
/// many messages at once as a mesh service does by default: the shape of
/// the bench's own executions.
pub fn shape(executions: usize) -> Shape {
    Shape {
        executions,
        steps: 5,
        concurrency: noetl_mesh::config::DEFAULT_CONCURRENCY,
        chained: false,
    }
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct ExecFloor {
    /// Executions completed per second, from the first request to the last end.
    pub exec_per_s: f64,
    /// Each execution's time from its request's publish to its end, ms.
    pub latencies_ms: Vec<f64>,
    /// CPU per execution, this process and nats-server, µs.
    pub cpu_us_per_exec: f64,
    /// Messages stored per execution, over both streams and the bucket.
    pub stored_per_exec: f64,
}

/// What the three handlers share.
struct Run {
    js: Context,
    headers: kv::Store,
    steps: usize,
    chained: bool,
    /// The header revision each execution's router write saw last (the
    /// engine's router keeps the same, so a boundary writes without reading).
    revisions: Mutex<HashMap<String, u64>>,
    /// Each execution's header writes, one at a time (a chained
    /// execution's ends may be handled at once), and how many were done.
    writing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<usize>>>>,
    /// When each execution's request went out, and when it ended.
    started: Mutex<HashMap<String, Instant>>,
    ended: Mutex<Vec<(String, Instant)>>,
    all_ended: Notify,
    executions: usize,
}

/// Run `shape` once on fresh streams and a fresh bucket, and time it.
pub async fn run(mesh: &Mesh, nats_pids: &[u32], shape: Shape) -> ExecFloor {
    let js = jetstream::new(mesh.client().clone());
    let (work, events, headers) = create(&js, mesh).await;
    let run = Arc::new(Run {
        js: js.clone(),
        headers,
        steps: shape.steps.max(1),
        chained: shape.chained,
        revisions: Mutex::new(HashMap::new()),
        writing: Mutex::new(HashMap::new()),
        started: Mutex::new(HashMap::new()),
        ended: Mutex::new(Vec::with_capacity(shape.executions)),
        all_ended: Notify::new(),
        executions: shape.executions,
    });
    let consumers = [
        (&work, "request", "bench_exec.request", Handler::Request),
        (&work, "task", "bench_exec.task", Handler::Task),
        (&events, "router", "bench_exec.evt.>", Handler::Boundary),
    ];
    let mut loops = Vec::new();
    for (stream, name, subject, handler) in consumers {
        loops.push(
            consume(
                stream,
                name,
                subject,
                handler,
                run.clone(),
                shape.concurrency,
            )
            .await,
        );
    }
    let eids: Vec<String> = (0..shape.executions)
        .map(|_| noetl_mesh::ids::new_execution_id())
        .collect();
    let ended = run.all_ended.notified();
    let before = Cpu::now(nats_pids);
    let t0 = Instant::now();
    pipelined(shape.executions, WINDOW, |i| {
        let (js, run, eid) = (&js, &run, &eids[i]);
        run.started
            .lock()
            .expect("not poisoned")
            .insert(eid.clone(), Instant::now());
        let msg = jetstream::message::PublishMessage::build()
            .payload(body(eid, 0))
            .message_id(derive_id(&[eid, "request"]));
        async move {
            js.send_publish("bench_exec.request", msg)
                .await
                .map(|ack| async move { ack.await.map(|_| ()).map_err(|e| e.to_string()) })
                .map_err(|e| e.to_string())
        }
    })
    .await
    .expect("the floor's requests");
    if shape.executions > 0 {
        tokio::time::timeout(TIMEOUT, ended)
            .await
            .expect("every floor execution ended in time");
    }
    let spent = Cpu::now(nats_pids).since(before);
    for l in loops {
        l.abort();
    }
    let stored = stored(&js, &[WORK, EVENTS, &format!("KV_{BUCKET}")]).await;
    delete(&js).await;
    let started = run.started.lock().expect("not poisoned");
    let ended = run.ended.lock().expect("not poisoned");
    assert_eq!(ended.len(), shape.executions, "every execution ended once");
    let last = ended.iter().map(|(_, at)| *at).max().unwrap_or(t0);
    let latencies_ms = ended
        .iter()
        .map(|(eid, at)| (*at - started[eid]).as_secs_f64() * 1000.0)
        .collect();
    let n = shape.executions.max(1) as f64;
    ExecFloor {
        exec_per_s: shape.executions as f64 / (last - t0).as_secs_f64(),
        latencies_ms,
        cpu_us_per_exec: spent.total().as_secs_f64() * 1e6 / n,
        stored_per_exec: stored as f64 / n,
    }
}

/// The streams and the bucket, fresh, with the mesh's settings.
async fn create(js: &Context, mesh: &Mesh) -> (stream::Stream, stream::Stream, kv::Store) {
    delete(js).await;
    let config = mesh.config();
    let stream_of = |name: &str, subjects: &[&str], retention| stream::Config {
        name: name.into(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        retention,
        storage: stream::StorageType::File,
        duplicate_window: config.duplicate_window,
        num_replicas: config.replicas,
        ..Default::default()
    };
    let work = js
        .create_stream(stream_of(
            WORK,
            &["bench_exec.request", "bench_exec.task"],
            stream::RetentionPolicy::WorkQueue,
        ))
        .await
        .expect("the floor's work stream");
    let events = js
        .create_stream(stream_of(
            EVENTS,
            &["bench_exec.evt.>"],
            stream::RetentionPolicy::Limits,
        ))
        .await
        .expect("the floor's events stream");
    let headers = js
        .create_key_value(kv::Config {
            bucket: BUCKET.into(),
            history: 1,
            storage: stream::StorageType::File,
            num_replicas: config.replicas,
            ..Default::default()
        })
        .await
        .expect("the floor's bucket");
    (work, events, headers)
}

async fn delete(js: &Context) {
    let _ = js.delete_stream(WORK).await;
    let _ = js.delete_stream(EVENTS).await;
    let _ = js.delete_key_value(BUCKET).await;
}

/// Messages ever stored in `streams`.
async fn stored(js: &Context, streams: &[&str]) -> u64 {
    let mut sum = 0;
    for name in streams {
        if let Ok(mut s) = js.get_stream(*name).await {
            if let Ok(info) = s.info().await {
                sum += info.state.last_sequence;
            }
        }
    }
    sum
}

/// Which of the three a consumer runs.
#[derive(Debug, Clone, Copy)]
enum Handler {
    /// A request: create the header, send the first command.
    Request,
    /// A command: the executor's end event.
    Task,
    /// An end: the header's compare-and-set, then the next command or the
    /// execution's end.
    Boundary,
}

/// A durable pull consumer of `subject` handing `concurrency` messages at
/// once to `handler`; every message is acked after its effects are stored.
async fn consume(
    stream: &stream::Stream,
    name: &str,
    subject: &str,
    handler: Handler,
    run: Arc<Run>,
    concurrency: usize,
) -> tokio::task::JoinHandle<()> {
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.into()),
            filter_subject: subject.into(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("the floor's consumer");
    let messages = consumer.messages().await.expect("the floor's messages");
    tokio::spawn(async move {
        messages
            .for_each_concurrent(concurrency.max(1), |m| {
                let run = run.clone();
                async move {
                    let m = m.expect("a floor message");
                    handle(&run, handler, &m.payload).await;
                    m.ack().await.expect("the floor's ack");
                }
            })
            .await
    })
}

/// One message's effects, stored before it is acked.
async fn handle(run: &Run, handler: Handler, payload: &[u8]) {
    let (eid, step) = parse(payload);
    match handler {
        Handler::Request => {
            let revision = run
                .headers
                .create(&eid, body(&eid, 0))
                .await
                .expect("the floor's header");
            remember(run, &eid, revision);
            publish(run, "bench_exec.task".into(), &eid, "command", 0).await;
        }
        Handler::Task => {
            let last = if run.chained { run.steps } else { step + 1 };
            for step in step..last {
                let subject = format!("bench_exec.evt.{eid}.step.done");
                publish(run, subject, &eid, "done", step).await;
            }
        }
        Handler::Boundary => {
            let writing = run
                .writing
                .lock()
                .expect("not poisoned")
                .entry(eid.clone())
                .or_default()
                .clone();
            let mut written = writing.lock().await;
            let seen = run.revisions.lock().expect("not poisoned")[&eid];
            let next = step + 1;
            let revision = run
                .headers
                .update(&eid, body(&eid, next), seen)
                .await
                .expect("the floor's compare-and-set");
            remember(run, &eid, revision);
            *written += 1;
            if next < run.steps && !run.chained {
                publish(run, "bench_exec.task".into(), &eid, "command", next).await;
            } else if *written == run.steps {
                let mut ended = run.ended.lock().expect("not poisoned");
                ended.push((eid, Instant::now()));
                if ended.len() == run.executions {
                    run.all_ended.notify_one();
                }
            }
        }
    }
}

fn remember(run: &Run, eid: &str, revision: u64) {
    run.revisions
        .lock()
        .expect("not poisoned")
        .insert(eid.to_string(), revision);
}

/// Publish step `step`'s message of kind `what` and wait for its ack.
async fn publish(run: &Run, subject: String, eid: &str, what: &str, step: usize) {
    let msg = jetstream::message::PublishMessage::build()
        .payload(body(eid, step))
        .message_id(derive_id(&[eid, what, &step.to_string()]));
    run.js
        .send_publish(subject, msg)
        .await
        .expect("the floor's publish")
        .await
        .expect("the floor's publish ack");
}

/// `<eid> <step>`, padded to an event's size.
fn body(eid: &str, step: usize) -> Bytes {
    let mut b = format!("{eid} {step} ").into_bytes();
    b.resize(BODY_BYTES.max(b.len()), b'x');
    b.into()
}

/// The execution id and step a [`body`] names.
fn parse(payload: &[u8]) -> (String, usize) {
    let text = std::str::from_utf8(payload).expect("a floor body is text");
    let mut parts = text.split(' ');
    let eid = parts.next().unwrap_or_default().to_string();
    let step = parts
        .next()
        .and_then(|s| s.parse().ok())
        .expect("a floor body names its step");
    (eid, step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_an_events_size_and_reads_back() {
        let b = body("0190abcdef", 4);
        assert_eq!(b.len(), BODY_BYTES);
        assert_eq!(parse(&b), ("0190abcdef".to_string(), 4));
    }
}
