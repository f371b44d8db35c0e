//! `noetl exec retry ID`: a new execution of the same playbook with the
//! same workload (the merged workload the first one ran with). A playbook
//! started from the catalog runs the same version again; one sent inline
//! runs the normalised playbook its plan kept.

use std::process::ExitCode;

use anyhow::Context;
use noetl_mesh::{catalog::parse_catalog_id, codec, ids::new_execution_id};
use noetl_wire::ExecutionRequest;

use super::common::MeshArgs;
use super::exec_shared::{no_execution, print_started, publish_request};

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
    let Some(header) = mesh.exec_header(&a.id).await? else {
        return Ok(no_execution(&mesh, &a.id));
    };
    let plan = mesh.plans().get(&mesh, &a.id).await.with_context(|| {
        format!(
            "execution {} has no stored plan (it was refused before it started: {}); \
             start the playbook again with `noetl exec start`",
            a.id,
            header.error.as_deref().unwrap_or("no error recorded")
        )
    })?;
    let execution_id = a.new_id.clone().unwrap_or_else(new_execution_id);
    let mut req = ExecutionRequest {
        execution_id,
        workload_json: codec::json_bytes(&plan.workload),
        ..Default::default()
    };
    match parse_catalog_id(&header.source) {
        Some((path, version)) => {
            req.path = path;
            req.version = version;
        }
        None => {
            req.playbook_yaml = serde_json::to_string(&plan.playbook)?;
            req.source_name = plan.source_name.clone();
        }
    }
    publish_request(&mesh, &req).await?;
    print_started(&req.execution_id, a.json);
    Ok(ExitCode::SUCCESS)
}
