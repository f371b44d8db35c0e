//! Diagnostics: a stable code, a one-line message, a help line and a source
//! position, rendered for people (with the source line and a caret), in one
//! line (`file:line:col: error[E022]: ...`) or as JSON for tools. Each code
//! has a short page in `docs/errors.md`.

use crate::codes::Code;
use serde::Serialize;

use crate::yaml::Span;

/// Error or warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Refuses the playbook.
    Error,
    /// Worth a look; the playbook runs.
    Warning,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// Stable code (`E022`, `W101`...).
    pub code: Code,
    /// One line: what is wrong.
    pub message: String,
    /// One line: how to fix it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
    /// Where (absent only when the document has no position to offer).
    #[serde(skip)]
    pub span: Option<Span>,
    /// JSON pointer of the offending node.
    pub path: String,
}

impl Diagnostic {
    /// An error.
    pub fn error(code: Code, span: Span, path: &str, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            code,
            message: message.into(),
            help: None,
            span: Some(span),
            path: path.to_string(),
        }
    }

    /// A warning.
    pub fn warning(code: Code, span: Span, path: &str, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(code, span, path, message)
        }
    }

    /// Attach a help line.
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    fn label(&self) -> &'static str {
        match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }

    /// `file:line:col: error[CODE]: message`.
    pub fn short(&self, file: &str) -> String {
        let (l, c) = self.span.map(|s| (s.line, s.col)).unwrap_or((1, 1));
        format!(
            "{file}:{l}:{c}: {}[{}]: {}",
            self.label(),
            self.code,
            self.message
        )
    }

    /// The short line, the source line with a caret, and the help.
    pub fn human(&self, file: &str, source: &str) -> String {
        self.human_styled(file, source, false)
    }

    /// [`Diagnostic::human`], with ANSI colours when `color` is true (for
    /// terminals).
    pub fn human_styled(&self, file: &str, source: &str, color: bool) -> String {
        let paint = |code: &str, text: &str| {
            if color {
                format!("\x1b[{code}m{text}\x1b[0m")
            } else {
                text.to_string()
            }
        };
        let accent = match self.severity {
            Severity::Error => "1;31",
            Severity::Warning => "1;33",
        };
        let (l, c) = self.span.map(|s| (s.line, s.col)).unwrap_or((1, 1));
        let mut out = format!(
            "{}: {}: {}",
            paint("1", &format!("{file}:{l}:{c}")),
            paint(accent, &format!("{}[{}]", self.label(), self.code)),
            paint("1", &self.message)
        );
        if let Some(span) = self.span {
            if let Some(line) = source.lines().nth(span.line.saturating_sub(1)) {
                let num = span.line.to_string();
                let pad = " ".repeat(num.len());
                let caret_pad: String = line
                    .chars()
                    .take(span.col.saturating_sub(1))
                    .map(|c| if c == '\t' { '\t' } else { ' ' })
                    .collect();
                let bar = paint("1;34", "|");
                out.push_str(&format!(
                    "\n{pad} {bar}\n{} {bar} {line}\n{pad} {bar} {caret_pad}{}",
                    paint("1;34", &num),
                    paint(accent, "^")
                ));
            }
        }
        if let Some(h) = &self.help {
            out.push_str(&format!("\n  = {}: {h}", paint("1;36", "help")));
        }
        out
    }

    /// JSON object for tools.
    pub fn json(&self, file: &str) -> serde_json::Value {
        let (l, c) = self.span.map(|s| (s.line, s.col)).unwrap_or((1, 1));
        serde_json::json!({
            "file": file, "line": l, "column": c,
            "severity": self.severity, "code": self.code,
            "message": self.message, "help": self.help, "path": self.path,
        })
    }
}

