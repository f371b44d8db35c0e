//! This replica's view of execution status: the headers and step records
//! of the exec bucket, followed with one KV watch, so a status read
//! (`GET /api/executions/{id}/status`, what clients poll) costs no
//! round trip to JetStream.
//!
//! The view only answers for an execution it holds *completely*: one
//! whose header and step records it read once (a batched get) while the
//! watch ran. The watch applies every later write (each key keeps its
//! highest revision, so a read and the watch may land in either order);
//! a write the watch delivers for an execution not yet read is kept too,
//! and completed by that first read. When the watch ends (a disconnect),
//! the view is emptied and a new watch starts: reads go to JetStream
//! until executions are read again. A view is at most the watch's delay
//! (milliseconds) behind the bucket. It holds at most [`CAPACITY`]
//! executions, the oldest forgotten first. A second view follows the
//! `ctx` records the same way ([`follow_ctx`]): the status answer's
//! `variables`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv::{Operation, Store};
use bytes::Bytes;
use futures::StreamExt;
use noetl_mesh::Mesh;
use tokio_util::sync::CancellationToken;

/// Executions held at most.
pub const CAPACITY: usize = 20_000;

/// What a key of the exec bucket is to the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part<'a> {
    /// `<eid>`: a header.
    Header(&'a str),
    /// `<eid>.step.<name>`: a step record.
    Step(&'a str),
}

/// The part of the view a key is, if any.
pub fn part_of(key: &str) -> Option<Part<'_>> {
    match key.split_once('.') {
        None => Some(Part::Header(key)),
        Some((eid, rest)) if rest.starts_with("step.") => Some(Part::Step(eid)),
        Some(_) => None,
    }
}

/// One execution in the view.
#[derive(Debug, Default, Clone)]
struct Entry {
    /// Read once completely (by a batched get while the watch ran).
    complete: bool,
    /// Key → (value, revision); a deleted key is absent.
    keys: HashMap<String, (Bytes, u64)>,
}

impl Entry {
    /// Keep `value` at `revision` unless a later revision is held.
    fn apply(&mut self, key: &str, value: Option<Bytes>, revision: u64) {
        if self.keys.get(key).is_some_and(|(_, r)| *r >= revision) {
            return;
        }
        match value {
            Some(v) => {
                self.keys.insert(key.to_string(), (v, revision));
            }
            None => {
                self.keys.remove(key);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    order: VecDeque<String>,
}

impl Inner {
    fn entry(&mut self, eid: &str) -> &mut Entry {
        if !self.entries.contains_key(eid) {
            if self.order.len() >= CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.entries.remove(&old);
                }
            }
            self.order.push_back(eid.to_string());
        }
        self.entries.entry(eid.to_string()).or_default()
    }
}

/// The view (shared by every request of the replica).
#[derive(Debug, Default)]
pub struct StatusView {
    inner: Mutex<Inner>,
    /// The watch runs: writes since its start are applied.
    following: AtomicBool,
    /// Bumped each time the view is emptied: a read begun before must not
    /// complete an entry after.
    generation: AtomicU64,
}

/// An execution's keys, as the view holds them.
pub type Keys = HashMap<String, (Bytes, u64)>;

impl StatusView {
    /// The current generation, to pass to [`StatusView::complete`] after a
    /// read begun now.
    pub fn generation(&self) -> Option<u64> {
        self.following
            .load(Ordering::Acquire)
            .then(|| self.generation.load(Ordering::Acquire))
    }

    /// The keys of `eid`, when the view holds it completely.
    pub fn read(&self, eid: &str) -> Option<Keys> {
        self.held(eid, |e| e.keys.clone())
    }

    /// Whether the view holds `eid` completely ([`StatusView::read`]
    /// would answer), without copying its keys.
    pub fn holds(&self, eid: &str) -> bool {
        self.held(eid, |_| ()).is_some()
    }

    /// `f` of `eid`'s entry, when the view holds it completely.
    fn held<T>(&self, eid: &str, f: impl FnOnce(&Entry) -> T) -> Option<T> {
        if !self.following.load(Ordering::Acquire) {
            return None;
        }
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entries.get(eid).filter(|e| e.complete).map(f)
    }

    /// A write the watch delivered.
    pub fn apply(&self, key: &str, value: Option<Bytes>, revision: u64) {
        let eid = match part_of(key) {
            Some(Part::Header(eid) | Part::Step(eid)) => eid,
            None => return,
        };
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entry(eid).apply(key, value, revision);
    }

