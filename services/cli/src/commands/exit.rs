//! The exit codes of every `noetl` command, one meaning each (the table is
//! in the README, "Exit codes"), so scripts can tell a failed execution from
//! a typo, a missing execution, a timeout or an unreachable NATS.

use std::process::ExitCode;

use noetl_mesh::error::ErrorKind;
use noetl_mesh::MeshError;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done; an execution completed.
    Ok,
    /// 1: an execution failed or was cancelled; `validate` found errors.
    Failed,
    /// 2: the command line or its input is wrong (bad flags, a playbook
    /// that does not load, a malformed file).
    Usage,
    /// 3: what the command names is not there (an execution, a credential,
    /// a catalog entry).
    NotFound,
    /// 4: the wait the command was asked for ran out (`--timeout`).
    Timeout,
    /// 5: NATS, KV or the object store could not be reached or answered
    /// wrongly; trying again later may work.
    Infrastructure,
}

impl Exit {
    /// The process exit status.
    pub fn code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Failed => 1,
            Self::Usage => 2,
            Self::NotFound => 3,
            Self::Timeout => 4,
            Self::Infrastructure => 5,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e.code())
    }
}

/// The exit for an error that ended a command: from the kind of the first
/// mesh error in its chain ([`ErrorKind`]), else a connection error, else
/// usage (the error came from what the user gave: a file, a flag).
pub fn of_error(e: &anyhow::Error) -> Exit {
    for cause in e.chain() {
        if let Some(m) = cause.downcast_ref::<MeshError>() {
            if matches!(m, MeshError::Missing { .. }) {
                // The mesh itself is not set up, not what the user named.
                return Exit::Infrastructure;
            }
            return of_kind(m.kind());
        }
        if let Some(c) = cause.downcast_ref::<noetl_mesh::credentials::CredentialError>() {
            return of_kind(c.kind());
        }
        if cause.downcast_ref::<async_nats::ConnectError>().is_some() {
            return Exit::Infrastructure;
        }
    }
    Exit::Usage
}

/// The one line said when NATS could not be reached at all (refused, timed
/// out, no such host): what failed, where, and what to check, with the
/// innermost cause once (the error chain repeats it at every level).
/// `None` for any other error.
pub fn unreachable(e: &anyhow::Error) -> Option<String> {
    let url = e
        .chain()
        .find_map(|c| match c.downcast_ref::<MeshError>() {
            Some(MeshError::Connect { url, source })
                if noetl_mesh::error::connect_kind(source.kind()) == ErrorKind::Transient =>
            {
                Some(url)
            }
            _ => None,
        })?;
    let cause = e
        .chain()
        .last()
        .map(ToString::to_string)
        .unwrap_or_default();
    Some(format!(
        "error: cannot reach NATS at {url} ({cause}): check that nats-server runs there with JetStream (`nats-server -js`), or point --nats (or NOETL_NATS_URL) at your mesh"
    ))
}

/// The exit for a mesh error of `kind`.
pub fn of_kind(kind: ErrorKind) -> Exit {
    match kind {
        ErrorKind::Transient | ErrorKind::Conflict | ErrorKind::Corrupt => Exit::Infrastructure,
        ErrorKind::NotFound => Exit::NotFound,
        ErrorKind::Invalid | ErrorKind::Config => Exit::Usage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_has_its_own_code() {
        let all = [
            Exit::Ok,
            Exit::Failed,
            Exit::Usage,
            Exit::NotFound,
            Exit::Timeout,
            Exit::Infrastructure,
        ];
        let codes: Vec<u8> = all.iter().map(|e| e.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn an_error_exits_by_the_kind_of_the_mesh_error_in_its_chain() {
        let kv = anyhow::Error::new(MeshError::Kv {
            bucket: "noetl_state".into(),
            key: "k".into(),
            message: "timed out".into(),
        })
        .context("reading execution e1");
        assert_eq!(of_error(&kv), Exit::Infrastructure);
        let unset = anyhow::Error::new(MeshError::Missing {
            prefix: "noetl".into(),
            url: "nats://127.0.0.1:4222".into(),
            what: "stream NOETL_EVT".into(),
        })
        .context("joining the mesh");
        assert_eq!(of_error(&unset), Exit::Infrastructure, "a mesh not set up");
        let missing = anyhow::Error::new(MeshError::NoPlan {
            execution_id: "e1".into(),
        });
        assert_eq!(of_error(&missing), Exit::NotFound);
        let invalid = anyhow::Error::new(MeshError::Invalid("bad id".into()));
        assert_eq!(of_error(&invalid), Exit::Usage);
        let io = anyhow::Error::new(std::io::Error::other("no such file"))
            .context("reading --workload w.json");
        assert_eq!(of_error(&io), Exit::Usage);
    }

    #[test]
    fn an_unreachable_server_is_one_line_naming_it_and_what_to_check() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = anyhow::Error::new(MeshError::Connect {
            url: "nats://127.0.0.1:1".into(),
            source: async_nats::ConnectError::with_source(
                async_nats::ConnectErrorKind::Io,
                refused,
            ),
        })
        .context("joining the mesh at nats://127.0.0.1:1");
        let line = unreachable(&e).expect("an unreachable server");
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("nats://127.0.0.1:1"), "{line}");
        assert!(
            line.contains("nats-server -js") && line.contains("--nats"),
            "{line}"
        );
        assert_eq!(line.matches("refused").count(), 1, "{line}");
        assert_eq!(of_error(&e), Exit::Infrastructure);
        // Refused credentials are said as they are.
        let auth = anyhow::Error::new(MeshError::Connect {
            url: "nats://127.0.0.1:1".into(),
            source: async_nats::ConnectError::new(
                async_nats::ConnectErrorKind::AuthorizationViolation,
            ),
        });
        assert_eq!(unreachable(&auth), None);
    }
}
