//! A task's `set_ctx` patch written: reducer contributions stay in the
//! iteration, the rest is claimed (parallel loops) and merged into the
//! execution's `ctx` once per task run.

use noetl_core::Task;
use noetl_mesh::{
    ctx_owners,
    keys::Keys,
    kv::{self, Cas},
    state::{claim_ctx_keys, CtxClaim, CtxOwners},
    MeshError,
};
use serde_json::{Map, Value};

use super::{Cursor, StepRun};

/// Why a patch was not written: the error kind and message.
type CtxError = (&'static str, String);

/// What writing a task's `set_ctx` patch did, as its `task.done` records it.
pub(super) struct CtxWritten {
    /// Why nothing was written (a key conflict, a reducer that cannot fold).
    pub(super) error: Option<CtxError>,
    /// Keys that went to the loop's reducers instead of `ctx`.
    pub(super) reduced: Vec<String>,
    /// An earlier delivery of this command already applied the patch (its
    /// `task.done` never went out): the values `ctx` holds for its keys,
    /// which this delivery's `task.done` carries instead of its own
    /// rendering (a template such as `ctx.n + 1` renders differently now).
    pub(super) applied_before: Option<Map<String, Value>>,
}

impl StepRun<'_> {
    /// Write a task's `set_ctx` patch: reducer contributions stay in the
    /// iteration, the rest is claimed (parallel loops) and merged. Returns
    /// the keys that went to reducers, and the error kind and message when
    /// a key conflicts or a reducer fails (then nothing is written).
    pub(super) async fn write_ctx(
        &self,
        cur: &mut Cursor,
        task: &Task,
        patch: &Map<String, Value>,
        task_run_id: &str,
    ) -> Result<CtxWritten, MeshError> {
        let refused = |e: CtxError| CtxWritten {
            error: Some(e),
            reduced: Vec::new(),
            applied_before: None,
        };
        let rest = match self.split_ctx_patch(patch, &mut cur.reduce) {
            Err(e) => return Ok(refused(e)),
            Ok(rest) => rest,
        };
        let reduced: Vec<String> = patch
            .keys()
            .filter(|k| !rest.contains_key(*k))
            .cloned()
            .collect();
        if rest.is_empty() {
            return Ok(CtxWritten {
                error: None,
                reduced,
                applied_before: None,
            });
        }
        let writer = ctx_owners::writer(
            &self.step.step,
            self.loop_run.as_ref().map(|(_, i)| *i),
            &task.name,
        );
        match self.claim_ctx_keys(&rest, &writer, task_run_id).await? {
            Err(e) => Ok(refused(e)),
            Ok(()) => {
                let (ctx, again) = self.apply_ctx(&rest, task_run_id).await?;
                let applied_before = again.then(|| {
                    rest.keys()
                        .filter_map(|k| ctx.get(k).map(|v| (k.clone(), v.clone())))
                        .collect()
                });
                cur.ctx = ctx;
                Ok(CtxWritten {
                    error: None,
                    reduced,
                    applied_before,
                })
            }
        }
    }

    /// Inside a loop iteration, take the keys that have a declared reducer
    /// out of `patch` and fold them into the iteration's contributions;
    /// return the rest ([`split_patch`]).
    fn split_ctx_patch(
        &self,
        patch: &Map<String, Value>,
        contributions: &mut Map<String, Value>,
    ) -> Result<Map<String, Value>, CtxError> {
        split_patch(self.step, self.loop_run.is_some(), patch, contributions)
    }

    /// In a parallel loop, `ctx` keys are write-once per loop run
    /// ([`noetl_mesh::state::claim_ctx_keys`]); the claims live under
    /// `<eid>.owners.<loop_run>`, so the same loop step entered again (e.g.
    /// through a back-arc) starts with none. A record found missing may
    /// have been lost: when `ctx` holds a key of the patch with another
    /// value, the claims are folded back from the log first
    /// ([`Self::restore_owners`]); otherwise claiming afresh decides alike,
    /// and the log is not read.
    async fn claim_ctx_keys(
        &self,
        patch: &Map<String, Value>,
        writer: &str,
        task_run_id: &str,
    ) -> Result<Result<(), CtxError>, MeshError> {
        let parallel = self
            .step
            .loop_
            .as_ref()
            .map(|l| l.spec.mode == noetl_core::LoopMode::Parallel)
            .unwrap_or(false);
        let Some((loop_run_id, _)) = self.loop_run.as_ref().filter(|_| parallel) else {
            return Ok(Ok(()));
        };
        let hashes = ctx_owners::hashes(patch);
        let key = Keys::owners(self.eid(), loop_run_id);
        // `fresh`: the log was read and holds no claim of the run, so a
        // missing record is its first claim. A record rebuilt and purged
        // again before the claim is written is rebuilt again (bounded).
        let mut fresh = false;
        for _ in 0..kv::RESTORES {
            let mut conflict = None;
            let mut missing = false;
            kv::update(self.mesh().ctx_kv(), &key, |cur: Option<&CtxOwners>| {
                conflict = None;
                missing = cur.is_none() && !fresh;
                if missing {
                    return Cas::Keep;
                }
                match claim_ctx_keys(cur, &hashes, writer, task_run_id) {
                    CtxClaim::Held => Cas::Keep,
                    CtxClaim::Write(owners) => Cas::Write(owners),
                    CtxClaim::Conflict(m) => {
                        conflict = Some(m);
                        Cas::Keep
                    }
                }
            })
            .await?;
            if !missing {
                return Ok(match conflict {
                    Some(m) => Err(("ctx.conflict", m)),
                    None => Ok(()),
                });
            }
            fresh = !self.restore_owners(loop_run_id, &hashes).await?;
        }
        Err(kv::conflict(self.mesh().ctx_kv(), &key, kv::RESTORES))
    }

    /// The claims record of this loop run is missing: the first claim of
    /// the run, or a record lost (an operator's purge, a lost bucket).
    /// Only a key `ctx` already holds with another value can be claimed
    /// differently without the record, so only then are the claims folded
    /// from the log ([`noetl_mesh::ctx_owners::restore`], which writes
    /// them back create-only); a key `ctx` held from before the loop has
    /// no owner in the fold, and is claimed as before.
    ///
    /// Returns whether the log holds claims of the run (then a record of
    /// them is there, unless purged again since).
    async fn restore_owners(
        &self,
        loop_run_id: &str,
        hashes: &[(String, String)],
    ) -> Result<bool, MeshError> {
        use noetl_mesh::scope::StateSource;
        let ctx = self.mesh().ctx(self.eid()).await?;
        let keys = ctx_owners::differing(&ctx, hashes);
        if keys.is_empty() {
            return Ok(false);
        }
        // One log read at a time: the iterations that found the record
        // missing together find it written by the first.
        let _one = self.exec.log_reads.acquire().await;
        let key = Keys::owners(self.eid(), loop_run_id);
        if kv::get::<CtxOwners>(self.mesh().ctx_kv(), &key)
            .await?
            .is_some()
        {
            return Ok(true);
        }
        let restored = ctx_owners::restore(self.mesh(), self.eid(), loop_run_id).await?;
        if let Some(owners) = restored.written {
            tracing::warn!(
                execution_id = %self.eid(),
                step = %self.step.step,
                loop_run = %loop_run_id,
                keys = ?keys,
                owners = owners.len(),
                "ctx claims of a parallel loop run were missing: rebuilt from the events"
            );
        }
        Ok(restored.held)
    }

    /// Merge the `set_ctx` patch of task run `task_run_id` into the
    /// execution's `ctx` (compare-and-set) and return the `ctx` now stored,
    /// as users see it, and whether an earlier delivery had applied it.
    /// The task run's id is recorded in the same write, so a redelivered
    /// command (whose patch may render differently, e.g. `ctx.n + 1`) does
    /// not apply it again.
    async fn apply_ctx(
        &self,
        patch: &Map<String, Value>,
        task_run_id: &str,
    ) -> Result<(Value, bool), MeshError> {
        use noetl_mesh::state::{ctx_applied, mark_ctx_applied, user_ctx};
        // A `ctx` lost from KV is written back from the events first.
        let mut again = false;
        let stored =
            noetl_mesh::ctx_record::update(self.mesh(), self.eid(), |current: Option<&Value>| {
                let mut obj = match current {
                    Some(Value::Object(m)) => m.clone(),
                    _ => Map::new(),
                };
                again = ctx_applied(&obj, task_run_id);
                if again {
                    return Cas::Keep; // already applied (redelivery)
                }
                for (k, v) in patch {
                    obj.insert(k.clone(), v.clone());
                }
                mark_ctx_applied(&mut obj, task_run_id);
                Cas::Write(Value::Object(obj))
            })
            .await?;
        let ctx = user_ctx(stored.unwrap_or_else(|| Value::Object(patch.clone())));
        Ok((ctx, again))
    }
}

