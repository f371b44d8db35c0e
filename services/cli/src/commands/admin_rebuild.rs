//! `noetl admin rebuild`: write an execution's records (header, plan, step
//! records, results kept by name, `ctx`, waiters, the pause, and of a
//! running execution its open loop runs and their iterations'
//! checkpoints) back from its events, for one execution or every one its
//! events say is running (docs/operations.md "Rebuild").

use std::collections::BTreeSet;
use std::process::ExitCode;

use anyhow::Context;
use noetl_executor::CheckpointRebuilt;
use noetl_mesh::rebuild::{self, Mode, Rebuilt};
use noetl_mesh::Mesh;
use noetl_wire::TaskCommand;
use serde::Serialize;

use super::common::MeshArgs;

/// Arguments of `noetl admin rebuild`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["execution", "running"])))]
pub struct RebuildArgs {
    /// This execution.
    #[arg(long, value_parser = super::exec_shared::execution_id)]
    pub execution: Option<String>,
    /// Every execution its events say is running.
    #[arg(long)]
    pub running: bool,
    /// Write every record over what is stored; without it only missing
    /// records are written.
    #[arg(long)]
    pub force: bool,
    /// One JSON object per execution.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// `noetl admin rebuild`.
pub async fn run(a: RebuildArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let mode = if a.force { Mode::All } else { Mode::Missing };
    let ids = match a.execution.clone() {
        Some(id) => vec![id],
        None => rebuild::running(&mesh).await?,
    };
    if a.running && ids.is_empty() && !a.json {
        println!("no execution is running according to its events");
    }
    for id in ids {
        // The log is read a chunk at a time by each part, never held.
        match rebuild::rebuild(&mesh, &id, mode).await? {
            None => return Ok(super::exec_shared::no_execution(&mesh, &id).await),
            Some(rebuilt) => {
                let mut report = Report {
                    rebuilt,
                    loop_runs: 0,
                    checkpoints: 0,
                };
                if report.rebuilt.running {
                    loops(&mesh, &id, &mut report).await?;
                }
                print(&report, a.json)
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `noetl admin rebuild` wrote of one execution.
#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    rebuilt: Rebuilt,
    /// Open loop runs written back (with their iterations' claims).
    loop_runs: usize,
    /// Checkpoints of iterations in flight written back.
    checkpoints: usize,
}

/// Write back what a running execution's open loop runs lost: each run's
/// record (the loop-supervisor's fold), then the checkpoint of each of its
/// iterations in flight (the executor's fold, from the iteration's first
/// command, over the events of those iterations alone). Create-only,
/// whatever the mode: the services move both on.
async fn loops(mesh: &Mesh, eid: &str, r: &mut Report) -> anyhow::Result<()> {
    let plan = match mesh.plans().get(mesh, eid).await {
        Ok(plan) => plan,
        Err(e) => {
            r.rebuilt
                .notes
                .push(format!("loop runs not rebuilt: no plan of {eid}: {e}"));
            return Ok(());
        }
    };
    let open = noetl_loop_supervisor::admin::rebuild_open_runs(mesh, &plan)
        .await
        .with_context(|| format!("loop runs of {eid}"))?;
    for run in open {
        r.loop_runs += usize::from(run.written);
        r.rebuilt.notes.extend(run.notes);
        let Some(step) = plan.step(&run.step) else {
            continue;
        };
        let index_of = |cmd: &TaskCommand| cmd.iteration.as_ref().map_or(0, |it| it.index);
        let indices: BTreeSet<u64> = run.in_flight.iter().map(index_of).collect();
        let log = noetl_executor::checkpoints_log(mesh, &plan, step, &run.step_run_id, &indices)
            .await
            .with_context(|| format!("the events of loop run {}", run.step_run_id))?;
        for cmd in &run.in_flight {
            let index = index_of(cmd);
            let rebuilt = noetl_executor::rebuild_checkpoint(mesh, &plan, step, cmd, &log)
                .await
                .with_context(|| {
                    format!(
                        "the checkpoint of iteration {index} of loop run {}",
                        run.step_run_id
                    )
                })?;
            match rebuilt {
                CheckpointRebuilt::Written => r.checkpoints += 1,
                CheckpointRebuilt::NotFolded(why) => r.rebuilt.notes.push(format!(
                    "the checkpoint of iteration {index} of loop run {} (step {:?}) is not rebuilt: {why}",
                    run.step_run_id, run.step
                )),
                CheckpointRebuilt::Present | CheckpointRebuilt::NotOwed => {}
            }
        }
    }
    Ok(())
}

fn print(report: &Report, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string(report).expect("a report serialises")
        );
        return;
    }
    let r = &report.rebuilt;
    let mut wrote = Vec::new();
    if r.header {
        wrote.push("header".to_string());
    }
    if r.plan {
        wrote.push("plan".to_string());
    }
    if r.steps > 0 {
        wrote.push(format!("{} step record(s)", r.steps));
    }
    if r.results > 0 {
        wrote.push(format!("{} step result(s)", r.results));
    }
    if r.ctx {
        wrote.push("ctx".to_string());
    }
    if r.waiters > 0 {
        wrote.push(format!("{} waiter(s)", r.waiters));
    }
    if r.paused {
        wrote.push("the pause".to_string());
    }
    if r.owners > 0 {
        wrote.push(format!(
            "the ctx claims of {} parallel loop run(s)",
            r.owners
        ));
    }
    if report.loop_runs > 0 {
        wrote.push(format!("{} loop run(s)", report.loop_runs));
    }
    if report.checkpoints > 0 {
        wrote.push(format!("{} iteration checkpoint(s)", report.checkpoints));
    }
    let wrote = if wrote.is_empty() {
        "nothing was missing".to_string()
    } else {
        format!("wrote {}", wrote.join(", "))
    };
    println!("{}: {} events folded; {wrote}", r.execution_id, r.events);
    for n in &r.notes {
        println!("  note: {n}");
    }
}
