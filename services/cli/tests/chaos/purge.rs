//! The bucket-purge extra: while services and the server are killed, the
//! KV records of running executions are purged at seeded moments — a
//! whole bucket's records of every running execution of the mix, or one
//! record of one — and every execution must still end exactly once with
//! the `ctx` of a clean run (docs/reliability.md "The chaos suite"). The
//! records purged are the ones the engine rebuilds from the event log
//! (docs/architecture.md "The event log"): the `ctx` record; the header,
//! plan and step records, the step results kept by name, join records and
//! waiters (`<eid>.wait.<signal>`, of the signalled wait);
//! loop runs (a cursor loop's too), their collection chunks, their
//! iterations' claims and checkpoints (`<run>.ckpt.<i>`, folded back by a
//! redelivered command), a cursor loop's frames (`<run>.frame.<seq>`);
//! the execution concurrency records (`exec.*` in the gates bucket). A
//! step record is purged only with its header (whole-bucket purges):
//! alone, nothing notices it before the end.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::Store;
use noetl_mesh::state::{ExecHeader, ExecStatus};
use noetl_mesh::{keys::Keys, kv, Mesh};

use crate::plan::Rng;

/// A bucket the extra purges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bucket {
    /// `ctx`.
    Ctx,
    /// The execution state: headers, plans, step records, results, joins,
    /// waiters.
    Exec,
    /// Loop runs, their chunks, claims and iterations' checkpoints.
    Loop,
    /// The execution concurrency records (`exec.*`: the mix's gated
    /// executions' key), not any one execution's.
    Gates,
}

impl Bucket {
    fn name(self) -> &'static str {
        match self {
            Self::Ctx => "ctx",
            Self::Exec => "exec",
            Self::Loop => "loop",
            Self::Gates => "gates",
        }
    }
}

/// One purge of the schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purge {
    /// Milliseconds after the run's first submission.
    pub at_ms: u64,
    /// Which bucket.
    pub bucket: Bucket,
    /// Every running execution's records in it (else one record of one).
    pub whole: bool,
    /// Picks the execution and record of a single-record purge.
    pub pick: u64,
}

/// The purges of the run with `seed`: one every 400–1,400 ms within
/// `window_ms`, a third of them whole-bucket purges.
pub fn schedule(seed: u64, window_ms: u64) -> Vec<Purge> {
    let mut rng = Rng::new(seed ^ 0x5EED_0FB0_C4E7);
    let mut out = Vec::new();
    let mut at = rng.range(200, 1_000);
    while at < window_ms {
        let bucket = match rng.range(0, 3) {
            0 => Bucket::Ctx,
            1 => Bucket::Exec,
            2 => Bucket::Loop,
            _ => Bucket::Gates,
        };
        let whole = rng.chance(33) || bucket == Bucket::Gates;
        out.push(Purge {
            at_ms: at,
            bucket,
            whole,
            pick: rng.next_u64(),
        });
        at += rng.range(400, 1_400);
    }
    out
}

/// Executions the purger may hit (the mix's, as they are submitted).
pub type Targets = Arc<Mutex<Vec<String>>>;

/// Records purged, by `<bucket> <whole|key>`.
pub type Tally = BTreeMap<String, usize>;

/// Run `purges` against the running executions of `targets`, from `t0`.
/// A purge that fails (the server is down) is skipped: it is a fault, not
/// a check.
pub fn spawn(
    mesh: Mesh,
    targets: Targets,
    purges: Vec<Purge>,
    t0: Instant,
) -> tokio::task::JoinHandle<Tally> {
    tokio::spawn(async move {
        let mut tally = Tally::new();
        for p in purges {
            let due = t0 + Duration::from_millis(p.at_ms);
            tokio::time::sleep(due.saturating_duration_since(Instant::now())).await;
            let eids = targets.lock().expect("targets").clone();
            let purged = purge(&mesh, &eids, &p).await;
            let scope = if p.whole { "whole" } else { "key" };
            *tally
                .entry(format!("{} {scope}", p.bucket.name()))
                .or_default() += purged;
        }
        tally
    })
}

