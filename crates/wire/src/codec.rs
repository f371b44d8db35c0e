//! Encoding of wire messages. Internal messages are protobuf; execution
//! requests may also be plain JSON so that any NATS client can start work,
//! and events may be JSON so that any NATS client can read them.
//! Every decoder here returns a [`DecodeError`] on bad input, never panics
//! (fuzzed: `fuzz/`, docs/architecture.md "Hostile input").

use crate::{Event, ExecutionRequest, Message};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A message could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode {what}: {reason}")]
pub struct DecodeError {
    /// Which message type was expected.
    pub what: &'static str,
    /// Why decoding failed.
    pub reason: String,
}

/// Encode a protobuf message.
pub fn encode<M: Message>(m: &M) -> bytes::Bytes {
    bytes::Bytes::from(m.encode_to_vec())
}

/// Decode a protobuf message.
pub fn decode<M: Message + Default>(what: &'static str, data: &[u8]) -> Result<M, DecodeError> {
    M::decode(data).map_err(|e| DecodeError {
        what,
        reason: e.to_string(),
    })
}

/// Parse a JSON object field stored as bytes; empty means `{}`.
pub fn json_object(data: &[u8]) -> Result<serde_json::Map<String, Value>, DecodeError> {
    if data.is_empty() {
        return Ok(Default::default());
    }
    match serde_json::from_slice(data) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(DecodeError {
            what: "JSON object",
            reason: format!("expected an object, found {}", json_type(&other)),
        }),
        Err(e) => Err(DecodeError {
            what: "JSON object",
            reason: e.to_string(),
        }),
    }
}

/// Parse a JSON value stored as bytes; empty means `null`.
pub fn json_value(data: &[u8]) -> Result<Value, DecodeError> {
    if data.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(data).map_err(|e| DecodeError {
        what: "JSON value",
        reason: e.to_string(),
    })
}

/// The `args` of a token or command: absent or `null` is `{}`; bytes that
/// are not JSON are an error (the message is refused, never run with
/// arguments silently dropped).
pub fn args(data: &[u8]) -> Result<Value, DecodeError> {
    match json_value(data) {
        Ok(Value::Null) => Ok(Value::Object(Default::default())),
        Ok(v) => Ok(v),
        Err(e) => Err(DecodeError {
            what: "args",
            reason: e.reason,
        }),
    }
}

/// Serialise a JSON value to bytes (`null` becomes empty).
pub fn json_bytes(v: &Value) -> Vec<u8> {
    if v.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(v).expect("JSON values always serialise")
    }
}

pub use noetl_core::json_type;

/// The JSON form of an execution request.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecutionRequestJson {
    #[serde(default)]
    execution_id: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    version: u32,
    /// Inline playbook YAML (alias `playbook_yaml`).
    #[serde(default, alias = "playbook_yaml")]
    playbook: String,
    #[serde(default)]
    workload: Option<Value>,
    #[serde(default)]
    parent_execution_id: String,
    #[serde(default)]
    source_name: String,
    #[serde(default)]
    trace_id: String,
}

/// Decode an execution request: JSON when the payload starts with `{`,
/// protobuf otherwise.
pub fn decode_execution_request(data: &[u8]) -> Result<ExecutionRequest, DecodeError> {
    let first = data.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        let j: ExecutionRequestJson = match serde_json::from_slice(data) {
            Ok(j) => j,
            // `\n{` also starts a protobuf request whose first field is
            // 123 bytes long: not JSON, but maybe protobuf.
            Err(e) => {
                return decode("execution request (protobuf)", data).map_err(|_| DecodeError {
                    what: "execution request (JSON)",
                    reason: e.to_string(),
                })
            }
        };
        let workload_json = match j.workload {
            None | Some(Value::Null) => Vec::new(),
            Some(v @ Value::Object(_)) => serde_json::to_vec(&v).expect("serialisable"),
            Some(other) => {
                return Err(DecodeError {
                    what: "execution request (JSON)",
                    reason: format!("`workload` must be an object, found {}", json_type(&other)),
                })
            }
        };
        return Ok(ExecutionRequest {
            execution_id: j.execution_id,
            path: j.path,
            version: j.version,
            playbook_yaml: j.playbook,
            workload_json,
            parent_execution_id: j.parent_execution_id,
            source_name: j.source_name,
            trace_id: j.trace_id,
            ..Default::default()
        });
    }
    decode("execution request (protobuf)", data)
}

