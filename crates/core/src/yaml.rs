//! A YAML tree whose every node and mapping key carries its source position,
//! built from the event stream of `granit-parser` (the parser under
//! serde-saphyr). Duplicate keys are errors; anchors, aliases and merge keys
//! (`<<`) resolve, with alias expansion bounded; scalars follow the YAML 1.2
//! core schema (quoted scalars and `!!str` are strings).

use crate::codes::Code;
use std::collections::HashMap;

use granit_parser::{Event, Parser, ScalarStyle};

use crate::limits::{MAX_ALIAS_BYTES, MAX_ALIAS_NODES, MAX_YAML_DEPTH};
use serde_json::{Map, Number, Value};

/// A position in the source (1-based line and column, byte offset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// Byte offset in the source.
    pub offset: usize,
}

/// A mapping key (keys are strings in playbooks; others are stringified).
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// The key text.
    pub name: String,
    /// Where it is.
    pub span: Span,
}

/// The shape of a node.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// `null`, `~` or empty.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (any quoted scalar, or a plain one that is nothing else).
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order.
    Map(Vec<(Key, Node)>),
}

/// A positioned YAML node.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Shape and value.
    pub kind: NodeKind,
    /// Where the node starts.
    pub span: Span,
}

/// A YAML syntax error, or a document beyond a limit of [`crate::limits`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    /// Diagnostic code: `E001` (syntax), `E041` (nesting too deep) or
    /// `E042` (aliases expand too much).
    pub code: Code,
    /// What is wrong.
    pub message: String,
    /// Where.
    pub span: Span,
}

fn span_of(m: &granit_parser::Marker) -> Span {
    Span {
        line: m.line(),
        col: m.col() + 1,
        offset: m.byte_offset().unwrap_or(m.index()),
    }
}

fn scalar(value: &str, style: ScalarStyle) -> NodeKind {
    if style != ScalarStyle::Plain {
        return NodeKind::Str(value.to_string());
    }
    match value {
        "" | "~" | "null" | "Null" | "NULL" => return NodeKind::Null,
        "true" | "True" | "TRUE" => return NodeKind::Bool(true),
        "false" | "False" | "FALSE" => return NodeKind::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return NodeKind::Float(f64::INFINITY)
        }
        ".nan" | ".NaN" | ".NAN" => return NodeKind::Float(f64::NAN),
        "-.inf" | "-.Inf" | "-.INF" => return NodeKind::Float(f64::NEG_INFINITY),
        _ => {}
    }
    let looks_numeric = value
        .chars()
        .next()
        .map(|c| c.is_ascii_digit() || c == '-' || c == '+' || c == '.')
        .unwrap_or(false);
    if looks_numeric {
        if let Ok(i) = value.parse::<i64>() {
            return NodeKind::Int(i);
        }
        if let Some(hex) = value.strip_prefix("0x") {
            if let Ok(i) = i64::from_str_radix(hex, 16) {
                return NodeKind::Int(i);
            }
        }
        if let Some(oct) = value.strip_prefix("0o") {
            if let Ok(i) = i64::from_str_radix(oct, 8) {
                return NodeKind::Int(i);
            }
        }
        if value.chars().any(|c| c.is_ascii_digit())
            && value
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        {
            if let Ok(f) = value.parse::<f64>() {
                return NodeKind::Float(f);
            }
        }
    }
    NodeKind::Str(value.to_string())
}

/// An open sequence or mapping (a mapping with the key awaiting its value).
enum Frame {
    Seq(Vec<Node>, Span),
    Map(Vec<(Key, Node)>, Span, Option<Key>),
}

/// An E001 syntax error.
fn syntax_error(message: String, span: Span) -> YamlError {
    YamlError {
        code: Code::E001,
        message,
        span,
    }
}

