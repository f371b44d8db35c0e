//! Who may do what: roles, the caller a request names, and the decisions
//! (which role a route needs is fixed in `routes`; whether a caller has
//! it, and whether the API may start on an address, are plain functions
//! here). Tokens themselves are in [`crate::tokens`].

use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A role, ordered: each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read: catalog, executions, events, results, credential names.
    Viewer,
    /// Viewer, and start and cancel executions.
    Operator,
    /// Operator, and change the catalog and the credentials.
    Admin,
}

impl Role {
    /// Its name, as tokens and logs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// A role name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}: use viewer, operator or admin")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(UnknownRole(other.to_string())),
        }
    }
}

/// Who made a request that was let through: a token's name and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's name (never the token), or `anonymous`.
    pub name: String,
    /// Its role.
    pub role: Role,
}

impl Principal {
    /// The caller of an API running without tokens: allowed everything.
    pub fn anonymous() -> Self {
        Self {
            name: ANONYMOUS.into(),
            role: Role::Admin,
        }
    }
}

/// The name of a caller without a token.
pub const ANONYMOUS: &str = "anonymous";

/// What a request's `Authorization` header names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No header.
    Nobody,
    /// A header that is not a known bearer token: why.
    Refused(String),
    /// A known token.
    Known(Principal),
}

impl Caller {
    /// The name to log for it.
    pub fn log_name(&self) -> &str {
        match self {
            Caller::Nobody => ANONYMOUS,
            Caller::Refused(_) => "unknown-token",
            Caller::Known(p) => &p.name,
        }
    }
}

/// Whether requests need a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Every protected route needs a token of a sufficient role.
    Required,
    /// No token is configured: requests without one are allowed everything
    /// (a token sent is still checked).
    Open,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// 401: no token, or one that is not known.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403: the token's role is not enough.
    #[error("token `{name}` has role {have}; this needs {need}", have = .have.name(), need = .need.name())]
    Forbidden {
        /// The token's name.
        name: String,
        /// Its role.
        have: Role,
        /// The role needed.
        need: Role,
    },
}

/// Let `caller` through a route that needs `needed`, or say why not.
pub fn authorize(mode: AuthMode, caller: &Caller, needed: Role) -> Result<Principal, Denied> {
    match caller {
        Caller::Known(p) if p.role >= needed => Ok(p.clone()),
        Caller::Known(p) => Err(Denied::Forbidden {
            name: p.name.clone(),
            have: p.role,
            need: needed,
        }),
        Caller::Refused(why) => Err(Denied::Unauthenticated(why.clone())),
        Caller::Nobody => match mode {
            AuthMode::Open => Ok(Principal::anonymous()),
            AuthMode::Required => Err(Denied::Unauthenticated(format!(
                "this needs a bearer token (role {} or more): send `Authorization: Bearer <token>`",
                needed.name()
            ))),
        },
    }
}

/// Longest token accepted (a longer one is refused before any lookup).
pub const MAX_TOKEN_LEN: usize = 512;

/// The token of an `Authorization` header: `None` without one, an error
/// (the 401 message) for any other scheme or an empty or oversized token.
pub fn bearer(header: Option<&str>) -> Result<Option<&str>, String> {
    let Some(value) = header else {
        return Ok(None);
    };
    let (scheme, token) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err("the Authorization header must be `Bearer <token>`".into());
    }
    let token = token.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err("the bearer token is empty or too long".into());
    }
    Ok(Some(token))
}

/// Why the API will not start on an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing to serve the API on {addr} without authentication: no token is configured (create one with `noetl admin token create --role admin --name NAME`, or set NOETL_API_BOOTSTRAP_TOKEN), bind a loopback address, or pass --insecure-no-auth")]
pub struct Unprotected {
    /// The address asked for.
    pub addr: SocketAddr,
}

/// How the API runs on `addr`: with tokens configured, tokens are
/// required; without, only on loopback, or anywhere with
/// `insecure_no_auth`.
pub fn startup_mode(
    addr: SocketAddr,
    has_tokens: bool,
    insecure_no_auth: bool,
) -> Result<AuthMode, Unprotected> {
    if has_tokens {
        Ok(AuthMode::Required)
    } else if addr.ip().is_loopback() || insecure_no_auth {
        Ok(AuthMode::Open)
    } else {
        Err(Unprotected { addr })
    }
}

/// The mode while the API runs, once tokens come or go: any token makes
/// tokens required (a token made after the start needs no restart);
/// without tokens the start's rule holds, except that an address others
/// can reach, allowed at the start only because tokens existed, now lets
/// nobody in rather than everybody.
pub fn live_mode(addr: SocketAddr, has_tokens: bool, insecure_no_auth: bool) -> AuthMode {
    startup_mode(addr, has_tokens, insecure_no_auth).unwrap_or(AuthMode::Required)
}

/// The auth mode of a running API, changed by [`live_mode`] as tokens are
/// made and revoked.
#[derive(Debug)]
pub struct ModeCell {
    addr: SocketAddr,
    insecure_no_auth: bool,
    required: std::sync::atomic::AtomicBool,
}

impl ModeCell {
    /// The mode on `addr` with tokens present or not.
    pub fn new(addr: SocketAddr, has_tokens: bool, insecure_no_auth: bool) -> Self {
        let cell = Self {
            addr,
            insecure_no_auth,
            required: std::sync::atomic::AtomicBool::new(true),
        };
        cell.tokens_present(has_tokens);
        cell
    }