/// An event as JSON (`NOETL_EVENT_ENCODING=json`): the protobuf fields by
/// name, with the payload as a JSON object instead of bytes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventJson {
    event_id: String,
    event_type: String,
    #[serde(default)]
    ts: String,
    execution_id: String,
    #[serde(default)]
    step_run_id: String,
    #[serde(default)]
    task_run_id: String,
    #[serde(default)]
    trace_id: String,
    #[serde(default)]
    parent_id: String,
    #[serde(default)]
    step: String,
    #[serde(default)]
    task: String,
    #[serde(default)]
    payload: Value,
}

/// An event's time as RFC 3339 text with milliseconds, UTC: its `ts`, or
/// its `ts_ms` written so (events are stored with `ts_ms` only); empty
/// when it has neither.
pub fn event_time(ev: &Event) -> String {
    if !ev.ts.is_empty() || ev.ts_ms == 0 {
        return ev.ts.clone();
    }
    rfc3339_of_ms(ev.ts_ms)
}

/// Milliseconds since the Unix epoch as RFC 3339 text with milliseconds,
/// UTC (`2026-11-26T08:00:00.000Z`).
pub fn rfc3339_of_ms(ms: u64) -> String {
    let f = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&f).ok())
        .unwrap_or_else(|| format!("{ms} ms after the epoch"))
}

/// An event as JSON text: what `nats sub` prints when the mesh publishes
/// events as JSON, and what `noetl events decode` prints.
pub fn event_json(ev: &Event) -> Result<Vec<u8>, DecodeError> {
    let payload = json_value(&ev.payload_json).map_err(|e| DecodeError {
        what: "event payload",
        reason: e.reason,
    })?;
    let j = EventJson {
        event_id: ev.event_id.clone(),
        event_type: ev.event_type.clone(),
        ts: event_time(ev),
        execution_id: ev.execution_id.clone(),
        step_run_id: ev.step_run_id.clone(),
        task_run_id: ev.task_run_id.clone(),
        trace_id: ev.trace_id.clone(),
        parent_id: ev.parent_id.clone(),
        step: ev.step.clone(),
        task: ev.task.clone(),
        payload,
    };
    Ok(serde_json::to_vec(&j).expect("an event is plain JSON"))
}

