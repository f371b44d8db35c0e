//! `noetl-bench --only <scenario> [--rounds N] [--size N]`: one scenario
//! of the bench (at the full run's size, or `--size`'s), alone, N times
//! (default 5) on the warm mesh, each round's figure and the
//! CPU it cost (this process and nats-server) printed, then their medians.
//! For comparing two builds on one scenario (run them alternately) and for
//! a profiler to watch one path. Writes no `results.json`.

use std::time::Duration;

use noetl_integration::Cluster;
use serde_json::{json, Value};

use crate::cpu::Cpu;
use crate::ends::Ends;
use crate::report;
use crate::scenarios as sc;
use crate::Plan;

/// The scenarios `--only` runs, as named on its command line.
pub const SCENARIOS: &[&str] = &[
    "floor",
    "latency-floor",
    "seq",
    "pipeline",
    "python40",
    "http",
    "big",
    "loop",
    "python-loop",
    "executions",
    "exec-floor",
    "exec-floor-chained",
    "api-status",
    HTTP_SCALE,
];

/// The scenario of the http loop's scale-out figures alone (1, 2 and 4
/// executor replicas, each on a mesh of its own).
pub const HTTP_SCALE: &str = "http-scale";

/// One round's figure and what it cost.
struct Round {
    value: f64,
    /// CPU per unit of work (step, task, iteration, message), µs.
    cpu_us: f64,
    /// nats-server's part of it, µs.
    nats_us: f64,
}

/// Set the size of scenario `name` (steps, tasks, items, messages...) to
/// `n` (`--size`).
pub fn resize(plan: &mut Plan, name: &str, n: usize) {
    match name {
        "floor" => plan.floor_msgs = n,
        "latency-floor" | "seq" => plan.steps = n,
        "pipeline" => plan.pipeline_tasks = n,
        "python40" => plan.python_steps = n,
        "http" => plan.http_steps = n,
        "big" => plan.big_mib = n,
        "loop" => plan.loop_items = n,
        "python-loop" => plan.python_items = n,
        "executions" | "exec-floor" | "exec-floor-chained" => plan.executions = n,
        HTTP_SCALE => plan.http_loop_items = n,
        _ => plan.api_reads = n,
    }
}

