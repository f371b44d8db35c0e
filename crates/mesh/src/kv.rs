//! Compare-and-set updates of JSON values in JetStream KV: read the entry and
//! its revision, compute the new value, write it only if nobody else wrote in
//! between, and retry on conflict. No in-memory lock anywhere.

use async_nats::jetstream::kv::{CreateErrorKind, Operation, Store, UpdateErrorKind};
use serde::{de::DeserializeOwned, Serialize};
use std::sync::Arc;

use crate::MeshError;

/// What an update function decided.
pub enum Cas<T> {
    /// Write this value.
    Write(T),
    /// Leave the entry as it is.
    Keep,
}

fn kv_err(store: &Store, key: &str, e: impl std::fmt::Display) -> MeshError {
    MeshError::Kv {
        bucket: store.name.clone(),
        key: key.to_string(),
        message: e.to_string(),
    }
}

/// Read a JSON value and its revision (`None` when absent or deleted).
pub async fn read<T: DeserializeOwned>(
    store: &Store,
    key: &str,
) -> Result<Option<(T, u64)>, MeshError> {
    match entry_of(store, key).await? {
        Some((bytes, revision)) => Ok(Some((decode(store, key, &bytes)?, revision))),
        None => Ok(None),
    }
}

/// Read a value as stored (`None` when absent or deleted), to decode it
/// another way than [`read`] does.
pub async fn get_bytes(store: &Store, key: &str) -> Result<Option<bytes::Bytes>, MeshError> {
    Ok(entry_of(store, key).await?.map(|(bytes, _)| bytes))
}

/// The bytes of a put entry and its revision (`None` when absent or
/// deleted).
async fn entry_of(store: &Store, key: &str) -> Result<Option<(bytes::Bytes, u64)>, MeshError> {
    match store.entry(key).await.map_err(|e| kv_err(store, key, e))? {
        Some(entry) if entry.operation == Operation::Put => Ok(Some((entry.value, entry.revision))),
        _ => Ok(None),
    }
}

/// A JSON value of `store`'s `key` from its bytes, or why it is corrupt.
pub fn decode<T: DeserializeOwned>(store: &Store, key: &str, bytes: &[u8]) -> Result<T, MeshError> {
    serde_json::from_slice(bytes).map_err(|e| MeshError::Corrupt {
        bucket: store.name.clone(),
        key: key.to_string(),
        message: e.to_string(),
    })
}

/// Read a JSON value (`None` when absent).
pub async fn get<T: DeserializeOwned>(store: &Store, key: &str) -> Result<Option<T>, MeshError> {
    Ok(read(store, key).await?.map(|(v, _)| v))
}

/// Unconditionally write a JSON value.
pub async fn put<T: Serialize>(store: &Store, key: &str, value: &T) -> Result<u64, MeshError> {
    put_bytes(store, key, encode(store, key, value)?).await
}

/// The JSON bytes of a value to write under `store`'s `key`.
pub fn encode<T: Serialize>(store: &Store, key: &str, value: &T) -> Result<Vec<u8>, MeshError> {
    serde_json::to_vec(value).map_err(|e| kv_err(store, key, e))
}

/// Unconditionally write bytes already encoded ([`encode`]).
pub async fn put_bytes(store: &Store, key: &str, bytes: Vec<u8>) -> Result<u64, MeshError> {
    store
        .put(key, bytes.into())
        .await
        .map_err(|e| kv_err(store, key, e))
}

/// Create `key` with bytes already encoded ([`encode`]) unless it exists:
/// false when it does (the value stored stands).
pub async fn create_bytes(store: &Store, key: &str, bytes: Vec<u8>) -> Result<bool, MeshError> {
    match store.create(key, bytes.into()).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(kv_err(store, key, e)),
    }
}

/// Remove every key below `key_prefix` (`<key_prefix>.…`, not the key
/// itself) in one stream purge, whatever their number.
pub async fn purge_under(store: &Store, key_prefix: &str) -> Result<u64, MeshError> {
    let filter = format!("{}{key_prefix}.>", store.prefix);
    store
        .stream
        .purge()
        .filter(filter)
        .await
        .map(|r| r.purged)
        .map_err(|e| kv_err(store, key_prefix, e))
}

