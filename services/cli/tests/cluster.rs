//! The mesh on a three-node JetStream cluster (`NOETL_REPLICAS=3`: every
//! stream and KV bucket R3), every service a separate `noetl serve` process
//! given all three server URLs: two replicas of the router, the scheduler and
//! the loop supervisor, three executors. Mid-run the NATS node leading the
//! work stream is SIGKILLed together with one replica of each service; every
//! execution still completes with exactly the `ctx` it would have had.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use noetl_testkit::TestCluster;
use serde_json::{json, Value};

/// Sequential steps, then an inclusive fan-out into a parallel loop with
/// reducers, a noop retried by policy, and a python task that fails (and is
/// retried) until the test opens a gate file; a join waits for all three.
const MIX: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: cluster_mix }
workload: { n: 10, gate: "", seen: "" }
workflow:
  - step: start
    tool:
      - name: a
        kind: noop
        result: a
    next:
      arcs:
        - step: second
          args: { acc: "{{ event.result }}" }
  - step: second
    tool:
      - name: b
        kind: noop
        result: "{{ args.acc }}b"
    next:
      arcs:
        - step: third
          args: { acc: "{{ event.result }}" }
  - step: third
    tool:
      - name: c
        kind: noop
        result: "{{ args.acc }}c"
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { chain: "{{ outcome.result }}" } }
    next:
      spec: { mode: inclusive }
      arcs:
        - step: items
        - step: flaky
        - step: gated
  - step: items
    loop:
      in: "{{ range(workload.n) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 8
        policy:
          reducers: { total: sum, count: sum }
    tool:
      - name: touch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { total: "{{ iter.i }}", count: 1 } }
    next:
      arcs:
        - step: merge
          when: "{{ event.name == 'loop.done' }}"
          args: { done: "{{ event.counts.done }}" }
  - step: flaky
    tool:
      - name: again
        kind: noop
        result: "{{ _attempt }}"
        spec:
          policy:
            rules:
              - when: "{{ outcome.result < 3 }}"
                then: { do: retry, attempts: 5, delay: 0.1 }
              - else:
                  then: { set_ctx: { retried: "{{ outcome.result }}" } }
    next:
      arcs:
        - step: merge
          args: { attempts: "{{ event.result }}" }
  - step: gated
    tool:
      - name: wait_gate
        kind: python
        args:
          gate: "{{ workload.gate }}"
          seen: "{{ workload.seen }}"
          eid: "{{ execution_id }}"
        code: |
          import os
          with open(seen, 'a') as f:
              f.write(eid + '\n')
          if not os.path.exists(gate):
              raise ConnectionError('the gate is closed')
          result = 'open'
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: retry, attempts: 400, delay: 0.3 }
              - else:
                  then: { set_ctx: { gate: "{{ outcome.result }}" } }
    next:
      arcs:
        - step: merge
          args: { gate: "{{ event.result }}" }
  - step: merge
    spec: { join: all }
    tool:
      - name: combine
        kind: noop
        result: "{{ args.done }}|{{ args.attempts }}|{{ args.gate }}"
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { merged: "{{ outcome.result }}" } }
"#;

/// The `ctx` an execution of [`MIX`] with `n` loop items ends with.
fn expected_ctx(n: u64) -> Value {
    json!({
        "chain": "abc",
        "total": n * (n - 1) / 2,
        "count": n,
        "retried": 3,
        "gate": "open",
        "merged": format!("{n}|3|open"),
    })
}

/// What every `noetl` process of one test shares: the server list, one
/// object store, one secret key, R3 topology. The directory (with every
/// replica's log) is kept when the test fails.
struct Env {
    urls: String,
    dir: Option<tempfile::TempDir>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                eprintln!(
                    "test files and replica logs kept in {}",
                    dir.keep().display()
                );
            }
        }
    }
}

