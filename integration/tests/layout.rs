//! The layout stays readable: no crate's modules import each other in a
//! cycle, at the top level or among the children of any module folder (a
//! pure item that two I/O modules share lives in a leaf module of its
//! own), no production function is over 100 lines, and no source file of
//! any crate is over 800 lines (tests aside). Read from the sources:
//! `crate::`, `super::` and `self::` paths (and their `{...}` groups) in
//! each module's code before its tests, comments aside.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use noetl_integration::repo_root;

/// Every crate of the workspace: the `src` folder of each `members` entry
/// of the root `Cargo.toml`, so a crate added anywhere is checked too.
fn crate_sources(root: &Path) -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let mut out: Vec<PathBuf> = workspace_members(&manifest)
        .into_iter()
        .map(|m| root.join(m).join("src"))
        .collect();
    for src in &out {
        assert!(
            src.is_dir(),
            "workspace member without src: {}",
            src.display()
        );
    }
    out.sort();
    out
}

/// The quoted entries of the `members = [...]` array of a workspace
/// manifest, comments aside.
fn workspace_members(manifest: &str) -> Vec<String> {
    let start = manifest
        .find("members = [")
        .expect("a workspace `members` array");
    let rest = &manifest[start + "members = [".len()..];
    let list = &rest[..rest.find(']').expect("the end of `members`")];
    list.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(','))
        .filter_map(|m| {
            m.trim()
                .strip_prefix('"')?
                .strip_suffix('"')
                .map(String::from)
        })
        .collect()
}

#[test]
fn every_workspace_member_is_checked() {
    let manifest = "[workspace]\nmembers = [\n  # libs\n  \"crates/a\", \"tools/b\",\n  \"c\" # last\n]\n[x]\ny = [\"no\"]\n";
    assert_eq!(workspace_members(manifest), ["crates/a", "tools/b", "c"]);
    let root = repo_root();
    let srcs = crate_sources(&root);
    for name in [
        "crates/migrate",
        "services/inprocess",
        "services/executors/transfer",
        "integration",
    ] {
        assert!(
            srcs.contains(&root.join(name).join("src")),
            "{name} not checked"
        );
    }
}

/// The code of a module file before its tests, without comments.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    // Up to the test module: a `#[cfg(test)]` item before it (a test-only
    // helper in an impl) must not hide what follows.
    let mut end = text.len();
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]") {
        let at = from + i;
        from = at + "#[cfg(test)]".len();
        let next = text[from..].trim_start();
        if next.starts_with("mod ") || next.starts_with("pub(crate) mod ") {
            end = at;
            break;
        }
    }
    text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module path of a source file under `src` (`lib.rs`/`main.rs`: the
/// crate root, `[]`; `a/b.rs` and `a/b/mod.rs`: `["a", "b"]`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    let root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root {
        parts.push(stem.to_string());
    }
    parts
}

/// The paths `code` names from `start` (`crate::`, `super::`, `self::`),
/// each as its segments, `{...}` groups expanded.
fn named_paths(code: &str, start: &str) -> Vec<Vec<String>> {
    fn ident(s: &str) -> (String, &str) {
        let w: String = s
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let rest = &s[w.len()..];
        (w, rest)
    }
    /// The paths of `s` (just after `prefix::`), expanding groups.
    fn parse(prefix: &[String], s: &str, out: &mut Vec<Vec<String>>) {
        let s = s.trim_start();
        if let Some(group) = s.strip_prefix('{') {
            let (mut depth, mut item_start, mut end) = (0i32, 0usize, group.len());
            let mut items = Vec::new();
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        end = i;
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&group[item_start..i]);
                        item_start = i + 1;
                    }
                    _ => {}
                }
            }
            items.push(&group[item_start..end]);
            for item in items {
                parse(prefix, item, out);
            }
            return;
        }
        let (w, rest) = ident(s);
        if w.is_empty() {
            out.push(prefix.to_vec());
            return;
        }
        let mut path = prefix.to_vec();
        path.push(w);
        match rest.strip_prefix("::") {
            Some(rest) => parse(&path, rest, out),
            None => out.push(path),
        }
    }
    let mut out = Vec::new();
    let pattern = format!("{start}::");
    let mut from = 0;
    while let Some(i) = code[from..].find(&pattern) {
        let at = from + i;
        from = at + pattern.len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `my_crate::`, `itself::`
        }
        parse(&[start.to_string()], &code[from..], &mut out);
    }
    out
}

/// Where a path named in the module `at` (a file's module path; `is_root`:
/// the file is the module itself, `foo.rs`, not a child) leads, from the
/// crate root.
fn resolve(at: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => at.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop()?;
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// Per module folder (its path from the crate root; `[]`: the crate
/// root), its child modules → the sibling children each names.
fn module_graphs(src: &Path) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let files = rust_files(src);
    let paths: Vec<(Vec<String>, &PathBuf)> =
        files.iter().map(|f| (module_path(src, f), f)).collect();
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (m, _) in &paths {
        if let Some((child, parent)) = m.split_last() {
            graphs
                .entry(parent.to_vec())
                .or_default()
                .entry(child.clone())
                .or_default();
        }
    }
    for (m, f) in &paths {
        let code = code_of(f);
        let mut targets = Vec::new();
        for start in ["crate", "super", "self"] {
            for p in named_paths(&code, start) {
                targets.extend(resolve(m, &p));
            }
        }
        for t in targets {
            // The deepest folder holding both `m` and `t` as different children.
            let common = m.iter().zip(&t).take_while(|(a, b)| a == b).count();
            if common >= m.len() || common >= t.len() {
                continue; // a module naming itself, a child or an ancestor
            }
            let folder = m[..common].to_vec();
            let Some(graph) = graphs.get_mut(&folder) else {
                continue;
            };
            let (from, to) = (&m[common], &t[common]);
            if graph.contains_key(to) {
                graph.get_mut(from).unwrap().insert(to.clone());
            }
        }
    }
    graphs
}

