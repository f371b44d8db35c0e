//! A loop's elements: the collection of a loop over `in`, stored in chunks
//! of [`CHUNK`] elements when the loop starts, and the rows of a cursor
//! loop's claims; both read back, through a small cache, when an
//! iteration is dispatched.

use std::sync::Arc;

use noetl_mesh::{
    codec,
    event_type::EventType,
    keys::Keys,
    kv,
    payloads::{self, LoopStarted},
    Mesh, MeshError,
};
use serde_json::Value;

use crate::state::cursor::CursorRun;

/// Elements per stored chunk of a loop collection: state stays small and a
/// dispatch reads one chunk, whatever the collection's size.
pub const CHUNK: usize = 1000;

/// A loop collection to store.
pub(crate) struct Collection<'a> {
    pub eid: &'a str,
    pub srid: &'a str,
    pub step: &'a str,
    pub items: &'a [Value],
    /// Chunks whose JSON is larger go to object storage; KV keeps the
    /// reference.
    pub limit: usize,
}

/// Store the collection in chunks of [`CHUNK`] elements, and return the
/// list of the chunks as stored, for `loop.started` (inline, or by
/// reference when large): what rebuilds them if the loop bucket loses
/// them ([`restore_chunk`]). A collection whose JSON is over the limit has
/// every chunk in object storage (KV holds their references), so the
/// list stays small; a small one has every chunk in KV.
pub(crate) async fn store_items(mesh: &Mesh, c: Collection<'_>) -> Result<Value, MeshError> {
    let limit = if is_small(c.items, c.limit) {
        c.limit
    } else {
        0
    };
    let mut batch = Vec::new();
    for (n, chunk) in c.items.chunks(CHUNK).enumerate() {
        let value = Value::Array(chunk.to_vec());
        let id = Keys::items_object(c.srid, n);
        let value = mesh
            .results()
            .offload(
                noetl_mesh::objects::PutParams {
                    execution_id: c.eid,
                    step: c.step,
                    id: &id,
                    value: &value,
                },
                limit,
            )
            .await?;
        batch.push((Keys::items(c.eid, c.srid, n), value));
    }
    let puts = batch.iter().map(|(k, v)| kv::put(mesh.loop_kv(), k, v));
    for r in futures::future::join_all(puts).await {
        r?;
    }
    let chunks = Value::Array(batch.into_iter().map(|(_, v)| v).collect());
    logged_list(mesh, &c, chunks).await
}

/// The list of stored chunks as `loop.started` carries it: inline when
/// small, else by reference.
async fn logged_list(mesh: &Mesh, c: &Collection<'_>, chunks: Value) -> Result<Value, MeshError> {
    let id = Keys::collection_object(c.srid);
    let p = noetl_mesh::objects::PutParams {
        execution_id: c.eid,
        step: c.step,
        id: &id,
        value: &chunks,
    };
    Ok(mesh.results().offload(p, c.limit).await?)
}

/// True when `items` as JSON are at most `limit` bytes.
fn is_small(items: &[Value], limit: usize) -> bool {
    let mut len = 2usize;
    for v in items {
        len += serde_json::to_vec(v)
            .map(|b| b.len())
            .unwrap_or(usize::MAX / 2)
            + 1;
        if len > limit {
            return false;
        }
    }
    true
}

/// The chunks of loop run `srid` as stored in the loop bucket (`chunks`
/// of them), as `loop.started` carries them: for a start redelivered
/// after its first publish may have been lost. `Null` when one is gone.
pub(crate) async fn stored_list(
    mesh: &Mesh,
    at: Elements<'_>,
    chunks: usize,
) -> Result<Value, MeshError> {
    let mut out = Vec::with_capacity(chunks);
    for n in 0..chunks {
        match kv::get::<Value>(mesh.loop_kv(), &Keys::items(at.eid, at.srid, n)).await? {
            Some(v) => out.push(v),
            None => return Ok(Value::Null),
        }
    }
    Ok(Value::Array(out))
}

