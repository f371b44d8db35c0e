//! The keychain's per-execution cache (the spec's `auth_cache`,
//! docs/security.md "Keychain"): what a `secret_manager` or `oauth2` entry
//! resolved to, kept for the rest of its execution so that every step-run
//! reads the same value and the secret manager or token endpoint is asked
//! once. Each record lives in the credentials bucket under
//! `_cache.<execution>.<name>` (a key no credential can have: a credential
//! key has no dot), encrypted like a credential and bound to its execution
//! and name, with its expiry (`expires_at_ms`) beside it. An expired record
//! reads as absent, so the entry is resolved again.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::credentials::{kv_err, CredentialError, Vault, CACHE_KEY_PREFIX};
use crate::keys::key_part;

/// What the bucket holds per cached entry: never the plaintext.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CachedRecord {
    /// `secret` (a secret manager's value) or `token` (an OAuth2 token).
    cache_type: String,
    expires_at_ms: u64,
    nonce: String,
    ciphertext: String,
}

/// The bucket key of entry `name` of execution `eid`.
pub fn cache_key(eid: &str, name: &str) -> String {
    format!("{CACHE_KEY_PREFIX}{}.{}", key_part(eid), key_part(name))
}

/// True for a key of the cache (not a credential's).
pub fn is_cache_key(key: &str) -> bool {
    key.starts_with(CACHE_KEY_PREFIX)
}

fn aad(eid: &str, name: &str, cache_type: &str, expires_at_ms: u64) -> String {
    format!("noetl-auth-cache\0{eid}\0{name}\0{cache_type}\0{expires_at_ms}")
}

/// A record still valid at `now_ms`.
pub fn fresh(expires_at_ms: u64, now_ms: u64) -> bool {
    now_ms < expires_at_ms
}

impl Vault {
    /// The cached value of entry `name` of execution `eid`, unless there is
    /// none or it expired.
    pub async fn cache_get(&self, eid: &str, name: &str) -> Result<Option<Value>, CredentialError> {
        let key = cache_key(eid, name);
        let Some(bytes) = self.store().get(&key).await.map_err(|e| kv_err(&key, e))? else {
            return Ok(None);
        };
        let decrypt_err = || CredentialError::Decrypt { name: name.into() };
        let rec: CachedRecord = serde_json::from_slice(&bytes).map_err(|_| decrypt_err())?;
        if !fresh(rec.expires_at_ms, crate::events::now_ms()) {
            return Ok(None);
        }
        let binding = aad(eid, name, &rec.cache_type, rec.expires_at_ms);
        let plain = self
            .open(&rec.nonce, &rec.ciphertext, &binding)?
            .ok_or_else(decrypt_err)?;
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(|_| decrypt_err())
    }

    /// Keep `data`, what entry `name` of execution `eid` resolved to, until
    /// `expires_at_ms`. `cache_type` is `secret` or `token`.
    pub async fn cache_put(
        &self,
        eid: &str,
        name: &str,
        cache_type: &str,
        data: &Value,
        expires_at_ms: u64,
    ) -> Result<(), CredentialError> {
        let plain = serde_json::to_vec(data).expect("JSON values serialise");
        let (nonce, ciphertext) = self.seal(&plain, &aad(eid, name, cache_type, expires_at_ms))?;
        let rec = CachedRecord {
            cache_type: cache_type.into(),
            expires_at_ms,
            nonce,
            ciphertext,
        };
        let key = cache_key(eid, name);
        let bytes = serde_json::to_vec(&rec).expect("record serialises");
        self.store()
            .put(&key, bytes.into())
            .await
            .map_err(|e| kv_err(&key, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_never_meet_credential_keys_and_expiry_is_strict() {
        let k = cache_key("e1", "api token");
        assert!(is_cache_key(&k) && k.starts_with("_cache.e1."), "{k}");
        assert!(!key_part("_cache").contains('.'));
        assert!(!is_cache_key(&key_part("_cache.e1.x")));
        assert!(fresh(1_001, 1_000));
        assert!(!fresh(1_000, 1_000));
    }
}
