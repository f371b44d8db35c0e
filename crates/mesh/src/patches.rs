//! What the event log carries whole (docs/architecture.md "The event
//! log"): `ctx` patches, reducer results, the merged workload and the
//! plan. A value small enough rides inline in its event; a larger one is
//! written once to the object store under a deterministic name (a
//! redelivered write writes the same object) and its event carries the
//! reference. Never a preview: folding the log must give back every
//! value the engine stored.

use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use std::sync::{Arc, OnceLock};

use crate::cache::{Bounded, ByAddress};
use crate::objects::{ObjectError, ResultStore};
use crate::MeshError;

/// Largest JSON (bytes) of a value an event carries inline; above it the
/// value goes by reference. Equal to the size above which an oversized
/// event's fields become previews, so an inline value is never cut.
pub const INLINE_BYTES: usize = noetl_core::limits::EVENT_FIELD_BYTES;

/// A value as an event carries it: inline, or a reference to it.
#[derive(Debug, Clone, PartialEq)]
pub enum Carried<T> {
    /// Small enough: the value itself.
    Inline(T),
    /// Stored whole in the object store: its reference.
    Stored(Value),
}

impl<T> Carried<T> {
    /// The inline value, if it is one.
    pub fn inline(self) -> Option<T> {
        match self {
            Self::Inline(v) => Some(v),
            Self::Stored(_) => None,
        }
    }

    /// The reference, if the value is stored.
    pub fn reference(&self) -> Option<Value> {
        match self {
            Self::Inline(_) => None,
            Self::Stored(r) => Some(r.clone()),
        }
    }
}

/// True when `value`'s JSON fits inline in an event.
pub fn fits_inline<T: Serialize>(value: &T) -> bool {
    serde_json::to_value(value)
        .map(|v| noetl_core::limits::json_size_within(&v, INLINE_BYTES).is_ok())
        .unwrap_or(false)
}

/// `value` inline when it fits, else written to the object store under
/// `execution/<eid>/log/<id>` (`id` deterministic: the task run, the
/// step-run's arcs, the loop run) and carried by reference.
pub async fn carry<T: Serialize>(
    store: &ResultStore,
    eid: &str,
    id: &str,
    value: T,
) -> Result<Carried<T>, MeshError> {
    if fits_inline(&value) {
        return Ok(Carried::Inline(value));
    }
    store_whole(store, eid, id, &value)
        .await
        .map(Carried::Stored)
}

/// `value` written to the object store under `execution/<eid>/log/<id>`
/// whatever its size (a value kept out of the event stream), and its
/// reference.
pub async fn store_whole<T: Serialize>(
    store: &ResultStore,
    eid: &str,
    id: &str,
    value: &T,
) -> Result<Value, MeshError> {
    let json = serde_json::to_value(value).map_err(|e| ObjectError::Config(e.to_string()))?;
    let reference = store
        .put_named(&format!("execution/{eid}/log/{id}"), &json)
        .await?;
    Ok(reference)
}

/// The value a reference stands for, as `T` (checksum verified).
pub async fn read<T: DeserializeOwned>(
    store: &ResultStore,
    reference: &Value,
) -> Result<T, MeshError> {
    let key = reference
        .get("key")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let value = store.hydrate(reference.clone()).await?;
    serde_json::from_value(value).map_err(|e| {
        MeshError::Object(ObjectError::Corrupt {
            store: store.location().label().to_string(),
            key,
            message: format!("it does not hold what its event names: {e}"),
        })
    })
}

/// `sha256:<hex>` of `value`'s JSON as a `serde_json::Value` writes it
/// (one form whatever the type it came from): the identity of a plan.
pub fn digest<T: Serialize>(value: &T) -> String {
    let json = serde_json::to_value(value).expect("plans serialise to JSON");
    let bytes = serde_json::to_vec(&json).expect("JSON serialises");
    format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))
}

