//! Tasks of a kind no executor serves (docs/architecture.md, "A kind no
//! executor serves").
//!
//! Whoever publishes a task command (scheduler, loop-supervisor, an
//! executor handing a pipeline to another kind) asks whether an executor
//! serves the kind: whether the kind's work consumer (`executor-<kind>`)
//! exists and is in use (an executor waits on it, holds a message of it,
//! or created it or took a message from it within the wait). When it is
//! not, the publisher emits a `task.unserved` timer into
//! `NOETL_EVENTS`, due `NOETL_EXECUTOR_WAIT_MS` later; the router's timer
//! consumer asks again when it is due and fails the step-run with error
//! kind `executor.unavailable` if the kind is still unserved and the
//! step-run still live. No service waits in memory.
//!
//! A served kind is remembered for [`SERVED_TTL`] per process, so a
//! dispatch of a kind seen served costs no request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use noetl_wire::TaskCommand;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::events::{now_ms, EventDraft};
use crate::{codec, Mesh, MeshError, PendingAck};

/// How long a kind seen served is not asked about again.
pub const SERVED_TTL: Duration = Duration::from_secs(10);

/// The error kind of a step-run failed because no executor serves a kind.
pub const EXECUTOR_UNAVAILABLE: &str = "executor.unavailable";

/// What the work consumer of a kind shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ConsumerCounts {
    /// Pull requests waiting (idle executors).
    pub waiting: usize,
    /// Messages delivered and not yet acknowledged (busy executors).
    pub ack_pending: usize,
    /// How long ago the consumer was created, last delivered a message or
    /// last saw one acknowledged, whichever is latest.
    #[serde(rename = "idle_for_ms", serialize_with = "millis")]
    pub idle_for: Duration,
}

/// A kind's work queue: its consumer, and the commands waiting in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct QueueCounts {
    /// What the consumer shows.
    pub consumer: ConsumerCounts,
    /// Commands not yet delivered to any executor.
    pub pending: u64,
}

