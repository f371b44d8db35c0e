//! Edits on the text: byte-range replacements of one text, applied
//! together, and where the lines they move went.

use noetl_core::yaml::{Node, NodeKind};

use crate::{Change, Refusal};

/// Where the lines of a run of whole lines went when an edit of pass 0
/// replaced it: `lines` (1-based, original numbering) became, in order, the
/// lines `order` names; a line left out was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineOrder {
    /// The run's first line and how many lines it had.
    pub(crate) first: usize,
    pub(crate) count: usize,
    /// The original lines of the new text of the run, in order.
    pub(crate) order: Vec<usize>,
}

impl LineOrder {
    /// For each line of the text after the edits (index `n - 1` for line
    /// `n`), its line in the text of `lines` lines before them.
    pub(crate) fn origin(lines: usize, orders: &[LineOrder]) -> Vec<usize> {
        let mut out = Vec::with_capacity(lines);
        let mut next = 1;
        let mut sorted: Vec<&LineOrder> = orders.iter().collect();
        sorted.sort_by_key(|o| o.first);
        for o in sorted {
            out.extend(next..o.first);
            out.extend(&o.order);
            next = o.first + o.count;
        }
        out.extend(next..=lines);
        out
    }
}

/// Replacements of byte ranges of one text, applied together.
pub(crate) struct Edits<'a> {
    pub(crate) text: &'a str,
    pub(crate) edits: Vec<(usize, usize, String)>,
    /// Per edit, the change it reports (`None`: part of another edit's).
    pub(crate) changes: Vec<Option<Change>>,
    /// Per edit, where its lines went when it moves or deletes lines.
    pub(crate) orders: Vec<Option<LineOrder>>,
    pub(crate) refusals: Vec<Refusal>,
}

impl<'a> Edits<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self {
            text,
            edits: Vec::new(),
            changes: Vec::new(),
            orders: Vec::new(),
            refusals: Vec::new(),
        }
    }

    pub(crate) fn replace(
        &mut self,
        range: (usize, usize),
        with: String,
        line: usize,
        summary: String,
    ) {
        self.edits.push((range.0, range.1, with));
        self.changes.push(Some(Change { line, summary }));
        self.orders.push(None);
    }

    /// A replacement of whole lines that moves or deletes some (pass 0).
    pub(crate) fn replace_lines(
        &mut self,
        range: (usize, usize),
        with: String,
        change: Change,
        order: LineOrder,
    ) {
        self.edits.push((range.0, range.1, with));
        self.changes.push(Some(change));
        self.orders.push(Some(order));
    }

    /// An edit that is part of a change another edit reports.
    pub(crate) fn replace_quietly(&mut self, range: (usize, usize), with: String) {
        self.edits.push((range.0, range.1, with));
        self.changes.push(None);
        self.orders.push(None);
    }

    pub(crate) fn refuse(&mut self, line: usize, why: String) {
        self.refusals.push(Refusal { line, why });
    }

    /// The edited text; overlapping edits keep the first and are reported.
    /// Last, for each line of the edited text, its line before the edits.
    #[allow(clippy::type_complexity)]
    pub(crate) fn apply(
        mut self,
    ) -> (
        String,
        Vec<Change>,
        Vec<Refusal>,
        Vec<LineOrder>,
        Vec<usize>,
    ) {
        let mut order: Vec<usize> = (0..self.edits.len()).collect();
        order.sort_by_key(|&i| (self.edits[i].0, self.edits[i].1));
        let mut kept: Vec<usize> = Vec::new();
        let mut end = 0;
        for i in order {
            let (s, e, _) = &self.edits[i];
            if *s < end {
                let line = line_of(self.text, *s);
                let summary = self.changes[i]
                    .as_ref()
                    .map_or_else(|| "a rewrite".to_string(), |c| c.summary.clone());
                self.refusals.push(Refusal {
                    line,
                    why: format!("{summary}: overlaps another rewrite; run `noetl migrate` again"),
                });
                continue;
            }
            end = *e;
            kept.push(i);
        }
        let mut out = self.text.to_string();
        for &i in kept.iter().rev() {
            let (s, e, with) = &self.edits[i];
            out.replace_range(*s..*e, with);
        }
        let changes = kept
            .iter()
            .filter_map(|&i| self.changes[i].clone())
            .collect();
        let replaced: Vec<crate::lines::Replaced> = kept
            .iter()
            .map(|&i| crate::lines::Replaced {
                start: self.edits[i].0,
                end: self.edits[i].1,
                with: &self.edits[i].2,
                order: self.orders[i].as_ref().map(|o| o.order.as_slice()),
            })
            .collect();
        let moved = crate::lines::origin(self.text, &replaced);
        let orders = kept
            .iter()
            .filter_map(|&i| self.orders[i].clone())
            .collect();
        (out, changes, self.refusals, orders, moved)
    }
}

