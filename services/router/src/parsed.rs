//! Playbooks the router has parsed, by their text: executions of one
//! playbook (the same YAML, or the same catalog version) are started many
//! times, and parsing, normalising and validating it again for each was a
//! twelfth of the engine's CPU with 1,000 executions started at once
//! (docs/performance.md "A playbook parsed once").

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use noetl_core::{load::LoadError, Playbook};
use noetl_mesh::cache::Bounded;

/// How many parsed playbooks the router keeps.
pub const PARSED_ENTRIES: usize = 256;

/// The most they may weigh (their text, counted four times for the
/// model built from it).
pub const PARSED_BYTES: usize = 8 << 20;

/// A parsed playbook and the text and source name it was parsed from.
struct Parsed {
    text: String,
    source: String,
    playbook: Arc<Playbook>,
}

/// Parsed playbooks by text and source name: only a playbook that loaded
/// is kept (one that fails is parsed again, and says why again).
pub struct ParsedPlaybooks {
    cache: Bounded<u64, Arc<Parsed>>,
}

impl Default for ParsedPlaybooks {
    fn default() -> Self {
        Self::new(PARSED_ENTRIES, PARSED_BYTES)
    }
}

impl ParsedPlaybooks {
    /// At most `capacity` playbooks whose texts weigh (×4) at most `budget`.
    pub fn new(capacity: usize, budget: usize) -> Self {
        Self {
            cache: Bounded::weighted(capacity, budget),
        }
    }

    /// The playbook `text` (called `source` in diagnostics) loads to:
    /// [`noetl_core::load::load_playbook`]'s answer, from this cache when
    /// the same text and source were loaded before (then the playbook is
    /// shared, not copied).
    pub fn load(&self, text: &str, source: &str) -> Result<Arc<Playbook>, LoadError> {
        let key = key_of(text, source);
        if let Some(hit) = self.cache.get(&key) {
            if hit.text == text && hit.source == source {
                return Ok(hit.playbook.clone());
            }
        }
        let playbook = Arc::new(noetl_core::load::load_playbook(text, source)?.playbook);
        let parsed = Parsed {
            text: text.to_string(),
            source: source.to_string(),
            playbook: playbook.clone(),
        };
        let weight = 4 * text.len() + source.len();
        self.cache.insert_weighing(key, Arc::new(parsed), weight);
        Ok(playbook)
    }
}

fn key_of(text: &str, source: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    source.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: one }\nworkflow:\n  - step: start\n    tool:\n      - name: t\n        kind: noop\n";

    #[test]
    fn a_playbook_loads_the_same_from_the_cache_as_from_its_text() {
        let parsed = ParsedPlaybooks::default();
        let first = parsed.load(ONE, "one.yaml").unwrap();
        assert_eq!(parsed.cache.len(), 1);
        let again = parsed.load(ONE, "one.yaml").unwrap();
        assert!(Arc::ptr_eq(&first, &again), "shared, not copied");
        assert_eq!(
            *again,
            noetl_core::load::load_playbook(ONE, "one.yaml")
                .unwrap()
                .playbook
        );
        assert_eq!(parsed.cache.len(), 1, "the second load was a hit");
    }

    #[test]
    fn another_text_or_source_is_loaded_on_its_own() {
        let parsed = ParsedPlaybooks::default();
        let two = ONE.replace("name: one", "name: two");
        assert_eq!(parsed.load(ONE, "one.yaml").unwrap().metadata.name, "one");
        assert_eq!(parsed.load(&two, "one.yaml").unwrap().metadata.name, "two");
        parsed.load(ONE, "other.yaml").unwrap();
        assert_eq!(parsed.cache.len(), 3);
    }

    #[test]
    fn a_playbook_that_fails_says_why_every_time_and_is_not_kept() {
        let parsed = ParsedPlaybooks::default();
        let bad = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: bad }\nworkflow: [\n";
        for _ in 0..2 {
            let err = parsed.load(bad, "bad.yaml").unwrap_err();
            assert!(err.to_string().contains("bad.yaml"), "{err}");
        }
        assert!(parsed.cache.is_empty());
    }

    #[test]
    fn a_hash_collision_is_not_taken_for_a_hit() {
        let parsed = ParsedPlaybooks::default();
        let two = ONE.replace("name: one", "name: two");
        let playbook = noetl_core::load::load_playbook(&two, "one.yaml")
            .unwrap()
            .playbook;
        // `two` filed under `ONE`'s key, as a collision would.
        parsed.cache.insert(
            key_of(ONE, "one.yaml"),
            Arc::new(Parsed {
                text: two,
                source: "one.yaml".into(),
                playbook: Arc::new(playbook),
            }),
        );
        assert_eq!(parsed.load(ONE, "one.yaml").unwrap().metadata.name, "one");
    }
}
