//! `noetl migrate FILE... [--write | --diff]`: legacy NoETL playbooks
//! rewritten into canonical v10 (docs/migrate.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use noetl_core::load::load_playbook;
use noetl_migrate::{migrate, Migration};

use crate::commands::exit::Exit;

/// Arguments of `noetl migrate`.
#[derive(clap::Args)]
#[command(
    after_help = "Prints one line per change (file:line: what) on stderr. Without \
    --write or --diff, prints the migrated playbook on stdout (one FILE only). Exit status: \
    0 when every migrated file loads without errors, 1 when a construct was refused or an \
    error remains, 2 when a file cannot be read or is not YAML.\n\n\
    Every construct NoETL accepts and what becomes of it here (canonical as is, rewritten \
    by this command, or refused and why): docs/noetl-compat.md. The rewrite itself: \
    docs/migrate.md. `noetl run`, `noetl exec start` and `noetl playbook register` take \
    --migrate to apply it in memory."
)]
pub struct Args {
    /// Legacy playbook files (YAML).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Rewrite each file in place (atomically; untouched when nothing changes).
    #[arg(long, conflicts_with = "diff")]
    pub write: bool,
    /// Print a unified diff of each file instead of the migrated text.
    #[arg(long)]
    pub diff: bool,
}

/// Migrate every file.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.files.len() > 1 && !args.write && !args.diff {
        anyhow::bail!(
            "{} files given: add --write to rewrite them in place, or --diff to see the changes",
            args.files.len()
        );
    }
    let mut failed = false;
    for path in &args.files {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {name}"))?;
        let m = migrate(&text).with_context(|| format!("{name} is not YAML"))?;
        report(&name, &m);
        let loads = match load_playbook(&m.text, &name) {
            Ok(_) => true,
            Err(e) => {
                eprintln!("{}", e.render_human());
                false
            }
        };
        failed |= !loads || !m.refusals.is_empty();
        eprintln!(
            "{name}: {} change(s), {} refused; {}",
            m.changes.len(),
            m.refusals.len(),
            if loads {
                "the result is a valid canonical playbook"
            } else {
                "the result does not load yet (see above)"
            }
        );
        if args.write {
            if m.text != text {
                write_atomically(path, &m.text)?;
            }
        } else if args.diff {
            print!("{}", unified_diff(&name, &text, &m.text));
        } else {
            print!("{}", m.text);
        }
    }
    Ok(if failed {
        Exit::Failed.into()
    } else {
        ExitCode::SUCCESS
    })
}

/// One line per change and refusal, in file order, on stderr.
pub fn report(name: &str, m: &Migration) {
    for (line, text) in m.report() {
        eprintln!("{name}:{line}: {text}");
    }
}

/// Replace `path` with `text` through a temporary file in its directory,
/// so a crash leaves the old file or the new one, never half of each.
fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    if let Ok(meta) = std::fs::metadata(path) {
        let _ = std::fs::set_permissions(tmp.path(), meta.permissions());
    }
    tmp.persist(path)
        .with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// A unified diff of `old` → `new` (3 lines of context).
fn unified_diff(name: &str, old: &str, new: &str) -> String {
    if old == new {
        return String::new();
    }
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{name}"), &format!("b/{name}"))
        .to_string()
}
