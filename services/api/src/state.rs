//! What every handler shares: the mesh, the tokens, the auth mode, and the
//! signal that ends open event streams when the API drains.

use std::sync::Arc;
use std::time::Instant;

use noetl_mesh::Mesh;
use tokio_util::sync::CancellationToken;

use crate::auth::AuthMode;
use crate::tokens::Tokens;

/// The handlers' state (cheap to clone).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// What [`AppState`] holds.
pub struct Shared {
    /// The mesh this API reads and publishes to.
    pub mesh: Mesh,
    /// Its tokens.
    pub tokens: Tokens,
    /// Whether requests need a token.
    pub mode: AuthMode,
    /// When the API started (`uptime_seconds`).
    pub started: Instant,
    /// Cancelled when the API drains: open event streams end.
    pub draining: CancellationToken,
}

impl AppState {
    /// A state over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}