/// Store a normalised playbook content-addressed (`plans/<digest>`: the
/// same playbook is one object however many executions run it) and return
/// its digest and reference.
pub async fn store_playbook(
    store: &ResultStore,
    playbook: &Arc<noetl_core::Playbook>,
) -> Result<(String, Value), MeshError> {
    // The same playbook is written once per process and store: every
    // execution of it names the same object.
    static STORED: OnceLock<Bounded<String, Value>> = OnceLock::new();
    let stored = STORED.get_or_init(|| Bounded::new(1024));
    let cache_key = |digest: &str| format!("{:?} {digest}", store.location());
    // Plans of one playbook share it (`PlanRecord::playbook`): its digest
    // is known by its address, without serialising it again.
    static DIGESTS: OnceLock<ByAddress<noetl_core::Playbook, String>> = OnceLock::new();
    let digests = DIGESTS.get_or_init(|| ByAddress::new(1024));
    if let Some(digest) = digests.get(playbook) {
        if let Some(reference) = stored.get(&cache_key(&digest)) {
            return Ok((digest, reference));
        }
    }
    let json = serde_json::to_value(&**playbook).map_err(|e| ObjectError::Config(e.to_string()))?;
    let digest = digest(&json);
    digests.insert(playbook, digest.clone());
    let key = cache_key(&digest);
    if let Some(reference) = stored.get(&key) {
        return Ok((digest, reference));
    }
    let name = format!("plans/{}", digest.trim_start_matches("sha256:"));
    let reference = store.put_named(&name, &json).await?;
    stored.insert(key, reference.clone());
    Ok((digest, reference))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store() -> (tempfile::TempDir, ResultStore) {
        let dir = tempfile::tempdir().unwrap();
        let loc = crate::objects::StoreLocation::parse(dir.path().to_str().unwrap()).unwrap();
        (dir, ResultStore::open(loc).unwrap())
    }

    #[tokio::test]
    async fn a_small_value_rides_inline_and_a_large_one_by_reference_read_back_whole() {
        let (_dir, store) = store();
        let small = json!({"n": 1});
        assert_eq!(
            carry(&store, "e1", "t1", small.clone()).await.unwrap(),
            Carried::Inline(small)
        );
        let big = json!({"rows": "x".repeat(INLINE_BYTES + 1)});
        let carried = carry(&store, "e1", "t2", big.clone()).await.unwrap();
        let reference = carried.reference().expect("stored");
        assert!(crate::objects::is_ref(&reference), "{reference}");
        let back: Value = read(&store, &reference).await.unwrap();
        assert_eq!(back, big);
    }

    #[tokio::test]
    async fn a_playbook_is_stored_once_under_its_digest() {
        let (_dir, store) = store();
        let load = |name: &str| {
            let yaml = format!("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{name: {name}}}\nworkflow:\n  - step: start\n    tool: {{kind: noop}}\n");
            Arc::new(
                noetl_core::load::load_playbook(&yaml, "p.yaml")
                    .unwrap()
                    .playbook,
            )
        };
        let pb = load("p");
        let (d1, r1) = store_playbook(&store, &pb).await.unwrap();
        let (d2, r2) = store_playbook(&store, &pb).await.unwrap();
        assert_eq!((d1.clone(), r1.clone()), (d2, r2));
        assert!(d1.starts_with("sha256:") && d1.len() == 71, "{d1}");
        let back: noetl_core::Playbook = read(&store, &r1).await.unwrap();
        assert_eq!(back, *pb);
        // The same playbook parsed again: the same object; another one,
        // once the first is dropped, gets its own.
        assert_eq!(store_playbook(&store, &load("p")).await.unwrap().0, d1);
        drop(pb);
        let other = load("q");
        let (d3, r3) = store_playbook(&store, &other).await.unwrap();
        assert_ne!(d3, d1);
        let back: noetl_core::Playbook = read(&store, &r3).await.unwrap();
        assert_eq!(back, *other);
    }
}