/// Every key under `<key_prefix>.` (its current values' keys, deleted
/// ones excluded), read with one ordered consumer.
pub async fn keys_under(store: &Store, key_prefix: &str) -> Result<Vec<String>, MeshError> {
    let found = scan(store, &format!("{key_prefix}.>"), true).await?;
    Ok(found.into_iter().map(|(k, _)| k).collect())
}

/// The current value of every key matching `pattern` (a subject pattern:
/// `*` one token, `>` the rest; `*` alone is every one-token key), read
/// with one ordered consumer. A value that does not decode is returned as
/// its error, so one bad record does not hide the others.
pub async fn values_matching<T: DeserializeOwned>(
    store: &Store,
    pattern: &str,
) -> Result<Vec<(String, Result<T, MeshError>)>, MeshError> {
    let found = scan(store, pattern, false).await?;
    Ok(found
        .into_iter()
        .map(|(k, bytes)| {
            let v = serde_json::from_slice(&bytes).map_err(|e| MeshError::Corrupt {
                bucket: store.name.clone(),
                key: k.clone(),
                message: e.to_string(),
            });
            (k, v)
        })
        .collect())
}

/// How long a scan waits for its next record before it fails.
pub const SCAN_STALL: std::time::Duration = std::time::Duration::from_secs(5);

/// The error of a scan that heard nothing for [`SCAN_STALL`].
#[cold]
fn scan_stalled(store: &Store, pattern: &str, after: usize) -> MeshError {
    kv_err(
        store,
        pattern,
        format!(
            "scan stalled: no record for {} s after {after} of them",
            SCAN_STALL.as_secs()
        ),
    )
}

/// Keys (and, unless `headers_only`, values) of the live records whose key
/// matches `pattern`, through the last record the stream's leader held
/// when the scan began (its consumer may sit on a lagging replica;
/// docs/architecture.md, "Reading the log"). The scan runs as a task of
/// its own: a record it waits for is awaited under a timer
/// ([`SCAN_STALL`]), and polled inside a handler's future that would take
/// a debug build's thread stack past its limit.
async fn scan(
    store: &Store,
    pattern: &str,
    headers_only: bool,
) -> Result<Vec<(String, bytes::Bytes)>, MeshError> {
    let (own_store, own_pattern) = (store.clone(), pattern.to_string());
    tokio::spawn(async move { scan_records(&own_store, &own_pattern, headers_only).await })
        .await
        .unwrap_or_else(|e| Err(kv_err(store, pattern, e)))
}

async fn scan_records(
    store: &Store,
    pattern: &str,
    headers_only: bool,
) -> Result<Vec<(String, bytes::Bytes)>, MeshError> {
    use crate::through::Short;
    use async_nats::jetstream::consumer::DeliverPolicy;
    use std::ops::ControlFlow;
    let filter = format!("{}{pattern}", store.prefix);
    let mut found = Vec::new();
    // The leader's last record under the pattern: the consumer lands on
    // any replica, and one that lags must not end the scan before it has
    // that record (docs/architecture.md, "Reading the log").
    let target = match crate::through::leader_last(&store.stream, &filter).await {
        Ok(Some(m)) => m.sequence,
        Ok(None) => return Ok(found),
        Err(e) => return Err(kv_err(store, pattern, e)),
    };
    let consumer = store
        .stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::LastPerSubject,
            headers_only,
            ..Default::default()
        })
        .await
        .map_err(|e| kv_err(store, pattern, e))?;
    let read = crate::through::read(&store.stream, consumer, target, SCAN_STALL, |_, m| {
        let deleted = m
            .headers
            .as_ref()
            .and_then(|h| h.get("KV-Operation"))
            .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
        if !deleted {
            if let Some(k) = m.subject.as_str().strip_prefix(store.prefix.as_str()) {
                found.push((k.to_string(), m.payload.clone()));
            }
        }
        ControlFlow::Continue(())
    });
    match read.await {
        Ok(()) => Ok(found),
        // An ordered consumer recreated after a server restart can wait
        // for a message that never comes (it starts after the last one it
        // delivered, which said more were pending), and a replica may not
        // catch up: the caller tries again.
        Err(Short::Stalled) => Err(scan_stalled(store, pattern, found.len())),
        Err(Short::Failed(e)) => Err(kv_err(store, pattern, e)),
    }
}

