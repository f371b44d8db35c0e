//! Waiting for a signal (docs/operations.md, "Waiting for a signal"): a
//! `wait` task stores a *waiter* under `<eid>.wait.<signal>` (bucket
//! exec) holding the task command that continues its step-run, and ends
//! its attempt without a result; the step-run stays live. A signal
//! (`noetl exec signal`, the API) whose data fits the waiter's schema
//! records its data in the waiter as the task's outcome (compare-and-set
//! at the revision it read), publishes that command with it, then removes
//! the waiter; so does the `wait.timeout` timer, with a `timeout` error,
//! when it is due first. Whichever records its outcome first continues the
//! step-run: a signal is consumed once. A waiter left with an outcome (its
//! publisher died before removing it) is published again, under the same
//! message id, by the next signal or timer that finds it.
//!
//! The log has the waiter too: `wait.started` (written after the waiter)
//! carries what it holds, so a waiter purged from KV while its step-run
//! waits is written back from the events ([`Waits`] decides which is
//! owed) by the signal or timer that misses it, and by `noetl admin
//! rebuild`.

use serde_json::Value;

use noetl_core::Outcome;

use crate::commands::Continue;
use crate::event_type::EventType;
use crate::events::EventDraft;
use crate::ids::derive_id;
use crate::keys::Keys;
use crate::replay::{hydrate, LogReader};
use crate::{kv, payloads, Mesh, MeshError};

pub use crate::waiter::{SignalReceived, WaitStarted, WaitTimeout, Waiter, Waits};

/// An event of `waiter`'s wait: its step, step-run, task and task-run.
fn waiter_event<'a>(eid: &'a str, waiter: &'a Waiter) -> EventDraft<'a> {
    EventDraft {
        execution_id: eid,
        step_run_id: &waiter.step_run_id,
        task_run_id: &waiter.task_run_id,
        step: &waiter.step,
        task: &waiter.task,
        ..EventDraft::default()
    }
}

/// The `wait` tool kind.
pub const WAIT_KIND: &str = "wait";

/// Why a signal was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// No step of the execution waits for this signal now.
    #[error("no step of execution {execution_id} waits for signal `{signal}` now")]
    NoWaiter {
        /// The execution.
        execution_id: String,
        /// The signal.
        signal: String,
    },
    /// The data does not fit the waiter's schema.
    #[error("signal `{signal}` of execution {execution_id}: the data does not fit the schema of step `{step}`: {mismatch}")]
    Invalid {
        /// The execution.
        execution_id: String,
        /// The signal.
        signal: String,
        /// The waiting step.
        step: String,
        /// Where and what.
        mismatch: noetl_core::data_schema::Mismatch,
    },
    /// The name cannot be a signal's ([`valid_signal`]): no step can wait
    /// for it, now or later.
    #[error("`{signal}` is not a signal name: use {rule}", rule = crate::ids::NAME_RULE)]
    BadName {
        /// The name given.
        signal: String,
    },
    /// Reading or writing the mesh failed.
    #[error(transparent)]
    Mesh(#[from] MeshError),
}

