//! What the `exec` subcommands (and `why`) share: status names, the
//! "no such execution" answer, the pause's author, and publishing and
//! printing a started execution. A leaf: it imports none of them, so
//! they do not import each other in a circle.

use std::process::ExitCode;
use std::time::Instant;

use noetl_mesh::{codec, connect::display_urls, state::ExecStatus};
use noetl_wire::ExecutionRequest;

use super::exit::Exit;
use super::retry::ride_out;

/// The name an execution's status is shown by.
pub(crate) fn status_name(s: ExecStatus) -> &'static str {
    match s {
        ExecStatus::Running => "running",
        ExecStatus::Completed => "completed",
        ExecStatus::Failed => "failed",
        ExecStatus::Cancelled => "cancelled",
    }
}

/// Say that `id` is not an execution of this mesh; exit code 3.
pub(crate) fn no_execution(mesh: &noetl_mesh::Mesh, id: &str) -> ExitCode {
    eprintln!(
        "error: no execution {id:?} at {}",
        display_urls(&mesh.config().nats_url)
    );
    Exit::NotFound.into()
}

/// Who a pause names when the CLI makes it.
pub fn local_user() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("cli:{user}")
}

/// Publish an execution request under its execution id (de-duplicated
/// by JetStream: a request tried again after a failover starts it once).
pub(crate) async fn publish_request(
    mesh: &noetl_mesh::Mesh,
    req: &ExecutionRequest,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + super::retry::DEFAULT_BUDGET;
    ride_out(deadline, "requesting the execution", || async {
        mesh.publish(
            mesh.subjects().exec_request(),
            &req.execution_id,
            codec::encode(req),
        )
        .await?
        .wait()
        .await?;
        Ok(())
    })
    .await
}

/// Print a started execution's id (`{"execution_id"}` with `json`).
pub(crate) fn print_started(id: &str, json: bool) {
    if json {
        println!("{}", serde_json::json!({"execution_id": id}));
    } else {
        println!("{id}");
    }
}