    /// A batched read of `eid`'s header and step records, begun at
    /// `generation`: merged in, and the entry complete from now on (unless
    /// the view was emptied meanwhile).
    pub fn complete(&self, eid: &str, generation: u64, values: &[(String, Bytes, u64)]) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if self.generation.load(Ordering::Acquire) != generation
            || !self.following.load(Ordering::Acquire)
        {
            return;
        }
        let entry = inner.entry(eid);
        for (key, value, revision) in values {
            entry.apply(key, Some(value.clone()), *revision);
        }
        entry.complete = true;
    }

    /// The watch started (`true`) or ended (`false`: the view is emptied).
    fn following(&self, on: bool) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if !on {
            inner.entries.clear();
            inner.order.clear();
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        self.following.store(on, Ordering::Release);
    }
}

/// Follow the exec bucket's headers and step records into `view` until
/// `shutdown`; a watch that ends is started again after a second.
pub fn follow(mesh: Mesh, view: Arc<StatusView>, shutdown: CancellationToken) {
    follow_bucket(mesh.exec_kv().clone(), &["*", "*.step.>"], view, shutdown);
}

/// Follow the `ctx` records (`<eid>` keys of the ctx bucket, not the
/// loop runs' owner claims) into `view`, the same way: a status read's
/// `variables` then costs no round trip either.
pub fn follow_ctx(mesh: Mesh, view: Arc<StatusView>, shutdown: CancellationToken) {
    follow_bucket(mesh.ctx_kv().clone(), &["*"], view, shutdown);
}

fn follow_bucket(
    store: Store,
    patterns: &'static [&'static str],
    view: Arc<StatusView>,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            match store.watch_many(patterns.iter().copied()).await {
                Ok(mut watch) => {
                    view.following(true);
                    loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            next = watch.next() => match next {
                                Some(Ok(e)) => {
                                    let value = (e.operation == Operation::Put).then_some(e.value);
                                    view.apply(&e.key, value, e.revision);
                                }
                                _ => break,
                            },
                        }
                    }
                    view.following(false);
                    tracing::warn!(
                        bucket = %store.name,
                        "the status view's watch ended; reading from JetStream until it runs again"
                    );
                }
                Err(e) => {
                    tracing::warn!(bucket = %store.name, error = %e, "cannot watch a bucket for the status view; retrying")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> StatusView {
        let v = StatusView::default();
        v.following(true);
        v
    }

    #[test]
    fn keys_are_headers_step_records_or_nothing() {
        assert_eq!(part_of("e1"), Some(Part::Header("e1")));
        assert_eq!(part_of("e1.step.load"), Some(Part::Step("e1")));
        assert_eq!(part_of("e1.plan"), None);
        assert_eq!(part_of("e1.result.load"), None);
    }

    #[test]
    fn an_execution_answers_once_read_and_keeps_the_latest_revision_either_way() {
        let v = on();
        v.apply("e1", Some("h2".into()), 20);
        assert!(v.read("e1").is_none(), "not read completely yet");
        let g = v.generation().unwrap();
        // The read saw an older header and a step the watch never sent.
        v.complete(
            "e1",
            g,
            &[
                ("e1".into(), "h1".into(), 10),
                ("e1.step.a".into(), "a1".into(), 11),
            ],
        );
        let keys = v.read("e1").unwrap();
        assert_eq!(
            keys["e1"].0,
            Bytes::from("h2"),
            "the watch's later write stands"
        );
        assert_eq!(keys["e1.step.a"].0, Bytes::from("a1"));
        v.apply("e1.step.a", Some("a2".into()), 30);
        v.apply("e1.step.a", Some("stale".into()), 25);
        assert_eq!(v.read("e1").unwrap()["e1.step.a"].0, Bytes::from("a2"));
        v.apply("e1", None, 40);
        assert!(
            !v.read("e1").unwrap().contains_key("e1"),
            "a deleted header is gone"
        );
    }

    #[test]
    fn a_view_emptied_during_a_read_is_not_completed_by_it() {
        let v = on();
        let g = v.generation().unwrap();
        v.following(false);
        v.following(true);
        v.complete("e1", g, &[("e1".into(), "h".into(), 1)]);
        assert!(v.read("e1").is_none());
        v.following(false);
        assert!(
            v.generation().is_none(),
            "not following: no reads from the view"
        );
    }
}
