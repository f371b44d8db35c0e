//! How long an execution's events are kept (docs/operations.md
//! "Retention"). The event stream has no age limit of its own: an event is
//! never dropped while its execution is not terminal. A terminal execution
//! whose end is older than `NOETL_EVENTS_MAX_AGE_S` goes whole: its events
//! and, first, its KV state, so that events are kept at least as long as
//! the state they determine. Which executions have expired is a plain
//! function ([`expired`]) of their `execution.*` events; the router sweeps
//! ([`Mesh::sweep_retention`]) every `NOETL_RETENTION_SWEEP_S`.

use std::collections::BTreeMap;

use noetl_wire::Event;

use crate::event_type::EventType;
use crate::{Mesh, MeshError};

/// The executions among `events` (their `execution.*` events, in stream
/// order) whose last word is a terminal event older than `max_age_ms`
/// before `now_ms`: an `execution.resumed` after it makes the execution
/// run again. Sorted by id.
pub fn expired<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    now_ms: u64,
    max_age_ms: u64,
) -> Vec<String> {
    let mut ended: BTreeMap<&str, Option<u64>> = BTreeMap::new();
    for ev in events {
        let Some(t) = EventType::parse(&ev.event_type) else {
            continue;
        };
        let at = match t {
            EventType::ExecutionCompleted
            | EventType::ExecutionFailed
            | EventType::ExecutionCancelled => Some(ev.ts_ms),
            EventType::ExecutionResumed => None,
            _ => continue,
        };
        ended.insert(ev.execution_id.as_str(), at);
    }
    ended
        .into_iter()
        .filter_map(|(id, at)| {
            at.filter(|t| t.saturating_add(max_age_ms) <= now_ms)
                .map(|_| id.to_string())
        })
        .collect()
}

/// What a retention sweep removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// The executions removed, by id.
    pub executions: Vec<String>,
    /// Events removed in all.
    pub events: u64,
}

impl Mesh {
    /// The terminal executions whose events have outlived
    /// `NOETL_EVENTS_MAX_AGE_S` ([`expired`]).
    pub async fn expired_executions(&self, now_ms: u64) -> Result<Vec<String>, MeshError> {
        let filter = self.subjects().events_matching(None, "execution.>");
        let read = self.stored_events_from(&filter, None).await?;
        let events: Vec<Event> = read.into_iter().filter_map(|(_, e)| e.ok()).collect();
        let max_age_ms = self.config().events_max_age.as_millis() as u64;
        Ok(expired(&events, now_ms, max_age_ms))
    }

    /// Remove execution `eid` whole: its KV state first
    /// ([`Mesh::forget_execution`]), then its events. Returns the number
    /// of events removed.
    pub async fn drop_execution(&self, eid: &str) -> Result<u64, MeshError> {
        self.forget_execution(eid).await?;
        let stream_name = self.subjects().events_stream();
        let failed = |e: &dyn std::fmt::Display| MeshError::Consume {
            consumer: format!("purge of {}", self.subjects().events_of(eid)),
            message: e.to_string(),
        };
        let stream = self
            .js()
            .get_stream(&stream_name)
            .await
            .map_err(|e| failed(&e))?;
        let purged = stream
            .purge()
            .filter(self.subjects().events_of(eid))
            .await
            .map_err(|e| failed(&e))?;
        Ok(purged.purged)
    }

    /// Remove every execution whose events have expired; one that fails
    /// is logged and left for the next sweep.
    pub async fn sweep_retention(&self, now_ms: u64) -> Result<Swept, MeshError> {
        let mut swept = Swept::default();
        for eid in self.expired_executions(now_ms).await? {
            match self.drop_execution(&eid).await {
                Ok(n) => {
                    swept.events += n;
                    swept.executions.push(eid);
                }
                Err(e) => {
                    tracing::warn!(execution_id = %eid, error = %e, "retention: could not remove an expired execution; the next sweep tries again")
                }
            }
        }
        Ok(swept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(eid: &str, t: &str, ts_ms: u64) -> Event {
        Event {
            execution_id: eid.into(),
            event_type: t.into(),
            ts_ms,
            ..Default::default()
        }
    }

    #[test]
    fn only_executions_that_ended_long_enough_ago_and_stayed_ended_expire() {
        let events = [
            ev("old", "execution.completed", 100),
            ev("failed_old", "execution.failed", 50),
            ev("recent", "execution.cancelled", 950),
            ev("running", "execution.paused", 10),
            ev("resumed", "execution.failed", 10),
            ev("resumed", "execution.resumed", 20),
            ev("ended_again", "execution.failed", 10),
            ev("ended_again", "execution.resumed", 20),
            ev("ended_again", "execution.completed", 30),
        ];
        assert_eq!(
            expired(&events, 1000, 500),
            ["ended_again", "failed_old", "old"]
        );
        assert!(expired(&events, 1000, 10_000).is_empty());
    }
}
