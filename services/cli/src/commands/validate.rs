//! `noetl validate FILE...`.

use crate::commands::exit::Exit;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use noetl_core::diagnostic::Diagnostics;
use noetl_core::load::{load_file, load_playbook};

/// Output formats.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Format {
    /// Each diagnostic with its source line, a caret and a help line.
    Human,
    /// One line per diagnostic: `file:line:col: error[CODE]: message`.
    Short,
    /// One JSON array of `{file, line, column, severity, code, message, help, path}`.
    Json,
}

/// Arguments of `noetl validate`.
#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 when every file is valid (warnings allowed), 1 when any \
                        file has an error. Error codes are explained in docs/errors.md."
)]
pub struct Args {
    /// Playbook files (YAML) to check.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
}

/// Validate every file; exit 1 if any has an error.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mut failed = false;
    let mut json = Vec::new();
    for path in &args.files {
        let name = path.display().to_string();
        let (diags, text, ok): (Diagnostics, String, bool) = match std::fs::read_to_string(path) {
            Ok(text) => match load_playbook(&text, &name) {
                Ok(l) => {
                    let python = super::validate_python::check(&l, &text);
                    let ok = !python.has_errors();
                    let mut diags = l.warnings;
                    diags.extend(python.0);
                    diags.sort();
                    (diags, text, ok)
                }
                Err(e) => (e.diagnostics, text, false),
            },
            // Unreadable: load_file reports it as a diagnostic.
            Err(_) => match load_file(path) {
                Ok(l) => (l.warnings, String::new(), true),
                Err(e) => (e.diagnostics, e.text, false),
            },
        };
        failed |= !ok;
        match args.format {
            Format::Json => {
                if let serde_json::Value::Array(a) = diags.render_json(&name) {
                    json.extend(a);
                }
            }
            Format::Short => {
                if !diags.is_empty() {
                    println!("{}", diags.render_short(&name));
                }
                if ok {
                    println!("ok: {name} ({})", plural(diags.len(), "warning"));
                }
            }
            Format::Human => {
                if !diags.is_empty() {
                    println!("{}\n", diags.render_human_styled(&name, &text, color));
                }
                if ok {
                    println!("ok: {name} ({})", plural(diags.len(), "warning"));
                } else {
                    println!(
                        "refused: {name} ({}, {})",
                        plural(diags.errors().count(), "error"),
                        plural(diags.warnings().count(), "warning")
                    );
                }
            }
        }
    }
    if let Format::Json = args.format {
        println!("{}", serde_json::to_string_pretty(&json)?);
    }
    Ok(if failed {
        Exit::Failed.into()
    } else {
        ExitCode::SUCCESS
    })
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}
