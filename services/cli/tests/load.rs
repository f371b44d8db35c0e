//! Load: 1,000 executions of a small playbook started at once on `noetl
//! serve` processes, while cold `noetl exec status` and `noetl events
//! tail` processes keep probing them. Every execution must complete, and
//! every probe must answer within a second (docs/reliability.md, "Load").

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use noetl_mesh::server::{NatsServerProcess, ServerOptions};
use noetl_mesh::state::ExecStatus;
use noetl_mesh::{codec, Mesh, MeshConfig};
use noetl_wire::ExecutionRequest;

mod support;
use support::{free_port, noetl, Procs};

/// Executions started at once.
const EXECUTIONS: usize = 1_000;
/// What every probe must answer within.
const BOUND: Duration = Duration::from_secs(1);

const SMALL: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: small }
workflow:
  - step: start
    tool: [{ name: a, kind: noop, result: 1 }]
    next: { arcs: [{ step: middle }] }
  - step: middle
    tool: [{ name: b, kind: noop, result: 2 }]
    next: { arcs: [{ step: end }] }
  - step: end
    tool: [{ name: c, kind: noop, result: 3 }]
"#;

/// A cold `noetl exec status ID`: how long until it exited, and its output.
fn probe_status(home: &Path, url: &str, eid: &str) -> (Duration, String) {
    let t = Instant::now();
    let out = noetl(home)
        .args(["exec", "status", eid, "--nats", url])
        .output()
        .expect("run noetl exec status");
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    // An execution the router has not taken yet is not known yet: that
    // is an answer too.
    assert!(
        out.status.success() || err.contains("no execution"),
        "exec status {eid}: {:?}\n{text}\n{err}",
        out.status,
    );
    (took, text)
}

/// A cold `noetl events tail` of one execution from the start: how long
/// until it printed its first event.
fn probe_tail(home: &Path, url: &str, eid: &str) -> Duration {
    let t = Instant::now();
    let mut child = noetl(home)
        .args(["events", "tail", "--execution", eid, "--from-start"])
        .args(["--nats", url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run noetl events tail");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(20));
    let took = t.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    let line = line.expect("events tail printed nothing within 20 s");
    assert!(line.contains(eid) || !line.is_empty(), "{line:?}");
    took
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn a_thousand_executions_complete_while_status_and_tail_answer_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let nats = NatsServerProcess::start(ServerOptions {
        store_dir: dir.path().join("nats"),
        port: Some(free_port()),
        binary: None,
    })
    .expect("nats-server");
    let url = nats.url();

    let mut services = Procs(Vec::new());
    for args in [
        vec!["router"],
        vec!["scheduler"],
        vec!["executor", "--kind", "noop"],
    ] {
        let log = dir.path().join(format!("{}.log", args[0]));
        services.0.push(
            noetl(&home)
                .arg("serve")
                .args(&args)
                .args(["--nats", &url, "--concurrency", "64"])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(log).unwrap())
                .spawn()
                .unwrap(),
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mesh = rt.block_on(async {
        Mesh::connect(MeshConfig {
            nats_url: url.clone(),
            data_dir: home.clone(),
            ..MeshConfig::default()
        })
        .await
        .expect("connect")
    });

    // All at once: every request published, then every ack awaited.
    let eids: Vec<String> = (0..EXECUTIONS)
        .map(|_| noetl_mesh::ids::new_execution_id())
        .collect();
    let started = Instant::now();
    rt.block_on(async {
        let mut acks = Vec::with_capacity(EXECUTIONS);
        for eid in &eids {
            let req = ExecutionRequest {
                execution_id: eid.clone(),
                playbook_yaml: SMALL.into(),
                source_name: "load/small.yaml".into(),
                ..Default::default()
            };
            acks.push(
                mesh.publish(mesh.subjects().exec_request(), eid, codec::encode(&req))
                    .await
                    .expect("publish a request"),
            );
        }
        for a in acks {
            a.wait().await.expect("request ack");
        }
    });

    // Probe while they run: a status and a tail of an execution of the
    // batch, each a new process, until every execution has ended.
    let (mut status_times, mut tail_times) = (Vec::new(), Vec::new());
    let mut remaining: Vec<&String> = eids.iter().collect();
    let mut probes_under_load = 0;
    let mut answered_with_status = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut i = 0usize;
    while !remaining.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} executions still running after 300 s",
            remaining.len()
        );
        let eid = &eids[(i * 97) % EXECUTIONS];
        i += 1;
        let (took, text) = probe_status(&home, &url, eid);
        status_times.push(took);
        if text.contains("running") || text.contains("completed") {
            answered_with_status += 1;
        }
        tail_times.push(probe_tail(&home, &url, eid));
        probes_under_load += 1;
        // Drop those that ended (oldest first: they end roughly in order).
        rt.block_on(async {
            while let Some(eid) = remaining.first() {
                match mesh.exec_header(eid).await.expect("read header") {
                    Some(h) if h.status.is_terminal() => {
                        assert_eq!(h.status, ExecStatus::Completed, "{eid}");
                        remaining.remove(0);
                    }
                    _ => break,
                }
            }
            // The rest, in one concurrent sweep.
            let headers =
                futures::future::join_all(remaining.iter().map(|eid| mesh.exec_header(eid))).await;
            let mut still = Vec::new();
            for (eid, h) in remaining.iter().zip(headers) {
                match h.expect("read header") {
                    Some(h) if h.status.is_terminal() => {
                        assert_eq!(h.status, ExecStatus::Completed, "{eid}");
                    }
                    _ => still.push(*eid),
                }
            }
            remaining = still;
        });
    }
    let elapsed = started.elapsed();
    let (status_max, tail_max) = (
        *status_times.iter().max().unwrap(),
        *tail_times.iter().max().unwrap(),
    );
    eprintln!(
        "load: {EXECUTIONS} executions in {:.1} s ({:.0} exec/s); {probes_under_load} probes under load: \
         exec status median {:?} max {:?}, events tail median {:?} max {:?}",
        elapsed.as_secs_f64(),
        EXECUTIONS as f64 / elapsed.as_secs_f64(),
        median(&mut status_times.clone()),
        status_max,
        median(&mut tail_times.clone()),
        tail_max,
    );
    assert!(
        probes_under_load >= 3,
        "only {probes_under_load} probes ran under load"
    );
    assert!(
        answered_with_status >= 1,
        "no probe saw an execution's status"
    );
    assert!(
        status_max < BOUND,
        "noetl exec status took {status_max:?}: {status_times:?}"
    );
    assert!(
        tail_max < BOUND,
        "noetl events tail took {tail_max:?}: {tail_times:?}"
    );
    drop(services);
    drop(nats);
}
