//! The playbook mix the fault tests drive (the chaos suite in
//! `services/cli/tests/chaos/`, the every-message-twice test in
//! `integration/tests/twice.rs`), each with the end state it must reach
//! whatever is killed or delivered twice: sequential chains, a parallel loop with every
//! reducer, pagination with jump/break and checkpoints, retries with
//! delays, an inclusive fan-out with a join, child playbooks, a failing step
//! routed by `step.failed`, a failure nobody handles, executions
//! waiting in line for one concurrency key, rows written to PostgreSQL,
//! and a cursor loop draining a PostgreSQL work queue.

use serde_json::{json, Value};

/// One playbook of the mix and what it must end with.
#[derive(Clone)]
pub struct Case {
    /// Short name (the playbook's `metadata.name` is `chaos_<name>`).
    pub name: &'static str,
    /// The playbook.
    pub yaml: String,
    /// Terminal status.
    pub status: &'static str,
    /// The final `ctx`, exactly.
    pub ctx: Value,
    /// Each step's final status, exactly.
    pub steps: Value,
    /// `(step, done)`: loop steps and the iterations their `loop.done`
    /// must count.
    pub loops: &'static [(&'static str, u64)],
    /// Tasks of kind `http`: each attempt the engine reports (a
    /// `task.done`) must match one distinct call the sink counted.
    pub http_tasks: &'static [&'static str],
    /// `(step, n)`: the step's iterations `0..n` each leave exactly one
    /// row in PostgreSQL ([`crate::rows`]).
    pub rows: &'static [(&'static str, u64)],
}

/// Steps in the sequential chain.
const CHAIN: usize = 8;
/// Iterations of the reducer loop.
const N: u64 = 24;

fn chain() -> Case {
    let mut yaml = String::from(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: chaos_chain }\n\
         workload: { api: \"\" }\nworkflow:\n",
    );
    let mut ctx = serde_json::Map::new();
    let mut steps = serde_json::Map::new();
    for i in 0..CHAIN {
        yaml.push_str(&format!(
            "  - step: s{i}\n    tool:\n      - name: t{i}\n        kind: noop\n        \
             result: \"{{{{ (args.n | default(0)) + 1 }}}}\"\n        spec:\n          \
             policy:\n            rules:\n              - else:\n                  then:\n                    \
             do: continue\n                    set_ctx: {{ s{i}: \"{{{{ outcome.result }}}}\" }}\n"
        ));
        if i == CHAIN / 2 {
            yaml.push_str(
                "      - name: effect\n        kind: http\n        \
                 url: \"{{ workload.api }}/effect/{{ execution_id }}/chain/0/{{ _attempt }}\"\n",
            );
        }
        if i + 1 < CHAIN {
            yaml.push_str(&format!(
                "    next:\n      arcs:\n        - step: s{}\n          \
                 args: {{ n: \"{{{{ ctx.s{i} }}}}\" }}\n",
                i + 1
            ));
        }
        ctx.insert(format!("s{i}"), json!(i + 1));
        steps.insert(format!("s{i}"), json!("done"));
    }
    Case {
        name: "chain",
        yaml,
        status: "completed",
        ctx: Value::Object(ctx),
        steps: Value::Object(steps),
        loops: &[],
        http_tasks: &["effect"],
        rows: &[],
    }
}

const REDUCERS: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_reducers }
workload: { api: "", n: 24 }
workflow:
  - step: start
    loop:
      in: "{{ range(workload.n) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 12
        policy:
          reducers:
            total: sum
            lo: min
            hi: max
            seen: append
            pairs: extend
            by_key: merge
    tool:
      - name: effect
        kind: http
        url: "{{ workload.api }}/effect/{{ execution_id }}/reducers/{{ iter.index }}/{{ _attempt }}"
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: retry, attempts: 5, delay: 0.2 }
              - else:
                  then: { do: continue }
      - name: square
        kind: python
        args: { i: "{{ iter.i }}" }
        code: |
          result = {"sq": i * i, "pair": [i, i * i], "by": {f"k{i:02d}": i}}
        spec:
          policy:
            rules:
              - else:
                  then:
                    set_ctx:
                      total: "{{ iter.i }}"
                      lo: "{{ outcome.result.sq + 5 }}"
                      hi: "{{ outcome.result.sq }}"
                      seen: "{{ iter.i }}"
                      pairs: "{{ outcome.result.pair }}"
                      by_key: "{{ outcome.result.by }}"
    next:
      arcs:
        - step: report
          when: "{{ event.name == 'loop.done' }}"
          args: { counts: "{{ event.counts }}" }
  - step: report
    tool:
      - name: keep
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { iterations_done: "{{ args.counts.done }}" } }
"#;

