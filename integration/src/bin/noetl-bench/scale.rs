//! Scale-out: the same loop on a fresh server with more replicas of one
//! service. Two questions: does a latency-bound loop (http tasks against
//! a server that answers after 20 ms) run faster with more executor
//! replicas, as the chart's scaling knob promises; and are two replicas
//! of the router, scheduler and loop-supervisor no slower than one on the
//! noop loop (they share their work through JetStream, not a leader).

use std::time::{Duration, Instant};

use noetl_integration::{Cluster, ClusterOptions, Gauge};
use serde_json::json;

use crate::cpu;
use crate::scenarios as sc;

/// How long the bench's server holds each request of the http loop.
pub const HTTP_HOLD: Duration = Duration::from_millis(20);

/// Messages each executor replica handles at once in the http loop.
pub const HTTP_CONCURRENCY: usize = 16;

/// One loop run on its own cluster.
pub struct LoopRun {
    /// Items of the measured loop.
    pub items: usize,
    /// Replicas of the router, scheduler and loop-supervisor.
    pub control: usize,
    /// Executor replicas (each serving only the loop's kind).
    pub executors: usize,
    /// Messages each executor handles at once.
    pub executor_concurrency: usize,
    /// `true`: http tasks against a server holding each call for
    /// [`HTTP_HOLD`]; `false`: noop tasks.
    pub http: bool,
    /// Most iterations per loop batch (`NOETL_LOOP_BATCH`).
    pub loop_batch: usize,
}

/// What one run measured.
pub struct Rate {
    /// Iterations per second.
    pub per_s: f64,
    /// How busy the machine's cores were meanwhile (CPU of this process
    /// and of nats-server over wall time and cores; 1.0 is all of them).
    pub busy: f64,
}

/// Iterations per second of `run`'s parallel loop (`max_in_flight` 256),
/// after a 50-item warm-up loop; asserts every item was counted once (and,
/// for http, that the server answered every call).
pub async fn loop_rate(run: LoopRun) -> Rate {
    let cluster = Cluster::start_with(ClusterOptions {
        executors: false,
        replicas: run.control,
        loop_batch: run.loop_batch,
        ..ClusterOptions::default()
    })
    .await;
    let kind = if run.http { "http" } else { "noop" };
    let mut handles = Vec::new();
    for _ in 0..run.executors {
        handles.push(
            cluster
                .spawn_executor_for(&[kind], run.executor_concurrency)
                .await,
        );
    }
    let (gauge, url) = Gauge::serve(HTTP_HOLD).await;
    let body = if run.http {
        sc::LOOP_HTTP
    } else {
        sc::LOOP_NOOP
    };
    let mut took = Duration::ZERO;
    let mut spent = Duration::ZERO;
    for (items, name) in [(50, "warm-up"), (run.items, "bench")] {
        let yaml = sc::parallel_loop(items, 256, body);
        let before = cpu::Cpu::now(&cluster.server.pids());
        let t0 = Instant::now();
        let eid = cluster
            .submit(&yaml, "bench_scale.yaml", json!({ "url": url }))
            .await;
        let s = cluster.wait(&eid, sc::TIMEOUT).await;
        took = t0.elapsed();
        spent = cpu::Cpu::now(&cluster.server.pids()).since(before).total();
        assert_eq!(
            s.ctx["total"], items,
            "{name} {kind} loop, {} control replicas, {} executors: every item counted once ({:?}: {:?})",
            run.control, run.executors, s.status, s.error
        );
    }
    if run.http {
        assert_eq!(gauge.total(), 50 + run.items, "every http call answered");
    }
    for h in handles {
        h.abort();
    }
    cluster.stop().await;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Rate {
        per_s: run.items as f64 / took.as_secs_f64(),
        busy: spent.as_secs_f64() / (took.as_secs_f64() * cores as f64),
    }
}

/// The scale-out figures, each with its `results.json` key, with loop
/// batches of at most `loop_batch` iterations.
pub async fn figures(
    noop_items: usize,
    http_items: usize,
    loop_batch: usize,
) -> Vec<(&'static str, f64)> {
    let mut out = http_figures(http_items, loop_batch).await;
    out.extend(noop_figures(noop_items, loop_batch).await);
    out
}

/// The latency-bound http loop by executor replicas (1, 2, 4), each with
/// its `results.json` key: `http_items` per replica, so every run lasts
/// about as long. With the same items for all, four replicas ran the loop
/// in a quarter of the time, so what a run costs whatever its length
/// (about 50 ms: the execution's start, the first window, the end) weighed
/// four times as much in their run as in one replica's: their ratio read
/// 5 % low and spread by a tenth (docs/performance.md).
pub async fn http_figures(http_items: usize, loop_batch: usize) -> Vec<(&'static str, f64)> {
    let mut out = Vec::new();
    println!(
        "\nlatency-bound http loop ({http_items} items per executor, server answers after {} ms, executor concurrency {HTTP_CONCURRENCY}), fresh server per run, by executor replicas:",
        HTTP_HOLD.as_millis()
    );
    let mut one = 0.0;
    for (executors, key) in [
        (1, "loop_http_1_executor_per_s"),
        (2, "loop_http_2_executors_per_s"),
        (4, "loop_http_4_executors_per_s"),
    ] {
        let rate = loop_rate(LoopRun {
            items: http_items * executors,
            control: 1,
            executors,
            executor_concurrency: HTTP_CONCURRENCY,
            http: true,
            loop_batch,
        })
        .await;
        if executors == 1 {
            one = rate.per_s;
        }
        let goal = match executors {
            2 => " (goal >= 1.9x)",
            4 => " (goal >= 3.5x)",
            _ => "",
        };
        println!(
            "  executors {executors}: {:>8.0} iterations/s  ({:.2}x of 1 executor{goal}; bound {:.0}/s; cores {:.0}% busy)",
            rate.per_s,
            rate.per_s / one,
            (executors * HTTP_CONCURRENCY) as f64 / HTTP_HOLD.as_secs_f64(),
            rate.busy * 100.0
        );
        out.push((key, rate.per_s));
    }
    out
}

/// The noop loop by replicas of the executor and of the control services,
/// each with its `results.json` key.
async fn noop_figures(noop_items: usize, loop_batch: usize) -> Vec<(&'static str, f64)> {
    let mut out = Vec::new();
    println!("\nparallel noop loop, {noop_items} items, fresh server per run, by replicas:");
    let mut one = 0.0;
    for (control, executors, key) in [
        (1, 1, "loop_1_executor_per_s"),
        (1, 2, "loop_2_executors_per_s"),
        (1, 4, "loop_4_executors_per_s"),
        (2, 1, "loop_2_control_replicas_per_s"),
    ] {
        let rate = loop_rate(LoopRun {
            items: noop_items,
            control,
            executors,
            executor_concurrency: 16,
            http: false,
            loop_batch,
        })
        .await;
        if key == "loop_1_executor_per_s" {
            one = rate.per_s;
        }
        println!(
            "  router/scheduler/loop-supervisor x{control}, executors {executors}: {:>8.0} iterations/s  ({:.2}x of one each; cores {:.0}% busy)",
            rate.per_s,
            rate.per_s / one,
            rate.busy * 100.0
        );
        out.push((key, rate.per_s));
    }
    out
}
