//! Applying a finished loop's reducers to `ctx`: the aggregates are
//! assembled from the run (`sum` / `min` / `max`, folded as iterations
//! were counted) and from the iterations' claims (`append` / `extend` /
//! `merge`, which grow with the loop), then folded into `ctx` once.

use noetl_core::reduce::{self, ReducerOp};
use noetl_mesh::{
    keys::Keys,
    kv::Cas,
    payloads::Reduced,
    runtime::HandlerError,
    state::{ctx_applied, mark_ctx_applied},
    Mesh, MeshError,
};
use serde_json::Value;

use crate::state::{grows, reducer_error, reducers_of, Claim, LoopRun, RunAt};

/// Largest `ctx` object (JSON bytes) reducers may leave behind: a KV value
/// must fit in one NATS message (1 MiB by default). A loop whose reducer
/// results would make `ctx` larger fails, naming the reducer and key.
pub const MAX_CTX_BYTES: usize = 1_000_000;

/// One reducer's aggregate over the loop: ctx key, operation, value.
type Aggregate = (String, ReducerOp, Value);

/// Every iteration claim of a loop run, by index.
async fn read_claims(mesh: &Mesh, eid: &str, srid: &str) -> Result<Vec<(u64, Claim)>, MeshError> {
    let claims = Keys::claims(eid, srid);
    let found =
        noetl_mesh::kv::values_matching::<Claim>(mesh.loop_kv(), &format!("{claims}.>")).await?;
    let mut out = Vec::with_capacity(found.len());
    for (key, claim) in found {
        // A claim that does not decode is corrupt (dead-lettered naming its
        // key), not a KV outage to retry.
        let claim = claim?;
        if let Some(index) = Keys::claim_index(&claims, &key) {
            out.push((index, claim));
        }
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out)
}

/// The claims read, with those the events give that were not read
/// (by index, in index order): a claim read stands, as the fold of the
/// same events would give it. Also a later run's claims (`read`) over an
/// earlier one's (`rebuilt`).
fn with_rebuilt(read: Vec<(u64, Claim)>, rebuilt: Vec<(u64, Claim)>) -> Vec<(u64, Claim)> {
    let mut by_index: std::collections::BTreeMap<u64, Claim> = rebuilt.into_iter().collect();
    by_index.extend(read);
    by_index.into_iter().collect()
}

/// The claims of several runs, earliest first, as one list by index: a
/// later run's claim over an earlier one's.
fn later_wins(runs: impl IntoIterator<Item = Vec<(u64, Claim)>>) -> Vec<(u64, Claim)> {
    runs.into_iter()
        .fold(Vec::new(), |earlier, later| with_rebuilt(later, earlier))
}

/// Whether `claims` hold a contribution of every successful iteration
/// `run` counted (a loop with growing reducers); else why not, for the
/// retry.
fn contributions_complete(
    run: &LoopRun,
    claims: &[(u64, Claim)],
    growing: bool,
) -> Result<(), String> {
    let read = successes(claims);
    if growing && read < in_claims(run) {
        return Err(format!(
            "{} successful iterations counted whose contributions are in claims, but the claims and the log give {read}: the growing reducers are not folded until every contribution is read",
            in_claims(run)
        ));
    }
    Ok(())
}

/// How many successful iterations of `run` have their growing
/// contributions in claims (its own, and those of the runs it continues
/// that never ended): those of an ended run it continues are in `ctx`.
fn in_claims(run: &LoopRun) -> u64 {
    run.done.saturating_sub(run.carried)
}

/// How many of `claims` are of successful iterations.
fn successes(claims: &[(u64, Claim)]) -> u64 {
    claims.iter().filter(|(_, c)| !c.failed).count() as u64
}

