//! TLS to PostgreSQL: libpq's `sslmode` and `sslrootcert`, spoken with
//! rustls (the ring provider the rest of the workspace already uses).
//!
//! | sslmode | TLS | certificate check |
//! |---|---|---|
//! | `disable` | never | — |
//! | `allow`, `prefer` (default) | when the server offers it | none |
//! | `require` | always | none; the chain when `sslrootcert` is given (as libpq) |
//! | `verify-ca` | always | the chain against the root certificates |
//! | `verify-full` | always | the chain and the host name |
//!
//! Root certificates: `sslrootcert` (a PEM file on the worker, PEM text
//! itself, or `system`), else the platform trust store.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// Treated as `prefer` (libpq tries plain first; tokio-postgres tries
    /// TLS first and falls back to plain).
    Allow,
    /// TLS when the server offers it, else plain; the certificate is not
    /// checked.
    #[default]
    Prefer,
    /// TLS always; the certificate chain is checked only when
    /// `sslrootcert` is given.
    Require,
    /// TLS always; the chain is checked against the root certificates, the
    /// host name is not.
    VerifyCa,
    /// TLS always; the chain and the host name are checked.
    VerifyFull,
}

/// The `sslmode` values, for messages.
pub const SSL_MODES: &str = "disable, allow, prefer, require, verify-ca, verify-full";

impl SslMode {
    /// Parse a libpq `sslmode` value.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }

    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// The tokio-postgres mode that drives the negotiation.
    pub fn negotiation(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Pg;
        match self {
            Self::Disable => Pg::Disable,
            Self::Allow | Self::Prefer => Pg::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => Pg::Require,
        }
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the root certificates come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file on the worker.
    File(PathBuf),
    /// PEM text given inline (a value starting with `-----BEGIN`).
    Pem(String),
    /// `system`: the platform trust store.
    System,
}

impl RootCert {
    /// Read a `sslrootcert` value.
    pub fn parse(s: &str) -> Self {
        let t = s.trim();
        if t == "system" {
            Self::System
        } else if t.starts_with("-----BEGIN") {
            Self::Pem(t.to_string())
        } else {
            Self::File(PathBuf::from(s))
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::File(p) => format!("file {}", p.display()),
            Self::Pem(_) => "(inline PEM)".into(),
            Self::System => "system (the platform trust store)".into(),
        }
    }
}

/// The TLS settings of one target.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`, if given.
    pub root_cert: Option<RootCert>,
}

/// Why a TLS connector cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The `sslrootcert` file cannot be read.
    #[error("sslrootcert {path}: cannot read: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// `sslrootcert` holds no usable PEM certificate.
    #[error("sslrootcert {from}: {reason}")]
    Parse {
        /// Which `sslrootcert`.
        from: String,
        /// What is wrong.
        reason: String,
    },
    /// A verifying mode without `sslrootcert` on a machine whose trust
    /// store is empty.
    #[error("sslmode {mode} checks the server certificate, but the platform trust store has no certificates; set sslrootcert")]
    NoRoots {
        /// The mode.
        mode: SslMode,
    },
    /// rustls refused the configuration.
    #[error("TLS setup for sslmode {mode}: {reason}")]
    Setup {
        /// The mode.
        mode: SslMode,
        /// rustls' reason.
        reason: String,
    },
}

/// How much of the server certificate is checked.
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

/// The tokio-postgres TLS connector for `settings`. With `disable` it is
/// never used for a handshake, but it is still built so one pool type
/// serves every mode.
pub fn connector(settings: &TlsSettings) -> Result<MakeRustlsConnect, TlsError> {
    let mode = settings.mode;
    let check = match (mode, &settings.root_cert) {
        (SslMode::Disable | SslMode::Allow | SslMode::Prefer, _) => Check::Nothing,
        (SslMode::Require, None) => Check::Nothing,
        (SslMode::Require | SslMode::VerifyCa, _) => Check::Chain,
        (SslMode::VerifyFull, _) => Check::ChainAndName,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let setup = |e: rustls::Error| TlsError::Setup {
        mode,
        reason: e.to_string(),
    };
    let verifier: Arc<dyn ServerCertVerifier> = match check {
        Check::Nothing => Arc::new(NoCheck(provider.clone())),
        Check::Chain | Check::ChainAndName => {
            let roots = roots(settings)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| TlsError::Setup {
                        mode,
                        reason: e.to_string(),
                    })?;
            match check {
                Check::Chain => Arc::new(ChainOnly(webpki)),
                _ => webpki,
            }
        }
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(setup)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    // PostgreSQL 17 checks the ALPN name; older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(MakeRustlsConnect::new(config))
}

fn roots(settings: &TlsSettings) -> Result<RootCertStore, TlsError> {
    let parse = |bytes: &[u8], from: &RootCert| {
        let certs = CertificateDer::pem_slice_iter(bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Parse {
                from: from.describe(),
                reason: format!("not PEM: {e}"),
            })?;
        if certs.is_empty() {
            return Err(TlsError::Parse {
                from: from.describe(),
                reason: "no `-----BEGIN CERTIFICATE-----` block in it".into(),
            });
        }
        Ok(certs)
    };
    let (certs, from) = match &settings.root_cert {
        Some(rc @ RootCert::File(path)) => {
            let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.display().to_string(),
                source,
            })?;
            (parse(&bytes, rc)?, Some(rc))
        }
        Some(rc @ RootCert::Pem(text)) => (parse(text.as_bytes(), rc)?, Some(rc)),
        Some(RootCert::System) | None => (rustls_native_certs::load_native_certs().certs, None),
    };
    let mut store = RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(match from {
            Some(rc) => TlsError::Parse {
                from: rc.describe(),
                reason: "no certificate in it is usable as a trust anchor".into(),
            },
            None => TlsError::NoRoots {
                mode: settings.mode,
            },
        });
    }
    Ok(store)
}

/// `require` without root certificates, `prefer`, `allow`: encrypt, check
/// nothing about the certificate (the handshake signature is still
/// verified, so the server holds the certificate's key).
#[derive(Debug)]
struct NoCheck(Arc<CryptoProvider>);

impl ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the webpki check, except that a certificate valid for
/// another name passes (webpki checks the name only after the chain).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
