//! The shell tool against real processes: output, exit status, sealing,
//! the working directory, and that no process outlives its task or its
//! executor.

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use noetl_core::tool::{Tool, ToolCall};
use noetl_core::{Outcome, OutcomeStatus};
use noetl_tool_shell::{ShellTool, OUTPUT_LIMIT};
use serde_json::{json, Value};

fn call(config: Value, spec: Value) -> ToolCall {
    ToolCall {
        spec,
        ..ToolCall::new("shell", config.as_object().cloned().expect("an object"))
    }
}

fn tool() -> ShellTool {
    ShellTool::with_env(std::env::vars_os(), &[])
}

async fn run(config: Value) -> Outcome {
    tool().call(call(config, json!({}))).await.outcome
}

fn err_kind(o: &Outcome) -> &str {
    o.error.as_ref().map(|e| e.kind.as_str()).unwrap_or("")
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet),
/// waiting up to 10 s for it to get there.
fn ends(pid: u32) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // `pid (comm) S ...`: the state follows the last `)`.
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.trim().chars().next());
        if matches!(state, None | Some('Z') | Some('X')) {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn a_script_runs_in_sh_and_its_output_and_status_are_the_result() {
    let o = run(json!({"command": "echo out; echo err >&2; X=2; echo $((X + 3))"})).await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(
        o.result,
        json!({"returncode": 0, "stdout": "out\n5\n", "stderr": "err\n"})
    );
    assert_eq!(o.helpers["shell"]["returncode"], 0);
    assert_eq!(
        o.helpers["shell"]["command"],
        "echo out; echo err >&2; X=2; echo $((X + 3))"
    );
}

#[tokio::test]
async fn a_list_is_an_argv_run_without_a_shell() {
    let o = run(json!({"command": ["printf", "[%s][%s]", "$HOME", "a b; echo no"]})).await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(o.result["stdout"], "[$HOME][a b; echo no]");
    let o = run(json!({"command": ["/no/such/program"]})).await;
    assert_eq!(err_kind(&o), "shell.spawn", "{o:?}");
    assert!(o.error.unwrap().message.contains("/no/such/program"));
}

#[tokio::test]
async fn a_non_zero_status_is_an_error_outcome_unless_check_is_false() {
    let o = run(json!({"command": "echo partial; echo bad >&2; exit 3"})).await;
    assert_eq!(err_kind(&o), "shell.exit", "{o:?}");
    let e = o.error.clone().unwrap();
    assert!(!e.retryable);
    assert!(e.message.contains("exited with status 3"), "{}", e.message);
    assert_eq!(o.result["returncode"], 3);
    assert_eq!(o.result["stdout"], "partial\n");
    assert_eq!(o.result["stderr"], "bad\n");
    assert_eq!(o.helpers["shell"]["returncode"], 3);

    let o = run(json!({"command": "exit 3", "check": false})).await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(o.result["returncode"], 3);

    let o = run(json!({"command": "kill -TERM $$"})).await;
    assert_eq!(err_kind(&o), "shell.exit", "{o:?}");
    assert_eq!(o.result["returncode"], -15);
    assert!(o.error.unwrap().message.contains("killed by signal 15"));
}

#[tokio::test]
async fn cmds_run_in_order_and_stop_at_the_first_failure() {
    let o = run(json!({"cmds": ["echo a", "echo b; exit 4", "echo c"]})).await;
    assert_eq!(err_kind(&o), "shell.exit", "{o:?}");
    assert_eq!(o.result["stdout"], "a\nb\n");
    assert_eq!(o.result["returncode"], 4);
    assert_eq!(o.helpers["shell"]["command"], "echo b; exit 4");
    let o = run(json!({"cmds": ["echo a", "echo b"]})).await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(o.result["stdout"], "a\nb\n");
    let o = run(json!({"cmds": ["echo a"], "command": "echo b"})).await;
    assert_eq!(err_kind(&o), "shell.config", "{o:?}");
}

/// Sealed like a python interpreter: the allow-list, the listed names and
/// the task's `env`; never the secret key, NATS or cloud credentials, even
/// when an operator lists them.
#[tokio::test]
async fn a_process_sees_the_allow_list_and_its_env_but_no_secret() {
    let mut parent: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (k, v) in [
        ("NOETL_SECRET_KEY", "5a1e5a1e"),
        ("NOETL_NATS_PASSWORD", "nats-Pw-7713"),
        ("NATS_URL", "nats://secret-host:4222"),
        ("AWS_SECRET_ACCESS_KEY", "aws-Secret-8841"),
        ("TEAM_SETTING", "blue"),
        ("UNLISTED", "hidden"),
    ] {
        parent.push((k.into(), v.into()));
    }
    let listed = ["TEAM_SETTING".to_string(), "AWS_*".to_string()];
    let tool = ShellTool::with_env(parent, &listed);
    let config = json!({"command": "env", "env": {"TASK_VAR": "t1", "COUNT": 2}});
    let o = tool.call(call(config, json!({}))).await.outcome;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    let env = o.result["stdout"].as_str().unwrap();
    for want in ["TEAM_SETTING=blue", "TASK_VAR=t1", "COUNT=2", "PATH="] {
        assert!(
            env.lines().any(|l| l.starts_with(want)),
            "{want} missing:\n{env}"
        );
    }
    for secret in [
        "5a1e5a1e",
        "nats-Pw-7713",
        "secret-host",
        "aws-Secret-8841",
        "hidden",
    ] {
        assert!(!env.contains(secret), "{secret} leaked:\n{env}");
    }
    // Nor through the executor's /proc (it is made non-dumpable). Root
    // (CAP_SYS_PTRACE) reads any process's /proc entries: the image and the
    // chart run the executor as uid 10001, where this holds.
    let script = "if [ \"$(id -u)\" = 0 ]; then echo root; \
                  elif cat /proc/$PPID/environ >/dev/null 2>&1; then echo read; else echo refused; fi";
    let o = tool
        .call(call(json!({ "command": script }), json!({})))
        .await
        .outcome;
    let seen = o.result["stdout"].as_str().unwrap_or_default();
    assert!(seen == "root\n" || seen == "refused\n", "{o:?}");
}

#[tokio::test]
async fn cwd_sets_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().canonicalize().unwrap();
    let o = run(json!({"command": ["pwd", "-P"], "cwd": dir.path()})).await;
    assert_eq!(o.result["stdout"], format!("{}\n", real.display()), "{o:?}");
    let o = run(json!({"command": "pwd", "cwd": real.join("missing")})).await;
    assert_eq!(err_kind(&o), "shell.config", "{o:?}");
    assert!(o.error.unwrap().message.contains("missing"));
}

