//! Whether python tasks' code compiles, asked of the interpreter the tool
//! runs, without running any of it: `noetl validate` names a syntax error
//! at its playbook line before a run reaches the task (docs/errors.md#e048).
//! The code is compiled as the runner compiles a task's (`compile.py`,
//! shared by both: a top-level `return` is allowed).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::Deserialize;

/// The check script, passed with `-c`: the compile rule, then the check.
pub const CHECK: &str = concat!(include_str!("compile.py"), include_str!("syntax.py"));

/// Where a source does not compile, in the source's own lines and columns
/// (1-based).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SyntaxError {
    /// Line of the source.
    pub line: usize,
    /// Column of that line.
    pub column: usize,
    /// The interpreter's message (`invalid syntax`, `'(' was never closed`).
    pub message: String,
}

/// What the interpreter said of the sources.
#[derive(Debug, Clone, Deserialize)]
pub struct Report {
    /// Its version (`3.11.2`).
    pub version: String,
    /// For each source, in order: `None` when it compiles.
    pub results: Vec<Option<SyntaxError>>,
}

/// Why the check could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The interpreter could not be started.
    #[error("python interpreter `{program}` is not available ({source})")]
    Unavailable {
        /// The interpreter as configured.
        program: String,
        /// Why it did not start.
        source: std::io::Error,
    },
    /// It started but gave no report.
    #[error("python interpreter `{program}` could not check the code: {message}")]
    Failed {
        /// The interpreter as configured.
        program: String,
        /// What went wrong (its stderr, or the report that did not parse).
        message: String,
    },
}

/// Compile each of `sources` with `interpreter`, as a task's code is
/// compiled.
pub fn check(interpreter: &Path, sources: &[&str]) -> Result<Report, CheckError> {
    let program = interpreter.display().to_string();
    let failed = |message: String| CheckError::Failed {
        program: program.clone(),
        message,
    };
    let mut child = Command::new(interpreter)
        // Isolated: no user site, no PYTHON* variables, no startup file.
        .args(["-I", "-c", CHECK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CheckError::Unavailable {
            program: program.clone(),
            source,
        })?;
    let input = serde_json::to_vec(sources).map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&input)
            .map_err(|e| failed(format!("writing the sources: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(failed(format!("{} ({})", stderr.trim(), out.status)));
    }
    let report: Report = serde_json::from_slice(&out.stdout)
        .map_err(|e| failed(format!("its report does not parse: {e}")))?;
    if report.results.len() != sources.len() {
        return Err(failed(format!(
            "{} results for {} sources",
            report.results.len(),
            sources.len()
        )));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_checked_as_a_task_compiles_it() {
        let python = Path::new("python3");
        let report = check(
            python,
            &[
                "result = 1",
                // A top-level `return`: a task may return its result.
                "x = 2\nreturn x * 2",
                "def main(:\n    return 1",
                "if True:\nprint(1)",
            ],
        )
        .expect("python3 checks the code");
        assert!(!report.version.is_empty());
        assert_eq!(report.results[0], None);
        assert_eq!(report.results[1], None);
        let e = report.results[2].as_ref().expect("a syntax error");
        assert_eq!((e.line, e.column), (1, 10), "{e:?}");
        let e = report.results[3].as_ref().expect("an indentation error");
        assert_eq!(e.line, 2, "{e:?}");
        assert!(e.message.contains("indented"), "{e:?}");
    }

    #[test]
    fn a_missing_interpreter_is_named() {
        let e = check(Path::new("/nonexistent/python9"), &["x = 1"]).unwrap_err();
        assert!(matches!(e, CheckError::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/python9"), "{e}");
    }
}
