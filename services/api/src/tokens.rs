//! API tokens in the mesh's `<p>_tokens` bucket: only the SHA-256 of a
//! token is stored (the key), with its name, role and creation time; the
//! token itself is shown once, when it is made, and never again.

use async_nats::jetstream::kv::Store;
use noetl_mesh::keys::Keys;
use noetl_mesh::{kv, MeshError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::auth::{Principal, Role};

/// The name under which `NOETL_API_BOOTSTRAP_TOKEN` is stored.
pub const BOOTSTRAP_NAME: &str = "bootstrap";

/// Shortest bootstrap token accepted.
pub const MIN_BOOTSTRAP_LEN: usize = 16;

/// What the bucket holds per token, under the token's hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// A label for logs and audit records (not unique).
    pub name: String,
    /// What the token may do.
    pub role: Role,
    /// RFC 3339.
    pub created_at: String,
}

impl TokenRecord {
    /// The principal a request with this token acts as.
    pub fn principal(&self) -> Principal {
        Principal {
            name: self.name.clone(),
            role: self.role,
        }
    }
}

/// What can go wrong with tokens. No variant carries a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The name cannot be a token name.
    #[error("token name {0:?} is invalid: use 1-64 characters of [A-Za-z0-9_.@-]")]
    BadName(String),
    /// The bootstrap token is too short to be secret.
    #[error("NOETL_API_BOOTSTRAP_TOKEN is too short: use at least {MIN_BOOTSTRAP_LEN} random characters (e.g. `openssl rand -hex 32`)")]
    WeakBootstrap,
    /// The system's random source failed.
    #[error("cannot make a random token: {0}")]
    Random(String),
    /// The bucket could not be read or written.
    #[error(transparent)]
    Mesh(#[from] MeshError),
}

/// A fresh token: `noetl_` and 64 hex digits (32 random bytes).
pub fn generate() -> Result<String, TokenError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| TokenError::Random(e.to_string()))?;
    Ok(format!("noetl_{}", hex::encode(bytes)))
}

/// The key a token is stored under: its SHA-256, in hex.
pub fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether `name` can name a token.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-'))
}

/// The tokens of a mesh.
#[derive(Clone)]
pub struct Tokens {
    store: Store,
}

impl Tokens {
    /// The tokens in `store` (the mesh's `tokens_kv()`).
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// Make and store a new token named `name` with `role`; returns the
    /// token (the only time it is seen).
    pub async fn create(&self, name: &str, role: Role) -> Result<String, TokenError> {
        if !valid_name(name) {
            return Err(TokenError::BadName(name.to_string()));
        }
        let token = generate()?;
        self.put(&token, name, role).await?;
        Ok(token)
    }

    async fn put(&self, token: &str, name: &str, role: Role) -> Result<(), TokenError> {
        let record = TokenRecord {
            name: name.to_string(),
            role,
            created_at: noetl_mesh::events::now_rfc3339(),
        };
        kv::put(&self.store, &Keys::token(&hash(token)), &record).await?;
        Ok(())
    }

    /// The record of `token`, if it is one.
    pub async fn lookup(&self, token: &str) -> Result<Option<TokenRecord>, TokenError> {
        Ok(kv::get(&self.store, &Keys::token(&hash(token))).await?)
    }

    /// Every token's record (names and roles; never hashes), by name.
    pub async fn list(&self) -> Result<Vec<TokenRecord>, TokenError> {
        let mut out = Vec::new();
        for (key, record) in kv::values_matching::<TokenRecord>(&self.store, "*").await? {
            match record {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, "skipping a token record that does not decode")
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.created_at.cmp(&b.created_at)));
        Ok(out)
    }

    /// True when at least one token is stored.
    pub async fn any(&self) -> Result<bool, TokenError> {
        let found = kv::values_matching::<serde_json::Value>(&self.store, "*").await?;
        Ok(!found.is_empty())
    }

    /// Delete every token named `name`; returns how many.
    pub async fn revoke(&self, name: &str) -> Result<usize, TokenError> {
        self.remove_named(name, None).await
    }

    /// Store `token` as the `admin` token named [`BOOTSTRAP_NAME`],
    /// replacing any other token of that name (a changed bootstrap token
    /// no longer works).
    pub async fn install_bootstrap(&self, token: &str) -> Result<(), TokenError> {
        if token.trim().len() < MIN_BOOTSTRAP_LEN {
            return Err(TokenError::WeakBootstrap);
        }
        let token = token.trim();
        self.put(token, BOOTSTRAP_NAME, Role::Admin).await?;
        let keep = Keys::token(&hash(token));
        self.remove_named(BOOTSTRAP_NAME, Some(&keep)).await?;
        Ok(())
    }

    async fn remove_named(&self, name: &str, keep: Option<&str>) -> Result<usize, TokenError> {
        let mut removed = 0;
        for (key, record) in kv::values_matching::<TokenRecord>(&self.store, "*").await? {
            let named = record.as_ref().is_ok_and(|r| r.name == name);
            if named && keep != Some(key.as_str()) {
                self.store.purge(&key).await.map_err(|e| MeshError::Kv {
                    bucket: self.store.name.clone(),
                    key: key.clone(),
                    message: e.to_string(),
                })?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_only_their_hash_names_them() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("noetl_") && a.len() == 6 + 64, "{a}");
        let h = hash(&a);
        assert_eq!(h.len(), 64);
        assert!(!h.contains(&a[6..]), "the key is not the token");
        assert_eq!(h, hash(&a), "the same token, the same key");
    }

    #[test]
    fn names_are_short_labels() {
        assert!(valid_name("ci-bot"));
        assert!(valid_name("alice@example.com"));
        assert!(!valid_name(""));
        assert!(!valid_name("has space"));
        assert!(!valid_name(&"x".repeat(65)));
    }
}
