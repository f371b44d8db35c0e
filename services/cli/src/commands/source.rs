//! A playbook file read for `run`, `exec start` and `playbook register`:
//! loaded as written, or first rewritten in memory by the `noetl migrate`
//! rewrite (`--migrate`, docs/migrate.md), its change lines printed as
//! `noetl migrate` prints them; refused, as `noetl validate` refuses it,
//! when a python task's code does not compile (E048).

use std::path::Path;

use noetl_core::load::{load_file, load_playbook, LoadedPlaybook};
use noetl_migrate::migrate;

use super::migrate::report;

/// What [`read`] needs.
pub struct Read<'a> {
    /// The playbook file.
    pub path: &'a Path,
    /// Apply the `noetl migrate` rewrite first.
    pub migrate: bool,
    /// Print the loader's warnings on stderr.
    pub warnings: bool,
}

/// A playbook file that loads: the text to send or store, and what the
/// loader made of it.
pub struct Source {
    /// The text (the migrated text with `--migrate`).
    pub text: String,
    /// The loaded playbook.
    pub loaded: LoadedPlaybook,
}

/// Why a file was not read: already printed on stderr; `summary` says it
/// in one line (`does not load: E004, E012`).
#[derive(Debug)]
pub struct NotLoaded {
    /// One line for a per-file report.
    pub summary: String,
}

/// Read `path`, rewrite it with `--migrate`, load it and compile its
/// python code. Change lines, refusals, warnings (if asked) and errors are
/// printed on stderr; a file that does not load or whose python does not
/// compile is [`NotLoaded`] (the command's exit 2).
pub fn read(r: Read<'_>) -> Result<Source, NotLoaded> {
    let name = r.path.display().to_string();
    let (text, loaded) = if r.migrate {
        let original = std::fs::read_to_string(r.path).map_err(|e| {
            eprintln!("error: reading {name}: {e}");
            NotLoaded {
                summary: format!("cannot be read: {e}"),
            }
        })?;
        let m = migrate(&original).map_err(|e| {
            eprintln!("error: {name}: not YAML: {e}");
            NotLoaded {
                summary: format!("not YAML: {e}"),
            }
        })?;
        report(&name, &m);
        if !m.changes.is_empty() || !m.refusals.is_empty() {
            eprintln!(
                "{name}: migrated in memory: {} change(s), {} refused",
                m.changes.len(),
                m.refusals.len()
            );
        }
        let loaded = load_playbook(&m.text, &name).map_err(|e| {
            eprintln!("{}", e.render_human());
            if m.text != original {
                eprintln!(
                    "note: the lines above are those of the migrated text (`noetl migrate {name}` prints it)"
                );
            }
            not_loaded(&e)
        })?;
        (m.text, loaded)
    } else {
        let loaded = load_file(r.path).map_err(|e| {
            eprintln!("{}", e.render_human());
            not_loaded(&e)
        })?;
        let text = std::fs::read_to_string(r.path).map_err(|e| {
            eprintln!("error: reading {name}: {e}");
            NotLoaded {
                summary: format!("cannot be read: {e}"),
            }
        })?;
        (text, loaded)
    };
    if r.warnings && !loaded.warnings.is_empty() {
        eprintln!("{}\n", loaded.warnings.render_human(&name, &text));
    }
    // What `noetl validate` refuses beyond the loader (E048) is refused
    // here too, before anything runs or is stored.
    let python = super::validate_python::check(&loaded, &text);
    if python.has_errors() {
        eprintln!("{}", python.render_human(&name, &text));
        return Err(NotLoaded {
            summary: "refused: E048 (python code that does not compile)".into(),
        });
    }
    Ok(Source { text, loaded })
}

/// The one-line summary of a load error: its distinct error codes.
fn not_loaded(e: &noetl_core::load::LoadError) -> NotLoaded {
    let mut codes: Vec<&str> = e.diagnostics.errors().map(|d| d.code.as_str()).collect();
    codes.sort_unstable();
    codes.dedup();
    NotLoaded {
        summary: format!("does not load: {}", codes.join(", ")),
    }
}
