//! Time limits: a step's `lifecycle` (`timeout_s`, `deadline_s`) and the
//! execution's `executor.spec.limits.timeout_s`, as plain decisions.
//!
//! The services only read, decide (here) and write: the scheduler turns a
//! step's limits into one absolute [`Deadline`] carried by every command of
//! the step-run, the executor checks it before each task and bounds each
//! tool call by it, and the router's timer fails a step-run or an execution
//! still running when its deadline is due (`docs/architecture.md`,
//! "Timeouts").

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Playbook, Step, StepError};

/// The error kind of everything that ran out of time.
pub const TIMEOUT: &str = "timeout";

/// A step's lifecycle limits, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lifecycle {
    /// The step-run must end within this many seconds of its start.
    pub timeout_s: Option<f64>,
    /// The step-run must end within this many seconds of the execution's start.
    pub deadline_s: Option<f64>,
}

/// A positive, finite number of seconds, or why not.
pub fn seconds(v: &Value) -> Result<f64, String> {
    match v.as_f64() {
        Some(n) if n.is_finite() && n > 0.0 => Ok(n),
        Some(n) => Err(format!("must be a positive number of seconds, got {n}")),
        None => Err(format!(
            "must be a positive number of seconds, got {}",
            crate::json_type(v)
        )),
    }
}

/// The `lifecycle` object of a step: `spec.policy.lifecycle` (canonical),
/// else `spec.lifecycle`.
pub fn lifecycle_value(step: &Step) -> Option<&Value> {
    step.spec
        .policy
        .as_ref()
        .and_then(|p| p.lifecycle.as_ref())
        .or(step.spec.lifecycle.as_ref())
}

/// A step's limits. Values that are not positive numbers are ignored here
/// (validation refuses them before a playbook runs).
pub fn step_lifecycle(step: &Step) -> Lifecycle {
    let get = |k: &str| {
        lifecycle_value(step)
            .and_then(|l| l.get(k))
            .and_then(|v| seconds(v).ok())
    };
    Lifecycle {
        timeout_s: get("timeout_s"),
        deadline_s: get("deadline_s"),
    }
}

/// `executor.spec.limits.timeout_s`: the whole execution's time limit.
pub fn execution_timeout_s(playbook: &Playbook) -> Option<f64> {
    playbook
        .executor
        .as_ref()
        .and_then(|e| e.spec.get("limits"))
        .and_then(|l| l.get("timeout_s"))
        .and_then(|v| seconds(v).ok())
}

/// An absolute deadline and the setting that set it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deadline {
    /// Unix epoch milliseconds.
    pub at_ms: u64,
    /// The setting, for error messages (e.g. `lifecycle.timeout_s: 2`).
    pub what: String,
}

fn after(start_ms: u64, s: f64) -> u64 {
    start_ms.saturating_add((s * 1000.0).ceil() as u64)
}

fn secs_text(s: f64) -> String {
    // 2 -> "2", 0.5 -> "0.5"
    format!("{s}")
}

/// The execution's deadline, if its playbook sets one.
pub fn execution_deadline(playbook: &Playbook, started_ms: u64) -> Option<Deadline> {
    execution_timeout_s(playbook).map(|s| Deadline {
        at_ms: after(started_ms, s),
        what: format!(
            "execution deadline executor.spec.limits.timeout_s: {}",
            secs_text(s)
        ),
    })
}

/// What [`step_deadline`] needs.
pub struct StepDeadlineInput<'a> {
    /// The playbook (for the execution's limit).
    pub playbook: &'a Playbook,
    /// The step.
    pub step: &'a Step,
    /// When the step-run starts (epoch ms).
    pub now_ms: u64,
    /// When the execution started (epoch ms; 0 when unknown, which
    /// disables the limits counted from it).
    pub execution_started_ms: u64,
}

