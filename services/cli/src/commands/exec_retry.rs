//! `noetl exec retry ID`: a new execution of the same playbook with the
//! same workload (the merged workload the first one ran with). A playbook
//! started from the catalog runs the same version again; one sent inline
//! runs the normalised playbook its plan kept. An execution whose KV state
//! was compacted is run again from its events (`noetl_mesh::rerun`).

use std::process::ExitCode;

use anyhow::Context;
use noetl_mesh::ids::new_execution_id;

use super::common::MeshArgs;
use super::exec_shared::{exists_already, no_execution, print_started, publish_request};

/// Arguments of `noetl exec retry`.
#[derive(clap::Args)]
pub struct RetryArgs {
    /// The execution to run again.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// Id of the new execution (idempotent: the same id starts one).
    #[arg(long = "as", value_parser = super::exec_shared::execution_id)]
    pub new_id: Option<String>,
    /// Print `{"execution_id": ...}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// `noetl exec retry`.
pub async fn run(a: RetryArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    // Its KV state compacted or purged: what its events give.
    let Some(again) = mesh.run_again_of(&a.id).await? else {
        return Ok(no_execution(&mesh, &a.id).await);
    };
    let plan = again.plan.with_context(|| {
        format!(
            "execution {} has no stored plan (it was refused before it started: {}); \
             start the playbook again with `noetl exec start`",
            a.id,
            again.header.error.as_deref().unwrap_or("no error recorded")
        )
    })?;
    let execution_id = a.new_id.clone().unwrap_or_else(new_execution_id);
    if a.new_id.is_some() && exists_already(&mesh, &execution_id).await? {
        print_started(&execution_id, a.json);
        return Ok(ExitCode::SUCCESS);
    }
    let req = noetl_mesh::rerun::request(&again.header, &plan, &Default::default(), execution_id)?;
    publish_request(&mesh, &req).await?;
    print_started(&req.execution_id, a.json);
    Ok(ExitCode::SUCCESS)
}
