//! Where each line of a rewritten text came from: the map that turns a
//! line of the migrated text back into a line of the file as written, so
//! what is reported on the migrated text (a diagnostic that remains) can
//! name the line the user wrote.

/// One replacement of a pass, as the line map sees it.
pub(super) struct Replaced<'a> {
    /// Byte range of the text replaced.
    pub start: usize,
    /// End of that range (exclusive).
    pub end: usize,
    /// What replaced it.
    pub with: &'a str,
    /// For a replacement of whole lines that moves or deletes some: the
    /// line of the text before it that each of its new lines is.
    pub order: Option<&'a [usize]>,
}

/// For each line of `text` after `edits` (sorted by `start`, not
/// overlapping; index `n - 1` for line `n`), the line of `text` it comes
/// from. A line a replacement wrote maps to the line it replaced (the
/// `k`-th line of the new text to the `k`-th line replaced, lines added
/// past those to the last one replaced), or to its line in `order`.
pub(super) fn origin(text: &str, edits: &[Replaced<'_>]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at_start = true;
    let mut line = 1;
    let mut pos = 0;
    for r in edits {
        for ch in text[pos..r.start].chars() {
            if at_start {
                out.push(line);
                at_start = false;
            }
            if ch == '\n' {
                line += 1;
                at_start = true;
            }
        }
        let replaced = &text[r.start..r.end];
        let newlines = replaced.matches('\n').count();
        let last = line + newlines.saturating_sub(usize::from(replaced.ends_with('\n')));
        let mut k = 0;
        for ch in r.with.chars() {
            if at_start {
                out.push(match r.order {
                    Some(o) => o.get(k).copied().unwrap_or(last),
                    None => (line + k).min(last),
                });
                at_start = false;
            }
            if ch == '\n' {
                k += 1;
                at_start = true;
            }
        }
        line += newlines;
        pos = r.end;
    }
    for ch in text[pos..].chars() {
        if at_start {
            out.push(line);
            at_start = false;
        }
        if ch == '\n' {
            line += 1;
            at_start = true;
        }
    }
    out
}

/// `outer` after `inner`: for each line of the last text, its line in the
/// first, given each pass's map (`inner` maps the middle text to the first,
/// `outer` the last to the middle).
pub(super) fn compose(inner: &[usize], outer: &[usize]) -> Vec<usize> {
    outer
        .iter()
        .map(|&l| inner.get(l.wrapping_sub(1)).copied().unwrap_or(l))
        .collect()
}

impl super::Migration {
    /// `diagnostics` of the migrated text, placed in the file as written
    /// (`original`): each at the line its line came from, at its column
    /// when that line is unchanged, else at the line's first column.
    pub fn diagnostics_as_written(
        &self,
        diagnostics: &noetl_core::diagnostic::Diagnostics,
        original: &str,
    ) -> noetl_core::diagnostic::Diagnostics {
        let migrated: Vec<&str> = self.text.lines().collect();
        let written: Vec<&str> = original.lines().collect();
        let mut out = diagnostics.clone();
        for d in &mut out.0 {
            let Some(span) = d.span.as_mut() else {
                continue;
            };
            let line = self.original_line(span.line);
            let same = migrated.get(span.line.wrapping_sub(1)) == written.get(line.wrapping_sub(1));
            if !same {
                span.col = 1;
            }
            span.offset = written
                .iter()
                .take(line.saturating_sub(1))
                .map(|l| l.len() + 1)
                .sum::<usize>()
                + span.col.saturating_sub(1);
            span.line = line;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str, from: &str, with: &str) -> (usize, usize, String) {
        let s = text.find(from).unwrap();
        (s, s + from.len(), with.to_string())
    }

    fn map(text: &str, edits: &[(usize, usize, String)]) -> Vec<usize> {
        let r: Vec<Replaced> = edits
            .iter()
            .map(|(s, e, w)| Replaced {
                start: *s,
                end: *e,
                with: w,
                order: None,
            })
            .collect();
        origin(text, &r)
    }

    #[test]
    fn untouched_lines_keep_their_number_and_added_lines_take_the_one_they_replace() {
        let text = "a: 1\ninput: 2\nc: 3\n";
        // A rename on a line keeps the numbering.
        assert_eq!(map(text, &[at(text, "input", "args")]), vec![1, 2, 3]);
        // Two lines written where one was: both are line 2.
        let grown = at(text, "input: 2\n", "args: 2\nspec: {}\n");
        assert_eq!(map(text, &[grown]), vec![1, 2, 2, 3]);
        // A line removed: the lines after it keep their own number.
        let gone = at(text, "input: 2\n", "");
        assert_eq!(map(text, &[gone]), vec![1, 3]);
        // An insertion in the middle of a line: the lines it adds are that line.
        let inserted = at(text, ": 3", ": 3\nd: 4");
        assert_eq!(map(text, &[inserted]), vec![1, 2, 3, 3]);
    }

    #[test]
    fn a_replacement_that_moves_lines_says_where_each_went() {
        let text = "a\nb\nc\nd\n";
        let s = text.find("b").unwrap();
        let moved = [Replaced {
            start: s,
            end: s + 4,
            with: "c\nb\n",
            order: Some(&[3, 2]),
        }];
        assert_eq!(origin(text, &moved), vec![1, 3, 2, 4]);
        assert_eq!(
            compose(&[1, 3, 2, 4], &[1, 2, 2, 3, 4]),
            vec![1, 3, 3, 2, 4]
        );
    }
}