/// The earliest of the step's `timeout_s` (from now), its `deadline_s` and
/// the execution's limit (both from the execution's start): the deadline of
/// the whole step-run, carried by every command of it.
pub fn step_deadline(i: &StepDeadlineInput<'_>) -> Option<Deadline> {
    let l = step_lifecycle(i.step);
    let name = &i.step.step;
    let mut all = Vec::new();
    if let Some(s) = l.timeout_s {
        all.push(Deadline {
            at_ms: after(i.now_ms, s),
            what: format!("step {name:?} lifecycle.timeout_s: {}", secs_text(s)),
        });
    }
    if i.execution_started_ms > 0 {
        if let Some(s) = l.deadline_s {
            all.push(Deadline {
                at_ms: after(i.execution_started_ms, s),
                what: format!(
                    "step {name:?} lifecycle.deadline_s: {} (from the execution's start)",
                    secs_text(s)
                ),
            });
        }
        all.extend(execution_deadline(i.playbook, i.execution_started_ms));
    }
    all.into_iter().min_by_key(|d| d.at_ms)
}

/// Whether a deadline has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// It has passed: time is up.
    Now,
    /// This much time is left.
    In(Duration),
}

/// Is `at_ms` due at `now_ms`?
pub fn due(at_ms: u64, now_ms: u64) -> Due {
    if at_ms <= now_ms {
        Due::Now
    } else {
        Due::In(Duration::from_millis(at_ms - now_ms))
    }
}

/// How long a tool call may run: the task's own limit, cut to what is left
/// of the step-run's deadline. `None` when neither applies. The flag is
/// true when the deadline (not the task's limit) is the bound.
pub fn call_budget(
    task_limit: Option<Duration>,
    left: Option<Duration>,
) -> Option<(Duration, bool)> {
    match (task_limit, left) {
        (None, None) => None,
        (Some(t), None) => Some((t, false)),
        (None, Some(l)) => Some((l, true)),
        (Some(t), Some(l)) if l < t => Some((l, true)),
        (Some(t), Some(_)) => Some((t, false)),
    }
}

/// Whether a retry due at `not_before_ms` can still run before the deadline.
pub fn retry_fits(not_before_ms: u64, deadline_ms: u64) -> bool {
    deadline_ms == 0 || not_before_ms < deadline_ms
}

/// The `{kind, message, task}` error of a step-run past its deadline.
pub fn timeout_error(d: &Deadline, step: &str, task: Option<&str>) -> StepError {
    let message = match task {
        Some(t) => format!(
            "step {step:?} ran out of time in task {t:?}: {} passed",
            d.what
        ),
        None => format!("step {step:?} ran out of time: {} passed", d.what),
    };
    StepError::new(TIMEOUT, message, task)
}

