//! `noetl exec start FILE|PATH`, `noetl exec status ID` and
//! `noetl exec cancel ID`.

use crate::commands::exit::Exit;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use noetl_mesh::{
    codec,
    ids::new_execution_id,
    state::{shown_status, ExecStatus},
};
use noetl_wire::ExecutionRequest;

use super::common::{exit_code, print_summary, MeshArgs, WorkloadArgs};
use super::exec_shared::{
    exists_already, no_execution, print_started, publish_request, status_name,
};
use super::retry::ride_out;

/// `noetl exec ...`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Start an execution and print its id.
    Start(StartArgs),
    /// Print an execution's status, `ctx` and steps.
    Status(StatusArgs),
    /// Cancel a running execution and its child executions.
    Cancel(CancelArgs),
    /// Recent executions: status, playbook, start, end, duration.
    List(ListArgs),
    /// One execution as a tree: steps, their runs, loop counts, tasks with
    /// attempts and durations.
    Show(super::exec_show::ShowArgs),
    /// What each open token of a running execution waits for, in words.
    Why(super::why::WhyArgs),
    /// Start a new execution of the same playbook with the same workload.
    Retry(super::exec_retry::RetryArgs),
    /// Go on with a failed or cancelled execution where it stopped.
    Resume(super::exec_resume::ResumeArgs),
    /// Hold new steps and loop iterations (what runs finishes).
    Pause(super::exec_pause::PauseArgs),
    /// Go on after a pause: release what it held.
    Unpause(super::exec_pause::UnpauseArgs),
    /// Send a signal to the `wait` task waiting for it.
    Signal(super::exec_pause::SignalArgs),
    /// Fold the execution's events into the records they determine and
    /// compare them with the stored ones (`--until`: the state as of an
    /// event).
    Replay(super::exec_replay::ReplayArgs),
}

/// Arguments of `noetl exec list`.
#[derive(clap::Args)]
pub struct ListArgs {
    /// Only executions in this state (`running` includes the paused and
    /// the queued ones, which are running executions held back).
    #[arg(long, value_parser = ["running", "paused", "queued", "completed", "failed", "cancelled"])]
    pub status: Option<String>,
    /// The most recent this many.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments of `noetl exec cancel`.
#[derive(clap::Args)]
pub struct CancelArgs {
    /// Execution id.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// Why (recorded as the execution's error: `cancelled: <reason>`).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Wait until the router has recorded the cancellation (or the
    /// execution had already ended); give up after 30 s.
    #[arg(long)]
    pub wait: bool,
    /// Print `{"execution_id", "requested", "status"}`: whether a
    /// cancellation was requested, and the status last read.
    #[arg(long)]
    pub json: bool,
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
    /// Rewrite a legacy NoETL playbook file with the `noetl migrate`
    /// rewrite in memory first, printing its changes on stderr
    /// (docs/migrate.md, docs/noetl-compat.md).
    #[arg(long)]
    pub migrate: bool,
    /// Execution id to use (idempotent: the same id starts one execution).
    #[arg(long, value_parser = super::exec_shared::execution_id)]
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
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// Wait until the execution has ended.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this many seconds (exit 4).
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
        Command::List(a) => list(a).await,
        Command::Show(a) => super::exec_show::run(a).await,
        Command::Why(a) => super::why::run(a).await,
        Command::Retry(a) => super::exec_retry::run(a).await,
        Command::Resume(a) => super::exec_resume::run(a).await,
        Command::Pause(a) => super::exec_pause::pause(a).await,
        Command::Unpause(a) => super::exec_pause::unpause(a).await,
        Command::Signal(a) => super::exec_pause::signal(a).await,
        Command::Replay(a) => super::exec_replay::run(a).await,
    }
}