/// Run `name` `rounds` times and print each round and the medians.
pub async fn run(
    name: &str,
    rounds: usize,
    plan: &Plan,
    cluster: &Cluster,
    ends: &Ends,
    http: &Value,
) {
    let nats_pids = cluster.server.pids();
    let (unit, per): (&str, &str) = match name {
        "floor" => ("msgs/s", "message"),
        "latency-floor" | "seq" | "http" => ("ms per step", "step"),
        "pipeline" => ("ms per task", "task"),
        "python40" => ("s", "step"),
        "big" => ("MiB/s", "run"),
        "loop" | "python-loop" => ("tasks/s", "iteration"),
        "executions" | "exec-floor" | "exec-floor-chained" => ("exec/s", "execution"),
        "api-status" => ("reads/s", "read"),
        other => {
            eprintln!(
                "--only {other}: no such scenario; one of {}",
                SCENARIOS.join(", ")
            );
            std::process::exit(2);
        }
    };
    let api = if name == "api-status" {
        Some(noetl_integration::api::Api::serve(&cluster.mesh).await)
    } else {
        None
    };
    let mut out = Vec::with_capacity(rounds);
    // CPU over all rounds, and their units: steadier than a round's
    // (`/proc` counts in 10 ms ticks).
    let mut all = Cpu::default();
    let mut all_units = 0usize;
    let stored_before = stored(cluster).await;
    let exchanged_before = cluster.server.exchanged();
    for round in 0..rounds {
        let before = Cpu::now(&nats_pids);
        // (the figure, units of work it covered)
        let (value, units) = match name {
            "floor" => {
                let f = crate::throughput::run(
                    &cluster.mesh,
                    &nats_pids,
                    plan.floor_msgs,
                    plan.floor_window,
                )
                .await;
                (f.msgs_per_s, plan.floor_msgs)
            }
            "latency-floor" => {
                let d = crate::raw_hops(&cluster.mesh, plan.steps).await;
                (ms_per(d, plan.steps), plan.steps)
            }
            "seq" => {
                let chain = sc::chain("bench_chain", plan.steps, sc::NOOP);
                let d = sc::time_one(cluster, ends, &chain, json!({})).await;
                (ms_per(d, plan.steps), plan.steps)
            }
            "pipeline" => {
                let d = sc::time_one(cluster, ends, &sc::pipeline(plan.pipeline_tasks), json!({}))
                    .await;
                (ms_per(d, plan.pipeline_tasks), plan.pipeline_tasks)
            }
            "python40" => {
                let chain = sc::chain("bench_python40", plan.python_steps, sc::FIBO);
                let d = sc::time_one(cluster, ends, &chain, json!({})).await;
                (d.as_secs_f64(), plan.python_steps)
            }
            "http" => {
                let chain = sc::chain("bench_http", plan.http_steps, sc::HTTP);
                let d = sc::time_one(cluster, ends, &chain, http.clone()).await;
                (ms_per(d, plan.http_steps), plan.http_steps)
            }
            "big" => {
                let (d, ctx) =
                    sc::ctx_of(cluster, ends, &sc::big_result(plan.big_mib), json!({})).await;
                assert_eq!(
                    ctx["size"],
                    plan.big_mib * 1024 * 1024,
                    "the big result arrived whole"
                );
                (plan.big_mib as f64 / d.as_secs_f64(), 1)
            }
            "loop" => {
                let yaml = sc::parallel_loop(plan.loop_items, plan.loop_mif, sc::LOOP_NOOP);
                let (d, ctx) = sc::ctx_of(cluster, ends, &yaml, json!({})).await;
                assert_eq!(
                    ctx["total"], plan.loop_items,
                    "every noop iteration counted once"
                );
                (plan.loop_items as f64 / d.as_secs_f64(), plan.loop_items)
            }
            "python-loop" => {
                let yaml = sc::parallel_loop(plan.python_items, plan.loop_mif, sc::LOOP_PYTHON);
                let (d, ctx) = sc::ctx_of(cluster, ends, &yaml, json!({})).await;
                let squares: u64 = (0..plan.python_items as u64).map(|i| i * i).sum();
                assert_eq!(ctx["total"], squares, "every python iteration counted once");
                (
                    plan.python_items as f64 / d.as_secs_f64(),
                    plan.python_items,
                )
            }
            "executions" => {
                let (rate, _) = sc::concurrent(cluster, ends, plan.executions, 5).await;
                (rate, plan.executions)
            }
            "exec-floor" | "exec-floor-chained" => {
                let shape = crate::exec_floor::Shape {
                    chained: name == "exec-floor-chained",
                    ..crate::exec_floor::shape(plan.executions)
                };
                let f = crate::exec_floor::run(&cluster.mesh, &nats_pids, shape).await;
                println!(
                    "{name}: {:.1} messages stored per execution, latency p99 {:.0} ms",
                    f.stored_per_exec,
                    report::stats(&f.latencies_ms).p99
                );
                (f.exec_per_s, plan.executions)
            }
            _ => {
                let api = api.as_ref().expect("the API is served");
                let r = crate::api_status::run(cluster, ends, api, plan.executions, plan.api_reads)
                    .await;
                (r.api_per_s, plan.api_reads)
            }
        };
        let spent = Cpu::now(&nats_pids).since(before);
        all.engine += spent.engine;
        all.nats += spent.nats;
        all_units += units;
        let us = |d: Duration| d.as_secs_f64() * 1e6 / units as f64;
        let r = Round {
            value,
            cpu_us: us(spent.total()),
            nats_us: us(spent.nats),
        };
        println!(
            "{name} round {}/{rounds}: {} {unit}; CPU {:.0} µs per {per} (nats-server {:.0})",
            round + 1,
            fmt(r.value),
            r.cpu_us,
            r.nats_us
        );
        out.push(r);
    }
    let exchanged_after = cluster.server.exchanged();
    let median = |f: fn(&Round) -> f64| report::stats(&out.iter().map(f).collect::<Vec<_>>());
    let (v, c, n) = (
        median(|r| r.value),
        median(|r| r.cpu_us),
        median(|r| r.nats_us),
    );
    let stored_after = stored(cluster).await;
    let written: Vec<String> = stored_after
        .iter()
        .filter_map(|(name, seq)| {
            let was = stored_before.get(name).copied().unwrap_or(0);
            (*seq > was).then(|| format!("{name} {:.1}", (*seq - was) as f64 / rounds as f64))
        })
        .collect();
    println!(
        "{name}: messages stored per round, by stream: {}",
        written.join(", ")
    );
    let over_all = |d: Duration| d.as_secs_f64() * 1e6 / all_units.max(1) as f64;
    println!(
        "{name}, median of {rounds}: {} {unit} ({}–{}); CPU {:.0} µs per {per} ({:.0}–{:.0}; nats-server {:.0}); over all rounds {:.1} µs per {per} (nats-server {:.1})",
        fmt(v.median),
        fmt(v.min),
        fmt(v.max),
        c.median,
        c.min,
        c.max,
        n.median,
        over_all(all.total()),
        over_all(all.nats)
    );
    if let (Some(was), Some(is)) = (exchanged_before, exchanged_after) {
        let each = |a: u64, b: u64| a.saturating_sub(b) as f64 / all_units.max(1) as f64;
        println!(
            "{name}: nats-server took in {:.1} and sent out {:.1} client messages per {per} over all rounds (its /varz: publishes, requests and acks in; deliveries, replies and acks out)",
            each(is.0, was.0),
            each(is.1, was.1)
        );
    }
}

/// Every stream's last sequence (messages ever stored, KV buckets too).
async fn stored(cluster: &Cluster) -> std::collections::BTreeMap<String, u64> {
    use futures::TryStreamExt;
    let js = cluster.mesh.js();
    let names: Vec<String> = js.stream_names().try_collect().await.unwrap_or_default();
    let mut out = std::collections::BTreeMap::new();
    for name in names {
        if let Ok(mut s) = js.get_stream(&name).await {
            if let Ok(info) = s.info().await {
                out.insert(name, info.state.last_sequence);
            }
        }
    }
    out
}

fn ms_per(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1000.0 / n as f64
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}
