//! `POST /api/catalog/register|list|resource|delete`.

use axum::extract::State;
use axum::{Extension, Json};

use crate::audit::{audited, Change};
use crate::auth::Principal;
use crate::contract::catalog::{
    CatalogBatchItem, CatalogBatchRequest, CatalogBatchResponse, CatalogDeleteRequest,
    CatalogDeleteResponse, CatalogEntries, CatalogEntriesRequest, CatalogEntryRequest,
    CatalogEntryResponse, CatalogRegisterRequest, CatalogRegisterResponse, DeletedCatalogEntry,
};
use crate::contract::ErrorBody;
use crate::error::ApiError;
use crate::extract::{Body, OptionalBody};
use crate::shape::catalog::{
    catalog_id, entry_response, parse_catalog_id, registration, version_of, RegisterInput,
};
use crate::state::AppState;
use noetl_mesh::catalog::NewVersion;

/// Validate a playbook and store it as the next version of its path; one
/// in NoETL's dialect is stored as `noetl migrate` rewrites it, with the
/// text as sent beside it.
#[utoipa::path(post, path = "/api/catalog/register", tag = "catalog",
    request_body = CatalogRegisterRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Stored", body = CatalogRegisterResponse),
        (status = 400, description = "Not JSON", body = ErrorBody),
        (status = 401, description = "No token", body = ErrorBody),
        (status = 403, description = "Not admin", body = ErrorBody),
        (status = 422, description = "The playbook does not load (with `diagnostics`)", body = ErrorBody)))]
pub async fn register(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(req): Body<CatalogRegisterRequest>,
) -> Result<Json<CatalogRegisterResponse>, ApiError> {
    register_one(&state, &principal, &req).await.map(Json)
}

/// Validate and store one registration, audited.
async fn register_one(
    state: &AppState,
    principal: &Principal,
    req: &CatalogRegisterRequest,
) -> Result<CatalogRegisterResponse, ApiError> {
    // The check runs a python interpreter (E048): off the runtime's threads.
    let (content, resource_type, migrate) =
        (req.content.clone(), req.resource_type.clone(), req.migrate);
    let reg = tokio::task::spawn_blocking(move || {
        registration(RegisterInput {
            content: &content,
            resource_type: &resource_type,
            migrate,
        })
    })
    .await
    .unwrap_or_else(|e| {
        Err(ApiError::Internal(format!(
            "the registration's checks did not finish: {e}"
        )))
    });
    let reg = match reg {
        Ok(r) => r,
        Err(e) => {
            let change = Change {
                principal,
                action: "catalog.register",
                target: "<request>",
            };
            return audited(state, change, Err(e)).await;
        }
    };
    let stored = state
        .mesh
        .catalog()
        .register_version(NewVersion {
            path: &reg.path,
            name: &reg.name,
            yaml: &reg.text,
            original: reg.original.as_deref(),
        })
        .await
        .map_err(ApiError::from);
    let target = stored
        .as_ref()
        .map(|e| catalog_id(&e.path, e.version))
        .unwrap_or_else(|_| reg.path.clone());
    let change = Change {
        principal,
        action: "catalog.register",
        target: &target,
    };
    let entry = audited(state, change, stored).await?;
    Ok(CatalogRegisterResponse {
        status: "success".into(),
        message: format!(
            "Resource '{}' version '{}' registered.",
            entry.path, entry.version
        ),
        catalog_id: catalog_id(&entry.path, entry.version),
        path: entry.path,
        version: entry.version,
        kind: "playbook".into(),
        name: entry.name,
        warnings: reg.warnings,
        migrated: reg.original.is_some(),
    })
}

/// Most registrations in one batch.
pub const MAX_BATCH: usize = 1000;

/// Register up to 1,000 playbooks (NoETL's `catalog load`); each succeeds
/// or fails alone.
#[utoipa::path(post, path = "/api/catalog/register/batch", tag = "catalog",
    request_body = CatalogBatchRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One result per item", body = CatalogBatchResponse),
        (status = 403, description = "Not admin", body = ErrorBody),
        (status = 422, description = "Empty, or over 1,000 items", body = ErrorBody)))]
pub async fn register_batch(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(batch): Body<CatalogBatchRequest>,
) -> Result<Json<CatalogBatchResponse>, ApiError> {
    let n = batch.items.len();
    if n == 0 || n > MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "a batch needs 1-{MAX_BATCH} registrations in 'items'; it has {n}"
        )));
    }
    let mut outcomes = Vec::with_capacity(n);
    for req in &batch.items {
        outcomes.push(register_one(&state, &principal, &req.0).await);
    }
    Ok(Json(batch_response(outcomes)))
}

/// The answer to a batch from each registration's outcome.
fn batch_response(
    outcomes: Vec<Result<CatalogRegisterResponse, ApiError>>,
) -> CatalogBatchResponse {
    let results: Vec<CatalogBatchItem> = outcomes
        .into_iter()
        .enumerate()
        .map(|(index, o)| match o {
            Ok(r) => CatalogBatchItem {
                index,
                status: "success".into(),
                path: Some(r.path),
                version: Some(r.version),
                catalog_id: Some(r.catalog_id),
                warnings: r.warnings,
                migrated: r.migrated,
                error: None,
                diagnostics: None,
            },
            Err(e) => {
                let diagnostics = match &e {
                    ApiError::Validation { diagnostics, .. } => diagnostics.clone(),
                    _ => None,
                };
                CatalogBatchItem {
                    index,
                    status: "error".into(),
                    path: None,
                    version: None,
                    catalog_id: None,
                    warnings: Vec::new(),
                    migrated: false,
                    error: Some(e.to_string()),
                    diagnostics,
                }
            }
        })
        .collect();
    let registered = results.iter().filter(|r| r.status == "success").count();
    let failed = results.len() - registered;
    let status = match (registered, failed) {
        (_, 0) => "success",
        (0, _) => "error",
        _ => "partial",
    };
    CatalogBatchResponse {
        status: status.into(),
        registered,
        failed,
        skipped: 0,
        results,
    }
}

