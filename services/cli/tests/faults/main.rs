//! The fault harness: the mesh's `noetl serve` processes (as in the chaos
//! suite) on a three-node JetStream cluster whose nodes each run in a
//! network namespace of their own ([`net`]), every stream and bucket R3,
//! driving the playbook mix while a seeded schedule ([`plan`]) isolates
//! nodes (the events stream's leader among them), splits the cluster,
//! pauses nodes, degrades their links, kills them, crashes one as an
//! OS crash would (its unsynced writes lost) or with a damaged data file,
//! and kills service processes while a fault lasts. About a quarter of the
//! faults carry a second node fault while they last (Jepsen's combinations:
//! a crash or a pause during a partition, a crash on a degraded link or
//! during a pause), each healed on its own. Every fault heals before the run settles; then every
//! execution must end as in a clean run
//! ([`check`](noetl_integration::check)), the three replicas of every
//! stream must agree, and each anomaly is printed with the run's fault
//! history and the seed that replays it.
//!
//! - `make test` runs [`faults_short`]: one run, every fault class once,
//!   a fixed seed. It skips, saying why, where it cannot run (not root, no
//!   `ip`).
//! - `make test-faults` runs [`faults_campaign`]: 50 runs
//!   (`NOETL_FAULT_RUNS`) of faults drawn at random, from
//!   `NOETL_FAULT_BASE_SEED` (default: the clock).
//! - `NOETL_FAULT_SEED=0x…` replays one run, in either test;
//!   `NOETL_FAULT_SYNC=always` runs the nodes with `sync_interval: always`;
//!   `NOETL_FAULT_NODES=5` runs five nodes, every stream and bucket R5;
//!   `NOETL_FAULT_POWER=1` adds the power loss of all three nodes at once
//!   (left out by default: with the default `sync_interval` it loses
//!   acknowledged writes by construction);
//!   `NOETL_FAULT_OVERLAP=0` draws no overlapping faults (the rest of a
//!   seed's schedule is the same either way);
//!   `NOETL_FAULT_KEEP=1` keeps every run's files (node logs, service
//!   logs, `history.txt`), not only a failing run's.
//!
//! docs/reliability.md ("The fault harness") says what each fault is, how
//! it is injected, and what the runs found.

mod net;
mod plan;
#[path = "../common/serve.rs"]
mod serve;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use noetl_integration::campaign::{self, check_started, patiently, submit, Started};
use noetl_integration::seeded::{base_seed, env_u64};
use noetl_integration::{mix, sink::Sink};
use noetl_mesh::{Mesh, MeshConfig};

use crate::net::{Net, Sync};
use crate::plan::{cuts, nodes_from_env, Fault, Kind, Plan, PlanParams};
use crate::serve::Services;

/// Faults of a campaign run start within this window.
const WINDOW_MS: u64 = 30_000;
/// A new wave of the mix is submitted this often while faults go on.
const WAVE_MS: u64 = 6_000;
/// An execution not ended this long after the faults healed is stuck.
const SETTLE: Duration = Duration::from_secs(180);
/// The seed of the short run in `make test`.
const SHORT_SEED: u64 = 0x39;

/// The schedule of the run with `seed`.
fn plan_for(seed: u64, every_class_once: bool) -> Plan {
    plan::plan(&PlanParams {
        seed,
        window_ms: WINDOW_MS,
        gap_ms: (1_000, 2_500),
        every_class_once,
        power_loss: env_u64("NOETL_FAULT_POWER").is_some_and(|v| v != 0),
        services: serve::service_names().len(),
        nodes: nodes_from_env(),
        overlaps: env_u64("NOETL_FAULT_OVERLAP").is_none_or(|v| v != 0),
    })
}

/// What one run did and found.
struct RunReport {
    seed: u64,
    plan: Plan,
    /// What was done, when (ms after the first submission).
    history: Vec<String>,
    executions: usize,
    anomalies: Vec<String>,
    repeated_calls: u32,
    unexpected_exits: Vec<String>,
    /// From the healing of the last fault to every execution checked.
    settle_secs: f64,
    secs: f64,
    kept: Option<PathBuf>,
    /// Whether links were degraded with netem (else a token bucket).
    netem: bool,
}

