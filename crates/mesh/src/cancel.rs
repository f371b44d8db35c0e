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
}

/// Start listening; the task ends when the client closes.
pub(crate) async fn watch(
    client: &async_nats::Client,
    names: &crate::subjects::Subjects,
    subjects: Vec<String>,
) -> Result<Arc<Cancellations>, crate::MeshError> {
    let set = Arc::new(Cancellations::default());
    for subject in subjects {
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
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                // <p>.evt.<eid>.execution.<cancelled|failed>
                if let Some(eid) = names
                    .parse(msg.subject.as_str())
                    .and_then(|p| p.execution())
                {
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
        let ev = crate::events::EventDraft {
            event_type: crate::events::types::EXECUTION_CANCEL_REQUESTED,
            execution_id: eid,
            payload: crate::payloads::to_value(&crate::payloads::CancelRequested {
                reason: reason.to_string(),
            }),
            ..Default::default()
        }
        .build();
        self.emit(&ev).await?.wait().await
    }
}