/// E041: sequences and mappings nest deeper than `max_yaml_depth`.
fn too_deep(span: Span) -> YamlError {
    YamlError {
        code: Code::E041,
        message: format!(
            "the YAML nests sequences and mappings more than {MAX_YAML_DEPTH} levels deep (limit `max_yaml_depth`)"
        ),
        span,
    }
}

/// Parse one YAML document into a positioned tree (an empty document is
/// `Null`). Only the first document of a stream is read.
pub fn parse(src: &str) -> Result<Node, YamlError> {
    let mut parser = Parser::new_from_str(src);
    let mut tree = TreeBuilder::default();
    while let Some(ev) = parser.next_event() {
        let (event, sp) =
            ev.map_err(|e| syntax_error(e.info().to_string(), span_of(e.marker())))?;
        let span = span_of(&sp.start);
        if matches!(event, Event::StreamEnd | Event::DocumentEnd) {
            if tree.root.is_some() || matches!(event, Event::StreamEnd) {
                break;
            }
            continue;
        }
        if let Some((node, anchor)) = tree.event(event, span)? {
            tree.place(node, anchor)?;
        }
    }
    Ok(tree.root.unwrap_or(Node {
        kind: NodeKind::Null,
        span: Span {
            line: 1,
            col: 1,
            offset: 0,
        },
    }))
}

/// The tree [`parse`] builds from the parser's events, with the depth and
/// alias budgets (E041/E042) it keeps.
#[derive(Default)]
struct TreeBuilder {
    /// The open sequences and mappings, innermost last, each with its
    /// anchor id (0 for none).
    stack: Vec<(Frame, usize)>,
    /// Anchored nodes with their size (nodes, scalar bytes); aliases may not
    /// add more than MAX_ALIAS_NODES nodes or MAX_ALIAS_BYTES bytes of text
    /// to the document (a guard against "billion laughs" inputs).
    anchors: HashMap<usize, (Node, Size)>,
    /// What aliases have added so far.
    expanded: Size,
    /// The document's node, once complete.
    root: Option<Node>,
}

impl TreeBuilder {
    /// The node an event completes, with its anchor id (0 for none);
    /// `None` when the event opens a collection or completes nothing.
    fn event(&mut self, event: Event<'_>, span: Span) -> Result<Option<(Node, usize)>, YamlError> {
        Ok(match event {
            Event::Alias(id) => Some((self.alias(id, span)?, 0)),
            Event::Scalar(value, style, anchor, tag) => {
                // An explicit `!!str` keeps the text; other tags resolve as usual.
                let is_str = tag.as_deref().and_then(|t| t.core_suffix()) == Some("str");
                let kind = if is_str {
                    NodeKind::Str(value.to_string())
                } else {
                    scalar(&value, style)
                };
                Some((Node { kind, span }, anchor))
            }
            Event::SequenceStart(_, anchor, _) => {
                self.open(Frame::Seq(Vec::new(), span), anchor, span)?;
                None
            }
            Event::MappingStart(_, anchor, _) => {
                self.open(Frame::Map(Vec::new(), span, None), anchor, span)?;
                None
            }
            Event::SequenceEnd | Event::MappingEnd => Some(self.close()),
            _ => None,
        })
    }

    /// An alias: a copy of the anchored node at the alias's position,
    /// within the expansion (E042) and depth (E041) budgets.
    fn alias(&mut self, id: usize, span: Span) -> Result<Node, YamlError> {
        let Some((n, size)) = self.anchors.get(&id) else {
            return Err(syntax_error(
                "alias refers to an unknown anchor".into(),
                span,
            ));
        };
        let expanded = &mut self.expanded;
        expanded.nodes = expanded.nodes.saturating_add(size.nodes);
        expanded.bytes = expanded.bytes.saturating_add(size.bytes);
        if expanded.nodes > MAX_ALIAS_NODES || expanded.bytes > MAX_ALIAS_BYTES {
            return Err(YamlError {
                code: Code::E042,
                message: format!(
                    "aliases expand the document by {} nodes and {} bytes so far, above the limit `max_alias_expansion` of {MAX_ALIAS_NODES} nodes or {MAX_ALIAS_BYTES} bytes (\"billion laughs\")",
                    expanded.nodes, expanded.bytes
                ),
                span,
            });
        }
        if self.stack.len() + size.depth > MAX_YAML_DEPTH {
            return Err(too_deep(span));
        }
        Ok(Node {
            kind: n.kind.clone(),
            span,
        })
    }

