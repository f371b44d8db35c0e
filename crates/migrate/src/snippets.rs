//! The YAML text the rewrites insert: a scalar quoted when it must be, a
//! block re-indented, the fallback rule a legacy `set` becomes.

use noetl_core::yaml::Node;

use crate::edits::{indent_at, next_line, value_text};

/// The text of a `spec:` whose policy's fallback rule sets what the entry
/// `(k, v)` (a legacy `set`/`set_ctx`) sets, at column `indent`; and the
/// field it uses (`set` when the keys are `ctx.`/`iter.` paths, else
/// `set_ctx`).
pub(crate) fn fallback_rule(
    text: &str,
    (k, v): (&noetl_core::yaml::Key, &Node),
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

/// `s` as a YAML scalar: plain when it is a simple name, quoted otherwise.
pub(crate) fn yaml_scalar(s: &str) -> String {
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
pub(crate) fn reindent(block: &str, from: usize, to: usize) -> String {
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