/// True when an executor serves the kind whose consumer shows `counts`
/// (`None`: the consumer does not exist, no executor of the kind ever
/// started): one waits for work or holds some, or one created the
/// consumer or used it within `recent` (an executor between two pulls, or
/// still starting, is not mistaken for none).
pub fn serves(counts: Option<ConsumerCounts>, recent: Duration) -> bool {
    counts.is_some_and(|c| c.waiting > 0 || c.ack_pending > 0 || c.idle_for <= recent)
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The `task.unserved` timer: a task command of `kind` was published while
/// no executor served it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskUnserved {
    /// When the router looks again (epoch ms).
    pub at_ms: u64,
    /// The tool kind.
    pub kind: String,
    /// The subject the command waits on.
    pub subject: String,
    /// How long it waits (ms), for the error message.
    pub wait_ms: u64,
    /// The step's args (carried into its `step.failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// The `step.failed` error of a step-run whose task no executor took.
pub fn unavailable_error(t: &TaskUnserved, task: &str) -> Value {
    let waited = Duration::from_millis(t.wait_ms);
    serde_json::json!({
        "kind": EXECUTOR_UNAVAILABLE,
        "message": format!(
            "no executor serves kind `{}` (waited {} on subject {}); start one with `noetl serve executor --kind {}`",
            t.kind,
            human(waited),
            t.subject,
            t.kind
        ),
        "task": task,
    })
}

fn human(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Kinds seen served, and when.
#[derive(Debug, Default)]
pub struct ServedCache {
    seen: Mutex<HashMap<String, Instant>>,
}

impl ServedCache {
    fn fresh(&self, kind: &str) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(kind).is_some_and(|t| t.elapsed() < SERVED_TTL)
    }

    fn remember(&self, kind: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(kind.to_string(), Instant::now());
    }
}

impl Mesh {
    /// Whether an executor serves `kind` now ([`serves`]); `cached` lets a
    /// recent "served" answer stand.
    pub async fn kind_served(&self, kind: &str, cached: bool) -> Result<bool, MeshError> {
        if cached && self.served_cache().fresh(kind) {
            return Ok(true);
        }
        let counts = self
            .queue_of(kind)
            .await
            .inspect_err(|_| self.outages().note())?
            .map(|q| q.consumer);
        let served = serves(counts, self.config().executor_wait);
        if served {
            self.served_cache().remember(kind);
        }
        Ok(served)
    }

    /// The work queue of `kind`: its consumer's counts and the commands
    /// waiting (`None` when no executor of the kind ever created it).
    pub async fn queue_of(&self, kind: &str) -> Result<Option<QueueCounts>, MeshError> {
        let stream = self.subjects().work_stream();
        let what = format!("consumer executor-{kind} on {stream}");
        let setup = |message: String| MeshError::Setup {
            what: what.clone(),
            message,
        };
        let s = self
            .js()
            .get_stream_no_info(&stream)
            .await
            .map_err(|e| setup(e.to_string()))?;
        let name = format!("{}-executor-{kind}", self.subjects().prefix());
        match s.consumer_info(&name).await {
            Ok(info) => {
                let latest = [info.delivered.last_active, info.ack_floor.last_active]
                    .into_iter()
                    .flatten()
                    .fold(info.created, |a, b| a.max(b));
                let idle_for = time::OffsetDateTime::now_utc() - latest;
                Ok(Some(QueueCounts {
                    consumer: ConsumerCounts {
                        waiting: info.num_waiting,
                        ack_pending: info.num_ack_pending,
                        idle_for: idle_for.try_into().unwrap_or(Duration::ZERO),
                    },
                    pending: info.num_pending,
                }))
            }
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => Ok(None),
            Err(e) => Err(setup(e.to_string())),
        }
    }

    /// After publishing `cmd` for `task` on `kind`'s subject: when no
    /// executor serves the kind, emit its `task.unserved` timer.
    pub async fn watch_dispatch(
        &self,
        kind: &str,
        task: &str,
        cmd: &TaskCommand,
    ) -> Result<Option<PendingAck>, MeshError> {
        if self.kind_served(kind, true).await? {
            return Ok(None);
        }
        let wait = self.config().executor_wait;
        let args = codec::json_value(&cmd.args_json).ok();
        let timer = TaskUnserved {
            at_ms: now_ms().saturating_add(wait.as_millis() as u64),
            kind: kind.to_string(),
            subject: self.subjects().task(kind),
            wait_ms: wait.as_millis() as u64,
            args,
        };
        tracing::info!(execution_id = %cmd.execution_id, step = %cmd.step, task, kind,
            "no executor serves this kind yet; the step-run fails if none takes the task in time");
        let ev = EventDraft {
            execution_id: &cmd.execution_id,
            step_run_id: &cmd.step_run_id,
            step: &cmd.step,
            task,
            trace_id: &cmd.trace_id,
            parent_id: &cmd.command_id,
            discriminator: &cmd.command_id,
            ..Default::default()
        }
        .build(&timer);
        Ok(Some(self.emit(&ev).await?))
    }
}

crate::payloads::payload_of! { TaskUnserved => TaskUnserved }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_served_while_an_executor_waits_on_it_holds_work_or_used_it_lately() {
        let recent = Duration::from_secs(30);
        let idle = ConsumerCounts {
            idle_for: Duration::from_secs(600),
            ..Default::default()
        };
        assert!(!serves(None, recent), "no consumer: never started");
        assert!(!serves(Some(idle), recent), "nobody pulled for 10 minutes");
        assert!(serves(Some(ConsumerCounts { waiting: 1, ..idle }), recent));
        assert!(serves(
            Some(ConsumerCounts {
                ack_pending: 3,
                ..idle
            }),
            recent
        ));
        let between_pulls = ConsumerCounts {
            idle_for: Duration::from_secs(2),
            ..Default::default()
        };
        assert!(serves(Some(between_pulls), recent));
    }

    #[test]
    fn the_error_names_the_kind_the_wait_and_the_subject() {
        let t = TaskUnserved {
            at_ms: 1,
            kind: "duckdb".into(),
            subject: "noetl.task.duckdb".into(),
            wait_ms: 30_000,
            args: None,
        };
        let e = unavailable_error(&t, "load");
        assert_eq!(e["kind"], EXECUTOR_UNAVAILABLE);
        assert_eq!(e["task"], "load");
        let m = e["message"].as_str().unwrap();
        assert!(
            m.starts_with(
                "no executor serves kind `duckdb` (waited 30 s on subject noetl.task.duckdb)"
            ),
            "{m}"
        );
        let t = TaskUnserved { wait_ms: 1500, ..t };
        assert!(unavailable_error(&t, "x")["message"]
            .as_str()
            .unwrap()
            .contains("waited 1500 ms"));
    }
}