/// Fold the loop run's reducer aggregates into `ctx`, once: the loop run
/// is recorded as applied in the same compare-and-set, so a repeated
/// `finish` changes nothing, and the aggregate lands on the key's current
/// value (a concurrent write to the key is never lost). Returns the
/// aggregates applied (a repeated finish returns the same ones, for its
/// `loop.done`), or the error that fails the step, if a reducer cannot fold
/// or `ctx` would grow past [`MAX_CTX_BYTES`].
pub(crate) async fn apply_reducers(
    mesh: &Mesh,
    at: RunAt<'_>,
    run: &LoopRun,
) -> Result<Result<Vec<Reduced>, Value>, HandlerError> {
    let (eid, step) = (at.eid(), &at.step.step);
    let reducers = reducers_of(at.step);
    // Growing contributions are only in the claims of successful
    // iterations.
    // With those of the runs it continues that never ended: by index, a
    // later run's claim over an earlier one's (an iteration the earlier
    // run had not counted when it was superseded runs again here).
    let claims = if in_claims(run) > 0 && reducers.iter().any(|(_, op)| grows(*op)) {
        let srids: Vec<&str> = (run.claims_of.iter().map(String::as_str))
            .chain([at.srid])
            .collect();
        let mut read = Vec::with_capacity(srids.len());
        for srid in &srids {
            read.push(read_claims(mesh, eid, srid).await?);
        }
        let claims = later_wins(read.clone());
        if successes(&claims) < in_claims(run) {
            // The loop bucket lost some (a purge, or a compaction before a
            // resume that continues a run that never ended): written back
            // from the events, and taken from them here (not read back:
            // the bucket may lose them again meanwhile).
            let rebuilt = crate::rebuild::restore_claims(mesh, at, &srids).await?;
            later_wins(
                read.into_iter()
                    .zip(rebuilt)
                    .map(|(r, b)| with_rebuilt(r, b)),
            )
        } else {
            claims
        }
    } else {
        Vec::new()
    };
    // Reads that came back short (a cluster that has just restarted can
    // answer before it has applied everything) must not finish the loop
    // with contributions missing: retried until they are all read.
    if let Err(short) =
        contributions_complete(run, &claims, reducers.iter().any(|(_, op)| grows(*op)))
    {
        return Err(HandlerError::Mesh(MeshError::Consume {
            consumer: format!("loop run {} of execution {eid} (step {step:?})", at.srid),
            message: short,
        }));
    }
    let aggregates = match aggregates(&reducers, run, &claims, step) {
        Ok(a) if a.is_empty() => return Ok(Ok(Vec::new())),
        Ok(a) => a,
        Err(e) => return Ok(Err(e)),
    };
    let marker = format!("loop:{}", at.srid);
    let mut failure: Option<String> = None;
    noetl_mesh::ctx_record::update(mesh, eid, |cur: Option<&Value>| {
        failure = None;
        match fold_ctx(cur, &aggregates, &marker) {
            CtxFold::Applied => Cas::Keep,
            CtxFold::Write(ctx) => Cas::Write(ctx),
            CtxFold::Fail(why) => {
                failure = Some(why);
                Cas::Keep
            }
        }
    })
    .await?;
    Ok(match failure {
        Some(why) => Err(reducer_error(step, &why)),
        None => Ok(aggregates
            .into_iter()
            .map(|(key, op, value)| Reduced { key, op, value })
            .collect()),
    })
}

/// The loop's aggregates, in the order of its reducers (non-growing ones
/// first, from the run; then growing ones, assembled from the `claims`
/// of successful iterations in index order); the step's error when a
/// growing reducer cannot combine two contributions.
fn aggregates(
    reducers: &[(String, ReducerOp)],
    run: &LoopRun,
    claims: &[(u64, Claim)],
    step: &str,
) -> Result<Vec<Aggregate>, Value> {
    let mut out: Vec<Aggregate> = Vec::new();
    for (k, op) in reducers.iter().filter(|(_, op)| !grows(*op)) {
        if let Some(v) = run.reduced.get(k) {
            out.push((k.clone(), *op, v.clone()));
        }
    }
    for (k, op) in reducers.iter().filter(|(_, op)| grows(*op)) {
        let mut acc: Option<Value> = None;
        for (_, c) in claims.iter().filter(|(_, c)| !c.failed) {
            if let Some(part) = c.reduce.get(k) {
                match reduce::combine(*op, k, acc.as_ref(), part) {
                    Ok(v) => acc = Some(v),
                    Err(e) => return Err(reducer_error(step, &e.to_string())),
                }
            }
        }
        if let Some(acc) = acc {
            out.push((k.clone(), *op, acc));
        }
    }
    Ok(out)
}