fn reducers() -> Case {
    let seen: Vec<u64> = (0..N).collect();
    let pairs: Vec<u64> = (0..N).flat_map(|i| [i, i * i]).collect();
    let by_key: serde_json::Map<String, Value> =
        (0..N).map(|i| (format!("k{i:02}"), json!(i))).collect();
    Case {
        name: "reducers",
        yaml: REDUCERS.to_string(),
        status: "completed",
        ctx: json!({
            "total": (0..N).sum::<u64>(),
            "lo": 5,
            "hi": (N - 1) * (N - 1),
            "seen": seen,
            "pairs": pairs,
            "by_key": by_key,
            "iterations_done": N,
        }),
        steps: json!({"start": "done", "report": "done"}),
        loops: &[("start", N)],
        http_tasks: &["effect"],
        rows: &[],
    }
}

const PAGES: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_pages }
workload:
  api: ""
  endpoints:
    - { name: a, pages: 4 }
    - { name: b, pages: 2 }
    - { name: c, pages: 3 }
workflow:
  - step: start
    loop:
      in: "{{ workload.endpoints }}"
      iterator: ep
      spec:
        mode: parallel
        max_in_flight: 3
        policy:
          reducers: { pages: sum, rows: extend }
    tool:
      - name: init
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_iter: { page: 1 } }
      - name: fetch
        kind: http
        url: "{{ workload.api }}/page/{{ execution_id }}/{{ iter.ep.name }}/{{ iter.page }}"
        params: { pages: "{{ iter.ep.pages }}", attempt: "{{ _attempt }}" }
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: retry, attempts: 5, delay: 0.2 }
              - else:
                  then:
                    do: continue
                    set_iter:
                      has_more: "{{ outcome.result.data.has_more }}"
                      items: "{{ outcome.result.data['items'] }}"
      - name: store
        kind: noop
        result: "{{ iter['items'] }}"
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { pages: 1, rows: "{{ outcome.result }}" } }
      - name: paginate
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ iter.has_more == true }}"
                then:
                  do: jump
                  to: fetch
                  set_iter: { page: "{{ (iter.page | int) + 1 }}" }
              - else:
                  then: { do: break }
    next:
      arcs:
        - step: done
          when: "{{ event.name == 'loop.done' }}"
  - step: done
"#;

fn pages() -> Case {
    Case {
        name: "pages",
        yaml: PAGES.to_string(),
        status: "completed",
        ctx: json!({
            "pages": 9,
            "rows": ["a#1", "a#2", "a#3", "a#4", "b#1", "b#2", "c#1", "c#2", "c#3"],
        }),
        steps: json!({"start": "done", "done": "done"}),
        loops: &[("start", 3)],
        http_tasks: &["fetch"],
        rows: &[],
    }
}

const RETRIES: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_retries }
workload: { api: "" }
workflow:
  - step: start
    tool:
      - name: flaky
        kind: http
        url: "{{ workload.api }}/flaky/{{ execution_id }}/{{ _attempt }}"
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: retry, attempts: 5, backoff: exponential, delay: 0.3 }
              - else:
                  then:
                    do: continue
                    set_ctx: { succeeded_on: "{{ outcome.result.data.attempt }}" }
"#;

fn retries() -> Case {
    Case {
        name: "retries",
        yaml: RETRIES.to_string(),
        status: "completed",
        ctx: json!({"succeeded_on": 3}),
        steps: json!({"start": "done"}),
        loops: &[],
        http_tasks: &["flaky"],
        rows: &[],
    }
}

const FANJOIN: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_fanjoin }
workload: { api: "" }
workflow:
  - step: start
    next:
      spec: { mode: inclusive }
      arcs:
        - step: left
        - step: right
        - step: never
          when: "{{ false }}"
  - step: left
    tool:
      - name: slow
        kind: python
        code: |
          import time
          time.sleep(0.3)
          result = "L"
    next:
      arcs:
        - step: merge
          args: { left: "{{ event.result }}" }
  - step: right
    tool:
      - name: effect
        kind: http
        url: "{{ workload.api }}/effect/{{ execution_id }}/right/0/{{ _attempt }}"
      - name: r
        kind: noop
        result: R
    next:
      arcs:
        - step: merge
          args: { right: "{{ event.result }}" }
  - step: never
  - step: merge
    spec:
      join: all
    tool:
      - name: combine
        kind: noop
        result: "{{ args.left }}+{{ args.right }}"
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { merged: "{{ outcome.result }}" } }
"#;

fn fanjoin() -> Case {
    Case {
        name: "fanjoin",
        yaml: FANJOIN.to_string(),
        status: "completed",
        ctx: json!({"merged": "L+R"}),
        steps: json!({
            "start": "done", "left": "done", "right": "done",
            "never": "not_run", "merge": "done",
        }),
        loops: &[],
        http_tasks: &["effect"],
        rows: &[],
    }
}

