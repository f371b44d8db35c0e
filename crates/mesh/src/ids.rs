//! Deterministic ids: the same inputs always give the same id, so a
//! redelivered message republishes with the same `Nats-Msg-Id` and JetStream
//! drops the duplicate.

use sha2::{Digest, Sha256};

/// The execution id of the child a `playbook` task's run `task_run_id`
/// starts: derived, so the parent's `task.started` names its child.
pub fn child_execution_id(task_run_id: &str) -> String {
    derive_id(&["child", task_run_id])
}

/// The id of the command that runs iteration `index` of loop run
/// `loop_run_id` from its first task: a command of its own, or its part
/// of a batch (the parent of the iteration's end either way).
pub fn iteration_command_id(loop_run_id: &str, index: u64) -> String {
    derive_id(&[loop_run_id, "iter", &index.to_string()])
}

/// What tells a batch of iterations `indices` apart from any other batch
/// of its loop run (its command's and its events' ids): derived from the
/// indices, so a batch sent again is the same batch, and two batches that
/// share an index are not.
pub fn batch_key(indices: impl IntoIterator<Item = u64>) -> String {
    let text: Vec<String> = indices.into_iter().map(|i| i.to_string()).collect();
    let parts: Vec<&str> = text.iter().map(String::as_str).collect();
    derive_id(&parts)
}

/// Where a task run is in its step-run (or iteration): what its id is
/// derived from beside the step-run and the iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskRunAt {
    /// The task's index in the pipeline.
    pub pc: usize,
    /// Its attempt (1-based).
    pub attempt: u32,
    /// Task runs of the step-run before it.
    pub steps_taken: u64,
}

/// The id of a task run of step-run `srid` (iteration `index` as text,
/// `""` outside loops) at `at`: deterministic, so a redelivered command
/// republishes the same events.
pub fn task_run_id(srid: &str, index: &str, at: TaskRunAt) -> String {
    derive_id(&[
        srid,
        index,
        &at.pc.to_string(),
        &at.attempt.to_string(),
        &at.steps_taken.to_string(),
    ])
}

/// A 32-hex-character id derived from `parts` (order matters): the first
/// 16 bytes of the SHA-256 of each part's length (8 bytes, little-endian)
/// and bytes, in lowercase hex. Never to change: ids derived by an older
/// version must come out the same (a redelivery de-duplicated, a log
/// compared).
pub fn derive_id(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    lower_hex(&h.finalize()[..16])
}

/// The identity of claim `seq` of cursor loop run `loop_run_id`, which
/// its claim reads as `__frame_claim` (docs/dsl.md, "Cursor loops"): the
/// same text each time the claim runs again. Never to change: rows a
/// claim marked with it are taken back by it.
pub fn claim_identity(loop_run_id: &str, seq: u64) -> String {
    format!("{loop_run_id}.{seq}")
}

/// `bytes` in lowercase hex, written straight into a string of the right
/// size (every id of a step or an iteration goes through here; `hex::encode`
/// collects it char by char).
fn lower_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// True for a W3C trace id: 32 lowercase hex digits, not all zero.
pub fn is_w3c_trace_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && s.bytes().any(|b| b != b'0')
}

/// The trace id of an execution: the one its request carries when that is
/// a W3C trace id (a child's is its parent's, so a tree of executions is
/// one trace; a client may pass its own); otherwise one derived from what
/// the request carries (or, when nothing, from the execution id), so every
/// service and every redelivery agrees on it.
pub fn trace_id_for(requested: &str, execution_id: &str) -> String {
    if is_w3c_trace_id(requested) {
        return requested.to_string();
    }
    let from = if requested.is_empty() {
        execution_id
    } else {
        requested
    };
    derive_id(&["trace", from])
}

/// A fresh, time-ordered execution id (UUIDv7, simple form).
pub fn new_execution_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// The scope of audit events that belong to no execution
/// ([`crate::audit`]): never an execution id.
pub const MESH_SCOPE: &str = "_mesh";

/// What an execution id and a signal name may be, as messages state it
/// ([`is_valid_execution_id`], [`crate::signal::valid_signal`]).
pub const NAME_RULE: &str = "1-128 characters of [A-Za-z0-9_-]";

/// True when `id` can be used inside subjects and KV keys (and is not
/// [`MESH_SCOPE`]).
pub fn is_valid_execution_id(id: &str) -> bool {
    !id.is_empty()
        && id != MESH_SCOPE
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        // Pinned: the same inputs give the same id in every version.
        assert_eq!(derive_id(&["a", "b"]), "cf6ab613e3942391f88ed698557e1680");
        assert_eq!(
            derive_id(&["e1", "step.done", "sr1", "", ""]),
            "d17bf65c39e8ec6832b3d03d415b705a"
        );
        assert_eq!(lower_hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(derive_id(&["a", "b"]), derive_id(&["a", "b"]));
        assert_ne!(derive_id(&["ab", ""]), derive_id(&["a", "b"]));
        assert_eq!(derive_id(&["x"]).len(), 32);
    }

    #[test]
    fn execution_ids_are_subject_safe() {
        assert!(is_valid_execution_id(&new_execution_id()));
        assert!(!is_valid_execution_id("a.b"));
        assert!(!is_valid_execution_id("a b"));
        assert!(!is_valid_execution_id(""));
    }

    #[test]
    fn trace_ids_are_w3c_and_stable() {
        let t = trace_id_for("", "e1");
        assert!(is_w3c_trace_id(&t), "{t}");
        assert_eq!(t, trace_id_for("", "e1"), "every service derives the same");
        assert_ne!(t, trace_id_for("", "e2"));
        let given = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(trace_id_for(given, "e1"), given, "a W3C id is kept");
        assert!(is_w3c_trace_id(&trace_id_for("legacy-trace", "e1")));
        assert!(!is_w3c_trace_id("00000000000000000000000000000000"));
        assert!(!is_w3c_trace_id("4BF92F3577B34DA6A3CE929D0E0E4736"));
    }
}
