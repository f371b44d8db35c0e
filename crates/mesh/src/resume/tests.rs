use super::*;
use crate::state::StepStatus;
use serde_json::json;

fn playbook() -> Playbook {
    let yaml = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: p, path: demo/p }
workload: { n: 1 }
workflow:
  - step: start
    next: { arcs: [ { step: a } ] }
  - step: a
    next: { arcs: [ { step: b } ] }
  - step: b
    loop: { in: "{{ [1, 2] }}", iterator: x }
    tool: { kind: noop }
    next: { arcs: [ { step: c } ] }
  - step: c
  - step: other
"#;
    noetl_core::load::load_playbook(yaml, "p.yaml")
        .unwrap()
        .playbook
}

fn stopped_header(status: ExecStatus, stopped: Vec<TokenRecord>) -> ExecHeader {
    ExecHeader {
        status,
        stopped,
        error: Some("boom".into()),
        ended_at: Some("t".into()),
        terminal_emitted: true,
        ..ExecHeader::running("e1", Vec::new())
    }
}

fn record(srid: &str) -> StepRecord {
    StepRecord {
        status: StepStatus::Done,
        last_step_run_id: srid.into(),
        loop_counts: None,
        error: None,
        handled: Vec::new(),
    }
}

fn token(id: &str, step: &str) -> TokenRecord {
    TokenRecord {
        args: json!({"k": id}),
        arc: 1,
        parent: "r0".into(),
        ..TokenRecord::new(id, step)
    }
}

fn decided(h: &ExecHeader, from: Option<&str>) -> Result<Decision, ResumeError> {
    let records = BTreeMap::from([
        ("start".to_string(), record("r0")),
        ("a".to_string(), record("ra")),
        ("c".to_string(), record("rc")),
        ("other".to_string(), record("ro")),
    ]);
    decide(&Decide {
        header: h,
        playbook: &playbook(),
        playbook_name: "demo/p@v1",
        records: &records,
        from,
    })
}

#[test]
fn the_stopped_tokens_run_again_with_fresh_ids_and_their_args() {
    let h = stopped_header(ExecStatus::Failed, vec![token("t1", "a"), token("t2", "b")]);
    let d = decided(&h, None).unwrap();
    let ids: Vec<&str> = d.tokens.iter().map(|t| t.token_id.as_str()).collect();
    assert_eq!(ids, [again_id("t1", 1), again_id("t2", 1)]);
    assert_ne!(ids[0], "t1");
    assert_eq!(d.tokens[0].args, json!({"k": "t1"}));
    assert_eq!((d.tokens[0].arc, d.tokens[0].parent.as_str()), (1, "r0"));
    // The loop step continues its stopped run.
    assert_eq!(d.continues, [(again_id("t2", 1), "t2".to_string())]);
    assert!(d.superseded.is_empty());
    // Every stopped run is retired: none goes on beside the new ones.
    assert_eq!(d.retired, ["t1", "t2"]);
    // A second resume gets other ids.
    let h2 = ExecHeader { resumes: 1, ..h };
    assert_ne!(decided(&h2, None).unwrap().tokens[0].token_id, ids[0]);
}

#[test]
fn from_a_step_supersedes_what_is_reachable_from_it_and_ran() {
    let h = stopped_header(ExecStatus::Cancelled, vec![token("t2", "b")]);
    let d = decided(&h, Some("a")).unwrap();
    assert_eq!(d.tokens.len(), 1);
    assert_eq!(d.tokens[0].step, "a");
    assert_eq!(d.tokens[0].args, Value::Null, "no stopped token of `a`");
    assert_eq!(
        d.superseded,
        [
            ("a".to_string(), "ra".to_string()),
            ("c".to_string(), "rc".to_string())
        ],
        "b has no record; start and other are not reachable from a"
    );
    assert!(d.continues.is_empty(), "a restart runs every iteration");
    assert_eq!(d.retired, ["t2"], "the stopped loop run goes no further");
    let err = decided(&h, Some("nope")).unwrap_err();
    assert!(
        err.to_string()
            .contains("`--from nope` names no step of demo/p@v1"),
        "{err}"
    );
}

#[test]
fn only_a_failed_or_cancelled_execution_with_something_to_run_resumes() {
    for status in [ExecStatus::Running, ExecStatus::Completed] {
        let h = ExecHeader {
            status,
            ..stopped_header(ExecStatus::Failed, vec![token("t1", "a")])
        };
        let err = decided(&h, None).unwrap_err();
        assert!(matches!(err, ResumeError::NotStopped { .. }), "{err}");
    }
    let empty = stopped_header(ExecStatus::Failed, Vec::new());
    let err = decided(&empty, None).unwrap_err();
    assert!(err.to_string().contains("--from STEP"), "{err}");
    assert!(decided(&empty, Some("start")).is_ok());
}

#[test]
fn a_version_without_a_step_still_to_run_is_refused_naming_it() {
    let h = stopped_header(ExecStatus::Failed, vec![token("t1", "gone")]);
    let err = decided(&h, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "execution e1 cannot resume under demo/p@v1: it has no step \"gone\", which the execution still has to run"
    );
}

#[test]
fn the_resumed_header_runs_again_and_counts_the_resume() {
    let h = stopped_header(ExecStatus::Failed, vec![token("t1", "a")]);
    let r = resumed_header(&h, vec![token("n1", "a")], 42);
    assert_eq!(r.status, ExecStatus::Running);
    assert_eq!((r.resumes, r.resumed_at_ms), (1, 42));
    assert!(r.error.is_none() && r.ended_at.is_none() && !r.terminal_emitted);
    assert!(r.stopped.is_empty());
    assert!(r.is_live("n1"));
}

#[test]
fn the_resumed_plan_merges_the_changes_and_restarts_the_clock() {
    let mut old = PlanRecord::new(
        "e1".into(),
        "demo/p@v1".into(),
        playbook(),
        json!({"n": 1, "keep": {"a": 1}}),
    );
    old.trace_id = "tr".into();
    old.started_ms = 5;
    let set = json!({"n": 2, "keep": {"b": 2}})
        .as_object()
        .cloned()
        .unwrap();
    let plan = resumed_plan(&old, None, &set, 99);
    assert_eq!(plan.workload, json!({"n": 2, "keep": {"a": 1, "b": 2}}));
    assert_eq!((plan.started_ms, plan.trace_id.as_str()), (99, "tr"));
    // Another version: its defaults under the execution's workload.
    let mut other = playbook();
    other.workload = json!({"n": 7, "fresh": true}).as_object().cloned().unwrap();
    other.workflow.pop();
    let plan = resumed_plan(&old, Some((other, "demo/p@v2".into())), &Map::new(), 99);
    assert_eq!(
        plan.workload,
        json!({"n": 1, "fresh": true, "keep": {"a": 1}})
    );
    assert!(plan.step("other").is_none());
    assert_eq!(plan.source_name, "demo/p@v2");
}

#[test]
fn a_continued_loop_run_is_marked_superseded_once_and_only_while_it_has_not_ended() {
    let run = json!({"step": "b", "total": 5, "done": 2, "in_flight": [2, 3]});
    let marked = superseded_record(Some(&run)).expect("marked");
    assert_eq!(marked["superseded"], true);
    assert_eq!(marked["in_flight"], json!([2, 3]), "the rest kept as it is");
    assert_eq!(superseded_record(Some(&marked)), None, "marked once");
    let ended = json!({"step": "b", "done_emitted": true});
    assert_eq!(superseded_record(Some(&ended)), None, "an ended run stays");
    assert_eq!(superseded_record(None), None);
}
