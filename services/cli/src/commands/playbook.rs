//! `noetl playbook register|list|show`: the playbook catalog.
//!
//! Without `--nats` the commands use the local persistent store of
//! `noetl run` (under `NOETL_HOME`), so a playbook registered here can be
//! started by path in later local runs (`noetl run PATH`).

use crate::commands::exit::Exit;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use noetl_mesh::catalog::{CatalogError, Entry};
use noetl_mesh::Mesh;
use serde_json::json;

use super::local::Target;
use super::source;

/// Catalog commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Validate a playbook and store it under its `metadata.path` as the
    /// next version; with --recursive, every playbook under a folder.
    #[command(
        after_help = "With --recursive, every .yaml/.yml file under the folder FILE whose `kind` is \
        `Playbook` is registered (other files are skipped, and said so); one line per file \
        (its path and version, or why not), and exit 1 if any was not registered."
    )]
    Register {
        /// The playbook file (with --recursive: a folder).
        file: PathBuf,
        /// Register every playbook under the folder FILE.
        #[arg(long, short = 'r')]
        recursive: bool,
        /// Rewrite each legacy NoETL playbook with the `noetl migrate`
        /// rewrite in memory first, printing its changes on stderr; the
        /// catalog stores the migrated text.
        #[arg(long)]
        migrate: bool,
        /// Print `{"path", "version", "name"}` (with --recursive, a JSON
        /// array with one object per file: `file` and either those or
        /// `error` or `skipped`).
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

/// What became of one file.
enum Registered {
    /// Stored as this entry.
    Stored(Entry),
    /// Not stored: why, in one line (the details are on stderr).
    Refused(String),
}

/// Read (and with `migrate` rewrite) one playbook file, validate it and
/// store it under its `metadata.path`. Errors only for the mesh.
async fn register_one(file: &Path, migrate: bool, mesh: &Mesh) -> anyhow::Result<Registered> {
    let src = match source::read(source::Read {
        path: file,
        migrate,
        warnings: true,
    }) {
        Ok(s) => s,
        Err(e) => return Ok(Registered::Refused(e.summary)),
    };
    let meta = &src.loaded.playbook.metadata;
    let Some(path) = meta.path.clone().filter(|p| !p.trim().is_empty()) else {
        eprintln!(
            "error: {}: `metadata.path` is required to register a playbook\n  help: add `path: my/playbook` under `metadata`; executions name it by that path",
            file.display()
        );
        return Ok(Registered::Refused("no `metadata.path`".into()));
    };
    match mesh.catalog().register(&path, &meta.name, &src.text).await {
        Ok(e) => Ok(Registered::Stored(e)),
        Err(e @ CatalogError::BadPath { .. }) => {
            eprintln!("error: {}: {e}", file.display());
            Ok(Registered::Refused(e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// What [`register_tree`] registers.
struct Tree<'a> {
    dir: &'a Path,
    migrate: bool,
    json: bool,
    target: &'a Target,
}

/// `register DIR --recursive`: every playbook file under `dir`, in path
/// order; one line (or JSON object) per file; exit 1 if any was refused.
async fn register_tree(t: Tree<'_>) -> anyhow::Result<ExitCode> {
    if !t.dir.is_dir() {
        eprintln!(
            "error: --recursive needs a folder; {} is not one",
            t.dir.display()
        );
        return Ok(Exit::Usage.into());
    }
    let files = yaml_files(t.dir)?;
    let joined = t.target.join().await?;
    let (mut rows, mut failed) = (Vec::new(), 0usize);
    let (mut stored, mut skipped) = (0usize, 0usize);
    for file in &files {
        let shown = file.display().to_string();
        if let Some(why) = not_a_playbook(file) {
            skipped += 1;
            if !t.json {
                println!("skipped  {shown}: {why}");
            }
            rows.push(json!({"file": shown, "skipped": why}));
            continue;
        }
        match register_one(file, t.migrate, &joined.mesh).await? {
            Registered::Stored(e) => {
                stored += 1;
                if !t.json {
                    println!("registered {shown}: {} version {}", e.path, e.version);
                }
                let mut row = summary(&e);
                row["file"] = json!(shown);
                rows.push(row);
            }
            Registered::Refused(why) => {
                failed += 1;
                if !t.json {
                    println!("failed   {shown}: {why}");
                }
                rows.push(json!({"file": shown, "error": why}));
            }
        }
    }
    if t.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("{stored} registered, {failed} failed, {skipped} skipped");
    }
    Ok(if failed > 0 {
        Exit::Failed.into()
    } else {
        ExitCode::SUCCESS
    })
}

/// Every `.yaml` / `.yml` file under `dir` (symbolic links not followed),
/// sorted by path.
fn yaml_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries =
            std::fs::read_dir(&d).with_context(|| format!("reading folder {}", d.display()))?;
        for e in entries {
            let e = e.with_context(|| format!("reading folder {}", d.display()))?;
            let kind = e.file_type()?;
            let p = e.path();
            if kind.is_dir() {
                todo.push(p);
            } else if kind.is_file() && is_yaml_name(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn is_yaml_name(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

/// Why a YAML file is not a playbook to register (`kind` is not
/// `Playbook`), or `None` when it is one or cannot tell (the loader then
/// says what is wrong).
fn not_a_playbook(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    kind_is_not_playbook(&text)
}

/// The decision of [`not_a_playbook`] on a file's text.
fn kind_is_not_playbook(text: &str) -> Option<String> {
    let root = noetl_core::yaml::parse(text).ok()?;
    if !root.is_map() {
        return Some(format!(
            "not a Playbook (the document is {})",
            root.type_name()
        ));
    }
    match root.get("kind") {
        None => Some("not a Playbook (no `kind`)".into()),
        Some(k) => match k.as_str() {
            Some("Playbook") => None,
            Some(other) => Some(format!("not a Playbook (kind: {other})")),
            None => Some(format!("not a Playbook (`kind` is {})", k.type_name())),
        },
    }
}

// Over 80 lines on purpose: one arm per catalog subcommand.
/// Run a catalog command.
pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Register {
            file,
            recursive,
            migrate,
            json,
            target,
        } => {
            if recursive {
                return register_tree(Tree {
                    dir: &file,
                    migrate,
                    json,
                    target: &target,
                })
                .await;
            }
            if file.is_dir() {
                eprintln!(
                    "error: {} is a folder: add --recursive to register every playbook under it",
                    file.display()
                );
                return Ok(Exit::Usage.into());
            }
            let one = register_one(&file, migrate, &target.join().await?.mesh).await?;
            match one {
                Registered::Stored(entry) if json => println!("{}", summary(&entry)),
                Registered::Stored(entry) => {
                    println!("registered {} version {}", entry.path, entry.version)
                }
                Registered::Refused(why) => {
                    eprintln!("error: {} was not registered: {why}", file.display());
                    return Ok(Exit::Usage.into());
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_documents_of_kind_playbook_are_registered() {
        assert_eq!(kind_is_not_playbook("kind: Playbook\nworkflow: []\n"), None);
        assert_eq!(
            kind_is_not_playbook("kind: Credential\nname: x\n").as_deref(),
            Some("not a Playbook (kind: Credential)")
        );
        assert_eq!(
            kind_is_not_playbook("name: x\n").as_deref(),
            Some("not a Playbook (no `kind`)")
        );
        assert_eq!(
            kind_is_not_playbook("- a\n- b\n").as_deref(),
            Some("not a Playbook (the document is a list)")
        );
        // Not YAML: the loader says what is wrong, as for any playbook.
        assert_eq!(kind_is_not_playbook("kind: [\n"), None);
    }

    #[test]
    fn the_tree_is_every_yaml_file_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("b/c")).unwrap();
        for f in [
            "b/c/x.yml",
            "a.yaml",
            "b/readme.md",
            "b/z.yaml",
            "b/a.yaml.bak",
        ] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let got: Vec<String> = yaml_files(dir.path())
            .unwrap()
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(got, ["a.yaml", "b/c/x.yml", "b/z.yaml"]);
    }
}
