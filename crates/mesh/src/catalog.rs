//! The playbook catalog: playbooks registered by `metadata.path`, each
//! registration a new immutable version, in the `<p>_catalog` KV bucket.
//!
//! Keys: `<path>.latest` (the version counter, advanced by compare-and-set,
//! and the version "latest" means) and `<path>.v<N>` (the document). Path
//! segments (`/`) map to key tokens. A deleted version is gone for good:
//! the counter stays, so a later registration never reuses its number.

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
    /// The YAML text that runs (canonical: migrated when it was sent in
    /// NoETL's dialect).
    pub yaml: String,
    /// The text as it was sent, when the registration migrated it
    /// (`yaml` is then what `noetl migrate` made of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<String>,
    /// RFC 3339.
    pub registered_at: String,
}

/// A version to store ([`Catalog::register_version`]).
#[derive(Debug, Clone, Copy)]
pub struct NewVersion<'a> {
    /// Catalog path (`metadata.path`).
    pub path: &'a str,
    /// `metadata.name`.
    pub name: &'a str,
    /// The text that runs.
    pub yaml: &'a str,
    /// The text as sent, when `yaml` is its migration.
    pub original: Option<&'a str>,
}

/// The counter record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Latest {
    path: String,
    /// The last version number given out.
    version: u32,
    /// The version "latest" resolves to once versions were deleted: the
    /// highest still stored, 0 for none; absent = `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    live: Option<u32>,
}

impl Latest {
    /// The version "latest" resolves to (0: every version was deleted).
    fn current(&self) -> u32 {
        self.live.unwrap_or(self.version)
    }
}

/// The path and version a catalog id names (`<path>@v<N>`, N from 1).
pub fn parse_catalog_id(id: &str) -> Option<(String, u32)> {
    let (path, version) = id.rsplit_once("@v")?;
    let version: u32 = version.parse().ok()?;
    (!path.is_empty() && version > 0).then(|| (path.to_string(), version))
}

/// Which versions a delete of `version` (`None`: every one) looks for
/// under a counter at `counter`: highest first.
pub fn versions_to_delete(counter: u32, version: Option<u32>) -> Vec<u32> {
    match version {
        Some(v) if (1..=counter).contains(&v) => vec![v],
        Some(_) => Vec::new(),
        None => (1..=counter).rev().collect(),
    }
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
    /// The path cannot be a catalog path ([`crate::keys::is_catalog_path`]).
    #[error("catalog path {} is invalid: 1-{} characters, none a control character, in `/`-separated segments none of which is empty", shown(path), crate::keys::MAX_CATALOG_PATH)]
    BadPath {
        /// Path given.
        path: String,
    },
    /// KV trouble.
    #[error(transparent)]
    Mesh(#[from] MeshError),
}

/// `text` quoted for a message, cut after 64 characters (a refused path
/// may be kilobytes long).
pub fn shown(text: &str) -> String {
    const MAX: usize = 64;
    if text.chars().count() <= MAX {
        return format!("{text:?}");
    }
    let head: String = text.chars().take(MAX).collect();
    format!("{head:?}… ({} characters)", text.chars().count())
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
        self.register_version(NewVersion {
            path,
            name,
            yaml,
            original: None,
        })
        .await
    }

    /// Store a version, with the text it was migrated from if any, as the
    /// next version of its path; returns the entry.
    pub async fn register_version(&self, new: NewVersion<'_>) -> Result<Entry, CatalogError> {
        let NewVersion {
            path,
            name,
            yaml,
            original,
        } = new;
        let key = path_key(path)?;
        let latest = kv::update(
            &self.store,
            &Keys::catalog_latest(&key),
            |cur: Option<&Latest>| {
                Cas::Write(Latest {
                    path: path.to_string(),
                    version: cur.map(|l| l.version).unwrap_or(0) + 1,
                    live: None,
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
            original: original.map(str::to_string),
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
            None => kv::get::<Latest>(&self.store, &Keys::catalog_latest(&key))
                .await?
                .map(|l| l.current())
                .filter(|v| *v > 0)
                .ok_or_else(not_found)?,
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
                let Some(latest) = kv::get::<Latest>(&self.store, &k).await? else {
                    continue;
                };
                if latest.current() == 0 {
                    continue;
                }
                if let Some(e) =
                    kv::get::<Entry>(&self.store, &Keys::catalog_version(l, latest.current()))
                        .await?
                {
                    out.push(e);
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Delete `version` of `path`, or every version (`None`); returns the
    /// versions removed, highest first (empty when none was stored). The
    /// counter stays, so a later registration takes a new number; "latest"
    /// then means the highest version still stored.
    pub async fn delete(&self, path: &str, version: Option<u32>) -> Result<Vec<u32>, CatalogError> {
        let key = path_key(path)?;
        let latest_key = Keys::catalog_latest(&key);
        let Some(latest) = kv::get::<Latest>(&self.store, &latest_key).await? else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        for v in versions_to_delete(latest.version, version) {
            let k = Keys::catalog_version(&key, v);
            if self.stored(&k).await? {
                self.store
                    .purge(&k)
                    .await
                    .map_err(|e| kv_err(&self.store, &k, e))?;
                removed.push(v);
            }
        }
        if removed.is_empty() {
            return Ok(removed);
        }
        let mut live = latest.current();
        while live > 0 && !self.stored(&Keys::catalog_version(&key, live)).await? {
            live -= 1;
        }
        kv::update(&self.store, &latest_key, |cur: Option<&Latest>| match cur {
            // A registration in between points "latest" at itself.
            Some(l) if l.version == latest.version => Cas::Write(Latest {
                live: Some(live),
                ..l.clone()
            }),
            _ => Cas::Keep,
        })
        .await?;
        Ok(removed)
    }

    async fn stored(&self, key: &str) -> Result<bool, CatalogError> {
        let found = self
            .store
            .get(key)
            .await
            .map_err(|e| kv_err(&self.store, key, e))?;
        Ok(found.is_some())
    }
}

fn kv_err(store: &Store, key: &str, e: impl std::fmt::Display) -> MeshError {
    MeshError::Kv {
        bucket: store.name.clone(),
        key: key.to_string(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_path_is_shown_cut_and_escaped() {
        let e = CatalogError::BadPath {
            path: format!("a\n{}", "b".repeat(5000)),
        };
        let m = e.to_string();
        assert!(m.len() < 300, "{m}");
        assert!(!m.contains('\n') && m.contains("\\n"), "{m}");
        assert!(m.contains("5002 characters"), "{m}");
        assert_eq!(shown("a/b"), "\"a/b\"");
    }

    #[test]
    fn a_delete_looks_for_one_stored_version_or_all_highest_first() {
        assert_eq!(versions_to_delete(3, Some(2)), [2]);
        assert_eq!(versions_to_delete(3, None), [3, 2, 1]);
        assert!(versions_to_delete(3, Some(4)).is_empty());
        assert!(versions_to_delete(3, Some(0)).is_empty());
        assert!(versions_to_delete(0, None).is_empty());
    }

    #[test]
    fn latest_is_the_highest_live_version_and_reads_old_records() {
        let old: Latest = serde_json::from_str(r#"{"path":"a","version":3}"#).unwrap();
        assert_eq!(old.current(), 3);
        let deleted = Latest {
            live: Some(0),
            ..old.clone()
        };
        assert_eq!(deleted.current(), 0);
        let text = serde_json::to_string(&old).unwrap();
        assert!(!text.contains("live"), "{text}");
    }
}
