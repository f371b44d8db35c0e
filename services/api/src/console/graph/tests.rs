use noetl_mesh::state::TokenRecord;
use serde_json::json;

use super::*;

const FLOW: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: graph_flow }
workflow:
  - step: start
    desc: fetch the pages
    tool:
      - { name: fetch, kind: http, url: "http://example.invalid" }
      - { name: keep, kind: noop }
    next:
      arcs:
        - { step: each, when: "{{ outcome.status == 'ok' }}" }
        - { step: end }
  - step: each
    loop:
      in: [1, 2, 3]
      iterator: n
      spec: { mode: parallel }
    tool:
      - { name: square, kind: noop }
    next:
      arcs:
        - { step: start, when: "{{ false }}" }
        - { step: end }
  - step: end
    tool:
      - { name: done, kind: noop }
"#;

fn playbook() -> Playbook {
    noetl_core::load::load_playbook(FLOW, "graph_flow.yaml")
        .expect("the test playbook loads")
        .playbook
}

fn header(live: Vec<TokenRecord>) -> ExecHeader {
    ExecHeader {
        started_at: "2026-01-01T00:00:00Z".into(),
        ..ExecHeader::running("e1", live)
    }
}

fn record(status: StepStatus, srid: &str) -> StepRecord {
    StepRecord {
        status,
        last_step_run_id: srid.into(),
        loop_counts: None,
        error: None,
        handled: Vec::new(),
    }
}

fn step<'g>(g: &'g Graph, name: &str) -> &'g GraphStep {
    g.steps.iter().find(|s| s.name == name).unwrap()
}

#[test]
fn before_the_plan_is_stored_the_graph_is_empty() {
    let h = header(vec![]);
    let g = graph_of(GraphInput {
        header: &h,
        playbook: None,
        records: &BTreeMap::new(),
        loops: &BTreeMap::new(),
    });
    assert!(!g.planned);
    assert!(g.steps.is_empty() && g.arcs.is_empty());
    assert_eq!(g.status, "RUNNING");
}

#[test]
fn steps_are_placed_and_arcs_marked_back_where_they_close_a_cycle() {
    let (h, p) = (header(vec![]), playbook());
    let g = graph_of(GraphInput {
        header: &h,
        playbook: Some(&p),
        records: &BTreeMap::new(),
        loops: &BTreeMap::new(),
    });
    assert!(g.planned);
    assert_eq!(g.entry.as_deref(), Some("start"));
    assert_eq!(g.layers, 3);
    let at: Vec<(&str, usize)> = g.steps.iter().map(|s| (s.name.as_str(), s.layer)).collect();
    assert_eq!(at, vec![("start", 0), ("each", 1), ("end", 2)]);
    let arcs: Vec<(&str, &str, usize, bool)> = g
        .arcs
        .iter()
        .map(|a| (a.from.as_str(), a.to.as_str(), a.index, a.back))
        .collect();
    assert_eq!(
        arcs,
        vec![
            ("start", "each", 0, false),
            ("start", "end", 1, false),
            ("each", "start", 0, true),
            ("each", "end", 1, false),
        ]
    );
    assert_eq!(
        g.arcs[0].when.as_deref(),
        Some("{{ outcome.status == 'ok' }}")
    );
    let start = step(&g, "start");
    assert_eq!(start.desc.as_deref(), Some("fetch the pages"));
    let kinds: Vec<&str> = start.tasks.iter().map(|t| t.kind.as_str()).collect();
    assert_eq!(kinds, vec!["http", "noop"]);
    assert_eq!(step(&g, "each").loop_mode.as_deref(), Some("parallel"));
    assert!(g
        .steps
        .iter()
        .all(|s| s.status == "not_run" && s.loop_progress.is_none()));
}

#[test]
fn a_live_token_makes_a_step_running_with_its_loop_counts_read_live() {
    let p = playbook();
    let h = header(vec![TokenRecord::new("sr-each", "each")]);
    let records = BTreeMap::from([("start".to_string(), record(StepStatus::Done, "sr-start"))]);
    let loops = BTreeMap::from([(
        "sr-each".to_string(),
        LoopRunView {
            total: 3,
            done: 1,
            failed: 0,
            in_flight: vec![1, 2],
        },
    )]);
    let g = graph_of(GraphInput {
        header: &h,
        playbook: Some(&p),
        records: &records,
        loops: &loops,
    });
    assert_eq!(step(&g, "start").status, "done");
    assert_eq!(step(&g, "start").step_run_id.as_deref(), Some("sr-start"));
    let each = step(&g, "each");
    assert_eq!((each.status.as_str(), each.live), ("running", 1));
    assert_eq!(each.step_run_id.as_deref(), Some("sr-each"));
    assert_eq!(
        each.loop_progress,
        Some(LoopProgress {
            total: 3,
            done: 1,
            failed: 0,
            in_flight: 2,
            running: true
        })
    );
    assert_eq!(step(&g, "end").status, "not_run");
}

#[test]
fn an_ended_step_shows_its_record_its_last_loop_counts_and_its_error() {
    let p = playbook();
    let h = header(vec![]);
    let mut each = record(StepStatus::Done, "sr-each");
    each.loop_counts = Some(json!({"total": 3, "done": 2, "failed": 1}));
    let mut end = record(StepStatus::Failed, "sr-end");
    end.error = Some("noop: boom".into());
    let mut start = record(StepStatus::Skipped, "sr-start");
    start.error = Some("only shown when failed".into());
    let records = BTreeMap::from([
        ("start".to_string(), start),
        ("each".to_string(), each),
        ("end".to_string(), end),
    ]);
    let g = graph_of(GraphInput {
        header: &h,
        playbook: Some(&p),
        records: &records,
        loops: &BTreeMap::new(),
    });
    assert_eq!(step(&g, "start").status, "skipped");
    assert_eq!(step(&g, "start").error, None);
    assert_eq!(
        step(&g, "each").loop_progress,
        Some(LoopProgress {
            total: 3,
            done: 2,
            failed: 1,
            in_flight: 0,
            running: false
        })
    );
    let end = step(&g, "end");
    assert_eq!(
        (end.status.as_str(), end.error.as_deref()),
        ("failed", Some("noop: boom"))
    );
    assert_eq!(end.loop_progress, None, "not a loop step");
}
