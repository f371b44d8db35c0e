//! `make test-heavy`: a 100,000-item parallel noop loop through separate
//! service processes, reporting each service's peak RSS (VmHWM).

use std::process::{Child, Command, Stdio};
use std::time::Instant;

mod support;

fn noetl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_noetl"));
    c.env_remove("NOETL_NATS_URL");
    c
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Procs(Vec<(String, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
#[ignore = "heavy: run with `make test-heavy`"]
fn a_100k_item_parallel_loop_completes_with_flat_memory() {
    let n = 100_000;
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(noetl(), &url);
    let mut procs = Vec::new();
    for (name, args) in [
        ("router", vec!["serve", "router", "--concurrency", "32"]),
        ("scheduler", vec!["serve", "scheduler"]),
        (
            "loop-supervisor",
            vec!["serve", "loop-supervisor", "--concurrency", "32"],
        ),
        (
            "executor(noop)",
            vec!["serve", "executor", "--kind", "noop", "--concurrency", "64"],
        ),
    ] {
        let child = noetl()
            .args(&args)
            .args(["--nats", &url])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        procs.push((name.to_string(), child));
    }
    let procs = Procs(procs);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big_loop.yaml");
    std::fs::write(
        &file,
        format!(
            r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: big_loop }}
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
    next:
      arcs:
        - step: end
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: end
"#
        ),
    )
    .unwrap();
    let t0 = Instant::now();
    let id = support::exec_start(noetl(), &url, &[&file]);
    let s = support::exec_wait(noetl(), &url, &id, 3000);
    let took = t0.elapsed();
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["ctx"]["total"], n, "every item counted exactly once");
    println!(
        "100k loop: {:.1} s ({:.0} iterations/s)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
    for (name, child) in &procs.0 {
        let kib = peak_rss_kib(child.id());
        println!("peak RSS {name:<16} {:>7.1} MiB", kib as f64 / 1024.0);
        assert!(
            kib < 512 * 1024,
            "{name} peaked at {kib} KiB: memory is not flat"
        );
    }
}
