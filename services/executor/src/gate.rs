//! A step's concurrency and rate limits (`spec.policy.concurrency`,
//! `spec.policy.rate`; docs/operations.md, "Concurrency and rate limits"),
//! checked before a task command runs: a slot of the key's concurrency
//! record (a lease in the name of the command, renewed while it runs and
//! released when it ends), then a token of its rate. A command that must
//! wait is handed back to JetStream with the delay (no slot of this
//! replica is held meanwhile) and asks again with the same id, so it keeps
//! its place in line or its reserved token; only a token due within
//! 300 ms is waited for in the handler, so calls start on time.

use std::future::Future;
use std::time::Duration;

use noetl_core::concurrency::{default_step_key, render_key};
use noetl_core::template::Scope;
use noetl_core::Step;
use noetl_mesh::gate::{self, Ask, Owner, RateAsk, Verdict};
use noetl_mesh::{events::now_ms, gates, keys::Keys, plan::PlanRecord, Mesh, MeshError};
use noetl_wire::TaskCommand;

/// What the gates said about a command.
pub(crate) enum Admission {
    /// Run it (holding this slot, if the step has a concurrency limit).
    Go(Option<Held>),
    /// Ask again after this long.
    Wait(Duration),
    /// A key template does not render: the step-run fails with this.
    Broken(String),
}

/// A slot held while a command runs.
pub(crate) struct Held {
    kv_key: String,
    key: String,
    id: String,
    owner: Owner,
    limit: u32,
}

/// What [`enter`] needs.
pub(crate) struct Entering<'a> {
    pub mesh: &'a Mesh,
    pub plan: &'a PlanRecord,
    pub step: &'a Step,
    pub cmd: &'a TaskCommand,
    /// The scope of the task the command runs first.
    pub scope: &'a Scope,
}

/// Ask the step's concurrency key for a slot, then its rate for a token.
/// A command waiting for a token keeps its slot (its lease runs out if it
/// does not come back).
pub(crate) async fn enter(e: Entering<'_>) -> Result<Admission, MeshError> {
    let Some(policy) = e.step.spec.policy.as_ref() else {
        return Ok(Admission::Go(None));
    };
    let default = || default_step_key(&e.plan.playbook, e.step);
    let owner = Owner {
        execution_id: e.cmd.execution_id.clone(),
        step: e.step.step.clone(),
        step_run_id: e.cmd.step_run_id.clone(),
    };
    let id = e.cmd.command_id.as_str();
    let store = e.mesh.gates_kv();
    let mut held = None;
    if let Some(c) = &policy.concurrency {
        let key = match render_key(c.key.as_deref(), default, e.scope) {
            Ok(k) => k,
            Err(err) => return Ok(broken("concurrency", &err)),
        };
        let kv_key = Keys::gate_task(&key);
        let d = gates::acquire(
            store,
            &kv_key,
            &Ask {
                key: &key,
                id,
                owner: &owner,
                limit: c.limit,
                now_ms: now_ms(),
                lease_ms: gate::TASK_LEASE_MS,
                wait_ttl_ms: gate::WAIT_TTL_MS,
                queue: true,
                gone: &[],
            },
        )
        .await?;
        if let Some(wait) = wait_of(&d.verdict) {
            tracing::debug!(execution_id = %owner.execution_id, step = %owner.step, %key, ?wait, "task waits for a concurrency slot");
            return Ok(Admission::Wait(wait));
        }
        held = Some(Held {
            kv_key,
            key,
            id: id.to_string(),
            owner: owner.clone(),
            limit: c.limit,
        });
    }
    if let Some(r) = &policy.rate {
        let key = match render_key(r.key.as_deref(), default, e.scope) {
            Ok(k) => k,
            Err(err) => return Ok(broken("rate", &err)),
        };
        let kv_key = Keys::gate_rate(&key);
        for _ in 0..RATE_TRIES {
            let ask = RateAsk {
                key: &key,
                id,
                owner: &owner,
                per_second: r.per_second,
                burst: r.burst,
                now_ms: now_ms(),
                wait_ttl_ms: gate::WAIT_TTL_MS,
            };
            match wait_of(&gates::take(store, &kv_key, &ask).await?) {
                None => return Ok(Admission::Go(held)),
                // A token due soon is waited for here, so calls start on
                // time (a redelivery comes a few ms late); a later one is
                // waited for in the queue, coming back a little early.
                Some(wait) if wait <= RATE_SLEEP => tokio::time::sleep(wait).await,
                Some(wait) => {
                    tracing::debug!(execution_id = %owner.execution_id, step = %owner.step, %key, ?wait, "task waits for a rate token");
                    return Ok(Admission::Wait(wait - RATE_EARLY));
                }
            }
        }
        return Ok(Admission::Wait(RATE_EARLY));
    }
    Ok(Admission::Go(held))
}

/// A rate token due within this is waited for in the handler.
const RATE_SLEEP: Duration = Duration::from_millis(300);
/// How much earlier than its token a command waiting in the queue comes
/// back (then waits the rest in the handler).
const RATE_EARLY: Duration = Duration::from_millis(200);
/// Asks for a token in one handling before going back to the queue.
const RATE_TRIES: usize = 4;

fn broken(what: &str, err: &noetl_core::template::TemplateError) -> Admission {
    Admission::Broken(format!("`spec.policy.{what}.key` does not render: {err}"))
}

fn wait_of(v: &Verdict) -> Option<Duration> {
    match v {
        Verdict::Acquired => None,
        Verdict::Wait { retry_after_ms, .. } => {
            Some(Duration::from_millis((*retry_after_ms).max(1)))
        }
        // Task calls always queue.
        Verdict::Rejected { .. } => Some(Duration::from_millis(gate::MAX_RETRY_MS)),
    }
}

/// Run `work` holding `held`: its lease is renewed every third of its
/// length while the work runs, and released when it ends (a release that
/// fails leaves the lease to expire).
pub(crate) async fn hold<T>(mesh: &Mesh, h: Held, work: impl Future<Output = T>) -> T {
    let period = Duration::from_millis(gate::TASK_LEASE_MS / 3);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tokio::pin!(work);
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            _ = tick.tick() => {
                let lease = gate::Lease {
                    key: &h.key,
                    id: &h.id,
                    owner: &h.owner,
                    limit: h.limit,
                    lease_ms: gate::TASK_LEASE_MS,
                };
                match gates::renew(mesh.gates_kv(), &h.kv_key, &lease, now_ms()).await {
                    Ok(false) => {}
                    Ok(true) => tracing::warn!(gate = %h.kv_key, command_id = %h.id,
                        execution_id = %h.owner.execution_id, step = %h.owner.step,
                        "concurrency lease was lost (expired, or its record purged): claimed again, the task runs"),
                    Err(e) => tracing::warn!(gate = %h.kv_key, error = %e, "concurrency lease not renewed"),
                }
            }
        }
    };
    if let Err(e) = gates::release(mesh.gates_kv(), &h.kv_key, &h.id, now_ms(), &[]).await {
        tracing::warn!(gate = %h.kv_key, error = %e, "concurrency lease not released; it expires");
    }
    out
}
