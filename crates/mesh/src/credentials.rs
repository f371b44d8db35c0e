//! The credential vault: named credentials stored in the `<p>_credentials`
//! KV bucket, each encrypted with AES-256-GCM under one 32-byte key, bound to
//! its name and kind as associated data (a ciphertext moved to another name
//! does not decrypt).
//!
//! The key comes from `NOETL_SECRET_KEY` (64 hex digits or base64 of 32
//! bytes), else the file named by `NOETL_SECRET_KEY_FILE`, else
//! `<data dir>/secret.key`, which is created (mode 0600) on first use so
//! local runs work without set-up. Errors never carry a secret value.

use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use async_nats::jetstream::kv::Store;
use base64::Engine as _;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::keys::key_part;
use crate::MeshConfig;

/// Credential kinds `noetl credential put --kind` accepts, with the fields
/// each must have.
pub const KINDS: &[(&str, &[&str])] = &[
    ("postgres_credential", &["user"]),
    ("bearer", &["token"]),
    ("basic", &["username", "password"]),
    ("api_key", &["key"]),
    ("secret", &[]),
];

/// The key prefix of the auth cache's records in the bucket: a credential
/// key never has a dot ([`key_part`]).
pub const CACHE_KEY_PREFIX: &str = "_cache.";

/// What can go wrong with credentials. No variant carries a secret value.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The key is set but is not 32 bytes of hex or base64.
    #[error(
        "secret key from {source_name} is invalid: expected 32 bytes as 64 hex digits or base64"
    )]
    BadKey {
        /// Where the key came from.
        source_name: String,
    },
    /// The key file could not be read or created.
    #[error("secret key file {path}: {message}")]
    KeyFile {
        /// The file.
        path: String,
        /// Cause.
        message: String,
    },
    /// No credential of that name.
    #[error("credential `{name}` is not stored; add it with `noetl credential put {name} --kind KIND --from-file FILE.json`")]
    NotFound {
        /// Credential name.
        name: String,
    },
    /// Unknown kind.
    #[error("credential kind `{kind}` is not one of postgres_credential, bearer, basic, api_key, secret")]
    BadKind {
        /// The kind given.
        kind: String,
    },
    /// The data lacks a field its kind needs, or is not an object.
    #[error("credential `{name}` of kind {kind}: {problem}")]
    BadData {
        /// Credential name.
        name: String,
        /// Its kind.
        kind: String,
        /// What is wrong (field names only).
        problem: String,
    },
    /// Decryption failed: another key, or tampered data.
    #[error("credential `{name}` cannot be decrypted: it was stored under another secret key (check NOETL_SECRET_KEY) or was altered")]
    Decrypt {
        /// Credential name.
        name: String,
    },
    /// A keychain entry resolved from a secret manager or a token endpoint
    /// could not be resolved (the message names the service and its
    /// answer's status or error code, never a value).
    #[error("keychain `{name}` ({kind}) of playbook `{playbook}`: {message}")]
    Provider {
        /// Entry name.
        name: String,
        /// Entry kind (`secret_manager`, `oauth2`, `google_id_token`...).
        kind: String,
        /// The playbook that declares it (`metadata.name`).
        playbook: String,
        /// What went wrong.
        message: String,
    },
    /// The bucket could not be read or written.
    #[error("credentials bucket, key {key}: {message}")]
    Kv {
        /// Key.
        key: String,
        /// Cause.
        message: String,
    },
}

/// A decrypted credential.
#[derive(Debug, Clone, PartialEq)]
pub struct Credential {
    /// Name.
    pub name: String,
    /// Kind (one of [`KINDS`]).
    pub kind: String,
    /// The secret fields (a JSON object).
    pub data: Value,
}

/// What the bucket holds per credential: never the plaintext.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sealed {
    name: String,
    kind: String,
    nonce: String,
    ciphertext: String,
    updated_at: String,
}

/// A listing entry: name and kind only.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listed {
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// Last write (RFC 3339).
    pub updated_at: String,
}

/// Encrypts, stores and resolves credentials.
#[derive(Clone)]
pub struct Vault {
    store: Store,
    key_source: KeySource,
}

#[derive(Clone)]
enum KeySource {
    Env(String),
    File(PathBuf),
}

impl Vault {
    /// A vault over `store`, with the key named by `config` (read on use).
    pub fn new(store: Store, config: &MeshConfig) -> Self {
        let key_source = match std::env::var("NOETL_SECRET_KEY") {
            Ok(v) if !v.trim().is_empty() => KeySource::Env(v),
            _ => KeySource::File(match std::env::var("NOETL_SECRET_KEY_FILE") {
                Ok(p) if !p.trim().is_empty() => PathBuf::from(p),
                _ => config.data_dir.join("secret.key"),
            }),
        };
        Self { store, key_source }
    }

