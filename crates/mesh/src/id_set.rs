//! A set of ids (event, task-run, step-run) as small as the engine's ids
//! allow: an id of 32 lower-case hex digits, the form the engine derives
//! ([`crate::ids`]), is kept as the 16 bytes it stands for, any other as
//! written. A reader of a long loop's log remembers an id per iteration
//! event (300,000 for a loop of 100,000 iterations): 16 bytes each here,
//! about 80 as a `String` in a tree.

use std::collections::HashSet;

/// A set of ids ([module docs](self)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdSet {
    hex: HashSet<u128>,
    other: HashSet<String>,
}

impl IdSet {
    /// Add `id`; false when it was there.
    pub fn insert(&mut self, id: &str) -> bool {
        self.insert_key(IdKey::of(id))
    }

    /// Whether `id` is there.
    pub fn contains(&self, id: &str) -> bool {
        self.contains_key(&IdKey::of(id))
    }

    /// Take `id` out; false when it was not there.
    pub fn remove(&mut self, id: &str) -> bool {
        self.remove_key(&IdKey::of(id))
    }

    /// How many ids are there.
    pub fn len(&self) -> usize {
        self.hex.len() + self.other.len()
    }

    /// No id is there.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn insert_key(&mut self, id: IdKey) -> bool {
        match id {
            IdKey::Hex(n) => self.hex.insert(n),
            IdKey::Other(s) => self.other.insert(s),
        }
    }

    pub(crate) fn contains_key(&self, id: &IdKey) -> bool {
        match id {
            IdKey::Hex(n) => self.hex.contains(n),
            IdKey::Other(s) => self.other.contains(s),
        }
    }

    pub(crate) fn remove_key(&mut self, id: &IdKey) -> bool {
        match id {
            IdKey::Hex(n) => self.hex.remove(n),
            IdKey::Other(s) => self.other.remove(s),
        }
    }
}

/// An id as an [`IdSet`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum IdKey {
    Hex(u128),
    Other(String),
}

impl IdKey {
    pub(crate) fn of(id: &str) -> Self {
        // Lower-case digits only: "AB" and "ab" are different ids.
        let hex = id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        match hex.then(|| u128::from_str_radix(id, 16).ok()).flatten() {
            Some(n) => Self::Hex(n),
            None => Self::Other(id.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_id_is_kept_as_its_bytes_and_any_other_as_written() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            IdKey::of(id),
            IdKey::Hex(0x0123456789abcdef0123456789abcdef)
        );
        // Not the engine's form: kept as written, so no two ids meet.
        let upper = id.to_uppercase();
        assert_eq!(IdKey::of(&upper), IdKey::Other(upper.clone()));
        assert_ne!(IdKey::of(id), IdKey::of(&upper));
        assert_eq!(IdKey::of("e1"), IdKey::Other("e1".into()));
        assert_eq!(IdKey::of(""), IdKey::Other(String::new()));
        assert_eq!(IdKey::of(&id[..31]), IdKey::Other(id[..31].into()));
    }

    #[test]
    fn a_set_holds_each_id_once_in_either_form() {
        let mut set = IdSet::default();
        let (hex, upper) = (
            "0123456789abcdef0123456789abcdef",
            "0123456789ABCDEF0123456789ABCDEF",
        );
        assert!(set.insert(hex) && set.insert(upper) && set.insert("e1"));
        assert!(!set.insert(hex) && !set.insert("e1"));
        assert_eq!(set.len(), 3);
        assert!(set.contains(hex) && set.contains(upper) && set.contains("e1"));
        assert!(!set.contains("fedcba9876543210fedcba9876543210"));
        assert!(set.remove(hex) && !set.remove(hex) && set.remove("e1"));
        assert!(!set.contains(hex) && set.contains(upper));
        assert_eq!(set.len(), 1);
    }
}