const CHILDREN: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_children }
workflow:
  - step: start
    loop:
      in: "{{ [1, 2, 3] }}"
      iterator: x
      spec:
        mode: parallel
        max_in_flight: 3
        policy:
          reducers: { child_sum: sum, child_values: append }
    tool:
      - name: child
        kind: playbook
        args: { x: "{{ iter.x }}" }
        playbook: |
          apiVersion: noetl.io/v2
          kind: Playbook
          metadata: { name: chaos_child }
          workload: { x: 0 }
          workflow:
            - step: start
              tool:
                - name: times_ten
                  kind: python
                  args: { x: "{{ workload.x }}" }
                  code: |
                    result = x * 10
                  spec:
                    policy:
                      rules:
                        - else:
                            then: { set_ctx: { tens: "{{ outcome.result }}" } }
              next:
                arcs:
                  - step: finish
            - step: finish
              tool:
                - name: plus_one
                  kind: noop
                  result: "{{ ctx.tens + 1 }}"
                  spec:
                    policy:
                      rules:
                        - else:
                            then: { set_ctx: { value: "{{ outcome.result }}" } }
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'ok' }}"
                then:
                  do: continue
                  set_ctx:
                    child_sum: "{{ outcome.result.value }}"
                    child_values: "{{ outcome.result.value }}"
"#;

fn children() -> Case {
    Case {
        name: "children",
        yaml: CHILDREN.to_string(),
        status: "completed",
        ctx: json!({"child_sum": 63, "child_values": [11, 21, 31]}),
        steps: json!({"start": "done"}),
        loops: &[("start", 3)],
        http_tasks: &[],
        rows: &[],
    }
}

const HANDLED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_handled }
workflow:
  - step: start
    tool:
      - name: divide
        kind: python
        code: |
          result = 1 / 0
    next:
      arcs:
        - step: celebrate
          when: "{{ event.name == 'step.done' }}"
        - step: handle
          when: "{{ event.name == 'step.failed' }}"
          args: { why: "{{ event.error.message }}" }
  - step: celebrate
  - step: handle
    tool:
      - name: note
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { handled: "{{ args.why }}" } }
"#;

fn handled() -> Case {
    Case {
        name: "handled",
        yaml: HANDLED.to_string(),
        status: "completed",
        ctx: json!({"handled": "ZeroDivisionError: division by zero"}),
        steps: json!({"start": "failed", "celebrate": "not_run", "handle": "done"}),
        loops: &[],
        http_tasks: &[],
        rows: &[],
    }
}

const UNHANDLED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_unhandled }
workload: { api: "" }
workflow:
  - step: start
    tool:
      - name: effect
        kind: http
        url: "{{ workload.api }}/effect/{{ execution_id }}/unhandled/0/{{ _attempt }}"
      - name: boom
        kind: python
        code: |
          raise ValueError("no luck")
    next:
      arcs:
        - step: after
          when: "{{ event.name == 'step.done' }}"
  - step: after
"#;

fn unhandled() -> Case {
    Case {
        name: "unhandled",
        yaml: UNHANDLED.to_string(),
        status: "failed",
        ctx: json!({}),
        steps: json!({"start": "failed", "after": "not_run"}),
        loops: &[],
        http_tasks: &["effect"],
        rows: &[],
    }
}

const GATED: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: chaos_gated }
executor:
  spec:
    policy:
      concurrency: { key: chaos-gated, limit: 1, on_limit: queue }
workload: { api: "" }
workflow:
  - step: start
    tool:
      - name: nap
        kind: python
        code: |
          import time
          time.sleep(0.4)
          result = 1
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { napped: "{{ outcome.result }}" } }
      - name: effect
        kind: http
        url: "{{ workload.api }}/effect/{{ execution_id }}/gated/0/{{ _attempt }}"
"#;

/// One execution at a time under one concurrency key: the mix has two of
/// these, so in each wave one waits in line for the other (its record
/// is purged by the chaos suite like the rest).
fn gated(name: &'static str) -> Case {
    Case {
        name,
        yaml: GATED.to_string(),
        status: "completed",
        ctx: json!({"napped": 1}),
        steps: json!({"start": "done"}),
        loops: &[],
        http_tasks: &["effect"],
        rows: &[],
    }
}

/// A parallel loop whose iterations each upsert a row keyed by execution,
/// step and iteration (`attempts` counts repeats).
fn rows() -> Case {
    let yaml = format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: chaos_rows }}
