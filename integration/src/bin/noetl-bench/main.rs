//! `make bench`: the engine against the physical floor, on one machine, in
//! one run. It starts its own nats-server, warms the mesh up, then runs each
//! scenario (sequential chain, pipeline, parallel noop and python loops,
//! 40 python steps, an http chain, 1,000 executions at once, a 20 MiB
//! result, the HTTP API's status reads and event stream), and the bare
//! JetStream operations each needs as the floor. It
//! prints a table (median, p99, min–max over the repeats, and the ratio to
//! the floor where one applies) and writes `target/bench/results.json`.
//!
//! Two floors: the latency floor (one step's bare JetStream hops and KV
//! compare-and-set, `floor_step_ms`) and the throughput floor (pipelined
//! acknowledged publishes, `throughput_floor_msgs_per_s` and
//! `cpu_us_per_floor_msg`, throughput.rs); issue 37's goals are ratios to
//! them, printed and written too. The executions also run against a
//! floor of their own shape, bare JetStream with a command, an event and a
//! header compare-and-set per step (`exec_floor_per_s`, exec_floor.rs).
//!
//! Usage: `noetl-bench [--quick | --profile-seq | --profile-http |
//! --profile-loop | --profile-api] [--only <scenario> [--rounds N]
//! [--size N]] [--window N] [--loop-batch N]` (`make bench`, `make bench QUICK=1`). `--profile-seq`
//! (`--profile-http`) runs only the floor and the noop (http) chain, five
//! times, and `--profile-loop` only the 10,000-item noop loop, five times,
//! for a profiler to watch (docs/performance.md). `--only` runs one
//! scenario alone (only.rs), `--window` sets the throughput floor's window
//! of outstanding acks (default 1,024), `--loop-batch` the most iterations
//! a loop batch carries (`NOETL_LOOP_BATCH`, default 64) in the main mesh
//! and the replica figures. `--only http-scale` runs only the http loop's
//! scale-out figures (1, 2 and 4 executors, one round).

mod api_sse;
mod api_status;
mod bytes;
mod cpu;
mod ends;
mod exec_floor;
mod only;
mod procs;
mod report;
mod scale;
mod scenarios;
mod throughput;

/// The allocator the `noetl` binary runs with, so that the engine measured
/// in process is the engine deployed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use noetl_integration::{Cluster, ClusterOptions, Gauge};
use noetl_mesh::server::SyncPolicy;
use serde_json::json;

use ends::Ends;
use report::Figure;
use scenarios as sc;

/// Sizes and repeats of a run.
pub struct Plan {
    rounds: usize,
    steps: usize,
    pipeline_tasks: usize,
    loop_items: usize,
    loop_mif: usize,
    python_items: usize,
    python_steps: usize,
    http_steps: usize,
    executions: usize,
    big_mib: usize,
    /// Status reads through the API while `executions` run.
    api_reads: usize,
    /// Marker events timed through the API's event stream.
    sse_events: usize,
    /// Also measure the loops with 1, 2 and 4 executor replicas, and two
    /// of each other service.
    replicas: bool,
    /// Items per executor replica of the latency-bound http loop of the
    /// scale-out figures.
    http_loop_items: usize,
    /// Messages of each throughput-floor measurement.
    floor_msgs: usize,
    /// The throughput floor's acks outstanding at most.
    floor_window: usize,
}

impl Plan {
    fn full() -> Self {
        Self {
            rounds: 3,
            steps: 1000,
            pipeline_tasks: 100,
            loop_items: 10_000,
            loop_mif: 256,
            python_items: 2000,
            python_steps: 40,
            http_steps: 100,
            executions: 1000,
            big_mib: 20,
            api_reads: 20_000,
            sse_events: 1000,
            replicas: true,
            http_loop_items: 2000,
            floor_msgs: 100_000,
            floor_window: throughput::WINDOW,
        }
    }

