//! The plan of one execution (normalised playbook + merged workload),
//! stored in KV by the router and cached by every service so no message
//! re-parses the playbook. Only a resume (`noetl exec resume --set`,
//! `--playbook-version`) writes it again; every process then drops its
//! copy ([`crate::cancel`]).

use std::sync::Arc;

use noetl_core::Playbook;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Mesh, MeshError};

/// What is stored under `<eid>.plan`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanRecord {
    /// Execution id.
    pub execution_id: String,
    /// File name or catalog path the playbook came from.
    pub source_name: String,
    /// The normalised playbook, shared by the plans of one playbook in a
    /// process ([`PlanCache`], the router's parsed playbooks), and
    /// serialised once for all of them ([`playbook_as_stored`]).
    #[serde(serialize_with = "playbook_as_stored")]
    pub playbook: Arc<Playbook>,
    /// The merged, immutable workload.
    pub workload: Value,
    /// Parent execution (child playbooks).
    #[serde(default)]
    pub parent_execution_id: String,
    /// Trace id of the execution.
    #[serde(default)]
    pub trace_id: String,
    /// When the execution started (Unix epoch ms; 0 in plans stored before
    /// this field existed): deadlines counted from the start use it.
    #[serde(default)]
    pub started_ms: u64,
    /// The parent task's `iter` (child playbooks): `iter.parent` here.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub parent_iter: Value,
    /// The step whose last result answers the parent task (a child
    /// started with `return_step`); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub return_step: String,
    /// What is derived from the playbook alone, shared by every plan of
    /// the same playbook in this process ([`Derived`], found on demand).
    #[serde(skip)]
    derived: std::sync::OnceLock<Arc<Derived>>,
    /// [`PlanRecord::playbook_digest`] (computed once, on demand).
    #[serde(skip)]
    digest: std::sync::OnceLock<[u8; 32]>,
}

/// [`PlanRecord`]'s index of its steps.
#[derive(Debug, Default, Clone)]
struct StepIndex {
    position: std::collections::HashMap<String, usize>,
    names: Arc<std::collections::BTreeSet<String>>,
}

/// What a plan derives from its playbook alone, each computed once, on
/// demand, for every plan of that playbook in the process (plans of one
/// playbook share it: the router's parsed playbooks, [`PlanCache`]): a
/// long workflow is not scanned for every message, nor a playbook
/// serialised for every execution.
#[derive(Debug, Default)]
struct Derived {
    /// Step index by name, and the names as one shared set.
    steps: std::sync::OnceLock<StepIndex>,
    /// Step names some template reads by name.
    referenced: std::sync::OnceLock<std::collections::BTreeSet<String>>,
}

/// The [`Derived`] of `playbook`, shared by the plans of that playbook.
fn derived_of(playbook: &Arc<Playbook>) -> Arc<Derived> {
    static SEEN: std::sync::OnceLock<crate::cache::ByAddress<Playbook, Arc<Derived>>> =
        std::sync::OnceLock::new();
    let seen = SEEN.get_or_init(|| crate::cache::ByAddress::new(1024));
    seen.get(playbook).unwrap_or_else(|| {
        let derived = Arc::new(Derived::default());
        seen.insert(playbook, derived.clone());
        derived
    })
}

/// Serialise a plan's playbook as the JSON kept for that shared playbook:
/// the executions of one playbook store the same text, and serialise the
/// playbook once per process instead of once each.
fn playbook_as_stored<S: serde::Serializer>(
    playbook: &Arc<Playbook>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::Serialize as _;
    match stored_json(playbook) {
        Some(json) => json.serialize(serializer),
        None => playbook.serialize(serializer),
    }
}

/// `playbook` as JSON, from the text kept for that shared playbook (by
/// address, as [`Derived`]; at most [`PLAYBOOKS`]); `None` if it cannot
/// be serialised (the caller's own serialisation then says why).
fn stored_json(playbook: &Arc<Playbook>) -> Option<Arc<serde_json::value::RawValue>> {
    type Json = Arc<serde_json::value::RawValue>;
    static SEEN: std::sync::OnceLock<crate::cache::ByAddress<Playbook, Json>> =
        std::sync::OnceLock::new();
    let seen = SEEN.get_or_init(|| crate::cache::ByAddress::weighted(PLAYBOOKS.0, PLAYBOOKS.1));
    if let Some(json) = seen.get(playbook) {
        return Some(json);
    }
    let json: Json = serde_json::value::to_raw_value(&**playbook).ok()?.into();
    seen.insert_weighing(playbook, json.clone(), json.get().len());
    Some(json)
}

