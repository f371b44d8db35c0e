//! Size limits on hostile input, in one place (table: `docs/architecture.md`,
//! "Limits"). Each limit has a documented default; a refusal is a
//! [`LimitError`] (or, for a playbook, a diagnostic with its own code) that
//! names the limit, the actual size, the maximum and where.
//!
//! Limits the runtime applies per execution can be raised or lowered in the
//! playbook under `executor.spec.limits` ([`Limits::from_spec_limits`]).
//! Large step results and task arguments never fail for size: above
//! `max_payload_bytes` they travel by reference to object storage.

use serde_json::Value;

/// Largest playbook source accepted, in bytes (E040).
pub const MAX_PLAYBOOK_BYTES: usize = 4 * 1024 * 1024;
/// Deepest nesting of YAML sequences and mappings (E041).
pub const MAX_YAML_DEPTH: usize = 64;
/// Most nodes YAML aliases may add to a document ("billion laughs", E042).
pub const MAX_ALIAS_NODES: usize = 100_000;
/// Most scalar text, in bytes, YAML aliases may add to a document (E042).
pub const MAX_ALIAS_BYTES: usize = 8 * 1024 * 1024;
/// Most steps in a workflow (E043).
pub const MAX_STEPS: usize = 2_000;
/// Most `next` arcs in a workflow, all steps together (E044).
pub const MAX_ARCS: usize = 10_000;
/// Largest output of one template render, in bytes: its text, or the JSON
/// of a value an expression builds (a plain lookup passes what it reads).
pub const MAX_TEMPLATE_OUTPUT_BYTES: usize = 32 * 1024 * 1024;
/// Work budget of one template render, in minijinja instructions ("fuel"):
/// bounds the CPU time of loops such as `{% for i in range(n) %}` nested.
pub const MAX_TEMPLATE_FUEL: u64 = 5_000_000;
/// Default most items in one loop collection (`loop.in`);
/// `executor.spec.limits.max_loop_items` overrides it per playbook.
pub const DEFAULT_MAX_LOOP_ITEMS: usize = 1_000_000;

/// Largest event payload, in bytes of JSON. Events carry compact results
/// (large results and arguments are references); a payload still above
/// this has its large fields replaced by previews ([`bound_payload`]).
pub const MAX_EVENT_PAYLOAD_BYTES: usize = 64 * 1024;
/// A field of an oversized event payload above this many bytes of JSON
/// becomes a preview.
pub const EVENT_FIELD_BYTES: usize = 4 * 1024;
/// Bytes of JSON text kept in a preview.
const PREVIEW_BYTES: usize = 1024;

/// A size limit was exceeded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} is {actual} {unit}, above the limit `{limit}` of {max} {unit} ({place}); {hint}")]
pub struct LimitError {
    /// The limit's name (`max_loop_items`, `max_template_output_bytes`...).
    pub limit: &'static str,
    /// What was measured ("the loop collection", "the rendered template").
    pub what: String,
    /// The actual size (or the size reached when measuring stopped).
    pub actual: usize,
    /// The limit.
    pub max: usize,
    /// `bytes`, `items`, `nodes`...
    pub unit: &'static str,
    /// Where: playbook path, execution id, step.
    pub place: String,
    /// What to do about it.
    pub hint: &'static str,
}

/// The per-execution limits, after `executor.spec.limits` overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most items in one loop collection.
    pub max_loop_items: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_loop_items: DEFAULT_MAX_LOOP_ITEMS,
        }
    }
}

impl Limits {
    /// The defaults, overridden by `<name>` of an `executor.spec.limits`
    /// object (a positive integer; anything else keeps the default).
    pub fn from_spec_limits(limits: Option<&Value>) -> Self {
        let mut l = Self::default();
        let get = |name: &str| {
            limits
                .and_then(|l| l.get(name))
                .and_then(Value::as_u64)
                .filter(|n| *n > 0)
                .and_then(|n| usize::try_from(n).ok())
        };
        if let Some(n) = get("max_loop_items") {
            l.max_loop_items = n;
        }
        l
    }

