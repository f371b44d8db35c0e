//! Pausing an execution (`noetl exec pause`): no new step starts and no
//! new loop iteration is dispatched until it is unpaused; what is in
//! flight finishes. docs/operations.md, "Pause and unpause".
//!
//! The pause is a record, `<eid>.paused` (bucket exec). Every process
//! that dispatches follows those records with one KV watch (the set in
//! [`Pauses`]), so a token costs no read. A token that reaches the
//! scheduler of a paused execution, and a loop run whose next iterations
//! would go out, are *held*: the message that will carry on is stored
//! under `<eid>.held.…` and acknowledged. Unpausing removes the record,
//! then publishes each held message again, each removed with its
//! revision first, so exactly one publisher sends it. A process that
//! holds a message reads the record once more afterwards and, should the
//! pause have ended meanwhile, publishes it itself: nothing stays held
//! behind an unpause.
//!
//! The log has the pause too (`execution.paused`, `execution.unpaused`):
//! a record purged while the execution is paused is owed ([`owed`]) and
//! written back by the watch that sees the purge (an unpause deletes, an
//! operator purges), by an unpause that finds it missing, and by `noetl
//! admin rebuild`.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use async_nats::jetstream::kv::Operation;
use futures::StreamExt;
use noetl_wire::Event;
use serde::{Deserialize, Serialize};

use crate::event_type::EventType;
use crate::events::{now_rfc3339, EventDraft};
use crate::keys::Keys;
use crate::{kv, Mesh, MeshError};

/// The record of a pause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRecord {
    /// Who paused it.
    pub by: String,
    /// Why.
    #[serde(default)]
    pub reason: String,
    /// When (RFC 3339).
    pub at: String,
}

/// The payload of `execution.paused` and `execution.unpaused`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseChanged {
    /// Who.
    pub by: String,
    /// Why (pause).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Messages released (unpause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<u64>,
}

/// `execution.paused`: who paused the execution, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Paused(pub PauseChanged);

/// `execution.unpaused`: who unpaused it, and how much it released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Unpaused(pub PauseChanged);

crate::payloads::payload_of! {
    Paused => ExecutionPaused,
    Unpaused => ExecutionUnpaused,
}

/// Whether an execution's pause record is owed, from the stream sequences
/// of its last `execution.paused`, `execution.unpaused` and end
/// (`execution.completed`, `failed`, `cancelled`): paused last.
pub fn owed(paused: Option<u64>, unpaused: Option<u64>, ended: Option<u64>) -> bool {
    paused.is_some_and(|p| unpaused.is_none_or(|u| u < p) && ended.is_none_or(|e| e < p))
}

/// What an execution's events say of its pause ([`owed`]), folded one
/// event at a time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PauseLog {
    paused: Option<(u64, PauseRecord)>,
    unpaused: Option<u64>,
    ended: Option<u64>,
}

impl PauseLog {
    /// Apply event `ev` of stream sequence `seq` (in any order: each kind
    /// keeps its latest). A pause whose payload does not decode is an
    /// error naming it.
    pub fn apply(&mut self, seq: u64, ev: &Event) -> Result<(), MeshError> {
        use EventType as T;
        let later = |kept: Option<u64>| kept.is_none_or(|k| k <= seq);
        match EventType::of(ev) {
            Some(T::ExecutionPaused) if later(self.paused.as_ref().map(|(s, _)| *s)) => {
                let Paused(p) = crate::payloads::decode_typed(ev)?;
                let record = PauseRecord {
                    by: p.by,
                    reason: p.reason,
                    at: noetl_wire::codec::event_time(ev),
                };
                self.paused = Some((seq, record));
            }
            Some(T::ExecutionUnpaused) if later(self.unpaused) => self.unpaused = Some(seq),
            Some(T::ExecutionCompleted | T::ExecutionFailed | T::ExecutionCancelled)
                if later(self.ended) =>
            {
                self.ended = Some(seq)
            }
            _ => {}
        }
        Ok(())
    }

    /// The pause record owed, if one is.
    pub fn owed(&self) -> Option<&PauseRecord> {
        let (seq, record) = self.paused.as_ref()?;
        owed(Some(*seq), self.unpaused, self.ended).then_some(record)
    }
}

/// The paused executions this process knows of.
#[derive(Debug, Default)]
pub struct Pauses {
    paused: RwLock<HashSet<String>>,
}

impl Pauses {
    /// True when `eid` is paused: hold what would start.
    pub fn is_paused(&self, eid: &str) -> bool {
        self.paused
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(eid)
    }