impl PlanRecord {
    /// A plan record.
    pub fn new(
        execution_id: String,
        source_name: String,
        playbook: Playbook,
        workload: Value,
    ) -> Self {
        Self::sharing(execution_id, source_name, Arc::new(playbook), workload)
    }

    /// A plan record whose playbook is shared with other plans.
    pub fn sharing(
        execution_id: String,
        source_name: String,
        playbook: Arc<Playbook>,
        workload: Value,
    ) -> Self {
        Self {
            execution_id,
            source_name,
            playbook,
            workload,
            parent_execution_id: String::new(),
            trace_id: String::new(),
            started_ms: 0,
            parent_iter: Value::Null,
            return_step: String::new(),
            derived: Default::default(),
            digest: Default::default(),
        }
    }

    /// Results above this many bytes travel by reference:
    /// `executor.spec.limits.max_payload_bytes`, else `default`.
    pub fn max_payload_bytes(&self, default: usize) -> usize {
        self.playbook
            .executor
            .as_ref()
            .and_then(|e| e.spec.get("limits"))
            .and_then(|l| l.get("max_payload_bytes"))
            .and_then(Value::as_u64)
            .map(|n| n as usize)
            .unwrap_or(default)
    }

    /// The names of the playbook's steps, in workflow order.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.playbook.workflow.iter().map(|s| s.step.as_str())
    }

    /// The step named `name` (the first, as [`noetl_core::Playbook::step`]).
    pub fn step(&self, name: &str) -> Option<&noetl_core::Step> {
        self.playbook.workflow.get(self.step_position(name)?)
    }

    /// Where the step named `name` is in the workflow (the first of that
    /// name).
    pub fn step_position(&self, name: &str) -> Option<usize> {
        self.step_index().position.get(name).copied()
    }

    /// This plan without what was derived from its playbook (the step
    /// index, the names templates read, the digest): computed again on
    /// demand, after the playbook changed.
    pub fn without_derived(mut self) -> Self {
        self.derived = Default::default();
        self.digest = Default::default();
        self
    }

    /// SHA-256 of the playbook as stored: equal for the plans of one
    /// playbook (whatever their executions and workloads), so what is
    /// derived from the playbook alone can be kept once for all of them.
    pub fn playbook_digest(&self) -> [u8; 32] {
        *self.digest.get_or_init(|| {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            // Serialising a parsed playbook cannot fail; if it did, the
            // digest of nothing would still differ from every playbook's
            // (the execution id is mixed in below).
            if serde_json::to_writer(&mut h, &self.playbook).is_err() {
                h.update(self.execution_id.as_bytes());
            }
            h.finalize().into()
        })
    }

    /// Every step name, as one set templates can declare at once
    /// ([`noetl_core::template::Scope::declare_all`]).
    pub fn step_name_set(&self) -> Arc<std::collections::BTreeSet<String>> {
        self.step_index().names.clone()
    }

    fn derived(&self) -> &Derived {
        self.derived.get_or_init(|| derived_of(&self.playbook))
    }

    fn step_index(&self) -> &StepIndex {
        self.derived().steps.get_or_init(|| {
            let mut position = std::collections::HashMap::new();
            for (i, s) in self.playbook.workflow.iter().enumerate() {
                position.entry(s.step.clone()).or_insert(i);
            }
            StepIndex {
                names: Arc::new(position.keys().cloned().collect()),
                position,
            }
        })
    }

    /// True when some template of the playbook reads `step`'s result by
    /// name (`{{ step.x }}`), or it is the [`Self::return_step`]: only then
    /// is the result worth storing in KV.
    pub fn is_result_referenced(&self, step: &str) -> bool {
        if !self.return_step.is_empty() && self.return_step == step {
            return true;
        }
        self.derived()
            .referenced
            .get_or_init(|| {
                let names: std::collections::BTreeSet<&str> = self.step_names().collect();
                let json = serde_json::to_value(&self.playbook).unwrap_or(Value::Null);
                let roots = crate::scope::roots(crate::scope::strings(&json));
                roots
                    .into_iter()
                    .filter(|r| names.contains(r.as_str()))
                    .collect()
            })
            .contains(step)
    }

    /// The render scope of templates the services evaluate themselves (an
    /// arc's `when` and `args`, a loop's `in` and window): the workload,
    /// `ctx`, the token's `args` (results by reference read back), the
    /// execution id, and the results of the steps `templates` read, every
    /// step name declared. Arcs add their `event`, loops the parent's
    /// `iter`.
    pub async fn template_scope<'t, S: crate::scope::StateSource>(
        &self,
        source: &S,
        templates: impl IntoIterator<Item = &'t str>,
        args: &Value,
    ) -> Result<noetl_core::template::Scope, MeshError> {
        let roots = crate::scope::roots(templates);
        // The steps whose results a template reads (not every step's name).
        let names: Vec<&str> = roots
            .iter()
            .map(String::as_str)
            .filter(|r| self.step(r).is_some())
            .collect();
        let loaded = crate::scope::load_from(source, &self.execution_id, &roots, &names).await?;
        let mut sc = noetl_core::template::Scope::new()
            .workload(self.workload.clone())
            .ctx(loaded.ctx)
            .args(source.args(args).await?)
            .execution_id(self.execution_id.clone())
            .declare_all(self.step_name_set());
        for (name, result) in loaded.steps {
            sc = sc.step_result(name, result);
        }
        Ok(sc)
    }
}