    /// Opens a sequence or a mapping, within the depth budget (E041).
    fn open(&mut self, frame: Frame, anchor: usize, span: Span) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_YAML_DEPTH {
            return Err(too_deep(span));
        }
        self.stack.push((frame, anchor));
        Ok(())
    }

    /// Closes the innermost sequence or mapping: its node and anchor id.
    fn close(&mut self) -> (Node, usize) {
        let (frame, anchor) = self.stack.pop().expect("balanced events");
        match frame {
            Frame::Seq(items, span) => (
                Node {
                    kind: NodeKind::Seq(items),
                    span,
                },
                anchor,
            ),
            Frame::Map(entries, span, _) => (
                Node {
                    kind: NodeKind::Map(merge_keys(entries)),
                    span,
                },
                anchor,
            ),
        }
    }

    /// Records a completed node under its anchor, then places it: as the
    /// document, an item of the open sequence, or a key or value of the
    /// open mapping.
    fn place(&mut self, node: Node, anchor: usize) -> Result<(), YamlError> {
        if anchor != 0 {
            let size = size_of(&node);
            self.anchors.insert(anchor, (node.clone(), size));
        }
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
            }
            Some((Frame::Seq(items, _), _)) => items.push(node),
            Some((Frame::Map(entries, _, pending), _)) => match pending.take() {
                None => *pending = Some(map_key(entries, node)?),
                Some(key) => entries.push((key, node)),
            },
        }
        Ok(())
    }
}

/// A node read as a mapping key: a scalar, stringified, that is not a key
/// of `entries` already (E001 otherwise).
fn map_key(entries: &[(Key, Node)], node: Node) -> Result<Key, YamlError> {
    let name = match &node.kind {
        NodeKind::Str(s) => s.clone(),
        NodeKind::Null => "null".into(),
        NodeKind::Bool(b) => b.to_string(),
        NodeKind::Int(i) => i.to_string(),
        NodeKind::Float(f) => f.to_string(),
        _ => {
            return Err(syntax_error(
                "mapping keys must be scalars".into(),
                node.span,
            ))
        }
    };
    if let Some((first, _)) = entries.iter().find(|(k, _)| k.name == name) {
        return Err(syntax_error(
            format!(
                "duplicate key `{name}` (first defined at line {})",
                first.span.line
            ),
            node.span,
        ));
    }
    Ok(Key {
        name,
        span: node.span,
    })
}

/// What an anchored node adds each time an alias repeats it.
#[derive(Debug, Clone, Copy, Default)]
struct Size {
    /// Nodes (mapping keys count as nodes).
    nodes: usize,
    /// Bytes of scalar text (keys and values).
    bytes: usize,
    /// Nesting levels of sequences and mappings.
    depth: usize,
}

fn size_of(n: &Node) -> Size {
    fn add(s: &mut Size, c: Size) {
        s.nodes = s.nodes.saturating_add(c.nodes);
        s.bytes = s.bytes.saturating_add(c.bytes);
        s.depth = s.depth.max(c.depth + 1);
    }
    let mut s = Size {
        nodes: 1,
        bytes: 0,
        depth: 0,
    };
    match &n.kind {
        NodeKind::Seq(items) => {
            s.depth = 1;
            for i in items {
                add(&mut s, size_of(i));
            }
        }
        NodeKind::Map(entries) => {
            s.depth = 1;
            for (k, v) in entries {
                s.nodes += 1;
                s.bytes = s.bytes.saturating_add(k.name.len());
                add(&mut s, size_of(v));
            }
        }
        NodeKind::Str(t) => s.bytes = t.len(),
        _ => {}
    }
    s
}