/// Chunk `chunk` of loop run `at` written back to the loop bucket from the
/// collection its `loop.started` carries (create-only: a chunk stored
/// meanwhile stands); `None` when the log does not have it (a run started
/// before `loop.started` carried its collection, or a cursor loop).
pub(crate) async fn restore_chunk(
    at: Elements<'_>,
    chunk: usize,
) -> Result<Option<Value>, MeshError> {
    let mesh = at.mesh;
    let filter = mesh
        .subjects()
        .events_matching(Some(at.eid), EventType::LoopStarted.wire_name());
    let mut list = Value::Null;
    for (_, ev) in mesh.stored_events_from(&filter, None).await? {
        let Ok(ev) = ev else { continue };
        if ev.step_run_id != at.srid {
            continue;
        }
        if let Ok(p) = payloads::decode::<LoopStarted>(&ev) {
            list = p.collection;
        }
    }
    if list.is_null() {
        return Ok(None);
    }
    let list = mesh.results().hydrate(list).await?;
    let Some(value) = list.get(chunk).cloned() else {
        return Ok(None);
    };
    let key = Keys::items(at.eid, at.srid, chunk);
    kv::create(mesh.loop_kv(), &key, &value).await?;
    tracing::info!(execution_id = %at.eid, loop_run = %at.srid, chunk, "collection chunk rebuilt from loop.started");
    Ok(Some(value))
}

/// An element of a stored collection could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ItemError {
    /// Transient: retry the message.
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// The chunk is gone or corrupt: the loop cannot go on.
    #[error("{0}")]
    Gone(String),
}

/// Why a stored list cannot be read (worded by its reader).
enum Unreadable {
    /// No record under its key.
    Missing,
    /// It holds something else than a list: the JSON type it holds.
    Holds(&'static str),
    /// Its object is gone or corrupt.
    Broken(String),
}

/// Which loop run's elements are read.
#[derive(Clone, Copy)]
pub(crate) struct Elements<'a> {
    pub mesh: &'a Mesh,
    pub eid: &'a str,
    /// The loop run id.
    pub srid: &'a str,
}

/// The most memory the chunks a [`ChunkCache`] holds take, as
/// [`heap_size`] estimates it (but for the newest, kept whatever its
/// size). Held by count alone (64), a cursor loop's claims of 1,000 rows
/// took 20 MiB of a loop-supervisor's 25 MiB heap in `make test-heavy`.
pub const CHUNK_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// A small cache of collection chunks (a loop dispatches from the same chunk
/// CHUNK times in a row). One per process and mesh, shared by the handlers;
/// keyed by bucket and key all the same; bounded by count and by
/// [`CHUNK_CACHE_BYTES`].
pub(crate) struct ChunkCache {
    inner: noetl_mesh::cache::Bounded<String, Arc<Vec<Value>>>,
}

impl Default for ChunkCache {
    fn default() -> Self {
        Self {
            inner: noetl_mesh::cache::Bounded::weighted(64, CHUNK_CACHE_BYTES),
        }
    }
}

impl ChunkCache {
    /// The element of iteration `index`: an element of the collection, or
    /// for a cursor loop (`cursor`) its claimed row.
    pub(crate) async fn element(
        &self,
        at: Elements<'_>,
        cursor: Option<&CursorRun>,
        index: u64,
    ) -> Result<Value, ItemError> {
        match cursor {
            Some(c) => self.row(at, c, index).await,
            None => self.item(at, index).await,
        }
    }

    /// Element `index` of the stored collection. A chunk that cannot be
    /// read is written back from the loop's `loop.started` when missing
    /// ([`restore_chunk`]) and read again.
    async fn item(&self, at: Elements<'_>, index: u64) -> Result<Value, ItemError> {
        let chunk = index as usize / CHUNK;
        let key = Keys::items(at.eid, at.srid, chunk);
        let words = |reference: Option<String>, why| {
            let named = match &reference {
                Some(r) => format!("collection chunk {key} ({r})"),
                None => format!("collection chunk {key}"),
            };
            match why {
                Unreadable::Missing => format!(
                    "collection chunk {key} (items {}..) is missing from the loop bucket and its loop.started does not carry it",
                    chunk * CHUNK
                ),
                Unreadable::Holds(t) => format!("{named} holds {t}, not a list"),
                Unreadable::Broken(e) => format!("{named}: {e}"),
            }
        };
        // Written back (create-only) from `loop.started`, then read again:
        // a chunk that is there but unreadable stays so. One purged again
        // before that read is written back again, not taken for gone.
        let mut read = self.list(at.mesh, &key, words).await;
        for _ in 0..kv::RESTORES {
            match read {
                Err(ItemError::Gone(_)) if restore_chunk(at, chunk).await?.is_some() => {
                    read = self.list(at.mesh, &key, words).await;
                }
                _ => break,
            }
        }
        let items = read?;
        items.get(index as usize % CHUNK).cloned().ok_or_else(|| {
            ItemError::Gone(format!(
                "collection chunk {key} has {} items, item {index} is not there",
                items.len()
            ))
        })
    }

