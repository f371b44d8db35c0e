//! Configuration of the python tool: the replica-wide settings
//! ([`PythonConfig`]) and the fields of one task ([`PythonTask`]).

use noetl_core::field_rules::python_import;
use noetl_core::timeout::read_timeout;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

/// Default `spec.timeout` of a python task.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Interpreters started when the tool is created, by default.
pub const DEFAULT_WARM: usize = 2;

/// Replica-wide settings of the python tool.
#[derive(Debug, Clone)]
pub struct PythonConfig {
    /// The interpreter to run (`NOETL_PYTHON`, default `python3` on `PATH`).
    pub interpreter: PathBuf,
    /// Timeout of a task whose effective spec sets none.
    pub default_timeout: Duration,
    /// Interpreters started as soon as the tool is created (inside a tokio
    /// runtime), so the first tasks do not pay interpreter start-up
    /// (`NOETL_PYTHON_WARM`, default [`DEFAULT_WARM`]; at most the pool's
    /// idle limit). Set it to the executor's `--concurrency` to have every
    /// slot warm from the start.
    pub warm: usize,
    /// Variables passed to interpreters on top of [`crate::env::ALLOWED`]
    /// (`NOETL_PYTHON_ENV`, comma-separated names, or prefixes ending in
    /// `*`). Names of [`crate::env::NEVER_PREFIXES`] are refused.
    pub pass_env: Vec<String>,
    /// Interpreters that run fast code (a loop's small tasks) back to back,
    /// each given its next request while it runs one (`NOETL_PYTHON_LANES`,
    /// default [`default_lanes`]: one per core; 0 gives every task an
    /// interpreter of its own).
    pub lanes: usize,
}

/// One lane per core the executor may use.
pub fn default_lanes() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            interpreter: PathBuf::from("python3"),
            default_timeout: DEFAULT_TIMEOUT,
            warm: DEFAULT_WARM,
            pass_env: Vec::new(),
            lanes: default_lanes(),
        }
    }
}

impl PythonConfig {
    /// Defaults overlaid with `NOETL_PYTHON`, `NOETL_PYTHON_ENV`,
    /// `NOETL_PYTHON_WARM` and `NOETL_PYTHON_LANES` (an unusable number is
    /// logged and its default kept: a replica still serves).
    pub fn from_env() -> Self {
        let mut c = Self::from_env_without_numbers();
        for (name, slot) in c.counts() {
            match count_from_env(name) {
                Ok(Some(n)) => *slot = n,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, default = *slot, "python tool: using the default")
                }
            }
        }
        c
    }

    /// Defaults overlaid with the variables of [`PythonConfig::from_env`],
    /// or why one of them is unusable.
    pub fn try_from_env() -> Result<Self, ConfigError> {
        let mut c = Self::from_env_without_numbers();
        for (name, slot) in c.counts() {
            if let Some(n) = count_from_env(name)? {
                *slot = n;
            }
        }
        Ok(c)
    }

    /// The numbers of interpreters the environment may set, by variable.
    fn counts(&mut self) -> [(&'static str, &mut usize); 2] {
        [
            ("NOETL_PYTHON_WARM", &mut self.warm),
            ("NOETL_PYTHON_LANES", &mut self.lanes),
        ]
    }

    fn from_env_without_numbers() -> Self {
        let mut c = Self::default();
        if let Some(p) = std::env::var_os("NOETL_PYTHON").filter(|p| !p.is_empty()) {
            c.interpreter = PathBuf::from(p);
        }
        if let Some(list) = std::env::var_os("NOETL_PYTHON_ENV") {
            c.pass_env = crate::env::parse_list(&list);
        }
        c
    }
}

/// The number of interpreters a variable sets, if it is set.
fn count_from_env(name: &'static str) -> Result<Option<usize>, ConfigError> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| ConfigError::Count { name, value: v }),
        Err(_) => Ok(None),
    }
}

/// A task's configuration could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The task fields do not match [`PythonTask`].
    #[error("invalid python task: {0}")]
    Task(String),
    /// `spec.timeout` unusable.
    #[error(transparent)]
    Timeout(#[from] noetl_core::timeout::TimeoutError),
    /// `NOETL_PYTHON_WARM` or `NOETL_PYTHON_LANES` is not a number of
    /// interpreters.
    #[error("{name} must be a number of interpreters (0 or more), got {value:?}")]
    Count {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
}

/// The kind-specific fields of a `kind: python` task.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonTask {
    /// The Python source (not template-rendered). Sets a global `result` or
    /// defines `main()`.
    pub code: String,
    /// Inputs, rendered; visible as `args` (and each identifier key as a
    /// global of its own). `{}` when absent.
    #[serde(default)]
    pub args: Option<Value>,
    /// Modules imported before the code runs (NoETL's `libs`): `alias:
    /// module` (`np: numpy`, `json: json`) or `alias: {from, import}`.
    #[serde(default)]
    pub libs: Option<Map<String, Value>>,
    /// Free text.
    #[serde(default)]
    pub desc: Option<String>,
}