impl Env {
    fn new(cluster: &TestCluster) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("noetl-cluster-test-")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("objects")).unwrap();
        Self {
            urls: cluster.urls(),
            dir: Some(dir),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir
            .as_ref()
            .expect("present until drop")
            .path()
            .join(name)
    }

    /// `noetl` with its own `NOETL_HOME` (named `home`) and the shared
    /// settings; `--nats` is the caller's, always the full server list.
    fn noetl(&self, home: &str) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_noetl"));
        c.env("NOETL_HOME", self.path(&format!("home-{home}")))
            .env("NOETL_OBJECT_STORE", self.path("objects"))
            .env(
                "NOETL_SECRET_KEY",
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            )
            .env("NOETL_REPLICAS", "3")
            // A killed replica's unacked messages come back after 5 s, not 30.
            .env("NOETL_ACK_WAIT_MS", "5000")
            .env("NOETL_PYTHON_WARM", "1")
            .env_remove("NOETL_NATS_URL")
            .env_remove("NATS_URL");
        c
    }
}

/// A `noetl serve` replica; its log is `<name>.log` in the test dir.
struct Replica {
    name: String,
    args: Vec<String>,
    child: Option<Child>,
}

/// Every replica, SIGKILLed when the test ends, however it ends.
struct Replicas<'a> {
    env: &'a Env,
    all: Vec<Replica>,
}

