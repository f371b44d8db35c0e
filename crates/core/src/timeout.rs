//! A tool task's `spec.timeout`, read the same way by every executor kind
//! (docs/tools.md, "Timeouts").
//!
//! Accepted shapes: absent or `null` (the kind's defaults); a number of
//! seconds, or its text (`"30"`, as a template renders); or a mapping
//! `{connect, read}` where either may be absent or `null` (its default). A
//! plain number bounds the whole operation and also caps the connect
//! timeout, so `timeout: 2` never waits 10 s to connect.

use std::time::Duration;

use serde_json::Value;

/// Connect and operation timeouts of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskTimeouts {
    /// Reaching the remote end (a TCP/TLS connect, a pool checkout).
    pub connect: Duration,
    /// The operation itself: the request, the statement, the script.
    pub read: Duration,
}

/// `spec.timeout` is not seconds or `{connect, read}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`spec.timeout` must be a positive number of seconds or {{connect, read}}, got {found}")]
pub struct TimeoutError {
    /// The offending value, as JSON text.
    pub found: String,
}

/// A positive, finite number of seconds from a number or its text.
fn seconds(v: &Value) -> Result<Duration, TimeoutError> {
    v.as_f64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        .filter(|s| *s > 0.0 && s.is_finite())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| TimeoutError {
            found: v.to_string(),
        })
}

/// The timeouts of a task whose effective spec is `spec`, the kind's
/// `defaults` filling what it leaves out.
pub fn task_timeouts(spec: &Value, defaults: TaskTimeouts) -> Result<TaskTimeouts, TimeoutError> {
    match spec.get("timeout") {
        None | Some(Value::Null) => Ok(defaults),
        Some(Value::Object(m)) => {
            let get = |k: &str, d: Duration| match m.get(k) {
                None | Some(Value::Null) => Ok(d),
                Some(v) => seconds(v),
            };
            Ok(TaskTimeouts {
                connect: get("connect", defaults.connect)?,
                read: get("read", defaults.read)?,
            })
        }
        Some(v) => {
            let read = seconds(v)?;
            Ok(TaskTimeouts {
                connect: defaults.connect.min(read),
                read,
            })
        }
    }
}

/// The operation timeout of a kind without a connect phase (python, shell,
/// duckdb): `read` of [`task_timeouts`] with `default` for both parts.
pub fn read_timeout(spec: &Value, default: Duration) -> Result<Duration, TimeoutError> {
    let defaults = TaskTimeouts {
        connect: default,
        read: default,
    };
    Ok(task_timeouts(spec, defaults)?.read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const D: TaskTimeouts = TaskTimeouts {
        connect: Duration::from_secs(10),
        read: Duration::from_secs(30),
    };

    fn t(v: Value) -> Result<TaskTimeouts, TimeoutError> {
        task_timeouts(&json!({ "timeout": v }), D)
    }

    #[test]
    fn absent_or_null_gives_the_defaults() {
        assert_eq!(task_timeouts(&json!({}), D), Ok(D));
        assert_eq!(t(Value::Null), Ok(D));
        assert_eq!(t(json!({})), Ok(D));
        assert_eq!(t(json!({"read": null, "connect": null})), Ok(D));
    }

    #[test]
    fn a_number_bounds_the_operation_and_caps_connect() {
        let got = t(json!(2)).unwrap();
        assert_eq!(got.read, Duration::from_secs(2));
        assert_eq!(got.connect, Duration::from_secs(2));
        let got = t(json!(60)).unwrap();
        assert_eq!(
            (got.connect, got.read),
            (D.connect, Duration::from_secs(60))
        );
        assert_eq!(t(json!(1.5)).unwrap().read, Duration::from_millis(1500));
    }

    #[test]
    fn numeric_text_counts_as_seconds() {
        assert_eq!(t(json!(" 3 ")).unwrap().read, Duration::from_secs(3));
        assert_eq!(
            t(json!({"read": "0.5"})).unwrap().read,
            Duration::from_millis(500)
        );
    }

    #[test]
    fn a_mapping_sets_each_part_alone() {
        let got = t(json!({"connect": 1})).unwrap();
        assert_eq!((got.connect, got.read), (Duration::from_secs(1), D.read));
        let got = t(json!({"read": 3})).unwrap();
        assert_eq!((got.connect, got.read), (D.connect, Duration::from_secs(3)));
    }

    #[test]
    fn anything_else_is_refused_naming_the_value() {
        for bad in [json!(-1), json!(0), json!("soon"), json!(true), json!([1])] {
            let e = t(bad.clone()).unwrap_err();
            assert_eq!(e.found, bad.to_string());
            assert!(e.to_string().contains("spec.timeout"), "{e}");
        }
        assert_eq!(t(json!({"read": -2})).unwrap_err().found, "-2");
    }
}
