//! The log a lost loop run is folded from, never held whole: one pass
//! keeps the few events the fold looks up ([`from_log::looked_up`]), and
//! each pass over a run's own events reads the log anew, a chunk at a
//! time ([`LogReader`]), through the message the first pass read last. A
//! run of a million iterations is about 30,000 stored messages; held, they
//! grew the loop-supervisor by 0.45–0.8 KB per iteration
//! (docs/reliability.md "A lost loop run of a long loop").
//!
//! The fold is plain code over iterators ([`from_log`]); it runs on a
//! blocking thread ([`Streamed::fold`]), pulling each pass's events from a
//! task that reads them, a few at a time.

use std::sync::{Arc, Mutex};

use noetl_mesh::{replay::LogReader, Mesh, MeshError};
use noetl_wire::Event;
use tokio::sync::mpsc;

use crate::state::from_log::{self, Own, RunLog, Stored};

/// Events a pass reads ahead of the fold.
const AHEAD: usize = 256;

/// An execution's log as a [`RunLog`]: its looked-up events held, its
/// runs' own events streamed. A clone reads the same log.
#[derive(Clone)]
pub(crate) struct Streamed {
    mesh: Mesh,
    eid: String,
    /// The last message the first pass read: every pass stops there.
    through: u64,
    events: Vec<Event>,
    seqs: Vec<u64>,
    runtime: tokio::runtime::Handle,
    /// The first failed read of a pass, which ended that pass early.
    failed: Arc<Mutex<Option<MeshError>>>,
}

impl Streamed {
    /// Read execution `eid`'s log once, keeping the events a fold looks
    /// up.
    pub(crate) async fn read(mesh: &Mesh, eid: &str) -> Result<Self, MeshError> {
        // The looked-up types are never carried inside another event: a
        // message of another type is passed over without unfolding it.
        let mut reader = LogReader::of(mesh, eid).stored_where(from_log::looked_up);
        let (mut events, mut seqs) = (Vec::new(), Vec::new());
        while let Some(l) = reader.next().await? {
            if from_log::looked_up(&l.event) {
                events.push(l.event);
                seqs.push(l.seq);
            }
        }
        Ok(Self {
            mesh: mesh.clone(),
            eid: eid.to_string(),
            through: reader.read_through(),
            events,
            seqs,
            runtime: tokio::runtime::Handle::current(),
            failed: Arc::default(),
        })
    }

    /// `fold` over this log, run on a blocking thread; a read that failed
    /// while it ran is the answer instead of what it folded.
    pub(crate) async fn fold<T: Send + 'static>(
        self,
        fold: impl FnOnce(&dyn RunLog) -> T + Send + 'static,
    ) -> Result<T, MeshError> {
        let failed = self.failed.clone();
        let out = tokio::task::spawn_blocking(move || fold(&self))
            .await
            .map_err(|e| MeshError::Invalid(format!("the fold of a loop run stopped: {e}")))?;
        let failed = failed.lock().map(|mut f| f.take());
        match failed {
            Ok(Some(e)) => Err(e),
            _ => Ok(out),
        }
    }
}

impl RunLog for Streamed {
    fn events(&self) -> (&[Event], &[u64]) {
        (&self.events, &self.seqs)
    }

    fn own(&self, srid: &str, before: Option<u64>, stored: Stored) -> Own<'_> {
        let (tx, mut rx) = mpsc::channel(AHEAD);
        let (mesh, eid, srid) = (self.mesh.clone(), self.eid.clone(), srid.to_string());
        let through = before.map_or(self.through, |b| self.through.min(b.saturating_sub(1)));
        let failed = self.failed.clone();
        self.runtime.spawn(async move {
            let run = srid.clone();
            let mut reader = LogReader::of(&mesh, &eid)
                .through(through)
                .stored_where(move |e| e.step_run_id == run && stored(e));
            loop {
                match reader.next().await {
                    // The events a message stands for carry its step-run.
                    Ok(Some(l)) if l.event.step_run_id == srid => {
                        if tx.send((l.seq, l.event)).await.is_err() {
                            return; // the fold has read what it needs
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return,
                    Err(e) => {
                        if let Ok(mut f) = failed.lock() {
                            f.get_or_insert(e);
                        }
                        return;
                    }
                }
            }
        });
        Box::new(std::iter::from_fn(move || rx.blocking_recv()))
    }
}
