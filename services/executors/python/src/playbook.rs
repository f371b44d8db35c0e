//! The check of a playbook's python tasks' inline code (E048), by
//! `noetl validate`, by the CLI commands that read a playbook file (`run`,
//! `exec start`, `playbook register`) and by the API's catalog
//! registration: each is compiled, not run, by the interpreter the python
//! executor would run (`NOETL_PYTHON`, else `python3`), the way the
//! executor compiles it ([`crate::syntax`]), and a syntax error is named at
//! its line in the playbook rather than when a run reaches the task
//! (docs/errors.md#e048).

use crate::syntax::{self, CheckError, SyntaxError};
use noetl_core::codes::Code;
use noetl_core::diagnostic::{Diagnostic, Diagnostics};
use noetl_core::load::LoadedPlaybook;
use noetl_core::script::{script_source, ScriptSource};
use noetl_core::yaml::{escape, Span};
use noetl_core::Playbook;
use serde_json::{Map, Value};
use std::path::Path;

/// A python task's inline code, and where it is.
#[derive(Debug, PartialEq)]
struct PythonCode {
    pointer: String,
    whose: String,
    code: String,
}

/// The inline code of every python task of `pb`: its steps' tasks and
/// its root `workbook`'s, as `code` or as an inline `script` (a script
/// holding a template is rendered when it runs, so it is left alone).
fn python_codes(pb: &Playbook) -> Vec<PythonCode> {
    let mut out = Vec::new();
    for (i, step) in pb.workflow.iter().enumerate() {
        for (j, task) in step.tool.iter().enumerate() {
            if task.kind != "python" {
                continue;
            }
            if let Some((field, code)) = inline_code(&task.config) {
                out.push(PythonCode {
                    pointer: format!("/workflow/{i}/tool/{j}/{field}"),
                    whose: format!("task `{}` of step `{}`", task.name, step.step),
                    code,
                });
            }
        }
    }
    for (base, name, body) in workbook_tasks(pb.workbook.as_ref()) {
        let python = body.get("kind").and_then(Value::as_str) == Some("python");
        if let Some((field, code)) = inline_code(body).filter(|_| python) {
            out.push(PythonCode {
                pointer: format!("{base}/{field}"),
                whose: format!("workbook task `{name}`"),
                code,
            });
        }
    }
    out
}

/// A python task body's inline code and the field holding it (`code`,
/// `script/source/code` or `script/code`).
fn inline_code(body: &Map<String, Value>) -> Option<(&'static str, String)> {
    if let Some(code) = body.get("code").and_then(Value::as_str) {
        return Some(("code", code.to_string()));
    }
    let script = body.get("script")?;
    let Ok(ScriptSource::Inline(code)) = script_source(script) else {
        return None;
    };
    if code.contains("{{") || code.contains("{%") {
        return None;
    }
    let in_source = script.pointer("/source/code").is_some();
    let field = if in_source {
        "script/source/code"
    } else {
        "script/code"
    };
    Some((field, code))
}

