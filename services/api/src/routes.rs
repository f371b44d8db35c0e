//! The routes, the role each needs, and the OpenAPI document generated
//! from the handlers and their types.

use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::auth::Role;
use crate::error::ApiError;
use crate::handlers::{
    catalog, credentials, ehdb, events, execute, executions, health, history, lifecycle, operate,
};
use crate::middleware::{identify, require, Needs};
use crate::state::AppState;

pub use crate::limits::MAX_BODY;

/// The OpenAPI document of the API.
#[derive(OpenApi)]
#[openapi(
    info(title = "NoETL mesh API", description = "NoETL's REST contract over the mesh (docs/api.md)."),
    paths(
        health::health, health::api_health,
        catalog::register, catalog::register_batch, catalog::list, catalog::resource, catalog::delete,
        execute::execute, execute::execute_batch,
        executions::list, executions::get, executions::status, executions::cancel, executions::result,
        history::state_at,
        operate::pause, operate::unpause, operate::signal, operate::resume,
        lifecycle::rerun, lifecycle::cleanup,
        events::execution_events, events::all_events,
        ehdb::executions, ehdb::execution, ehdb::events,
        credentials::create, credentials::list, credentials::get, credentials::delete,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "health", description = "Probes (no token)"),
        (name = "catalog", description = "Registered playbooks"),
        (name = "executions", description = "Start, watch, pause and cancel executions"),
        (name = "events", description = "Server-Sent Events of the event stream"),
        (name = "ehdb", description = "NoETL's read-only views of executions and their events"),
        (name = "credentials", description = "The encrypted keychain: names and kinds out, never data"),
    )
)]
pub struct ApiDoc;

/// Declares the `bearer` security scheme the paths refer to.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document `GET /api/openapi.json` serves: generated, then
/// conformed to what the server answers ([`crate::openapi::conform`]).
pub fn openapi_document() -> serde_json::Value {
    static DOC: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    DOC.get_or_init(|| {
        let generated = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
        crate::openapi::conform(generated)
    })
    .clone()
}

/// `GET /api/openapi.json`.
async fn openapi() -> Json<serde_json::Value> {
    Json(openapi_document())
}

/// `routes` behind a layer that needs `role`.
fn needing(state: &AppState, role: Role, routes: Router<AppState>) -> Router<AppState> {
    let needs = Needs {
        state: state.clone(),
        role,
    };
    routes.route_layer(from_fn_with_state(needs, require))
}

fn viewer_routes() -> Router<AppState> {
    Router::new()
        .route("/api/catalog/list", post(catalog::list))
        .route("/api/catalog/resource", post(catalog::resource))
        .route("/api/executions", get(executions::list))
        .route("/api/executions/{id}", get(executions::get))
        .route("/api/executions/{id}/status", get(executions::status))
        .route("/api/executions/{id}/events", get(events::execution_events))
        .route("/api/executions/{id}/state", get(history::state_at))
        .route(
            "/api/executions/{id}/results/{step}",
            get(executions::result),
        )
        .route("/api/events", get(events::all_events))
        .route("/api/ehdb/executions", get(ehdb::executions))
        .route("/api/ehdb/executions/{id}", get(ehdb::execution))
        .route("/api/ehdb/executions/{id}/events", get(ehdb::events))
        .route("/api/credentials", get(credentials::list))
        .route("/api/credentials/{name}", get(credentials::get))
}

fn operator_routes() -> Router<AppState> {
    Router::new()
        .route("/api/execute", post(execute::execute))
        .route("/api/execute/batch", post(execute::execute_batch))
        .route("/api/executions/{id}/cancel", post(executions::cancel))
        .route("/api/executions/{id}/pause", post(operate::pause))
        .route("/api/executions/{id}/unpause", post(operate::unpause))
        .route("/api/executions/{id}/resume", post(operate::resume))
        .route("/api/executions/{id}/rerun", post(lifecycle::rerun))
        .route("/api/executions/{id}/signals/{name}", post(operate::signal))
}

fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/api/catalog/register", post(catalog::register))
        .route("/api/catalog/register/batch", post(catalog::register_batch))
        .route("/api/executions/cleanup", post(lifecycle::cleanup))
        .route("/api/catalog/delete", post(catalog::delete))
        .route("/api/credentials", post(credentials::create))
        .route("/api/credentials/{name}", delete(credentials::delete))
}

/// 404 for a path no route has.
async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route {method} {}", uri.path()))
}

/// 405 for a method a path does not take.
async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::Http {
        status: axum::http::StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{} does not take {method}", uri.path()),
    }
}

/// Every API route over `state` (with `extra` routes merged in before
/// the layers, e.g. the mesh's `/healthz`, `/readyz`, `/metrics`): each
/// request identified and logged, protected routes behind their role.
pub fn router(state: AppState, extra: Router) -> Router {
    let public: Router<AppState> = Router::new()
        .route("/health", get(health::health))
        .route("/api/health", get(health::api_health))
        .route("/api/openapi.json", get(openapi));
    public
        .merge(needing(&state, Role::Viewer, viewer_routes()))
        .merge(needing(&state, Role::Operator, operator_routes()))
        .merge(needing(&state, Role::Admin, admin_routes()))
        .merge(crate::console::routes(&state))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state.clone())
        .merge(extra)
        .layer(from_fn_with_state(state, identify))
}