    /// The bucket (the auth cache keeps its records there too).
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn cipher(&self) -> Result<Aes256Gcm, CredentialError> {
        let key = match &self.key_source {
            KeySource::Env(v) => parse_key(v).ok_or_else(|| CredentialError::BadKey {
                source_name: "NOETL_SECRET_KEY".into(),
            })?,
            KeySource::File(path) => key_from_file(path)?,
        };
        Ok(Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key)))
    }

    /// `plain` encrypted under the vault key, bound to `aad`: its nonce and
    /// ciphertext, base64 (what a credential and a cached entry store).
    pub(crate) fn seal(
        &self,
        plain: &[u8],
        aad: &str,
    ) -> Result<(String, String), CredentialError> {
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let ciphertext = self
            .cipher()?
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: aad.as_bytes(),
                },
            )
            .expect("AES-GCM encryption of an in-memory buffer cannot fail");
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok((b64.encode(nonce), b64.encode(ciphertext)))
    }

    /// What [`Self::seal`] sealed with `aad`; `None` when it does not open
    /// (altered, another key or another binding).
    pub(crate) fn open(
        &self,
        nonce: &str,
        ciphertext: &str,
        aad: &str,
    ) -> Result<Option<Vec<u8>>, CredentialError> {
        let cipher = self.cipher()?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let (Ok(nonce), Ok(ciphertext)) = (b64.decode(nonce), b64.decode(ciphertext)) else {
            return Ok(None);
        };
        if nonce.len() != 12 {
            return Ok(None);
        }
        let payload = Payload {
            msg: &ciphertext,
            aad: aad.as_bytes(),
        };
        Ok(cipher.decrypt(Nonce::from_slice(&nonce), payload).ok())
    }

    /// Encrypt and store (replacing any credential of that name).
    pub async fn put(&self, cred: &Credential) -> Result<(), CredentialError> {
        check(cred)?;
        let plain = serde_json::to_vec(&cred.data).expect("JSON values serialise");
        let (nonce, ciphertext) = self.seal(&plain, &aad(&cred.name, &cred.kind))?;
        let sealed = Sealed {
            name: cred.name.clone(),
            kind: cred.kind.clone(),
            nonce,
            ciphertext,
            updated_at: crate::events::now_rfc3339(),
        };
        let key = key_part(&cred.name);
        let bytes = serde_json::to_vec(&sealed).expect("record serialises");
        self.store
            .put(&key, bytes.into())
            .await
            .map_err(|e| kv_err(&key, e))?;
        Ok(())
    }

    /// Decrypt one credential.
    pub async fn get(&self, name: &str) -> Result<Credential, CredentialError> {
        let key = key_part(name);
        let entry = self.store.get(&key).await.map_err(|e| kv_err(&key, e))?;
        let Some(bytes) = entry else {
            return Err(CredentialError::NotFound { name: name.into() });
        };
        let decrypt_err = || CredentialError::Decrypt { name: name.into() };
        // A record that does not decode was altered: permanent, like a
        // failed decryption (never retried as if the bucket were down).
        let sealed: Sealed = serde_json::from_slice(&bytes).map_err(|_| decrypt_err())?;
        let plain = self
            .open(
                &sealed.nonce,
                &sealed.ciphertext,
                &aad(&sealed.name, &sealed.kind),
            )?
            .ok_or_else(decrypt_err)?;
        let data = serde_json::from_slice(&plain).map_err(|_| decrypt_err())?;
        Ok(Credential {
            name: sealed.name,
            kind: sealed.kind,
            data,
        })
    }

    /// Whether a credential exists, and its kind (no decryption).
    pub async fn kind_of(&self, name: &str) -> Result<Option<String>, CredentialError> {
        let key = key_part(name);
        let entry = self.store.get(&key).await.map_err(|e| kv_err(&key, e))?;
        Ok(match entry {
            None => None,
            Some(b) => Some(
                serde_json::from_slice::<Sealed>(&b)
                    .map_err(|e| kv_err(&key, e))?
                    .kind,
            ),
        })
    }

    /// Names and kinds, sorted by name.
    pub async fn list(&self) -> Result<Vec<Listed>, CredentialError> {
        let mut keys = self.store.keys().await.map_err(|e| kv_err("*", e))?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| kv_err("*", e))?;
            // The auth cache's records (`crate::auth_cache`) are no credentials.
            if k.starts_with(CACHE_KEY_PREFIX) {
                continue;
            }
            if let Some(b) = self.store.get(&k).await.map_err(|e| kv_err(&k, e))? {
                if let Ok(s) = serde_json::from_slice::<Sealed>(&b) {
                    out.push(Listed {
                        name: s.name,
                        kind: s.kind,
                        updated_at: s.updated_at,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Delete; `false` when there was none.
    pub async fn delete(&self, name: &str) -> Result<bool, CredentialError> {
        let key = key_part(name);
        if self
            .store
            .get(&key)
            .await
            .map_err(|e| kv_err(&key, e))?
            .is_none()
        {
            return Ok(false);
        }
        self.store.purge(&key).await.map_err(|e| kv_err(&key, e))?;
        Ok(true)
    }
}

/// A KV failure on `key`.
pub(crate) fn kv_err(key: &str, e: impl std::fmt::Display) -> CredentialError {
    CredentialError::Kv {
        key: key.into(),
        message: e.to_string(),
    }
}

fn aad(name: &str, kind: &str) -> String {
    format!("noetl-credential\0{name}\0{kind}")
}

/// Kind known and required fields present (names only in errors).
pub fn check(cred: &Credential) -> Result<(), CredentialError> {
    let Some((_, fields)) = KINDS.iter().find(|(k, _)| *k == cred.kind) else {
        return Err(CredentialError::BadKind {
            kind: cred.kind.clone(),
        });
    };
    let bad = |problem: String| CredentialError::BadData {
        name: cred.name.clone(),
        kind: cred.kind.clone(),
        problem,
    };
    let Some(obj) = cred.data.as_object() else {
        return Err(bad("the data must be a JSON object".into()));
    };
    let missing: Vec<&str> = fields
        .iter()
        .copied()
        .filter(|f| !obj.contains_key(*f))
        .collect();
    if !missing.is_empty() {
        return Err(bad(format!("missing field(s) {}", missing.join(", "))));
    }
    Ok(())
}

/// 32 bytes from 64 hex digits or base64.
fn parse_key(text: &str) -> Option<[u8; 32]> {
    let t = text.trim();
    let bytes = hex::decode(t)
        .ok()
        .or_else(|| base64::engine::general_purpose::STANDARD.decode(t).ok())?;
    bytes.try_into().ok()
}

fn key_from_file(path: &Path) -> Result<[u8; 32], CredentialError> {
    let file_err = |message: String| CredentialError::KeyFile {
        path: path.display().to_string(),
        message,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => parse_key(&text).ok_or_else(|| CredentialError::BadKey {
            source_name: path.display().to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key: [u8; 32] = Aes256Gcm::generate_key(&mut OsRng).into();
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| file_err(e.to_string()))?;
            }
            // Written whole to a private temporary file, then linked into
            // place: the link is created only if no key exists yet, so a
            // concurrent reader never sees a half-written key and two
            // processes never end up with different keys.
            let tmp = path.with_extension(format!(
                "tmp-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ));
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let written = opts.open(&tmp).and_then(|mut f| {
                use std::io::Write;
                f.write_all(hex::encode(key).as_bytes())?;
                f.sync_all()
            });
            if let Err(e) = written {
                let _ = std::fs::remove_file(&tmp);
                return Err(file_err(e.to_string()));
            }
            let linked = std::fs::hard_link(&tmp, path);
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "created a new secret key for credentials");
                    Ok(key)
                }
                // Another process created it first: use theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => key_from_file(path),
                Err(e) => Err(file_err(e.to_string())),
            }
        }
        Err(e) => Err(file_err(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_racing_to_create_the_key_file_all_get_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/secret.key");
        let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| key_from_file(&path).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]));
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left behind");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn keys_parse_from_hex_or_base64_only_at_32_bytes() {
        let hex_key = "00".repeat(32);
        assert_eq!(parse_key(&hex_key), Some([0u8; 32]));
        let b64 = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        assert_eq!(parse_key(&b64), Some([7u8; 32]));
        assert_eq!(parse_key("abcd"), None);
    }

    #[test]
    fn kinds_require_their_fields_and_errors_name_fields_not_values() {
        let c = Credential {
            name: "api".into(),
            kind: "basic".into(),
            data: serde_json::json!({"username": "u", "pw": "hunter2"}),
        };
        let e = check(&c).unwrap_err().to_string();
        assert!(e.contains("missing field(s) password"), "{e}");
        assert!(!e.contains("hunter2"));
        let unknown = Credential {
            kind: "ssh".into(),
            ..c
        };
        assert!(matches!(
            check(&unknown),
            Err(CredentialError::BadKind { .. })
        ));
    }
}