/// What folding a loop's aggregates into `ctx` gives.
#[derive(Debug, PartialEq)]
enum CtxFold {
    /// Applied before (a repeated finish): nothing to write.
    Applied,
    /// The new `ctx`, marked as applied.
    Write(Value),
    /// Why it cannot be folded: a reducer cannot combine with the key's
    /// current value, or `ctx` would grow past [`MAX_CTX_BYTES`].
    Fail(String),
}

/// `ctx` (`cur`) with every aggregate folded into its key and the loop run
/// (`marker`) recorded as applied.
fn fold_ctx(cur: Option<&Value>, aggregates: &[Aggregate], marker: &str) -> CtxFold {
    let mut obj = match cur {
        Some(Value::Object(m)) => m.clone(),
        _ => serde_json::Map::new(),
    };
    if ctx_applied(&obj, marker) {
        return CtxFold::Applied;
    }
    for (k, op, acc) in aggregates {
        match reduce::combine(*op, k, obj.get(k), acc) {
            Ok(v) => {
                obj.insert(k.clone(), v);
            }
            Err(e) => return CtxFold::Fail(e.to_string()),
        }
    }
    mark_ctx_applied(&mut obj, marker);
    let size = serde_json::to_vec(&obj).map(|b| b.len()).unwrap_or(0);
    if size > MAX_CTX_BYTES {
        let (k, op, bytes) = aggregates
            .iter()
            .map(|(k, op, _)| {
                (
                    k,
                    op,
                    serde_json::to_vec(&obj[k]).map(|b| b.len()).unwrap_or(0),
                )
            })
            .max_by_key(|(_, _, n)| *n)
            .expect("aggregates is not empty");
        return CtxFold::Fail(format!(
            "reducer `{}` of ctx key `{k}` gives {bytes} bytes, and ctx would be {size} bytes, above the limit of {MAX_CTX_BYTES} (keep large aggregates in step results or storage)",
            op.name()
        ));
    }
    CtxFold::Write(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_claim_read_stands_and_the_events_fill_in_the_ones_lost() {
        let claim = |n: u64| Claim {
            failed: false,
            reduce: json!({"seen": [n]}).as_object().unwrap().clone(),
            handled: Vec::new(),
        };
        let read = vec![(3, claim(30)), (1, claim(10))];
        let rebuilt = vec![(0, claim(0)), (1, claim(1)), (2, claim(2)), (3, claim(3))];
        let all = with_rebuilt(read, rebuilt);
        let seen: Vec<_> = all
            .iter()
            .map(|(i, c)| (*i, c.reduce["seen"][0].clone()))
            .collect();
        assert_eq!(
            seen,
            vec![(0, json!(0)), (1, json!(10)), (2, json!(2)), (3, json!(30))]
        );
    }

    #[test]
    fn of_several_runs_the_latest_claim_of_each_index_stands() {
        let seen = |n: u64| claim(false, json!({"seen": [n]}));
        // The run resumed twice: the first stopped after 0..3, the second
        // ran 2 and 3 again (3 failed there), the third runs 3 and 4.
        let first = vec![(0, seen(0)), (1, seen(1)), (2, seen(2))];
        let second = vec![(2, seen(20)), (3, claim(true, json!({})))];
        let third = vec![(3, seen(300)), (4, seen(400))];
        let all = later_wins([first, second, third]);
        let got: Vec<_> = all
            .iter()
            .map(|(i, c)| (*i, c.failed, c.reduce.get("seen").cloned()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, false, Some(json!([0]))),
                (1, false, Some(json!([1]))),
                (2, false, Some(json!([20]))),
                (3, false, Some(json!([300]))),
                (4, false, Some(json!([400]))),
            ]
        );
        assert_eq!(
            successes(&later_wins([
                vec![(0, seen(0))],
                vec![(0, claim(true, json!({})))]
            ])),
            0
        );
    }

    fn run(reduced: Value, done: u64) -> LoopRun {
        let cmd = noetl_wire::LoopCommand::default();
        let mut r = crate::state::new_run(&cmd, "lp", 3, 3, json!({}));
        r.in_flight.clear();
        r.done = done;
        r.reduced = reduced.as_object().cloned().unwrap_or_default();
        r
    }

    fn claim(failed: bool, reduce: Value) -> Claim {
        Claim {
            failed,
            reduce: reduce.as_object().cloned().unwrap_or_default(),
            handled: Vec::new(),
        }
    }

    #[test]
    fn aggregates_come_from_the_run_and_the_claims_of_successful_iterations() {
        let reducers = vec![
            ("rows".to_string(), ReducerOp::Append),
            ("total".to_string(), ReducerOp::Sum),
        ];
        let claims = vec![
            (0, claim(false, json!({"rows": [1]}))),
            (1, claim(true, json!({"rows": [99]}))),
            (2, claim(false, json!({"rows": [3]}))),
        ];
        let a = aggregates(&reducers, &run(json!({"total": 7}), 2), &claims, "lp").unwrap();
        assert_eq!(
            a,
            vec![
                ("total".to_string(), ReducerOp::Sum, json!(7)),
                ("rows".to_string(), ReducerOp::Append, json!([1, 3])),
            ]
        );
        // No contribution, no aggregate.
        assert!(aggregates(&reducers, &run(json!({}), 0), &[], "lp")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn aggregates_fold_into_ctx_once() {
        let a = vec![("total".to_string(), ReducerOp::Sum, json!(7))];
        let CtxFold::Write(ctx) = fold_ctx(Some(&json!({"total": 1, "x": 2})), &a, "loop:r1")
        else {
            panic!("written")
        };
        assert_eq!((&ctx["total"], &ctx["x"]), (&json!(8), &json!(2)));
        assert_eq!(fold_ctx(Some(&ctx), &a, "loop:r1"), CtxFold::Applied);
        // Another loop run folds again.
        assert!(matches!(
            fold_ctx(Some(&ctx), &a, "loop:r2"),
            CtxFold::Write(_)
        ));
    }

    #[test]
    fn a_ctx_past_its_limit_or_a_bad_fold_fails() {
        let big = "x".repeat(MAX_CTX_BYTES);
        let a = vec![("rows".to_string(), ReducerOp::Append, json!([big]))];
        let CtxFold::Fail(why) = fold_ctx(None, &a, "loop:r1") else {
            panic!("too large")
        };
        assert!(
            why.starts_with("reducer `append` of ctx key `rows` gives"),
            "{why}"
        );
        let a = vec![("total".to_string(), ReducerOp::Sum, json!(1))];
        assert!(matches!(
            fold_ctx(Some(&json!({"total": "many"})), &a, "loop:r1"),
            CtxFold::Fail(_)
        ));
    }

    #[test]
    fn a_loop_is_not_folded_while_its_claims_read_short_of_its_successes() {
        let claims = vec![
            (0, claim(false, json!({"rows": [1]}))),
            (1, claim(true, json!({}))),
            (2, claim(false, json!({"rows": [3]}))),
        ];
        // Two successes counted, two read: complete.
        assert!(contributions_complete(&run(json!({}), 2), &claims, true).is_ok());
        // Three counted, two read (a read that came back short): retried.
        let short = contributions_complete(&run(json!({}), 3), &claims, true).unwrap_err();
        assert!(
            short.contains("3 successful iterations counted") && short.contains("give 2"),
            "{short}"
        );
        // Nothing read at all is short too; a loop without growing
        // reducers reads no claims.
        assert!(contributions_complete(&run(json!({}), 3), &[], true).is_err());
        assert!(contributions_complete(&run(json!({}), 3), &[], false).is_ok());
        // A resumed run: eight successes of the ended run it continues are
        // in ctx already, so its own two claims are all there is to read.
        let resumed = LoopRun {
            carried: 8,
            ..run(json!({}), 10)
        };
        assert!(contributions_complete(&resumed, &claims, true).is_ok());
        assert!(contributions_complete(&resumed, &claims[..1], true).is_err());
    }
}