/// Apply YAML merge keys (`<<: *anchor` or `<<: [*a, *b]`): keys written in
/// the mapping win over merged ones; earlier merged mappings win over later.
fn merge_keys(entries: Vec<(Key, Node)>) -> Vec<(Key, Node)> {
    if !entries.iter().any(|(k, _)| k.name == "<<") {
        return entries;
    }
    let mut sources = Vec::new();
    let mut out: Vec<(Key, Node)> = Vec::new();
    for (k, v) in entries {
        if k.name != "<<" {
            out.push((k, v));
            continue;
        }
        match v.kind {
            NodeKind::Map(m) => sources.push(m),
            NodeKind::Seq(items) => {
                for it in items {
                    if let NodeKind::Map(m) = it.kind {
                        sources.push(m);
                    }
                }
            }
            // Not a mergeable value: keep it as an ordinary key.
            other => out.push((
                k,
                Node {
                    kind: other,
                    span: v.span,
                },
            )),
        }
    }
    for m in sources {
        for (k, v) in m {
            if !out.iter().any(|(o, _)| o.name == k.name) {
                out.push((k, v));
            }
        }
    }
    out
}

/// The node as JSON (key order kept); same as [`Node::to_json`].
pub fn to_json(node: &Node) -> Value {
    node.to_json()
}

impl Node {
    /// The node at a JSON pointer (`/workflow/0/tool/1`; `""` is the node
    /// itself; `~0`/`~1` escapes as in RFC 6901).
    pub fn pointer(&self, pointer: &str) -> Option<&Node> {
        if pointer.is_empty() {
            return Some(self);
        }
        let rest = pointer.strip_prefix('/')?;
        let mut node = self;
        for raw in rest.split('/') {
            let part = raw.replace("~1", "/").replace("~0", "~");
            node = match &node.kind {
                NodeKind::Map(entries) => entries
                    .iter()
                    .find(|(k, _)| k.name == part)
                    .map(|(_, v)| v)?,
                NodeKind::Seq(items) => items.get(part.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(node)
    }

    /// The value of mapping key `name`.
    pub fn get(&self, name: &str) -> Option<&Node> {
        self.entry(name).map(|(_, v)| v)
    }

    /// Key and value of mapping key `name`.
    pub fn entry(&self, name: &str) -> Option<(&Key, &Node)> {
        match &self.kind {
            NodeKind::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.name == name)
                .map(|(k, v)| (k, v)),
            _ => None,
        }
    }

    /// Mapping entries (empty for other shapes).
    pub fn entries(&self) -> &[(Key, Node)] {
        match &self.kind {
            NodeKind::Map(e) => e,
            _ => &[],
        }
    }

    /// Sequence items (empty for other shapes).
    pub fn items(&self) -> &[Node] {
        match &self.kind {
            NodeKind::Seq(i) => i,
            _ => &[],
        }
    }

    /// The string value, if a string.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Str(s) => Some(s),
            _ => None,
        }
    }

    /// True for mappings.
    pub fn is_map(&self) -> bool {
        matches!(self.kind, NodeKind::Map(_))
    }

    /// True for sequences.
    pub fn is_seq(&self) -> bool {
        matches!(self.kind, NodeKind::Seq(_))
    }

    /// True for null.
    pub fn is_null(&self) -> bool {
        matches!(self.kind, NodeKind::Null)
    }

