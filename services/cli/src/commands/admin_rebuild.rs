//! `noetl admin rebuild`: write an execution's records (header, plan, step
//! records, results kept by name, `ctx`, waiters, the pause) back from its
//! events, for one execution or every one
//! its events say is running (docs/operations.md "Rebuild").

use std::process::ExitCode;

use noetl_mesh::rebuild::{self, Mode, Rebuilt};

use super::common::MeshArgs;
use super::exit::Exit;

/// Arguments of `noetl admin rebuild`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["execution", "running"])))]
pub struct RebuildArgs {
    /// This execution.
    #[arg(long)]
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
    if let Some(id) = a.execution.as_deref() {
        if !noetl_mesh::ids::is_valid_execution_id(id) {
            eprintln!("error: --execution {id:?}: use 1-128 characters of [A-Za-z0-9_-]");
            return Ok(Exit::Usage.into());
        }
    }
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
        match rebuild::rebuild(&mesh, &id, mode).await? {
            None => return Ok(super::exec_shared::no_execution(&mesh, &id)),
            Some(r) => print(&r, a.json),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print(r: &Rebuilt, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).expect("a report serialises"));
        return;
    }
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
