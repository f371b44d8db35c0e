//! The fields of one `kind: shell` task ([`ShellTask`]) and its timeout,
//! read from the rendered task config: plain functions, unit-tested.

use noetl_core::timeout::read_timeout;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

/// Default `spec.timeout` of a shell task (NoETL's default too).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The shell that runs scripts.
pub const SHELL: &str = "/bin/sh";

/// A task's fields could not be used (`shell.config`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Neither or both of `command` and `cmds`.
    #[error("a shell task needs exactly one of `command` (a script, or a list: the program and its arguments) and `cmds` (scripts run one after another); it has {0}")]
    Program(String),
    /// A field of the wrong shape.
    #[error("`{field}` of a shell task must be {want}, got {got}")]
    Field {
        /// The field.
        field: &'static str,
        /// What it must be.
        want: &'static str,
        /// What it is (JSON).
        got: String,
    },
    /// An `env` name a process cannot have.
    #[error("`env` name {0:?} is not a usable variable name (empty, or holding `=` or NUL)")]
    EnvName(String),
    /// `spec.timeout` unusable.
    #[error(transparent)]
    Timeout(#[from] noetl_core::timeout::TimeoutError),
}

/// One process to start: a program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// What the outcome and messages call it: the script's first line, or
    /// the argv joined by spaces (at most 120 characters).
    pub label: String,
    /// The program (`/bin/sh` for a script).
    pub program: String,
    /// Its arguments (`-c <script>` for a script).
    pub args: Vec<String>,
}

impl Program {
    /// A script run by `/bin/sh -c`.
    pub fn script(script: &str) -> Self {
        let first = script.trim().lines().next().unwrap_or_default();
        Self {
            label: shorten(first),
            program: SHELL.into(),
            args: vec!["-c".into(), script.into()],
        }
    }

    /// A program and its arguments, run without a shell.
    pub fn argv(argv: &[String]) -> Self {
        Self {
            label: shorten(&argv.join(" ")),
            program: argv[0].clone(),
            args: argv[1..].to_vec(),
        }
    }
}

fn shorten(s: &str) -> String {
    match s.char_indices().nth(120) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// The kind-specific fields of a `kind: shell` task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellTask {
    /// The processes to run, one after another until one fails.
    pub programs: Vec<Program>,
    /// Variables set on top of the executor's allow-list.
    pub env: Vec<(String, String)>,
    /// The working directory (default: the executor's).
    pub cwd: Option<PathBuf>,
    /// A non-zero exit status is an error outcome (default true).
    pub check: bool,
}

fn field_error(field: &'static str, want: &'static str, got: &Value) -> ConfigError {
    ConfigError::Field {
        field,
        want,
        got: got.to_string(),
    }
}

fn strings(field: &'static str, want: &'static str, v: &Value) -> Result<Vec<String>, ConfigError> {
    let Value::Array(items) = v else {
        return Err(field_error(field, want, v));
    };
    let out: Option<Vec<String>> = items
        .iter()
        .map(|x| x.as_str().map(str::to_string))
        .collect();
    match out {
        Some(out) if !out.is_empty() => Ok(out),
        _ => Err(field_error(field, want, v)),
    }
}

impl ShellTask {
    /// Read the task's fields from its rendered config (other fields, such
    /// as `name` or `desc`, are the runtime's and ignored here).
    pub fn from_config(config: &Map<String, Value>) -> Result<Self, ConfigError> {
        let given = |k: &str| config.get(k).filter(|v| !v.is_null());
        let programs = match (given("command"), given("cmds")) {
            (Some(Value::String(s)), None) if !s.trim().is_empty() => vec![Program::script(s)],
            (Some(v @ Value::Array(_)), None) => {
                let argv = strings("command", "a script or a non-empty list of strings", v)?;
                vec![Program::argv(&argv)]
            }
            (Some(v), None) => {
                return Err(field_error(
                    "command",
                    "a script or a non-empty list of strings",
                    v,
                ))
            }
            (None, Some(Value::String(s))) if !s.trim().is_empty() => vec![Program::script(s)],
            (None, Some(v)) => strings("cmds", "a non-empty list of scripts", v)?
                .iter()
                .map(|s| Program::script(s))
                .collect(),
            (None, None) => return Err(ConfigError::Program("neither".into())),
            (Some(_), Some(_)) => return Err(ConfigError::Program("both".into())),
        };
        let env = match given("env") {
            None => Vec::new(),
            Some(Value::Object(m)) => env_of(m)?,
            Some(v) => return Err(field_error("env", "a mapping of names to values", v)),
        };
        let cwd = match given("cwd") {
            None => None,
            Some(Value::String(s)) if !s.is_empty() => Some(PathBuf::from(s)),
            Some(v) => return Err(field_error("cwd", "a directory path", v)),
        };
        let check = match given("check") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) if s == "true" || s == "false" => s == "true",
            Some(v) => return Err(field_error("check", "a boolean", v)),
        };
        Ok(Self {
            programs,
            env,
            cwd,
            check,
        })
    }
}