    fn set(&self, eid: &str, paused: bool) {
        let mut set = self.paused.write().unwrap_or_else(|p| p.into_inner());
        if paused {
            set.insert(eid.to_string());
        } else {
            set.remove(eid);
        }
    }
}

/// The execution a `<eid>.paused` key names.
fn paused_eid(key: &str) -> Option<&str> {
    key.strip_suffix(".paused").filter(|e| !e.contains('.'))
}

/// Follow the pause records of `mesh`: the watch starts first, then the
/// records already there are read, so no change falls in between. A
/// record purged (not deleted by an unpause) stays paused when the log
/// says it is, and is written back.
pub(crate) async fn follow(mesh: &Mesh) -> Result<Arc<Pauses>, MeshError> {
    let store = mesh.exec_kv();
    let failed = |e: &dyn std::fmt::Display| MeshError::Kv {
        bucket: store.name.clone(),
        key: "*.paused".into(),
        message: e.to_string(),
    };
    let mut watch = store.watch("*.paused").await.map_err(|e| failed(&e))?;
    let set = Arc::new(Pauses::default());
    for (key, _) in kv::values_matching::<serde_json::Value>(store, "*.paused").await? {
        if let Some(eid) = paused_eid(&key) {
            set.set(eid, true);
        }
    }
    let s = set.clone();
    // Weak: the watch does not keep the mesh alive.
    let weak = mesh.downgrade();
    tokio::spawn(async move {
        while let Some(entry) = watch.next().await {
            let Ok(entry) = entry else { continue };
            let Some(eid) = paused_eid(&entry.key) else {
                continue;
            };
            let paused = match entry.operation {
                Operation::Put => true,
                Operation::Delete => false,
                Operation::Purge => match Mesh::upgrade(&weak) {
                    Some(mesh) => mesh.restore_pause(eid).await.unwrap_or_else(|e| {
                        tracing::warn!(execution_id = %eid, error = %e,
                            "a pause record was purged and the log could not be read");
                        false
                    }),
                    None => false,
                },
            };
            s.set(eid, paused);
        }
    });
    Ok(set)
}

/// What a held message is: the key it waits under and the subject it
/// goes to when released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held<'a> {
    /// A token for the scheduler (`<eid>.held.token.<token_id>`).
    Token {
        /// The token.
        token_id: &'a str,
    },
    /// A loop run's window (`<eid>.held.loop.<step_run_id>`): its loop
    /// command again, which dispatches the run's iterations in flight.
    Loop {
        /// The loop step's run.
        step_run_id: &'a str,
    },
}

impl Mesh {
    /// The executions paused, as this process follows them (the watch
    /// starts on first use).
    pub async fn pauses(&self) -> Result<&Pauses, MeshError> {
        let set = self.inner.paused.get_or_try_init(|| follow(self)).await?;
        Ok(set)
    }

    /// Pause `eid`: `false` when it was paused already.
    pub async fn pause(&self, eid: &str, by: &str, reason: &str) -> Result<bool, MeshError> {
        let record = PauseRecord {
            by: by.to_string(),
            reason: reason.to_string(),
            at: now_rfc3339(),
        };
        if !kv::create(self.exec_kv(), &Keys::paused(eid), &record).await? {
            return Ok(false);
        }
        let changed = Paused(PauseChanged {
            by: by.to_string(),
            reason: reason.to_string(),
            released: None,
        });
        self.emit_pause(eid, &changed).await?;
        Ok(true)
    }

    /// The executions paused now (one read of the pause records, not the
    /// followed set): what a client listing executions shows.
    pub async fn paused_executions(&self) -> Result<HashSet<String>, MeshError> {
        Ok(
            kv::values_matching::<serde_json::Value>(self.exec_kv(), "*.paused")
                .await?
                .into_iter()
                .filter_map(|(key, _)| paused_eid(&key).map(str::to_string))
                .collect(),
        )
    }

    /// The pause record of `eid`, read now (not from the followed set).
    pub async fn pause_record(&self, eid: &str) -> Result<Option<PauseRecord>, MeshError> {
        kv::get(self.exec_kv(), &Keys::paused(eid)).await
    }

