//! The shared engine and its bounded cache of compiled sources.

use super::cmp_rewrite::CMP_FN;
use super::text::text_form;
use super::*;

pub(super) const RESULT_VAR: &str = "__noetl_value";
const MAX_CACHED: usize = 4096;

/// How a source is compiled; also the loader-name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A whole template rendered to text.
    Text,
    /// One expression evaluated to a native value.
    Expr,
    /// One `when` expression, with lenient ordering comparisons.
    Cond,
}

impl Kind {
    pub(super) fn prefix(self) -> &'static str {
        match self {
            Kind::Text => "\u{1}text:",
            Kind::Expr => "\u{1}expr:",
            Kind::Cond => "\u{1}cond:",
        }
    }
}

/// One compiled source: its loader name and the top-level names it reads.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) roots: Vec<String>,
    /// Of `roots`, those the source tests for being defined somewhere
    /// (`x is defined`, `x | default(...)`): read knowing they may be
    /// missing, so not a typo to refuse ([`super::guards::guarded_in`]).
    pub(super) guarded: Vec<String>,
}

/// One generation of the cache: an environment whose loader maps our names
/// back to sources, and the per-source metadata. When the cache is full a
/// fresh generation replaces it (renders in flight keep the old one alive).
pub(super) struct Engine {
    pub(super) env: Environment<'static>,
    pub(super) builtins: BTreeSet<String>,
    pub(super) entries: RwLock<HashMap<String, Arc<Entry>>>,
}

pub(super) static ENGINE: OnceLock<RwLock<Arc<Engine>>> = OnceLock::new();

pub(super) fn engine() -> Arc<Engine> {
    let lock = ENGINE.get_or_init(|| RwLock::new(Arc::new(Engine::new())));
    lock.read().unwrap_or_else(|e| e.into_inner()).clone()
}

pub(super) fn rotate(full: &Arc<Engine>) {
    if let Some(lock) = ENGINE.get() {
        let mut current = lock.write().unwrap_or_else(|e| e.into_inner());
        if Arc::ptr_eq(&current, full) {
            *current = Arc::new(Engine::new());
        }
    }
}

impl Engine {
    pub(super) fn new() -> Self {
        let env = build_env();
        let builtins = env.globals().map(|(name, _)| name.to_string()).collect();
        Self {
            env,
            builtins,
            entries: RwLock::new(HashMap::new()),
        }
    }

    pub(super) fn entry(self: &Arc<Self>, kind: Kind, src: &str) -> Result<Arc<Entry>, MjError> {
        let name = format!("{}{src}", kind.prefix());
        if let Some(e) = self
            .entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
        {
            return Ok(e.clone());
        }
        let tmpl = self.env.get_template(&name)?;
        let mut roots: Vec<String> = tmpl
            .undeclared_variables(false)
            .into_iter()
            .filter(|r| !self.builtins.contains(r))
            .collect();
        roots.sort();
        let guarded = super::guards::guarded_in(&tmpl, &roots);
        let entry = Arc::new(Entry {
            name: name.clone(),
            roots,
            guarded,
        });
        let len = {
            let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
            entries.insert(name, entry.clone());
            entries.len()
        };
        if len >= MAX_CACHED {
            rotate(self);
        }
        Ok(entry)
    }
}

pub(super) fn loader(name: &str) -> Result<Option<String>, MjError> {
    if let Some(src) = name.strip_prefix(Kind::Text.prefix()) {
        return Ok(Some(src.to_string()));
    }
    if let Some(expr) = name.strip_prefix(Kind::Expr.prefix()) {
        return Ok(Some(wrap_expr(expr)));
    }
    if let Some(expr) = name.strip_prefix(Kind::Cond.prefix()) {
        let rewritten = cmp_rewrite::rewrite(expr, CMP_FN).unwrap_or_else(|| expr.to_string());
        return Ok(Some(wrap_expr(&rewritten)));
    }
    // `{% include %}` and friends: NoETL templates are self-contained.
    Ok(None)
}

pub(super) fn wrap_expr(expr: &str) -> String {
    format!("{{% set {RESULT_VAR} = ({expr}\n) %}}")
}

pub(super) fn build_env() -> Environment<'static> {
    let mut env = Environment::new();
    // Bounds the work of one render (nested loops over large ranges).
    env.set_fuel(Some(MAX_TEMPLATE_FUEL));
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_debug(false);
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_loader(loader);
    env.set_formatter(|out, state, value| match text_form(value)? {
        Some(text) => out.write_str(&text).map_err(MjError::from),
        None => minijinja::escape_formatter(out, state, value),
    });
    funcs::register(&mut env);
    env
}
