//! `noetl exec resume ID [--from STEP] [--set k=v] [--playbook-version N]`:
//! a failed or cancelled execution goes on where it stopped, under the same
//! id and trace (docs/operations.md, "Resume"). What it would do is checked
//! first ([`noetl_mesh::Mesh::resume`]), so a refusal is a clear error;
//! the router carries it out.

use std::process::ExitCode;
use std::time::Duration;

use noetl_mesh::resume::{ResumeError, ResumeRequested};

use super::common::{MeshArgs, WorkloadArgs};
use super::exec_shared::{local_user, no_execution};
use super::exit::Exit;

/// Arguments of `noetl exec resume`.
#[derive(clap::Args)]
pub struct ResumeArgs {
    /// The failed or cancelled execution.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// Restart at this step instead (it and the steps after it that ran
    /// are superseded).
    #[arg(long, value_name = "STEP")]
    pub from: Option<String>,
    /// Resume under this catalog version of the playbook (refused when a
    /// step still to run is not in it).
    #[arg(long, value_name = "N")]
    pub playbook_version: Option<u32>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Print `{"execution_id", "resumes", "steps", "superseded"}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// How long the router gets to record the resume.
const RECORDED_WITHIN: Duration = Duration::from_secs(30);

/// `noetl exec resume`.
pub async fn run(a: ResumeArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let set = match a.workload.build()? {
        serde_json::Value::Object(m) => m,
        _ => Default::default(),
    };
    let req = ResumeRequested {
        expect_resumes: 0, // set from the header `resume` reads
        from: a.from.clone(),
        set,
        playbook_version: a.playbook_version,
        by: local_user(),
    };
    let prepared = match mesh.resume(&a.id, req, RECORDED_WITHIN).await {
        Ok(p) => p,
        Err(ResumeError::Mesh(e)) => return Err(e.into()),
        Err(ResumeError::NotFound(_)) => return Ok(no_execution(&mesh, &a.id).await),
        Err(why) => {
            eprintln!("error: {why}");
            let exit = match why {
                ResumeError::NotRecorded { .. } => Exit::Timeout,
                _ => Exit::Usage,
            };
            return Ok(exit.into());
        }
    };
    let wanted = prepared.header.resumes + 1;
    let d = &prepared.decision;
    let steps: Vec<&str> = d.tokens.iter().map(|t| t.step.as_str()).collect();
    let superseded: Vec<&str> = d.superseded.iter().map(|(s, _)| s.as_str()).collect();
    if a.json {
        let out = serde_json::json!({
            "execution_id": a.id,
            "resumes": wanted,
            "steps": steps,
            "superseded": superseded,
        });
        println!("{out}");
    } else {
        println!(
            "execution {} resumed (resume {wanted}): runs again {}",
            a.id,
            steps.join(", ")
        );
        if !superseded.is_empty() {
            println!("superseded: {}", superseded.join(", "));
        }
        println!("follow it with: noetl exec status {} --wait", a.id);
    }
    Ok(ExitCode::SUCCESS)
}
