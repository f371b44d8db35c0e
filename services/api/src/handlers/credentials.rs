//! `POST /api/credentials`, `GET /api/credentials[/{name}]`,
//! `DELETE /api/credentials/{name}`: data goes in (encrypted in the
//! vault) and never comes out.

use axum::extract::State;
use axum::{Extension, Json};

use crate::audit::{audited, Change};
use crate::auth::Principal;
use crate::contract::credentials::{
    CredentialCreateRequest, CredentialDeleteResponse, CredentialFilter, CredentialListResponse,
    CredentialResponse, GetCredentialQuery,
};
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::{Body, CredentialName, Params};
use crate::shape::credentials::{select, to_store, view};
use crate::state::AppState;

/// Encrypt and store a credential (replacing one of the same name).
#[utoipa::path(post, path = "/api/credentials", tag = "credentials",
    request_body = CredentialCreateRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Stored (name and kind only)", body = CredentialResponse),
        (status = 403, description = "Not admin", body = ErrorBody),
        (status = 422, description = "No name, an unknown type, or data without the kind's fields", body = ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(req): Body<CredentialCreateRequest>,
) -> Result<Json<CredentialResponse>, ApiError> {
    let name = req.name.trim().to_string();
    let done = async {
        let cred = to_store(req)?;
        state.mesh.vault().put(&cred).await?;
        Ok(cred.kind)
    }
    .await;
    let change = Change {
        principal: &principal,
        action: "credential.put",
        target: &name,
    };
    let kind = audited(&state, change, done).await?;
    let now = noetl_mesh::events::now_rfc3339();
    Ok(Json(CredentialResponse {
        id: name.clone(),
        name,
        credential_type: kind,
        created_at: now.clone(),
        updated_at: now,
        data_withheld: None,
    }))
}

/// Names and kinds (filtered by `type` and `q`).
#[utoipa::path(get, path = "/api/credentials", tag = "credentials",
    params(CredentialFilter),
    security(("bearer" = [])),
    responses((status = 200, description = "Names and kinds, never data", body = CredentialListResponse)))]
pub async fn list(
    State(state): State<AppState>,
    Params(f): Params<CredentialFilter>,
) -> Result<Json<CredentialListResponse>, ApiError> {
    let all = state.mesh.vault().list().await?;
    let items = select(&all, &f);
    let filtered = f.credential_type.is_some() || f.q.is_some();
    Ok(Json(CredentialListResponse {
        items,
        filter: filtered.then_some(f),
    }))
}

/// What `include_data=true` is answered with, beside the name and kind.
pub const WITHHELD: &str =
    "this API never returns credential data; executors decrypt what their playbooks declare";

/// One credential's name and kind (with `include_data=true`, a field
/// saying the data is held back).
#[utoipa::path(get, path = "/api/credentials/{name}", tag = "credentials",
    params(("name" = String, Path, description = "Credential name"), GetCredentialQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Name and kind", body = CredentialResponse),
        (status = 404, description = "Not stored", body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    CredentialName(name): CredentialName,
    Params(q): Params<GetCredentialQuery>,
) -> Result<Json<CredentialResponse>, ApiError> {
    let all = state.mesh.vault().list().await?;
    let mut found = all
        .iter()
        .find(|c| c.name == name)
        .map(view)
        .ok_or_else(|| ApiError::NotFound(format!("credential `{name}` is not stored")))?;
    if q.include_data {
        found.data_withheld = Some(WITHHELD.into());
    }
    Ok(Json(found))
}

/// Delete a credential.
#[utoipa::path(delete, path = "/api/credentials/{name}", tag = "credentials",
    params(("name" = String, Path, description = "Credential name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Deleted", body = CredentialDeleteResponse),
        (status = 403, description = "Not admin", body = ErrorBody),
        (status = 404, description = "Not stored", body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    CredentialName(name): CredentialName,
) -> Result<Json<CredentialDeleteResponse>, ApiError> {
    let done = async {
        if state.mesh.vault().delete(&name).await? {
            Ok(())
        } else {
            Err(ApiError::NotFound(format!(
                "credential `{name}` is not stored"
            )))
        }
    }
    .await;
    let change = Change {
        principal: &principal,
        action: "credential.delete",
        target: &name,
    };
    audited(&state, change, done).await?;
    Ok(Json(CredentialDeleteResponse {
        message: "Credential deleted successfully".into(),
        id: name,
    }))
}