    /// Refuse a loop collection of more than [`Limits::max_loop_items`].
    pub fn check_loop_items(&self, count: usize, place: &str) -> Result<(), LimitError> {
        if count <= self.max_loop_items {
            return Ok(());
        }
        Err(LimitError {
            limit: "max_loop_items",
            what: "the loop collection".into(),
            actual: count,
            max: self.max_loop_items,
            unit: "items",
            place: place.to_string(),
            hint: "split the collection (a child playbook per chunk, or pagination), or raise executor.spec.limits.max_loop_items",
        })
    }
}

/// A `std::fmt::Write` / `std::io::Write` sink that counts bytes and refuses
/// to go beyond `max` (used to measure renders and JSON without building
/// them whole).
#[derive(Debug, Default)]
pub struct Bounded {
    /// Bytes written so far.
    pub written: usize,
    /// The most accepted.
    pub max: usize,
}

impl Bounded {
    /// A counter that refuses more than `max` bytes.
    pub fn new(max: usize) -> Self {
        Self { written: 0, max }
    }

    /// Count `n` more bytes; false when that passes the limit.
    pub fn add(&mut self, n: usize) -> bool {
        self.written = self.written.saturating_add(n);
        self.written <= self.max
    }
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.add(buf.len()) {
            Ok(buf.len())
        } else {
            Err(std::io::Error::other("size limit reached"))
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The size of `v` as compact JSON, counting no further than `max + 1`
/// bytes: `Ok(size)` when within `max`, `Err(size_so_far)` beyond.
pub fn json_size_within(v: &Value, max: usize) -> Result<usize, usize> {
    let mut b = Bounded::new(max);
    match serde_json::to_writer(&mut b, v) {
        Ok(()) => Ok(b.written),
        Err(_) => Err(b.written),
    }
}

/// `payload` itself when its JSON fits in [`MAX_EVENT_PAYLOAD_BYTES`];
/// else the same object with every field above 4 KiB of JSON (searched
/// depth-first) replaced by `{"truncated": true, "size": <bytes>,
/// "preview": "<first 1 KiB of its JSON>"}`, and if that is still too large,
/// a preview of the whole payload that keeps `status` and `error.kind`.
pub fn bound_payload(payload: Value) -> Value {
    if json_size_within(&payload, MAX_EVENT_PAYLOAD_BYTES).is_ok() {
        return payload;
    }
    let shrunk = shrink(payload.clone(), 0);
    if json_size_within(&shrunk, MAX_EVENT_PAYLOAD_BYTES).is_ok() {
        return shrunk;
    }
    let mut out = serde_json::Map::new();
    if let Some(s) = payload.get("status").filter(|s| s.is_string()) {
        out.insert("status".into(), s.clone());
    }
    if let Some(k) = payload.pointer("/error/kind").filter(|k| k.is_string()) {
        out.insert("error".into(), serde_json::json!({"kind": k}));
    }
    if let Value::Object(p) = preview(&payload) {
        out.extend(p);
    }
    Value::Object(out)
}

fn shrink(v: Value, depth: usize) -> Value {
    if json_size_within(&v, EVENT_FIELD_BYTES).is_ok() {
        return v;
    }
    match v {
        Value::Object(m) if depth < 4 => Value::Object(
            m.into_iter()
                .map(|(k, x)| (k, shrink(x, depth + 1)))
                .collect(),
        ),
        other => preview(&other),
    }
}

/// `value` itself when its JSON fits in `limit` bytes, else a
/// [`Preview`] of its first `min(limit, 1 KiB)` bytes of JSON. Used where
/// a result rides whole in an event only while it is small.
pub fn compact(value: &Value, limit: usize) -> Value {
    if value.is_null() || matches!(value, Value::Bool(_) | Value::Number(_)) {
        return value.clone();
    }
    if json_size_within(value, limit).is_ok() {
        return value.clone();
    }
    preview_of(value, limit.min(PREVIEW_BYTES))
}

/// What stands in for a value too large to carry:
/// `{"truncated": true, "size": <bytes>, "preview": "<first bytes of its JSON>"}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Preview {
    /// Always `true`: marks the value as a preview.
    pub truncated: bool,
    /// Bytes of the whole value's JSON.
    pub size: usize,
    /// The first bytes of that JSON, cut at a character boundary.
    pub preview: String,
}

fn preview(v: &Value) -> Value {
    preview_of(v, PREVIEW_BYTES)
}

fn preview_of(v: &Value, bytes: usize) -> Value {
    let text = v.to_string();
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let p = Preview {
        truncated: true,
        size: text.len(),
        preview: text[..end].to_string(),
    };
    serde_json::to_value(p).expect("a preview is plain JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn loop_items_limit_names_the_limit_the_size_and_the_place() {
        let l = Limits::default();
        assert!(l.check_loop_items(DEFAULT_MAX_LOOP_ITEMS, "x").is_ok());
        let e = l
            .check_loop_items(DEFAULT_MAX_LOOP_ITEMS + 1, "step \"fan\" of execution e1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_loop_items"), "{e}");
        assert!(
            e.contains(&format!("{}", DEFAULT_MAX_LOOP_ITEMS + 1)),
            "{e}"
        );
        assert!(e.contains("step \"fan\" of execution e1"), "{e}");
    }

