//! Rewrites ordering comparisons of a Jinja expression into calls of a
//! lenient comparison function: `a < b` becomes `f(a, "<", b)`, chains
//! `a < b <= c` become `(f(a, "<", b) and f(b, "<=", c))`.
//!
//! A small lexer groups brackets; comparison operands are delimited by the
//! tokens that bind looser than comparisons (`and`, `or`, `not`, `if`,
//! `else`, `,`, `:`, `=`). Returns `None` when the source does not lex
//! cleanly; callers then use the expression unchanged.
//!
//! Why a lexer of our own: minijinja exposes its tokenizer and parser only
//! behind the `unstable_machinery` feature, whose API changes between
//! minor releases (1.0.16 changed `tokenize`'s arguments), and a source
//! rewrite needs byte spans of brackets and operators, not an AST. This one
//! reads expressions only (never `{% %}` statements), and whatever it does
//! not lex is left to minijinja unchanged.

/// The name the lenient comparison function is registered under.
pub(super) const CMP_FN: &str = "__noetl_cmp";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tk {
    Str,
    Num,
    Name,
    Op,
    Open,
    Close,
    Other,
}

#[derive(Debug, Clone, Copy)]
struct Tok {
    kind: Tk,
    start: usize,
    end: usize,
}

#[derive(Debug)]
enum Node {
    Tok(Tok),
    Group {
        open: Tok,
        children: Vec<Node>,
        close: Tok,
    },
}

impl Node {
    fn start(&self) -> usize {
        match self {
            Node::Tok(t) => t.start,
            Node::Group { open, .. } => open.start,
        }
    }
    fn end(&self) -> usize {
        match self {
            Node::Tok(t) => t.end,
            Node::Group { close, .. } => close.end,
        }
    }
}

fn lex(src: &str) -> Option<Vec<Tok>> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let kind = if c.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if c == b'\'' || c == b'"' {
            i += 1;
            loop {
                match b.get(i) {
                    None => return None,
                    Some(b'\\') => i += 2,
                    Some(&q) if q == c => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            Tk::Str
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            Tk::Num
        } else if c.is_ascii_alphabetic() || c == b'_' || !c.is_ascii() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || !b[i].is_ascii())
            {
                i += 1;
            }
            Tk::Name
        } else if matches!(c, b'(' | b'[' | b'{') {
            i += 1;
            Tk::Open
        } else if matches!(c, b')' | b']' | b'}') {
            i += 1;
            Tk::Close
        } else {
            let two = src.get(i..i + 2).unwrap_or("");
            if ["==", "!=", "<=", ">=", "//", "**"].contains(&two) {
                i += 2;
            } else {
                i += 1;
            }
            if b"<>+-*/%~|.,:=!".contains(&c) {
                Tk::Op
            } else {
                Tk::Other
            }
        };
        out.push(Tok {
            kind,
            start,
            end: i,
        });
    }
    Some(out)
}

fn tree(toks: &[Tok], src: &str) -> Option<Vec<Node>> {
    let mut stack: Vec<(Option<Tok>, Vec<Node>)> = vec![(None, Vec::new())];
    for &t in toks {
        match t.kind {
            Tk::Open => stack.push((Some(t), Vec::new())),
            Tk::Close => {
                let (open, children) = stack.pop()?;
                let open = open?;
                let pair = (&src[open.start..open.end], &src[t.start..t.end]);
                if !matches!(pair, ("(", ")") | ("[", "]") | ("{", "}")) {
                    return None;
                }
                stack.last_mut()?.1.push(Node::Group {
                    open,
                    children,
                    close: t,
                });
            }
            _ => stack.last_mut()?.1.push(Node::Tok(t)),
        }
    }
    if stack.len() != 1 {
        return None;
    }
    stack.pop().map(|(_, nodes)| nodes)
}

/// Rewrites `src`; `None` when it does not lex or nothing changes.
pub(super) fn rewrite(src: &str, func: &str) -> Option<String> {
    let toks = lex(src)?;
    let nodes = tree(&toks, src)?;
    let out = Rewriter { src, func }.seq(&nodes);
    (out != src.trim()).then_some(out)
}

struct Rewriter<'a> {
    src: &'a str,
    func: &'a str,
}

/// A comparison operator at one nesting level, spanning `len` nodes.
struct CmpOp {
    at: usize,
    len: usize,
    text: &'static str,
}

