//! `noetl exec start FILE|PATH`, `noetl exec status ID` and
//! `noetl exec cancel ID`.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use noetl_mesh::{codec, connect::display_urls, ids::new_execution_id, state::ExecStatus};
use noetl_wire::ExecutionRequest;

use super::common::{exit_code, print_summary, MeshArgs, WorkloadArgs};

/// `noetl exec ...`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Start an execution and print its id.
    Start(StartArgs),
    /// Print an execution's status, `ctx` and steps.
    Status(StatusArgs),
    /// Cancel a running execution and its child executions.
    Cancel(CancelArgs),
}

/// Arguments of `noetl exec cancel`.
#[derive(clap::Args)]
pub struct CancelArgs {
    /// Execution id.
    pub id: String,
    /// Why (recorded as the execution's error: `cancelled: <reason>`).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Wait until the router has recorded the cancellation (or the
    /// execution had already ended); give up after 30 s.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments of `noetl exec start`.
#[derive(clap::Args)]
pub struct StartArgs {
    /// A playbook file (sent inline) or a catalog path.
    pub playbook: String,
    /// With a catalog path: start this version instead of the latest.
    #[arg(long)]
    pub version: Option<u32>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Execution id to use (idempotent: the same id starts one execution).
    #[arg(long)]
    pub id: Option<String>,
    /// Print `{"execution_id": ...}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments of `noetl exec status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Execution id.
    pub id: String,
    /// Wait until the execution has ended.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this many seconds (exit 2).
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// Print the JSON summary (as `noetl run --json`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Dispatch.
pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Start(a) => start(a).await,
        Command::Status(a) => status(a).await,
        Command::Cancel(a) => cancel(a).await,
    }
}

async fn cancel(a: CancelArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let Some(header) = mesh.exec_header(&a.id).await? else {
        eprintln!(
            "error: no execution {:?} at {}",
            a.id,
            display_urls(&mesh.config().nats_url)
        );
        return Ok(ExitCode::from(2));
    };
    if header.status != ExecStatus::Running {
        println!("execution {} already ended ({:?})", a.id, header.status);
        return Ok(ExitCode::SUCCESS);
    }
    mesh.request_cancel(&a.id, &a.reason).await?;
    if a.wait {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match mesh.exec_header(&a.id).await? {
                Some(h) if h.status != ExecStatus::Running => {
                    println!("execution {} {:?}", a.id, h.status);
                    break;
                }
                _ if Instant::now() > deadline => {
                    eprintln!(
                        "error: no router recorded the cancellation of {} within 30 s",
                        a.id
                    );
                    return Ok(ExitCode::from(2));
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    } else {
        println!("cancellation of {} requested", a.id);
    }
    Ok(ExitCode::SUCCESS)
}

async fn start(a: StartArgs) -> anyhow::Result<ExitCode> {
    let mut req = ExecutionRequest {
        execution_id: a.id.clone().unwrap_or_else(new_execution_id),
        workload_json: codec::json_bytes(&a.workload.build()?),
        ..Default::default()
    };
    if !noetl_mesh::ids::is_valid_execution_id(&req.execution_id) {
        bail!(
            "--id {:?}: use 1-128 characters of [A-Za-z0-9_-]",
            req.execution_id
        );
    }
    let path = Path::new(&a.playbook);
    if path.is_file() {
        if let Err(e) = noetl_core::load::load_file(path) {
            eprintln!("{}", e.render_human());
            return Ok(ExitCode::from(1));
        }
        req.playbook_yaml = std::fs::read_to_string(path)?;
        req.source_name = a.playbook.clone();
    } else {
        req.path = a.playbook.clone();
        req.version = a.version.unwrap_or(0);
    }
    let mesh = a.mesh.attach().await?;
    mesh.publish(
        mesh.subjects().exec_request(),
        &req.execution_id,
        codec::encode(&req),
    )
    .await?
    .wait()
    .await?;
    if a.json {
        println!("{}", serde_json::json!({"execution_id": req.execution_id}));
    } else {
        println!("{}", req.execution_id);
    }
    Ok(ExitCode::SUCCESS)
}

async fn status(a: StatusArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    // A just-started execution may not have its header yet: with --wait,
    // waiting for it to appear is part of waiting.
    loop {
        let header = mesh.exec_header(&a.id).await?;
        let done = matches!(&header, Some(h) if h.status != ExecStatus::Running);
        if done || !a.wait {
            if header.is_none() {
                eprintln!(
                    "error: no execution {:?} at {}",
                    a.id,
                    display_urls(&mesh.config().nats_url)
                );
                return Ok(ExitCode::from(2));
            }
            break;
        }
        if Instant::now() > deadline {
            eprintln!(
                "error: execution {} still running after {} s",
                a.id, a.timeout
            );
            return Ok(ExitCode::from(2));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(summary) = mesh.exec_summary(&a.id).await? else {
        bail!("execution {} vanished", a.id);
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(if summary.status == ExecStatus::Running {
        ExitCode::SUCCESS
    } else {
        exit_code(summary.status)
    })
}