/// Whether a signal name can be a key part and a subject token.
pub fn valid_signal(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Mesh {
    /// Store `waiter` for execution `eid`, then its `wait.started` event
    /// (after: a signal that finds no waiter finds no event either; its id
    /// is the task-run's, so a redelivered command writes it once), and
    /// its timeout timer if it has one.
    pub async fn wait_for(&self, eid: &str, waiter: &Waiter) -> Result<(), MeshError> {
        kv::put(self.exec_kv(), &Keys::wait(eid, &waiter.signal), waiter).await?;
        let command = crate::patches::carry(
            self.results(),
            eid,
            &format!("wait-{}", waiter.task_run_id),
            waiter.command.clone(),
        )
        .await?;
        let started = WaitStarted {
            signal: waiter.signal.clone(),
            since: waiter.since.clone(),
            timeout_at_ms: waiter.timeout_at_ms,
            schema: waiter.schema.clone(),
            command_ref: command.reference(),
            command: command.inline(),
        };
        let ev = waiter_event(eid, waiter).build(&started);
        self.emit(&ev).await?.wait().await?;
        if let Some(at_ms) = waiter.timeout_at_ms {
            let timer = WaitTimeout {
                at_ms,
                signal: waiter.signal.clone(),
                task_run_id: waiter.task_run_id.clone(),
            };
            let ev = waiter_event(eid, waiter).build(&timer);
            self.emit(&ev).await?.wait().await?;
        }
        Ok(())
    }

    /// The waiter of `eid` for `signal` and its revision: the stored one,
    /// or, when the key is missing, the one its events say is owed,
    /// written back first (create-only: one written meanwhile wins). The
    /// log is read only when the key is missing and the execution has a
    /// `wait.started`.
    async fn read_waiter(
        &self,
        eid: &str,
        signal: &str,
    ) -> Result<Option<(Waiter, u64)>, MeshError> {
        let key = Keys::wait(eid, signal);
        // Written back and purged again before it is read: written back
        // again (the events still owe it), not taken for none.
        for _ in 0..kv::RESTORES {
            if let Some(found) = kv::read::<Waiter>(self.exec_kv(), &key).await? {
                return Ok(Some(found));
            }
            if self
                .last_event_seq(eid, EventType::WaitStarted)
                .await?
                .is_none()
            {
                return Ok(None);
            }
            let Some(waiter) = self.owed_waiter(eid, signal).await? else {
                return Ok(None);
            };
            if kv::create(self.exec_kv(), &key, &waiter).await? {
                tracing::warn!(execution_id = %eid, %key, step = %waiter.step,
                    "a waiter was missing: rebuilt from the events");
            }
        }
        Err(kv::conflict(self.exec_kv(), &key, kv::RESTORES))
    }

    /// The waiter the events of `eid` say is owed for `signal`, its
    /// command read back when the event carries it by reference; `None`
    /// when none is.
    pub async fn owed_waiter(&self, eid: &str, signal: &str) -> Result<Option<Waiter>, MeshError> {
        // Read a chunk at a time: the log is never held.
        let mut log = LogReader::of(self, eid);
        let mut waits = Waits::default();
        while let Some(mut l) = log.next().await? {
            if EventType::of(&l.event) == Some(EventType::WaitStarted) {
                hydrate(self, &mut l.event).await?;
            }
            waits.apply(&l.event)?;
        }
        Ok(waits
            .owed(signal)
            .filter(|w| !w.command.is_empty())
            .cloned())
    }

    /// The waiters of `eid` now.
    pub async fn waiters(&self, eid: &str) -> Result<Vec<Waiter>, MeshError> {
        let found = kv::values_matching::<Waiter>(self.exec_kv(), &Keys::waits_of(eid)).await?;
        found.into_iter().map(|(_, w)| w).collect()
    }

    /// Deliver signal `signal` with `data` to the step of `eid` waiting for
    /// it: its `wait` task's result is `data`. Returns the waiter it
    /// continued.
    pub async fn signal(
        &self,
        eid: &str,
        signal: &str,
        data: Value,
        by: &str,
    ) -> Result<Waiter, SignalError> {
        let none = || SignalError::NoWaiter {
            execution_id: eid.to_string(),
            signal: signal.to_string(),
        };
        if !valid_signal(signal) {
            return Err(SignalError::BadName {
                signal: signal.to_string(),
            });
        }
        let Some((waiter, revision)) = self.read_waiter(eid, signal).await? else {
            return Err(none());
        };
        if waiter.delivered.is_some() {
            // Consumed already; its continuation may not have gone out.
            self.republish(eid, &waiter).await?;
            return Err(none());
        }
        if let Some(schema) = &waiter.schema {
            if let Err(mismatch) = noetl_core::data_schema::check(schema, &data) {
                return Err(SignalError::Invalid {
                    execution_id: eid.to_string(),
                    signal: signal.to_string(),
                    step: waiter.step.clone(),
                    mismatch,
                });
            }
        }
        if !self
            .continue_waiter(eid, &waiter, revision, Outcome::ok(data))
            .await?
        {
            return Err(none());
        }
        let received = SignalReceived {
            signal: signal.to_string(),
            by: by.to_string(),
            task_run_id: waiter.task_run_id.clone(),
        };
        let ev = waiter_event(eid, &waiter).build(&received);
        self.emit(&ev).await?.wait().await?;
        Ok(waiter)
    }

    /// A due `wait.timeout` timer: the waiter it is for, if still there,
    /// continues with a `timeout` error. `false` when it was gone.
    pub async fn expire_wait(&self, eid: &str, t: &WaitTimeout) -> Result<bool, MeshError> {
        if !valid_signal(&t.signal) {
            return Ok(false);
        }
        let Some((waiter, revision)) = self.read_waiter(eid, &t.signal).await? else {
            return Ok(false);
        };
        if waiter.task_run_id != t.task_run_id {
            return Ok(false);
        }
        if waiter.delivered.is_some() {
            self.republish(eid, &waiter).await?;
            return Ok(false);
        }
        let message = format!(
            "no signal `{}` arrived within the wait's timeout_s (since {})",
            t.signal, waiter.since
        );
        let outcome = Outcome::error(noetl_core::lifecycle::TIMEOUT, message, false);
        self.continue_waiter(eid, &waiter, revision, outcome).await
    }

    /// Record `outcome` in `waiter` at `revision` (compare-and-set: of
    /// two deliveries one wins), publish its command with it, then remove
    /// the waiter; `false` when another delivery won.
    async fn continue_waiter(
        &self,
        eid: &str,
        waiter: &Waiter,
        revision: u64,
        outcome: Outcome,
    ) -> Result<bool, MeshError> {
        let key = Keys::wait(eid, &waiter.signal);
        let store = self.exec_kv();
        let delivered = Waiter {
            delivered: Some(payloads::to_value(&outcome)),
            ..waiter.clone()
        };
        let bytes = serde_json::to_vec(&delivered).map_err(|e| MeshError::Kv {
            bucket: store.name.clone(),
            key: key.clone(),
            message: e.to_string(),
        })?;
        if store.update(&key, bytes.into(), revision).await.is_err() {
            return Ok(false);
        }
        self.republish(eid, &delivered).await?;
        Ok(true)
    }

    /// Publish a delivered waiter's continuation (the same message id
    /// each time: JetStream keeps one) and remove the waiter.
    async fn republish(&self, eid: &str, waiter: &Waiter) -> Result<(), MeshError> {
        let key = Keys::wait(eid, &waiter.signal);
        self.continue_parked(Continue {
            parked: &waiter.command,
            key: &key,
            kind: WAIT_KIND,
            outcome: waiter.delivered.clone().unwrap_or(Value::Null),
            command_id: derive_id(&["signal", &waiter.task_run_id]),
        })
        .await?;
        // Gone already (another publisher removed it): nothing to do.
        let _ = self.exec_kv().delete(&key).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_are_key_parts() {
        assert!(valid_signal("approval"));
        assert!(valid_signal("go-ahead_2"));
        assert!(!valid_signal(""));
        assert!(!valid_signal("a.b"));
        assert!(!valid_signal("*"));
    }
}