    /// The element of iteration `index` of a cursor loop run: its row (or,
    /// with `process: frame`, its claim's rows), read from the frame record.
    async fn row(&self, at: Elements<'_>, c: &CursorRun, index: u64) -> Result<Value, ItemError> {
        let Some(f) = c
            .frames
            .iter()
            .find(|f| (f.base..f.base + f.len).contains(&index))
        else {
            return Err(ItemError::Gone(format!(
                "no claim of loop run {} holds iteration {index}",
                at.srid
            )));
        };
        let key = Keys::frame(at.eid, at.srid, f.seq);
        let rows = self
            .list(at.mesh, &key, |_, why| match why {
                Unreadable::Missing => format!(
                    "the rows of claim {} ({key}) are missing from the loop bucket",
                    f.seq
                ),
                Unreadable::Holds(t) => format!("{key} holds {t}, not rows"),
                Unreadable::Broken(e) => format!("{key}: {e}"),
            })
            .await?;
        if c.per_frame {
            return Ok(Value::Array(rows.as_ref().clone()));
        }
        rows.get((index - f.base) as usize).cloned().ok_or_else(|| {
            ItemError::Gone(format!(
                "{key} has {} rows, iteration {index} is not there",
                rows.len()
            ))
        })
    }

    /// The list stored under `key` in the loop bucket (hydrated from object
    /// storage when offloaded), cached; `words` says why it cannot be read,
    /// given its object reference.
    async fn list(
        &self,
        mesh: &Mesh,
        key: &str,
        words: impl FnOnce(Option<String>, Unreadable) -> String,
    ) -> Result<Arc<Vec<Value>>, ItemError> {
        let cached = format!("{}/{key}", mesh.loop_kv().name);
        if let Some(v) = self.inner.get(&cached) {
            return Ok(v);
        }
        let Some(stored) = kv::get::<Value>(mesh.loop_kv(), key).await? else {
            return Err(ItemError::Gone(words(None, Unreadable::Missing)));
        };
        let reference = noetl_mesh::objects::Reference::of(&stored).map(|r| r.reference);
        let list = match mesh.results().hydrate(stored).await {
            Ok(Value::Array(a)) => a,
            Ok(other) => {
                let why = Unreadable::Holds(codec::json_type(&other));
                return Err(ItemError::Gone(words(reference, why)));
            }
            Err(e) if e.is_permanent() => {
                let why = Unreadable::Broken(e.to_string());
                return Err(ItemError::Gone(words(reference, why)));
            }
            Err(e) => return Err(MeshError::from(e).into()),
        };
        let weight = list.iter().map(heap_size).sum();
        let list = Arc::new(list);
        self.inner.insert_weighing(cached, list.clone(), weight);
        Ok(list)
    }
}

/// About the memory `v` takes: its own size, what its strings hold, and
/// for each array element and object entry its own size again (an
/// object's key and index slot included). An estimate for bounding a
/// cache, not an exact count.
fn heap_size(v: &Value) -> usize {
    const NODE: usize = std::mem::size_of::<Value>();
    NODE + match v {
        Value::String(s) => s.capacity(),
        Value::Array(a) => a.iter().map(heap_size).sum(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| k.capacity() + NODE + heap_size(v))
            .sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_chunk_is_weighed_by_what_its_elements_hold() {
        let node = std::mem::size_of::<Value>();
        assert_eq!(heap_size(&json!(7)), node);
        assert_eq!(heap_size(&json!("abc")), node + 3);
        assert_eq!(heap_size(&json!([1, 2])), 3 * node);
        assert_eq!(heap_size(&json!({"id": 1})), 3 * node + 2);
        // A claim of 1,000 rows of four columns: about two thirds of a
        // MiB, so the cache holds about six of them.
        let rows: Vec<Value> = (0..1000)
            .map(|i| json!({"id": i, "name": format!("row {i}"), "qty": i * 2, "ok": true}))
            .collect();
        let weight: usize = rows.iter().map(heap_size).sum();
        assert!((300_000..1_500_000).contains(&weight), "{weight}");
        let cache = ChunkCache::default();
        for n in 0..64 {
            cache
                .inner
                .insert_weighing(format!("frame.{n}"), Arc::new(rows.clone()), weight);
        }
        let held = cache.inner.len();
        assert!((2..=CHUNK_CACHE_BYTES / weight).contains(&held), "{held}");
        assert!(cache.inner.contains("frame.63"), "the newest stays");
    }
}