    /// A short name of the shape, for messages.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            NodeKind::Null => "null",
            NodeKind::Bool(_) => "a boolean",
            NodeKind::Int(_) | NodeKind::Float(_) => "a number",
            NodeKind::Str(_) => "a string",
            NodeKind::Seq(_) => "a list",
            NodeKind::Map(_) => "a mapping",
        }
    }

    /// The node as JSON (key order kept).
    pub fn to_json(&self) -> Value {
        match &self.kind {
            NodeKind::Null => Value::Null,
            NodeKind::Bool(b) => Value::Bool(*b),
            NodeKind::Int(i) => Value::Number((*i).into()),
            NodeKind::Float(f) => Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            NodeKind::Str(s) => Value::String(s.clone()),
            NodeKind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeKind::Map(entries) => {
                let mut m = Map::new();
                for (k, v) in entries {
                    m.insert(k.name.clone(), v.to_json());
                }
                Value::Object(m)
            }
        }
    }

    /// A node made from JSON, every position set to `span`.
    pub fn from_json(v: &Value, span: Span) -> Node {
        let kind = match v {
            Value::Null => NodeKind::Null,
            Value::Bool(b) => NodeKind::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => NodeKind::Int(i),
                None => NodeKind::Float(n.as_f64().unwrap_or(0.0)),
            },
            Value::String(s) => NodeKind::Str(s.clone()),
            Value::Array(a) => NodeKind::Seq(a.iter().map(|x| Node::from_json(x, span)).collect()),
            Value::Object(m) => NodeKind::Map(
                m.iter()
                    .map(|(k, x)| {
                        (
                            Key {
                                name: k.clone(),
                                span,
                            },
                            Node::from_json(x, span),
                        )
                    })
                    .collect(),
            ),
        };
        Node { kind, span }
    }

    /// Visit every node with its JSON pointer.
    pub fn walk<'a>(&'a self, path: &str, f: &mut dyn FnMut(&str, &'a Node)) {
        f(path, self);
        match &self.kind {
            NodeKind::Seq(items) => {
                for (i, n) in items.iter().enumerate() {
                    n.walk(&format!("{path}/{i}"), f);
                }
            }
            NodeKind::Map(entries) => {
                for (k, n) in entries {
                    n.walk(&format!("{path}/{}", escape(&k.name)), f);
                }
            }
            _ => {}
        }
    }
}