/// `env` values as text: strings as they are, numbers and booleans
/// written out, objects and lists as JSON; a null drops the variable.
fn env_of(m: &Map<String, Value>) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(ConfigError::EnvName(k.clone()));
        }
        let text = match v {
            Value::Null => continue,
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out.push((k.clone(), text));
    }
    Ok(out)
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

    fn task(v: Value) -> Result<ShellTask, ConfigError> {
        ShellTask::from_config(v.as_object().unwrap())
    }

    #[test]
    fn a_string_command_is_a_script_and_a_list_is_an_argv() {
        let t = task(json!({"command": "echo hi\necho there"})).unwrap();
        assert_eq!(t.programs.len(), 1);
        assert_eq!(t.programs[0].program, "/bin/sh");
        assert_eq!(t.programs[0].args, ["-c", "echo hi\necho there"]);
        assert_eq!(t.programs[0].label, "echo hi");
        let t = task(json!({"command": ["printf", "%s", "a b"]})).unwrap();
        assert_eq!(t.programs[0].program, "printf");
        assert_eq!(t.programs[0].args, ["%s", "a b"]);
        assert_eq!(t.programs[0].label, "printf %s a b");
        assert!(t.check);
        assert!(t.env.is_empty() && t.cwd.is_none());
    }

    #[test]
    fn cmds_are_scripts_run_in_order() {
        let t = task(json!({"cmds": ["echo a", "echo b"]})).unwrap();
        let labels: Vec<&str> = t.programs.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(labels, ["echo a", "echo b"]);
        assert!(t.programs.iter().all(|p| p.program == SHELL));
        assert_eq!(task(json!({"cmds": "echo a"})).unwrap().programs.len(), 1);
    }

    #[test]
    fn exactly_one_program_field_is_required() {
        let e = task(json!({})).unwrap_err();
        assert_eq!(e, ConfigError::Program("neither".into()));
        assert!(e.to_string().contains("exactly one of `command`"), "{e}");
        let e = task(json!({"command": "a", "cmds": ["b"]})).unwrap_err();
        assert_eq!(e, ConfigError::Program("both".into()));
        for bad in [
            json!({"command": []}),
            json!({"command": [1]}),
            json!({"command": 3}),
        ] {
            let e = task(bad.clone()).unwrap_err();
            assert!(e.to_string().contains("`command`"), "{bad}: {e}");
        }
        assert!(task(json!({"cmds": []})).is_err());
        assert!(task(json!({"command": "   "})).is_err());
    }

    #[test]
    fn env_values_become_text_and_bad_names_are_refused() {
        let t = task(json!({"command": "env", "env": {"A": "x", "N": 3, "B": true, "J": {"k": 1}, "GONE": null}}))
            .unwrap();
        assert_eq!(
            t.env,
            [
                ("A".to_string(), "x".to_string()),
                ("N".into(), "3".into()),
                ("B".into(), "true".into()),
                ("J".into(), "{\"k\":1}".into())
            ]
        );
        let e = task(json!({"command": "env", "env": {"A=B": "x"}})).unwrap_err();
        assert_eq!(e, ConfigError::EnvName("A=B".into()));
        assert!(task(json!({"command": "env", "env": ["A"]})).is_err());
    }

    #[test]
    fn cwd_and_check_are_read() {
        let t = task(json!({"command": "pwd", "cwd": "/tmp", "check": false})).unwrap();
        assert_eq!(t.cwd, Some(PathBuf::from("/tmp")));
        assert!(!t.check);
        assert!(
            !task(json!({"command": "x", "check": "false"}))
                .unwrap()
                .check
        );
        assert!(task(json!({"command": "x", "check": "no"})).is_err());
        assert!(task(json!({"command": "x", "cwd": 1})).is_err());
    }

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
        assert!(timeout_of(&json!({"timeout": -1}), d).is_err());
        assert!(timeout_of(&json!({"timeout": "soon"}), d).is_err());
    }
}