    fn quick() -> Self {
        Self {
            rounds: 1,
            steps: 200,
            loop_items: 1000,
            python_items: 200,
            http_steps: 50,
            executions: 100,
            big_mib: 5,
            api_reads: 2000,
            sse_events: 200,
            replicas: false,
            floor_msgs: 30_000,
            ..Self::full()
        }
    }
}

async fn raw_hops(mesh: &noetl_mesh::Mesh, n: usize) -> Duration {
    let js = jetstream::new(mesh.client().clone());
    let _ = js.delete_stream("BENCH_RAW").await;
    let stream = js
        .get_or_create_stream(stream::Config {
            name: "BENCH_RAW".into(),
            subjects: vec!["bench.>".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: mesh.config().replicas,
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

fn usage() -> ! {
    eprintln!(
        "usage: noetl-bench [--quick | --profile-seq | --profile-http | --profile-loop | --profile-api] [--only <scenario> [--rounds N] [--size N]] [--window N] [--loop-batch N] [--sync interval|always] [--nodes 1|3|5]; scenarios: {}",
        only::SCENARIOS.join(", ")
    );
    std::process::exit(2);
}

/// A positive count given after an option, else the usage.
fn number(arg: Option<String>) -> usize {
    arg.and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| usage())
}

#[tokio::main]
async fn main() {
    let mut plan = Plan::full();
    // A chain to run alone under a profiler: (name, task, steps).
    let mut profile: Option<(&str, &str, usize)> = None;
    let mut profile_loop = false;
    let mut profile_api = false;
    let mut only: Option<String> = None;
    let mut rounds: Option<usize> = None;
    let mut window: Option<usize> = None;
    let mut size: Option<usize> = None;
    let mut sync = SyncPolicy::default();
    let mut nodes = 1;
    let mut loop_batch = noetl_mesh::config::DEFAULT_LOOP_BATCH;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => plan = Plan::quick(),
            "--profile-seq" => profile = Some(("noop", sc::NOOP, 1000)),
            "--profile-http" => profile = Some(("http", sc::HTTP, 300)),
            "--profile-loop" => profile_loop = true,
            "--profile-api" => profile_api = true,
            "--rounds" => rounds = Some(number(args.next())),
            "--window" => window = Some(number(args.next())),
            "--size" => size = Some(number(args.next())),
            // Most iterations per loop batch (`NOETL_LOOP_BATCH`), for the
            // main cluster and the replica figures (the per-service figures
            // run `noetl` processes with the default).
            "--loop-batch" => {
                loop_batch = number(args.next());
                if !(1..=noetl_mesh::config::MAX_LOOP_BATCH).contains(&loop_batch) {
                    usage()
                }
            }
            "--only" => only = Some(args.next().unwrap_or_else(|| usage())),
            // The private nats-server's disk writes, as `noetl run --sync`
            // sets them (the per-service and replica figures start servers
            // of their own with the default).
            "--sync" => {
                sync = match args.next().as_deref() {
                    Some("interval") => SyncPolicy::Interval,
                    Some("always") => SyncPolicy::Always,
                    _ => usage(),
                }
            }
            // Three or five clustered nats-servers, every stream and bucket
            // R3 or R5 (the per-service and replica figures still start one
            // server of their own).
            "--nodes" => {
                nodes = match args.next().as_deref() {
                    Some("1") => 1,
                    Some("3") => 3,
                    Some("5") => 5,
                    _ => usage(),
                }
            }
            "--help" | "-h" => usage(),
            other => {
                eprintln!("unknown argument {other}");
                usage()
            }
        }
    }
    if let Some(w) = window {
        plan.floor_window = w;
    }
    if only
        .as_deref()
        .is_some_and(|o| !only::SCENARIOS.contains(&o))
    {
        usage()
    }
    let started = Instant::now();
    if only.as_deref() == Some(only::HTTP_SCALE) {
        // Meshes of its own, one per replica count; one round.
        if let Some(n) = size {
            only::resize(&mut plan, only::HTTP_SCALE, n);
        }
        scale::http_figures(plan.http_loop_items, loop_batch).await;
        return;
    }
    let cluster = Cluster::start_with(ClusterOptions {
        sync,
        nodes,
        loop_batch,
        monitored: true,
        ..ClusterOptions::default()
    })
    .await;
    if loop_batch != noetl_mesh::config::DEFAULT_LOOP_BATCH {
        println!("loop batches of at most {loop_batch} iterations (NOETL_LOOP_BATCH)");
    }
    if nodes > 1 {
        println!("{nodes} clustered nats-servers, every stream and bucket R{nodes}");
    }
    if sync == SyncPolicy::Always {
        println!("nats-server with sync_interval: always (every write fsynced before its ack)");
    }
    let ends = Ends::watch(&cluster.mesh).await;
    let (_gauge, url) = Gauge::serve(Duration::ZERO).await;
    let http = json!({ "url": url });
    // Warm-up: caches, consumers, connections, python interpreters.
    sc::time_one(&cluster, &ends, &sc::chain("warm", 20, sc::NOOP), json!({})).await;
    sc::time_one(
        &cluster,
        &ends,
        &sc::chain("warm_py", 4, sc::FIBO),
        json!({}),
    )
    .await;
    sc::time_one(
        &cluster,
        &ends,
        &sc::chain("warm_http", 4, sc::HTTP),
        http.clone(),
    )
    .await;
    // A steady pool of python interpreters, as a loaded executor has.
    let warm_loop = sc::parallel_loop(64, plan.loop_mif, sc::LOOP_PYTHON);
    sc::time_one(&cluster, &ends, &warm_loop, json!({})).await;
    raw_hops(&cluster.mesh, 50).await;

    let per = |d: Duration, n: usize| d.as_secs_f64() * 1000.0 / n as f64;
    if let Some(name) = only {
        if let Some(n) = size {
            only::resize(&mut plan, &name, n);
        }
        only::run(&name, rounds.unwrap_or(5), &plan, &cluster, &ends, &http).await;
        cluster.stop().await;
        return;
    }
    if profile_api {
        // The status reads of the quick plan, five times.
        let quick = Plan::quick();
        let api = noetl_integration::api::Api::serve(&cluster.mesh).await;
        for _ in 0..5 {
            let r = api_status::run(&cluster, &ends, &api, quick.executions, quick.api_reads).await;
            eprintln!(
                "status reads: {:.0}/s, floor {:.0}/s ({:.2}x)",
                r.api_per_s,
                r.floor_per_s,
                r.api_per_s / r.floor_per_s
            );
        }
        drop(api);
        cluster.stop().await;
        return;
    }
    if profile_loop {
        let noop_loop = sc::parallel_loop(plan.loop_items, plan.loop_mif, sc::LOOP_NOOP);
        for _ in 0..5 {
            let (d, ctx) = sc::ctx_of(&cluster, &ends, &noop_loop, json!({})).await;
            assert_eq!(
                ctx["total"], plan.loop_items,
                "every iteration counted once"
            );
            eprintln!(
                "parallel noop loop: {:.0} tasks/s",
                plan.loop_items as f64 / d.as_secs_f64()
            );
        }
        cluster.stop().await;
        return;
    }
    if let Some((what, task, steps)) = profile {
        let chain = sc::chain("profile_chain", steps, task);
        for _ in 0..5 {
            let floor = per(raw_hops(&cluster.mesh, steps).await, steps);
            let step = per(
                sc::time_one(&cluster, &ends, &chain, http.clone()).await,
                steps,
            );
            eprintln!(
                "floor {floor:.3} ms, sequential {what} step {step:.3} ms ({:.2}x)",
                step / floor
            );
        }
        cluster.stop().await;
        return;
    }
    let mut floor = Vec::new();
    let mut tput = Vec::new();
    let mut cpu_floor_msg = Vec::new();
    let mut floor_nats_us = Vec::new();
    let mut floor_bytes = 0.0;
    let mut seq = Vec::new();
    let mut pipe = Vec::new();
    let mut py40 = Vec::new();
    let mut http_step = Vec::new();
    let mut big = Vec::new();
    let mut cpu_step = Vec::new();
    let mut cpu_step_nats = Duration::ZERO;
    let mut cpu_step_all = Duration::ZERO;
    let nats_pids = cluster.server.pids();
    let chain = sc::chain("bench_chain", plan.steps, sc::NOOP);
    let pipeline = sc::pipeline(plan.pipeline_tasks);
    let python = sc::chain("bench_python40", plan.python_steps, sc::FIBO);
    let http_chain = sc::chain("bench_http", plan.http_steps, sc::HTTP);
    let big_yaml = sc::big_result(plan.big_mib);
    for round in 0..plan.rounds {
        eprintln!("round {}/{}", round + 1, plan.rounds);
        floor.push(per(raw_hops(&cluster.mesh, plan.steps).await, plan.steps));
        let t = throughput::run(
            &cluster.mesh,
            &nats_pids,
            plan.floor_msgs,
            plan.floor_window,
        )
        .await;
        tput.push(t.msgs_per_s);
        cpu_floor_msg.push(t.cpu_us_per_msg);
        floor_nats_us.push(t.nats_us_per_msg);
        floor_bytes = t.stored_bytes_per_msg;
        let before = cpu::Cpu::now(&nats_pids);
        seq.push(per(
            sc::time_one(&cluster, &ends, &chain, json!({})).await,
            plan.steps,
        ));
        let spent = cpu::Cpu::now(&nats_pids).since(before);
        cpu_step.push(spent.total().as_secs_f64() * 1e6 / plan.steps as f64);
        cpu_step_nats += spent.nats;
        cpu_step_all += spent.total();
        let d = sc::time_one(&cluster, &ends, &pipeline, json!({})).await;
        pipe.push(per(d, plan.pipeline_tasks));
        py40.push(
            sc::time_one(&cluster, &ends, &python, json!({}))
                .await
                .as_secs_f64(),
        );
        let d = sc::time_one(&cluster, &ends, &http_chain, http.clone()).await;
        http_step.push(per(d, plan.http_steps));
        let (d, ctx) = sc::ctx_of(&cluster, &ends, &big_yaml, json!({})).await;
        assert_eq!(
            ctx["size"],
            plan.big_mib * 1024 * 1024,
            "the big result arrived whole"
        );
        big.push(plan.big_mib as f64 / d.as_secs_f64());
    }
    eprintln!("loops");
    // Each loop and the executions run `plan.rounds` times, and their
    // goals read the medians: the first round of a fresh mesh also pays
    // for growing the processes' memory (docs/performance.md "Medians of
    // the loops").
    let noop_loop = sc::parallel_loop(plan.loop_items, plan.loop_mif, sc::LOOP_NOOP);
    let items = plan.loop_items as f64;
    let (bytes_before, events_before) = cpu::event_bytes(&cluster.mesh).await;
    let (mut loop_rates, mut cpu_iterations) = (Vec::new(), Vec::new());
    let mut loop_cpu = cpu::Cpu::default();
    for round in 0..plan.rounds {
        let before = cpu::Cpu::now(&nats_pids);
        let (d, ctx) = sc::ctx_of(&cluster, &ends, &noop_loop, json!({})).await;
        let spent = cpu::Cpu::now(&nats_pids).since(before);
        assert_eq!(
            ctx["total"],
            plan.loop_items,
            "every noop iteration counted once (round {})",
            round + 1
        );
        loop_rates.push(items / d.as_secs_f64());
        cpu_iterations.push(spent.total().as_secs_f64() * 1e6 / items);
        loop_cpu.engine += spent.engine;
        loop_cpu.nats += spent.nats;
    }
    let (bytes_after, events_after) = cpu::event_bytes(&cluster.mesh).await;
    let loop_rate = report::stats(&loop_rates).median;
    let cpu_iteration = report::stats(&cpu_iterations).median;
    let all_items = items * plan.rounds as f64;
    let event_bytes_iteration = bytes_after.saturating_sub(bytes_before) as f64 / all_items;
    let events_iteration = events_after.saturating_sub(events_before) as f64 / all_items;
    bytes::breakdown(&cluster, &ends).await;
    let py_loop = sc::parallel_loop(plan.python_items, plan.loop_mif, sc::LOOP_PYTHON);
    let squares: u64 = (0..plan.python_items as u64).map(|i| i * i).sum();
    let mut py_rates = Vec::new();
    for _ in 0..plan.rounds {
        let (d, ctx) = sc::ctx_of(&cluster, &ends, &py_loop, json!({})).await;
        assert_eq!(ctx["total"], squares, "every python iteration counted once");
        py_rates.push(plan.python_items as f64 / d.as_secs_f64());
    }
    let py_rate = report::stats(&py_rates).median;
    eprintln!(
        "{} executions at once, {} times",
        plan.executions, plan.rounds
    );
    let (mut exec_rates, mut latencies) = (Vec::new(), Vec::new());
    let (mut exec_floors, mut exec_floor_cpu) = (Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        let (rate, l) = sc::concurrent(&cluster, &ends, plan.executions, 5).await;
        exec_rates.push(rate);
        latencies.extend(l);
        let shape = exec_floor::shape(plan.executions);
        let f = exec_floor::run(&cluster.mesh, &nats_pids, shape).await;
        exec_floors.push(f.exec_per_s);
        exec_floor_cpu.push(f.cpu_us_per_exec);
    }
    let exec_rate = report::stats(&exec_rates).median;
    let exec_floor_rate = report::stats(&exec_floors).median;
    eprintln!("HTTP API");
    let api = noetl_integration::api::Api::serve(&cluster.mesh).await;
    let reads = api_status::run(&cluster, &ends, &api, plan.executions, plan.api_reads).await;
    let sse = api_sse::run(&cluster.mesh, &api, plan.sse_events).await;
    drop(api);
    cluster.stop().await;

    let floor_ms = report::stats(&floor).median;
    let tput_median = report::stats(&tput).median;
    let cpu_floor_msg_median = report::stats(&cpu_floor_msg).median;
    let cpu_step_median = report::stats(&cpu_step).median;
    let seq_samples = seq.clone();
    let figures = vec![
        Figure {
            key: "floor_step_ms",
            label: "raw floor: one step's JetStream hops + KV CAS".into(),
            unit: "ms",
            samples: floor,
            floor: None,
        },
        Figure {
            key: "throughput_floor_msgs_per_s",
            label: format!(
                "throughput floor: acked publishes, window {}",
                plan.floor_window
            ),
            unit: "msgs/s",
            samples: tput,
            floor: None,
        },
        Figure {
            key: "cpu_us_per_floor_msg",
            label: "  CPU per floor message, engine + nats-server".into(),
            unit: "µs",
            samples: cpu_floor_msg,
            floor: None,
        },
        Figure {
            key: "seq_step_ms",
            label: format!("sequential noop step ({}-step chain)", plan.steps),
            unit: "ms",
            samples: seq,
            floor: Some(floor_ms),
        },
        Figure {
            key: "pipeline_task_ms",
            label: format!(
                "pipeline task (one step, {} noop tasks)",
                plan.pipeline_tasks
            ),
            unit: "ms",
            samples: pipe,
            floor: Some(floor_ms),
        },
        Figure {
            key: "loop_tasks_per_s",
            label: format!(
                "parallel noop loop ({} items, mif {})",
                plan.loop_items, plan.loop_mif
            ),
            unit: "tasks/s",
            samples: loop_rates,
            floor: None,
        },
        Figure {
            key: "cpu_us_per_step",
            label: "CPU per sequential noop step, engine + nats-server".into(),
            unit: "µs",
            samples: cpu_step,
            floor: None,
        },
        Figure {
            key: "cpu_us_per_iteration",
            label: "CPU per noop loop iteration, engine + nats-server".into(),
            unit: "µs",
            samples: cpu_iterations,
            floor: None,
        },
        Figure {
            key: "event_bytes_per_iteration",
            label: "events stored per noop loop iteration".into(),
            unit: "bytes",
            samples: vec![event_bytes_iteration],
            floor: None,
        },
        Figure {
            key: "loop_python_tasks_per_s",
            label: format!("parallel python loop ({} items)", plan.python_items),
            unit: "tasks/s",
            samples: py_rates,
            floor: None,
        },
        Figure {
            key: "python40_s",
            label: format!("{} sequential python steps, fibo(10)", plan.python_steps),
            unit: "s",
            samples: py40,
            floor: None,
        },
        Figure {
            key: "http_step_ms",
            label: format!("http step ({}-step chain, local server)", plan.http_steps),
            unit: "ms",
            samples: http_step,
            floor: Some(floor_ms),
        },
        Figure {
            key: "exec_per_s",
            label: format!("{} 5-step executions at once", plan.executions),
            unit: "exec/s",
            samples: exec_rates,
            floor: Some(exec_floor_rate),
        },
        Figure {
            key: "exec_latency_ms",
            label: "  their end-to-end latency".into(),
            unit: "ms",
            samples: latencies.clone(),
            floor: None,
        },
        Figure {
            key: "exec_floor_per_s",
            label: "  floor: raw JetStream, command + event + CAS a step".into(),
            unit: "exec/s",
            samples: exec_floors,
            floor: None,
        },
        Figure {
            key: "big_result_mib_per_s",
            label: format!("{} MiB result into the next step", plan.big_mib),
            unit: "MiB/s",
            samples: big,
            floor: None,
        },
        Figure {
            key: "api_status_reads_per_s",
            label: format!(
                "API status reads, {} clients, {} execs running",
                api_status::CLIENTS,
                plan.executions
            ),
            unit: "reads/s",
            samples: vec![reads.api_per_s],
            floor: Some(reads.floor_per_s),
        },
        Figure {
            key: "api_status_floor_per_s",
            label: "  floor: raw KV gets of the headers".into(),
            unit: "gets/s",
            samples: vec![reads.floor_per_s],
            floor: None,
        },
        Figure {
            key: "api_sse_latency_ms",
            label: format!(
                "API SSE delivery, publish to client ({} events)",
                plan.sse_events
            ),
            unit: "ms",
            samples: sse.api_ms.clone(),
            floor: Some(report::stats(&sse.floor_ms).median),
        },
        Figure {
            key: "api_sse_floor_latency_ms",
            label: "  floor: JetStream ordered consumer".into(),
            unit: "ms",
            samples: sse.floor_ms.clone(),
            floor: None,
        },
    ];
    report::print(&figures);
    let share = |part: Duration, all: Duration| {
        100.0 * part.as_secs_f64() / all.as_secs_f64().max(f64::MIN_POSITIVE)
    };
    println!(
        "\nCPU: a sequential step {:.0} µs (nats-server {:.0} %, the engine's services {:.0} %; goal none); a loop iteration {cpu_iteration:.0} µs (nats-server {:.0} %; goal <= 150 µs: {}); {events_iteration:.1} events, {event_bytes_iteration:.0} bytes stored per iteration (goal <= 300 bytes: {})",
        cpu_step_median,
        share(cpu_step_nats, cpu_step_all),
        100.0 - share(cpu_step_nats, cpu_step_all),
        share(loop_cpu.nats, loop_cpu.total()),
        if cpu_iteration <= 150.0 { "met" } else { "NOT met" },
        if event_bytes_iteration <= 300.0 { "met" } else { "NOT met" },
    );
    let (sse_p99, sse_floor_p99) = (
        report::stats(&sse.api_ms).p99,
        report::stats(&sse.floor_ms).p99,
    );
    println!(
        "\nAPI status reads: {:.0}/s ({:.2}x of the floor's {:.0} gets/s; goal >= 2,000/s: {}); answered RUNNING {}, COMPLETED {}, 404 not yet accepted {}; {} batches of {} executions",
        reads.api_per_s,
        reads.api_per_s / reads.floor_per_s,
        reads.floor_per_s,
        if reads.api_per_s >= 2000.0 { "met" } else { "NOT met" },
        reads.running,
        reads.completed,
        reads.missing,
        reads.batches,
        plan.executions
    );
    println!(
        "API SSE delivery p99: {sse_p99:.2} ms ({:.2}x of the floor's {sse_floor_p99:.2} ms; goal <= 50 ms: {})",
        sse_p99 / sse_floor_p99,
        if sse_p99 <= 50.0 { "met" } else { "NOT met" }
    );
    let goals = throughput::goals(&throughput::Measured {
        throughput_floor_msgs_per_s: tput_median,
        cpu_us_per_floor_msg: cpu_floor_msg_median,
        loop_tasks_per_s: loop_rate,
        loop_python_tasks_per_s: py_rate,
        exec_per_s: exec_rate,
        cpu_us_per_iteration: cpu_iteration,
        seq_step_ms: report::stats(&seq_samples).median,
        floor_step_ms: floor_ms,
    });
    println!(
        "\nThroughput floor: {:.0} msgs/s, {:.1} µs of CPU per message (nats-server {:.1}), {:.0} bytes stored per message, window {}",
        tput_median,
        cpu_floor_msg_median,
        report::stats(&floor_nats_us).median,
        floor_bytes,
        plan.floor_window
    );
    throughput::print_goals(&goals);
    let (exec_floor_tput, exec_of_floor) =
        (exec_floor_rate / tput_median, exec_rate / exec_floor_rate);
    println!(
        "  executions' floor / throughput floor               {exec_floor_tput:>8.3}  (the most a design with a command and an event per step reaches here, {:.0} µs of CPU an execution; the engine's executions are {exec_of_floor:.2} of it)",
        report::stats(&exec_floor_cpu).median
    );
    let exec_p99 = report::stats(&latencies).p99;
    let mut extra: Vec<(String, f64)> =
        goals.iter().map(|g| (g.key.to_string(), g.ratio)).collect();
    extra.extend(
        [
            ("floor_stored_bytes_per_msg", floor_bytes),
            ("exec_p99_ms", exec_p99),
            ("exec_floor_ratio_to_throughput_floor", exec_floor_tput),
            ("exec_ratio_to_exec_floor", exec_of_floor),
            (
                "api_status_ratio_to_floor",
                reads.api_per_s / reads.floor_per_s,
            ),
            ("api_sse_p99_ms", sse_p99),
            ("api_sse_floor_p99_ms", sse_floor_p99),
            ("quick", if plan.replicas { 0.0 } else { 1.0 }),
            (
                "sync_always",
                if sync == SyncPolicy::Always { 1.0 } else { 0.0 },
            ),
            ("nats_nodes", nodes as f64),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v)),
    );
    match procs::noetl_binary() {
        Some(bin) => {
            let rows = procs::per_service(&bin, plan.steps, plan.loop_items).await;
            extra.extend(procs::report(&rows));
        }
        None => println!(
            "\nCPU per service: skipped (no `noetl` beside the bench; `make bench` builds it, or set NOETL_BIN)"
        ),
    }
    if plan.replicas {
        let rates = scale::figures(plan.loop_items / 5, plan.http_loop_items, loop_batch).await;
        extra.extend(rates.into_iter().map(|(k, v)| (k.to_string(), v)));
    }
    let path = noetl_integration::repo_root().join("target/bench/results.json");
    report::write_json(&path, &figures, &extra);
    println!("bench took {:.0} s", started.elapsed().as_secs_f64());
}
