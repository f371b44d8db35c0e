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

/// What an execution id may be ([`noetl_mesh::ids::is_valid_execution_id`]).
pub(crate) const EXECUTION_ID_RULE: &str = noetl_mesh::ids::NAME_RULE;

/// The clap value parser of every execution id argument: an id that cannot
/// be one (`abc,`, `*`) is refused before anything is read (exit 2) instead
/// of naming a KV key or subject filter it was never meant to.
pub(crate) fn execution_id(s: &str) -> Result<String, String> {
    if noetl_mesh::ids::is_valid_execution_id(s) {
        return Ok(s.to_string());
    }
    let reserved = if s == noetl_mesh::ids::MESH_SCOPE {
        format!(" (`{s}` is reserved)")
    } else {
        String::new()
    };
    Err(format!(
        "not an execution id{reserved}: use {EXECUTION_ID_RULE}"
    ))
}

/// What a signal name may be ([`noetl_mesh::signal::valid_signal`]).
pub(crate) const SIGNAL_NAME_RULE: &str = noetl_mesh::ids::NAME_RULE;

/// The clap value parser of a signal name.
pub(crate) fn signal_name(s: &str) -> Result<String, String> {
    if noetl_mesh::signal::valid_signal(s) {
        return Ok(s.to_string());
    }
    Err(format!("not a signal name: use {SIGNAL_NAME_RULE}"))
}

/// The name an execution's status is shown by.
pub(crate) fn status_name(s: ExecStatus) -> &'static str {
    match s {
        ExecStatus::Running => "running",
        ExecStatus::Completed => "completed",
        ExecStatus::Failed => "failed",
        ExecStatus::Cancelled => "cancelled",
    }
}

/// Say that `id` is not an execution of this mesh, or, when its events
/// remain (its KV state compacted or purged after it ended), what still
/// reads it; exit code 3.
pub(crate) async fn no_execution(mesh: &noetl_mesh::Mesh, id: &str) -> ExitCode {
    let at = display_urls(&mesh.config().nats_url);
    if matches!(mesh.in_log(id).await, Ok(true)) {
        eprintln!(
            "error: execution {id:?} at {at} ended and its state was removed (`noetl admin compact`, or a purge); \
             its events remain: `noetl exec show {id}` shows it, `noetl exec retry {id}` runs it again"
        );
    } else {
        eprintln!("error: no execution {id:?} at {at}");
    }
    Exit::NotFound.into()
}

/// Whether a chosen execution id names an execution already (its header,
/// or its events once its state was compacted), said on stderr: a start
/// under it is not asked again (the same id starts one execution).
pub(crate) async fn exists_already(mesh: &noetl_mesh::Mesh, id: &str) -> anyhow::Result<bool> {
    let deadline = Instant::now() + super::retry::DEFAULT_BUDGET;
    let known = ride_out(deadline, "reading the execution", || async {
        Ok(mesh.is_known(id).await?)
    })
    .await?;
    if known {
        eprintln!("note: execution {id:?} exists already: not started again");
    }
    Ok(known)
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

#[cfg(test)]
mod tests {
    #[test]
    fn execution_ids_and_signal_names_are_checked_with_their_rule() {
        assert_eq!(super::execution_id("run-1_A").unwrap(), "run-1_A");
        for bad in ["", "abc,", "*", "a.b", "_mesh", &"x".repeat(129)] {
            let e = super::execution_id(bad).unwrap_err();
            assert!(
                e.contains("1-128 characters of [A-Za-z0-9_-]"),
                "{bad:?}: {e}"
            );
        }
        assert!(super::execution_id("_mesh")
            .unwrap_err()
            .contains("reserved"));
        assert_eq!(super::signal_name("approval").unwrap(), "approval");
        let e = super::signal_name("approval.v2").unwrap_err();
        assert!(e.starts_with("not a signal name"), "{e}");
    }
}