/// How many plans a [`PlanCache`] holds at most: more than the
/// executions a replica has in flight at once in `noetl-bench`'s 1,000
/// concurrent executions, so none is read back and parsed again per step
/// (docs/performance.md "Plans read again").
pub const PLAN_CACHE_ENTRIES: usize = 4096;

/// The most the cached plans may weigh ([`weight`]): a five-step noop
/// plan weighs about 10 KB in memory (836 bytes as stored), a large
/// playbook's plan far more, and a replica keeps its memory bounded
/// whatever they are.
pub const PLAN_CACHE_BYTES: usize = 16 << 20;

/// How many decoded playbooks a [`PlanCache`] shares among its plans, and
/// the most they may weigh ([`weight`]).
const PLAYBOOKS: (usize, usize) = (256, 8 << 20);

/// A bounded cache of plans by execution id, by count and by what the
/// plans weigh in memory ([`weight`]). The plans read from KV share their
/// playbook when its stored JSON is the same: the executions of one
/// playbook decode it once per process, not once each.
pub struct PlanCache {
    inner: crate::cache::Bounded<String, Arc<PlanRecord>>,
    /// Decoded playbooks by the SHA-256 of their stored JSON.
    playbooks: crate::cache::Bounded<[u8; 32], Arc<Playbook>>,
}

impl Default for PlanCache {
    fn default() -> Self {
        Self::new(PLAN_CACHE_ENTRIES, PLAN_CACHE_BYTES)
    }
}

/// `plan`'s key, its bytes as stored, and its weight in the cache
/// ([`weight`]): serialised once, for both.
fn encoded(mesh: &Mesh, plan: &PlanRecord) -> Result<(String, Vec<u8>, usize), MeshError> {
    let key = crate::keys::Keys::plan(&plan.execution_id);
    let bytes = crate::kv::encode(mesh.exec_kv(), &key, plan)?;
    let weight = weight(plan, bytes.len());
    Ok((key, bytes, weight))
}

impl PlanCache {
    /// A cache holding at most `capacity` plans weighing at most `budget`
    /// bytes ([`weight`]; the newest is kept whatever it weighs).
    pub fn new(capacity: usize, budget: usize) -> Self {
        Self {
            inner: crate::cache::Bounded::weighted(capacity, budget),
            playbooks: crate::cache::Bounded::weighted(PLAYBOOKS.0, PLAYBOOKS.1),
        }
    }

    /// Store `plan` under its key (`<eid>.plan`) and keep it here, weighed
    /// by the bytes just written: it is serialised once, for both.
    pub async fn store(&self, mesh: &Mesh, plan: Arc<PlanRecord>) -> Result<(), MeshError> {
        let (key, bytes, weight) = encoded(mesh, &plan)?;
        crate::kv::put_bytes(mesh.exec_kv(), &key, bytes).await?;
        self.insert_weighing(plan, weight);
        Ok(())
    }