    /// The pause record the events of `eid` say is owed ([`PauseLog`]),
    /// from direct reads of its last pause, unpause and end events.
    pub async fn owed_pause(&self, eid: &str) -> Result<Option<PauseRecord>, MeshError> {
        let mut log = PauseLog::default();
        let Some((seq, paused)) = self.last_event(eid, EventType::ExecutionPaused).await? else {
            return Ok(None);
        };
        log.apply(seq, &paused)?;
        for kind in [
            EventType::ExecutionUnpaused,
            EventType::ExecutionCompleted,
            EventType::ExecutionFailed,
            EventType::ExecutionCancelled,
        ] {
            if let Some(seq) = self.last_event_seq(eid, kind).await? {
                // Only its sequence and type matter.
                let ev = Event {
                    event_type: kind.wire_name().to_string(),
                    ..Event::default()
                };
                log.apply(seq, &ev)?;
            }
        }
        Ok(log.owed().cloned())
    }

    /// Write back the pause record of `eid` when it is missing and its
    /// events say it is owed (create-only); returns whether `eid` is
    /// paused.
    pub async fn restore_pause(&self, eid: &str) -> Result<bool, MeshError> {
        if self.pause_record(eid).await?.is_some() {
            return Ok(true);
        }
        let Some(record) = self.owed_pause(eid).await? else {
            return Ok(false);
        };
        if kv::create(self.exec_kv(), &Keys::paused(eid), &record).await? {
            tracing::warn!(execution_id = %eid, "a pause record was missing: rebuilt from the events");
        }
        Ok(true)
    }

    /// Unpause `eid` and release what it held; returns how many messages
    /// were released. Idempotent: run again, it releases what a crash
    /// left held. A pause whose record was purged is ended too, and a
    /// token held whose record was purged is published again from the
    /// log ([`crate::held`]); a held token's record that outlived its
    /// release (its step-run in the log) is removed, not published again.
    pub async fn unpause(&self, eid: &str, by: &str) -> Result<u64, MeshError> {
        let mut was_paused = self.pause_record(eid).await?.is_some();
        let held = kv::keys_under(self.exec_kv(), &Keys::held_all(eid)).await?;
        if !was_paused && held.is_empty() {
            // Its record purged: the log says whether it is paused.
            was_paused = self.owed_pause(eid).await?.is_some();
        }
        if !was_paused && held.is_empty() {
            return Ok(0);
        }
        // The event first: it precedes in the stream every step the
        // release starts.
        let changed = Unpaused(PauseChanged {
            by: by.to_string(),
            reason: String::new(),
            released: Some(held.len() as u64),
        });
        self.emit_pause(eid, &changed).await?;
        if was_paused {
            self.exec_kv()
                .delete(Keys::paused(eid))
                .await
                .map_err(|e| MeshError::Kv {
                    bucket: self.exec_kv().name.clone(),
                    key: Keys::paused(eid),
                    message: e.to_string(),
                })?;
        }
        let mut released = std::collections::BTreeSet::new();
        // Listed after the record is gone: a message held before is
        // released here, one held after by its holder (which reads the
        // record again after holding).
        let keys = kv::keys_under(self.exec_kv(), &Keys::held_all(eid)).await?;
        let handled = if keys.iter().any(|k| k.contains(".held.token.")) {
            self.handled_held_tokens_of(eid).await?
        } else {
            Default::default()
        };
        let mut discarded = 0;
        for key in keys {
            if handled.contains(&key) {
                self.discard_handled(eid, &key).await?;
                discarded += 1;
                released.insert(key);
            } else if self.release(eid, &key).await? {
                released.insert(key);
            }
        }
        // A held token whose record is gone: the log says it is owed; a
        // held loop window: its run's record says so.
        let owed = self.release_owed_tokens(eid, &released).await?
            + self.release_owed_windows(eid, &released).await?;
        Ok(released.len() as u64 - discarded + owed)
    }

    /// Hold `payload` (what would go to `held`'s subject) while `eid` is
    /// paused; should the pause have ended meanwhile, release it at once.
    pub async fn hold(
        &self,
        eid: &str,
        held: Held<'_>,
        payload: bytes::Bytes,
    ) -> Result<(), MeshError> {
        let key = match held {
            Held::Token { token_id } => Keys::held_token(eid, token_id),
            Held::Loop { step_run_id } => Keys::held_loop(eid, step_run_id),
        };
        let store = self.exec_kv();
        store.put(&key, payload).await.map_err(|e| MeshError::Kv {
            bucket: store.name.clone(),
            key: key.clone(),
            message: e.to_string(),
        })?;
        tracing::info!(execution_id = %eid, %key, "held while the execution is paused");
        if self.pause_record(eid).await?.is_none() {
            self.release(eid, &key).await?;
        }
        Ok(())
    }

