//! `noetl schema`.

use std::process::ExitCode;

/// Arguments of `noetl schema` (none yet).
#[derive(clap::Args)]
pub struct Args {}

/// Print the playbook JSON Schema (draft-07, for yaml-language-server).
pub fn run(_: Args) -> anyhow::Result<ExitCode> {
    println!(
        "{}",
        serde_json::to_string_pretty(&noetl_core::schema::playbook_schema())?
    );
    Ok(ExitCode::SUCCESS)
}