impl Rewriter<'_> {
    fn text(&self, t: &Tok) -> &str {
        &self.src[t.start..t.end]
    }

    fn name_at(&self, nodes: &[Node], i: usize) -> Option<&str> {
        match nodes.get(i) {
            Some(Node::Tok(t)) if t.kind == Tk::Name => Some(self.text(t)),
            _ => None,
        }
    }

    /// Emits a node, rewriting inside groups.
    fn node(&self, n: &Node) -> String {
        match n {
            Node::Tok(t) => self.text(t).to_string(),
            Node::Group {
                open,
                children,
                close,
            } => {
                let mut s = self.text(open).to_string();
                s.push_str(&self.seq(children));
                s.push_str(self.text(close));
                s
            }
        }
    }

    /// Emits consecutive nodes, keeping the original gaps.
    fn plain(&self, nodes: &[Node]) -> String {
        let mut s = String::new();
        for (i, n) in nodes.iter().enumerate() {
            if i > 0 {
                s.push_str(&self.src[nodes[i - 1].end()..n.start()]);
            }
            s.push_str(&self.node(n));
        }
        s
    }

    fn is_boundary(&self, nodes: &[Node], i: usize) -> bool {
        match &nodes[i] {
            Node::Tok(t) if t.kind == Tk::Op => {
                matches!(self.text(t), "," | ":" | "=")
            }
            Node::Tok(t) if t.kind == Tk::Name => match self.text(t) {
                "and" | "or" | "if" | "else" => true,
                // `not in` is a comparison; `is not x` a test.
                "not" => {
                    self.name_at(nodes, i + 1) != Some("in")
                        && (i == 0 || self.name_at(nodes, i - 1) != Some("is"))
                }
                _ => false,
            },
            _ => false,
        }
    }

    fn cmp_ops(&self, nodes: &[Node]) -> Vec<CmpOp> {
        let mut ops = Vec::new();
        let mut i = 0;
        while i < nodes.len() {
            let op = match &nodes[i] {
                Node::Tok(t) if t.kind == Tk::Op => match self.text(t) {
                    "<" => Some(("<", 1)),
                    "<=" => Some(("<=", 1)),
                    ">" => Some((">", 1)),
                    ">=" => Some((">=", 1)),
                    "==" => Some(("==", 1)),
                    "!=" => Some(("!=", 1)),
                    _ => None,
                },
                Node::Tok(t) if t.kind == Tk::Name => {
                    let after_is = i > 0 && self.name_at(nodes, i - 1) == Some("is");
                    match self.text(t) {
                        "in" if !after_is => Some(("in", 1)),
                        "not" if !after_is && self.name_at(nodes, i + 1) == Some("in") => {
                            Some(("not in", 2))
                        }
                        _ => None,
                    }
                }
                _ => None,
            };
            match op {
                Some((text, len)) => {
                    ops.push(CmpOp { at: i, len, text });
                    i += len;
                }
                None => i += 1,
            }
        }
        ops
    }

    /// One segment between boundaries: a comparison chain or an operand.
    fn segment(&self, nodes: &[Node]) -> String {
        let ops = self.cmp_ops(nodes);
        let ordering = |o: &CmpOp| matches!(o.text, "<" | "<=" | ">" | ">=");
        if !ops.iter().any(ordering) {
            return self.plain(nodes);
        }
        let mut operands = Vec::new();
        let mut from = 0;
        for o in &ops {
            operands.push(self.plain(&nodes[from..o.at]));
            from = o.at + o.len;
        }
        operands.push(self.plain(&nodes[from..]));
        if operands.iter().any(|o| o.trim().is_empty()) {
            return self.plain(nodes);
        }
        let parts: Vec<String> = ops
            .iter()
            .enumerate()
            .map(|(k, o)| {
                let (l, r) = (&operands[k], &operands[k + 1]);
                if ordering(o) {
                    format!("{}({l}, \"{}\", {r})", self.func, o.text)
                } else {
                    format!("(({l}) {} ({r}))", o.text)
                }
            })
            .collect();
        if parts.len() == 1 {
            parts.into_iter().next().unwrap_or_default()
        } else {
            format!("({})", parts.join(" and "))
        }
    }

    /// Rewrites a node sequence at one nesting level.
    fn seq(&self, nodes: &[Node]) -> String {
        let mut out = String::new();
        let mut seg_start = 0;
        let mut last_end: Option<usize> = None;
        let mut push = |out: &mut String, text: String, start: usize, end: usize| {
            if let Some(prev) = last_end {
                out.push_str(&self.src[prev..start]);
            }
            out.push_str(&text);
            last_end = Some(end);
        };
        for i in 0..=nodes.len() {
            let boundary = i == nodes.len() || self.is_boundary(nodes, i);
            if !boundary {
                continue;
            }
            if seg_start < i {
                let seg = &nodes[seg_start..i];
                let text = self.segment(seg);
                push(&mut out, text, seg[0].start(), seg[seg.len() - 1].end());
            }
            if i < nodes.len() {
                let text = self.node(&nodes[i]);
                push(&mut out, text, nodes[i].start(), nodes[i].end());
            }
            seg_start = i + 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    #[test]
    fn rewrites_ordering_comparisons_only() {
        assert_eq!(rewrite("a == 1", "f"), None);
        assert_eq!(rewrite("a < 3", "f").as_deref(), Some("f(a, \"<\", 3)"));
        assert_eq!(
            rewrite("not a.b >= 2 and c", "f").as_deref(),
            Some("not f(a.b, \">=\", 2) and c")
        );
        assert_eq!(
            rewrite("(x | int) + 1 > y * 2", "f").as_deref(),
            Some("f((x | int) + 1, \">\", y * 2)")
        );
        assert_eq!(
            rewrite("1 < a <= 3", "f").as_deref(),
            Some("(f(1, \"<\", a) and f(a, \"<=\", 3))")
        );
        assert_eq!(
            rewrite("x if a < '<' else y", "f").as_deref(),
            Some("x if f(a, \"<\", '<') else y")
        );
        assert_eq!(
            rewrite("[a < 1, b]", "f").as_deref(),
            Some("[f(a, \"<\", 1), b]")
        );
        assert_eq!(rewrite("'unterminated < 1", "f"), None);
    }
}
