//! The check of python tasks' inline code (E048) as the CLI makes it
//! (`noetl validate`, `run`, `exec start`, `playbook register`):
//! [`noetl_tool_python::playbook::check`], with a note on stderr when no
//! interpreter could check the code (docs/errors.md#e048).

use noetl_core::diagnostic::Diagnostics;
use noetl_core::load::LoadedPlaybook;

/// E048 for each python task of `loaded` whose code does not compile.
/// Without an interpreter nothing is checked, and a note says so.
pub fn check(loaded: &LoadedPlaybook, text: &str) -> Diagnostics {
    noetl_tool_python::playbook::check(loaded, text).unwrap_or_else(|e| {
        eprintln!(
            "note: {}: python code not checked: {e} (NOETL_PYTHON names the interpreter)",
            loaded.source_name
        );
        Diagnostics::default()
    })
}