/// The error of an execution past its own deadline.
pub fn execution_timeout_message(d: &Deadline) -> String {
    format!("{TIMEOUT}: {} passed; the execution was stopped", d.what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn playbook(yaml: &str) -> Playbook {
        crate::load::load_playbook(yaml, "t.yaml")
            .expect("valid")
            .playbook
    }

    const PB: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: t }
executor: { spec: { limits: { timeout_s: 60 } } }
workflow:
  - step: start
    spec: { policy: { lifecycle: { timeout_s: 2, deadline_s: 30 } } }
    tool: { kind: noop }
    next: { arcs: [ { step: other } ] }
  - step: other
    spec: { lifecycle: { timeout_s: 0.5 } }
    tool: { kind: noop }
"#;

    #[test]
    fn seconds_must_be_positive_numbers() {
        assert_eq!(seconds(&json!(2)), Ok(2.0));
        assert_eq!(seconds(&json!(0.25)), Ok(0.25));
        for bad in [json!(0), json!(-1), json!("5"), json!(null), json!([1])] {
            let e = seconds(&bad).unwrap_err();
            assert!(e.contains("positive number of seconds"), "{bad}: {e}");
        }
        assert!(seconds(&json!("5")).unwrap_err().contains("a string"));
    }

    #[test]
    fn lifecycle_is_read_under_policy_or_spec() {
        let pb = playbook(PB);
        let start = pb.step("start").unwrap();
        let other = pb.step("other").unwrap();
        assert_eq!(
            step_lifecycle(start),
            Lifecycle {
                timeout_s: Some(2.0),
                deadline_s: Some(30.0)
            }
        );
        assert_eq!(step_lifecycle(other).timeout_s, Some(0.5));
        assert_eq!(execution_timeout_s(&pb), Some(60.0));
    }

    #[test]
    fn the_step_deadline_is_the_earliest_limit() {
        let pb = playbook(PB);
        let step = pb.step("start").unwrap();
        let at = |now_ms, started| {
            step_deadline(&StepDeadlineInput {
                playbook: &pb,
                step,
                now_ms,
                execution_started_ms: started,
            })
            .unwrap()
        };
        // Early in the execution: timeout_s (2 s from now) wins.
        let d = at(10_000, 9_000);
        assert_eq!(d.at_ms, 12_000);
        assert!(d.what.contains("lifecycle.timeout_s: 2"), "{}", d.what);
        // Late: deadline_s (30 s from the start) comes first.
        let d = at(38_500, 9_000);
        assert_eq!(d.at_ms, 39_000);
        assert!(d.what.contains("lifecycle.deadline_s: 30"), "{}", d.what);
        // A step without limits still has the execution's.
        let plain = playbook(
            "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t}\nexecutor: {spec: {limits: {timeout_s: 5}}}\nworkflow:\n  - step: start\n    tool: {kind: noop}\n",
        );
        let d = step_deadline(&StepDeadlineInput {
            playbook: &plain,
            step: plain.step("start").unwrap(),
            now_ms: 1_000,
            execution_started_ms: 500,
        })
        .unwrap();
        assert_eq!(d.at_ms, 5_500);
        assert_eq!(
            d.what,
            "execution deadline executor.spec.limits.timeout_s: 5"
        );
        // An unknown start disables the limits counted from it.
        assert_eq!(
            step_deadline(&StepDeadlineInput {
                playbook: &plain,
                step: plain.step("start").unwrap(),
                now_ms: 1_000,
                execution_started_ms: 0,
            }),
            None
        );
    }

    #[test]
    fn due_budget_and_retry_decisions() {
        assert_eq!(due(100, 100), Due::Now);
        assert_eq!(due(100, 150), Due::Now);
        assert_eq!(due(150, 100), Due::In(Duration::from_millis(50)));
        let s = Duration::from_secs;
        assert_eq!(call_budget(None, None), None);
        assert_eq!(call_budget(Some(s(5)), None), Some((s(5), false)));
        assert_eq!(call_budget(None, Some(s(3))), Some((s(3), true)));
        assert_eq!(call_budget(Some(s(5)), Some(s(3))), Some((s(3), true)));
        assert_eq!(call_budget(Some(s(2)), Some(s(3))), Some((s(2), false)));
        assert!(retry_fits(100, 0));
        assert!(retry_fits(100, 200));
        assert!(!retry_fits(200, 200));
    }

    #[test]
    fn timeout_errors_name_the_setting() {
        let d = Deadline {
            at_ms: 1,
            what: "step \"s\" lifecycle.timeout_s: 2".into(),
        };
        let e = timeout_error(&d, "s", Some("nap")).to_value();
        assert_eq!(e["kind"], "timeout");
        assert_eq!(e["task"], "nap");
        assert!(e["message"]
            .as_str()
            .unwrap()
            .contains("lifecycle.timeout_s: 2"));
        assert_eq!(timeout_error(&d, "s", None).to_value()["task"], Value::Null);
        let x = execution_timeout_message(&Deadline {
            at_ms: 1,
            what: "execution deadline executor.spec.limits.timeout_s: 5".into(),
        });
        assert!(x.starts_with("timeout: execution deadline executor.spec.limits.timeout_s: 5"));
    }
}
