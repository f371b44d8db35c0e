//! `noetl playbook register|list|show`: the playbook catalog.
//!
//! Without `--nats` the commands use the local persistent store of
//! `noetl run` (under `NOETL_HOME`), so a playbook registered here can be
//! started by path in later local runs (`noetl run PATH`).

use crate::commands::exit::Exit;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use noetl_mesh::catalog::{CatalogError, Entry};
use serde_json::json;

use super::local::Target;

/// Catalog commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Validate a playbook and store it under its `metadata.path` as the
    /// next version.
    Register {
        /// The playbook file.
        file: PathBuf,
        /// Print `{"path", "version", "name"}`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// The latest version of every registered path.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Print a registered playbook (the latest version, or `--version N`).
    Show {
        /// Catalog path (`metadata.path`).
        path: String,
        /// Version to show.
        #[arg(long)]
        version: Option<u32>,
        /// Print the entry as JSON (path, version, name, registered_at, yaml).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
}

fn summary(e: &Entry) -> serde_json::Value {
    json!({
        "path": e.path,
        "version": e.version,
        "name": e.name,
        "registered_at": e.registered_at,
    })
}

// Over 80 lines on purpose: one arm per catalog subcommand.
/// Run a catalog command.
pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Register { file, json, target } => {
            let loaded = match noetl_core::load::load_file(&file) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("{}", e.render_human());
                    eprintln!("error: {} was not registered", file.display());
                    return Ok(Exit::Usage.into());
                }
            };
            let text = std::fs::read_to_string(&file)?;
            if !loaded.warnings.is_empty() {
                let name = file.display().to_string();
                eprintln!("{}\n", loaded.warnings.render_human(&name, &text));
            }
            let meta = &loaded.playbook.metadata;
            let Some(path) = meta.path.clone().filter(|p| !p.trim().is_empty()) else {
                eprintln!(
                    "error: {}: `metadata.path` is required to register a playbook\n  help: add `path: my/playbook` under `metadata`; executions name it by that path",
                    file.display()
                );
                return Ok(Exit::Usage.into());
            };
            let joined = target.join().await?;
            let entry = match joined
                .mesh
                .catalog()
                .register(&path, &meta.name, &text)
                .await
            {
                Ok(e) => e,
                Err(e @ CatalogError::BadPath { .. }) => {
                    eprintln!("error: {}: {e}", file.display());
                    return Ok(Exit::Usage.into());
                }
                Err(e) => return Err(e.into()),
            };
            if json {
                println!("{}", summary(&entry));
            } else {
                println!("registered {} version {}", entry.path, entry.version);
            }
        }
        Command::List { json, target } => {
            let joined = target.join().await?;
            let all = joined.mesh.catalog().list().await?;
            if json {
                let rows: Vec<_> = all.iter().map(summary).collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else if all.is_empty() {
                println!("no playbooks registered");
            } else {
                for e in all {
                    println!(
                        "{:<32} v{:<5} {:<24} {}",
                        e.path, e.version, e.name, e.registered_at
                    );
                }
            }
        }
        Command::Show {
            path,
            version,
            json,
            target,
        } => {
            let joined = target.join().await?;
            let entry = match joined.mesh.catalog().get(&path, version).await {
                Ok(e) => e,
                Err(e @ CatalogError::NotFound { .. }) => {
                    eprintln!("error: {e}");
                    return Ok(Exit::NotFound.into());
                }
                Err(e @ CatalogError::BadPath { .. }) => {
                    eprintln!("error: {e}");
                    return Ok(Exit::Usage.into());
                }
                Err(e) => return Err(e.into()),
            };
            if json {
                let mut v = summary(&entry);
                v["yaml"] = json!(entry.yaml);
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", entry.yaml);
                if !entry.yaml.ends_with('\n') {
                    println!();
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
