//! `noetl migrate`: legacy NoETL playbooks rewritten into canonical v10
//! (docs/migrate.md has the table of constructs).
//!
//! The rewrite edits the YAML *text* where each construct is, found through
//! the positioned tree ([`crate::yaml`]), so comments, key order, quoting
//! and everything not migrated stay as written. It runs in five passes,
//! each on a fresh parse of the previous one's output: NoETL's nestings
//! undone (a workbook task's `tool:`, then tool fields under `spec`; these
//! move and delete lines and say where each went), key renames, template
//! rewrites, then structural rewrites (which add lines). Every change is
//! reported at its line in the original file. What cannot be rewritten
//! safely is left as written and reported as a [`Refusal`] naming why.

use std::collections::BTreeSet;

use crate::yaml::{Node, NodeKind};

mod keychain;
mod lines;
mod shapes;
mod tool_fields;
pub(crate) use tool_fields::hint as tool_field_hint;

/// One rewrite, at its line of the original file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// 1-based line.
    pub line: usize,
    /// What was rewritten, e.g. "task `t`: `input` → `args`".
    pub summary: String,
}

/// A legacy construct left as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 1-based line.
    pub line: usize,
    /// Why, and what to write instead.
    pub why: String,
}

/// The result of [`migrate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The rewritten text (the input when nothing changed).
    pub text: String,
    /// Every rewrite, in file order.
    pub changes: Vec<Change>,
    /// What was left as written, in file order.
    pub refusals: Vec<Refusal>,
    /// For each line of `text` (index `n - 1` for line `n`), its line in
    /// the file as written.
    lines: Vec<usize>,
}

impl Migration {
    /// Every change and refusal as `(line, text)` in file order; a
    /// refusal's text starts with `refused: `.
    pub fn report(&self) -> Vec<(usize, String)> {
        let mut lines: Vec<(usize, String)> = self
            .changes
            .iter()
            .map(|c| (c.line, c.summary.clone()))
            .chain(
                self.refusals
                    .iter()
                    .map(|r| (r.line, format!("refused: {}", r.why))),
            )
            .collect();
        lines.sort_by_key(|(l, _)| *l);
        lines
    }

    /// The line of the file as written that line `line` of the migrated
    /// text comes from (a line a rewrite wrote: the line it replaced), so
    /// a diagnostic of the migrated text can name the line the user wrote.
    pub fn original_line(&self, line: usize) -> usize {
        self.lines
            .get(line.wrapping_sub(1))
            .copied()
            .unwrap_or_else(|| line.min(self.lines.last().copied().unwrap_or(line)))
    }
}

/// Why a file cannot be migrated at all.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// It is not YAML (or not one the loader reads).
    #[error("{line}:{col}: {message}")]
    Yaml {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong.
        message: String,
    },
}

/// Rewrite the legacy constructs of the playbook `src`.
pub fn migrate(src: &str) -> Result<Migration, MigrateError> {
    let mut m = Migration {
        text: src.to_string(),
        changes: Vec::new(),
        refusals: Vec::new(),
        lines: (1..=src.lines().count()).collect(),
    };
    // Passes 0 and 1 (NoETL's nesting undone: workbook tasks' `tool:`,
    // then tool fields under `spec` and an artifact's `input`) delete and
    // move lines, saying which ([`LineOrder`]); every pass reports its
    // lines in the original file through `origin`.
    // A workbook task's `tool:` is unwrapped before its `spec` is read.
    let passes: [fn(&Node, &mut Edits); 5] = [
        shapes::unwrap,
        shapes::unnest,
        renames,
        templates,
        structure,
    ];
    let mut origin: Option<Vec<usize>> = None;
    for (i, pass) in passes.into_iter().enumerate() {
        let root = crate::yaml::parse(&m.text).map_err(|e| MigrateError::Yaml {
            line: e.span.line,
            col: e.span.col,
            message: e.message,
        })?;
        let mut edits = Edits::new(&m.text);
        pass(&root, &mut edits);
        let lines = m.text.lines().count();
        let (text, mut changes, mut refusals, orders, moved) = edits.apply();
        m.lines = lines::compose(&m.lines, &moved);
        let to_original = |line: usize| match &origin {
            Some(o) => o.get(line - 1).copied().unwrap_or(line),
            None => line,
        };
        for c in &mut changes {
            c.line = to_original(c.line);
        }
        for r in &mut refusals {
            r.line = to_original(r.line);
        }
        if i < 2 {
            let moved = LineOrder::origin(lines, &orders);
            origin = Some(match &origin {
                None => moved,
                Some(before) => moved
                    .iter()
                    .map(|&l| before.get(l - 1).copied().unwrap_or(l))
                    .collect(),
            });
        }
        m.text = text;
        m.changes.extend(changes);
        m.refusals.extend(refusals);
    }
    m.changes.sort_by_key(|c| c.line);
    m.refusals.sort_by_key(|r| r.line);
    Ok(m)
}

// ---------------------------------------------------------------------------
// Edits on the text
// ---------------------------------------------------------------------------

/// Where the lines of a run of whole lines went when an edit of pass 0
/// replaced it: `lines` (1-based, original numbering) became, in order, the
/// lines `order` names; a line left out was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LineOrder {
    /// The run's first line and how many lines it had.
    first: usize,
    count: usize,
    /// The original lines of the new text of the run, in order.
    order: Vec<usize>,
}

impl LineOrder {
    /// For each line of the text after the edits (index `n - 1` for line
    /// `n`), its line in the text of `lines` lines before them.
    fn origin(lines: usize, orders: &[LineOrder]) -> Vec<usize> {
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
struct Edits<'a> {
    text: &'a str,
    edits: Vec<(usize, usize, String)>,
    /// Per edit, the change it reports (`None`: part of another edit's).
    changes: Vec<Option<Change>>,
    /// Per edit, where its lines went when it moves or deletes lines.
    orders: Vec<Option<LineOrder>>,
    refusals: Vec<Refusal>,
}

impl<'a> Edits<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            text,
            edits: Vec::new(),
            changes: Vec::new(),
            orders: Vec::new(),
            refusals: Vec::new(),
        }
    }

    fn replace(&mut self, range: (usize, usize), with: String, line: usize, summary: String) {
        self.edits.push((range.0, range.1, with));
        self.changes.push(Some(Change { line, summary }));
        self.orders.push(None);
    }

    /// A replacement of whole lines that moves or deletes some (pass 0).
    fn replace_lines(
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
    fn replace_quietly(&mut self, range: (usize, usize), with: String) {
        self.edits.push((range.0, range.1, with));
        self.changes.push(None);
        self.orders.push(None);
    }

    fn refuse(&mut self, line: usize, why: String) {
        self.refusals.push(Refusal { line, why });
    }

    /// The edited text; overlapping edits keep the first and are reported.
    /// Last, for each line of the edited text, its line before the edits.
    #[allow(clippy::type_complexity)]
    fn apply(
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
        let replaced: Vec<lines::Replaced> = kept
            .iter()
            .map(|&i| lines::Replaced {
                start: self.edits[i].0,
                end: self.edits[i].1,
                with: &self.edits[i].2,
                order: self.orders[i].as_ref().map(|o| o.order.as_slice()),
            })
            .collect();
        let moved = lines::origin(self.text, &replaced);
        let orders = kept
            .iter()
            .filter_map(|&i| self.orders[i].clone())
            .collect();
        (out, changes, self.refusals, orders, moved)
    }
}

