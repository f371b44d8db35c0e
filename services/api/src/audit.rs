//! Audit records: one log line with target `audit` per change a caller
//! made (started or cancelled an execution, registered or deleted a
//! playbook, stored or deleted a credential), whoever it was and whether
//! it was done. Shipped with the other logs; never a secret, never a token.

use crate::auth::Principal;

/// One audited action.
pub struct Audit<'a> {
    /// Who.
    pub principal: &'a Principal,
    /// What: `execution.start`, `execution.cancel`, `catalog.register`,
    /// `catalog.delete`, `credential.put`, `credential.delete`.
    pub action: &'static str,
    /// On what: an execution id, `<path>@v<N>`, a credential name.
    pub target: &'a str,
    /// `ok`, or why it was not done.
    pub outcome: &'a str,
}

/// Write the record.
pub fn record(a: Audit<'_>) {
    tracing::info!(
        target: "audit",
        principal = %a.principal.name,
        role = %a.principal.role.name(),
        action = %a.action,
        object = %a.target,
        outcome = %a.outcome,
        "audit"
    );
}