/// One entry of `libs`: bind `alias` to `module` (or to `name` imported
/// from `module`) in the task's globals.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Import {
    /// The global the code uses.
    pub alias: String,
    /// The module (dotted path).
    pub module: String,
    /// `from module import name`, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The imports of a task's `libs` (`alias: module` or `alias: {from,
/// import}`), or why one entry is unusable.
pub fn imports(libs: &Map<String, Value>) -> Result<Vec<Import>, ConfigError> {
    let bad = |alias: &str, why: &str| {
        ConfigError::Task(format!(
            "`libs.{alias}` {why}: write `alias: module` or `alias: {{from: module, import: name}}`"
        ))
    };
    libs.iter()
        .map(|(alias, v)| {
            let import = python_import(alias, v).map_err(|e| bad(alias, e.why()))?;
            Ok(Import {
                alias: alias.clone(),
                module: import.module,
                name: import.name,
            })
        })
        .collect()
}

impl PythonTask {
    /// Read the task fields from a rendered task config.
    pub fn from_config(config: &Map<String, Value>) -> Result<Self, ConfigError> {
        serde_json::from_value(Value::Object(config.clone()))
            .map_err(|e| ConfigError::Task(e.to_string()))
    }
}

/// The timeout of a task from its effective spec (`timeout: N`, or
/// `{read: N}`; docs/tools.md), `default` when absent.
pub fn timeout_of(spec: &Value, default: Duration) -> Result<Duration, ConfigError> {
    Ok(read_timeout(spec, default)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timeouts_parse_in_every_shape() {
        let d = Duration::from_secs(7);
        assert_eq!(timeout_of(&json!({}), d).unwrap(), d);
        assert_eq!(
            timeout_of(&json!({"timeout": 1.5}), d).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            timeout_of(&json!({"timeout": {"connect": 1, "read": 3}}), d).unwrap(),
            Duration::from_secs(3)
        );
        assert_eq!(
            timeout_of(&json!({"timeout": "2"}), d).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(
            timeout_of(&json!({"timeout": {"connect": 1}}), d).unwrap(),
            d
        );
        assert!(matches!(
            timeout_of(&json!({"timeout": -1}), d),
            Err(ConfigError::Timeout(_))
        ));
        assert!(timeout_of(&json!({"timeout": "soon"}), d).is_err());
    }

    #[test]
    fn libs_become_imports_and_bad_entries_are_named() {
        let libs = json!({"json": "json", "pp": "os.path", "dt": {"from": "datetime", "import": "datetime"}, "os.path": "os.path"});
        let got = imports(libs.as_object().unwrap()).unwrap();
        let want = |alias: &str, module: &str, name: Option<&str>| Import {
            alias: alias.into(),
            module: module.into(),
            name: name.map(str::to_string),
        };
        assert_eq!(
            got,
            vec![
                want("json", "json", None),
                want("pp", "os.path", None),
                want("dt", "datetime", Some("datetime")),
                want("os.path", "os.path", None),
            ]
        );
        for bad in [
            json!({"np": 3}),
            json!({"1x": "json"}),
            json!({"x": "a b"}),
            json!({"x": {"from": "datetime"}}),
        ] {
            let e = imports(bad.as_object().unwrap()).unwrap_err().to_string();
            assert!(e.contains("`libs."), "{e}");
        }
    }

    #[test]
    fn task_fields_are_checked() {
        let ok = json!({"code": "result = 1", "args": {"a": 1}});
        let t = PythonTask::from_config(ok.as_object().unwrap()).unwrap();
        assert_eq!(t.code, "result = 1");
        let typo = json!({"code": "x", "agrs": {}});
        let e = PythonTask::from_config(typo.as_object().unwrap()).unwrap_err();
        assert!(e.to_string().contains("agrs"), "{e}");
        let missing = json!({});
        let e = PythonTask::from_config(missing.as_object().unwrap()).unwrap_err();
        assert!(e.to_string().contains("code"), "{e}");
    }
}
