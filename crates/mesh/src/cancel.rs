//! Which executions were stopped (cancelled, or failed) as this process has
//! heard: every mesh endpoint listens to `<p>.evt.*.execution.cancelled`
//! and `<p>.evt.*.execution.failed` (plain subscriptions to the events
//! JetStream also stores), so executors, schedulers and loop-supervisors
//! start no more work for an execution that has ended that way (no further
//! task of a failed execution's other branches runs, with its side
//! effects), without a KV read per message.
//!
//! A replica started after a cancellation has not heard of it; the router
//! still ignores every boundary event of a cancelled execution, so at most
//! the step-runs already dispatched run to their end.
//!
//! A resumed execution (`execution.resumed`, docs/operations.md) is
//! forgotten again, with its cached plan (a resume may change it). A
//! process that missed that event finds out from the header before it
//! drops any work: [`crate::Mesh::still_stopped`].

use std::sync::Arc;

use futures::StreamExt;

/// Executions remembered at most (oldest forgotten first).
pub const REMEMBERED: usize = 100_000;

/// The cancelled or failed executions this process knows of.
pub struct Cancellations {
    inner: crate::cache::Bounded<String, ()>,
}

impl Default for Cancellations {
    fn default() -> Self {
        Self {
            inner: crate::cache::Bounded::new(REMEMBERED),
        }
    }
}

impl Cancellations {
    /// True when `eid` was cancelled or failed: start no more work for it.
    pub fn is_stopped(&self, eid: &str) -> bool {
        self.inner.contains(eid)
    }

    /// Remember `eid` as stopped.
    pub fn insert(&self, eid: &str) {
        self.inner.insert(eid.to_string(), ());
    }

    /// Forget `eid` (it was resumed).
    pub fn forget(&self, eid: &str) {
        self.inner.remove(eid);
    }
}

/// What [`watch`] listens to.
pub(crate) struct Watched {
    /// Subjects of the events that stop an execution.
    pub stopped: Vec<String>,
    /// The subject of `execution.resumed`.
    pub resumed: String,
    /// The plans this process caches (a resumed execution's is dropped).
    pub plans: Arc<crate::plan::PlanCache>,
}

/// Start listening; the tasks end when the client closes.
pub(crate) async fn watch(
    client: &async_nats::Client,
    names: &crate::subjects::Subjects,
    watched: Watched,
) -> Result<Arc<Cancellations>, crate::MeshError> {
    let set = Arc::new(Cancellations::default());
    let resumed = watched.resumed.clone();
    for subject in watched.stopped.into_iter().chain([resumed.clone()]) {
        let names = names.clone();
        let mut sub =
            client
                .subscribe(subject.clone())
                .await
                .map_err(|e| crate::MeshError::Setup {
                    what: format!("subscription {subject}"),
                    message: e.to_string(),
                })?;
        let s = set.clone();
        let plans = watched.plans.clone();
        let resumes = subject == resumed;
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                // <p>.evt.<eid>.execution.<cancelled|failed|resumed>
                let Some(eid) = names
                    .parse(msg.subject.as_str())
                    .and_then(|p| p.execution())
                else {
                    continue;
                };
                if resumes {
                    s.forget(eid);
                    plans.forget(eid);
                } else {
                    s.insert(eid);
                }
            }
        });
    }
    Ok(set)
}

impl crate::Mesh {
    /// Ask the router to cancel `eid` (idempotent; its children follow).
    pub async fn request_cancel(&self, eid: &str, reason: &str) -> Result<(), crate::MeshError> {
        // After a resume, a cancellation is another request than the one
        // that may have stopped it before (a header purged meanwhile is
        // written back from the events first: read as none, the resume
        // count would be 0, and the request would carry the id of the
        // cancel before the resume, dropped as its copy).
        let nth = match crate::rebuild::running_header(self, eid).await? {
            Some(h) if h.resumes > 0 => h.resumes.to_string(),
            _ => String::new(),
        };
        let ev = crate::events::EventDraft {
            execution_id: eid,
            discriminator: &nth,
            ..Default::default()
        }
        .build(&crate::payloads::CancelRequested {
            reason: reason.to_string(),
        });
        self.emit(&ev).await?.wait().await
    }

    /// True when `eid` stopped (cancelled or failed) and was not resumed
    /// since: this process's set says so, and the header agrees (one read,
    /// only for executions the set holds). A resumed execution is
    /// forgotten, with its cached plan.
    pub async fn still_stopped(&self, eid: &str) -> Result<bool, crate::MeshError> {
        if !self.cancellations().is_stopped(eid) {
            return Ok(false);
        }
        match self.exec_header(eid).await? {
            Some(h) if !h.status.is_terminal() => {
                self.cancellations().forget(eid);
                self.plans().forget(eid);
                Ok(false)
            }
            _ => Ok(true),
        }
    }
}
