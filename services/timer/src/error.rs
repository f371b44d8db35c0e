//! The timer's errors, each naming the schedule, playbook or setting
//! involved, with the kind that decides a client's exit code.

use noetl_mesh::catalog::CatalogError;
use noetl_mesh::error::ErrorKind;
use noetl_mesh::MeshError;

use crate::record::RecordError;

/// What can go wrong with a schedule.
#[derive(Debug, thiserror::Error)]
pub enum TimerError {
    /// NATS or KV trouble.
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// The playbook is not in the catalog (or the catalog failed).
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The name, expression, time zone or workload is refused.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// `add` of a name already taken.
    #[error("schedule {name:?} already exists; remove it first or pick another name")]
    Exists {
        /// The name.
        name: String,
    },
    /// No schedule of that name.
    #[error("no schedule named {name:?}")]
    NotFound {
        /// The name.
        name: String,
    },
    /// A pass over the schedules took longer than this and was abandoned
    /// (a JetStream read that never answered); the next pass starts.
    #[error("a pass over the schedules took longer than {} s and was abandoned", .0.as_secs())]
    Stalled(std::time::Duration),
    /// A backfill range that cannot be used.
    #[error("backfill of {name:?}: {why}")]
    Range {
        /// The schedule.
        name: String,
        /// What is wrong.
        why: String,
    },
}

impl TimerError {
    /// The kind of the error: not found, invalid input, or the mesh's own.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Mesh(m) => m.kind(),
            Self::Catalog(CatalogError::Mesh(m)) => m.kind(),
            Self::Catalog(CatalogError::NotFound { .. }) | Self::NotFound { .. } => {
                ErrorKind::NotFound
            }
            Self::Catalog(CatalogError::BadPath { .. })
            | Self::Record(_)
            | Self::Exists { .. }
            | Self::Range { .. } => ErrorKind::Invalid,
            Self::Stalled(_) => ErrorKind::Transient,
        }
    }
}
