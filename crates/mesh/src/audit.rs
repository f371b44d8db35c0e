//! Audit events: who started, cancelled or changed what, and whether it
//! was done. An action on an execution is filed under that execution
//! (`<p>.evt.<eid>.audit`, so it is among its events); a change of the
//! catalog or the credentials, which belongs to no execution, under
//! [`MESH_SCOPE`] (`<p>.evt._mesh.audit`). No service acts on them; they
//! are for people and their tools (`noetl events tail --type audit`,
//! `GET /api/events?type=audit`). Never a secret, never a token.

use serde::{Deserialize, Serialize};

use crate::events::EventDraft;
use crate::{Mesh, MeshError};

pub use crate::ids::MESH_SCOPE;

/// The payload of an `audit` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Audit {
    /// Who: a token's name (never the token), `anonymous`, or the local
    /// user of the CLI.
    pub principal: String,
    /// Their role (`viewer`, `operator`, `admin`; `local` for the CLI).
    pub role: String,
    /// What: `execution.start`, `execution.cancel`, `catalog.register`,
    /// `catalog.delete`, `credential.put`, `credential.delete`.
    pub action: String,
    /// On what: an execution id, `<path>@v<N>`, a credential name.
    pub object: String,
    /// `ok`, or why it was not done.
    pub outcome: String,
}

crate::payloads::payload_of! { Audit => Audit }

impl Mesh {
    /// Publish an audit event under `execution` (or [`MESH_SCOPE`]) and
    /// wait for the stream to store it.
    pub async fn audit(&self, execution: Option<&str>, record: &Audit) -> Result<(), MeshError> {
        let discriminator = uuid::Uuid::now_v7().to_string();
        let event = EventDraft {
            execution_id: execution.unwrap_or(MESH_SCOPE),
            discriminator: &discriminator,
            ..EventDraft::default()
        }
        .build(record);
        self.emit(&event).await?.wait().await
    }
}
