//! The names a template reads knowing they may be missing: what the
//! unknown-name check of a value template lets through. Read from the
//! instructions the engine compiles the source to.

use std::collections::BTreeSet;

use minijinja::machinery::{get_compiled_template, Instruction, Instructions};
use minijinja::Template;

/// Of `roots`, the names `tmpl` tests for being defined: a lookup of the
/// name, maybe with attributes, items and constant arguments after it,
/// that goes straight into the `defined` / `undefined` test or the
/// `default` (`d`) filter. `{{ r.status if r is defined else 'none' }}`
/// reads `r` knowing it may be missing.
pub(super) fn guarded_in(tmpl: &Template<'_, '_>, roots: &[String]) -> Vec<String> {
    if roots.is_empty() {
        return Vec::new();
    }
    let compiled = get_compiled_template(tmpl);
    let mut guarded = BTreeSet::new();
    for instructions in std::iter::once(&compiled.instructions).chain(compiled.blocks.values()) {
        guarded_lookups(instructions, &mut guarded);
    }
    (roots.iter())
        .filter(|r| guarded.contains(r.as_str()))
        .cloned()
        .collect()
}

/// Every name `instructions` look up and then test for being defined:
/// after the lookup, attributes (`.a`) and constant items (`['a']`), then
/// the test, or the filter with only its own constant arguments between
/// (`x | default('y')`, not `x ~ 'a' | default('y')`, whose filter applies
/// to `'a'`).
fn guarded_lookups<'a>(instructions: &Instructions<'a>, out: &mut BTreeSet<&'a str>) {
    let mut at = 0;
    while let Some(instruction) = instructions.get(at) {
        at += 1;
        let Instruction::Lookup(name) = instruction else {
            continue;
        };
        let mut next = at;
        loop {
            match (instructions.get(next), instructions.get(next + 1)) {
                (Some(Instruction::GetAttr(_)), _) => next += 1,
                (Some(Instruction::LoadConst(_)), Some(Instruction::GetItem)) => next += 2,
                _ => break,
            }
        }
        let mut consts = 0;
        while let Some(Instruction::LoadConst(_)) = instructions.get(next + consts) {
            consts += 1;
        }
        let guarded = match instructions.get(next + consts) {
            Some(Instruction::PerformTest("defined" | "undefined", ..)) => consts == 0,
            Some(Instruction::ApplyFilter("default" | "d", args, _)) => {
                args.map_or(consts == 0, |n| u32::from(n) == consts + 1)
            }
            _ => false,
        };
        if guarded {
            out.insert(*name);
        }
    }
}
