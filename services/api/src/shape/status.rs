//! Statuses as NoETL spells them, and an execution's progress.

use std::collections::BTreeMap;

use noetl_mesh::state::{ExecStatus, StepStatus};
use serde_json::Value;

use crate::contract::executions::ExecutionProgress;

/// NoETL's spelling of an execution status.
pub fn status_name(s: ExecStatus) -> &'static str {
    match s {
        ExecStatus::Running => "RUNNING",
        ExecStatus::Completed => "COMPLETED",
        ExecStatus::Failed => "FAILED",
        ExecStatus::Cancelled => "CANCELLED",
    }
}

/// A status filter, in any case: the status, or the message saying which
/// ones there are.
pub fn parse_status(s: &str) -> Result<ExecStatus, String> {
    match s.to_ascii_uppercase().as_str() {
        "RUNNING" => Ok(ExecStatus::Running),
        "COMPLETED" => Ok(ExecStatus::Completed),
        "FAILED" => Ok(ExecStatus::Failed),
        "CANCELLED" => Ok(ExecStatus::Cancelled),
        _ => Err(format!(
            "status {s:?} is not one of RUNNING, COMPLETED, FAILED, CANCELLED"
        )),
    }
}

/// The status of one event, as NoETL's execution view shows it: from its
/// type, and for an event that ends something from its payload's `status`
/// (`ok` → `COMPLETED`, `error`/`failed` → `FAILED`, `partial` → `PARTIAL`).
pub fn event_status(event_type: &str, payload: &Value) -> &'static str {
    let last = event_type.rsplit('.').next().unwrap_or(event_type);
    match last {
        "failed" => "FAILED",
        "cancelled" => "CANCELLED",
        "skipped" => "SKIPPED",
        "started" | "scheduled" | "initialized" | "resumed" => "RUNNING",
        "done" | "completed" | "claimed" => match payload.get("status").and_then(Value::as_str) {
            Some("error") | Some("failed") => "FAILED",
            Some("partial") => "PARTIAL",
            _ => "COMPLETED",
        },
        _ => "INFO",
    }
}

/// A step's status as `noetl exec status` shows it.
pub fn step_name(s: Option<StepStatus>) -> &'static str {
    match s {
        Some(StepStatus::Done) => "done",
        Some(StepStatus::Failed) => "failed",
        Some(StepStatus::Skipped) => "skipped",
        None => "not_run",
    }
}

/// Step counts: `steps` with their latest status, `live` the steps of the
/// live tokens.
pub fn progress(
    steps: &BTreeMap<String, Option<StepStatus>>,
    live: &[String],
) -> ExecutionProgress {
    let count = |want: StepStatus| steps.values().filter(|s| **s == Some(want)).count() as u32;
    let mut running: Vec<&String> = live.iter().collect();
    running.sort();
    running.dedup();
    ExecutionProgress {
        total_steps: steps.len() as u32,
        completed_steps: count(StepStatus::Done),
        running_steps: running.len() as u32,
        failed_steps: count(StepStatus::Failed),
    }
}

/// Seconds from `started` to `ended` (or to `now_ms`, the Unix epoch in
/// milliseconds, when it has not ended), and the same for people:
/// `1h 2m 3s`, `45s`, `0.25s`. `None` when a time does not parse.
pub fn duration(started: &str, ended: Option<&str>, now_ms: u64) -> Option<(f64, String)> {
    let ms_of = noetl_mesh::events::ms_of_rfc3339;
    let start = ms_of(started)?;
    let end = match ended {
        Some(e) => ms_of(e)?,
        None => now_ms,
    };
    let ms = end.saturating_sub(start);
    let seconds = ms as f64 / 1000.0;
    let human = if ms < 1000 {
        format!("{seconds}s")
    } else {
        let total = ms / 1000;
        let (h, m, s) = (total / 3600, total % 3600 / 60, total % 60);
        let mut parts = Vec::new();
        if h > 0 {
            parts.push(format!("{h}h"));
        }
        if m > 0 {
            parts.push(format!("{m}m"));
        }
        if s > 0 || parts.is_empty() {
            parts.push(format!("{s}s"));
        }
        parts.join(" ")
    };
    Some((seconds, human))
}