    /// Publish the held message under `key` again, then remove it; `false`
    /// when another publisher removed it first. Published before it is
    /// removed: a publish that fails leaves it held, for the next unpause
    /// (or a retry of this one) to release; two releasers publish it under
    /// one message id, which JetStream keeps once.
    async fn release(&self, eid: &str, key: &str) -> Result<bool, MeshError> {
        let store = self.exec_kv();
        let kv_err = |e: &dyn std::fmt::Display| MeshError::Kv {
            bucket: store.name.clone(),
            key: key.to_string(),
            message: e.to_string(),
        };
        let Some(entry) = store.entry(key).await.map_err(|e| kv_err(&e))? else {
            return Ok(false);
        };
        if entry.operation != Operation::Put {
            return Ok(false);
        }
        let subject = if key.contains(".held.loop.") {
            self.subjects().loop_cmd(eid)
        } else {
            self.subjects().token(eid)
        };
        let msg_id = format!("{key}@{}", entry.revision);
        self.publish(subject, &msg_id, entry.value)
            .await?
            .wait()
            .await?;
        // Removed (or held again, a newer message) by someone else first:
        // theirs to count, and a message held again theirs to send.
        Ok(store
            .delete_expect_revision(key, Some(entry.revision))
            .await
            .is_ok())
    }

    /// Remove the held record under `key` whose token the log shows
    /// handled (a release cut short after its publish left it): not
    /// published again.
    async fn discard_handled(&self, eid: &str, key: &str) -> Result<(), MeshError> {
        let store = self.exec_kv();
        store.delete(key).await.map_err(|e| MeshError::Kv {
            bucket: store.name.clone(),
            key: key.to_string(),
            message: e.to_string(),
        })?;
        tracing::warn!(execution_id = %eid, %key,
            "a held token's record outlived its release: its step-run has started, not published again");
        Ok(())
    }

    async fn emit_pause(
        &self,
        eid: &str,
        changed: &impl crate::payloads::EventPayload,
    ) -> Result<(), MeshError> {
        let discriminator = uuid::Uuid::now_v7().to_string();
        let event = EventDraft {
            execution_id: eid,
            discriminator: &discriminator,
            ..EventDraft::default()
        }
        .build(changed);
        self.emit(&event).await?.wait().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pause_key_names_a_paused_execution() {
        assert_eq!(paused_eid("e1.paused"), Some("e1"));
        assert_eq!(paused_eid("e1.step.paused"), None);
        assert_eq!(paused_eid("e1"), None);
        let p = Pauses::default();
        p.set("e1", true);
        assert!(p.is_paused("e1") && !p.is_paused("e2"));
        p.set("e1", false);
        assert!(!p.is_paused("e1"));
    }

    #[test]
    fn a_pause_is_owed_when_paused_is_the_last_of_pause_unpause_and_end() {
        assert!(!owed(None, None, None));
        assert!(owed(Some(3), None, None));
        assert!(!owed(Some(3), Some(5), None));
        assert!(owed(Some(7), Some(5), None));
        // Ended after the pause: its record is owed by nothing.
        assert!(!owed(Some(3), None, Some(9)));
        // Paused again after a resume.
        assert!(owed(Some(10), Some(5), Some(9)));
    }

    fn event(payload: &impl crate::payloads::EventPayload) -> Event {
        EventDraft {
            execution_id: "e1",
            ..EventDraft::default()
        }
        .build(payload)
    }

    #[test]
    fn the_pause_log_keeps_the_last_pause_and_its_record() {
        let changed = |by: &str| PauseChanged {
            by: by.into(),
            reason: "look".into(),
            released: None,
        };
        let mut log = PauseLog::default();
        assert_eq!(log.owed(), None);
        log.apply(4, &event(&Paused(changed("ann")))).unwrap();
        let owed = log.owed().unwrap();
        assert_eq!((owed.by.as_str(), owed.reason.as_str()), ("ann", "look"));
        assert!(!owed.at.is_empty());
        log.apply(6, &event(&Unpaused(changed("bob")))).unwrap();
        assert_eq!(log.owed(), None);
        // Read out of order (direct reads): an earlier pause changes nothing.
        log.apply(2, &event(&Paused(changed("old")))).unwrap();
        assert_eq!(log.owed(), None);
        log.apply(8, &event(&Paused(changed("cy")))).unwrap();
        assert_eq!(log.owed().map(|r| r.by.as_str()), Some("cy"));
    }
}