/// A set of diagnostics, in source order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Extend<Diagnostic> for Diagnostics {
    fn extend<I: IntoIterator<Item = Diagnostic>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Diagnostics {
    /// Add one.
    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }
    /// The distinct codes, in order of first appearance.
    pub fn codes(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for d in &self.0 {
            if !out.contains(&d.code.as_str()) {
                out.push(d.code.as_str());
            }
        }
        out
    }
    /// True if any is an error.
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(|d| d.severity == Severity::Error)
    }
    /// The errors.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| d.severity == Severity::Error)
    }
    /// The warnings.
    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| d.severity == Severity::Warning)
    }
    /// All of them.
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }
    /// Number of findings.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Sort by position, errors first on the same position; drop exact repeats.
    pub fn sort(&mut self) {
        self.0.sort_by_key(|d| (d.span, d.severity, d.code));
        self.0.dedup();
    }
    /// One line each.
    pub fn render_short(&self, file: &str) -> String {
        self.0
            .iter()
            .map(|d| d.short(file))
            .collect::<Vec<_>>()
            .join("\n")
    }
    /// For people: each with its source line and help.
    pub fn render_human(&self, file: &str, source: &str) -> String {
        self.render_human_styled(file, source, false)
    }
    /// [`Diagnostics::render_human`], with ANSI colours when `color` is true.
    pub fn render_human_styled(&self, file: &str, source: &str, color: bool) -> String {
        self.0
            .iter()
            .map(|d| d.human_styled(file, source, color))
            .collect::<Vec<_>>()
            .join("\n\n")
    }
    /// JSON array.
    pub fn render_json(&self, file: &str) -> serde_json::Value {
        serde_json::Value::Array(self.0.iter().map(|d| d.json(file)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_short_human_and_json() {
        let d = Diagnostic::error(
            Code::E022,
            Span {
                line: 2,
                col: 5,
                offset: 0,
            },
            "/x",
            "bad jump",
        )
        .help("name a task");
        assert_eq!(d.short("p.yaml"), "p.yaml:2:5: error[E022]: bad jump");
        let h = d.human("p.yaml", "a: 1\nb:  x\n");
        assert!(
            h.contains("2 | b:  x") && h.contains("|     ^") && h.contains("help: name a task"),
            "{h}"
        );
        assert_eq!(d.json("p.yaml")["line"], 2);
    }

    #[test]
    fn colour_only_adds_escapes_and_json_has_every_field() {
        let span = Span {
            line: 1,
            col: 4,
            offset: 3,
        };
        let d = Diagnostic::warning(Code::W102, span, "/workflow/1", "unreachable");
        let plain = d.human_styled("p.yaml", "a: b\n", false);
        assert_eq!(plain, d.human("p.yaml", "a: b\n"));
        assert_eq!(
            plain,
            "p.yaml:1:4: warning[W102]: unreachable\n  |\n1 | a: b\n  |    ^"
        );
        let coloured = d.human_styled("p.yaml", "a: b\n", true);
        assert!(
            coloured.contains("\x1b[1;33mwarning[W102]\x1b[0m"),
            "{coloured}"
        );
        let stripped = coloured
            .split("\x1b[")
            .enumerate()
            .map(|(i, part)| {
                if i == 0 {
                    part
                } else {
                    part.split_once('m').map(|(_, r)| r).unwrap_or(part)
                }
            })
            .collect::<String>();
        assert_eq!(stripped, plain);
        let j = d.json("p.yaml");
        for k in [
            "file", "line", "column", "severity", "code", "message", "help", "path",
        ] {
            assert!(j.get(k).is_some(), "{k} missing in {j}");
        }
        assert_eq!(j["severity"], "warning");
        assert!(j["help"].is_null());
    }

    #[test]
    fn sort_orders_by_position_and_codes_are_distinct() {
        let at = |line| Span {
            line,
            col: 1,
            offset: 0,
        };
        let mut ds = Diagnostics::default();
        ds.push(Diagnostic::warning(Code::W102, at(5), "", "b"));
        ds.push(Diagnostic::error(Code::E030, at(2), "", "a"));
        ds.push(Diagnostic::error(Code::E030, at(2), "", "a"));
        ds.sort();
        assert_eq!(ds.len(), 2);
        assert_eq!(ds.codes(), vec!["E030", "W102"]);
        assert!(ds.has_errors());
        assert_eq!(ds.render_short("f").lines().count(), 2);
    }
}
