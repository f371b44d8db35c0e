//! What kind of failure an error is, and what a consumer does about it.
//!
//! Every [`MeshError`] has an [`ErrorKind`]; the consumer loop acks, retries
//! with backoff or dead-letters a message from the kind alone
//! ([`dispose`]), never from the error's text. The table is in
//! `docs/architecture.md` ("Error kinds").

use crate::credentials::CredentialError;
use crate::objects::ObjectError;
use crate::MeshError;
use std::time::Duration;

/// What to do with a message once handled.
#[derive(Debug)]
pub enum Disposition {
    /// Done; remove it.
    Ack,
    /// Redeliver later (after the delay, if given): a command whose time has
    /// not come.
    Retry(Option<Duration>),
    /// A transient failure: redeliver after a delay that grows with each
    /// delivery of this message.
    Backoff,
    /// The message can never be handled: log it, copy it to the dead-letter
    /// subject with the reason, and ack it.
    DeadLetter(String),
    /// Test mode only ([`crate::MeshConfig::deliver_twice`]): handled, but
    /// handed back to be delivered once more after the delay.
    HandBack(Duration),
}

/// The kind of a failure, which decides whether trying again can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// NATS, KV or the object store did not answer or refused for now:
    /// retry with backoff.
    Transient,
    /// A compare-and-set kept losing to other writers: retry with backoff.
    Conflict,
    /// What the message needs is not there (a plan, a credential, an
    /// object): retrying finds nothing more. Dead-letter.
    NotFound,
    /// A stored record or object does not decode or match its checksum:
    /// reading it again gives the same bytes. Dead-letter.
    Corrupt,
    /// The message itself breaks the contract (does not decode, refers to
    /// what cannot exist). Dead-letter.
    Invalid,
    /// This process is set up wrongly (a key, a store location): nothing a
    /// redelivery to the same process changes. Dead-letter, naming it.
    Config,
}

impl ErrorKind {
    /// Whether trying the same message again can succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Transient | Self::Conflict)
    }
}

/// What a consumer does with a message whose handling failed with an error
/// of `kind`: retry with backoff, or dead-letter with `reason` (which fails
/// the execution, naming it).
pub fn dispose(kind: ErrorKind, reason: String) -> Disposition {
    if kind.is_retryable() {
        Disposition::Backoff
    } else {
        Disposition::DeadLetter(reason)
    }
}

impl MeshError {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Connect { source, .. } => connect_kind(source.kind()),
            Self::Setup { .. } | Self::Publish { .. } | Self::Kv { .. } | Self::Consume { .. } => {
                ErrorKind::Transient
            }
            Self::Conflict { .. } => ErrorKind::Conflict,
            Self::Missing { .. } | Self::NoPlan { .. } => ErrorKind::NotFound,
            Self::Corrupt { .. } => ErrorKind::Corrupt,
            Self::Decode(_) | Self::Invalid(_) => ErrorKind::Invalid,
            Self::Config(_) => ErrorKind::Config,
            Self::Object(o) => o.kind(),
            Self::Credential(c) => c.kind(),
        }
    }
}

/// What a failed connection is: refused credentials, a bad server
/// address or a TLS setup that does not match are the configuration's
/// (trying again changes nothing); the rest may pass (a server
/// restarting, a network blip).
pub fn connect_kind(kind: async_nats::ConnectErrorKind) -> ErrorKind {
    use async_nats::ConnectErrorKind as K;
    match kind {
        K::Authentication | K::AuthorizationViolation | K::Tls | K::ServerParse => {
            ErrorKind::Config
        }
        K::Dns | K::TimedOut | K::Io | K::MaxReconnects => ErrorKind::Transient,
    }
}

impl ObjectError {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Write { .. } | Self::Read { .. } => ErrorKind::Transient,
            Self::Missing { .. } => ErrorKind::NotFound,
            Self::Corrupt { .. } => ErrorKind::Corrupt,
            Self::Config(_) => ErrorKind::Config,
        }
    }
}

impl CredentialError {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Kv { .. } => ErrorKind::Transient,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Decrypt { .. } => ErrorKind::Corrupt,
            Self::BadKind { .. } | Self::BadData { .. } | Self::Provider { .. } => {
                ErrorKind::Invalid
            }
            Self::BadKey { .. } | Self::KeyFile { .. } => ErrorKind::Config,
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn refused_credentials_are_configuration_and_an_unreachable_server_passes() {
        use async_nats::ConnectErrorKind as K;
        for k in [
            K::Authentication,
            K::AuthorizationViolation,
            K::Tls,
            K::ServerParse,
        ] {
            assert_eq!(connect_kind(k), ErrorKind::Config, "{k}");
        }
        for k in [K::Io, K::TimedOut, K::Dns, K::MaxReconnects] {
            assert_eq!(connect_kind(k), ErrorKind::Transient, "{k}");
        }
    }