/// Replace the whole mapping entry whose key is at `key_offset` (its key
/// line through its value's last line) with `with`.
fn replace_entry(e: &mut Edits, key_offset: usize, with: String, line: usize, summary: String) {
    let from = line_start(e.text, key_offset);
    let to = entry_end(e.text, key_offset);
    e.replace((from, to), with, line, summary);
}

/// Remove the mapping entry whose key is at `key_offset`, as part of a
/// change another edit reports.
fn remove_entry(e: &mut Edits, key_offset: usize) {
    let from = line_start(e.text, key_offset);
    let to = entry_end(e.text, key_offset);
    e.replace_quietly((from, to), String::new());
}

/// 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Byte offset of the start of the line holding `offset`.
fn line_start(text: &str, offset: usize) -> usize {
    text[..offset].rfind('\n').map_or(0, |i| i + 1)
}

/// Byte offset just past the line holding `offset` (after its `\n`).
fn next_line(text: &str, offset: usize) -> usize {
    text[offset..]
        .find('\n')
        .map_or(text.len(), |i| offset + i + 1)
}

/// Leading spaces of the line starting at `start`.
fn indent_at(text: &str, start: usize) -> usize {
    text[start..].bytes().take_while(|b| *b == b' ').count()
}

/// Byte offset where the mapping entry whose key is at `key_offset` ends:
/// the start of the first later line that is neither blank, nor a comment,
/// nor indented deeper than the key (its value's last line included).
fn entry_end(text: &str, key_offset: usize) -> usize {
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
fn indent_lines(text: &str, by: usize) -> String {
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
fn flow_end(text: &str, open: usize) -> Option<usize> {
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
fn value_text<'t>(text: &'t str, key_offset: usize, value: &Node) -> &'t str {
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

// ---------------------------------------------------------------------------
// Walking the playbook
// ---------------------------------------------------------------------------

/// Every task mapping of the playbook (pipeline tasks, label-keyed ones,
/// workbook tasks), with its name for messages.
/// The tasks of a step's `tool` (a task, or a list of tasks, each maybe
/// written `- label: {kind: ...}`), with their names.
fn step_tasks(step: &Node) -> Vec<(&Node, String)> {
    let Some(tool) = step.get("tool") else {
        return Vec::new();
    };
    let list: Vec<&Node> = match &tool.kind {
        NodeKind::Seq(items) => items.iter().collect(),
        NodeKind::Map(_) => vec![tool],
        _ => Vec::new(),
    };
    list.into_iter()
        .enumerate()
        .map(|(i, t)| match t.entries() {
            [(label, body)] if body.is_map() => (body, label.name.clone()),
            _ => (t, name_of(t, i)),
        })
        .collect()
}

/// Workbook tasks by name.
fn workbook_task_nodes(root: &Node) -> Vec<(&Node, String)> {
    let mut out = Vec::new();
    if let Some(wb) = root.get("workbook") {
        let list = wb.get("tasks").unwrap_or(wb);
        match &list.kind {
            NodeKind::Seq(items) => {
                for (i, t) in items.iter().enumerate() {
                    out.push((t, name_of(t, i)));
                }
            }
            NodeKind::Map(entries) => {
                for (k, t) in entries {
                    out.push((t, k.name.clone()));
                }
            }
            _ => {}
        }
    }
    out
}

/// Every task: the steps' tasks, then the workbook's.
fn tasks(root: &Node) -> Vec<(&Node, String)> {
    let mut out: Vec<(&Node, String)> = root
        .get("workflow")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .flat_map(step_tasks)
        .collect();
    out.extend(workbook_task_nodes(root));
    out
}

fn name_of(t: &Node, i: usize) -> String {
    t.get("name")
        .and_then(Node::as_str)
        .map_or_else(|| format!("#{}", i + 1), str::to_string)
}

fn steps(root: &Node) -> impl Iterator<Item = (&Node, &str)> {
    root.get("workflow")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .map(|s| (s, s.get("step").and_then(Node::as_str).unwrap_or("?")))
}

/// Every rule of the playbook (task policy rules and admission rules).
fn rules(root: &Node) -> Vec<&Node> {
    let mut out = Vec::new();
    for (t, _) in tasks(root) {
        if let Some(r) = t.pointer("/spec/policy/rules") {
            out.extend(r.items());
        }
    }
    for (s, _) in steps(root) {
        if let Some(r) = s.pointer("/spec/policy/admit/rules") {
            out.extend(r.items());
        }
    }
    out
}

/// The arcs of every step.
fn arcs(root: &Node) -> Vec<&Node> {
    steps(root)
        .filter_map(|(s, _)| s.get("next"))
        .filter_map(|n| n.get("arcs"))
        .flat_map(Node::items)
        .collect()
}

// ---------------------------------------------------------------------------
// Pass 2: key renames
// ---------------------------------------------------------------------------

/// Rename the key at `key` (whose text is `from`) to `to`.
fn rename(e: &mut Edits, key: &crate::yaml::Key, to: &str, summary: String) {
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

fn renames(root: &Node, e: &mut Edits) {
    for (t, name) in tasks(root) {
        let kind = t.get("kind").and_then(Node::as_str);
        for (k, _) in t.entries() {
            match k.name.as_str() {
                "input" | "inputs" => {
                    let takes_args = kind
                        .and_then(crate::tool::kind)
                        .is_some_and(|k| k.fields.iter().any(|f| f.name == "args"));
                    if takes_args || kind.is_none() || kind == Some("workbook") {
                        rename(
                            e,
                            k,
                            "args",
                            format!("task `{name}`: `{}` → `args`", k.name),
                        );
                    } else {
                        e.refuse(k.span.line, format!("task `{name}`: `{}` on a {} task has no canonical field; move its values into the fields of docs/tools.md", k.name, kind.unwrap_or("?")));
                    }
                }
                "type" if t.get("kind").is_none() => {
                    rename(e, k, "kind", format!("task `{name}`: `type` → `kind`"));
                }
                // NoETL v1 names a workbook task's kind `tool: python`.
                "tool"
                    if t.get("kind").is_none()
                        && t.get("type").is_none()
                        && t.get("tool").and_then(Node::as_str).is_some() =>
                {
                    rename(e, k, "kind", format!("task `{name}`: `tool` → `kind`"));
                }
                _ => {}
            }
        }
    }
    for rule in rules(root) {
        if let Some((k, _)) = rule.entry("expr") {
            rename(e, k, "when", "rule: `expr` → `when`".into());
        }
    }
    shapes::renames(root, e);
    tool_fields::renames(root, e);
    for arc in arcs(root) {
        for old in ["expr", "cond", "condition"] {
            if let Some((k, _)) = arc.entry(old) {
                if arc.get("when").is_none() {
                    rename(e, k, "when", format!("arc: `{old}` → `when`"));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Pass 3: templates
// ---------------------------------------------------------------------------

/// Where a template is, which decides what `output` means there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place<'a> {
    /// Task policy (or a legacy task `set`): `output` is the outcome.
    Policy,
    /// A legacy step- or task-level `set`, which becomes a rule of the
    /// (last) task's policy: as in `Policy`, and the step's or task's own
    /// result, read by its name (`{{ fetch.rows }}` in step `fetch`), is the
    /// outcome's (`outcome.result.rows`): the rule runs before the step ends.
    OwnSet(&'a str),
    /// An arc: `output` is the boundary event.
    Arc,
    /// Anywhere else: `output` has no canonical meaning.
    Other,
}

/// What the template rewrite needs to know of the playbook.
#[derive(Clone)]
struct Names {
    /// Inside a loop step: its iterator's name (NoETL reads the element
    /// bare, `{{ item.id }}`; canonical `{{ iter.item.id }}`).
    iterator: Option<String>,
    /// Keys of the root `workload` (read bare in legacy templates).
    workload: BTreeSet<String>,
    /// Step and task names, and runtime variables: never rewritten.
    shadowing: BTreeSet<String>,
}

fn templates(root: &Node, e: &mut Edits) {
    let mut shadowing: BTreeSet<String> = crate::template::RUNTIME_VARIABLES
        .iter()
        .map(|s| s.to_string())
        .collect();
    crate::names::collect_names(root, &mut shadowing);
    let names = Names {
        iterator: None,
        workload: root
            .get("workload")
            .map(|w| w.entries().iter().map(|(k, _)| k.name.clone()).collect())
            .unwrap_or_default(),
        shadowing,
    };
    for (step, step_name) in steps(root) {
        // In the step's tasks (and its `set`, which joins a task's policy)
        // the loop's element is `iter.<iterator>`.
        let in_loop = Names {
            iterator: step
                .get("loop")
                .and_then(|l| l.get("iterator"))
                .and_then(Node::as_str)
                .map(str::to_string),
            ..names.clone()
        };
        for (k, v) in step.entries() {
            let (place, names) = match k.name.as_str() {
                "next" => (Place::Arc, &names),
                // A step-level `set` becomes its last task's policy rule.
                "set" | "set_ctx" => (Place::OwnSet(step_name), &in_loop),
                _ => (Place::Other, &names),
            };
            if k.name == "tool" {
                continue; // tasks below, with their own places
            }
            walk_templates(v, place, names, e);
        }
        for (t, task_name) in step_tasks(step) {
            task_templates(t, &task_name, &in_loop, e);
        }
    }
    for (t, task_name) in workbook_task_nodes(root) {
        task_templates(t, &task_name, &names, e);
    }
}

fn task_templates(t: &Node, task_name: &str, names: &Names, e: &mut Edits) {
    let python = t.get("kind").and_then(Node::as_str) == Some("python");
    for (k, v) in t.entries() {
        if python && k.name == "code" {
            continue; // raw: Python, not a template
        }
        let place = match k.name.as_str() {
            "spec" => Place::Policy,
            "set" => Place::OwnSet(task_name),
            _ => Place::Other,
        };
        walk_templates(v, place, names, e);
    }
}

fn walk_templates(n: &Node, place: Place<'_>, names: &Names, e: &mut Edits) {
    match &n.kind {
        NodeKind::Str(s) if crate::template::is_template(s) => {
            rewrite_scalar(n, s, place, names, e)
        }
        NodeKind::Seq(items) => items
            .iter()
            .for_each(|x| walk_templates(x, place, names, e)),
        NodeKind::Map(entries) => {
            for (_, v) in entries {
                walk_templates(v, place, names, e);
            }
        }
        _ => {}
    }
}

/// Rewrite the templates of the string `s` at node `n`, segment by segment,
/// where each segment appears in the text.
fn rewrite_scalar(n: &Node, s: &str, place: Place<'_>, names: &Names, e: &mut Edits) {
    let mut search_from = n.span.offset;
    for (seg_start, seg_end) in segments(s) {
        let old = &s[seg_start..seg_end];
        let (new, what, refused) = rewrite_expression(old, place, names);
        if let Some(why) = refused {
            e.refuse(n.span.line, why);
        }
        if new == old {
            continue;
        }
        let Some(found) = e.text[search_from..].find(old).map(|i| i + search_from) else {
            e.refuse(
                n.span.line,
                format!(
                    "{}: the template is written with escapes; rewrite it by hand",
                    what.join(", ")
                ),
            );
            continue;
        };
        let line = line_of(e.text, found);
        e.replace((found, found + old.len()), new, line, what.join(", "));
        search_from = found + old.len();
    }
}

/// Byte ranges of the `{{ ... }}` and `{% ... %}` blocks of `s`.
fn segments(s: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = s[at..].find(['{']) {
        let start = at + i;
        let close = match s[start..].get(..2) {
            Some("{{") => "}}",
            Some("{%") => "%}",
            _ => {
                at = start + 1;
                continue;
            }
        };
        match s[start + 2..].find(close) {
            Some(j) => {
                let end = start + 2 + j + 2;
                out.push((start, end));
                at = end;
            }
            None => break,
        }
    }
    out
}

/// Words of an expression that are never variable roots.
const NOT_ROOTS: &[&str] = &[
    "and",
    "or",
    "not",
    "in",
    "is",
    "if",
    "else",
    "elif",
    "endif",
    "for",
    "endfor",
    "true",
    "false",
    "none",
    "True",
    "False",
    "None",
    "set",
    "endset",
    "with",
    "endwith",
    "recursive",
];

/// The expression `expr` with its legacy roots rewritten; what was
/// rewritten; and why something was left (an `output` outside policy and
/// arcs).
fn rewrite_expression(
    expr: &str,
    place: Place<'_>,
    names: &Names,
) -> (String, Vec<String>, Option<String>) {
    let bytes = expr.as_bytes();
    let locals = loop_locals(expr);
    let mut out = String::with_capacity(expr.len() + 16);
    let mut what: Vec<String> = Vec::new();
    let mut refused = None;
    let mut i = 0;
    let mut prev_sig: Option<u8> = None; // last non-space byte outside words
    let mut prev_word: Option<&str> = None;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'"' || b == b'\'' {
            let end = expr[i + 1..]
                .find(b as char)
                .map_or(bytes.len(), |j| i + 1 + j + 1);
            out.push_str(&expr[i..end]);
            i = end;
            prev_sig = Some(b);
            prev_word = None;
            continue;
        }
        if b.is_ascii_alphabetic() || b == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &expr[start..i];
            let next = expr[i..].trim_start();
            // `name=value` in a call is a keyword argument, not a variable.
            let kwarg = next.starts_with('=') && !next.starts_with("==");
            let is_root = prev_sig != Some(b'.')
                && prev_sig != Some(b'|')
                && prev_word != Some("is")
                && !NOT_ROOTS.contains(&word)
                && !locals.contains(word)
                && !kwarg
                && !next.starts_with('(');
            let replaced = if is_root {
                root_rewrite(word, next, place, names, &mut what, &mut refused)
            } else {
                None
            };
            match replaced {
                Some((text, consumed)) => {
                    out.push_str(&text);
                    // `output.data` → `<o>.result`: skip the `.data` consumed.
                    let skip = expr[i..].len() - expr[i..].trim_start().len();
                    if consumed > 0 {
                        i += skip + consumed;
                    }
                }
                None => out.push_str(word),
            }
            prev_word = Some(word);
            prev_sig = None;
            continue;
        }
        if !b.is_ascii_whitespace() {
            prev_sig = Some(b);
            prev_word = None;
        }
        out.push(b as char);
        i += 1;
    }
    (out, what, refused)
}

/// The rewrite of root `word` (followed by `next`): its new text and how
/// many bytes of `next` it replaces too.
fn root_rewrite(
    word: &str,
    next: &str,
    place: Place<'_>,
    names: &Names,
    what: &mut Vec<String>,
    refused: &mut Option<String>,
) -> Option<(String, usize)> {
    match word {
        own if place == Place::OwnSet(own) && !next.starts_with('(') => {
            what.push(format!("`{own}` (its own result) → `outcome.result`"));
            Some(("outcome.result".into(), 0))
        }
        "output" => {
            let base = match place {
                Place::Policy | Place::OwnSet(_) => "outcome",
                Place::Arc => "event",
                Place::Other => {
                    *refused = Some("`output` outside a task policy or an arc has no canonical equivalent; left as written (the engine reads it as the current result envelope)".into());
                    return None;
                }
            };
            if next.starts_with(".data")
                && !next[5..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            {
                what.push(format!("`output.data` → `{base}.result`"));
                Some((format!("{base}.result"), ".data".len()))
            } else {
                what.push(format!("`output` → `{base}`"));
                Some((base.to_string(), 0))
            }
        }
        // NoETL v1 arcs read the step's result as `result`.
        "result"
            if place == Place::Arc
                && !names.shadowing.contains("result")
                && !names.workload.contains("result") =>
        {
            what.push("`result` → `event.result`".into());
            Some(("event.result".into(), 0))
        }
        "_index" => {
            what.push("`_index` → `iter.index`".into());
            Some(("iter.index".into(), 0))
        }
        // NoETL's job: the running execution.
        "job" if !names.shadowing.contains("job") && !names.workload.contains("job") => {
            let field = [".uuid", ".execution_id", ".id"].into_iter().find(|f| {
                next.starts_with(f)
                    && !next[f.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })?;
            what.push(format!("`job{field}` → `execution_id`"));
            Some(("execution_id".into(), field.len()))
        }
        w if names.iterator.as_deref() == Some(w)
            && !names.shadowing.contains(w)
            && !names.workload.contains(w) =>
        {
            what.push(format!("`{w}` (the loop's element) → `iter.{w}`"));
            Some((format!("iter.{w}"), 0))
        }
        w if names.workload.contains(w) && !names.shadowing.contains(w) => {
            what.push(format!("`{w}` → `workload.{w}`"));
            Some((format!("workload.{w}"), 0))
        }
        _ => None,
    }
}

/// Names a `{% for x in ... %}` or `{% set x = ... %}` binds in `expr`.
fn loop_locals(expr: &str) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    let words: Vec<&str> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ','))
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        if *w == "for" || *w == "set" {
            if let Some(bound) = words.get(i + 1) {
                out.extend(bound.split(',').filter(|x| !x.is_empty()));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Pass 4: structure
// ---------------------------------------------------------------------------

fn structure(root: &Node, e: &mut Edits) {
    for rule in rules(root) {
        else_without_then(rule, e);
    }
    for (t, name) in tasks(root) {
        task_set(t, &name, e);
        python_libs(t, &name, e);
        workbook_call(t, &name, e);
    }
    tool_fields::structure(root, e);
    for (s, name) in steps(root) {
        step_when(s, name, e);
        step_set(s, name, e);
        step_as_task(s, name, e);
        legacy_next(s, name, e);
        for (k, _) in s.entries() {
            if let Some((_, hint)) = REFUSED_STEP_KEYS.iter().find(|(key, _)| *key == k.name) {
                e.refuse(k.span.line, format!("step `{name}`: {hint}"));
            }
        }
    }
    shapes::structure(root, e);
    keychain::registered_credentials(root, e);
    keychain::declarations(root, e);
}

/// `- else: {do: ...}` → `- else: {then: {do: ...}}`.
fn else_without_then(rule: &Node, e: &mut Edits) {
    let Some((k, v)) = rule.entry("else") else {
        return;
    };
    if !v.is_map() || v.get("then").is_some() || rule.get("then").is_some() {
        return;
    }
    let line = k.span.line;
    let summary = "`else` without `then` → `else: { then: ... }`".to_string();
    let text = e.text;
    if v.span.offset < next_line(text, k.span.offset) {
        // Flow: `else: { do: continue }`.
        let Some(end) = flow_end(text, v.span.offset) else {
            e.refuse(line, format!("{summary}: unbalanced braces"));
            return;
        };
        let inner = &text[v.span.offset..end];
        e.replace(
            (v.span.offset, end),
            format!("{{ then: {inner} }}"),
            line,
            summary,
        );
    } else {
        // Block: indent the children under a new `then:`.
        let from = next_line(text, k.span.offset);
        let to = entry_end(text, k.span.offset);
        let child_indent = indent_at(text, line_start(text, v.span.offset));
        let body = indent_lines(&text[from..to], 2);
        let with = format!("{}then:\n{body}", " ".repeat(child_indent));
        e.replace((from, to), with, line, summary);
    }
}

/// A task-level `set:` → a fallback rule of its policy that sets `ctx`.
fn task_set(t: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = t.entry("set") else { return };
    let line = k.span.line;
    if t.get("spec").is_some() {
        tool_fields::set_beside_spec(t, &format!("task `{name}`: `set`"), (k, v), e);
        return;
    }
    let indent = k.span.offset - line_start(e.text, k.span.offset);
    let (field, with) = fallback_rule(e.text, (k, v), indent);
    let summary = format!("task `{name}`: `set` → `{field}` in a `spec.policy` fallback rule");
    replace_entry(e, k.span.offset, with, line, summary);
}

/// A step's own keys: the canonical ones and the legacy ones migrate
/// rewrites in place. A NoETL v1 step's other keys are its task's, except
/// the refused ones ([`REFUSED_STEP_KEYS`]).
const STEP_KEYS: &[&str] = &[
    "step", "desc", "spec", "loop", "tool", "type", "next", "when", "set", "set_ctx", "input",
    "output",
];

/// Legacy step keys `noetl migrate` leaves as written, with what to write
/// instead.
const REFUSED_STEP_KEYS: &[(&str, &str)] = &[
    ("case", "step-level `case`: write its branches as task policy rules (`spec.policy.rules`) and routing as `next.arcs`"),
    ("eval", EVAL_HINT),
    ("expr", EVAL_HINT),
    ("vars", "step-level `vars`: write them with `set_ctx` (execution) or `set_iter` (iteration) in a task policy rule"),
    ("sink", "`sink`: add a storage task (postgres, duckdb, http) that writes the data and returns a reference"),
    ("save", "`save`: add a storage task (postgres, duckdb, http) that writes the data, or drop it (events already record every result)"),
    ("pipe", "`pipe`: list its tasks under `tool` (the ordered pipeline)"),
    ("command", WORK_HINT),
];
const EVAL_HINT: &str =
    "step-level `eval`/`expr`: write the conditions as task policy rules or arc `when`s";
const WORK_HINT: &str = "step `command`: move the work into a task of the step's `tool`";

/// A NoETL v1 step that is its own task (`tool: python` or `type: python`
/// with `code` beside it) → a pipeline of one task named after the step;
/// `tool: workbook` with `name: <task>` → a `kind: workbook` call;
/// `tool: router` / `type: end` (a step that only routes) → no `tool`.
fn step_as_task(s: &Node, name: &str, e: &mut Edits) {
    let kind_key = match s.get("tool") {
        Some(t) if t.as_str().is_none() => return, // a canonical pipeline
        Some(_) => "tool",
        None => "type",
    };
    let Some((tk, kind)) = s.entry(kind_key).and_then(|(k, v)| Some((k, v.as_str()?))) else {
        return;
    };
    let line = tk.span.line;
    let fields: Vec<&(crate::yaml::Key, Node)> = s
        .entries()
        .iter()
        .filter(|(k, _)| {
            !STEP_KEYS.contains(&k.name.as_str())
                && !REFUSED_STEP_KEYS.iter().any(|(key, _)| *key == k.name)
        })
        .collect();
    let text = e.text;
    let key_indent = tk.span.offset - line_start(text, tk.span.offset);
    if fields
        .iter()
        .any(|(k, _)| k.span.offset - line_start(text, k.span.offset) != key_indent)
    {
        e.refuse(line, format!("step `{name}`: `tool: {kind}` with its fields in flow style: list the task under `tool` by hand"));
        return;
    }
    if matches!(kind, "router" | "end" | "start") {
        if let Some((k, _)) = fields.first() {
            e.refuse(k.span.line, format!("step `{name}`: `{kind_key}: {kind}` with task field `{}`: a routing step has no task", k.name));
            return;
        }
        let summary = format!(
            "step `{name}`: `{kind_key}: {kind}` removed (a step without tasks only routes)"
        );
        replace_entry(e, tk.span.offset, String::new(), line, summary);
        return;
    }
    let pad = " ".repeat(key_indent);
    let mut task = format!("{pad}tool:\n{pad}  - name: {}\n", yaml_scalar(name));
    if kind == "workbook" {
        let Some(target) = s.get("name").and_then(Node::as_str) else {
            e.refuse(line, format!("step `{name}`: `tool: workbook` without `name`: name the workbook task (`task:`) by hand"));
            return;
        };
        task.push_str(&format!(
            "{pad}    kind: workbook\n{pad}    task: {}\n",
            yaml_scalar(target)
        ));
    } else {
        task.push_str(&format!("{pad}    kind: {}\n", yaml_scalar(kind)));
    }
    for (k, _) in &fields {
        if kind == "workbook" && k.name == "name" {
            remove_entry(e, k.span.offset);
            continue;
        }
        let from = line_start(text, k.span.offset);
        let to = entry_end(text, k.span.offset);
        task.push_str(&reindent(&text[from..to], key_indent, key_indent + 4));
        remove_entry(e, k.span.offset);
    }
    let summary = format!(
        "step `{name}`: `{kind_key}: {kind}` with its fields → a pipeline of one task `{name}`"
    );
    replace_entry(e, tk.span.offset, task, line, summary);
}

/// A step-level `set:` / `set_ctx:` (applied when the step ends) → a
/// fallback rule of its last task's policy, after the error case (an
/// error fails the task, as before), so it runs when the step's last task
/// ends well.
fn step_set(s: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = s.entry("set_ctx").or_else(|| s.entry("set")) else {
        return;
    };
    let line = k.span.line;
    let last = match s.get("tool").map(|t| &t.kind) {
        Some(NodeKind::Seq(items)) => items.last().map(|t| match t.entries() {
            [(_, body)] if body.is_map() && t.get("kind").is_none() => body,
            _ => t,
        }),
        Some(NodeKind::Map(_)) => s.get("tool"),
        _ => None,
    };
    let Some(task) = last.filter(|t| t.is_map()) else {
        e.refuse(line, format!("step `{name}`: step-level `{}` on a step without tasks: set it with `set_ctx` in the policy of a task that runs before", k.name));
        return;
    };
    if task.get("spec").is_some() {
        let summary = format!(
            "step `{name}`: step-level `{}` → a fallback rule in its last task's `spec.policy`",
            k.name
        );
        if shapes::set_into_spec(task, (k, v), e, summary) {
            remove_entry(e, k.span.offset);
            return;
        }
        // Into the fallback rule of the policy the last task has.
        let whose = format!(
            "step `{name}`: step-level `{}` (into its last task)",
            k.name
        );
        tool_fields::set_beside_spec(task, &whose, (k, v), e);
        return;
    }
    let Some((last_key, _)) = task.entries().last() else {
        return;
    };
    let text = e.text;
    let before = &text[line_start(text, last_key.span.offset)..last_key.span.offset];
    if !before.trim_start_matches([' ', '-']).is_empty() {
        e.refuse(line, format!("step `{name}`: step-level `{}` with a last task in flow style: move it into that task's `spec.policy` by hand", k.name));
        return;
    }
    let indent = last_key.span.offset - line_start(text, last_key.span.offset);
    let (field, with) = fallback_rule(text, (k, v), indent);
    let at = entry_end(text, last_key.span.offset);
    e.replace(
        (at, at),
        with,
        line,
        format!("step `{name}`: step-level `{}` → `{field}` in its last task's `spec.policy` fallback rule", k.name),
    );
    remove_entry(e, k.span.offset);
}

/// The text of a `spec:` whose policy's fallback rule sets what the entry
/// `(k, v)` (a legacy `set`/`set_ctx`) sets, at column `indent`; and the
/// field it uses (`set` when the keys are `ctx.`/`iter.` paths, else
/// `set_ctx`).
fn fallback_rule(
    text: &str,
    (k, v): (&crate::yaml::Key, &Node),
    indent: usize,
) -> (&'static str, String) {
    let dotted = v
        .entries()
        .iter()
        .any(|(k, _)| k.name.starts_with("ctx.") || k.name.starts_with("iter."));
    let field = if dotted { "set" } else { "set_ctx" };
    let pad = " ".repeat(indent);
    let value = value_text(text, k.span.offset, v);
    let value = if value.contains('\n') {
        let block_indent = indent_at(text, next_line(text, k.span.offset));
        let want = indent + 14;
        let shifted: String = value
            .split_inclusive('\n')
            .map(|l| {
                if l.trim().is_empty() {
                    l.to_string()
                } else {
                    let have = l.len() - l.trim_start_matches(' ').len();
                    format!(
                        "{}{}",
                        " ".repeat(want + have - block_indent.min(have)),
                        l.trim_start_matches(' ')
                    )
                }
            })
            .collect();
        format!("\n{shifted}")
    } else {
        format!(" {value}\n")
    };
    let with = format!(
        "{pad}spec:\n{pad}  policy:\n{pad}    rules:\n{pad}      - when: \"{{{{ outcome.status == 'error' }}}}\"\n{pad}        then: {{ do: fail }}\n{pad}      - else:\n{pad}          then:\n{pad}            do: continue\n{pad}            {field}:{value}"
    );
    (field, with)
}

/// A python task's `libs: [a, b]` → `import a` / `import b` at the top of
/// its `code` block; a list that cannot become imports (package names, a
/// `code` that is not a block) is removed, as NoETL ignores it. (A mapping
/// `libs`, NoETL's shape, is canonical: the tool imports it.)
fn python_libs(t: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = t.entry("libs").filter(|(_, v)| !v.is_map()) else {
        return;
    };
    let line = k.span.line;
    let libs: Vec<&str> = v.items().iter().filter_map(Node::as_str).collect();
    if libs.len() != v.items().len() || libs.is_empty() {
        e.refuse(
            line,
            format!("task `{name}`: `libs` must be a list of module names to rewrite into imports"),
        );
        return;
    }
    let text = e.text;
    let Some((ck, code)) = t.entry("code") else {
        e.refuse(line, format!("task `{name}`: `libs` without `code`"));
        return;
    };
    let code_line_end = next_line(text, ck.span.offset);
    let after_key =
        text[ck.span.offset + ck.name.len()..code_line_end].trim_start_matches([':', ' ']);
    let modules = libs.iter().all(|l| {
        l.split('.').all(|p| {
            p.starts_with(|c: char| c == '_' || c.is_ascii_alphabetic())
                && p.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
        })
    });
    if !after_key.starts_with('|') || code.as_str().is_none() || !modules {
        // NoETL ignores a list (its `libs` is a mapping): the code imports
        // what it needs, or these are package names (`psycopg2-binary`).
        replace_entry(
            e,
            k.span.offset,
            String::new(),
            line,
            format!("task `{name}`: `libs` list removed (NoETL ignores a list; the code imports what it uses)"),
        );
        return;
    }
    let indent = indent_at(text, code_line_end);
    let imports: String = libs
        .iter()
        .map(|l| format!("{}import {l}\n", " ".repeat(indent)))
        .collect();
    e.replace(
        (code_line_end, code_line_end),
        imports,
        ck.span.line,
        format!("task `{name}`: `libs` → imports at the top of `code`"),
    );
    remove_entry(e, k.span.offset);
}

/// A step-level `when:` → an admission rule.
fn step_when(s: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = s.entry("when") else {
        return;
    };
    let line = k.span.line;
    if s.get("spec").is_some() {
        e.refuse(line, format!("step `{name}`: `when` next to a `spec`: add it to `spec.policy.admit.rules` by hand"));
        return;
    }
    let text = e.text;
    let value = value_text(text, k.span.offset, v);
    if value.contains('\n') {
        e.refuse(
            line,
            format!(
                "step `{name}`: a multi-line `when`: move it to `spec.policy.admit.rules` by hand"
            ),
        );
        return;
    }
    let pad = " ".repeat(k.span.offset - line_start(text, k.span.offset));
    let with = format!(
        "{pad}spec:\n{pad}  policy:\n{pad}    admit:\n{pad}      rules:\n{pad}        - when: {value}\n{pad}          then: {{ allow: true }}\n{pad}        - else:\n{pad}            then: {{ allow: false }}\n"
    );
    let summary = format!("step `{name}`: `when` → an admission rule (`spec.policy.admit`)");
    replace_entry(e, k.span.offset, with, line, summary);
}

/// A task naming a workbook task (`task: lookup`) without a `kind` →
/// `kind: workbook` before its `task`.
fn workbook_call(t: &Node, name: &str, e: &mut Edits) {
    if t.get("kind").is_some() || t.get("type").is_some() {
        return;
    }
    let Some((k, target)) = t.entry("task").and_then(|(k, v)| Some((k, v.as_str()?))) else {
        return;
    };
    let text = e.text;
    let at = k.span.offset;
    let before = &text[line_start(text, at)..at];
    let (range, with) = if before.trim().is_empty() {
        // A line of its own, at the key's column.
        (
            (at - before.len(), at - before.len()),
            format!("{before}kind: workbook\n"),
        )
    } else if before.trim() == "-" {
        // `- task: lookup`: the new key takes the dash.
        let pad = " ".repeat(before.len());
        ((at, at), format!("kind: workbook\n{pad}"))
    } else {
        // A flow mapping.
        ((at, at), "kind: workbook, ".to_string())
    };
    let summary =
        format!("task `{name}`: `kind: workbook` added (it runs workbook task `{target}`)");
    e.replace(range, with, k.span.line, summary);
}

/// Keys an item of a legacy `next` list may have (all canonical arc keys).
const NEXT_ITEM_KEYS: &[&str] = &["step", "args", "when"];

/// A legacy `next` (a step name, or a list of names and `{step, args,
/// when}` maps) → the router object `next: { spec, arcs }`. Without `when`s
/// every listed step was scheduled, so several arcs get `mode: inclusive`;
/// with `when`s the first that holds fires (`exclusive`, the default).
fn legacy_next(s: &Node, name: &str, e: &mut Edits) {
    let Some((k, v)) = s.entry("next") else {
        return;
    };
    let line = k.span.line;
    let items: Vec<&Node> = match &v.kind {
        NodeKind::Str(_) => vec![v],
        NodeKind::Seq(items) if !items.is_empty() => items.iter().collect(),
        NodeKind::Map(_) if ["when", "then", "else"].iter().any(|x| v.get(x).is_some()) => {
            e.refuse(line, format!("step `{name}`: `next` with `when`/`then`/`else`: write one arc per branch, `next: {{ arcs: [ {{ step: target, when: \"{{{{ ... }}}}\" }} ] }}`"));
            return;
        }
        _ => return, // canonical (or not a `next` migrate knows)
    };
    for item in &items {
        let odd = item
            .entries()
            .iter()
            .find(|(k, _)| !NEXT_ITEM_KEYS.contains(&k.name.as_str()));
        let bad = match (&item.kind, odd) {
            (NodeKind::Str(_), _) => None,
            (NodeKind::Map(_), Some((k, _))) => Some(format!("its `{}`", k.name)),
            (NodeKind::Map(_), None) if item.get("step").is_none() => {
                Some("an item without `step`".into())
            }
            (NodeKind::Map(_), None) => None,
            _ => Some(format!("an item that is a {}", item.type_name())),
        };
        if let Some(bad) = bad {
            e.refuse(line, format!("step `{name}`: legacy `next` list with {bad}: write it as `next: {{ arcs: [...] }}` by hand (arcs take `step`, `when`, `args`)"));
            return;
        }
    }
    let guarded = items.iter().any(|i| i.get("when").is_some());
    let mode = (items.len() > 1 && !guarded).then_some("inclusive");
    let text = e.text;
    let key_indent = k.span.offset - line_start(text, k.span.offset);
    let pad = " ".repeat(key_indent);
    let spec = mode.map_or(String::new(), |m| format!("{pad}  spec: {{ mode: {m} }}\n"));
    let mut arcs = String::new();
    if v.span.offset < next_line(text, k.span.offset) {
        // On the key's line: a name, or a flow list.
        for item in &items {
            arcs.push_str(&format!("{pad}    - {}\n", flow_arc(text, item)));
        }
    } else {
        let dash_indent = indent_at(text, line_start(text, items[0].span.offset));
        if dash_indent <= key_indent {
            e.refuse(line, format!("step `{name}`: legacy `next` list indented no deeper than `next`: indent it, then run `noetl migrate` again"));
            return;
        }
        let end = entry_end(text, k.span.offset);
        for (i, item) in items.iter().enumerate() {
            let dash_line = line_start(text, item.span.offset);
            // Comments above the first item stay above it.
            let from = if i == 0 {
                next_line(text, k.span.offset)
            } else {
                dash_line
            };
            let to = items
                .get(i + 1)
                .map_or(end, |n| line_start(text, n.span.offset));
            if !text[dash_line..item.span.offset].trim_end().ends_with('-') {
                e.refuse(line, format!("step `{name}`: legacy `next` list whose items do not start on their `-` line: write it as `next: {{ arcs: [...] }}` by hand"));
                return;
            }
            match &item.kind {
                NodeKind::Map(_) => {
                    arcs.push_str(&reindent(&text[from..to], dash_indent, key_indent + 4))
                }
                _ => arcs.push_str(&format!("{pad}    - {}\n", flow_arc(text, item))),
            }
        }
    }
    let with = format!("{pad}next:\n{spec}{pad}  arcs:\n{arcs}");
    let how = match mode {
        Some(_) => " (`mode: inclusive`: every listed step starts, as before)",
        None if guarded && items.len() > 1 => {
            " (`exclusive`: the first arc whose `when` holds fires)"
        }
        None => "",
    };
    let summary = format!("step `{name}`: legacy `next` → `next.arcs`{how}");
    replace_entry(e, k.span.offset, with, line, summary);
}

/// One item of a legacy `next` as a flow arc: `step: name` for a name,
/// the item's own text for a flow map.
fn flow_arc(text: &str, item: &Node) -> String {
    match &item.kind {
        NodeKind::Str(s) => format!("step: {}", yaml_scalar(s)),
        _ => {
            let end = flow_end(text, item.span.offset).unwrap_or(item.span.offset);
            text[item.span.offset..end].to_string()
        }
    }
}

/// `s` as a YAML scalar: plain when it is a simple name, quoted otherwise.
fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !matches!(s, "true" | "false" | "null" | "yes" | "no" | "on" | "off")
        && !s.starts_with(|c: char| c.is_ascii_digit() || c == '-');
    if plain {
        s.to_string()
    } else {
        serde_json::Value::String(s.to_string()).to_string()
    }
}

/// The lines of `block`, whose least indentation is `from`, indented to `to`.
fn reindent(block: &str, from: usize, to: usize) -> String {
    block
        .split_inclusive('\n')
        .map(|l| {
            let body = l.trim_start_matches(' ');
            if body.trim().is_empty() {
                l.to_string()
            } else {
                let have = l.len() - body.len();
                format!("{}{body}", " ".repeat(to + have.saturating_sub(from)))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(workload: &[&str], shadowing: &[&str]) -> Names {
        Names {
            iterator: None,
            workload: workload.iter().map(|s| s.to_string()).collect(),
            shadowing: shadowing.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn rewrite(expr: &str, place: Place) -> String {
        rewrite_expression(
            expr,
            place,
            &names(&["numbers", "limit", "length"], &["fetch"]),
        )
        .0
    }

    #[test]
    fn an_entry_holds_a_sequence_written_at_its_own_indentation() {
        let text = "    libs:\n    - psycopg2-binary\n    - requests\n    code: x\n";
        let end = entry_end(text, 4);
        assert_eq!(&text[end..], "    code: x\n");
        // A scalar value ends at its own line, even before a `- ` line.
        let text = "  - a: 1\n  - b: 2\n";
        assert_eq!(&text[entry_end(text, 4)..], "  - b: 2\n");
    }

    #[test]
    fn only_roots_are_rewritten() {
        assert_eq!(
            rewrite("{{ numbers }}", Place::Other),
            "{{ workload.numbers }}"
        );
        assert_eq!(
            rewrite("{{ fetch.numbers | length > limit }}", Place::Other),
            "{{ fetch.numbers | length > workload.limit }}",
            "attributes and filters are not roots"
        );
        assert_eq!(
            rewrite("{{ 'numbers' ~ \"limit\" }}", Place::Other),
            "{{ 'numbers' ~ \"limit\" }}",
            "string literals are left alone"
        );
        assert_eq!(
            rewrite("{{ numbers is defined }}", Place::Other),
            "{{ workload.numbers is defined }}"
        );
        assert_eq!(
            rewrite(
                "{% for numbers in ctx.rows %}{{ numbers }}{% endfor %}",
                Place::Other
            ),
            "{% for numbers in ctx.rows %}{{ numbers }}{% endfor %}",
            "a loop variable shadows"
        );
        assert_eq!(
            rewrite("{{ range(limit) | list }}", Place::Other),
            "{{ range(workload.limit) | list }}"
        );
        assert_eq!(
            rewrite("{{ x | default(limit=1) }}", Place::Other),
            "{{ x | default(limit=1) }}"
        );
    }

    #[test]
    fn a_loop_s_bare_element_is_read_from_iter_in_its_tasks() {
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkload:\n  slots: [1, 2]\nworkflow:\n  - step: start\n    loop:\n      in: \"{{ workload.slots }}\"\n      iterator: slot\n    tool:\n      - name: claim\n        kind: noop\n        result: \"{{ slot }} of {{ loop.length }}\"\n        spec:\n          policy:\n            rules:\n              - when: \"{{ slot.x is defined }}\"\n                then: { do: continue }\n    next:\n      arcs:\n        - step: end\n          when: \"{{ slot }}\"\n  - step: end\n    tool: { kind: noop }\n";
        let m = migrate(src).unwrap();
        assert!(
            m.text
                .contains("result: \"{{ iter.slot }} of {{ loop.length }}\""),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("when: \"{{ iter.slot.x is defined }}\""),
            "{}",
            m.text
        );
        // Where the element is not bound (arcs run after the loop), as written.
        assert!(
            m.text.contains("          when: \"{{ slot }}\""),
            "{}",
            m.text
        );
        assert!(
            m.report()
                .iter()
                .any(|(l, s)| *l == 14 && s == "`slot` (the loop's element) → `iter.slot`"),
            "{:?}",
            m.report()
        );
    }

    #[test]
    fn noetl_s_job_id_is_the_execution_id() {
        assert_eq!(
            rewrite("{{ job.uuid }}-{{ job.execution_id|string }}", Place::Other),
            "{{ execution_id }}-{{ execution_id|string }}"
        );
        assert_eq!(rewrite("{{ job.name }}", Place::Other), "{{ job.name }}");
    }

    #[test]
    fn a_step_set_reads_its_own_result_as_the_outcome_s() {
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkflow:\n  - step: plan\n    tool:\n      kind: python\n      code: \"result = {'d': [1]}\"\n    set:\n      ctx.d: \"{{ plan.d }}\"\n      ctx.n: \"{{ other.n }}\"\n    next:\n      arcs:\n        - step: other\n  - step: other\n    tool: { kind: noop }\n";
        let m = migrate(src).unwrap();
        assert!(
            m.text.contains("ctx.d: \"{{ outcome.result.d }}\""),
            "{}",
            m.text
        );
        // Another step's result is read by its name, as written.
        assert!(m.text.contains("ctx.n: \"{{ other.n }}\""), "{}", m.text);
        assert!(
            m.report()
                .iter()
                .any(|(l, s)| *l == 10 && s.contains("`plan` (its own result) → `outcome.result`")),
            "{:?}",
            m.report()
        );
    }

    #[test]
    fn output_becomes_outcome_in_policy_and_event_in_arcs() {
        assert_eq!(
            rewrite("{{ output.data.rows }} {{ output.status }}", Place::Policy),
            "{{ outcome.result.rows }} {{ outcome.status }}"
        );
        assert_eq!(
            rewrite("{{ output.status == 'ok' }}", Place::Arc),
            "{{ event.status == 'ok' }}"
        );
        assert_eq!(
            rewrite("{{ output.database }}", Place::Policy),
            "{{ outcome.database }}"
        );
        let (same, _, refused) =
            rewrite_expression("{{ output.data }}", Place::Other, &names(&[], &[]));
        assert_eq!(same, "{{ output.data }}");
        assert!(refused.is_some_and(|r| r.contains("no canonical equivalent")));
        assert_eq!(
            rewrite("{{ _index + 1 }}", Place::Other),
            "{{ iter.index + 1 }}"
        );
    }

    #[test]
    fn a_second_migration_changes_nothing_and_comments_stay() {
        let src = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: t }\nworkload: { n: 2 }\nworkflow:\n  - step: a\n    # the only step\n    tool:\n      - name: t\n        kind: python\n        input: { n: \"{{ n }}\" }  # keep me\n        code: \"result = n\"\n";
        let m = migrate(src).unwrap();
        assert!(
            m.text
                .contains("        args: { n: \"{{ workload.n }}\" }  # keep me\n"),
            "{}",
            m.text
        );
        assert!(m.text.contains("    # the only step\n"));
        assert_eq!(m.changes.len(), 2);
        assert!(migrate(&m.text).unwrap().changes.is_empty());
    }

    fn playbook(workflow: &str) -> String {
        format!("apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {{ name: t }}\nworkflow:\n{workflow}")
    }

    #[test]
    fn a_legacy_next_becomes_the_router_object() {
        let m = migrate(&playbook(
            "  - step: a\n    next: b\n  - step: b\n    next: [c, \"d\"]\n  - step: c\n    next:\n      # why\n      - step: d\n        when: \"{{ ctx.x }}\"\n        args: { y: 1 }\n      - d\n  - step: d\n",
        ))
        .unwrap();
        assert!(
            m.text
                .contains("    next:\n      arcs:\n        - step: b\n"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("    next:\n      spec: { mode: inclusive }\n      arcs:\n        - step: c\n        - step: d\n"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("      arcs:\n        # why\n        - step: d\n          when: \"{{ ctx.x }}\"\n          args: { y: 1 }\n        - step: d\n"),
            "{}",
            m.text
        );
        assert_eq!(m.changes.len(), 3, "{:?}", m.changes);
        assert!(m.refusals.is_empty(), "{:?}", m.refusals);
        crate::load::load_playbook(&m.text, "t.yaml").unwrap();
        assert!(migrate(&m.text).unwrap().changes.is_empty());
    }

    #[test]
    fn a_next_with_branches_is_refused() {
        let m = migrate(&playbook(
            "  - step: a\n    next:\n      when: \"{{ ctx.x }}\"\n      then: [b]\n  - step: b\n",
        ))
        .unwrap();
        assert!(m.changes.is_empty());
        assert_eq!(m.refusals.len(), 1);
        assert!(
            m.refusals[0].why.contains("one arc per branch"),
            "{:?}",
            m.refusals
        );
    }

    #[test]
    fn a_workbook_call_without_kind_gets_one() {
        let m = migrate(&playbook(
            "  - step: a\n    tool:\n      - name: x\n        task: add\n      - task: add\n      - { name: z, task: add }\n",
        ))
        .unwrap();
        assert!(
            m.text.contains("      - name: x\n        kind: workbook\n        task: add\n      - kind: workbook\n        task: add\n      - { name: z, kind: workbook, task: add }\n"),
            "{}",
            m.text
        );
        assert_eq!(m.changes.len(), 3);
    }

    #[test]
    fn a_v1_step_it_cannot_rewrite_safely_is_refused() {
        let m = migrate(&playbook(
            "  - step: a\n    tool: router\n    code: x\n  - step: b\n    tool: workbook\n    args: { n: 1 }\n",
        ))
        .unwrap();
        assert!(m.changes.is_empty(), "{:?}", m.changes);
        let why: Vec<&str> = m.refusals.iter().map(|r| r.why.as_str()).collect();
        assert!(
            why[0].contains("`tool: router` with task field `code`"),
            "{why:?}"
        );
        assert!(
            why[1].contains("`tool: workbook` without `name`"),
            "{why:?}"
        );
    }

    #[test]
    fn what_is_not_yaml_is_an_error_with_its_position() {
        let e = migrate("workflow: [\n").unwrap_err();
        assert!(
            matches!(
                e,
                MigrateError::Yaml { line: 2, .. } | MigrateError::Yaml { line: 1, .. }
            ),
            "{e}"
        );
    }
}