    /// Store `plan` unless a plan of its execution is stored already, and
    /// return the plan that stands: `plan`, or the one stored before (a
    /// delivery of the same request that got there first, or stopped
    /// before its header: the first plan written, and its start time, are
    /// the ones its events are made from). Kept here either way.
    pub async fn create(
        &self,
        mesh: &Mesh,
        plan: Arc<PlanRecord>,
    ) -> Result<Arc<PlanRecord>, MeshError> {
        let (key, bytes, weight) = encoded(mesh, &plan)?;
        if crate::kv::create_bytes(mesh.exec_kv(), &key, bytes).await? {
            self.insert_weighing(plan.clone(), weight);
            return Ok(plan);
        }
        self.forget(&plan.execution_id);
        self.get(mesh, &plan.execution_id).await
    }

    fn insert_weighing(&self, plan: Arc<PlanRecord>, weight: usize) {
        self.inner
            .insert_weighing(plan.execution_id.clone(), plan, weight);
    }

    /// Forget the plan of `eid` (a resume may have changed it).
    pub fn forget(&self, eid: &str) {
        self.inner.remove(eid);
    }

    /// The plan of `eid`, from the cache or KV.
    pub async fn get(&self, mesh: &Mesh, eid: &str) -> Result<Arc<PlanRecord>, MeshError> {
        if let Some(p) = self.inner.get(eid) {
            return Ok(p);
        }
        let key = crate::keys::Keys::plan(eid);
        let store = mesh.exec_kv();
        let bytes = crate::kv::get_bytes(store, &key)
            .await?
            .ok_or_else(|| MeshError::NoPlan {
                execution_id: eid.to_string(),
            })?;
        let rec = match self.decode_sharing(&bytes) {
            Some(rec) => rec,
            None => crate::kv::decode(store, &key, &bytes)?,
        };
        let plan = Arc::new(rec);
        self.insert_weighing(plan.clone(), weight(&plan, bytes.len()));
        Ok(plan)
    }

    /// `bytes` (a stored plan) decoded with the playbook this cache
    /// already holds for the same JSON; `None` when they are not a plan
    /// of this version's shape (the caller decodes them whole, and says
    /// what is wrong).
    fn decode_sharing(&self, bytes: &[u8]) -> Option<PlanRecord> {
        use sha2::{Digest, Sha256};
        let stored: StoredPlan<'_> = serde_json::from_slice(bytes).ok()?;
        let text = stored.playbook.get();
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        let playbook = match self.playbooks.get(&digest) {
            Some(p) => p,
            None => {
                let p: Arc<Playbook> = Arc::new(serde_json::from_str(text).ok()?);
                let w = size_of_playbook(&p) + text.len();
                self.playbooks.insert_weighing(digest, p.clone(), w);
                p
            }
        };
        let mut plan = PlanRecord::sharing(
            stored.execution_id,
            stored.source_name,
            playbook,
            stored.workload,
        );
        plan.parent_execution_id = stored.parent_execution_id;
        plan.trace_id = stored.trace_id;
        plan.started_ms = stored.started_ms;
        plan.parent_iter = stored.parent_iter;
        plan.return_step = stored.return_step;
        // The playbook's JSON as stored is what `playbook_digest` hashes.
        let _ = plan.digest.set(digest);
        Some(plan)
    }
}

/// A [`PlanRecord`] as stored, its playbook left as JSON. Any field it
/// does not know (a plan of a later version) makes the caller decode the
/// record whole.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredPlan<'a> {
    execution_id: String,
    source_name: String,
    #[serde(borrow)]
    playbook: &'a serde_json::value::RawValue,
    workload: Value,
    #[serde(default)]
    parent_execution_id: String,
    #[serde(default)]
    trace_id: String,
    #[serde(default)]
    started_ms: u64,
    #[serde(default)]
    parent_iter: Value,
    #[serde(default)]
    return_step: String,
}

