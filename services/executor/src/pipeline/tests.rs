use super::command::{claim_log_decides, command_ended, decode_command};
use super::*;
use crate::call::render_config;
use noetl_core::Task;
use noetl_mesh::state::{ExecHeader, LoopProgress};
use noetl_mesh::state::{ExecStatus, TokenRecord};
use noetl_wire::IterationRef;
use serde_json::json;

fn header(status: ExecStatus, live: &[&str]) -> ExecHeader {
    ExecHeader {
        status,
        ..ExecHeader::running(
            "e1",
            live.iter().map(|t| TokenRecord::new(*t, "s")).collect(),
        )
    }
}

fn command(iteration: Option<u64>) -> TaskCommand {
    TaskCommand {
        execution_id: "e1".into(),
        step: "s".into(),
        step_run_id: "sr1".into(),
        iteration: iteration.map(|index| IterationRef {
            loop_run_id: "sr1".into(),
            index,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn progress(next: u64, in_flight: &[u64]) -> LoopProgress {
    LoopProgress {
        next,
        in_flight: in_flight.to_vec(),
        cursor: None,
    }
}

#[test]
fn a_command_decodes_its_json_fields() {
    let mut cmd = command(Some(3));
    cmd.args_json = br#"{"n": 1}"#.to_vec();
    cmd.prev_json = b"7".to_vec();
    let it = cmd.iteration.as_mut().unwrap();
    it.iter_json = br#"{"row": {"id": 2}}"#.to_vec();
    it.reduce_json = br#"{"total": 5}"#.to_vec();
    cmd.resume_outcome_json = br#"{"status": "ok", "result": 4}"#.to_vec();
    let d = decode_command(&cmd, "s").unwrap();
    assert_eq!(d.args, json!({"n": 1}));
    assert_eq!(d.cursor.prev, json!(7));
    assert_eq!(d.loop_run, Some(("sr1".to_string(), 3)));
    assert_eq!(d.cursor.iter["row"], json!({"id": 2}));
    assert_eq!(d.cursor.reduce["total"], json!(5));
    assert_eq!(d.cursor.resume.unwrap().result, json!(4));
    let plain = decode_command(&command(None), "s").unwrap();
    assert_eq!(plain.args, json!({}));
    assert!(plain.loop_run.is_none() && plain.cursor.resume.is_none());
}

#[test]
fn a_command_with_bad_json_is_refused_naming_the_field() {
    let refused = |cmd: &TaskCommand| match decode_command(cmd, "s") {
        Err(HandlerError::Refused(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let mut cmd = command(None);
    cmd.args_json = b"{not json".to_vec();
    let m = refused(&cmd);
    assert!(m.contains("execution e1") && m.contains("\"s\"") && m.contains("args"));
    let mut cmd = command(Some(0));
    cmd.iteration.as_mut().unwrap().iter_json = b"[1]".to_vec();
    assert!(refused(&cmd).contains("iter"));
    let mut cmd = command(None);
    cmd.resume_outcome_json = br#"{"status": "maybe"}"#.to_vec();
    assert!(refused(&cmd).contains("resume outcome"));
}

#[test]
fn raw_fields_pass_unrendered_and_other_fields_render() {
    let task: Task = serde_json::from_value(json!({
        "name": "t", "kind": "python",
        "code": "x = {{ not rendered }}",
        "args": {"n": "{{ workload.n }}"},
    }))
    .unwrap();
    let scope = Scope::new().workload(json!({"n": 3}));
    let out = render_config(&task, &["code"], &scope).unwrap();
    assert_eq!(out["code"], "x = {{ not rendered }}");
    assert_eq!(out["args"], json!({"n": 3}));
}

#[test]
fn a_field_that_does_not_render_is_named() {
    let task: Task = serde_json::from_value(json!({
        "name": "t", "kind": "noop", "result": "{{ nonesuch }}",
    }))
    .unwrap();
    let e = render_config(&task, &[], &Scope::new().workload(json!({}))).unwrap_err();
    assert!(e.starts_with("field `result`: "), "{e}");
}

#[test]
fn a_command_due_later_waits_the_rest() {
    assert_eq!(remaining(0), None);
    let later = remaining(now_ms() + 60_000).expect("in the future");
    assert!(later > Duration::from_secs(50) && later <= Duration::from_secs(60));
}

#[test]
fn a_command_of_a_live_step_run_may_run() {
    let h = header(ExecStatus::Running, &["sr1"]);
    assert_eq!(command_ended(&command(None), Some(&h), None), None);
}

#[test]
fn a_command_whose_step_run_or_execution_ended_is_stale() {
    let gone = header(ExecStatus::Running, &["sr2"]);
    let why = command_ended(&command(None), Some(&gone), None).unwrap();
    assert!(why.contains("step-run sr1 has ended"), "{why}");
    for status in [
        ExecStatus::Completed,
        ExecStatus::Failed,
        ExecStatus::Cancelled,
    ] {
        let h = header(status, &["sr1"]);
        assert!(command_ended(&command(None), Some(&h), None).is_some());
    }
}

#[test]
fn a_command_without_a_header_may_run() {
    // Nothing says its work is over: running it is the safe side.
    assert_eq!(command_ended(&command(None), None, None), None);
}

#[test]
fn an_iteration_runs_until_it_is_counted() {
    let h = header(ExecStatus::Running, &["sr1"]);
    let cmd = command(Some(3));
    assert_eq!(
        command_ended(&cmd, Some(&h), Some(&progress(5, &[3, 4]))),
        None
    );
    // Not dispatched yet by the record's view (a record behind): runs.
    assert_eq!(command_ended(&cmd, Some(&h), Some(&progress(3, &[]))), None);
    let why = command_ended(&cmd, Some(&h), Some(&progress(5, &[4]))).unwrap();
    assert!(
        why.contains("iteration 3 of loop run sr1 was counted"),
        "{why}"
    );
    // No record of its run: lost (a finished run's record stays), so it
    // runs; the loop-supervisor rebuilds the run from the events.
    assert_eq!(command_ended(&cmd, Some(&h), None), None);
}

#[test]
fn a_claim_reads_the_log_when_its_run_is_missing_or_it_comes_again() {
    let run = progress(5, &[]);
    // Checked though not come again (it waited in the queue): its run
    // holds it, no log read.
    assert!(!claim_log_decides(Some(&run), false));
    // Redelivered or sent again: its report may be stored and not
    // applied yet.
    assert!(claim_log_decides(Some(&run), true));
    // Its run purged: only the log says whether it ran.
    assert!(claim_log_decides(None, false));
    assert!(claim_log_decides(None, true));
}

/// The size of the future `f` would return, without calling it.
fn future_size<F: FnOnce() -> Fut, Fut>(_: F) -> usize {
    std::mem::size_of::<Fut>()
}

/// A value of any type, for a closure that is never called.
fn never<T>() -> T {
    unreachable!("only the type of the closure's future is measured")
}

/// A future holds the state of every future it awaits, and is copied
/// whole each time it moves (docs/performance.md "Futures that move"):
/// the paths an iteration of a noop loop does not take (reading step
/// results, rebuilding a lost checkpoint, publishing a held `task.done`,
/// storing a step's result) are boxed, so that an iteration's future does
/// not carry them. The closures are never called: only their futures'
/// types are measured.
#[test]
fn the_futures_an_iteration_awaits_do_not_carry_the_paths_it_skips() {
    let base_scope = future_size(|| never::<&Executor>().base_scope(never(), never(), never()));
    let resume = future_size(|| never::<&StepRun<'_>>().resume(never()));
    let release = future_size(|| never::<&mut Pending>().release(never()));
    let finish = future_size(|| never::<&StepRun<'_>>().finish(never(), never(), None));
    let run = future_size(|| never::<&Executor>().run(never(), never(), never(), false, None));
    let rebuilt = future_size(|| never::<&StepRun<'_>>().rebuilt_checkpoint(never()));
    let emit = future_size(|| never::<&Mesh>().emit(never()));
    for (name, size, most) in [
        ("base_scope", base_scope, 1024),
        ("resume", resume, rebuilt / 2),
        ("release", release, emit),
        ("finish", finish, 4096),
    ] {
        assert!(
            size <= most,
            "{name}'s future is {size} bytes (at most {most})"
        );
    }
    // 18,752 bytes in a release build before these were boxed, 12,056 after.
    assert!(run <= 16 * 1024, "an iteration's future is {run} bytes");
}
