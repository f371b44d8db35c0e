//! The stored schedule (bucket `<p>_schedules`, key = its name): what to
//! start, when, under which policies, and how far firing has got. Plain
//! data and plain functions.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::cron::{CronError, CronSpec, SpecText};
use crate::modes::{CatchUp, Overlap};

/// The workload key under which every run started by a schedule finds its
/// schedule and tick: `{"name": ..., "tick": ...}` (`workload.noetl_schedule`
/// in templates; stored in the execution's plan).
pub const WORKLOAD_KEY: &str = "noetl_schedule";

/// One schedule, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleRecord {
    /// Name (1-64 of `[A-Za-z0-9_-]`), also its key.
    pub name: String,
    /// Catalog path of the playbook.
    pub playbook: String,
    /// Pinned catalog version; `None` = the latest when each tick fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// Cron expression (5 fields, or 6 with seconds).
    pub cron: String,
    /// IANA time zone the expression is read in.
    pub tz: String,
    /// Workload overrides of every run (a JSON object).
    #[serde(default)]
    pub workload: Map<String, Value>,
    /// What a tick does while the previous run still runs.
    #[serde(default)]
    pub overlap: Overlap,
    /// How many missed ticks are started after a downtime.
    #[serde(default)]
    pub catch_up: CatchUp,
    /// Paused schedules fire nothing; their missed ticks are not caught up.
    #[serde(default)]
    pub paused: bool,
    /// When it was added (RFC 3339, UTC): no tick at or before it fires.
    pub created_at: String,
    /// When it was last unpaused: no tick at or before it fires (ticks
    /// missed while paused are not caught up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<String>,
    /// How far firing has got.
    #[serde(default)]
    pub state: FiringState,
}

/// A schedule's firing state, advanced by compare-and-set after the
/// execution requests it implies were published.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FiringState {
    /// The last tick handled (started, skipped or held): later ticks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_tick: Option<String>,
    /// The execution the last started tick requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_execution_id: Option<String>,
    /// The tick of that execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_started_tick: Option<String>,
    /// When that request was published (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_started_at: Option<String>,
    /// A tick waiting for the previous run to end (`--overlap queue`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_tick: Option<String>,
    /// Ticks not started because the previous run was still running
    /// (`skip`, or a later tick while one was held).
    #[serde(default)]
    pub skipped: u64,
    /// The last of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_tick: Option<String>,
    /// Ticks passed over after a downtime (beyond `--catch-up`).
    #[serde(default)]
    pub missed: u64,
    /// Runs started.
    #[serde(default)]
    pub started: u64,
}

/// Why a schedule's settings are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The name cannot be a schedule name.
    #[error("schedule name {0:?} is invalid: use 1-64 characters of [A-Za-z0-9_-]")]
    Name(String),
    /// The cron expression or time zone.
    #[error(transparent)]
    Cron(#[from] CronError),
    /// The workload overrides are not a JSON object.
    #[error("the workload overrides must be a JSON object")]
    Workload,
}

/// True for a valid schedule name.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl ScheduleRecord {
    /// Check what `add` checks without the catalog: the name, the
    /// expression and the time zone; returns the parsed expression.
    pub fn check(&self) -> Result<CronSpec, RecordError> {
        if !valid_name(&self.name) {
            return Err(RecordError::Name(self.name.clone()));
        }
        Ok(self.spec()?)
    }

    /// The parsed expression in its time zone.
    pub fn spec(&self) -> Result<CronSpec, CronError> {
        CronSpec::parse(SpecText {
            expr: &self.cron,
            tz: &self.tz,
        })
    }

    /// The execution id of this schedule's tick `tick` ([`execution_id`]).
    pub fn execution_id(&self, tick: &str) -> String {
        execution_id(&self.name, tick)
    }

    /// The workload overrides of the run of `tick`: the schedule's, plus
    /// [`WORKLOAD_KEY`] naming the schedule and the tick.
    pub fn run_workload(&self, tick: &str) -> Value {
        let mut w = self.workload.clone();
        w.insert(
            WORKLOAD_KEY.into(),
            json!({"name": self.name, "tick": tick}),
        );
        Value::Object(w)
    }
}

/// The execution id of a schedule's tick: derived from the schedule name
/// and the tick's canonical text ([`crate::cron::tick_text`]), so every
/// replica, retry and backfill requests the same execution for one tick,
/// and the router starts it once.
pub fn execution_id(name: &str, tick: &str) -> String {
    noetl_mesh::ids::derive_id(&["schedule", name, tick])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ScheduleRecord {
        ScheduleRecord {
            name: "nightly".into(),
            playbook: "etl/load".into(),
            version: None,
            cron: "0 2 * * *".into(),
            tz: "UTC".into(),
            workload: Map::new(),
            overlap: Overlap::default(),
            catch_up: CatchUp::default(),
            paused: false,
            created_at: "2026-01-01T00:00:00Z".into(),
            resumed_at: None,
            state: FiringState::default(),
        }
    }

    #[test]
    fn ids_are_deterministic_per_schedule_and_tick() {
        let a = execution_id("nightly", "2026-01-02T02:00:00Z");
        assert_eq!(a, execution_id("nightly", "2026-01-02T02:00:00Z"));
        assert_ne!(a, execution_id("nightly", "2026-01-03T02:00:00Z"));
        assert_ne!(a, execution_id("hourly", "2026-01-02T02:00:00Z"));
        assert!(noetl_mesh::ids::is_valid_execution_id(&a), "{a}");
        assert_eq!(record().execution_id("2026-01-02T02:00:00Z"), a);
    }

    #[test]
    fn names_are_checked() {
        for ok in ["nightly", "a", "load-1_x", &"n".repeat(64)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "a.b", "a b", "é", &"n".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
            let r = ScheduleRecord {
                name: bad.to_string(),
                ..record()
            };
            assert_eq!(r.check().unwrap_err(), RecordError::Name(bad.into()));
        }
        let r = ScheduleRecord {
            cron: "0 25 * * *".into(),
            ..record()
        };
        assert!(matches!(r.check(), Err(RecordError::Cron(_))));
    }

    #[test]
    fn a_run_workload_names_its_schedule_and_tick() {
        let mut r = record();
        r.workload.insert("region".into(), json!("eu"));
        let w = r.run_workload("2026-01-02T02:00:00Z");
        assert_eq!(
            w,
            json!({"region": "eu", "noetl_schedule": {"name": "nightly", "tick": "2026-01-02T02:00:00Z"}})
        );
    }

    #[test]
    fn records_written_before_a_field_existed_still_read() {
        let old = json!({"name": "n", "playbook": "p", "cron": "* * * * *", "tz": "UTC",
            "created_at": "2026-01-01T00:00:00Z"});
        let r: ScheduleRecord = serde_json::from_value(old).unwrap();
        assert_eq!(r.overlap, Overlap::Skip);
        assert_eq!(r.catch_up, CatchUp::Last(1));
        assert_eq!(r.state, FiringState::default());
    }
}
