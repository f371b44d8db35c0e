//! The schedules bucket (`<p>_schedules`): add, read, list, pause,
//! remove, and the compare-and-set write of a schedule's firing state.

use async_nats::jetstream::kv::Store;
use chrono::{DateTime, Utc};
use noetl_mesh::keys::Keys;
use noetl_mesh::kv::{self, Cas};

use crate::cron::tick_text;
use crate::record::{FiringState, ScheduleRecord};
use crate::TimerError;

/// The stored schedules.
#[derive(Clone)]
pub struct Schedules {
    store: Store,
}

/// A schedule read with its revision (for a compare-and-set write).
pub struct Read {
    /// The record.
    pub record: ScheduleRecord,
    /// Its revision.
    pub revision: u64,
}

impl Schedules {
    /// The schedules of a mesh.
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// Store a new schedule; refuses a name already taken.
    pub async fn add(&self, record: &ScheduleRecord) -> Result<(), TimerError> {
        if kv::create(&self.store, &Keys::schedule(&record.name), record).await? {
            Ok(())
        } else {
            Err(TimerError::Exists {
                name: record.name.clone(),
            })
        }
    }

    /// A schedule and its revision, if stored.
    pub async fn read(&self, name: &str) -> Result<Option<Read>, TimerError> {
        Ok(
            kv::read::<ScheduleRecord>(&self.store, &Keys::schedule(name))
                .await?
                .map(|(record, revision)| Read { record, revision }),
        )
    }

    /// A schedule, or [`TimerError::NotFound`].
    pub async fn get(&self, name: &str) -> Result<ScheduleRecord, TimerError> {
        match self.read(name).await? {
            Some(r) => Ok(r.record),
            None => Err(not_found(name)),
        }
    }

    /// Every schedule with its revision, by name. A record that does not
    /// decode is left out with a warning (the others still fire).
    pub async fn list(&self) -> Result<Vec<Read>, TimerError> {
        let mut out = Vec::new();
        for (key, value) in kv::values_matching::<ScheduleRecord>(&self.store, "*").await? {
            match value {
                Ok(record) => out.push(record),
                Err(e) => tracing::warn!(key = %key, error = %e, "schedule record unreadable"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        // The scan does not give revisions: read each (a compare-and-set
        // needs the revision of what was decided on).
        let mut read = Vec::with_capacity(out.len());
        for r in out {
            if let Some(found) = self.read(&r.name).await? {
                read.push(found);
            }
        }
        Ok(read)
    }

    /// Pause or resume a schedule. Resuming records the instant: ticks
    /// before it (missed while paused) are never caught up.
    pub async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        now: DateTime<Utc>,
    ) -> Result<ScheduleRecord, TimerError> {
        let stored = kv::update(
            &self.store,
            &Keys::schedule(name),
            |cur: Option<&ScheduleRecord>| match cur {
                None => Cas::Keep,
                Some(r) if r.paused == paused => Cas::Keep,
                Some(r) => {
                    let mut r = r.clone();
                    r.paused = paused;
                    if !paused {
                        r.resumed_at = Some(tick_text(now));
                    }
                    Cas::Write(r)
                }
            },
        )
        .await?;
        stored.ok_or_else(|| not_found(name))
    }

    /// Delete a schedule (its runs are kept). Firing stops at the next
    /// pass of every timer.
    pub async fn remove(&self, name: &str) -> Result<(), TimerError> {
        if self.read(name).await?.is_none() {
            return Err(not_found(name));
        }
        let key = Keys::schedule(name);
        self.store
            .purge(&key)
            .await
            .map_err(|e| noetl_mesh::MeshError::Kv {
                bucket: self.store.name.clone(),
                key,
                message: e.to_string(),
            })?;
        Ok(())
    }

    /// Write `state` into the schedule read at `read.revision`, only if
    /// nobody wrote since. `false`: another replica (or a command) did;
    /// the next pass decides again from what is stored.
    pub async fn write_state(&self, read: &Read, state: FiringState) -> Result<bool, TimerError> {
        let mut record = read.record.clone();
        record.state = state;
        let key = Keys::schedule(&record.name);
        Ok(
            kv::write_at(&self.store, &key, &record, Some(read.revision))
                .await?
                .is_some(),
        )
    }
}

fn not_found(name: &str) -> TimerError {
    TimerError::NotFound { name: name.into() }
}
