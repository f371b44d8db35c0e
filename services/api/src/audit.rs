//! Audit records: for each change a caller made (started or cancelled an
//! execution, registered or deleted a playbook, stored or deleted a
//! credential), whoever it was and whether it was done, an `audit` event
//! on the mesh's event stream ([`noetl_mesh::audit`]) and a log line with
//! target `audit`. Never a secret, never a token.

use noetl_mesh::ids::is_valid_execution_id;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::logged::field;
use crate::state::AppState;

/// One change a caller asked for.
pub struct Change<'a> {
    /// Who.
    pub principal: &'a Principal,
    /// What: `execution.start`, `execution.cancel`, `catalog.register`,
    /// `catalog.delete`, `credential.put`, `credential.delete`.
    pub action: &'static str,
    /// On what: an execution id, `<path>@v<N>`, a credential name.
    pub target: &'a str,
}

/// The execution an audit record is filed under: the target of an
/// action on an execution, when it names one (a refused start does not).
pub fn scope_of<'a>(change: &Change<'a>) -> Option<&'a str> {
    (change.action.starts_with("execution.") && is_valid_execution_id(change.target))
        .then_some(change.target)
}

/// The outcome word of a result: `ok`, or `refused (<status>): <why>`.
pub fn outcome_of<T>(result: &Result<T, ApiError>) -> String {
    match result {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("refused ({}): {e}", e.status().as_u16()),
    }
}

/// Record `change` with the outcome of `result`, and pass the result on.
/// The event is awaited until stored; when it cannot be (the mesh is
/// unreachable), the log line still says what happened and an error line
/// says the event is missing.
pub async fn audited<T>(
    state: &AppState,
    change: Change<'_>,
    result: Result<T, ApiError>,
) -> Result<T, ApiError> {
    let record = noetl_mesh::audit::Audit {
        principal: change.principal.name.clone(),
        role: change.principal.role.name().to_string(),
        action: change.action.to_string(),
        object: change.target.to_string(),
        outcome: outcome_of(&result),
    };
    tracing::info!(
        target: "audit",
        principal = %field(&record.principal),
        role = %record.role,
        action = %record.action,
        object = %field(&record.object),
        outcome = %field(&record.outcome),
        "audit"
    );
    if let Err(e) = state.mesh.audit(scope_of(&change), &record).await {
        tracing::error!(target: "audit", action = %record.action, object = %field(&record.object), error = %field(&e.to_string()), "the audit event could not be stored");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    #[test]
    fn actions_on_executions_are_filed_under_them_and_the_rest_under_the_mesh() {
        let p = Principal {
            name: "ci".into(),
            role: Role::Operator,
        };
        let change = |action, target| Change {
            principal: &p,
            action,
            target,
        };
        assert_eq!(scope_of(&change("execution.cancel", "e1")), Some("e1"));
        assert_eq!(scope_of(&change("execution.start", "<request>")), None);
        assert_eq!(scope_of(&change("catalog.register", "flows/a@v1")), None);
        assert_eq!(scope_of(&change("credential.put", "pg")), None);
        let refused: Result<(), ApiError> = Err(ApiError::NotFound("no such".into()));
        assert_eq!(outcome_of(&refused), "refused (404): no such");
        assert_eq!(outcome_of(&Ok::<_, ApiError>(())), "ok");
    }
}
