//! The one entry point: YAML text → validated, normalised [`Playbook`].

use crate::codes::Code;
use std::collections::HashMap;
use std::path::Path;

use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::limits::MAX_PLAYBOOK_BYTES;
use crate::model::Playbook;
use crate::yaml::{self, Span};

/// Source positions of the normalised document, by JSON pointer.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    spans: HashMap<String, Span>,
}

impl SourceMap {
    /// The positions of every node of a (normalised) tree.
    pub fn from_tree(root: &yaml::Node) -> Self {
        let mut spans = HashMap::new();
        root.walk("", &mut |p, n| {
            spans.insert(p.to_string(), n.span);
        });
        Self { spans }
    }

    /// Number of positioned nodes.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when nothing is positioned.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Position of the node at `pointer` (e.g. `/workflow/2/tool/0/url`), or
    /// of its nearest ancestor that has one.
    pub fn lookup(&self, pointer: &str) -> Option<Span> {
        let mut p = pointer.to_string();
        loop {
            if let Some(s) = self.spans.get(&p) {
                return Some(*s);
            }
            match p.rfind('/') {
                Some(i) => p.truncate(i),
                None => return None,
            }
        }
    }
}

/// A playbook that passed validation.
#[derive(Debug, Clone)]
pub struct LoadedPlaybook {
    /// The normalised model.
    pub playbook: Playbook,
    /// Warnings (never errors).
    pub warnings: Diagnostics,
    /// Positions of the normalised nodes.
    pub source_map: SourceMap,
    /// File name or catalog path, for messages.
    pub source_name: String,
}

/// A playbook was refused. Displays one short line per diagnostic.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .diagnostics.render_short(&self.source_name))]
pub struct LoadError {
    /// File name or catalog path.
    pub source_name: String,
    /// Errors and warnings.
    pub diagnostics: Diagnostics,
    /// The source text (for rendering snippets).
    pub text: String,
}

impl LoadError {
    /// Diagnostics with source snippets and help lines.
    pub fn render_human(&self) -> String {
        self.diagnostics.render_human(&self.source_name, &self.text)
    }
}

/// Parse, validate, normalise and type a playbook.
pub fn load_playbook(source: &str, name: &str) -> Result<LoadedPlaybook, LoadError> {
    let fail = |diagnostics: Diagnostics| LoadError {
        source_name: name.to_string(),
        diagnostics,
        text: source.to_string(),
    };
    if source.len() > MAX_PLAYBOOK_BYTES {
        return Err(too_large(name, source.len() as u64));
    }
    let raw = match yaml::parse(source) {
        Ok(n) => n,
        Err(e) => {
            let mut d = Diagnostics::default();
            let (message, help) = match e.code {
                Code::E041 => (e.message, "flatten the document (docs/errors.md#e041)"),
                Code::E042 => (
                    e.message,
                    "use fewer or smaller aliases (docs/errors.md#e042)",
                ),
                _ => (
                    format!("YAML syntax: {}", e.message),
                    "fix the YAML syntax (indentation, quotes, brackets)",
                ),
            };
            d.push(Diagnostic::error(e.code, e.span, "", message).help(help));
            return Err(fail(d));
        }
    };
    let mut diags = Diagnostics::default();
    let normalized = crate::normalize::normalize(&raw, &mut diags);
    diags.extend(crate::validate::validate(&normalized));
    diags.sort();
    if diags.has_errors() {
        return Err(fail(diags));
    }
    let source_map = SourceMap::from_tree(&normalized);
    let playbook: Playbook = match serde_path_to_error::deserialize(normalized.to_json()) {
        Ok(p) => p,
        Err(e) => {
            let pointer = pointer_of(e.path());
            let span = source_map.lookup(&pointer).unwrap_or(normalized.span);
            let at = if pointer.is_empty() { "/" } else { &pointer };
            diags.push(
                Diagnostic::error(
                    Code::E004,
                    span,
                    &pointer,
                    format!("wrong shape at `{at}`: {}", e.inner()),
                )
                .help("see docs/errors.md#e004 (or `noetl schema`) for the expected shape"),
            );
            diags.sort();
            return Err(fail(diags));
        }
    };
    Ok(LoadedPlaybook {
        playbook,
        warnings: diags,
        source_map,
        source_name: name.to_string(),
    })
}

/// E040: the playbook is larger than [`MAX_PLAYBOOK_BYTES`]. The text is
/// not kept: it is what was too large.
fn too_large(name: &str, size: u64) -> LoadError {
    let mut d = Diagnostics::default();
    d.push(
        Diagnostic::error(
            Code::E040,
            Span {
                line: 1,
                col: 1,
                offset: 0,
            },
            "",
            format!(
                "the playbook is {size} bytes, above the limit `max_playbook_bytes` of {MAX_PLAYBOOK_BYTES} bytes"
            ),
        )
        .help("move data out of the playbook (workload, object storage) or split it into child playbooks"),
    );
    LoadError {
        source_name: name.to_string(),
        diagnostics: d,
        text: String::new(),
    }
}

/// A serde path (`workflow[0].tool`) as a JSON pointer (`/workflow/0/tool`).
fn pointer_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("/{index}")),
            Segment::Map { key } => {
                out.push('/');
                out.push_str(&yaml::escape(key));
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out
}

/// Read and load a playbook file. An unreadable file is an E001 error.
pub fn load_file(path: &Path) -> Result<LoadedPlaybook, LoadError> {
    let name = path.display().to_string();
    // A file above the limit is refused without reading it.
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.is_file() && meta.len() > MAX_PLAYBOOK_BYTES as u64 {
            return Err(too_large(&name, meta.len()));
        }
    }
    match std::fs::read_to_string(path) {
        Ok(src) => load_playbook(&src, &name),
        Err(e) => {
            let mut d = Diagnostics::default();
            d.push(Diagnostic::error(
                Code::E001,
                Span {
                    line: 1,
                    col: 1,
                    offset: 0,
                },
                "",
                format!("cannot read the file: {e}"),
            ));
            Err(LoadError {
                source_name: name,
                diagnostics: d,
                text: String::new(),
            })
        }
    }
}