    #[test]
    fn executor_spec_overrides_the_loop_limit() {
        let spec = json!({"max_loop_items": 3});
        let l = Limits::from_spec_limits(Some(&spec));
        assert_eq!(l.max_loop_items, 3);
        assert!(l.check_loop_items(4, "s").is_err());
        // Nonsense keeps the default.
        let bad = json!({"max_loop_items": "many"});
        assert_eq!(Limits::from_spec_limits(Some(&bad)), Limits::default());
        assert_eq!(Limits::from_spec_limits(None), Limits::default());
    }

    #[test]
    fn event_payloads_are_bounded_keeping_what_routing_reads() {
        let small = json!({"status": "ok", "result": {"a": 1}});
        assert_eq!(bound_payload(small.clone()), small);
        let huge = "é".repeat(200_000);
        let p = bound_payload(json!({
            "status": "error",
            "error": {"kind": "python", "message": huge},
            "args": {"id": 7},
        }));
        let size = serde_json::to_vec(&p).unwrap().len();
        assert!(size <= MAX_EVENT_PAYLOAD_BYTES, "{size}");
        assert_eq!(p["status"], "error");
        assert_eq!(p["error"]["kind"], "python");
        assert_eq!(p["error"]["message"]["truncated"], true);
        assert_eq!(p["error"]["message"]["size"], 400_002);
        assert_eq!(p["args"], json!({"id": 7}));
        // Many fields each small: the whole payload becomes one preview.
        let many: serde_json::Map<String, Value> =
            (0..20_000).map(|i| (format!("k{i}"), json!(i))).collect();
        let p = bound_payload(json!({"status": "ok", "result": Value::Object(many)}));
        assert!(serde_json::to_vec(&p).unwrap().len() <= MAX_EVENT_PAYLOAD_BYTES);
        assert_eq!(p["status"], "ok");
        assert_eq!(p["truncated"], true);
    }

    #[test]
    fn json_size_stops_counting_past_the_limit() {
        let v = json!({"a": "x".repeat(100)});
        assert_eq!(
            json_size_within(&v, 1000),
            Ok(serde_json::to_vec(&v).unwrap().len())
        );
        let over = json_size_within(&v, 10).unwrap_err();
        assert!(over > 10 && over < 120, "{over}");
    }

    #[test]
    fn compact_keeps_small_values_and_previews_big_ones() {
        assert_eq!(compact(&json!({"a": 1}), 100), json!({"a": 1}));
        assert_eq!(compact(&json!(12345), 1), json!(12345));
        let big = json!({"s": "é".repeat(5000)});
        let c: Preview = serde_json::from_value(compact(&big, 4096)).unwrap();
        assert!(c.truncated);
        assert_eq!(c.size, big.to_string().len());
        assert!(c.preview.len() <= 1024 && !c.preview.is_empty());
        let small: Preview = serde_json::from_value(compact(&big, 10)).unwrap();
        assert!(small.preview.len() <= 10);
    }
}