/// A step of the run, in time order.
#[derive(Debug, PartialEq, Eq)]
enum Act {
    /// Copy a node's store, or every node's at one instant (the last
    /// fsync before a later crash that loses writes).
    Snapshot(Option<usize>),
    /// Inject fault `i` of the plan.
    Inject(usize),
    /// Heal fault `i` of the plan.
    Heal(usize),
    /// Copy the store of the node fault `i`'s overlap will crash losing
    /// its unsynced writes (while fault `i` lasts: the node is known).
    SnapshotOverlap(usize),
    /// Inject the overlap of fault `i` ([`plan::Overlap`]).
    InjectOverlap(usize),
    /// Heal it (fault `i` goes on, or heals right after).
    HealOverlap(usize),
    /// SIGKILL the service fault `i` names ([`Fault::service_kill`]).
    KillService(usize),
    /// Start it again.
    RestartService(usize),
    /// Submit the mix again.
    Wave,
}

/// The actions of a plan, in time order.
fn acts_of(plan: &Plan) -> Vec<(u64, Act)> {
    let mut acts = Vec::new();
    for (i, f) in plan.faults.iter().enumerate() {
        match f.kind {
            Kind::LostWrites => acts.push((f.at_ms - f.snap_ms, Act::Snapshot(Some(f.node)))),
            Kind::PowerLoss => acts.push((f.at_ms - f.snap_ms, Act::Snapshot(None))),
            _ => {}
        }
        acts.push((f.at_ms, Act::Inject(i)));
        if let Some(o) = f.overlap {
            let at = f.at_ms + o.after_ms;
            if o.kind.loses_writes() {
                acts.push((at - o.snap_ms, Act::SnapshotOverlap(i)));
            }
            acts.push((at, Act::InjectOverlap(i)));
        }
        if let Some(k) = f.service_kill {
            acts.push((f.at_ms + k.after_ms, Act::KillService(i)));
            acts.push((f.at_ms + k.after_ms + k.down_ms, Act::RestartService(i)));
        }
        if let Some(o) = f.overlap {
            // Before the first fault's heal when both are due at once.
            acts.push((f.at_ms + o.after_ms + o.dur_ms, Act::HealOverlap(i)));
        }
        acts.push((f.healed_ms(), Act::Heal(i)));
    }
    let mut at = WAVE_MS;
    while at < plan.healed_ms() {
        acts.push((at, Act::Wave));
        at += WAVE_MS;
    }
    // Stable: a heal and the next action at the same instant stay in order.
    acts.sort_by_key(|(at, _)| *at);
    acts
}

/// Inject `f`; the node it actually hit (the leader is looked up now),
/// and what was done to it when that is more than its class says.
fn inject(net: &mut Net, f: &Fault, events_stream: &str) -> (usize, String) {
    let n = match f.kind {
        Kind::IsolateLeader => net.stream_leader(events_stream).unwrap_or(f.node),
        _ => f.node,
    };
    let all: Vec<usize> = (0..net.len()).collect();
    let mut detail = String::new();
    match f.kind {
        Kind::Isolate | Kind::IsolateLeader => net.isolate(n),
        Kind::Split | Kind::Bridge => {
            for (a, b) in cuts(f.kind, n, net.len()) {
                net.cut(a, b);
            }
        }
        Kind::Pause => net.pause(n),
        Kind::Degrade => net.degrade(n),
        Kind::Kill => net.kill(n),
        Kind::LostWrites => net.crash_losing_unsynced(&[n]),
        Kind::PowerLoss => net.crash_losing_unsynced(&all),
        Kind::Corrupt => detail = net.corrupt(n, f.pick),
    }
    (n, detail)
}

/// The nodes `f` hit (`n`: the node [`inject`] returned) of `nodes`, for
/// the history.
fn on(f: &Fault, n: usize, nodes: usize) -> String {
    match f.kind {
        Kind::PowerLoss => (1..=nodes)
            .map(|i| format!("n{i}"))
            .collect::<Vec<_>>()
            .join("+"),
        _ => format!("n{}", n + 1),
    }
}