    /// The mode now.
    pub fn current(&self) -> AuthMode {
        if self.required.load(std::sync::atomic::Ordering::Acquire) {
            AuthMode::Required
        } else {
            AuthMode::Open
        }
    }

    /// Tokens are present or not; returns the mode when it changed.
    pub fn tokens_present(&self, has_tokens: bool) -> Option<AuthMode> {
        let mode = live_mode(self.addr, has_tokens, self.insecure_no_auth);
        let required = mode == AuthMode::Required;
        let before = self
            .required
            .swap(required, std::sync::atomic::Ordering::AcqRel);
        (before != required).then_some(mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(role: Role) -> Caller {
        Caller::Known(Principal {
            name: "ci".into(),
            role,
        })
    }

    #[test]
    fn each_role_includes_the_ones_below_it() {
        use Role::*;
        let table = [
            (Viewer, Viewer, true),
            (Viewer, Operator, false),
            (Viewer, Admin, false),
            (Operator, Viewer, true),
            (Operator, Operator, true),
            (Operator, Admin, false),
            (Admin, Viewer, true),
            (Admin, Operator, true),
            (Admin, Admin, true),
        ];
        for (have, need, ok) in table {
            let got = authorize(AuthMode::Required, &known(have), need);
            assert_eq!(got.is_ok(), ok, "{have:?} for {need:?}");
            if let Err(e) = got {
                assert!(matches!(e, Denied::Forbidden { .. }), "{e}");
                assert!(e.to_string().contains(need.name()), "{e}");
            }
        }
    }

    #[test]
    fn no_token_is_401_unless_the_api_runs_open() {
        let e = authorize(AuthMode::Required, &Caller::Nobody, Role::Viewer).unwrap_err();
        assert!(
            matches!(e, Denied::Unauthenticated(ref m) if m.contains("Bearer")),
            "{e}"
        );
        let p = authorize(AuthMode::Open, &Caller::Nobody, Role::Admin).unwrap();
        assert_eq!(p, Principal::anonymous());
        // A token that is not known is refused even when open.
        let bad = Caller::Refused("unknown".into());
        assert!(authorize(AuthMode::Open, &bad, Role::Viewer).is_err());
        // A known token keeps its role when open.
        assert!(authorize(AuthMode::Open, &known(Role::Viewer), Role::Admin).is_err());
    }

    #[test]
    fn only_bearer_tokens_are_read() {
        assert_eq!(bearer(None), Ok(None));
        assert_eq!(bearer(Some("Bearer abc")), Ok(Some("abc")));
        assert_eq!(bearer(Some("bearer  abc ")), Ok(Some("abc")));
        assert!(bearer(Some("Basic dXNlcjpwdw==")).is_err());
        assert!(bearer(Some("Bearer")).is_err());
        assert!(bearer(Some(&format!("Bearer {}", "x".repeat(MAX_TOKEN_LEN + 1)))).is_err());
    }

    #[test]
    fn roles_parse_from_their_names_only() {
        for r in [Role::Viewer, Role::Operator, Role::Admin] {
            assert_eq!(r.name().parse::<Role>(), Ok(r));
        }
        assert!("root"
            .parse::<Role>()
            .unwrap_err()
            .to_string()
            .contains("viewer, operator or admin"));
    }

    #[test]
    fn without_tokens_only_loopback_or_an_explicit_flag() {
        let lo: SocketAddr = "127.0.0.1:8082".parse().unwrap();
        let lo6: SocketAddr = "[::1]:8082".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8082".parse().unwrap();
        assert_eq!(startup_mode(any, true, false), Ok(AuthMode::Required));
        assert_eq!(startup_mode(lo, true, true), Ok(AuthMode::Required));
        assert_eq!(startup_mode(lo, false, false), Ok(AuthMode::Open));
        assert_eq!(startup_mode(lo6, false, false), Ok(AuthMode::Open));
        assert_eq!(startup_mode(any, false, true), Ok(AuthMode::Open));
        let e = startup_mode(any, false, false).unwrap_err();
        assert!(e.to_string().contains("--insecure-no-auth"), "{e}");
    }

    #[test]
    fn a_token_made_while_running_requires_tokens_and_revoking_all_reopens_only_loopback() {
        let local: SocketAddr = "127.0.0.1:8082".parse().unwrap();
        let cell = ModeCell::new(local, false, false);
        assert_eq!(cell.current(), AuthMode::Open);
        assert_eq!(cell.tokens_present(true), Some(AuthMode::Required));
        assert_eq!(cell.current(), AuthMode::Required);
        assert_eq!(cell.tokens_present(true), None, "no change");
        assert_eq!(cell.tokens_present(false), Some(AuthMode::Open));

        let public: SocketAddr = "0.0.0.0:8082".parse().unwrap();
        let cell = ModeCell::new(public, true, false);
        assert_eq!(cell.tokens_present(false), None);
        assert_eq!(cell.current(), AuthMode::Required, "never open to others");
        let insecure = ModeCell::new(public, false, true);
        assert_eq!(insecure.current(), AuthMode::Open);
        assert_eq!(insecure.tokens_present(true), Some(AuthMode::Required));
    }
}
