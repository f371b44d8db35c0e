//! The policies a schedule is added with: what a tick does while the
//! previous run still runs ([`Overlap`]) and how many missed ticks are
//! started after a downtime ([`CatchUp`]). A leaf: the record stores
//! them, `policy` decides with them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a tick does while the schedule's previous run is still running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// Do not start it; count it as skipped (the default).
    #[default]
    Skip,
    /// Hold it until the previous run ends, then start it (a queue of
    /// one: ticks that come due while one is held are skipped).
    Queue,
    /// Start it anyway.
    Allow,
    /// Ask the previous run to cancel, then start it.
    CancelRunning,
}

impl FromStr for Overlap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "skip" => Ok(Self::Skip),
            "queue" => Ok(Self::Queue),
            "allow" => Ok(Self::Allow),
            "cancel-running" => Ok(Self::CancelRunning),
            _ => Err(format!(
                "overlap policy {s:?} is unknown: use skip, queue, allow or cancel-running"
            )),
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Skip => "skip",
            Self::Queue => "queue",
            Self::Allow => "allow",
            Self::CancelRunning => "cancel-running",
        })
    }
}

/// How many ticks missed while no timer ran are started afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// None: only ticks that come due from now on.
    None,
    /// At most this many, the most recent.
    Last(u32),
}

impl Default for CatchUp {
    fn default() -> Self {
        Self::Last(1)
    }
}

impl CatchUp {
    /// The most missed ticks started.
    pub fn limit(self) -> usize {
        match self {
            Self::None => 0,
            Self::Last(n) => n as usize,
        }
    }
}

impl FromStr for CatchUp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(Self::None);
        }
        match s.parse::<u32>() {
            Ok(0) => Ok(Self::None),
            Ok(n) => Ok(Self::Last(n)),
            Err(_) => Err(format!(
                "catch-up {s:?} is invalid: use a number of ticks or `none`"
            )),
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Last(n) => write!(f, "{n}"),
        }
    }
}