/// A cycle of `graph`, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in &graph[m] {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_a_module_cycle() {
    let root = repo_root();
    let crates = crate_sources(&root);
    assert!(crates.len() >= 15, "too few crates found: {crates:?}");
    let mut cycles = Vec::new();
    for src in &crates {
        for (folder, graph) in module_graphs(src) {
            if let Some(c) = find_cycle(&graph) {
                let at = match folder.is_empty() {
                    true => String::new(),
                    false => format!(" (in {})", folder.join("::")),
                };
                cycles.push(format!("{}{at}: {}", src.display(), c.join(" → ")));
            }
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn nested_paths_resolve_to_the_sibling_they_name() {
    let at: Vec<String> = ["commands", "exec"].map(String::from).to_vec();
    let code =
        "use super::{why::WhyArgs, common::{MeshArgs, x}};\nlet _ = crate::commands::retry::B;";
    let mut got: Vec<Vec<String>> = Vec::new();
    for start in ["crate", "super", "self"] {
        for p in named_paths(code, start) {
            got.extend(resolve(&at, &p));
        }
    }
    let want = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    assert!(got.contains(&want("commands::why::WhyArgs")), "{got:?}");
    assert!(got.contains(&want("commands::common::MeshArgs")), "{got:?}");
    assert!(got.contains(&want("commands::retry::B")), "{got:?}");
    assert_eq!(
        module_path(Path::new("src"), Path::new("src/commands/why/mod.rs")),
        want("commands::why")
    );
}

#[test]
fn the_cycle_finder_finds_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The production code of a source file: its lines before `#[cfg(test)]`
/// (a file that is itself a test module — `tests.rs` — has none).
fn production_lines(path: &Path) -> Vec<String> {
    if path.file_name().is_some_and(|n| n == "tests.rs") {
        return Vec::new();
    }
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .map(str::to_string)
        .collect()
}

/// The functions of `lines` longer than `limit` lines (from the `fn` line
/// to its closing brace): name, first line (1-based), length. Braces in
/// strings, chars and comments are ignored.
fn long_functions(lines: &[String], limit: usize) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = fn_name(&lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut opened, mut j) = (0i64, false, i);
        while j < lines.len() {
            let code = code_part(&lines[j]);
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        let len = j - i + 1;
        if opened && len > limit {
            out.push((name, i + 1, len));
        }
        i += 1;
    }
    out
}

/// The name of the function a line declares, if it declares one.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
        rest = rest.strip_prefix("async ").unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// A line without its comment and the contents of its string and char
/// literals.
fn code_part(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '/' if chars.peek() == Some(&'/') => break,
            '\'' => {
                // A char literal ('{', '\n'); a lifetime has no closing quote.
                let ahead: Vec<char> = chars.clone().take(3).collect();
                match ahead.as_slice() {
                    ['\\', _, '\''] => {
                        chars.nth(2);
                    }
                    [_, '\'', ..] => {
                        chars.nth(1);
                    }
                    _ => out.push(c),
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn no_production_function_is_over_100_lines() {
    let root = repo_root();
    let mut long = Vec::new();
    // Production code: the libraries and services (test support and the
    // benchmark in `integration/` aside).
    let production = crate_sources(&root)
        .into_iter()
        .filter(|src| !src.starts_with(root.join("integration")));
    for src in production {
        for file in rust_files(&src) {
            for (name, line, len) in long_functions(&production_lines(&file), 100) {
                let at = file
                    .strip_prefix(&root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                long.push(format!("{at}:{line} fn {name}: {len} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over 100 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_source_file_is_over_800_lines() {
    let root = repo_root();
    let mut big = Vec::new();
    for src in crate_sources(&root) {
        for file in rust_files(&src) {
            let at = file
                .strip_prefix(&root)
                .unwrap_or(&file)
                .display()
                .to_string();
            let n = production_lines(&file).len();
            if n > 800 {
                big.push(format!("{at}: {n} lines"));
            }
        }
    }
    assert!(
        big.is_empty(),
        "source files over 800 lines (tests aside):\n{}",
        big.join("\n")
    );
}

#[test]
fn the_length_checks_see_a_long_function_and_braces_in_strings() {
    let mut lines = vec!["pub async fn big(x: u8) -> u8 {".to_string()];
    lines.extend((0..100).map(|i| format!("    let s{i} = \"}}\"; // }}")));
    lines.push("}".into());
    lines.push("fn small() { let c = '{'; }".into());
    assert_eq!(
        long_functions(&lines, 100),
        vec![("big".to_string(), 1, 102)]
    );
    assert!(long_functions(&lines, 102).is_empty());
    assert_eq!(
        fn_name("    pub(crate) async fn go<'a>(x: &'a str)"),
        Some("go".into())
    );
    assert_eq!(fn_name("let f = fn_ptr;"), None);
}