/// Escape a key for a JSON pointer.
pub fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based() {
        let n = parse("a: 1\nb:\n  - x\n  - 'y'\n").unwrap();
        let (k, v) = n.entry("b").unwrap();
        assert_eq!((k.span.line, k.span.col), (2, 1));
        assert_eq!((v.items()[1].span.line, v.items()[1].span.col), (4, 5));
        assert_eq!(n.get("a").unwrap().kind, NodeKind::Int(1));
        assert_eq!(v.items()[1].as_str(), Some("y"));
    }

    #[test]
    fn scalars_follow_the_core_schema() {
        let n = parse("a: true\nb: ~\nc: 1.5\nd: '1'\ne: 0x10\nf: abc\ng: -3\n").unwrap();
        let j = n.to_json();
        assert_eq!(
            j,
            serde_json::json!({"a": true, "b": null, "c": 1.5, "d": "1", "e": 16, "f": "abc", "g": -3})
        );
    }

    #[test]
    fn duplicate_keys_and_syntax_errors_have_positions() {
        let e = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert!(e.message.contains("duplicate key `a`"), "{e}");
        assert_eq!(e.span.line, 3);
        let e = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(e.span.line >= 1);
    }

    #[test]
    fn anchors_resolve() {
        let n = parse("base: &b {x: 1}\nuse: *b\n").unwrap();
        assert_eq!(n.get("use").unwrap().to_json(), serde_json::json!({"x": 1}));
    }

    #[test]
    fn plain_scalars_that_are_not_numbers_stay_strings() {
        let n =
            parse("a: 1_000\nb: '0x10'\nc: !!str 12\nd: 1e3\ne: 1.2.3\nf: +7\ng: 0o17\nh: .5\n")
                .unwrap();
        assert_eq!(
            n.to_json(),
            serde_json::json!({"a": "1_000", "b": "0x10", "c": "12", "d": 1000.0, "e": "1.2.3", "f": 7, "g": 15, "h": 0.5})
        );
    }

    #[test]
    fn syntax_error_position_is_where_the_parser_stopped() {
        let e = parse("a: 1\nb: \"open\nc: [\n").unwrap_err();
        assert!(e.span.line >= 2, "{e:?}");
        let e = parse("a: 1\n  b: 2\n").unwrap_err();
        assert_eq!(e.span.line, 2, "{e:?}");
    }

    #[test]
    fn merge_keys_fill_in_missing_entries() {
        let n = parse("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n").unwrap();
        assert_eq!(
            n.get("use").unwrap().to_json(),
            serde_json::json!({"y": 3, "x": 1})
        );
    }

    #[test]
    fn pointer_finds_nested_nodes_with_positions() {
        let n =
            parse("workflow:\n  - step: a\n    tool:\n      - {name: t, kind: noop}\n\"a/b\": 1\n")
                .unwrap();
        let k = n.pointer("/workflow/0/tool/0/kind").unwrap();
        assert_eq!(k.as_str(), Some("noop"));
        assert_eq!((k.span.line, k.span.col), (4, 25));
        assert_eq!(n.pointer("/a~1b").unwrap().kind, NodeKind::Int(1));
        assert!(n.pointer("/workflow/3").is_none());
        assert!(n.pointer("").unwrap().is_map());
        assert_eq!(
            to_json(n.pointer("/workflow/0/step").unwrap()),
            serde_json::json!("a")
        );
    }

    #[test]
    fn empty_document_is_null_and_only_the_first_document_is_read() {
        assert!(parse("").unwrap().is_null());
        assert_eq!(
            parse("a: 1\n---\nb: 2\n").unwrap().to_json(),
            serde_json::json!({"a": 1})
        );
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut src = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let p = i - 1;
            src.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = parse(&src).unwrap_err();
        assert_eq!(e.code, Code::E042);
        assert!(e.message.contains("aliases expand"), "{e}");
        assert!(e.message.contains("max_alias_expansion"), "{e}");
        assert!(e.span.line > 1);
    }

    #[test]
    fn aliases_of_long_text_are_bounded_by_bytes() {
        // Few nodes, but each alias repeats 1 MiB of text.
        let mut src = format!("big: &big \"{}\"\nmany:\n", "x".repeat(1 << 20));
        for _ in 0..20 {
            src.push_str("  - *big\n");
        }
        let e = parse(&src).unwrap_err();
        assert_eq!(e.code, Code::E042);
        assert!(e.message.contains("bytes"), "{e}");
        // Within the limit, aliases resolve.
        let ok = parse("a: &a {x: 1}\nb: *a\n").unwrap();
        assert_eq!(
            ok.to_json(),
            serde_json::json!({"a": {"x": 1}, "b": {"x": 1}})
        );
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        let depth = crate::limits::MAX_YAML_DEPTH;
        let ok = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        assert!(parse(&ok).is_ok());
        let deep = format!("{}1{}", "[".repeat(depth + 1), "]".repeat(depth + 1));
        let e = parse(&deep).unwrap_err();
        assert_eq!(e.code, Code::E041);
        assert!(e.message.contains("max_yaml_depth"), "{e}");
        assert_eq!(e.span.line, 1);
        // A hundred thousand levels: refused, no stack overflow.
        let bomb = "[".repeat(100_000);
        assert!(parse(&bomb).is_err());
        // An alias may not carry a document past the limit either.
        let half = depth / 2 + 1;
        let src = format!(
            "a: &a {}1{}\nb: {}*a{}\n",
            "[".repeat(half),
            "]".repeat(half),
            "[".repeat(half),
            "]".repeat(half)
        );
        assert_eq!(parse(&src).unwrap_err().code, Code::E041);
    }
}