impl<'a> Replicas<'a> {
    fn spawn(&mut self, name: &str, args: &[&str]) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut r = Replica {
            name: name.to_string(),
            args,
            child: None,
        };
        self.start(&mut r);
        self.all.push(r);
    }

    fn start(&self, r: &mut Replica) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.env.path(&format!("{}.log", r.name)))
            .unwrap();
        let child = self
            .env
            .noetl(&r.name)
            .arg("serve")
            .args(&r.args)
            .args(["--nats", &self.env.urls])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", r.name));
        r.child = Some(child);
    }

    /// SIGKILL the replica named `name`.
    fn kill(&mut self, name: &str) {
        let r = self.all.iter_mut().find(|r| r.name == name).unwrap();
        let mut child = r.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Start the replica named `name` again (same home, same flags).
    fn restart(&mut self, name: &str) {
        let i = self.all.iter().position(|r| r.name == name).unwrap();
        let mut r = self.all.remove(i);
        self.start(&mut r);
        self.all.insert(i, r);
    }

    /// Panic if a replica that should be running has exited.
    fn assert_running(&mut self) {
        for r in &mut self.all {
            if let Some(c) = r.child.as_mut() {
                if let Some(status) = c.try_wait().unwrap() {
                    panic!(
                        "replica {} exited ({status}); log:\n{}",
                        r.name,
                        tail(&self.env.path(&format!("{}.log", r.name)))
                    );
                }
            }
        }
    }

    /// The end of every replica's log (for a failure message).
    fn logs(&self) -> String {
        self.all
            .iter()
            .map(|r| {
                format!(
                    "--- {} ---\n{}",
                    r.name,
                    tail(&self.env.path(&format!("{}.log", r.name)))
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Replicas<'_> {
    fn drop(&mut self) {
        for r in &mut self.all {
            if let Some(mut c) = r.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `noetl admin init`: the streams and buckets, R3 (`NOETL_REPLICAS=3`).
fn init_topology(env: &Env) {
    let out = env
        .noetl("admin")
        .args(["admin", "init", "--nats", &env.urls])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "noetl admin init: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Start an execution of `playbook` with `n` loop items; its id.
fn start_execution(env: &Env, playbook: &Path, n: u64) -> String {
    let out = env
        .noetl("client")
        .args(["exec", "start"])
        .arg(playbook)
        .args(["--json", "--nats", &env.urls])
        .arg("--set")
        .arg(format!("n={n}"))
        .arg("--set")
        .arg(format!("gate={}", env.path("gate").display()))
        .arg("--set")
        .arg(format!("seen={}", env.path("seen").display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "exec start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["execution_id"].as_str().unwrap().to_string()
}

/// `noetl exec status ID --wait --json`: the terminal status with `ctx`.
/// A status command whose server dies under it is asked again. On timeout
/// the panic shows the execution's steps so far.
fn final_status(env: &Env, id: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let out = env
            .noetl("client")
            .args(["exec", "status", id, "--wait", "--json", "--timeout"])
            .arg(left.max(1).to_string())
            .args(["--nats", &env.urls])
            .output()
            .unwrap();
        if let Ok(s) = serde_json::from_slice::<Value>(&out.stdout) {
            if s["status"] != "running" {
                return s;
            }
        }
        if Instant::now() >= deadline {
            let now = env
                .noetl("client")
                .args(["exec", "status", id, "--json", "--nats", &env.urls])
                .output()
                .unwrap();
            panic!(
                "execution {id} not finished within {timeout:?}: {}\nnow: {}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&now.stdout),
                String::from_utf8_lossy(&now.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Streams and KV buckets of the mesh, as JetStream names them.
const TOPOLOGY: [&str; 11] = [
    "NOETL_WORK",
    "NOETL_EVENTS",
    "NOETL_DLQ",
    "KV_noetl_exec",
    "KV_noetl_ctx",
    "KV_noetl_loop",
    "KV_noetl_catalog",
    "KV_noetl_credentials",
    "KV_noetl_tokens",
    "KV_noetl_schedules",
    "KV_noetl_gates",
];

/// Every stream and bucket is R3: three replicas configured, a leader and
/// two peers placed.
async fn assert_r3(cluster: &TestCluster) {
    let js = jetstream::new(cluster.client().await);
    for name in TOPOLOGY {
        let mut stream = js
            .get_stream(name)
            .await
            .unwrap_or_else(|e| panic!("stream {name}: {e}"));
        let info = stream.info().await.unwrap();
        assert_eq!(info.config.num_replicas, 3, "{name} replicas");
        let cl = info
            .cluster
            .clone()
            .unwrap_or_else(|| panic!("{name}: no cluster info"));
        assert!(cl.leader.is_some(), "{name}: no leader: {cl:?}");
        assert_eq!(cl.replicas.len(), 2, "{name}: peers: {cl:?}");
        if name.starts_with("KV_") {
            // Direct gets may be answered by a follower that has not yet
            // applied the write just acknowledged: reads go to the leader.
            assert!(!info.config.allow_direct, "{name} allows direct gets");
        }
    }
}

/// The durable consumers of one replica of each service (noop executor):
/// stream and durable name.
const CONSUMERS: [(&str, &str); 6] = [
    ("NOETL_WORK", "noetl-router-requests"),
    ("NOETL_EVENTS", "noetl-router-events"),
    ("NOETL_WORK", "noetl-scheduler"),
    ("NOETL_WORK", "noetl-loop-commands"),
    ("NOETL_EVENTS", "noetl-loop-events"),
    ("NOETL_WORK", "noetl-executor-noop"),
];

/// Every service consumer is replicated like its stream: a leader and two
/// peers (a consumer on one node stops its service when that node dies).
async fn assert_consumers_r3(cluster: &TestCluster) {
    let js = jetstream::new(cluster.client().await);
    for (stream, durable) in CONSUMERS {
        let stream = js.get_stream(stream).await.unwrap();
        // A new consumer elects its leader shortly after it exists.
        let deadline = Instant::now() + Duration::from_secs(60);
        let info = loop {
            let last = match stream.consumer_info(durable).await {
                Ok(info) if info.cluster.as_ref().is_some_and(|c| c.leader.is_some()) => {
                    break info
                }
                Ok(info) => format!("{:?}", info.cluster),
                Err(e) => e.to_string(),
            };
            assert!(Instant::now() < deadline, "consumer {durable}: {last}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let cl = info.cluster.clone().expect("checked above");
        assert_eq!(
            cl.replicas.len(),
            2,
            "{durable}: peers (config replicas {}): {cl:?}",
            info.config.num_replicas
        );
    }
}

#[test]
fn the_topology_is_r3_with_noetl_replicas_3() {
    let cluster = TestCluster::start();
    let env = Env::new(&cluster);
    init_topology(&env);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(assert_r3(&cluster));
    let mut replicas = Replicas {
        env: &env,
        all: Vec::new(),
    };
    replicas.spawn("router", &["router"]);
    replicas.spawn("scheduler", &["scheduler"]);
    replicas.spawn("loop-supervisor", &["loop-supervisor"]);
    replicas.spawn("executor", &["executor", "--kind", "noop"]);
    rt.block_on(assert_consumers_r3(&cluster));
    replicas.assert_running();
}

#[test]
fn executions_survive_a_nats_node_and_service_replicas_being_killed() {
    let t0 = Instant::now();
    let mut cluster = TestCluster::start();
    let env = Env::new(&cluster);
    let rt = tokio::runtime::Runtime::new().unwrap();
    init_topology(&env);
    rt.block_on(assert_r3(&cluster));
    println!(
        "cluster {} up, R3 topology, {:?}",
        cluster.urls(),
        t0.elapsed()
    );

    let mut replicas = Replicas {
        env: &env,
        all: Vec::new(),
    };
    for i in 1..=2 {
        replicas.spawn(&format!("router-{i}"), &["router"]);
        replicas.spawn(&format!("scheduler-{i}"), &["scheduler"]);
        replicas.spawn(&format!("loop-supervisor-{i}"), &["loop-supervisor"]);
    }
    for i in 1..=3 {
        replicas.spawn(
            &format!("executor-{i}"),
            &["executor", "--kind", "noop", "--kind", "python"],
        );
    }

    // Ten executions of different sizes, plus two after the restarts.
    let playbook = env.path("mix.yaml");
    std::fs::write(&playbook, MIX).unwrap();
    let mut runs: Vec<(String, u64)> = (0..10)
        .map(|k| {
            let n = 20 + 3 * k;
            (start_execution(&env, &playbook, n), n)
        })
        .collect();
    println!("started {} executions, {:?}", runs.len(), t0.elapsed());

    // Mid-run: every execution is retrying at the closed gate.
    let seen = env.path("seen");
    let seen_ids = || std::fs::read_to_string(&seen).unwrap_or_default();
    wait_until(
        "every execution to reach the gate",
        Duration::from_secs(60),
        || runs.iter().all(|(id, _)| seen_ids().contains(id.as_str())),
    );
    replicas.assert_running();

    // Kill the node leading the work stream (else the meta leader) and one
    // replica of every service.
    let victim = cluster
        .stream_leader("NOETL_WORK")
        .or_else(|| cluster.meta_leader())
        .expect("a leader");
    let was_meta = cluster.meta_leader() == Some(victim);
    cluster.kill(victim);
    // A client asking right after the leader's node dies rides out the
    // failover itself (one command, not asked again): it ends with the
    // execution's final status once the gate opens.
    let status_wait = env
        .noetl("client")
        .args([
            "exec",
            "status",
            &runs[0].0,
            "--wait",
            "--json",
            "--timeout",
            "180",
        ])
        .args(["--nats", &env.urls])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for name in ["router-1", "scheduler-1", "loop-supervisor-1", "executor-1"] {
        replicas.kill(name);
    }
    let killed_at = Instant::now();
    println!(
        "{:?}: SIGKILLed nats node {} (leader of NOETL_WORK{}) and router-1, scheduler-1, loop-supervisor-1, executor-1",
        t0.elapsed(),
        cluster.name(victim),
        if was_meta { ", meta leader" } else { "" }
    );

    // The mesh carries on with a node down: every execution tries the gate
    // again (a retry scheduled, delivered and run after the kill).
    let before = seen_ids().lines().count();
    wait_until("retries after the kill", Duration::from_secs(60), || {
        let now = seen_ids();
        let after: Vec<&str> = now.lines().skip(before).collect();
        runs.iter().all(|(id, _)| after.contains(&id.as_str()))
    });
    println!(
        "{:?}: every execution retried with {} down ({:?} after the kill)",
        t0.elapsed(),
        cluster.name(victim),
        killed_at.elapsed()
    );

    // Open the gate: the first half completes on two nodes.
    std::fs::write(env.path("gate"), "open").unwrap();
    let waited = status_wait.wait_with_output().unwrap();
    let s: Value = serde_json::from_slice(&waited.stdout).unwrap_or_else(|_| {
        panic!(
            "exec status --wait issued right after the kill failed ({}): {}",
            waited.status,
            String::from_utf8_lossy(&waited.stderr)
        )
    });
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    assert_eq!(s["status"], "completed", "{s}");
    println!(
        "{:?}: a status wait issued right after the kill rode out the failover",
        t0.elapsed()
    );
    for (id, n) in &runs[..5] {
        let s = final_status(&env, id, Duration::from_secs(90));
        assert_eq!(s["status"], "completed", "{id}: {s}\n{}", replicas.logs());
        assert_eq!(s["ctx"], expected_ctx(*n), "{id}: ctx");
    }
    println!(
        "{:?}: 5 executions completed with a node down",
        t0.elapsed()
    );

    // The killed replicas come back first (their server list starts with a
    // dead node), then the NATS node, on its old ports and store.
    for name in ["router-1", "scheduler-1", "loop-supervisor-1", "executor-1"] {
        replicas.restart(name);
    }
    cluster
        .restart(victim)
        .expect("restart the killed nats node");
    println!(
        "{:?}: restarted nats node {} and the killed replicas",
        t0.elapsed(),
        cluster.name(victim)
    );
    for k in 0..2 {
        let n = 7 + k;
        runs.push((start_execution(&env, &playbook, n), n));
    }
    for (id, n) in &runs[5..] {
        let s = final_status(&env, id, Duration::from_secs(90));
        assert_eq!(s["status"], "completed", "{id}: {s}\n{}", replicas.logs());
        assert_eq!(s["ctx"], expected_ctx(*n), "{id}: ctx");
    }
    replicas.assert_running();
    rt.block_on(assert_r3(&cluster));
    println!(
        "{} executions completed with exact ctx; kills: nats {}, router-1, scheduler-1, loop-supervisor-1, executor-1; total {:.1} s",
        runs.len(),
        cluster.name(victim),
        t0.elapsed().as_secs_f64()
    );
}

/// Messages lost from the middle of one replica (its first block file cut
/// short while its node was down, as a disk fault leaves it) stay lost:
/// JetStream copies back only what a replica lacks at its end. `noetl admin
/// replicas` reports every replica equal before the damage, and after it
/// names the stream, the short replica and the remedy, exiting 1.
#[test]
fn admin_replicas_names_a_replica_short_in_the_middle_of_a_stream() {
    use jetstream::stream;
    let mut cluster = TestCluster::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 12.5 MiB: more than one block file (8 MiB at most each).
    rt.block_on(async {
        let js = jetstream::new(cluster.client().await);
        js.create_stream(stream::Config {
            name: "DAMAGE".into(),
            subjects: vec!["damage.>".into()],
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .unwrap();
        for i in 0..200 {
            js.publish(format!("damage.{i}"), vec![b'x'; 64 * 1024].into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
    let monitors: Vec<String> = (0..3).map(|i| cluster.monitor_url(i)).collect();
    let replicas = |settle: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_noetl"))
            .args(["admin", "replicas", "--settle", settle, "--monitor"])
            .arg(monitors.join(","))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) = replicas("20s");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("every replica holds the same"), "{text}");

    cluster.kill(2);
    let msgs = cluster.dir().join("n3/jetstream/$G/streams/DAMAGE/msgs");
    let mut blocks: Vec<PathBuf> = std::fs::read_dir(&msgs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "blk"))
        .collect();
    blocks.sort_by_key(|p| {
        let stem = p.file_stem().unwrap().to_string_lossy().to_string();
        stem.parse::<u64>().unwrap_or(u64::MAX)
    });
    assert!(blocks.len() >= 2, "one block only: {blocks:?}");
    let first = std::fs::OpenOptions::new()
        .write(true)
        .open(&blocks[0])
        .unwrap();
    let len = first.metadata().unwrap().len();
    first.set_len(len / 2).unwrap();
    drop(first);
    cluster.restart(2).unwrap();
    cluster.wait_healthy(Duration::from_secs(60)).unwrap();

    let (code, text) = replicas("10s");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("DAMAGE: replicas disagree"), "{text}");
    assert!(
        text.contains(&format!("{} hold(s) fewer messages", monitors[2])),
        "{text}"
    );
    assert!(
        text.contains("nats stream cluster peer-remove DAMAGE"),
        "{text}"
    );
}

/// `noetl events tail --no-follow` prints every event stored when it
/// began, even when its ordered consumer lands on a replica still catching
/// up (docs/architecture.md, "Reading the log"): it reads through the
/// leader's last event, where it used to stop at the replica's own last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_tail_no_follow_on_a_lagging_replica_prints_every_stored_event() {
    use noetl_testkit::lagging::{events_round, lagging};
    let l = lagging(|m| m.subjects().events_stream()).await;
    let home = tempfile::tempdir().unwrap();
    let event = |n: u32| {
        let d = n.to_string();
        noetl_mesh::events::EventDraft {
            execution_id: "lagging-cli",
            step_run_id: "r1",
            step: "start",
            discriminator: &d,
            ..Default::default()
        }
        .build(&noetl_mesh::payloads::StepStarted::default())
    };
    let ids: Vec<String> = (0..3).map(|n| event(n).event_id).collect();
    let (url, home_dir) = (l.url.clone(), home.path().to_path_buf());
    let (answered, misses) = l
        .rounds(
            |mesh, round| async move {
                // More than the in-process reads' backlog: a process takes
                // longer to start than the replica to catch up on less.
                events_round(&mesh, round, 4, &event(round)).await;
            },
            move |_| {
                let (url, home) = (url.clone(), home_dir.clone());
                async move {
                    let out = tokio::task::spawn_blocking(move || {
                        Command::new(env!("CARGO_BIN_EXE_noetl"))
                            .args(["events", "tail", "--execution", "lagging-cli"])
                            .args(["--from-start", "--no-follow", "--json", "--nats", &url])
                            .env("NOETL_HOME", home)
                            .env_remove("NOETL_NATS_URL")
                            .env_remove("NATS_URL")
                            .output()
                            .expect("run noetl")
                    })
                    .await
                    .unwrap();
                    if !out.status.success() {
                        return Err(noetl_mesh::MeshError::Consume {
                            consumer: "noetl events tail".into(),
                            message: String::from_utf8_lossy(&out.stderr).into_owned(),
                        });
                    }
                    Ok(String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .map(|l| {
                            let line: Value = serde_json::from_str(l).unwrap();
                            line["event_id"].as_str().unwrap_or_default().to_string()
                        })
                        .collect::<Vec<String>>())
                }
            },
            // Round r's tails must print the events of rounds 0..=r.
            |round, printed: &Vec<String>| {
                ids[..=round as usize].iter().all(|id| printed.contains(id))
            },
        )
        .await;
    assert!(answered > 0, "no tail answered");
    assert_eq!(misses, 0, "tails that ended before an acknowledged event");
}