/// Past `spec.timeout` the whole process group is killed, what it started
/// in the background too, and the output so far is kept.
#[tokio::test]
async fn a_timeout_kills_the_process_group() {
    let config = json!({"command": "sleep 300 & echo $!; wait"});
    let o = tool()
        .call(call(config, json!({"timeout": 0.5})))
        .await
        .outcome;
    assert_eq!(err_kind(&o), "timeout", "{o:?}");
    assert!(o.error.as_ref().unwrap().retryable);
    assert!(o.result["returncode"].is_null());
    let pid: u32 = o.result["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(ends(pid), "background sleep {pid} outlived the timeout");
}

/// A command that leaves a process running in the background ends when it
/// exits: the stray process is killed (it would hold the output open).
#[tokio::test]
async fn what_a_command_leaves_running_ends_with_it() {
    let config = json!({"command": "sleep 300 & echo $!"});
    let o = tool()
        .call(call(config, json!({"timeout": 60})))
        .await
        .outcome;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    let pid: u32 = o.result["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(ends(pid), "background sleep {pid} outlived its command");
}

/// Dropping the call (the step-run's deadline aborts it) kills the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_call_kills_the_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let config =
        json!({"command": "echo $$ > \"$PIDFILE\"; exec sleep 300", "env": {"PIDFILE": pidfile}});
    let handle = tokio::spawn(tool().call(call(config, json!({}))));
    let pid = wait_for_pid(&pidfile);
    handle.abort();
    let _ = handle.await;
    assert!(ends(pid), "sleep {pid} outlived its aborted call");
}

#[tokio::test]
async fn output_is_bounded() {
    let o = run(json!({"command": "head -c 2000000 /dev/zero | tr '\\0' a"})).await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    let out = o.result["stdout"].as_str().unwrap();
    let note = format!("\n...[truncated {} bytes]", 2_000_000 - OUTPUT_LIMIT);
    assert!(out.ends_with(&note), "{}", &out[out.len() - 60..]);
    assert_eq!(out.len(), OUTPUT_LIMIT + note.len());
}

#[tokio::test]
async fn bad_fields_are_a_config_error_naming_them() {
    for (config, spec, want) in [
        (json!({}), json!({}), "exactly one of `command`"),
        (
            json!({"command": "true", "env": {"A=B": 1}}),
            json!({}),
            "A=B",
        ),
        (
            json!({"command": "true"}),
            json!({"timeout": -1}),
            "spec.timeout",
        ),
    ] {
        let o = tool().call(call(config.clone(), spec)).await.outcome;
        assert_eq!(err_kind(&o), "shell.config", "{config}: {o:?}");
        assert!(o.error.unwrap().message.contains(want), "{config}");
    }
}

fn wait_for_pid(file: &Path) -> u32 {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(pid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < until, "no pid in {}", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

const HELPER_PIDFILE: &str = "NOETL_SHELL_TEST_PIDFILE";

/// Not a test: the "executor" of
/// [`the_process_dies_with_its_executor`], run in a process of its own.
#[test]
#[ignore = "run by the_process_dies_with_its_executor"]
fn executor_helper_runs_a_long_command() {
    let Some(pidfile) = std::env::var_os(HELPER_PIDFILE) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = json!({"command": "echo $$ > \"$PIDFILE\"; exec sleep 300",
                        "env": {"PIDFILE": pidfile.to_string_lossy()}});
    rt.block_on(tool().call(call(config, json!({}))));
}

/// An executor killed with SIGKILL (no chance to clean up) takes its
/// task's process with it (PR_SET_PDEATHSIG).
#[test]
fn the_process_dies_with_its_executor() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let mut executor = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "executor_helper_runs_a_long_command",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(HELPER_PIDFILE, &pidfile)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = wait_for_pid(&pidfile);
    assert!(!ends_now(pid), "the command {pid} is not running");
    executor.kill().unwrap(); // SIGKILL
    executor.wait().unwrap();
    assert!(ends(pid), "sleep {pid} outlived its executor");
}

fn ends_now(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty()
        || stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim().starts_with('Z'))
}
