//! The web console: a single-page app (hand-written HTML, CSS and ES
//! modules under `services/api/console/`, embedded in the binary) served by
//! the API process at `/`, and the few read-only routes it needs beyond
//! NoETL's REST contract. The app talks to the API only through its
//! routes, with the bearer token the user enters once (kept in the tab's
//! `sessionStorage`, never in a URL). What each page shows: `docs/console.md`.
//!
//! Routes:
//!
//! | route | role | answer |
//! |---|---|---|
//! | `GET /` | none | the app (`index.html`) |
//! | `GET /console/{file}` | none | its assets (CSS, JS modules, icon) |
//! | `GET /api/console/whoami` | viewer | `{name, role, auth_required}`: who the token is, so the app shows only what the role may do |
//! | `GET /api/console/executions/{id}/graph` | viewer | the plan's steps and arcs laid out in layers, each step with its latest status and loop progress ([`graph::Graph`]) |
//!
//! The assets need no token (they hold no data); every `/api/console/...`
//! route sits behind the same token check as the API's viewer routes.
//! Console responses carry a strict Content-Security-Policy: scripts and
//! styles from this origin only, no inline script, no framing.

pub mod assets;
pub mod graph;
pub mod layout;

use axum::extract::State;
use axum::middleware::from_fn_with_state;
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::auth::{AuthMode, Principal, Role};
use crate::middleware::{require, Needs};
use crate::state::AppState;

/// `GET /api/console/whoami`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhoAmI {
    /// The token's name (never the token), or `anonymous`.
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    pub role: Role,
    /// False when the API runs without tokens (loopback, or
    /// `--insecure-no-auth`): the app then asks for none.
    pub auth_required: bool,
}

/// Who the request's token is.
async fn whoami(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Json<WhoAmI> {
    Json(WhoAmI {
        name: principal.name,
        role: principal.role,
        auth_required: state.mode.current() == AuthMode::Required,
    })
}

/// The console's routes over `state`, to merge into the API's router
/// before its fallback: the app and its assets without a token, the
/// `/api/console/...` routes behind the viewer role.
pub fn routes(state: &AppState) -> Router<AppState> {
    let needs = Needs {
        state: state.clone(),
        role: Role::Viewer,
    };
    let data: Router<AppState> = Router::new()
        .route("/api/console/whoami", get(whoami))
        .route("/api/console/executions/{id}/graph", get(graph::graph))
        .route_layer(from_fn_with_state(needs, require));
    assets::routes().merge(data)
}
