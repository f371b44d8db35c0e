//! `make bench`: a chain of N sequential noop steps through the whole mesh,
//! and, in the same run against the same server, the bare JetStream hops one
//! step needs (token publish → pull, command publish → pull, event publish →
//! pull, one KV compare-and-set). Prints both per step and their ratio.
//! Then a parallel noop loop of `--loop-items` iterations, each on a fresh
//! server, with 1, 2 and 4 executor replicas (each its own connection):
//! iterations/s and the ratio to one replica.
//!
//! Usage: `noetl-bench [--steps N] [--rounds R] [--loop-items N]`.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use noetl_integration::{Cluster, ClusterOptions};
use serde_json::json;

fn chain_playbook(n: usize) -> String {
    let mut y = String::from(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: bench_chain\nworkflow:\n",
    );
    for i in 0..n {
        y.push_str(&format!(
            "  - step: s{i}\n    tool:\n      - name: t\n        kind: noop\n"
        ));
        if i + 1 < n {
            y.push_str(&format!(
                "    next:\n      arcs:\n        - step: s{}\n",
                i + 1
            ));
        }
    }
    y
}

async fn engine_chain(cluster: &Cluster, n: usize) -> Duration {
    let yaml = chain_playbook(n);
    let t0 = Instant::now();
    let eid = cluster.submit(&yaml, "bench_chain.yaml", json!({})).await;
    let s = cluster.wait(&eid, Duration::from_secs(600)).await;
    let took = t0.elapsed();
    assert_eq!(
        format!("{:?}", s.status),
        "Completed",
        "bench chain did not complete: {:?}",
        s.error
    );
    took
}

fn loop_playbook(n: usize) -> String {
    format!(
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: bench_loop }}
workflow:
  - step: start
    loop:
      in: "{{{{ range({n}) | list }}}}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 64
        policy:
          reducers: {{ total: sum }}
    tool:
      - name: touch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: {{ set_ctx: {{ total: 1 }} }}
"#
    )
}

/// Iterations per second of an `n`-item parallel noop loop on a fresh
/// server with `executors` executor replicas (after a short warm-up loop).
async fn loop_throughput(n: usize, executors: usize) -> f64 {
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        ..ClusterOptions::default()
    })
    .await;
    let mut handles = Vec::new();
    for _ in 0..executors {
        handles.push(cluster.spawn_executor_for(&["noop"], 16).await);
    }
    let mut took = Duration::ZERO;
    for (items, name) in [(50, "warm-up"), (n, "bench")] {
        let t0 = Instant::now();
        let eid = cluster
            .submit(&loop_playbook(items), "bench_loop.yaml", json!({}))
            .await;
        let s = cluster.wait(&eid, Duration::from_secs(600)).await;
        took = t0.elapsed();
        assert_eq!(
            s.ctx["total"], items,
            "{name} loop with {executors} executors: every item counted once ({:?}: {:?})",
            s.status, s.error
        );
    }
    // Nothing is in flight once the loop is done.
    for h in handles {
        h.abort();
    }
    cluster.stop().await;
    n as f64 / took.as_secs_f64()
}

async fn raw_hops(client: async_nats::Client, n: usize) -> Duration {
    let js = jetstream::new(client);
    let _ = js.delete_stream("BENCH_RAW").await;
    let stream = js
        .get_or_create_stream(stream::Config {
            name: "BENCH_RAW".into(),
            subjects: vec!["bench.>".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .expect("bench stream");
    let mut subs = Vec::new();
    for name in ["token", "task", "evt"] {
        let c = stream
            .get_or_create_consumer(
                name,
                pull::Config {
                    durable_name: Some(name.into()),
                    filter_subject: format!("bench.{name}"),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ..Default::default()
                },
            )
            .await
            .expect("bench consumer");
        subs.push(c.messages().await.expect("messages"));
    }
    let kv = match js.get_key_value("bench_raw").await {
        Ok(kv) => kv,
        Err(_) => js
            .create_key_value(jetstream::kv::Config {
                bucket: "bench_raw".into(),
                ..Default::default()
            })
            .await
            .expect("bench kv"),
    };
    let mut rev = kv.put("h", "0".into()).await.expect("kv put");
    let t0 = Instant::now();
    for i in 0..n {
        for (k, name) in ["token", "task", "evt"].iter().enumerate() {
            js.send_publish(
                format!("bench.{name}"),
                jetstream::message::PublishMessage::build()
                    .payload(format!("{i}").into())
                    .message_id(format!("{name}-{i}")),
            )
            .await
            .expect("publish")
            .await
            .expect("ack");
            let m = subs[k].next().await.expect("message").expect("message ok");
            m.ack().await.expect("ack message");
        }
        rev = kv
            .update("h", format!("{i}").into(), rev)
            .await
            .expect("kv cas");
    }
    t0.elapsed()
}

#[tokio::main]
async fn main() {
    let mut steps = 1000usize;
    let mut rounds = 3usize;
    let mut loop_items = 2000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--steps" => steps = args.next().and_then(|v| v.parse().ok()).expect("--steps N"),
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--rounds R")
            }
            "--loop-items" => {
                loop_items = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--loop-items N")
            }
            other => {
                eprintln!("unknown argument {other}; usage: noetl-bench [--steps N] [--rounds R] [--loop-items N]");
                std::process::exit(2);
            }
        }
    }
    let cluster = Cluster::start_with(ClusterOptions::default()).await;
    // Warm-up: caches, consumers, connections.
    engine_chain(&cluster, 20).await;
    raw_hops(cluster.mesh.client().clone(), 50).await;

    println!("noetl bench: {steps}-step sequential noop chain, {rounds} rounds (median)");
    let mut engine = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..rounds {
        engine.push(engine_chain(&cluster, steps).await);
        raw.push(raw_hops(cluster.mesh.client().clone(), steps).await);
    }
    engine.sort();
    raw.sort();
    let e = engine[rounds / 2].as_secs_f64() * 1000.0 / steps as f64;
    let r = raw[rounds / 2].as_secs_f64() * 1000.0 / steps as f64;
    println!("engine step       : {e:.3} ms/step  (token → scheduler → executor → event → router → next token)");
    println!("raw JetStream hops: {r:.3} ms/step  (3 × publish+ack+pull+ack, 1 KV CAS)");
    println!("ratio engine/raw  : {:.2}x", e / r);
    cluster.stop().await;

    println!("\nnoetl bench: {loop_items}-item parallel noop loop (max_in_flight 64), fresh server per run");
    let mut one = 0.0;
    for executors in [1, 2, 4] {
        let rate = loop_throughput(loop_items, executors).await;
        if executors == 1 {
            one = rate;
        }
        println!(
            "executors {executors}: {rate:>8.0} iterations/s  ({:.2}x of 1 executor)",
            rate / one
        );
    }
}