async fn cancel(a: CancelArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let budget = Instant::now() + super::retry::DEFAULT_BUDGET;
    let header = ride_out(budget, "reading the execution", || async {
        Ok(mesh.header_or_running(&a.id).await?)
    })
    .await?;
    let Some(header) = header else {
        return Ok(no_execution(&mesh, &a.id).await);
    };
    let said = |requested: bool, status: ExecStatus, text: String| {
        if a.json {
            println!(
                "{}",
                serde_json::json!({
                    "execution_id": a.id,
                    "requested": requested,
                    "status": status_name(status),
                })
            );
        } else {
            println!("{text}");
        }
    };
    if header.status != ExecStatus::Running {
        let text = format!("execution {} already ended ({:?})", a.id, header.status);
        said(false, header.status, text);
        return Ok(ExitCode::SUCCESS);
    }
    ride_out(budget, "requesting the cancellation", || async {
        Ok(mesh.request_cancel(&a.id, &a.reason).await?)
    })
    .await?;
    if a.mesh.local {
        // The store is free only while no `noetl run` serves it: the
        // request waits for the next one, which acts on it as it starts.
        let text = format!(
            "cancellation of {} requested: no services run on the local store now; the next `noetl run` on it cancels the execution",
            a.id
        );
        said(true, ExecStatus::Running, text);
        return Ok(ExitCode::SUCCESS);
    }
    if !a.wait {
        let text = format!("cancellation of {} requested", a.id);
        said(true, ExecStatus::Running, text);
        return Ok(ExitCode::SUCCESS);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match mesh.header_or_running(&a.id).await? {
            Some(h) if h.status != ExecStatus::Running => {
                said(true, h.status, format!("execution {} {:?}", a.id, h.status));
                return Ok(ExitCode::SUCCESS);
            }
            _ if Instant::now() > deadline => {
                eprintln!(
                    "error: no router recorded the cancellation of {} within 30 s",
                    a.id
                );
                return Ok(Exit::Timeout.into());
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn start(a: StartArgs) -> anyhow::Result<ExitCode> {
    let mut req = ExecutionRequest {
        execution_id: a.id.clone().unwrap_or_else(new_execution_id),
        workload_json: codec::json_bytes(&a.workload.build()?),
        ..Default::default()
    };
    let path = Path::new(&a.playbook);
    if path.is_file() {
        let read = super::source::read(super::source::Read {
            path,
            migrate: a.migrate,
            warnings: false,
        });
        match read {
            Ok(s) => req.playbook_yaml = s.text,
            Err(_) => return Ok(Exit::Usage.into()),
        }
        req.source_name = a.playbook.clone();
    } else if a.migrate {
        return Ok(super::run::migrate_needs_a_file(&a.playbook));
    } else {
        req.path = a.playbook.clone();
        req.version = a.version.unwrap_or(0);
    }
    let mesh = a.mesh.attach().await?;
    if a.id.is_some() && exists_already(&mesh, &req.execution_id).await? {
        print_started(&req.execution_id, a.json);
        return Ok(ExitCode::SUCCESS);
    }
    publish_request(&mesh, &req).await?;
    print_started(&req.execution_id, a.json);
    Ok(ExitCode::SUCCESS)
}

async fn status(a: StatusArgs) -> anyhow::Result<ExitCode> {
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    // A failover (a node dying, a stream electing a leader) is ridden out
    // until the deadline (docs/reliability.md, "Clients").
    let budget = if a.wait {
        deadline
    } else {
        Instant::now() + super::retry::DEFAULT_BUDGET
    };
    let mesh = a.mesh.attach_until(budget).await?;
    // A just-started execution may not have its header yet: with --wait,
    // waiting for it to appear is part of waiting.
    loop {
        let header = ride_out(budget, "reading the execution", || async {
            Ok(mesh.header_or_running(&a.id).await?)
        })
        .await?;
        let done = matches!(&header, Some(h) if h.status != ExecStatus::Running);
        if done || !a.wait {
            if header.is_none() {
                return Ok(no_execution(&mesh, &a.id).await);
            }
            break;
        }
        if Instant::now() > deadline {
            eprintln!(
                "error: execution {} still running after {} s",
                a.id, a.timeout
            );
            return Ok(Exit::Timeout.into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let summary = ride_out(
        budget.max(Instant::now() + Duration::from_secs(10)),
        "reading the execution",
        || async { Ok(mesh.exec_summary(&a.id).await?) },
    )
    .await?;
    let Some(summary) = summary else {
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

/// One line of `noetl exec list`.
#[derive(serde::Serialize)]
struct Listed {
    execution_id: String,
    status: String,
    playbook: String,
    started_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Whether an execution shown as `shown` is one `--status want` lists:
/// `running` includes the paused and queued (running executions held
/// back); any other state only itself.
fn status_matches(want: &str, shown: &str) -> bool {
    want == shown || (want == "running" && matches!(shown, "paused" | "queued"))
}

/// Milliseconds between two RFC 3339 times.
fn millis_between(from: &str, to: &str) -> Option<i64> {
    let parse = |t: &str| async_nats::datetime::parse_rfc3339(t).ok();
    let (a, b) = (parse(from)?, parse(to)?);
    Some(((b - a).whole_milliseconds()) as i64)
}

async fn list(a: ListArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let mut rows = Vec::new();
    let budget = Instant::now() + super::retry::DEFAULT_BUDGET;
    let executions = ride_out(budget, "listing executions", || async {
        Ok(mesh.listed_executions().await?)
    })
    .await?;
    // What holds running executions back, as `exec why` says: one read each.
    let (paused, queued) = ride_out(budget, "reading pauses and queues", || async {
        Ok((
            mesh.paused_executions().await?,
            mesh.queued_executions().await?,
        ))
    })
    .await?;
    for (key, header) in executions {
        match header {
            Ok(h) => rows.push(Listed {
                status: shown_status(
                    h.status,
                    paused.contains(&h.execution_id),
                    queued.contains(&h.execution_id),
                )
                .into(),
                duration_ms: h
                    .ended_at
                    .as_deref()
                    .and_then(|end| millis_between(&h.started_at, end)),
                execution_id: h.execution_id,
                playbook: h.playbook,
                started_at: h.started_at,
                ended_at: h.ended_at,
                error: h.error,
            }),
            Err(e) => eprintln!("warning: execution {key}: {e}"),
        }
    }
    if let Some(want) = &a.status {
        rows.retain(|r| status_matches(want, &r.status));
    }
    // Newest first (RFC 3339 times in UTC sort as text).
    rows.sort_by(|x, y| y.started_at.cmp(&x.started_at));
    rows.truncate(a.limit);
    if a.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<34}  {:<9}  {:<24}  {:<24}  {:>10}",
        "EXECUTION", "STATUS", "PLAYBOOK", "STARTED", "DURATION"
    );
    for r in &rows {
        let duration = r
            .duration_ms
            .map(|d| format!("{:.3} s", d as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<34}  {:<9}  {:<24}  {:<24}  {:>10}",
            r.execution_id, r.status, r.playbook, r.started_at, duration
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_running_lists_the_paused_and_queued_and_each_state_lists_itself() {
        for shown in ["running", "paused", "queued"] {
            assert!(status_matches("running", shown), "{shown}");
        }
        assert!(!status_matches("running", "completed"));
        assert!(status_matches("paused", "paused"));
        assert!(!status_matches("paused", "running"));
        assert!(!status_matches("queued", "paused"));
        assert!(status_matches("failed", "failed"));
    }
}