/// The latest version of every path (the body is optional).
#[utoipa::path(post, path = "/api/catalog/list", tag = "catalog",
    request_body(content = CatalogEntriesRequest, description = "Optional"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Sorted by path", body = CatalogEntries),
        (status = 401, description = "No token", body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    OptionalBody(req): OptionalBody<CatalogEntriesRequest>,
) -> Result<Json<CatalogEntries>, ApiError> {
    let wanted = req
        .resource_type
        .as_deref()
        .is_none_or(|t| t.eq_ignore_ascii_case("playbook"));
    let entries = if wanted {
        state.mesh.catalog().list().await?
    } else {
        Vec::new()
    };
    Ok(Json(CatalogEntries {
        entries: entries.iter().map(entry_response).collect(),
    }))
}

/// One version: by `catalog_id`, or by `path` and `version` (default
/// latest).
#[utoipa::path(post, path = "/api/catalog/resource", tag = "catalog",
    request_body = CatalogEntryRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The version", body = CatalogEntryResponse),
        (status = 404, description = "Not registered", body = ErrorBody),
        (status = 422, description = "Neither `catalog_id` nor `path`, or a bad one", body = ErrorBody)))]
pub async fn resource(
    State(state): State<AppState>,
    Body(req): Body<CatalogEntryRequest>,
) -> Result<Json<CatalogEntryResponse>, ApiError> {
    let (path, version) = match (&req.catalog_id, &req.path) {
        (Some(id), _) => {
            let (p, v) = parse_catalog_id(id.trim()).ok_or_else(|| {
                ApiError::invalid(format!("Invalid catalog_id {id:?}: use `<path>@v<N>`"))
            })?;
            (p, Some(v))
        }
        (None, Some(p)) => (p.trim().to_string(), version_of(req.version.as_ref())?),
        (None, None) => {
            return Err(ApiError::invalid(
                "Either 'catalog_id' or 'path' must be provided",
            ))
        }
    };
    let entry = state.mesh.catalog().get(&path, version).await?;
    Ok(Json(entry_response(&entry)))
}

/// Delete one version of a path, or all (idempotent: nothing matched is
/// 200 with `count: 0`). "Latest" is then the highest version left.
#[utoipa::path(post, path = "/api/catalog/delete", tag = "catalog",
    request_body = CatalogDeleteRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "What was removed", body = CatalogDeleteResponse),
        (status = 403, description = "Not admin", body = ErrorBody),
        (status = 422, description = "No path, or version 0", body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Body(req): Body<CatalogDeleteRequest>,
) -> Result<Json<CatalogDeleteResponse>, ApiError> {
    let path = req.path.trim().to_string();
    let target = match req.version {
        Some(v) => catalog_id(&path, v),
        None => path.clone(),
    };
    let removed = if path.is_empty() {
        Err(ApiError::invalid(
            "catalog delete requires a non-empty 'path'",
        ))
    } else if req.version == Some(0) {
        Err(ApiError::invalid(
            "version 0 is not a version: versions start at 1",
        ))
    } else {
        state
            .mesh
            .catalog()
            .delete(&path, req.version)
            .await
            .map_err(ApiError::from)
    };
    let change = Change {
        principal: &principal,
        action: "catalog.delete",
        target: &target,
    };
    let removed = audited(&state, change, removed).await?;
    let message = match (removed.len(), req.version) {
        (0, Some(v)) => format!("No catalog entry '{path}' version {v}; nothing removed."),
        (0, None) => format!("No catalog entries for '{path}'; nothing removed."),
        (_, Some(v)) => format!("Removed catalog entry '{path}' version {v}."),
        (n, None) => format!("Removed {n} version(s) of catalog entry '{path}'."),
    };
    Ok(Json(CatalogDeleteResponse {
        status: "success".into(),
        message,
        deleted: removed
            .iter()
            .map(|v| DeletedCatalogEntry {
                catalog_id: catalog_id(&path, *v),
                version: *v,
            })
            .collect(),
        count: removed.len(),
        path,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(path: &str) -> Result<CatalogRegisterResponse, ApiError> {
        Ok(CatalogRegisterResponse {
            status: "success".into(),
            message: String::new(),
            path: path.into(),
            version: 1,
            catalog_id: format!("{path}@v1"),
            kind: "playbook".into(),
            name: "n".into(),
            warnings: Vec::new(),
            migrated: false,
        })
    }

    #[test]
    fn a_batch_counts_each_registration_and_keeps_the_diagnostics() {
        let refused = ApiError::Validation {
            message: "E006".into(),
            diagnostics: Some(serde_json::json!([{"code": "E006"}])),
        };
        let r = batch_response(vec![stored("a"), Err(refused), stored("b")]);
        assert_eq!(
            (r.status.as_str(), r.registered, r.failed),
            ("partial", 2, 1)
        );
        assert_eq!(
            r.results[1].diagnostics.as_ref().unwrap()[0]["code"],
            "E006"
        );
        assert_eq!(r.results[2].catalog_id.as_deref(), Some("b@v1"));
        let all = batch_response(vec![stored("a")]);
        assert_eq!(all.status, "success");
        let none = batch_response(vec![Err(ApiError::invalid("x"))]);
        assert_eq!(none.status, "error");
    }
}