/// An estimate of the bytes `plan` holds in memory: its structs (a step's
/// is over a kilobyte however little it says) plus `stored`, the bytes of
/// its JSON, for what they point to (names, templates, values).
fn weight(plan: &PlanRecord, stored: usize) -> usize {
    std::mem::size_of::<PlanRecord>() + size_of_playbook(&plan.playbook) + stored
}

/// The bytes a playbook's structs take (not what they point to).
fn size_of_playbook(playbook: &Playbook) -> usize {
    use noetl_core::model::{Arc as Edge, Step, Task};
    use std::mem::size_of;
    let steps: usize = playbook
        .workflow
        .iter()
        .map(|s| {
            let arcs = s.next.as_ref().map_or(0, |n| n.arcs.len());
            size_of::<Step>() + s.tool.len() * size_of::<Task>() + arcs * size_of::<Edge>()
        })
        .sum();
    size_of::<Playbook>() + steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_found_by_name_and_their_names_shared_as_one_set() {
        let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: p }\nworkflow:\n  - step: start\n    next: { arcs: [ { step: b } ] }\n  - step: b\n";
        let playbook = noetl_core::load::load_playbook(yaml, "p.yaml")
            .unwrap()
            .playbook;
        let plan = PlanRecord::new("e1".into(), "p.yaml".into(), playbook, Value::Null);
        assert_eq!(plan.step("b").map(|s| s.step.as_str()), Some("b"));
        assert_eq!(plan.step("start").map(|s| s.step.as_str()), Some("start"));
        assert!(plan.step("missing").is_none());
        let names = plan.step_name_set();
        assert_eq!(names.iter().collect::<Vec<_>>(), ["b", "start"]);
        assert!(Arc::ptr_eq(&names, &plan.step_name_set()), "computed once");
    }

    fn plan(eid: &str) -> PlanRecord {
        let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: p }\nworkflow:\n  - step: start\n    next: { arcs: [ { step: b } ] }\n  - step: b\n";
        let playbook = noetl_core::load::load_playbook(yaml, "p.yaml")
            .unwrap()
            .playbook;
        PlanRecord::new(eid.into(), "p.yaml".into(), playbook, Value::Null)
    }

    /// What a plan weighs once stored.
    fn weighed(p: &PlanRecord) -> usize {
        weight(p, serde_json::to_vec(p).unwrap().len())
    }

    /// Keep `p` as [`PlanCache::store`] does, without the KV write.
    fn keep(cache: &PlanCache, p: PlanRecord) {
        let w = weighed(&p);
        cache.insert_weighing(Arc::new(p), w);
    }

    #[test]
    fn a_plan_weighs_its_json_and_its_structs() {
        let p = plan("e1");
        let stored = serde_json::to_vec(&p).unwrap().len();
        let structs = 2 * std::mem::size_of::<noetl_core::model::Step>();
        assert!(weight(&p, stored) > stored + structs);
    }

    #[test]
    fn the_plan_cache_keeps_to_its_bytes_dropping_the_oldest() {
        let one = weighed(&plan("e1"));
        let cache = PlanCache::new(100, one * 2 + one / 2);
        for eid in ["e1", "e2", "e3"] {
            keep(&cache, plan(eid));
        }
        assert!(
            cache.inner.get("e1").is_none(),
            "over budget: the oldest goes"
        );
        assert!(cache.inner.get("e2").is_some());
        assert!(cache.inner.get("e3").is_some());
        let by_count = PlanCache::new(2, usize::MAX);
        for eid in ["e1", "e2", "e3"] {
            keep(&by_count, plan(eid));
        }
        assert!(
            by_count.inner.get("e1").is_none(),
            "over count: the oldest goes"
        );
        assert_eq!(by_count.inner.len(), 2);
    }

    #[test]
    fn plans_of_one_playbook_share_a_digest_others_do_not() {
        let a = plan("e1");
        let mut b = plan("e2");
        b.workload = serde_json::json!({"other": "workload"});
        assert_eq!(a.playbook_digest(), b.playbook_digest());
        let mut c = plan("e3");
        Arc::make_mut(&mut c.playbook).workflow[1].step = "c".into();
        assert_ne!(a.playbook_digest(), c.playbook_digest());
    }

    /// A plan with every stored field set.
    fn full(eid: &str) -> PlanRecord {
        let mut p = plan(eid);
        p.workload = serde_json::json!({"n": eid});
        p.parent_execution_id = "parent".into();
        p.trace_id = "trace".into();
        p.started_ms = 42;
        p.parent_iter = serde_json::json!({"i": 1});
        p.return_step = "b".into();
        p
    }

    #[test]
    fn plans_of_one_playbook_read_back_share_it_and_equal_a_whole_decode() {
        let cache = PlanCache::default();
        let (one, two) = (full("e1"), full("e2"));
        let (b1, b2) = (
            serde_json::to_vec(&one).unwrap(),
            serde_json::to_vec(&two).unwrap(),
        );
        let (r1, r2) = (
            cache.decode_sharing(&b1).expect("a plan of this shape"),
            cache.decode_sharing(&b2).expect("a plan of this shape"),
        );
        assert!(
            Arc::ptr_eq(&r1.playbook, &r2.playbook),
            "one playbook decoded"
        );
        for (read, bytes) in [(&r1, &b1), (&r2, &b2)] {
            let whole: PlanRecord = serde_json::from_slice(bytes).unwrap();
            assert_eq!(
                serde_json::to_value(read).unwrap(),
                serde_json::to_value(&whole).unwrap()
            );
            assert_eq!(read.playbook_digest(), whole.playbook_digest());
        }
        assert_eq!(r1.workload, serde_json::json!({"n": "e1"}));
    }

    #[test]
    fn a_plan_of_another_shape_is_left_to_a_whole_decode() {
        let cache = PlanCache::default();
        let mut v = serde_json::to_value(full("e1")).unwrap();
        v["a_later_field"] = serde_json::json!(1);
        assert!(cache
            .decode_sharing(&serde_json::to_vec(&v).unwrap())
            .is_none());
        assert!(cache.decode_sharing(b"{not json").is_none());
    }

    #[test]
    fn plans_of_one_playbook_derive_its_index_once() {
        let first = plan("e1");
        let second = PlanRecord::sharing(
            "e2".into(),
            "p.yaml".into(),
            first.playbook.clone(),
            Value::Null,
        );
        assert_eq!(first.step_position("b"), Some(1));
        assert_eq!(second.step_position("b"), Some(1));
        assert!(Arc::ptr_eq(
            first.derived.get().expect("derived for the first"),
            second.derived.get().expect("derived for the second")
        ));
        assert!(!first.is_result_referenced("b"));
        assert!(second.derived().referenced.get().is_some(), "shared");
        let other = plan("e3");
        assert_eq!(other.step_position("b"), Some(1));
        assert!(!Arc::ptr_eq(
            other.derived.get().unwrap(),
            first.derived.get().unwrap()
        ));
    }

    #[test]
    fn plans_of_one_playbook_store_it_serialised_once_and_a_changed_one_anew() {
        let mut p = plan("e1");
        let stored = serde_json::to_value(&p).unwrap();
        assert_eq!(
            stored["playbook"],
            serde_json::to_value(&*p.playbook).unwrap()
        );
        let second = PlanRecord::sharing(
            "e2".into(),
            "p.yaml".into(),
            p.playbook.clone(),
            Value::Null,
        );
        assert_eq!(
            serde_json::to_value(&second).unwrap()["playbook"],
            stored["playbook"]
        );
        assert!(
            Arc::ptr_eq(
                &stored_json(&p.playbook).unwrap(),
                &stored_json(&second.playbook).unwrap()
            ),
            "serialised once for both"
        );
        drop(second);
        // The only strong reference left: `make_mut` changes it elsewhere
        // (the kept text holds a weak one), as a resume's `--set` does.
        Arc::make_mut(&mut p.playbook).workflow[1].step = "c".into();
        let stored = serde_json::to_value(&p).unwrap();
        assert_eq!(stored["playbook"]["workflow"][1]["step"], "c");
    }

    #[test]
    fn a_plan_without_what_was_derived_derives_it_from_its_new_playbook() {
        let mut p = plan("e1");
        assert!(p.step("b").is_some());
        let before = p.playbook_digest();
        Arc::make_mut(&mut p.playbook).workflow[1].step = "c".into();
        let p = p.without_derived();
        assert!(p.step("b").is_none() && p.step("c").is_some());
        assert_ne!(p.playbook_digest(), before);
    }
}
