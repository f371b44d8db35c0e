//! The one bounded in-memory cache of the services (plans, header
//! revisions, loop collection chunks, stopped executions): one eviction
//! rule and one way to treat a poisoned lock.
//!
//! - Eviction: oldest insertion first, once more than `capacity` keys are
//!   held. Every cache here only saves a read (a miss reads KV again), so
//!   evicting any entry is always correct.
//! - A panic while the lock was held cannot leave an entry half-written
//!   (each operation is one map update), so a poisoned lock is taken over
//!   instead of poisoning every later caller.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A map of at most `capacity` entries, evicting the oldest insertion.
pub struct Bounded<K, V> {
    capacity: usize,
    inner: Mutex<Slots<K, V>>,
}

struct Slots<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K: Eq + Hash + Clone, V: Clone> Bounded<K, V> {
    /// A cache holding at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Slots {
                map: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots<K, V>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value of `key`, if cached.
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lock().map.get(key).cloned()
    }

    /// True when `key` is cached.
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lock().map.contains_key(key)
    }

    /// Cache `value` under `key` (a key already held keeps its place in the
    /// eviction order); evicts the oldest entries beyond the capacity.
    pub fn insert(&self, key: K, value: V) {
        let mut g = self.lock();
        if g.map.insert(key.clone(), value).is_none() {
            g.order.push_back(key);
            while g.order.len() > self.capacity {
                if let Some(old) = g.order.pop_front() {
                    g.map.remove(&old);
                }
            }
        }
    }

    /// Forget `key`.
    pub fn remove<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut g = self.lock();
        if g.map.remove(key).is_some() {
            g.order.retain(|k| k.borrow() != key);
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::Bounded;

    #[test]
    fn the_oldest_insertion_is_evicted_first() {
        let c = Bounded::new(2);
        c.insert("a", 1);
        c.insert("b", 2);
        c.insert("a", 10); // replaced in place: still the oldest
        c.insert("c", 3);
        assert_eq!(
            (c.get(&"a"), c.get(&"b"), c.get(&"c")),
            (None, Some(2), Some(3))
        );
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn a_removed_key_frees_its_place() {
        let c = Bounded::new(2);
        c.insert(1, "x");
        c.insert(2, "y");
        c.remove(&1);
        c.insert(3, "z");
        assert!(c.contains(&2) && c.contains(&3) && !c.contains(&1));
        assert_eq!(Bounded::<u8, u8>::new(0).capacity, 1, "at least one");
    }

    #[test]
    fn a_poisoned_lock_is_taken_over() {
        let c = std::sync::Arc::new(Bounded::new(4));
        c.insert("k", 1);
        let c2 = c.clone();
        let _ = std::thread::spawn(move || {
            let _g = c2.inner.lock().unwrap();
            panic!("a panic while holding the lock");
        })
        .join();
        assert!(c.inner.is_poisoned());
        assert_eq!(c.get(&"k"), Some(1));
        c.insert("j", 2);
        assert_eq!(c.len(), 2);
    }
}
