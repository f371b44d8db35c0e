//! When executions end, seen as they end: a core NATS subscription to the
//! terminal events, so a scenario's clock stops at the event and not at
//! the next poll of the header.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use noetl_mesh::{event_type::EventType, Mesh};
use tokio::sync::Notify;

/// Terminal events seen so far, by execution.
#[derive(Clone)]
pub struct Ends {
    seen: Arc<Mutex<HashMap<String, (Instant, String)>>>,
    notify: Arc<Notify>,
}

impl Ends {
    /// Start watching `mesh`'s executions (before submitting any).
    pub async fn watch(mesh: &Mesh) -> Self {
        let subject = format!("{}.evt.*.execution.*", mesh.config().prefix);
        let mut sub = mesh
            .client()
            .subscribe(subject)
            .await
            .expect("subscribe to execution events");
        mesh.client().flush().await.expect("flush the subscription");
        let ends = Self {
            seen: Arc::default(),
            notify: Arc::default(),
        };
        let me = ends.clone();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let at = Instant::now();
                let Ok(ev) = noetl_mesh::events::decode(&m) else {
                    continue;
                };
                let terminal = [
                    EventType::ExecutionCompleted.wire_name(),
                    EventType::ExecutionFailed.wire_name(),
                    EventType::ExecutionCancelled.wire_name(),
                ];
                if terminal.contains(&ev.event_type.as_str()) {
                    me.seen
                        .lock()
                        .expect("ends lock")
                        .entry(ev.execution_id)
                        .or_insert((at, ev.event_type));
                    me.notify.notify_waiters();
                }
            }
        });
        ends
    }

    /// When `eid` ended; panics if it did not end within `timeout` or did
    /// not complete.
    pub async fn wait(&self, eid: &str, timeout: Duration) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            if let Some((at, t)) = self.seen.lock().expect("ends lock").get(eid) {
                assert_eq!(
                    t,
                    EventType::ExecutionCompleted.wire_name(),
                    "execution {eid} ended {t}"
                );
                return *at;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "execution {eid} did not end within {timeout:?}"
            );
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), notified).await;
        }
    }
}