/// Inside a loop iteration (`in_loop`) of `step`, take the keys of a
/// task's `set_ctx` `patch` that have a declared reducer out of it and fold
/// them into the iteration's `contributions`; return the rest (what goes
/// to `ctx`). The live pipeline and an iteration's checkpoint folded from
/// its events ([`super::checkpoint`]) both fold through it.
pub(super) fn split_patch(
    step: &noetl_core::Step,
    in_loop: bool,
    patch: &Map<String, Value>,
    contributions: &mut Map<String, Value>,
) -> Result<Map<String, Value>, CtxError> {
    let Some(lp) = step.loop_.as_ref().filter(|_| in_loop) else {
        return Ok(patch.clone());
    };
    let reducers = noetl_core::reduce::declared(lp.spec.policy.as_ref())
        .map_err(|e| ("reducer", format!("step {:?}: {e}", step.step)))?;
    let mut rest = Map::new();
    for (k, v) in patch {
        match reducers.iter().find(|(name, _)| name == k) {
            Some((_, op)) => {
                let folded = noetl_core::reduce::fold(*op, k, contributions.get(k), v)
                    .map_err(|e| ("reducer", format!("step {:?}: {e}", step.step)))?;
                contributions.insert(k.clone(), folded);
            }
            None => {
                rest.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(rest)
}
