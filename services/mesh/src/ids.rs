//! Deterministic ids: the same inputs always give the same id, so a
//! redelivered message republishes with the same `Nats-Msg-Id` and JetStream
//! drops the duplicate.

use sha2::{Digest, Sha256};

/// A 32-hex-character id derived from `parts` (order matters).
pub fn derive_id(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    hex::encode(&h.finalize()[..16])
}

/// A fresh, time-ordered execution id (UUIDv7, simple form).
pub fn new_execution_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// True when `id` can be used inside subjects and KV keys.
pub fn is_valid_execution_id(id: &str) -> bool {
    !id.is_empty()
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
}