/// Decode an event: JSON when the payload starts with `{`, protobuf
/// otherwise (and protobuf again when such a payload is not JSON but is a
/// protobuf event). Every reader accepts both, so a mesh can switch
/// encodings while it runs.
pub fn decode_event(data: &[u8]) -> Result<Event, DecodeError> {
    if data.first() != Some(&b'{') {
        let mut ev: Event = decode("event", data)?;
        if ev.ts.is_empty() {
            ev.ts = event_time(&ev);
        }
        return Ok(ev);
    }
    let j: EventJson = match serde_json::from_slice(data) {
        Ok(j) => j,
        Err(e) => {
            return decode("event", data).map_err(|_| DecodeError {
                what: "event (JSON)",
                reason: e.to_string(),
            })
        }
    };
    Ok(Event {
        event_id: j.event_id,
        event_type: j.event_type,
        ts: j.ts,
        execution_id: j.execution_id,
        step_run_id: j.step_run_id,
        task_run_id: j.task_run_id,
        trace_id: j.trace_id,
        parent_id: j.parent_id,
        step: j.step,
        task: j.task,
        payload_json: json_bytes(&j.payload),
        ts_ms: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_default_to_an_object_and_bad_bytes_are_an_error() {
        assert_eq!(args(b"").unwrap(), serde_json::json!({}));
        assert_eq!(args(b"null").unwrap(), serde_json::json!({}));
        assert_eq!(args(br#"{"a":1}"#).unwrap(), serde_json::json!({"a": 1}));
        let e = args(b"{not json").unwrap_err();
        assert_eq!(e.what, "args");
        assert!(e.to_string().contains("args"), "{e}");
    }

    #[test]
    fn events_round_trip_through_json_and_protobuf() {
        let ev = Event {
            event_id: "ev1".into(),
            event_type: "step.done".into(),
            ts: "2026-11-25T10:00:00.000Z".into(),
            execution_id: "e1".into(),
            step_run_id: "sr1".into(),
            step: "start".into(),
            payload_json: br#"{"status":"ok","result":{"n":1}}"#.to_vec(),
            ..Default::default()
        };
        let text = event_json(&ev).unwrap();
        let v: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            v["payload"]["result"]["n"], 1,
            "the payload is JSON, not bytes"
        );
        let back = decode_event(&text).unwrap();
        assert_eq!(back.event_id, ev.event_id);
        assert_eq!(
            json_value(&back.payload_json).unwrap(),
            json_value(&ev.payload_json).unwrap()
        );
        assert_eq!(
            decode_event(&encode(&ev)).unwrap(),
            ev,
            "protobuf as before"
        );
        // A protobuf event whose bytes happen to start like JSON.
        let odd = Event {
            event_id: "x".repeat(123),
            ..ev.clone()
        };
        assert_eq!(decode_event(&encode(&odd)).unwrap(), odd);
        let e = decode_event(br#"{"event_id": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("event_type"), "{e}");
    }

    #[test]
    fn an_event_stored_with_ts_ms_reads_with_its_rfc3339_time() {
        let ev = Event {
            event_type: "step.done".into(),
            ts_ms: 1_795_600_000_123,
            ..Default::default()
        };
        let back = decode_event(&encode(&ev)).unwrap();
        assert_eq!(back.ts, "2026-11-25T09:46:40.123Z");
        let v: Value = serde_json::from_slice(&event_json(&ev).unwrap()).unwrap();
        assert_eq!(v["ts"], "2026-11-25T09:46:40.123Z");
        assert_eq!(
            event_time(&Event::default()),
            "",
            "no time at all stays empty"
        );
    }

    #[test]
    fn json_requests_decode() {
        let r = decode_execution_request(
            br#"{"execution_id":"e1","playbook":"x: 1","workload":{"a":1}}"#,
        )
        .unwrap();
        assert_eq!(r.execution_id, "e1");
        assert_eq!(r.playbook_yaml, "x: 1");
        assert_eq!(json_object(&r.workload_json).unwrap()["a"], 1);
    }

    #[test]
    fn bad_json_names_the_problem() {
        let e = decode_execution_request(br#"{"workload": [1]}"#).unwrap_err();
        assert!(
            e.to_string().contains("`workload` must be an object"),
            "{e}"
        );
        let e = decode_execution_request(br#"{"wrkload": {}}"#).unwrap_err();
        assert!(e.to_string().contains("wrkload"), "{e}");
    }

    #[test]
    fn json_numbers_round_trip_exactly() {
        // Found by fuzz/decode_json_fields: without serde_json's
        // `float_roundtrip`, this came back one ULP off.
        for text in ["-10.2E26", "0.1", "1e-300", "123456789.123456789"] {
            let v = json_value(text.as_bytes()).unwrap();
            assert_eq!(json_value(&json_bytes(&v)).unwrap(), v, "{text}");
        }
    }

    #[test]
    fn protobuf_requests_round_trip() {
        let r = ExecutionRequest {
            execution_id: "e2".into(),
            path: "a/b".into(),
            ..Default::default()
        };
        let back = decode_execution_request(&encode(&r)).unwrap();
        assert_eq!(back, r);
    }
}