/// Replace the whole mapping entry whose key is at `key_offset` (its key
/// line through its value's last line) with `with`.
pub(crate) fn replace_entry(
    e: &mut Edits,
    key_offset: usize,
    with: String,
    line: usize,
    summary: String,
) {
    let from = line_start(e.text, key_offset);
    let to = entry_end(e.text, key_offset);
    e.replace((from, to), with, line, summary);
}

/// Remove the mapping entry whose key is at `key_offset`, as part of a
/// change another edit reports.
pub(crate) fn remove_entry(e: &mut Edits, key_offset: usize) {
    let from = line_start(e.text, key_offset);
    let to = entry_end(e.text, key_offset);
    e.replace_quietly((from, to), String::new());
}

/// 1-based line of byte `offset`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Byte offset of the start of the line holding `offset`.
pub(crate) fn line_start(text: &str, offset: usize) -> usize {
    text[..offset].rfind('\n').map_or(0, |i| i + 1)
}

/// Byte offset just past the line holding `offset` (after its `\n`).
pub(crate) fn next_line(text: &str, offset: usize) -> usize {
    text[offset..]
        .find('\n')
        .map_or(text.len(), |i| offset + i + 1)
}

/// Leading spaces of the line starting at `start`.
pub(crate) fn indent_at(text: &str, start: usize) -> usize {
    text[start..].bytes().take_while(|b| *b == b' ').count()
}

/// Byte offset where the mapping entry whose key is at `key_offset` ends:
/// the start of the first later line that is neither blank, nor a comment,
/// nor indented deeper than the key (its value's last line included).
pub(crate) fn entry_end(text: &str, key_offset: usize) -> usize {
    let key_indent = key_offset - line_start(text, key_offset);
    // `key:` with its value on the next lines may hold a sequence written
    // at the key's own indentation (`libs:` / `- x`): those items belong
    // to the entry.
    let key_line = &text[key_offset..next_line(text, key_offset)];
    let block_value = key_line
        .split_once(':')
        .is_some_and(|(_, v)| v.trim().is_empty() || v.trim_start().starts_with('#'));
    let mut at = next_line(text, key_offset);
    let mut end = at;
    while at < text.len() {
        let line = &text[at..next_line(text, at)];
        let body = line.trim_start_matches(' ');
        let blank = body.trim().is_empty() || body.starts_with('#');
        let indent = line.len() - body.len();
        let same_level_item = block_value
            && indent == key_indent
            && (body.starts_with("- ") || body.trim_end() == "-");
        if !blank && indent <= key_indent && !same_level_item {
            break;
        }
        at = next_line(text, at);
        if !blank {
            end = at;
        }
    }
    end
}

/// The lines `[from, to)` with `by` more spaces of indentation.
pub(crate) fn indent_lines(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.split_inclusive('\n')
        .map(|l| {
            if l.trim().is_empty() {
                l.to_string()
            } else {
                format!("{pad}{l}")
            }
        })
        .collect()
}

/// The end of the flow collection that starts at `open` (`{` or `[`),
/// just past its closing bracket; quotes are skipped.
pub(crate) fn flow_end(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let bytes = text.as_bytes();
    let mut i = open;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == q => quote = None,
            Some(b'"') if b == b'\\' => i += 1,
            Some(_) => {}
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            },
        }
        i += 1;
    }
    None
}

/// The source text of the value of the entry whose key is at `key_offset`
/// and whose value is `value`: what follows `key:` on the key's line (a
/// flow value or scalar), or the block lines below it.
pub(crate) fn value_text<'t>(text: &'t str, key_offset: usize, value: &Node) -> &'t str {
    let key_line_end = next_line(text, key_offset);
    if value.span.offset < key_line_end {
        let start = value.span.offset;
        let end = match value.kind {
            NodeKind::Map(_) | NodeKind::Seq(_) => flow_end(text, start).unwrap_or(key_line_end),
            _ => key_line_end,
        };
        text[start..end].trim_end()
    } else {
        &text[key_line_end..entry_end(text, key_offset)]
    }
}

/// Rename the key at `key` (whose text is `from`) to `to`.
pub(crate) fn rename(e: &mut Edits, key: &noetl_core::yaml::Key, to: &str, summary: String) {
    let at = key.span.offset;
    if e.text[at..].starts_with(key.name.as_str()) {
        let line = key.span.line;
        e.replace((at, at + key.name.len()), to.to_string(), line, summary);
    } else {
        e.refuse(
            key.span.line,
            format!("{summary}: the key is quoted; rename it by hand"),
        );
    }
}