workload: {{ api: "" }}
workflow:
  - step: start
    loop:
      in: [0, 1, 2, 3, 4, 5]
      iterator: i
      spec: {{ mode: parallel, max_in_flight: 3 }}
    tool:
      - name: row
        kind: postgres
        connection: "{conn}"
        command: |
          INSERT INTO {table} (execution_id, step, idx) VALUES ('{{{{ execution_id }}}}', 'start', {{{{ iter.i }}}})
          ON CONFLICT (execution_id, step, idx) DO UPDATE SET attempts = {table}.attempts + 1
"#,
        conn = crate::rows::CONNECTION,
        table = crate::rows::TABLE,
    );
    Case {
        name: "rows",
        yaml,
        status: "completed",
        ctx: json!({}),
        steps: json!({"start": "done"}),
        loops: &[("start", 6)],
        http_tasks: &[],
        rows: &[("start", 6)],
    }
}

/// The cursor case's claim (a template): the rows marked with this claim's
/// `__frame_claim`, whatever their status, or else up to
/// `__frame_max_rows` pending rows of the execution, marked. A claim that
/// runs again returns exactly what its first run took, even after some of
/// those rows were done (docs/dsl.md, "A claim that runs again takes the
/// same rows").
pub fn cursor_claim(queue: &str) -> String {
    format!(
        r#"WITH mine AS (
  SELECT id FROM {queue}
  WHERE execution_id = '{{{{ execution_id }}}}' AND claimed_by = '{{{{ __frame_claim }}}}'
), c AS (
  SELECT id FROM {queue}
  WHERE execution_id = '{{{{ execution_id }}}}' AND status = 'pending'
    AND NOT EXISTS (SELECT 1 FROM mine)
  ORDER BY id FOR UPDATE SKIP LOCKED LIMIT {{{{ __frame_max_rows }}}}
), taken AS (
  UPDATE {queue} q SET status = 'claimed', claimed_by = '{{{{ __frame_claim }}}}'
  FROM c WHERE q.execution_id = '{{{{ execution_id }}}}' AND q.id = c.id RETURNING q.id
)
SELECT id FROM taken UNION ALL SELECT id FROM mine ORDER BY id
"#
    )
}

/// `text` with every line indented by `by` spaces.
fn indent(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// A cursor loop draining the execution's own rows of a work queue (a
/// first step fills them), two claims of two rows in flight, each claim
/// taking [`cursor_claim`]; each iteration upserts its row's key
/// (`attempts` counts repeats) and marks it done. Needs
/// [`crate::rows::register_credential`].
fn cursor() -> Case {
    let yaml = format!(
        r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: chaos_cursor }}
keychain: [ {{ name: {cred}, kind: postgres_credential }} ]
workload: {{ api: "" }}
workflow:
  - step: seed
    tool:
      - name: fill
        kind: postgres
        auth: {cred}
        command: |
          INSERT INTO {queue} (execution_id, id) SELECT '{{{{ execution_id }}}}', g FROM generate_series(0, 5) g
          ON CONFLICT (execution_id, id) DO NOTHING
    next:
      arcs:
        - step: drain
  - step: drain
    loop:
      cursor:
        kind: postgres
        auth: {cred}
        claim: |
{claim}      iterator: job
      spec:
        mode: cursor
        max_in_flight: 2
        frame: {{ max_rows: 2 }}
        policy: {{ reducers: {{ processed: sum }} }}
    tool:
      - name: work
        kind: postgres
        auth: {cred}
        command: |
          INSERT INTO {table} (execution_id, step, idx) VALUES ('{{{{ execution_id }}}}', 'drain', {{{{ iter.job.id }}}})
          ON CONFLICT (execution_id, step, idx) DO UPDATE SET attempts = {table}.attempts + 1;
          UPDATE {queue} SET status = 'done' WHERE execution_id = '{{{{ execution_id }}}}' AND id = {{{{ iter.job.id }}}}
        spec:
          policy:
            rules:
              - else:
                  then: {{ do: continue, set_ctx: {{ processed: 1 }} }}
    next:
      arcs:
        - step: done
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: done
"#,
        cred = crate::rows::CREDENTIAL,
        queue = crate::rows::QUEUE,
        table = crate::rows::TABLE,
        claim = indent(&cursor_claim(crate::rows::QUEUE), 10),
    );
    Case {
        name: "cursor",
        yaml,
        status: "completed",
        ctx: json!({"processed": 6}),
        steps: json!({"seed": "done", "drain": "done", "done": "done"}),
        loops: &[("drain", 6)],
        http_tasks: &[],
        rows: &[("drain", 6)],
    }
}

/// The whole mix.
pub fn mix() -> Vec<Case> {
    vec![
        chain(),
        reducers(),
        pages(),
        retries(),
        fanjoin(),
        children(),
        handled(),
        unhandled(),
        gated("gated-a"),
        gated("gated-b"),
        rows(),
        cursor(),
    ]
}

/// The workload every case is submitted with.
pub fn workload(api: &str) -> Value {
    json!({ "api": api })
}