/// Create `key` only if it does not exist. Returns `false` when it existed.
pub async fn create<T: Serialize>(store: &Store, key: &str, value: &T) -> Result<bool, MeshError> {
    create_bytes(store, key, encode(store, key, value)?).await
}

/// Count a compare-and-set that lost to another writer
/// ([`crate::health::kv_cas_conflicts`]).
fn count_conflict(store: &Store) {
    crate::health::kv_cas_conflicts()
        .get_or_create(&crate::health::BucketLabels {
            bucket: store.name.clone(),
        })
        .inc();
}

/// Compare-and-set loop. `f` sees the current value (or `None`) and decides;
/// it may run several times when other writers race, so it must be pure.
/// Returns the value that is now stored (`None` if absent and kept).
pub async fn update<T, F>(store: &Store, key: &str, f: F) -> Result<Option<T>, MeshError>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(Option<&T>) -> Cas<T>,
{
    update_under(store, key, Contention::Light, f).await
}

/// How many writers a key's compare-and-set loop expects at one moment,
/// which says what a writer does after losing a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contention {
    /// A few: yield and read again at once, up to [`CAS_TRIES`] times.
    Light,
    /// A herd asking at the same moment (a parallel loop's task calls at
    /// one gate): wait a random moment growing with the losses (up to
    /// 2^n ms, at most 32 ms), so the herd spreads out instead of
    /// colliding again; up to [`HERD_TRIES`] times.
    Herd,
}

/// [`update`] for a key with the given [`Contention`].
pub async fn update_under<T, F>(
    store: &Store,
    key: &str,
    contention: Contention,
    mut f: F,
) -> Result<Option<T>, MeshError>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(Option<&T>) -> Cas<T>,
{
    let tries = match contention {
        Contention::Light => CAS_TRIES,
        Contention::Herd => HERD_TRIES,
    };
    for n in 0..tries {
        let current = read::<T>(store, key).await?;
        let (value, revision) = match current {
            Some((v, r)) => (Some(v), Some(r)),
            None => (None, None),
        };
        let new = match f(value.as_ref()) {
            Cas::Keep => return Ok(value),
            Cas::Write(new) => new,
        };
        if write_at(store, key, &new, revision).await?.is_some() {
            return Ok(Some(new));
        }
        count_conflict(store);
        match contention {
            Contention::Light => tokio::task::yield_now().await,
            Contention::Herd => tokio::time::sleep(herd_pause(n)).await,
        }
    }
    Err(conflict(store, key, tries))
}

/// A random pause after the `n`-th lost write of a herd (below 2^n ms,
/// at most 32 ms).
fn herd_pause(n: u32) -> std::time::Duration {
    use std::hash::{BuildHasher, Hasher};
    let ceiling_us = (1u64 << n.min(5)) * 1000;
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    std::time::Duration::from_micros(random % ceiling_us)
}

/// Compare-and-set attempts before giving up with [`MeshError::Conflict`].
pub const CAS_TRIES: u32 = 1000;

/// Attempts of a [`Contention::Herd`] loop (its pauses add up to seconds).
pub const HERD_TRIES: u32 = 200;

/// How many times a reader writes back a record purged again between its
/// rebuild from the events and its read or write, before it gives up with
/// a retryable conflict ([`conflict`]: the message comes again). One
/// bound for every such reader: the header, `ctx`, a waiter, a join, an
/// execution key's record, a loop run, a chunk, a parallel loop's claims.
pub const RESTORES: u32 = 5;

/// The retryable error of a write to `key` of `store` given up after
/// `tries` attempts (a compare-and-set lost, or a record purged again
/// each time it was written back).
pub fn conflict(store: &Store, key: &str, tries: u32) -> MeshError {
    MeshError::Conflict {
        bucket: store.name.clone(),
        key: key.to_string(),
        tries,
    }
}

/// The last value and revision seen per key, so a compare-and-set can skip
/// its read when this process was the last writer (bounded; a stale entry
/// only costs one failed update and a read). Values are shared, so a read
/// of the cache copies a pointer, not the value.
pub struct RevisionCache<T> {
    inner: crate::cache::Bounded<String, (Arc<T>, u64)>,
}

