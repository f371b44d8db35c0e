//! The filters and tests a template applies that the engine does not have:
//! minijinja looks each one up only when a render reaches it, so a
//! template with `| to_json` compiles and fails later, at run time. Read
//! from the instructions the engine compiles the source to.

use minijinja::machinery::{get_compiled_template, Instruction, Instructions};

use super::engine::{engine, Engine, Kind};
use super::*;

/// What an unknown name is applied as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NameKind {
    /// `value | name`.
    Filter,
    /// `value is name`.
    Test,
}

impl NameKind {
    /// `filter` or `test`, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            NameKind::Filter => "filter",
            NameKind::Test => "test",
        }
    }
}

/// A filter or test a template applies that the engine does not have.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnknownName {
    /// Filter or test.
    pub kind: NameKind,
    /// The name as written.
    pub name: String,
}

/// The filters and tests `src`, compiled as `kind`, applies that the
/// engine lacks, sorted, each once; empty when it does not compile (that
/// is the syntax check's to report).
pub(super) fn unknown_in(kind: Kind, src: &str) -> Vec<UnknownName> {
    let engine = engine();
    let Ok(entry) = engine.entry(kind, src) else {
        return Vec::new();
    };
    let Ok(tmpl) = engine.env.get_template(&entry.name) else {
        return Vec::new();
    };
    let compiled = get_compiled_template(&tmpl);
    let mut applied = BTreeSet::new();
    for instructions in std::iter::once(&compiled.instructions).chain(compiled.blocks.values()) {
        applied_names(instructions, &mut applied);
    }
    applied
        .into_iter()
        .filter(|(kind, name)| !has(&engine, *kind, name))
        .map(|(kind, name)| UnknownName {
            kind,
            name: name.to_string(),
        })
        .collect()
}

/// Every filter and test `instructions` apply.
fn applied_names<'a>(instructions: &Instructions<'a>, out: &mut BTreeSet<(NameKind, &'a str)>) {
    let mut at = 0;
    while let Some(instruction) = instructions.get(at) {
        match instruction {
            Instruction::ApplyFilter(name, ..) => {
                out.insert((NameKind::Filter, *name));
            }
            Instruction::PerformTest(name, ..) => {
                out.insert((NameKind::Test, *name));
            }
            _ => {}
        }
        at += 1;
    }
}

/// Whether the engine has filter or test `name`: applied to `none`, it
/// fails for some other reason than being unknown, or not at all.
fn has(engine: &Engine, kind: NameKind, name: &str) -> bool {
    let probe = match kind {
        NameKind::Filter => format!("{{{{ none | {name} }}}}"),
        NameKind::Test => format!("{{{{ none is {name} }}}}"),
    };
    let unknown = match kind {
        NameKind::Filter => ErrorKind::UnknownFilter,
        NameKind::Test => ErrorKind::UnknownTest,
    };
    !matches!(engine.env.render_str(&probe, ()), Err(e) if e.kind() == unknown)
}
