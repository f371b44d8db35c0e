//! The playbook catalog: playbooks registered by `metadata.path`, each
//! registration a new immutable version, in the `<p>_catalog` KV bucket.
//!
//! Keys: `<path>.latest` (the version counter, advanced by compare-and-set)
//! and `<path>.v<N>` (the document). Path segments (`/`) map to key tokens.

use async_nats::jetstream::kv::Store;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::keys::Keys;
use crate::kv::{self, Cas};
use crate::MeshError;

/// One registered version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Catalog path (`metadata.path`).
    pub path: String,
    /// 1, 2, ...
    pub version: u32,
    /// `metadata.name`.
    pub name: String,
    /// The YAML text as registered.
    pub yaml: String,
    /// RFC 3339.
    pub registered_at: String,
}

/// The counter record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Latest {
    path: String,
    version: u32,
}

/// Catalog errors.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// Nothing registered under the path (or not that version).
    #[error("no catalog entry for playbook path {path:?}{}; register it with `noetl playbook register FILE`", version.map(|v| format!(" version {v}")).unwrap_or_default())]
    NotFound {
        /// Path asked for.
        path: String,
        /// Version asked for (`None` = latest).
        version: Option<u32>,
    },
    /// The path cannot be a catalog path.
    #[error("catalog path {path:?} is invalid: use segments of [A-Za-z0-9_-] separated by `/`")]
    BadPath {
        /// Path given.
        path: String,
    },
    /// KV trouble.
    #[error(transparent)]
    Mesh(#[from] MeshError),
}

/// Registered playbooks.
#[derive(Clone)]
pub struct Catalog {
    store: Store,
}

fn path_key(path: &str) -> Result<String, CatalogError> {
    Keys::catalog_path(path).ok_or_else(|| CatalogError::BadPath { path: path.into() })
}

impl Catalog {
    /// A catalog over its bucket.
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// Store `yaml` as the next version of `path`; returns the entry.
    pub async fn register(
        &self,
        path: &str,
        name: &str,
        yaml: &str,
    ) -> Result<Entry, CatalogError> {
        let key = path_key(path)?;
        let latest = kv::update(
            &self.store,
            &Keys::catalog_latest(&key),
            |cur: Option<&Latest>| {
                Cas::Write(Latest {
                    path: path.to_string(),
                    version: cur.map(|l| l.version).unwrap_or(0) + 1,
                })
            },
        )
        .await?
        .expect("a write was made");
        let entry = Entry {
            path: path.to_string(),
            version: latest.version,
            name: name.to_string(),
            yaml: yaml.to_string(),
            registered_at: crate::events::now_rfc3339(),
        };
        kv::put(
            &self.store,
            &Keys::catalog_version(&key, entry.version),
            &entry,
        )
        .await?;
        Ok(entry)
    }

    /// A version of `path` (`None` = the latest).
    pub async fn get(&self, path: &str, version: Option<u32>) -> Result<Entry, CatalogError> {
        let key = path_key(path)?;
        let not_found = || CatalogError::NotFound {
            path: path.to_string(),
            version,
        };
        let v = match version {
            Some(v) => v,
            None => {
                kv::get::<Latest>(&self.store, &Keys::catalog_latest(&key))
                    .await?
                    .ok_or_else(not_found)?
                    .version
            }
        };
        kv::get::<Entry>(&self.store, &Keys::catalog_version(&key, v))
            .await?
            .ok_or_else(not_found)
    }

    /// The latest version of every path, sorted by path.
    pub async fn list(&self) -> Result<Vec<Entry>, CatalogError> {
        let mut keys = self.store.keys().await.map_err(|e| MeshError::Kv {
            bucket: self.store.name.clone(),
            key: "*".into(),
            message: e.to_string(),
        })?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let Ok(k) = k else { continue };
            if let Some(l) = Keys::catalog_latest_of(&k) {
                if let Some(latest) = kv::get::<Latest>(&self.store, &k).await? {
                    if let Some(e) =
                        kv::get::<Entry>(&self.store, &Keys::catalog_version(l, latest.version))
                            .await?
                    {
                        out.push(e);
                    }
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
}