/// `f` and the node it hit, for an overlap's history line (`isolate n1`).
fn first_of(f: &Fault, n: usize, nodes: usize) -> String {
    format!("{} {}", f.kind.name(), on(f, n, nodes))
}

/// Heal `f`, injected on node `n`: undo what it did and nothing else (an
/// overlapping fault stays in force: a node killed while isolated starts
/// again still isolated, a partition healed leaves a paused node paused;
/// a paused node that crashed started again running, and the pause's
/// SIGCONT reaches a running process).
fn heal(net: &mut Net, f: &Fault, n: usize) {
    match f.kind {
        Kind::Isolate | Kind::IsolateLeader => net.unisolate(n),
        Kind::Split | Kind::Bridge => {
            for (a, b) in cuts(f.kind, n, net.len()) {
                net.uncut(a, b);
            }
        }
        Kind::Pause => net.resume(n),
        Kind::Degrade => net.undegrade(n),
        Kind::Kill | Kind::LostWrites | Kind::Corrupt => net.restart(n),
        Kind::PowerLoss => (0..net.len()).for_each(|i| net.restart(i)),
    }
}

/// Wait until the three nodes report the same messages and last sequence
/// for every stream; the differences still there at `deadline`.
fn replicas_agree(net: &Net, deadline: Instant) -> Option<String> {
    loop {
        let states: Vec<_> = (0..net.len()).map(|i| net.stream_states(i)).collect();
        let agree = states.iter().all(|s| s.is_some()) && states.windows(2).all(|w| w[0] == w[1]);
        if agree {
            return None;
        }
        if Instant::now() > deadline {
            let mut out = String::new();
            for (i, s) in states.iter().enumerate() {
                out.push_str(&format!("\n      n{}: {s:?}", i + 1));
            }
            return Some(out);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One run: start the cluster and the services, submit the mix in waves
/// while the faults go on, heal, wait for every execution and check each.
async fn run_one(seed: u64, every_class_once: bool, sync: Sync, sink: &Sink) -> RunReport {
    let started_at = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("noetl-faults-")
        .tempdir()
        .expect("run dir");
    let plan = plan_for(seed, every_class_once);
    let nodes = plan.nodes;
    let mut net = tokio::task::block_in_place(|| Net::start(dir.path(), sync, nodes));
    let urls = net.urls();
    let home = dir.path().join("home");
    let env = [("NOETL_REPLICAS".to_string(), nodes.to_string())];
    tokio::task::block_in_place(|| serve::init(&home, &env, &urls));
    let mut services = tokio::task::block_in_place(|| {
        Services::start(&home, &dir.path().join("logs"), &urls, &env)
    });
    let mesh = patiently("attach to the mesh", || {
        Mesh::attach(MeshConfig {
            nats_url: urls.clone(),
            data_dir: home.clone(),
            ..MeshConfig::default()
        })
    })
    .await;
    let events_stream = mesh.subjects().events_stream();
    noetl_integration::rows::register_credential(&mesh).await;
    let cases = mix::mix();
    let mut started: Vec<Started> = campaign::wave(&cases);
    for s in &started {
        submit(&mesh, "faults", &s.eid, &cases[s.case], &sink.url).await;
    }
    let t0 = Instant::now();
    let mut history = Vec::new();
    let mut hit = vec![0usize; plan.faults.len()];
    // The node each overlap hit (moved with its first fault's node).
    let mut hit2 = vec![0usize; plan.faults.len()];
    let mut waves = Vec::new();
    for (at, act) in acts_of(&plan) {
        let due = t0 + Duration::from_millis(at);
        while Instant::now() < due {
            tokio::time::sleep(
                due.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(200)),
            )
            .await;
            tokio::task::block_in_place(|| services.reap());
        }
        let now = t0.elapsed().as_millis();
        match act {
            Act::Snapshot(n) => {
                let nodes: Vec<usize> = n.map_or((0..net.len()).collect(), |n| vec![n]);
                tokio::task::block_in_place(|| net.snapshot(&nodes));
                let names: Vec<String> = nodes.iter().map(|n| format!("n{}", n + 1)).collect();
                history.push(format!(
                    "{now}ms: {} store copied (the last fsync)",
                    names.join("+")
                ));
            }
            Act::Inject(i) => {
                let f = &plan.faults[i];
                let (n, detail) =
                    tokio::task::block_in_place(|| inject(&mut net, f, &events_stream));
                hit[i] = n;
                if let Some(o) = f.overlap {
                    hit2[i] = o.node_for(f, n, net.len());
                }
                history.push(format!(
                    "{now}ms: {} {}{detail}",
                    f.kind.name(),
                    on(f, n, net.len())
                ));
            }
            Act::SnapshotOverlap(i) => {
                let m = hit2[i];
                tokio::task::block_in_place(|| net.snapshot(&[m]));
                history.push(format!(
                    "{now}ms: n{} store copied (the last fsync), during {}",
                    m + 1,
                    first_of(&plan.faults[i], hit[i], net.len())
                ));
            }
            Act::InjectOverlap(i) => {
                let f = &plan.faults[i];
                let Some(o) = f.overlap else { continue };
                let second = o.as_fault(f, hit2[i]);
                let (m, detail) =
                    tokio::task::block_in_place(|| inject(&mut net, &second, &events_stream));
                history.push(format!(
                    "{now}ms: {} n{}{detail} during {} ({})",
                    o.kind.name(),
                    m + 1,
                    first_of(f, hit[i], net.len()),
                    f.name()
                ));
            }
            Act::HealOverlap(i) => {
                let f = &plan.faults[i];
                let Some(o) = f.overlap else { continue };
                let second = o.as_fault(f, hit2[i]);
                tokio::task::block_in_place(|| heal(&mut net, &second, hit2[i]));
                history.push(format!(
                    "{now}ms: healed {} n{} ({}: {} goes on)",
                    o.kind.name(),
                    hit2[i] + 1,
                    f.name(),
                    first_of(f, hit[i], net.len())
                ));
            }
            Act::Heal(i) => {
                let f = &plan.faults[i];
                tokio::task::block_in_place(|| heal(&mut net, f, hit[i]));
                history.push(format!(
                    "{now}ms: healed {} {}",
                    f.kind.name(),
                    on(f, hit[i], net.len())
                ));
            }
            Act::KillService(i) | Act::RestartService(i) => {
                let Some(k) = plan.faults[i].service_kill else {
                    continue;
                };
                let name = format!("{}-{}", services.service(k.service), k.service % 2 + 1);
                if matches!(act, Act::KillService(_)) {
                    tokio::task::block_in_place(|| services.kill(k.service));
                    history.push(format!("{now}ms: kill service {name}"));
                } else {
                    tokio::task::block_in_place(|| services.restart(k.service));
                    history.push(format!("{now}ms: restarted service {name}"));
                }
            }
            Act::Wave => {
                let batch = campaign::wave(&cases);
                let jobs: Vec<(String, mix::Case)> = batch
                    .iter()
                    .map(|s| (s.eid.clone(), cases[s.case].clone()))
                    .collect();
                started.extend(batch);
                let (mesh, url) = (mesh.clone(), sink.url.clone());
                waves.push(tokio::spawn(async move {
                    for (eid, case) in &jobs {
                        submit(&mesh, "faults", eid, case, &url).await;
                    }
                }));
            }
        }
    }
    tokio::task::block_in_place(|| {
        net.heal();
        services.heal();
    });
    let healed = Instant::now();
    let mut anomalies = Vec::new();
    if let Err(e) = tokio::task::block_in_place(|| net.wait_healthy(Duration::from_secs(90))) {
        anomalies.push(format!("the cluster did not heal: {e}"));
    }
    for w in waves {
        w.await.expect("a wave's submissions");
    }
    let deadline = Instant::now() + SETTLE;
    let (found, repeated_calls) = check_started(&mesh, sink, &cases, &started, deadline).await;
    anomalies.extend(found);
    let settle_secs = healed.elapsed().as_secs_f64();
    if let Some(diff) = tokio::task::block_in_place(|| {
        replicas_agree(&net, Instant::now() + Duration::from_secs(30))
    }) {
        anomalies.push(format!(
            "the replicas of the streams differ 30 s after the checks:{diff}"
        ));
    }
    services.stop();
    let unexpected_exits = std::mem::take(&mut services.unexpected_exits);
    if !anomalies.is_empty() {
        for i in 0..net.len() {
            history.push(format!("n{} log tail:\n{}", i + 1, net.log_tail(i, 8)));
        }
    }
    let netem = net.netem;
    drop(net);
    let _ = std::fs::write(dir.path().join("history.txt"), history.join("\n"));
    let _ = std::fs::write(dir.path().join("anomalies.txt"), anomalies.join("\n"));
    let kept = if anomalies.is_empty() && std::env::var_os("NOETL_FAULT_KEEP").is_none() {
        None
    } else {
        Some(dir.keep())
    };
    RunReport {
        seed,
        plan,
        history,
        executions: started.len(),
        anomalies,
        repeated_calls,
        unexpected_exits,
        settle_secs,
        secs: started_at.elapsed().as_secs_f64(),
        kept,
        netem,
    }
}

/// Print the campaign's table; panic naming the seeds of failing runs.
fn report(title: &str, replay: &str, reports: &[RunReport], sync: Sync, netem: bool) {
    println!(
        "\nfaults: {title}; {}; R{}; degraded links: {}",
        sync.name(),
        reports.first().map_or(plan::NODES, |r| r.plan.nodes),
        net::degrade_qdisc(netem)
    );
    let mut head = format!("{:>4}  {:<18}", "run", "seed");
    for k in Kind::ALL {
        head.push_str(&format!(" {:>7}", k.name()));
    }
    println!(
        "{head}  {:>5}  {:>5}  {:>9}  {:>7}  {:>5}  {:>6}  {:>6}  overlaps",
        "svc", "execs", "anomalies", "repeats", "exits", "settle", "secs"
    );
    for (i, r) in reports.iter().enumerate() {
        let mut row = format!("{:>4}  {:<18}", i + 1, format!("{:#x}", r.seed));
        for k in Kind::ALL {
            row.push_str(&format!(" {:>7}", r.plan.count(k)));
        }
        let overlaps = r.plan.overlaps();
        println!(
            "{row}  {:>5}  {:>5}  {:>9}  {:>7}  {:>5}  {:>6.1}  {:>6.1}  {}",
            r.plan.service_kills(),
            r.executions,
            r.anomalies.len(),
            r.repeated_calls,
            r.unexpected_exits.len(),
            r.settle_secs,
            r.secs,
            if overlaps.is_empty() {
                "-".to_string()
            } else {
                overlaps.join(",")
            }
        );
    }
    let by: Vec<String> = Kind::ALL
        .iter()
        .map(|k| {
            format!(
                "{} {}",
                k.name(),
                reports.iter().map(|r| r.plan.count(*k)).sum::<usize>()
            )
        })
        .collect();
    let total = |f: &dyn Fn(&RunReport) -> usize| reports.iter().map(f).sum::<usize>();
    let mut pairs = std::collections::BTreeMap::<String, usize>::new();
    for name in reports.iter().flat_map(|r| r.plan.overlaps()) {
        *pairs.entry(name).or_default() += 1;
    }
    let pairs: Vec<String> = pairs.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let pairs = if pairs.is_empty() {
        String::new()
    } else {
        format!(" ({})", pairs.join(", "))
    };
    println!(
        "total: {} faults ({}), {} of them overlapped by a second node fault{}, \
         {} service kills during them, {} executions, {} anomalies, \
         {} repeated tool calls, {} services exited on their own",
        total(&|r| r.plan.faults.len()),
        by.join(", "),
        total(&|r| r.plan.overlaps().len()),
        pairs,
        total(&|r| r.plan.service_kills()),
        total(&|r| r.executions),
        total(&|r| r.anomalies.len()),
        total(&|r| r.repeated_calls as usize),
        total(&|r| r.unexpected_exits.len()),
    );
    let failing: Vec<&RunReport> = reports.iter().filter(|r| !r.anomalies.is_empty()).collect();
    for r in &failing {
        println!(
            "\nrun with seed {:#x} failed (replay: NOETL_FAULT_SEED={:#x} {replay}; files in {}):",
            r.seed,
            r.seed,
            r.kept.as_deref().unwrap_or(Path::new("?")).display()
        );
        println!("  plan: {}", r.plan);
        println!("  fault history:");
        for h in &r.history {
            println!("    {h}");
        }
        println!("  anomalies:");
        for a in &r.anomalies {
            println!("  - {a}");
        }
    }
    campaign::conclude(
        "fault",
        reports.iter().map(|r| {
            (
                r.seed,
                r.unexpected_exits.as_slice(),
                !r.anomalies.is_empty(),
            )
        }),
    );
}

/// Run `seeds` one after the other and report them.
fn campaign(title: &str, replay: &str, seeds: Vec<u64>, every_class_once: bool) {
    if let Some(why) = net::unavailable() {
        println!("faults: skipped: {why}");
        eprintln!("faults: skipped: {why}");
        return;
    }
    let sync = Sync::from_env();
    let reports = campaign::run_seeds(
        "fault",
        &seeds,
        |seed, sink| async move { run_one(seed, every_class_once, sync, &sink).await },
        |r: &RunReport| {
            // The anomalies now: a later run that panics loses the table.
            let mut s = format!(
                "{} faults ({} overlapped), {} anomalies, {:.1} s",
                r.plan.faults.len(),
                r.plan.overlaps().len(),
                r.anomalies.len(),
                r.secs
            );
            for a in &r.anomalies {
                s.push_str(&format!("\n  - {a}"));
            }
            s
        },
    );
    let netem = reports.iter().any(|r| r.netem);
    report(title, replay, &reports, sync, netem);
}

/// An overlap's copy, injection and healing come inside its first fault,
/// in that order, its healing before the first's when both are due at
/// once; and the plan's acts are in time order.
#[test]
fn overlaps_act_inside_their_first_fault() {
    let mut seen = 0;
    for seed in 0..300 {
        let plan = plan::plan(&PlanParams {
            seed,
            window_ms: WINDOW_MS,
            gap_ms: (1_000, 2_500),
            every_class_once: seed % 2 == 0,
            power_loss: false,
            services: 10,
            nodes: plan::NODES,
            overlaps: true,
        });
        let acts = acts_of(&plan);
        assert!(acts.windows(2).all(|w| w[0].0 <= w[1].0));
        let at = |want: &Act| acts.iter().position(|(_, a)| a == want);
        for (i, f) in plan.faults.iter().enumerate() {
            let Some(o) = f.overlap else {
                assert_eq!(at(&Act::InjectOverlap(i)), None);
                continue;
            };
            seen += 1;
            let mut order = vec![at(&Act::Inject(i))];
            if o.kind.loses_writes() {
                order.push(at(&Act::SnapshotOverlap(i)));
            }
            order.extend([
                at(&Act::InjectOverlap(i)),
                at(&Act::HealOverlap(i)),
                at(&Act::Heal(i)),
            ]);
            assert!(order.iter().all(Option::is_some), "{plan}");
            assert!(order.windows(2).all(|w| w[0] < w[1]), "{plan}");
        }
    }
    assert!(seen > 100, "{seen} overlaps");
}

/// The short run inside `make test`: every fault class once, a fixed seed.
#[test]
fn faults_short() {
    let seed = env_u64("NOETL_FAULT_SEED").unwrap_or(SHORT_SEED);
    campaign(
        "the short run (every class once)",
        "cargo test -p noetl-cli --test faults faults_short",
        vec![seed],
        true,
    );
}

/// `make test-faults`: 50 runs of faults drawn at random.
#[test]
#[ignore = "long: run with `make test-faults`"]
fn faults_campaign() {
    let seeds = match env_u64("NOETL_FAULT_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = base_seed("NOETL_FAULT_BASE_SEED");
            eprintln!("faults: base seed {base:#x}");
            let runs = env_u64("NOETL_FAULT_RUNS").unwrap_or(50);
            (0..runs).map(|i| plan::run_seed(base, i)).collect()
        }
    };
    campaign("the campaign", "make test-faults", seeds, false);
}