    use super::*;

    #[test]
    fn only_transient_and_conflict_are_retried() {
        let table = [
            (ErrorKind::Transient, true),
            (ErrorKind::Conflict, true),
            (ErrorKind::NotFound, false),
            (ErrorKind::Corrupt, false),
            (ErrorKind::Invalid, false),
            (ErrorKind::Config, false),
        ];
        for (kind, retried) in table {
            let d = dispose(kind, format!("{kind:?} failure"));
            match d {
                Disposition::Backoff => assert!(retried, "{kind:?} must not be retried"),
                Disposition::DeadLetter(reason) => {
                    assert!(!retried, "{kind:?} must be retried");
                    assert_eq!(reason, format!("{kind:?} failure"));
                }
                other => panic!("{kind:?}: unexpected {other:?}"),
            }
        }
    }

    fn kv() -> MeshError {
        MeshError::Kv {
            bucket: "b".into(),
            key: "k".into(),
            message: "timed out".into(),
        }
    }

    #[test]
    fn every_mesh_error_has_its_kind() {
        let table: Vec<(MeshError, ErrorKind)> = vec![
            (kv(), ErrorKind::Transient),
            (
                MeshError::Publish {
                    subject: "s".into(),
                    message: "no responders".into(),
                },
                ErrorKind::Transient,
            ),
            (
                MeshError::Setup {
                    what: "stream".into(),
                    message: "timeout".into(),
                },
                ErrorKind::Transient,
            ),
            (
                MeshError::Consume {
                    consumer: "c".into(),
                    message: "gone".into(),
                },
                ErrorKind::Transient,
            ),
            (
                MeshError::Conflict {
                    bucket: "b".into(),
                    key: "k".into(),
                    tries: 1000,
                },
                ErrorKind::Conflict,
            ),
            (
                MeshError::NoPlan {
                    execution_id: "e1".into(),
                },
                ErrorKind::NotFound,
            ),
            (
                MeshError::Missing {
                    prefix: "p".into(),
                    url: "nats://x".into(),
                    what: "stream".into(),
                },
                ErrorKind::NotFound,
            ),
            (
                MeshError::Corrupt {
                    bucket: "b".into(),
                    key: "e1".into(),
                    message: "expected value".into(),
                },
                ErrorKind::Corrupt,
            ),
            (
                MeshError::Decode(crate::codec::DecodeError {
                    what: "task command",
                    reason: "truncated".into(),
                }),
                ErrorKind::Invalid,
            ),
            (MeshError::Invalid("bad".into()), ErrorKind::Invalid),
            (MeshError::Config("no key".into()), ErrorKind::Config),
            (
                MeshError::Object(ObjectError::Read {
                    store: "s3".into(),
                    key: "k".into(),
                    message: "503".into(),
                }),
                ErrorKind::Transient,
            ),
            (
                MeshError::Object(ObjectError::Missing {
                    store: "local".into(),
                    key: "k".into(),
                }),
                ErrorKind::NotFound,
            ),
            (
                MeshError::Object(ObjectError::Corrupt {
                    store: "local".into(),
                    key: "k".into(),
                    message: "checksum".into(),
                }),
                ErrorKind::Corrupt,
            ),
            (
                MeshError::Credential(CredentialError::Kv {
                    key: "pg".into(),
                    message: "timed out".into(),
                }),
                ErrorKind::Transient,
            ),
            (
                MeshError::Credential(CredentialError::NotFound { name: "pg".into() }),
                ErrorKind::NotFound,
            ),
            (
                MeshError::Credential(CredentialError::Decrypt { name: "pg".into() }),
                ErrorKind::Corrupt,
            ),
        ];
        for (e, kind) in table {
            assert_eq!(e.kind(), kind, "{e}");
        }
    }

    #[test]
    fn a_kv_outage_is_retried_and_a_corrupt_record_is_dead_lettered_naming_its_key() {
        assert!(matches!(
            crate::runtime::retry_on(&kv()),
            Disposition::Backoff
        ));
        let corrupt = MeshError::Corrupt {
            bucket: "noetl_exec".into(),
            key: "e1".into(),
            message: "expected value at line 1".into(),
        };
        match crate::runtime::retry_on(&corrupt) {
            Disposition::DeadLetter(reason) => {
                assert!(reason.contains("noetl_exec/e1"), "{reason}");
                assert!(reason.contains("corrupt"), "{reason}");
            }
            other => panic!("corrupt record: {other:?}"),
        }
    }
}
