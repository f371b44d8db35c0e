//! A registration written in NoETL's dialect: the server applies the
//! `noetl migrate` rewrite (`noetl_migrate`, docs/migrate.md) and
//! stores what it makes, with the text as sent beside it; the rewrite's
//! changes come back as warnings. A playbook the rewrite leaves unchanged
//! is loaded as written.

use noetl_core::diagnostic::Diagnostics;
use noetl_core::load::{load_playbook, LoadError, LoadedPlaybook};
use noetl_migrate::{migrate, Migration};

use crate::error::ApiError;

/// A playbook that loads, ready to store.
#[derive(Debug)]
pub struct Prepared {
    /// The text to store: the migrated text when the rewrite changed it.
    pub text: String,
    /// The text as sent, when `text` is its migration.
    pub original: Option<String>,
    /// What the loader made of `text`.
    pub loaded: LoadedPlaybook,
    /// What the rewrite changed (`<name>:<line>: migrated: ...`), what it
    /// left (`refused: ...`), then the loader's warnings; lines are those
    /// of the text as sent.
    pub warnings: Vec<String>,
}

/// Load `text` (named `name` in messages), first rewritten by
/// `noetl migrate` unless `migrate` is false. A playbook that still does
/// not load, or whose python code does not compile (E048: an interpreter
/// is run, so call it off the async runtime's threads), is a 422 with
/// `noetl validate`'s diagnostics, at the lines of the text as sent, and
/// the rewrite's `refused:` lines.
pub fn prepare(text: &str, name: &str, migrate_it: bool) -> Result<Prepared, ApiError> {
    // Not YAML: the loader says where, as `noetl validate` does.
    let m = migrate_it.then(|| migrate(text).ok()).flatten();
    let (m, refused) = match m {
        Some(m) if m.text != text => (Some(m), Vec::new()),
        Some(m) => (None, refused_lines(&m, name)),
        None => (None, Vec::new()),
    };
    let Some(m) = m else {
        let loaded = load_playbook(text, name).map_err(|e| refusal(&e, &refused, None, text))?;
        let unchecked = compiled(&loaded, &refused, None, text)?;
        let warnings = refused
            .into_iter()
            .chain(loaded.warnings.iter().map(|d| d.short(name)))
            .chain(unchecked)
            .collect();
        return Ok(Prepared {
            text: text.to_string(),
            original: None,
            loaded,
            warnings,
        });
    };
    let refused = refused_lines(&m, name);
    let loaded = load_playbook(&m.text, name).map_err(|e| refusal(&e, &refused, Some(&m), text))?;
    let unchecked = compiled(&loaded, &refused, Some(&m), text)?;
    let mut lines: Vec<(usize, String)> = m
        .changes
        .iter()
        .map(|c| {
            (
                c.line,
                format!("{name}:{}: migrated: {}", c.line, c.summary),
            )
        })
        .chain(
            m.refusals
                .iter()
                .map(|r| (r.line, format!("{name}:{}: refused: {}", r.line, r.why))),
        )
        .collect();
    lines.sort_by_key(|(l, _)| *l);
    let warnings = m
        .diagnostics_as_written(&loaded.warnings, text)
        .iter()
        .map(|d| d.short(name))
        .collect::<Vec<_>>();
    Ok(Prepared {
        original: Some(text.to_string()),
        text: m.text,
        loaded,
        warnings: (lines.into_iter().map(|(_, l)| l))
            .chain(warnings)
            .chain(unchecked)
            .collect(),
    })
}

/// The python tasks' inline code of `loaded` compiled as the python
/// executor compiles it (E048, [`noetl_tool_python::playbook::check`]): a
/// 422 as for a playbook that does not load when some does not compile; a
/// warning when no interpreter could check it (this server's `NOETL_PYTHON`,
/// else `python3`, is not there).
fn compiled(
    loaded: &LoadedPlaybook,
    refused: &[String],
    m: Option<&Migration>,
    sent: &str,
) -> Result<Option<String>, ApiError> {
    let text = m.map_or(sent, |m| m.text.as_str());
    match noetl_tool_python::playbook::check(loaded, text) {
        Ok(d) if d.has_errors() => {
            let e = LoadError {
                source_name: loaded.source_name.clone(),
                diagnostics: d,
                text: text.to_string(),
            };
            Err(refusal(&e, refused, m, sent))
        }
        Ok(_) => Ok(None),
        Err(e) => Ok(Some(format!(
            "{}: python code not checked (E048): {e}",
            loaded.source_name
        ))),
    }
}

