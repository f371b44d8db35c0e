//! `noetl credential put|list|delete`: the encrypted credential vault.
//!
//! Without `--nats` the commands use the local persistent store of
//! `noetl run` (under `NOETL_HOME`), so a credential put here is there for
//! later local runs.

use crate::commands::exit::Exit;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use noetl_mesh::credentials::{Credential, KINDS};

use super::local::Target;

/// Credential commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Encrypt and store a credential (replaces one of the same name).
    Put {
        /// Credential name, as the playbook's `keychain` declares it.
        name: String,
        /// postgres_credential | bearer | basic | api_key | secret.
        #[arg(long)]
        kind: String,
        /// A JSON object with the credential's fields (`-` for stdin).
        #[arg(long = "from-file")]
        from_file: PathBuf,
        /// Print `{"name", "kind", "stored": true}`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// List names and kinds (never values).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Delete a credential.
    Delete {
        /// Credential name.
        name: String,
        /// Print `{"name", "deleted": true}`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
}

/// Run a credential command.
pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    let target = match &cmd {
        Command::Put { target, .. }
        | Command::List { target, .. }
        | Command::Delete { target, .. } => target.clone(),
    };
    let joined = target.join().await?;
    let vault = joined.mesh.vault();
    match cmd {
        Command::Put {
            name,
            kind,
            from_file,
            json,
            ..
        } => {
            let text = if from_file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading stdin")?
            } else {
                std::fs::read_to_string(&from_file)
                    .with_context(|| format!("reading {}", from_file.display()))?
            };
            // serde_json's message names line and column, never the content.
            let data = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", from_file.display()))?;
            if !KINDS.iter().any(|(k, _)| *k == kind) {
                anyhow::bail!(
                    "credential kind `{kind}` is not one of {}",
                    KINDS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
                );
            }
            vault
                .put(&Credential {
                    name: name.clone(),
                    kind: kind.clone(),
                    data,
                })
                .await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"name": name, "kind": kind, "stored": true})
                );
            } else {
                println!("stored credential `{name}` ({kind})");
            }
        }
        Command::List { json, .. } => {
            let all = vault.list().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else if all.is_empty() {
                println!("no credentials stored");
            } else {
                for c in all {
                    println!("{:<24} {:<20} {}", c.name, c.kind, c.updated_at);
                }
            }
        }
        Command::Delete { name, json, .. } => {
            if !vault.delete(&name).await? {
                eprintln!("error: credential `{name}` is not stored");
                return Ok(Exit::NotFound.into());
            }
            if json {
                println!("{}", serde_json::json!({"name": name, "deleted": true}));
            } else {
                println!("deleted credential `{name}`");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