/// Apply one purge: how many records it removed.
async fn purge(mesh: &Mesh, eids: &[String], p: &Purge) -> usize {
    let mut running = Vec::new();
    for eid in eids {
        let header: Option<ExecHeader> = mesh.exec_header(eid).await.ok().flatten();
        if header.is_some_and(|h| h.status == ExecStatus::Running) {
            running.push(eid.clone());
        }
    }
    if running.is_empty() {
        return 0;
    }
    let store = match p.bucket {
        Bucket::Ctx => mesh.ctx_kv(),
        Bucket::Exec => mesh.exec_kv(),
        Bucket::Loop => mesh.loop_kv(),
        Bucket::Gates => return purge_gates(mesh.gates_kv()).await,
    };
    let chosen: Vec<String> = if p.whole {
        running
    } else {
        vec![running[(p.pick % running.len() as u64) as usize].clone()]
    };
    let mut keys = Vec::new();
    for eid in &chosen {
        keys.extend(rebuilt_keys(store, p.bucket, eid).await);
    }
    if !p.whole {
        // A step record lost alone is not noticed by the services (nothing
        // reads it before the end; `noetl admin rebuild` writes it back):
        // one-record purges take the others.
        keys.retain(|k| !k.contains(".step."));
    }
    if !p.whole && !keys.is_empty() {
        let one = keys[((p.pick >> 17) % keys.len() as u64) as usize].clone();
        keys = vec![one];
    }
    let mut purged = 0;
    for key in keys {
        if store.purge(&key).await.is_ok() {
            purged += 1;
        }
    }
    purged
}

/// Purge every execution concurrency record (`exec.*`): how many.
async fn purge_gates(store: &Store) -> usize {
    let keys = kv::keys_under(store, "exec").await.unwrap_or_default();
    let mut purged = 0;
    for key in keys {
        if store.purge(&key).await.is_ok() {
            purged += 1;
        }
    }
    purged
}

/// The keys of `eid` in `bucket` that the engine rebuilds from the log.
async fn rebuilt_keys(store: &Store, bucket: Bucket, eid: &str) -> Vec<String> {
    let under = kv::keys_under(store, eid).await.unwrap_or_default();
    let mut out = Vec::new();
    if matches!(bucket, Bucket::Ctx | Bucket::Exec)
        && kv::get::<serde_json::Value>(store, eid)
            .await
            .ok()
            .flatten()
            .is_some()
    {
        out.push(eid.to_string()); // the `ctx` record, or the header
    }
    for key in under {
        let rest = &key[eid.len() + 1..];
        let parts: Vec<&str> = rest.split('.').collect();
        let rebuilt = match bucket {
            // A parallel loop run's write-once claims.
            Bucket::Ctx => parts[0] == "owners",
            Bucket::Gates => false,
            Bucket::Exec => {
                key == Keys::plan(eid) || matches!(parts[0], "step" | "result" | "join" | "wait")
            }
            // The run record, its chunks, its claims, its iterations'
            // checkpoints and a cursor loop's frames (not carries).
            Bucket::Loop => {
                parts.len() == 1
                    || (parts.len() == 3 && matches!(parts[1], "items" | "it" | "ckpt" | "frame"))
            }
        };
        if rebuilt {
            out.push(key);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_purges_over_every_bucket() {
        assert_eq!(schedule(7, 10_000), schedule(7, 10_000));
        assert_ne!(schedule(7, 10_000), schedule(8, 10_000));
        let all: Vec<Purge> = (0..50).flat_map(|s| schedule(s, 10_000)).collect();
        for b in [Bucket::Ctx, Bucket::Exec, Bucket::Loop] {
            for whole in [true, false] {
                assert!(all.iter().any(|p| p.bucket == b && p.whole == whole));
            }
        }
        let gates = all.iter().filter(|p| p.bucket == Bucket::Gates);
        assert!(gates.clone().count() > 0 && gates.clone().all(|p| p.whole));
        assert!(all.iter().all(|p| p.at_ms < 10_000));
    }
}