/// The rewrite's `refused:` lines, as `<name>:<line>: refused: ...`.
fn refused_lines(m: &Migration, name: &str) -> Vec<String> {
    m.refusals
        .iter()
        .map(|r| format!("{name}:{}: refused: {}", r.line, r.why))
        .collect()
}

/// The 422 of a playbook that does not load: one line per finding (the
/// rewrite's refusals first), and the findings as `noetl validate
/// --format json` gives them, placed in the text as sent.
fn refusal(e: &LoadError, refused: &[String], m: Option<&Migration>, sent: &str) -> ApiError {
    let diagnostics: Diagnostics = match m {
        Some(m) => m.diagnostics_as_written(&e.diagnostics, sent),
        None => e.diagnostics.clone(),
    };
    let mut message: Vec<String> = refused.to_vec();
    message.push(diagnostics.render_short(&e.source_name));
    if m.is_some() {
        message.push(format!(
            "{}: in NoETL's dialect; what `noetl migrate` could not make canonical is above",
            e.source_name
        ));
    }
    ApiError::Validation {
        message: message.join("\n"),
        diagnostics: Some(diagnostics.render_json(&e.source_name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANONICAL: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: hello\n  path: t/hello\nworkflow:\n  - step: start\n    tool:\n      - name: t\n        kind: noop\n";

    /// NoETL's spellings: a task's `input`, a workload value read bare.
    const NOETL: &str = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata:\n  name: legacy\n  path: t/legacy\nworkload:\n  who: Ada\nworkflow:\n  - step: start\n    tool:\n      - name: greet\n        kind: python\n        input:\n          who: \"{{ who }}\"\n        code: |\n          result = who\n";

    #[test]
    fn a_canonical_playbook_is_stored_as_written() {
        let p = prepare(CANONICAL, "<request>", true).unwrap();
        assert_eq!(p.text, CANONICAL);
        assert_eq!(p.original, None);
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }

    #[test]
    fn a_noetl_playbook_is_migrated_and_keeps_what_was_sent() {
        let p = prepare(NOETL, "<request>", true).unwrap();
        assert_eq!(p.original.as_deref(), Some(NOETL));
        assert!(p.text.contains("args:"), "{}", p.text);
        assert!(p.text.contains("{{ workload.who }}"), "{}", p.text);
        assert!(
            p.warnings
                .iter()
                .any(|w| w.starts_with("<request>:13: migrated: ") && w.contains("`args`")),
            "{:?}",
            p.warnings
        );
        // Migrating again changes nothing: the stored text is canonical.
        let again = prepare(&p.text, "<request>", true).unwrap();
        assert_eq!(again.original, None);
        // `migrate: false` takes it as written, and refuses it.
        let e = prepare(NOETL, "<request>", false).unwrap_err();
        assert!(e.to_string().contains("E005"), "{e}");
    }

    #[test]
    fn what_the_rewrite_cannot_fix_is_refused_at_the_line_sent() {
        // `input` is migrated; the unknown kind on line 12 remains.
        let bad = NOETL.replace("kind: python", "kind: pyhton");
        let e = prepare(&bad, "<request>", true).unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
        assert!(e.to_string().contains("<request>:12:"), "{e}");
        let ApiError::Validation {
            diagnostics: Some(d),
            ..
        } = e
        else {
            panic!("diagnostics expected")
        };
        let first = &d[0];
        assert_eq!(
            (first["code"].as_str(), first["line"].as_u64()),
            (Some("E006"), Some(12))
        );
    }

    #[test]
    fn python_code_that_does_not_compile_is_refused_at_the_line_sent() {
        // Canonical: line 13 holds the error.
        let bad = CANONICAL.replace(
            "kind: noop\n",
            "kind: python\n        code: |\n          x = 1\n          def main(:\n",
        );
        let e = prepare(&bad, "<request>", true).unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
        assert!(
            e.to_string().contains("<request>:13:20: error[E048]"),
            "{e}"
        );
        // Migrated first (`input` becomes `args`): still the line as sent.
        let bad = NOETL.replace("result = who", "result = (who");
        let e = prepare(&bad, "<request>", true).unwrap_err();
        let ApiError::Validation {
            diagnostics: Some(d),
            ..
        } = e
        else {
            panic!("diagnostics expected")
        };
        assert_eq!(
            (d[0]["code"].as_str(), d[0]["line"].as_u64()),
            (Some("E048"), Some(16))
        );
        // Code that compiles is taken.
        assert!(prepare(NOETL, "<request>", true).is_ok());
    }

    #[test]
    fn not_yaml_is_refused_with_the_loaders_position() {
        let e = prepare("a: [1, 2\n", "<request>", true).unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
        assert!(e.to_string().contains("<request>:"), "{e}");
    }
}
