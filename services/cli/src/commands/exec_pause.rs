//! `noetl exec pause ID` and `noetl exec unpause ID`: hold new steps and
//! iterations of a running execution (what is in flight finishes), and go
//! on; `noetl exec signal ID NAME`: continue a `wait` task
//! (docs/operations.md, "Pause and unpause", "Waiting for a signal").

use std::process::ExitCode;
use std::time::Instant;

use noetl_mesh::state::ExecStatus;

use super::common::MeshArgs;
use super::exec_shared::{local_user, no_execution, status_name};
use super::retry::{ride_out, DEFAULT_BUDGET};

/// Arguments of `noetl exec pause`.
#[derive(clap::Args)]
pub struct PauseArgs {
    /// Execution id.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// Why (recorded in the pause and its `execution.paused` event).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Print `{"execution_id", "paused", "changed"}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments of `noetl exec unpause`.
#[derive(clap::Args)]
pub struct UnpauseArgs {
    /// Execution id.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// Print `{"execution_id", "paused", "released"}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// `noetl exec pause`.
pub async fn pause(a: PauseArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let budget = Instant::now() + DEFAULT_BUDGET;
    let Some(header) = mesh.header_or_running(&a.id).await? else {
        return Ok(no_execution(&mesh, &a.id).await);
    };
    if header.status != ExecStatus::Running {
        eprintln!(
            "error: execution {} has ended ({}): there is nothing to pause",
            a.id,
            status_name(header.status)
        );
        return Ok(super::exit::Exit::Usage.into());
    }
    let by = local_user();
    let changed = ride_out(budget, "pausing the execution", || async {
        Ok(mesh.pause(&a.id, &by, &a.reason).await?)
    })
    .await?;
    if a.json {
        let out = serde_json::json!({"execution_id": a.id, "paused": true, "changed": changed});
        println!("{out}");
    } else if changed {
        println!(
            "execution {} paused: no new step or iteration starts; what runs finishes",
            a.id
        );
    } else {
        println!("execution {} was paused already", a.id);
    }
    Ok(ExitCode::SUCCESS)
}

/// `noetl exec unpause`.
pub async fn unpause(a: UnpauseArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let budget = Instant::now() + DEFAULT_BUDGET;
    if mesh.header_or_running(&a.id).await?.is_none() {
        return Ok(no_execution(&mesh, &a.id).await);
    }
    let by = local_user();
    let released = ride_out(budget, "unpausing the execution", || async {
        Ok(mesh.unpause(&a.id, &by).await?)
    })
    .await?;
    if a.json {
        let out = serde_json::json!({"execution_id": a.id, "paused": false, "released": released});
        println!("{out}");
    } else {
        println!(
            "execution {} unpaused; {released} held message(s) released",
            a.id
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `noetl exec signal`.
#[derive(clap::Args)]
pub struct SignalArgs {
    /// Execution id.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// The signal a `wait` task waits for (1-128 characters of
    /// [A-Za-z0-9_-]).
    #[arg(value_parser = super::exec_shared::signal_name)]
    pub name: String,
    /// The data (JSON), the `wait` task's result; `{}` without it.
    #[arg(long, default_value = "{}")]
    pub data: String,
    /// Print `{"execution_id", "signal", "step", "task"}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// `noetl exec signal`.
pub async fn signal(a: SignalArgs) -> anyhow::Result<ExitCode> {
    use noetl_mesh::signal::SignalError;
    let data: serde_json::Value = match serde_json::from_str(&a.data) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: --data is not JSON: {e}");
            return Ok(super::exit::Exit::Usage.into());
        }
    };
    let mesh = a.mesh.attach().await?;
    if mesh.header_or_running(&a.id).await?.is_none() {
        return Ok(no_execution(&mesh, &a.id).await);
    }
    match mesh.signal(&a.id, &a.name, data, &local_user()).await {
        Ok(w) => {
            if a.json {
                let out = serde_json::json!({
                    "execution_id": a.id, "signal": a.name, "step": w.step, "task": w.task,
                });
                println!("{out}");
            } else {
                println!(
                    "signal `{}` delivered: step `{}` goes on after task `{}`",
                    a.name, w.step, w.task
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ SignalError::NoWaiter { .. }) => {
            eprintln!("error: {e}");
            Ok(super::exit::Exit::NotFound.into())
        }
        Err(e @ (SignalError::Invalid { .. } | SignalError::BadName { .. })) => {
            eprintln!("error: {e}");
            Ok(super::exit::Exit::Usage.into())
        }
        Err(SignalError::Mesh(e)) => Err(e.into()),
    }
}
