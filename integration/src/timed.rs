//! A loop whose tasks time themselves: what tests of concurrency bounds
//! measure (the tasks' own spans, not the engine's counters).

/// A loop whose python task records its own start/end times in a file, so
/// the test measures real concurrency (not the engine's counters).
pub fn timed_loop(mode: &str, mif: u32, n: u32, log: &str) -> String {
    timed_loop_of(mode, mif, n, 0.05, log)
}

/// [`timed_loop`] with calls of `secs` seconds each.
pub fn timed_loop_of(mode: &str, mif: u32, n: u32, secs: f64, log: &str) -> String {
    format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: timed_loop }}
workflow:
  - step: start
    loop:
      in: "{{{{ range({n}) | list }}}}"
      iterator: i
      spec: {{ mode: {mode}, max_in_flight: {mif} }}
    tool:
      - name: work
        kind: python
        args: {{ i: "{{{{ iter.i }}}}" }}
        code: |
          import time, os
          t0 = time.time()
          time.sleep({secs})
          with open({log:?}, "a") as f:
              f.write("%d %.6f %.6f\n" % (i, t0, time.time()))
          result = i
    next:
      arcs:
        - step: end
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: end
"#
    )
}

/// The spans [`timed_loop`] wrote to `path`: index, start and end (s).
pub fn read_log(path: &str) -> Vec<(u32, f64, f64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            (
                p[0].parse().unwrap(),
                p[1].parse().unwrap(),
                p[2].parse().unwrap(),
            )
        })
        .collect()
}

/// The most spans that overlap at any instant.
pub fn max_overlap(spans: &[(u32, f64, f64)]) -> usize {
    let mut points: Vec<(f64, i32)> = Vec::new();
    for (_, a, b) in spans {
        points.push((*a, 1));
        points.push((*b, -1));
    }
    points.sort_by(|x, y| x.partial_cmp(y).unwrap().then(x.1.cmp(&y.1)));
    let (mut cur, mut max) = (0i32, 0i32);
    for (_, d) in points {
        cur += d;
        max = max.max(cur);
    }
    max as usize
}
