//! The one bounded in-memory cache of the services (plans, header
//! revisions, loop collection chunks, stopped executions): one eviction
//! rule and one way to treat a poisoned lock.
//!
//! - Eviction: oldest insertion first, once more than `capacity` keys are
//!   held, or (a [`Bounded::weighted`] cache) once their weights add up to
//!   more than its budget. Every cache here only saves a read (a miss reads
//!   KV again), so evicting any entry is always correct.
//! - A panic while the lock was held cannot leave an entry half-written
//!   (each operation is one map update), so a poisoned lock is taken over
//!   instead of poisoning every later caller.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// A map of at most `capacity` entries, evicting the oldest insertion.
pub struct Bounded<K, V> {
    capacity: usize,
    /// The most the entries' weights add up to (the newest entry is kept
    /// whatever its weight).
    budget: usize,
    inner: Mutex<Slots<K, V>>,
}

struct Slots<K, V> {
    /// Each value with its weight and the number of its insertion.
    map: HashMap<K, (V, usize, u64)>,
    /// Keys in insertion order, each with the number of that insertion:
    /// a removed key's place stays here until its turn or a compaction
    /// (removing it at once would scan the whole order).
    order: VecDeque<(K, u64)>,
    /// The weights of the entries held, added up.
    weight: usize,
    /// The next insertion's number.
    next: u64,
}

