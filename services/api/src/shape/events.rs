//! Events as clients see them: the JSON of a streamed event, the event of
//! NoETL's execution view, and the subject filter of a `type` query.

use noetl_mesh::events::payload;
use noetl_wire::Event;
use serde_json::Value;

use crate::contract::events::StreamedEvent;
use crate::contract::executions::ExecutionEvent;
use crate::shape::status::event_status;

/// An event read from the stream at sequence `seq`.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// Stream sequence.
    pub seq: u64,
    /// The event.
    pub event: Event,
}

/// The `data:` of a Server-Sent Event.
pub fn streamed(seen: &Seen) -> StreamedEvent {
    let ev = &seen.event;
    StreamedEvent {
        seq: seen.seq,
        event_id: ev.event_id.clone(),
        event_type: ev.event_type.clone(),
        ts: noetl_wire::codec::event_time(ev),
        execution_id: ev.execution_id.clone(),
        step: ev.step.clone(),
        task: ev.task.clone(),
        step_run_id: ev.step_run_id.clone(),
        task_run_id: ev.task_run_id.clone(),
        trace_id: ev.trace_id.clone(),
        payload: payload(ev),
    }
}

/// An event of NoETL's execution view: status from its type and payload,
/// the payload's `result` and `error` (an error object as its `message`,
/// or its JSON).
pub fn execution_event(seen: &Seen) -> ExecutionEvent {
    let ev = &seen.event;
    let p = payload(ev);
    let error = match p.get("error") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(
            other
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| other.to_string()),
        ),
    };
    ExecutionEvent {
        event_id: ev.event_id.clone(),
        seq: seen.seq,
        event_type: ev.event_type.clone(),
        node_name: Some(ev.step.clone()).filter(|s| !s.is_empty()),
        status: event_status(&ev.event_type, &p).to_string(),
        created_at: noetl_wire::codec::event_time(ev),
        result: p.get("result").filter(|r| !r.is_null()).cloned(),
        error,
    }
}

/// Longest `type` query: event types are a few tokens.
pub const MAX_TYPE: usize = 128;

/// The subject tokens (after `<p>.evt.<eid>.`) of a `type` query: dotted
/// tokens of `[A-Za-z0-9_-]`, where `*` is one token and a final `*` the
/// rest (`step.*` → `step.>`); no query is every type (`>`).
pub fn type_subject(glob: Option<&str>) -> Result<String, String> {
    let Some(glob) = glob.map(str::trim).filter(|g| !g.is_empty()) else {
        return Ok(">".into());
    };
    if glob.len() > MAX_TYPE {
        return Err(format!(
            "type: at most {MAX_TYPE} characters (it has {})",
            glob.len()
        ));
    }
    let tokens: Vec<&str> = glob.split('.').collect();
    let last = tokens.len() - 1;
    let mut out = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let plain = !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
        match *t {
            "*" if i == last => out.push(">"),
            "*" => out.push("*"),
            _ if plain => out.push(t),
            _ => {
                return Err(format!(
                    "type {glob:?}: use dotted tokens of [A-Za-z0-9_-], `*` for one token, or a final `*` (`step.*`)"
                ))
            }
        }
    }
    Ok(out.join("."))
}

/// True when `event_type` matches `pattern` (what [`type_subject`]
/// returns: `*` one token, a final `>` one or more).
pub fn type_matches(pattern: &str, event_type: &str) -> bool {
    let mut want = pattern.split('.');
    let mut have = event_type.split('.');
    loop {
        match (want.next(), have.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(w), Some(h)) if w == h => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Where a stream resumes: after the `Last-Event-ID` header's sequence
/// (a reconnecting client), else after the `after` query, else from the
/// start (0). A header that is not a sequence is the message of a 400.
pub fn resume_point(last_event_id: Option<&str>, after: Option<u64>) -> Result<u64, String> {
    match last_event_id {
        Some(h) => h.trim().parse().map_err(|_| {
            format!("Last-Event-ID {h:?} is not an event's stream sequence (the `id:` of an event this API sent)")
        }),
        None => Ok(after.unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seen(event_type: &str, payload: Value) -> Seen {
        Seen {
            seq: 7,
            event: Event {
                event_id: "ev1".into(),
                event_type: event_type.into(),
                execution_id: "e1".into(),
                step: "fetch".into(),
                ts: "2026-01-01T00:00:00.000Z".into(),
                payload_json: serde_json::to_vec(&payload).unwrap(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn an_event_shows_its_sequence_status_result_and_error() {
        let done = execution_event(&seen(
            "step.done",
            json!({"status": "ok", "result": {"n": 1}}),
        ));
        assert_eq!((done.seq, done.status.as_str()), (7, "COMPLETED"));
        assert_eq!(done.result, Some(json!({"n": 1})));
        assert_eq!(done.node_name.as_deref(), Some("fetch"));
        let failed = execution_event(&seen(
            "step.failed",
            json!({"status": "error", "error": {"kind": "http", "message": "503"}}),
        ));
        assert_eq!(failed.status, "FAILED");
        assert_eq!(failed.error.as_deref(), Some("503"));
        let s = streamed(&seen("step.done", json!({"status": "ok"})));
        assert_eq!((s.seq, s.execution_id.as_str()), (7, "e1"));
        assert_eq!(s.payload, json!({"status": "ok"}));
    }

    #[test]
    fn a_stream_resumes_after_the_last_event_id_else_after_the_query() {
        assert_eq!(resume_point(Some("42"), Some(7)), Ok(42));
        assert_eq!(resume_point(None, Some(7)), Ok(7));
        assert_eq!(resume_point(None, None), Ok(0));
        assert!(resume_point(Some("abc"), None)
            .unwrap_err()
            .contains("Last-Event-ID"));
    }

    #[test]
    fn a_type_query_becomes_a_subject_filter() {
        assert_eq!(type_subject(None).unwrap(), ">");
        assert_eq!(type_subject(Some("step.done")).unwrap(), "step.done");
        assert_eq!(type_subject(Some("step.*")).unwrap(), "step.>");
        assert_eq!(type_subject(Some("*.done")).unwrap(), "*.done");
        assert_eq!(type_subject(Some("*")).unwrap(), ">");
        for bad in ["step.", "step.d*", "a b", "step.>"] {
            assert!(type_subject(Some(bad)).is_err(), "{bad}");
        }
        let long = "a.".repeat(3000);
        let e = type_subject(Some(&long)).unwrap_err();
        assert!(e.contains("at most 128") && e.len() < 100, "{e}");
    }

    #[test]
    fn a_type_pattern_matches_as_its_subject_filter_would() {
        assert!(type_matches(">", "loop.iteration.done"));
        assert!(type_matches("step.>", "step.done"));
        assert!(!type_matches("step.>", "step"));
        assert!(!type_matches("step.>", "task.done"));
        assert!(type_matches("*.done", "step.done"));
        assert!(!type_matches("*.done", "loop.iteration.done"));
        assert!(type_matches("loop.>", "loop.iteration.done"));
        assert!(type_matches("step.done", "step.done"));
        assert!(!type_matches("step.done", "step.done.x"));
    }
}