/// The root `workbook`'s task bodies: each one's pointer, name and body,
/// in either of its shapes (a list of named tasks, or `tasks:` by name).
fn workbook_tasks(workbook: Option<&Value>) -> Vec<(String, String, &Map<String, Value>)> {
    let named = |v: &Value| {
        v.get("name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    match workbook {
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((format!("/workbook/{i}"), named(t), t.as_object()?)))
            .collect(),
        Some(Value::Object(m)) => match m.get("tasks") {
            Some(Value::Object(tasks)) => tasks
                .iter()
                .filter_map(|(k, t)| {
                    let base = format!("/workbook/tasks/{}", escape(k));
                    Some((base, k.clone(), t.as_object()?))
                })
                .collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// E048 for each python task of `loaded` (loaded from `text`) whose code
/// does not compile; why nothing could be checked when the interpreter
/// cannot be started or gives no report (a playbook without python code
/// asks for none).
pub fn check(loaded: &LoadedPlaybook, text: &str) -> Result<Diagnostics, CheckError> {
    check_with(&crate::PythonConfig::from_env().interpreter, loaded, text)
}

/// [`check`] with `interpreter`.
pub fn check_with(
    interpreter: &Path,
    loaded: &LoadedPlaybook,
    text: &str,
) -> Result<Diagnostics, CheckError> {
    let mut out = Diagnostics::default();
    let codes = python_codes(&loaded.playbook);
    if codes.is_empty() {
        return Ok(out);
    }
    let sources: Vec<&str> = codes.iter().map(|c| c.code.as_str()).collect();
    let report = syntax::check(interpreter, &sources)?;
    for (c, result) in codes.iter().zip(&report.results) {
        let Some(e) = result else { continue };
        let at = loaded.source_map.lookup(&c.pointer).unwrap_or_default();
        let message = format!(
            "python code of {} does not compile: {} (line {} of the code)",
            c.whose, e.message, e.line
        );
        let help = format!(
            "the python executor compiles it the same way, and the task would fail with a \
             SyntaxError; checked with {} (Python {}; NOETL_PYTHON names another)",
            interpreter.display(),
            report.version
        );
        out.push(
            Diagnostic::error(
                Code::E048,
                locate(text, at, &c.code, e),
                &c.pointer,
                message,
            )
            .help(help),
        );
    }
    Ok(out)
}

/// Where `e` (a line and column of `code`) is in the playbook's `text`,
/// `code` being the scalar at `at`: a block scalar's lines follow its
/// indicator, each indented alike; a one-line scalar is on `at`'s line
/// (past its quote). `at` itself when the code's lines are not found.
fn locate(text: &str, at: Span, code: &str, e: &SyntaxError) -> Span {
    let lines: Vec<&str> = text.split('\n').collect();
    let starts: Vec<usize> = std::iter::once(0)
        .chain(lines.iter().scan(0, |o, l| {
            *o += l.len() + 1;
            Some(*o)
        }))
        .collect();
    let span = |line: usize, col: usize| Span {
        line: line + 1,
        col,
        offset: starts.get(line).map_or(at.offset, |s| s + col - 1),
    };
    let Some(first) = code.lines().next() else {
        return at;
    };
    if !code.trim_end().contains('\n') {
        let row = at.line.saturating_sub(1);
        let quoted = lines
            .get(row)
            .and_then(|l| l.get(at.col.saturating_sub(1)..))
            .is_some_and(|rest| rest.starts_with(['"', '\'']));
        return span(
            row,
            at.col + usize::from(quoted) + e.column.saturating_sub(1),
        );
    }
    let want = code.lines().nth(e.line.saturating_sub(1)).unwrap_or("");
    // The block's first line: on the indicator's line or the one after.
    let start = (at.line.saturating_sub(1)..lines.len().min(at.line + 1))
        .find(|&r| !first.trim().is_empty() && lines[r].trim() == first.trim());
    let Some(start) = start else { return at };
    let row = start + e.line.saturating_sub(1);
    let Some(src) = lines.get(row) else { return at };
    let indent = match src.strip_suffix(want) {
        Some(lead) if !want.is_empty() => lead.len(),
        _ => src.len() - src.trim_start().len(),
    };
    span(row, indent + e.column.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(line: usize, column: usize) -> SyntaxError {
        SyntaxError {
            line,
            column,
            message: "invalid syntax".into(),
        }
    }

    fn codes_of(yaml: &str) -> Vec<(String, String, String)> {
        let loaded = noetl_core::load::load_playbook(yaml, "t.yaml").expect("loads");
        let codes = python_codes(&loaded.playbook);
        codes
            .into_iter()
            .map(|c| (c.pointer, c.whose, c.code))
            .collect()
    }

    #[test]
    fn steps_tasks_inline_scripts_and_workbook_tasks_are_checked() {
        let yaml = r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: t }
workbook:
  - name: wb
    kind: python
    code: "x = 1"
  - name: other
    kind: noop
workflow:
  - step: start
    tool:
      - name: a
        kind: python
        script: { uri: inline, source: { type: inline, code: "y = 2" } }
      - name: b
        kind: workbook
        task: wb
      - name: c
        kind: python
        script: { source: { type: inline, code: "z = {{ workload.z }}" } }
      - name: d
        kind: python
        script: { uri: scripts/d.py, source: { type: file } }
      - name: e
        kind: python
        code: "w = 3"
"#;
        let want = [
            (
                "/workflow/0/tool/0/script/source/code",
                "task `a` of step `start`",
                "y = 2",
            ),
            (
                "/workflow/0/tool/4/code",
                "task `e` of step `start`",
                "w = 3",
            ),
            ("/workbook/0/code", "workbook task `wb`", "x = 1"),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(p, w, c)| (p.to_string(), w.to_string(), c.to_string()))
            .collect();
        assert_eq!(codes_of(yaml), want);
    }

    #[test]
    fn without_an_interpreter_only_a_playbook_with_python_code_is_left_unchecked() {
        let yaml = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkflow:\n  - step: start\n    tool:\n      - { name: t, kind: python, code: \"x = (\" }\n";
        let none = Path::new("/nonexistent/python9");
        let loaded = noetl_core::load::load_playbook(yaml, "t.yaml").expect("loads");
        let e = check_with(none, &loaded, yaml).expect_err("no interpreter");
        assert!(matches!(e, CheckError::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/python9"), "{e}");
        let found = check_with(Path::new("python3"), &loaded, yaml).expect("checked");
        assert_eq!(
            found.errors().map(|d| d.code.as_str()).collect::<Vec<_>>(),
            ["E048"]
        );
        let noop = yaml.replace("kind: python, code: \"x = (\"", "kind: noop");
        let loaded = noetl_core::load::load_playbook(&noop, "t.yaml").expect("loads");
        assert!(check_with(none, &loaded, &noop)
            .expect("nothing to check")
            .0
            .is_empty());
    }

    #[test]
    fn workbook_tasks_by_name_are_checked_under_their_escaped_name() {
        let yaml = r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: t }
workbook:
  tasks:
    a/b: { kind: python, code: "x = (" }
    c: { kind: noop }
workflow:
  - step: start
    tool:
      - { name: call, kind: workbook, task: a/b }
"#;
        let codes = codes_of(yaml);
        let pointers: Vec<&str> = codes.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(pointers, ["/workbook/tasks/a~1b/code"]);
        assert_eq!(codes[0].1, "workbook task `a/b`");
    }

    #[test]
    fn a_block_scalars_error_is_placed_on_its_own_line() {
        let text = "tool:\n  - name: t\n    code: |\n      x = 1\n      def main(:\n";
        // The scalar's node starts at the indicator `|` (line 3, column 11).
        let at = Span {
            line: 3,
            col: 11,
            offset: 30,
        };
        let s = locate(text, at, "x = 1\ndef main(:\n", &err(2, 10));
        assert_eq!((s.line, s.col), (5, 16));
        assert_eq!(&text[s.offset..s.offset + 1], ":");
    }

    #[test]
    fn a_one_line_scalars_error_is_placed_past_its_quote() {
        let text = "    code: \"result = (1\"\n";
        let at = Span {
            line: 1,
            col: 11,
            offset: 10,
        };
        let s = locate(text, at, "result = (1", &err(1, 10));
        assert_eq!((s.line, s.col), (1, 21));
        assert_eq!(&text[s.offset..s.offset + 1], "(");
    }

    #[test]
    fn code_not_found_where_expected_keeps_the_scalars_place() {
        let at = Span {
            line: 1,
            col: 3,
            offset: 2,
        };
        let s = locate("a: b\n", at, "one\ntwo\n", &err(2, 1));
        assert_eq!(s, at);
    }
}