impl<K: Eq + Hash + Clone, V: Clone> Bounded<K, V> {
    /// A cache holding at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self::weighted(capacity, usize::MAX)
    }

    /// A cache holding at most `capacity` entries whose weights (given by
    /// [`Bounded::insert_weighing`]) add up to at most `budget`, but for
    /// the newest entry, which is kept whatever its weight.
    pub fn weighted(capacity: usize, budget: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            budget,
            inner: Mutex::new(Slots {
                map: HashMap::new(),
                order: VecDeque::new(),
                weight: 0,
                next: 0,
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
        self.lock().map.get(key).map(|(v, _, _)| v.clone())
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
        self.insert_weighing(key, value, 0);
    }

    /// Cache `value`, weighing `weight`, under `key` (a key already held
    /// keeps its place in the eviction order); evicts the oldest entries
    /// beyond the capacity or the budget.
    pub fn insert_weighing(&self, key: K, value: V, weight: usize) {
        let mut g = self.lock();
        let g = &mut *g;
        match g.map.get_mut(&key) {
            Some(held) => {
                g.weight -= held.1;
                held.0 = value;
                held.1 = weight;
            }
            None => {
                let n = g.next;
                g.next += 1;
                g.order.push_back((key.clone(), n));
                g.map.insert(key, (value, weight, n));
            }
        }
        g.weight += weight;
        while g.map.len() > self.capacity || (g.weight > self.budget && g.map.len() > 1) {
            let Some((old, n)) = g.order.pop_front() else {
                break;
            };
            // A place left by a removed key (or by an earlier insertion of
            // a key removed and inserted again) is skipped.
            if holds(&g.map, &old, n) {
                if let Some((_, w, _)) = g.map.remove(&old) {
                    g.weight -= w;
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
        let g = &mut *g;
        if let Some((_, w, _)) = g.map.remove(key) {
            g.weight -= w;
            // Places left by removed keys are dropped once they outnumber
            // the keys held, so the order stays within twice the map.
            if g.order.len() > 2 * g.map.len() + 16 {
                let map = &g.map;
                g.order.retain(|(k, n)| holds(map, k, *n));
            }
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

/// True when the place `(key, n)` in the eviction order is `key`'s own:
/// held, and by the insertion numbered `n`.
fn holds<K: Eq + Hash, V>(map: &HashMap<K, (V, usize, u64)>, key: &K, n: u64) -> bool {
    map.get(key).is_some_and(|held| held.2 == n)
}

/// Values derived from shared `Arc<T>`s, found by the address of the
/// value shared (at most `capacity`, evicting the oldest). Each entry
/// holds a weak reference: the allocation stays while the entry does, so
/// no other value can take its address (and `Arc::make_mut` moves a value
/// with weak references out to a new one before changing it).
pub struct ByAddress<T, V> {
    inner: Bounded<usize, (Weak<T>, V)>,
}

impl<T, V: Clone> ByAddress<T, V> {
    /// A cache of at most `capacity` values.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Bounded::new(capacity),
        }
    }

    /// What was derived from `shared`, if cached.
    pub fn get(&self, shared: &Arc<T>) -> Option<V> {
        let (seen, v) = self.inner.get(&(Arc::as_ptr(shared) as usize))?;
        std::ptr::eq(seen.as_ptr(), Arc::as_ptr(shared)).then_some(v)
    }

    /// A cache of at most `capacity` values weighing at most `budget`
    /// ([`ByAddress::insert_weighing`]; the newest is kept whatever it
    /// weighs).
    pub fn weighted(capacity: usize, budget: usize) -> Self {
        Self {
            inner: Bounded::weighted(capacity, budget),
        }
    }

    /// Cache `v`, derived from `shared`.
    pub fn insert(&self, shared: &Arc<T>, v: V) {
        self.insert_weighing(shared, v, 0);
    }

    /// Cache `v`, derived from `shared` and weighing `weight`.
    pub fn insert_weighing(&self, shared: &Arc<T>, v: V, weight: usize) {
        let address = Arc::as_ptr(shared) as usize;
        self.inner
            .insert_weighing(address, (Arc::downgrade(shared), v), weight);
    }
}

#[cfg(test)]
mod tests {
    use super::{Bounded, ByAddress};
    use std::sync::Arc;

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
    fn a_weighted_cache_keeps_its_budget_but_always_the_newest() {
        let c = Bounded::weighted(8, 100);
        c.insert_weighing("a", 1, 40);
        c.insert_weighing("b", 2, 40);
        c.insert_weighing("c", 3, 40); // 120 > 100: "a" goes
        assert_eq!(
            (c.get(&"a"), c.get(&"b"), c.get(&"c")),
            (None, Some(2), Some(3))
        );
        c.insert_weighing("b", 20, 10); // lighter in place: 50
        c.insert_weighing("d", 4, 50); // 100: all stay
        assert_eq!(c.len(), 3);
        c.remove(&"d");
        c.insert_weighing("huge", 5, 500); // over the budget alone: kept, alone
        assert_eq!(c.len(), 1);
        assert_eq!(c.get(&"huge"), Some(5));
        c.insert_weighing("e", 6, 10); // the huge one is the oldest: it goes
        assert_eq!((c.get(&"huge"), c.get(&"e")), (None, Some(6)));
    }

    #[test]
    fn a_key_removed_and_inserted_again_is_evicted_by_its_new_place() {
        let c = Bounded::new(2);
        c.insert("a", 1);
        c.insert("b", 2);
        c.remove(&"a");
        c.insert("a", 10); // now newer than "b"
        c.insert("c", 3); // over: "b" goes, not the new "a"
        assert_eq!(
            (c.get(&"a"), c.get(&"b"), c.get(&"c")),
            (Some(10), None, Some(3))
        );
    }

    #[test]
    fn removed_places_do_not_pile_up() {
        let c = Bounded::new(1000);
        c.insert(0, 0);
        for k in 1..10_000 {
            c.insert(k, k);
            c.remove(&k);
        }
        let g = c.lock();
        assert_eq!(g.map.len(), 1);
        assert!(g.order.len() <= 2 * g.map.len() + 17, "{}", g.order.len());
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

    #[test]
    fn a_value_derived_from_a_shared_one_is_found_by_its_address_only() {
        let by = ByAddress::<String, usize>::new(8);
        let mut shared = Arc::new("abc".to_string());
        by.insert(&shared, 3);
        assert_eq!(by.get(&shared.clone()), Some(3));
        assert_eq!(by.get(&Arc::new("abc".to_string())), None, "an equal one");
        // Changed in place: moved out first (a weak reference is held).
        Arc::make_mut(&mut shared).push('d');
        assert_eq!(by.get(&shared), None);
    }
}