impl<T> RevisionCache<T> {
    /// A cache of at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: crate::cache::Bounded::new(capacity),
        }
    }
    /// Remember `v` at revision `rev` of `key`, just read or written: the
    /// next [`update_cached`] starts from it instead of reading again.
    pub fn remember(&self, key: &str, v: impl Into<Arc<T>>, rev: u64) {
        self.inner.insert(key.to_string(), (v.into(), rev));
    }
    /// Forget a key.
    pub fn forget(&self, key: &str) {
        self.inner.remove(key);
    }
    /// The value and revision last seen of `key`, if this cache holds it
    /// (it may be stale: only a write at that revision proves it current).
    pub fn cached(&self, key: &str) -> Option<(Arc<T>, u64)> {
        self.inner.get(key)
    }
}

/// The revision last seen per key, for writes that only need to know
/// whether a key is still where this process left it (bounded, as
/// [`RevisionCache`]).
pub struct Revisions {
    inner: crate::cache::Bounded<String, u64>,
}

impl Revisions {
    /// At most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: crate::cache::Bounded::new(capacity),
        }
    }
    /// Remember that `key` is at revision `rev`.
    pub fn remember(&self, key: &str, rev: u64) {
        self.inner.insert(key.to_string(), rev);
    }
    /// Forget a key.
    pub fn forget(&self, key: &str) {
        self.inner.remove(key);
    }
    /// The revision last seen of `key` (it may be stale).
    pub fn get(&self, key: &str) -> Option<u64> {
        self.inner.get(key)
    }
}

/// Write `value` only if `key` is still at `revision` (`None`: only if
/// `key` does not exist). Returns the new revision, or `None` when the
/// entry had moved on (not counted as a conflict: the caller's revision
/// came from a cache).
pub async fn write_at<T: Serialize>(
    store: &Store,
    key: &str,
    value: &T,
    revision: Option<u64>,
) -> Result<Option<u64>, MeshError> {
    let bytes = serde_json::to_vec(value).map_err(|e| kv_err(store, key, e))?;
    match revision {
        Some(rev) => match store.update(key, bytes.into(), rev).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(kv_err(store, key, e)),
        },
        None => match store.create(key, bytes.into()).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(kv_err(store, key, e)),
        },
    }
}

/// [`update`] that first tries the cached value and revision. Returns the
/// value now stored, shared with the cache.
pub async fn update_cached<T, F>(
    store: &Store,
    key: &str,
    cache: &RevisionCache<T>,
    mut f: F,
) -> Result<Option<Arc<T>>, MeshError>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(Option<&T>) -> Cas<T>,
{
    let mut hint = cache.cached(key);
    for _ in 0..CAS_TRIES {
        let from_cache = hint.is_some();
        let (value, revision) = match hint.take() {
            Some((v, r)) => (Some(v), Some(r)),
            None => match read::<T>(store, key).await? {
                Some((v, r)) => (Some(Arc::new(v)), Some(r)),
                None => (None, None),
            },
        };
        let new = match f(value.as_deref()) {
            // A cached value may be stale: only a fresh read may decide
            // that nothing is to be written.
            Cas::Keep if from_cache => continue,
            Cas::Keep => {
                if let (Some(v), Some(r)) = (&value, revision) {
                    cache.remember(key, v.clone(), r);
                }
                return Ok(value);
            }
            Cas::Write(new) => new,
        };
        match write_at(store, key, &new, revision).await? {
            Some(rev) => {
                let new = Arc::new(new);
                cache.remember(key, new.clone(), rev);
                return Ok(Some(new));
            }
            None => {
                // A stale cached revision is not another writer's win.
                if !from_cache {
                    count_conflict(store);
                }
                cache.forget(key);
            }
        }
    }
    Err(conflict(store, key, CAS_TRIES))
}

pub use crate::keys::key_part;

#[cfg(test)]
mod tests {
    use super::key_part;

    #[test]
    fn key_parts_are_safe_and_distinct() {
        assert_eq!(key_part("fetch_page"), "fetch_page");
        assert_eq!(key_part("a b"), "x-612062");
        assert_eq!(key_part("a.b"), "x-612e62");
        assert_ne!(key_part("x-1"), "x-1");
    }
}
