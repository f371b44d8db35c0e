//! Group commit of iteration reports: the reports of one loop run handled
//! at the same time in this process are counted by one compare-and-set on
//! the run's record instead of one each (each of which would otherwise
//! retry against the others on the same key).
//!
//! The first handler to arrive for a run writes for every report queued
//! behind it, round after round while more arrive (up to a few rounds, so
//! its own message is acked in good time); each handler gets back what its
//! own report did, and acks its message only after the write that counted
//! it. If a shared write fails, each handler's reports in it fall back to
//! a write of their own, so an error is never lost nor shared (and the
//! iterations they put in flight are cut into batches together, as in the
//! shared write: `state::batches`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use noetl_core::reduce::ReducerOp;
use noetl_mesh::{
    kv::{self, Cas},
    Mesh, MeshError,
};
use tokio::sync::oneshot;

use crate::state::{count_batch, Arrival, Claim, Counted, LoopRun};

/// Rounds a leader writes for others before it hands the rest back.
const MAX_ROUNDS: usize = 8;

/// One report waiting to be counted.
struct Waiting {
    index: u64,
    claim: Claim,
    /// The last of its handler's reports: the one whose run it reads.
    viewed: bool,
    /// `None`: the shared write failed; write alone.
    reply: oneshot::Sender<Option<Counted>>,
}

#[derive(Default)]
struct Queue {
    /// A leader is writing for this run.
    busy: bool,
    waiting: Vec<Waiting>,
}

/// What every report of one run shares.
pub(crate) struct Run<'a> {
    /// The run's key in the loop bucket.
    pub key: &'a str,
    pub fail_fast: bool,
    pub reducers: &'a [(String, ReducerOp)],
    pub step: &'a str,
    /// Iterations per batch at most (1 for a step whose commands go one
    /// at a time): what the iterations a count puts in flight are cut
    /// into ([`crate::messages::batch_size`]).
    pub batch: usize,
}

impl Run<'_> {
    /// Report `index` (`claim`) as counted in a write; `viewed`: its
    /// handler reads the run after it ([`Arrival::viewed`]).
    fn arrival<'b>(&'b self, index: u64, claim: &'b Claim, viewed: bool) -> Arrival<'b> {
        Arrival {
            index,
            claim,
            viewed,
            fail_fast: self.fail_fast,
            reducers: self.reducers,
            step: self.step,
        }
    }
}

/// The reports waiting per loop run (one per process and mesh, shared by
/// the handlers).
pub(crate) struct Counter {
    runs: Mutex<HashMap<String, Queue>>,
    /// Each run's record as this process last wrote it: a leader writes
    /// at that revision without reading first, and reads only when
    /// another writer moved the record since (the write then fails).
    written: kv::RevisionCache<LoopRun>,
}

impl Default for Counter {
    fn default() -> Self {
        Self {
            runs: Mutex::default(),
            written: kv::RevisionCache::new(RUNS_REMEMBERED),
        }
    }
}

/// Loop runs whose last written record a loop-supervisor remembers.
const RUNS_REMEMBERED: usize = 1024;

impl Counter {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Count reports `reports` (index and claim) of `run`, each once
    /// (queued at once, so one write counts them all, with the reports of
    /// the run other handlers queued meanwhile); `None` when the run is
    /// unknown.
    pub(crate) async fn count_many(
        &self,
        mesh: &Mesh,
        run: &Run<'_>,
        reports: &[(u64, Claim)],
    ) -> Result<Option<Vec<Counted>>, MeshError> {
        let mut answers = Vec::with_capacity(reports.len());
        let lead = {
            let mut runs = self.lock();
            let q = runs.entry(run.key.to_string()).or_default();
            for (k, (index, claim)) in reports.iter().enumerate() {
                let (reply, answer) = oneshot::channel();
                q.waiting.push(Waiting {
                    index: *index,
                    claim: claim.clone(),
                    viewed: k + 1 == reports.len(),
                    reply,
                });
                answers.push(answer);
            }
            !std::mem::replace(&mut q.busy, true)
        };
        if lead {
            let mut guard = Leader {
                counter: self,
                key: run.key,
            };
            guard.write_rounds(mesh, run).await;
        }
        let mut out: Vec<Option<Counted>> = Vec::with_capacity(reports.len());
        for answer in answers {
            out.push(answer.await.ok().flatten());
        }
        // The shared write failed (or its leader is gone, or handed these
        // back after its last round): this handler's reports left are
        // written together, so the iterations they put in flight are cut
        // into batches together, as in a shared write.
        let mut left: Vec<Arrival<'_>> = (out.iter().zip(reports))
            .filter(|(c, _)| c.is_none())
            .map(|(_, (index, claim))| run.arrival(*index, claim, false))
            .collect();
        if let Some(last) = left.last_mut() {
            last.viewed = true;
        }
        if !left.is_empty() {
            let Some(alone) = write_batch(mesh, &self.written, run, &left).await? else {
                return Ok(None);
            };
            let mut alone = alone.into_iter();
            for c in out.iter_mut().filter(|c| c.is_none()) {
                *c = alone.next();
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// The handler writing for a run; on drop (done, or its task gone) the
/// reports still queued are handed back to write alone.
struct Leader<'a> {
    counter: &'a Counter,
    key: &'a str,
}

impl Leader<'_> {
    async fn write_rounds(&mut self, mesh: &Mesh, run: &Run<'_>) {
        for _ in 0..MAX_ROUNDS {
            let batch = {
                let mut runs = self.counter.lock();
                match runs.get_mut(self.key) {
                    Some(q) if !q.waiting.is_empty() => std::mem::take(&mut q.waiting),
                    _ => return,
                }
            };
            let arrivals: Vec<Arrival<'_>> = batch
                .iter()
                .map(|w| run.arrival(w.index, &w.claim, w.viewed))
                .collect();
            match write_batch(mesh, &self.counter.written, run, &arrivals).await {
                Ok(Some(results)) => {
                    for (w, c) in batch.into_iter().zip(results) {
                        let _ = w.reply.send(Some(c));
                    }
                }
                // Unknown run, or the write failed: each finds out alone.
                Ok(None) | Err(_) => {
                    for w in batch {
                        let _ = w.reply.send(None);
                    }
                }
            }
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut runs = self.counter.lock();
        if let Some(q) = runs.remove(self.key) {
            for w in q.waiting {
                let _ = w.reply.send(None);
            }
        }
    }
}

/// One compare-and-set counting every report of `batch`, in order, from
/// the record as `written` last (read only when that is stale); `None`
/// when the run is unknown.
async fn write_batch(
    mesh: &Mesh,
    written: &kv::RevisionCache<LoopRun>,
    run: &Run<'_>,
    batch: &[Arrival<'_>],
) -> Result<Option<Vec<Counted>>, MeshError> {
    let mut results = Vec::new();
    let stored = kv::update_cached(mesh.loop_kv(), run.key, written, |r: Option<&LoopRun>| {
        results.clear();
        let Some(r) = r else { return Cas::Keep };
        let size = crate::messages::window_batch(r.max_in_flight, run.batch);
        let (next, each) = count_batch(r, batch, size);
        results = each;
        match next {
            Some(next) => Cas::Write(next),
            None => Cas::Keep,
        }
    })
    .await?;
    Ok(stored.map(|_| results))
}
