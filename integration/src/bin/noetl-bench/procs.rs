//! CPU per service: the sequential noop chain and the parallel noop loop
//! once more, with each service a process of its own (`noetl serve`, as a
//! deployment runs them), each process's user + system CPU read from
//! `/proc` around the run. The in-process figures give the total; these
//! give each service's share of it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use noetl_integration::procstat;
use noetl_mesh::{config::MeshConfig, Mesh};
use noetl_testkit::TestServer;

use crate::ends::Ends;
use crate::scenarios as sc;

/// The services, as `noetl serve` arguments, with the name printed.
const SERVICES: [(&str, &[&str]); 4] = [
    ("router", &["router"]),
    ("scheduler", &["scheduler"]),
    ("loop-supervisor", &["loop-supervisor"]),
    ("executor(noop)", &["executor", "--kind", "noop"]),
];

/// Where `noetl` is: `NOETL_BIN`, else the release build beside the
/// bench's own binary (`make bench` builds it first).
pub fn noetl_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NOETL_BIN") {
        return Some(PathBuf::from(p));
    }
    let me = std::env::current_exe().ok()?;
    let beside = me.parent()?.join("noetl");
    beside.is_file().then_some(beside)
}

/// CPU of one service over one scenario.
pub struct ServiceCpu {
    /// As printed (`router`, `executor(noop)`, `nats-server`).
    pub name: &'static str,
    /// Per step of the chain.
    pub per_step: Duration,
    /// Per iteration of the loop.
    pub per_iteration: Duration,
}

/// The processes a run started; killed however the run ends.
struct Children(Vec<(&'static str, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Run the chain (`steps`) and the loop (`items`) on separate service
/// processes of `bin`; each service's CPU, then nats-server's.
pub async fn per_service(bin: &Path, steps: usize, items: usize) -> Vec<ServiceCpu> {
    let server = TestServer::start();
    let url = server.url();
    let home = tempfile::tempdir().expect("a NOETL_HOME for the services");
    let noetl = || {
        let mut c = Command::new(bin);
        c.env("NOETL_HOME", home.path())
            .env("RUST_LOG", "warn")
            .env_remove("NOETL_NATS_URL")
            .env_remove("NOETL_HTTP_ADDR");
        c
    };
    let init = noetl()
        .args(["admin", "init", "--nats", &url])
        .output()
        .expect("run noetl admin init");
    assert!(
        init.status.success(),
        "noetl admin init: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let children = Children(
        SERVICES
            .iter()
            .map(|(name, args)| {
                let child = noetl()
                    .arg("serve")
                    .args(*args)
                    .args(["--nats", &url])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| panic!("start {name} from {}: {e}", bin.display()));
                (*name, child)
            })
            .collect(),
    );
    let data = tempfile::tempdir().expect("a data dir for the bench's client");
    let mesh = Mesh::connect(MeshConfig {
        nats_url: url.clone(),
        data_dir: data.path().to_path_buf(),
        ..MeshConfig::default()
    })
    .await
    .expect("connect to the processes' mesh");
    let ends = Ends::watch(&mesh).await;
    let ready = Instant::now() + Duration::from_secs(30);
    while !mesh.kind_served("noop", false).await.unwrap_or(false) {
        assert!(Instant::now() < ready, "the noop executor did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Warm-up, then the two measured runs.
    run(&mesh, &ends, &sc::chain("warm", 20, sc::NOOP), None).await;
    let warm = sc::parallel_loop(50, 256, sc::LOOP_NOOP);
    run(&mesh, &ends, &warm, Some(50)).await;
    let pids: Vec<(&'static str, u32)> = children
        .0
        .iter()
        .map(|(n, c)| (*n, c.id()))
        .chain(server.pid().map(|p| ("nats-server", p)))
        .collect();
    let sample = || -> Vec<Duration> { pids.iter().map(|(_, p)| procstat::cpu_time(*p)).collect() };
    let spent = |before: &[Duration], after: &[Duration]| -> Vec<Duration> {
        after
            .iter()
            .zip(before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect()
    };
    let t0 = sample();
    run(
        &mesh,
        &ends,
        &sc::chain("bench_chain", steps, sc::NOOP),
        None,
    )
    .await;
    let t1 = sample();
    let noop_loop = sc::parallel_loop(items, 256, sc::LOOP_NOOP);
    run(&mesh, &ends, &noop_loop, Some(items)).await;
    let t2 = sample();
    let (chain, lp) = (spent(&t0, &t1), spent(&t1, &t2));
    pids.iter()
        .enumerate()
        .map(|(i, (name, _))| ServiceCpu {
            name,
            per_step: chain[i] / steps as u32,
            per_iteration: lp[i] / items as u32,
        })
        .collect()
}

/// Run `yaml` to its end; with `items`, check the loop counted each once.
async fn run(mesh: &Mesh, ends: &Ends, yaml: &str, items: Option<usize>) {
    let started = sc::publish_batch(mesh, yaml, 1).await;
    let eid = &started[0].0;
    ends.wait(eid, sc::TIMEOUT).await;
    if let Some(n) = items {
        let ctx = mesh.exec_ctx(eid).await.expect("read ctx");
        assert_eq!(ctx["total"], n, "every iteration counted once");
    }
}

/// Print the shares, and return the figures for `results.json`.
pub fn report(rows: &[ServiceCpu]) -> Vec<(String, f64)> {
    let total_step: Duration = rows.iter().map(|r| r.per_step).sum();
    let total_iter: Duration = rows.iter().map(|r| r.per_iteration).sum();
    let pct = |d: Duration, all: Duration| 100.0 * d.as_secs_f64() / all.as_secs_f64().max(1e-12);
    println!("\nCPU per service, each a process of its own (`noetl serve`):");
    println!(
        "  {:<16} {:>12} {:>7} {:>16} {:>7}",
        "process", "µs per step", "share", "µs per iteration", "share"
    );
    let mut out = Vec::new();
    for r in rows {
        println!(
            "  {:<16} {:>12.0} {:>6.0}% {:>16.0} {:>6.0}%",
            r.name,
            r.per_step.as_secs_f64() * 1e6,
            pct(r.per_step, total_step),
            r.per_iteration.as_secs_f64() * 1e6,
            pct(r.per_iteration, total_iter)
        );
        let key = r
            .name
            .replace("executor(noop)", "executor")
            .replace('-', "_");
        out.push((
            format!("cpu_us_per_step_{key}"),
            r.per_step.as_secs_f64() * 1e6,
        ));
        out.push((
            format!("cpu_us_per_iteration_{key}"),
            r.per_iteration.as_secs_f64() * 1e6,
        ));
    }
    println!(
        "  {:<16} {:>12.0} {:>7} {:>16.0}",
        "all",
        total_step.as_secs_f64() * 1e6,
        "",
        total_iter.as_secs_f64() * 1e6
    );
    out.push((
        "cpu_us_per_step_processes".into(),
        total_step.as_secs_f64() * 1e6,
    ));
    out.push((
        "cpu_us_per_iteration_processes".into(),
        total_iter.as_secs_f64() * 1e6,
    ));
    out
}
