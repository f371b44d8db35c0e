use super::*;
use noetl_core::routing;
use noetl_mesh::event_type::EventType;
use noetl_mesh::ids::derive_id;
use noetl_mesh::state::TokenRecord;
use serde_json::json;
use serde_json::Value;

fn token(id: &str, parent: &str) -> TokenRecord {
    TokenRecord {
        token_id: id.into(),
        step: format!("step-{id}"),
        args: Value::Null,
        arc: 0,
        parent: parent.into(),
    }
}

fn header(status: ExecStatus, live: &[&str]) -> ExecHeader {
    ExecHeader {
        status,
        ..ExecHeader::running(
            "e1",
            live.iter().map(|t| TokenRecord::new(*t, "s")).collect(),
        )
    }
}

fn boundary<'a>(
    srid: &'a str,
    tokens: &'a [TokenRecord],
    failure: Option<&'a str>,
) -> Boundary<'a> {
    Boundary {
        step_run_id: srid,
        tokens,
        failure,
        now: "t1",
        status: StepStatus::Done,
    }
}

#[test]
fn a_boundary_replaces_its_token_by_the_fired_ones() {
    let fired = [token("a", "s1"), token("b", "s1")];
    let h = transition(
        &header(ExecStatus::Running, &["s1", "s2"]),
        &boundary("s1", &fired, None),
    )
    .expect("applied");
    let live: Vec<&str> = h.live.iter().map(|t| t.token_id.as_str()).collect();
    assert_eq!(live, vec!["s2", "a", "b"]);
    assert_eq!((h.status, h.ended_at), (ExecStatus::Running, None));
}

#[test]
fn the_last_token_ending_completes_the_execution() {
    let h = transition(
        &header(ExecStatus::Running, &["s1"]),
        &boundary("s1", &[], None),
    )
    .unwrap();
    assert_eq!(h.status, ExecStatus::Completed);
    assert_eq!(h.ended_at.as_deref(), Some("t1"));
    assert!(h.live.is_empty() && h.error.is_none());
}

#[test]
fn an_unhandled_failure_fails_the_execution_and_ends_every_token() {
    let fired = [token("a", "s1")];
    let h = transition(
        &header(ExecStatus::Running, &["s1", "s2"]),
        &boundary("s1", &fired, Some("step s failed: boom")),
    )
    .unwrap();
    assert_eq!(h.status, ExecStatus::Failed);
    assert_eq!(h.error.as_deref(), Some("step s failed: boom"));
    assert!(h.live.is_empty());
    assert_eq!(h.ended_at.as_deref(), Some("t1"));
    // What a resume runs again: the failing step-run and the other branch.
    let stopped: Vec<&str> = h.stopped.iter().map(|t| t.token_id.as_str()).collect();
    assert_eq!(stopped, ["s1", "s2"]);
}

#[test]
fn a_redelivered_boundary_changes_nothing() {
    let h = header(ExecStatus::Running, &["s2"]);
    assert_eq!(
        transition(&h, &boundary("s1", &[token("a", "s1")], None)),
        None
    );
}

#[test]
fn a_terminal_execution_only_loses_the_token() {
    for status in [
        ExecStatus::Cancelled,
        ExecStatus::Failed,
        ExecStatus::Completed,
    ] {
        let h = transition(
            &header(status, &["s1"]),
            &boundary("s1", &[token("a", "s1")], Some("x")),
        )
        .unwrap();
        assert_eq!(h.status, status);
        assert!(h.live.is_empty(), "{status:?}: no token fired");
        assert_eq!((h.error, h.ended_at), (None, None));
    }
}

fn event(event_type: &str) -> Event {
    Event {
        event_type: event_type.into(),
        execution_id: "e1".into(),
        step_run_id: "sr1".into(),
        step: "fetch".into(),
        ..Default::default()
    }
}

#[test]
fn arcs_see_the_payload_with_the_event_name_step_and_step_run() {
    let e = noetl_mesh::scope::event_scope(
        &event(EventType::StepFailed.wire_name()),
        &json!({"status": "error", "name": "payload's own"}),
    );
    assert_eq!(
        e,
        json!({"status": "error", "name": "step.failed", "step": "fetch", "step_run_id": "sr1"})
    );
    assert_eq!(
        noetl_mesh::scope::event_scope(&event(EventType::StepDone.wire_name()), &Value::Null)
            ["name"],
        "step.done"
    );
}

