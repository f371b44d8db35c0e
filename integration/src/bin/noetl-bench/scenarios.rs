//! The benchmark's playbooks and how each is timed. Every scenario runs on
//! an already warm mesh and checks its result, so a fast wrong answer
//! never counts.

use std::time::{Duration, Instant};

use noetl_integration::Cluster;
use noetl_mesh::{codec, Mesh};
use noetl_wire::ExecutionRequest;
use serde_json::Value;

use crate::ends::Ends;

const HEAD: &str = "apiVersion: noetl.io/v2\nkind: Playbook\n";

/// How long any one bench execution may take.
pub const TIMEOUT: Duration = Duration::from_secs(600);

/// Submit `yaml` and time it from the request to its `execution.completed`.
pub async fn time_one(cluster: &Cluster, ends: &Ends, yaml: &str, workload: Value) -> Duration {
    let t0 = Instant::now();
    let eid = cluster.submit(yaml, "bench.yaml", workload).await;
    ends.wait(&eid, TIMEOUT).await - t0
}

/// Submit `yaml`, wait for its end, and return its final `ctx`.
pub async fn ctx_of(
    cluster: &Cluster,
    ends: &Ends,
    yaml: &str,
    workload: Value,
) -> (Duration, Value) {
    let t0 = Instant::now();
    let eid = cluster.submit(yaml, "bench.yaml", workload).await;
    let took = ends.wait(&eid, TIMEOUT).await - t0;
    let ctx = cluster.mesh.exec_ctx(&eid).await.expect("read ctx");
    (took, ctx)
}

/// `n` sequential steps of one `task` each, linked by arcs.
pub fn chain(name: &str, n: usize, task: &str) -> String {
    let mut y = format!("{HEAD}metadata: {{ name: {name} }}\nworkflow:\n");
    for i in 0..n {
        y.push_str(&format!("  - step: s{i}\n    tool:\n{task}"));
        if i + 1 < n {
            y.push_str(&format!(
                "    next:\n      arcs:\n        - step: s{}\n",
                i + 1
            ));
        }
    }
    y
}

/// A noop task, as [`chain`] takes it.
pub const NOOP: &str = "      - name: t\n        kind: noop\n";

/// A python task computing fibo(10) (the shape of Windmill's benchmark).
pub const FIBO: &str = "      - name: fibo\n        kind: python\n        code: |\n          def fibo(n):\n              return n if n < 2 else fibo(n - 1) + fibo(n - 2)\n          result = fibo(10)\n";

/// An http task calling `workload.url`.
pub const HTTP: &str =
    "      - name: call\n        kind: http\n        url: \"{{ workload.url }}\"\n";

/// One step whose pipeline is `n` noop tasks.
pub fn pipeline(n: usize) -> String {
    let mut y = format!(
        "{HEAD}metadata: {{ name: bench_pipeline }}\nworkflow:\n  - step: start\n    tool:\n"
    );
    for i in 0..n {
        y.push_str(&format!("      - name: t{i}\n        kind: noop\n"));
    }
    y
}

/// A parallel loop of `n` iterations, `mif` in flight, whose body is
/// `body` (a task that sets `ctx.total` through the `sum` reducer).
pub fn parallel_loop(n: usize, mif: usize, body: &str) -> String {
    format!(
        r#"{HEAD}metadata: {{ name: bench_loop }}
workflow:
  - step: start
    loop:
      in: "{{{{ range({n}) | list }}}}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: {mif}
        policy:
          reducers: {{ total: sum }}
    tool:
{body}"#
    )
}

/// A noop loop body counting 1 per iteration.
pub const LOOP_NOOP: &str = r#"      - name: touch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { total: 1 } }
"#;

/// An http loop body calling `workload.url`, counting 1 per iteration.
pub const LOOP_HTTP: &str = r#"      - name: call
        kind: http
        url: "{{ workload.url }}"
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { total: 1 } }
"#;

/// A python loop body: `result = i * i`, summed.
pub const LOOP_PYTHON: &str = r#"      - name: square
        kind: python
        args: { i: "{{ iter.i }}" }
        code: "result = i * i"
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { total: "{{ outcome.result }}" } }
"#;

/// A step returning `mib` MiB of text, read whole by the next step.
pub fn big_result(mib: usize) -> String {
    format!(
        r#"{HEAD}metadata: {{ name: bench_big }}
workflow:
  - step: make
    tool:
      - name: make
        kind: python
        code: "result = 'x' * ({mib} * 1024 * 1024)"
    next:
      arcs:
        - step: use
  - step: use
    tool:
      - name: measure
        kind: python
        args: {{ big: "{{{{ make }}}}" }}
        code: "result = len(big)"
        spec:
          policy:
            rules:
              - else:
                  then: {{ set_ctx: {{ size: "{{{{ outcome.result }}}}" }} }}
"#
    )
}

/// Publish `n` requests of `yaml` back to back, then await their acks:
/// all start at once. Each execution's id and when it was requested.
pub async fn publish_batch(mesh: &Mesh, yaml: &str, n: usize) -> Vec<(String, Instant)> {
    let mut started = Vec::with_capacity(n);
    let mut acks = Vec::with_capacity(n);
    for _ in 0..n {
        let eid = noetl_mesh::ids::new_execution_id();
        let req = ExecutionRequest {
            execution_id: eid.clone(),
            playbook_yaml: yaml.to_string(),
            source_name: "bench_five.yaml".into(),
            ..Default::default()
        };
        let subject = mesh.subjects().exec_request();
        let at = Instant::now();
        let ack = mesh.publish(subject, &eid, codec::encode(&req)).await;
        acks.push(ack.expect("publish a request"));
        started.push((eid, at));
    }
    for ack in acks {
        ack.wait().await.expect("request acked");
    }
    started
}

/// `n` executions of a `steps`-step noop chain started at once: the
/// executions per second of the whole batch and each one's latency from
/// its request to its end, in ms.
pub async fn concurrent(cluster: &Cluster, ends: &Ends, n: usize, steps: usize) -> (f64, Vec<f64>) {
    let yaml = chain("bench_five", steps, NOOP);
    let t0 = Instant::now();
    let started = publish_batch(&cluster.mesh, &yaml, n).await;
    let mut latencies = Vec::with_capacity(n);
    let mut last = t0;
    for (eid, at) in &started {
        let end = ends.wait(eid, TIMEOUT).await;
        last = last.max(end);
        latencies.push((end - *at).as_secs_f64() * 1000.0);
    }
    let rate = n as f64 / (last - t0).as_secs_f64();
    (rate, latencies)
}