/// The steps whose latest run is done, in the workflow's order (`order`).
pub fn completed_steps(
    order: &[String],
    steps: &BTreeMap<String, Option<StepStatus>>,
) -> Vec<String> {
    order
        .iter()
        .filter(|s| steps.get(*s) == Some(&Some(StepStatus::Done)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_are_spelled_as_noetl_does_and_parse_in_any_case() {
        for s in [
            ExecStatus::Running,
            ExecStatus::Completed,
            ExecStatus::Failed,
            ExecStatus::Cancelled,
        ] {
            assert_eq!(parse_status(status_name(s)), Ok(s));
            assert_eq!(parse_status(&status_name(s).to_lowercase()), Ok(s));
        }
        let e = parse_status("done").unwrap_err();
        assert!(e.contains("RUNNING, COMPLETED"), "{e}");
    }

    #[test]
    fn an_events_status_comes_from_its_type_and_payload() {
        let none = json!({});
        let table = [
            (
                "execution.completed",
                json!({"status": "completed"}),
                "COMPLETED",
            ),
            ("execution.failed", none.clone(), "FAILED"),
            ("execution.cancelled", none.clone(), "CANCELLED"),
            ("step.done", json!({"status": "ok"}), "COMPLETED"),
            ("step.failed", json!({"status": "error"}), "FAILED"),
            ("task.done", json!({"status": "error"}), "FAILED"),
            ("loop.done", json!({"status": "partial"}), "PARTIAL"),
            ("loop.iteration.done", json!({"status": "ok"}), "COMPLETED"),
            ("step.skipped", none.clone(), "SKIPPED"),
            ("task.started", none.clone(), "RUNNING"),
            ("playbook.initialized", none.clone(), "RUNNING"),
            ("token.created", none.clone(), "INFO"),
            ("execution.cancel_requested", none.clone(), "INFO"),
            ("execution.resumed", none.clone(), "RUNNING"),
            // Waiting for a slot of its concurrency key: not started yet.
            ("execution.queued", none.clone(), "INFO"),
        ];
        for (t, p, want) in table {
            assert_eq!(event_status(t, &p), want, "{t} {p}");
        }
    }

    #[test]
    fn a_duration_is_counted_to_the_end_or_to_now_and_spelled_for_people() {
        let start = "2026-01-01T00:00:00.000Z";
        let (s, h) = duration(start, Some("2026-01-01T01:02:03.000Z"), 0).unwrap();
        assert_eq!((s, h.as_str()), (3723.0, "1h 2m 3s"));
        let (s, h) = duration(start, Some("2026-01-01T00:00:00.250Z"), 0).unwrap();
        assert_eq!((s, h.as_str()), (0.25, "0.25s"));
        let now = 1_767_225_645_000; // 2026-01-01T00:00:45Z
        assert_eq!(duration(start, None, now).unwrap().1, "45s");
        assert_eq!(
            duration(start, Some("2026-01-01T00:02:00Z"), 0).unwrap().1,
            "2m"
        );
        assert!(duration("yesterday", None, now).is_none());
    }

    #[test]
    fn completed_steps_keep_the_workflow_order() {
        let steps: BTreeMap<String, Option<StepStatus>> = [
            ("a", Some(StepStatus::Done)),
            ("b", Some(StepStatus::Failed)),
            ("z", Some(StepStatus::Done)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let order = ["z".to_string(), "a".into(), "b".into()];
        assert_eq!(completed_steps(&order, &steps), ["z", "a"]);
    }

    #[test]
    fn progress_counts_steps_by_their_latest_status_and_live_tokens() {
        let steps: BTreeMap<String, Option<StepStatus>> = [
            ("a", Some(StepStatus::Done)),
            ("b", Some(StepStatus::Failed)),
            ("c", Some(StepStatus::Skipped)),
            ("d", None),
            ("e", Some(StepStatus::Done)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let live = vec!["d".to_string(), "d".to_string(), "a".to_string()];
        let p = progress(&steps, &live);
        assert_eq!(
            p,
            ExecutionProgress {
                total_steps: 5,
                completed_steps: 2,
                running_steps: 2,
                failed_steps: 1,
            }
        );
        assert_eq!(step_name(None), "not_run");
    }
}