#[test]
fn errors_read_as_kind_and_message() {
    assert_eq!(error_text(&json!("plain")), "plain");
    assert_eq!(
        error_text(&json!({"kind": "http.status", "message": "503"})),
        "http.status: 503"
    );
    assert_eq!(error_text(&json!({"message": "no kind"})), "no kind");
    assert_eq!(error_text(&json!({"code": 7})), r#"{"code":7}"#);
    assert_eq!(error_text(&json!(42)), "42");
}

#[test]
fn a_failure_message_names_the_step_or_the_routing_error() {
    let ev = event(EventType::StepFailed.wire_name());
    let boom = json!({"kind": "python.exception", "message": "boom"});
    assert_eq!(
        failure_message(&ev, Some(&boom), None),
        r#"step "fetch" failed: python.exception: boom"#
    );
    assert_eq!(failure_message(&ev, None, None), r#"step "fetch" failed"#);
    assert_eq!(
        failure_message(&ev, Some(&boom), Some("routing of step \"fetch\" failed")),
        "routing of step \"fetch\" failed"
    );
}

#[test]
fn boundary_events_give_their_step_status() {
    let status = |t| handling_of(t);
    assert_eq!(
        status(EventType::StepFailed),
        Handling::Ended(StepStatus::Failed)
    );
    assert_eq!(
        status(EventType::StepSkipped),
        Handling::Ended(StepStatus::Skipped)
    );
    assert_eq!(
        status(EventType::StepDone),
        Handling::Ended(StepStatus::Done)
    );
    assert_eq!(
        status(EventType::LoopDone),
        Handling::Ended(StepStatus::Done)
    );
    assert_eq!(status(EventType::MessageDeadLettered), Handling::DeadLetter);
    assert_eq!(
        status(EventType::ExecutionCancelRequested),
        Handling::Cancel
    );
    // Nothing else is a boundary: an event the consumer should never
    // get is refused, not recorded as a finished step.
    assert_eq!(status(EventType::TaskDone), Handling::Foreign);
}

fn selected(index: usize, step: &str, set_ctx: serde_json::Value) -> routing::SelectedArc {
    routing::SelectedArc {
        index,
        step: step.into(),
        args: json!({"n": index}).as_object().unwrap().clone(),
        set_ctx: set_ctx.as_object().unwrap().clone(),
    }
}

#[test]
fn fired_arcs_become_tokens_with_ids_of_the_step_run_and_arc() {
    let ev = event(EventType::StepDone.wire_name());
    let arcs = vec![
        selected(0, "a", json!({"k": 1})),
        selected(2, "b", json!({"k": 2, "j": 3})),
    ];
    let d = route(&ev, EventType::of(&ev), Ok(arcs));
    let ids: Vec<&str> = d.tokens.iter().map(|t| t.token_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            derive_id(&[&ev.step_run_id, "arc", "0"]),
            derive_id(&[&ev.step_run_id, "arc", "2"])
        ]
    );
    assert_eq!(d.tokens[1].args, json!({"n": 2}));
    assert_eq!(d.tokens[1].parent, ev.step_run_id);
    // A later arc's ctx write wins.
    assert_eq!(Value::Object(d.set_ctx.unwrap()), json!({"k": 2, "j": 3}));
    assert!(!d.unhandled_failure);
}

#[test]
fn a_failure_no_arc_handles_or_a_routing_error_is_left_unhandled() {
    let failed = event(EventType::StepFailed.wire_name());
    assert!(route(&failed, EventType::of(&failed), Ok(vec![])).unhandled_failure);
    let handled = route(
        &failed,
        EventType::of(&failed),
        Ok(vec![selected(0, "x", json!({}))]),
    );
    assert!(!handled.unhandled_failure);
    assert_eq!(handled.set_ctx, None);
    let done = event(EventType::StepDone.wire_name());
    assert!(!route(&done, EventType::of(&done), Ok(vec![])).unhandled_failure);
    let broken = route(
        &done,
        EventType::of(&done),
        Err("routing of step \"s\" failed".into()),
    );
    assert!(broken.unhandled_failure && broken.tokens.is_empty());
    assert_eq!(
        broken.error.as_deref(),
        Some("routing of step \"s\" failed")
    );
}

#[test]
fn router_events_subscribes_to_step_ends_dead_letters_cancel_and_resume_requests() {
    use EventType as T;
    assert_eq!(
        subscribed().collect::<Vec<_>>(),
        [
            T::MessageDeadLettered,
            T::StepSkipped,
            T::StepDone,
            T::StepFailed,
            T::LoopDone,
            T::ExecutionCancelRequested,
            T::ExecutionResumeRequested,
        ]
    );
}
