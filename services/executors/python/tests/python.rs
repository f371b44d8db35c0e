//! The python tool against a real interpreter.

use std::time::{Duration, Instant};

use noetl_core::tool::{Tool, ToolCall};
use noetl_core::{Outcome, OutcomeStatus};
use noetl_tool_python::{PythonConfig, PythonTool};
use serde_json::{json, Value};

fn call(config: Value, spec: Value) -> ToolCall {
    ToolCall {
        spec,
        prev: json!({"rows": [1, 2, 3]}),
        iter: Some(json!({"item": "x", "index": 4})),
        ctx: json!({"seen": true}),
        workload: json!({"n": 10}),
        ..ToolCall::new(
            "python",
            config.as_object().cloned().expect("config is an object"),
        )
    }
}

async fn run(config: Value) -> Outcome {
    run_with(PythonTool::new(), config, json!({})).await
}

async fn run_with(tool: PythonTool, config: Value, spec: Value) -> Outcome {
    tool.call(call(config, spec)).await.outcome
}

fn err_kind(o: &Outcome) -> &str {
    o.error.as_ref().map(|e| e.kind.as_str()).unwrap_or("")
}

#[tokio::test]
async fn global_result_sees_every_input() {
    let o = run(json!({
        "code": "result = {'sum': sum(_prev['rows']) + workload['n'], 'a': args['a'], 'a2': a, \
                  'item': iter['item'], 'index': iter['index'], 'seen': ctx['seen']}",
        "args": {"a": "A"},
    }))
    .await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(
        o.result,
        json!({"sum": 16, "a": "A", "a2": "A", "item": "x", "index": 4, "seen": true})
    );
}

/// NoETL's python tasks read their inputs as `input_data` and may return
/// their result from the top level.
#[tokio::test]
async fn noetl_s_input_data_and_a_top_level_return_work() {
    let o = run(json!({
        "code": "x = input_data.get('a', 0)\nif x > 1:\n    return {'big': x, 'label': \"\"\"a\n  b\"\"\"}\nreturn {'small': x}",
        "args": {"a": 5},
    }))
    .await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(o.result, json!({"big": 5, "label": "a\n  b"}));
    // Falling through, its `result` is the result.
    let o = run(json!({
        "code": "def twice(v):\n    return 2 * v\nresult = twice(input_data['a'])\nif False:\n    return 0",
        "args": {"a": 4},
    }))
    .await;
    assert_eq!(o.result, json!(8), "{o:?}");
    // An input called `input_data` is that input.
    let o = run(json!({"code": "result = input_data", "args": {"input_data": 3}})).await;
    assert_eq!(o.result, json!(3));
    // Other syntax errors are still errors.
    let o = run(json!({"code": "x = (\nreturn 1"})).await;
    assert_eq!(err_kind(&o), "python.exception");
}

/// NoETL's python tool starts every task's globals with `json`, `os`,
/// `datetime` and `uuid`; its playbooks use them without importing them.
#[tokio::test]
async fn noetl_s_modules_are_bound_without_an_import() {
    let o = run(json!({
        "code": "result = [json.dumps({'a': 1}), os.path.join('a', 'b'), datetime.date(2026, 1, 2).isoformat(), len(str(uuid.uuid4()))]",
    }))
    .await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(o.result, json!(["{\"a\": 1}", "a/b", "2026-01-02", 36]));
    // An input of the same name is that input.
    let o = run(json!({"code": "result = json", "args": {"json": "mine"}})).await;
    assert_eq!(o.result, json!("mine"), "{o:?}");
}

#[tokio::test]
async fn main_is_called_with_or_without_args() {
    let o = run(json!({"code": "def main():\n    return [1, 'two', None]\n"})).await;
    assert_eq!(o.result, json!([1, "two", null]), "{o:?}");
    let o = run(json!({
        "code": "def main(a):\n    return a['x'] * 2\n",
        "args": {"x": 21},
    }))
    .await;
    assert_eq!(o.result, json!(42), "{o:?}");
    // args default to {}.
    let o = run(json!({"code": "def main(a):\n    return a\n"})).await;
    assert_eq!(o.result, json!({}), "{o:?}");
    // Parameters named after keys of args get those values (NoETL's
    // convention); a default fills a missing one.
    let o = run(json!({
        "code": "def main(message, times=2):\n    return message * times\n",
        "args": {"message": "ab", "unused": 1},
    }))
    .await;
    assert_eq!(o.result, json!("abab"), "{o:?}");
    let o = run(json!({
        "code": "def main(x, y):\n    return x + y\n",
        "args": {"x": 40, "y": 2},
    }))
    .await;
    assert_eq!(o.result, json!(42), "{o:?}");
    // Neither result nor main: None.
    let o = run(json!({"code": "x = 1"})).await;
    assert_eq!((o.status, o.result), (OutcomeStatus::Ok, Value::Null));
}

#[tokio::test]
async fn exceptions_are_typed_errors() {
    let o = run(json!({"code": "def main():\n    raise KeyError('missing')\n"})).await;
    assert_eq!(o.status, OutcomeStatus::Error);
    assert_eq!(err_kind(&o), "python.exception");
    let e = o.error.as_ref().unwrap();
    assert_eq!(e.message, "KeyError: 'missing'");
    assert!(!e.retryable);
    assert_eq!(o.helpers["py"]["exception_type"], "KeyError");
    let tb = o.helpers["py"]["traceback"].as_str().unwrap();
    assert!(
        tb.contains("<task>") && tb.contains("raise KeyError"),
        "{tb}"
    );
    assert!(!tb.contains("<string>"), "runner frames are hidden: {tb}");

    let o = run(json!({"code": "def broken(:"})).await;
    assert_eq!(o.helpers["py"]["exception_type"], "SyntaxError", "{o:?}");

    let o = run(json!({"code": "import sys\nsys.exit(3)"})).await;
    assert_eq!(o.helpers["py"]["exception_type"], "SystemExit", "{o:?}");
}

#[tokio::test]
async fn unserialisable_results_are_result_errors() {
    let o = run(json!({"code": "result = {1, 2}"})).await;
    assert_eq!(err_kind(&o), "python.result", "{o:?}");
    assert!(o.error.unwrap().message.contains("not JSON-serialisable"));
    let o = run(json!({"code": "result = float('nan')"})).await;
    assert_eq!(err_kind(&o), "python.result", "{o:?}");
}

#[tokio::test]
async fn prints_do_not_break_the_protocol() {
    let o = run(json!({
        "code": "import os, sys\nprint('hello')\nprint('{\"ok\": false}')\n\
                 print('oops', file=sys.stderr)\nos.write(1, b'raw fd write\\n')\n\
                 os.system('echo from a subprocess')\nresult = 'fine'",
    }))
    .await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(o.result, json!("fine"));
    let py = &o.helpers["py"];
    assert_eq!(py["stdout"], "hello\n{\"ok\": false}\n");
    let stderr = py["stderr"].as_str().unwrap();
    assert!(stderr.contains("oops"), "{stderr}");
    assert!(stderr.contains("raw fd write"), "{stderr}");
    assert!(stderr.contains("from a subprocess"), "{stderr}");
}

#[tokio::test]
async fn output_is_bounded() {
    let o = run(json!({"code": "print('x' * 100000)\nresult = 1"})).await;
    let out = o.helpers["py"]["stdout"].as_str().unwrap();
    assert!(
        out.len() < 4200 && out.contains("truncated"),
        "{}",
        out.len()
    );
}

#[tokio::test]
async fn timeout_kills_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let late = dir.path().join("late");
    let code = format!(
        "import time\ntime.sleep(1.5)\nopen({:?}, 'w').write('too late')\nresult = 1",
        late.display().to_string()
    );
    let started = Instant::now();
    let o = run_with(
        PythonTool::new(),
        json!({"code": code}),
        json!({"timeout": {"read": 0.3}}),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(1400),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err_kind(&o), "timeout", "{o:?}");
    assert!(o.error.as_ref().unwrap().retryable);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        !late.exists(),
        "the killed process must not have gone on running"
    );
}

#[tokio::test]
async fn missing_interpreter_is_unavailable() {
    let tool = PythonTool::with_config(PythonConfig {
        interpreter: "/nonexistent/python3".into(),
        ..PythonConfig::default()
    });
    let o = run_with(tool, json!({"code": "result = 1"}), json!({})).await;
    assert_eq!(err_kind(&o), "python.unavailable", "{o:?}");
    assert!(o.error.unwrap().message.contains("/nonexistent/python3"));
}

#[tokio::test]
async fn bad_task_config_is_a_config_error() {
    let o = run(json!({"code": "result = 1", "agrs": {}})).await;
    assert_eq!(err_kind(&o), "python.config", "{o:?}");
    let o = run_with(
        PythonTool::new(),
        json!({"code": "result = 1"}),
        json!({"timeout": "never"}),
    )
    .await;
    assert_eq!(err_kind(&o), "python.config", "{o:?}");
}

#[test]
fn code_is_not_rendered() {
    assert_eq!(PythonTool::new().raw_fields(), &["code"]);
    assert_eq!(PythonTool::new().kind(), "python");
}

#[tokio::test]
async fn warm_interpreters_are_reused_with_fresh_globals() {
    let tool = PythonTool::new();
    let pid =
        "import os\nresult = {'pid': os.getpid(), 'had_leak': 'leak' in globals()}\nleak = 'x'";
    let first = run_with(tool.clone(), json!({"code": pid}), json!({})).await;
    let second = run_with(tool.clone(), json!({"code": pid}), json!({})).await;
    assert_eq!(first.status, OutcomeStatus::Ok, "{first:?}");
    assert_eq!(
        first.result["pid"], second.result["pid"],
        "the second task reused the warm interpreter"
    );
    assert_eq!(
        second.result["had_leak"], false,
        "globals are fresh per task"
    );
    assert_eq!(tool.idle_interpreters(), tool.config().warm.max(1));
}

/// A task's changes to the environment and the working directory do not
/// reach the next task in the same interpreter (of another execution,
/// whose step resolved no secret to redact), on success and on error,
/// nor the processes it starts.
#[tokio::test]
async fn the_environment_and_cwd_are_put_back_after_each_task() {
    use noetl_tool_python::runner::PoolLimits;

    let pool = pool_with(PoolLimits {
        max_idle: 1,
        lanes: 0,
        ..PoolLimits::default()
    });
    let run = |code: &'static str| {
        let pool = pool.clone();
        async move {
            let out = pool
                .run(line_of(code, &json!({})), Duration::from_secs(30))
                .await
                .unwrap();
            out.response
        }
    };
    let look = "import os, subprocess\n\
                result = {'pid': os.getpid(), 'env': os.environ.get('NOETL_LEAK'), \
                'home': os.environ.get('HOME'), 'cwd': os.getcwd(), \
                'child': subprocess.run(['sh', '-c', 'echo \"$NOETL_LEAK\"'], \
                capture_output=True, text=True).stdout.strip()}";
    let before = run(look).await;
    assert!(before.ok, "{before:?}");
    for (how, code) in [
        (
            "set",
            "import os\nos.environ['NOETL_LEAK'] = 's3cret-1'\nos.environ.pop('HOME', None)\n\
             os.chdir('/')\nresult = os.getpid()",
        ),
        (
            "set, then raised",
            "import os\nos.environ['NOETL_LEAK'] = 's3cret-2'\nos.chdir('/')\nraise ValueError('x')",
        ),
        (
            "rebound os.environ",
            "import os\nos.environ['NOETL_LEAK'] = 's3cret-3'\nos.environ = {'NOETL_LEAK': 's3cret-3'}",
        ),
    ] {
        run(code).await;
        let after = run(look).await;
        assert!(after.ok, "{how}: {after:?}");
        assert_eq!(
            after.result["pid"], before.result["pid"],
            "{how}: the same interpreter served both"
        );
        assert_eq!(after.result["env"], Value::Null, "{how}: {after:?}");
        assert_eq!(after.result["child"], "", "{how}: {after:?}");
        assert_eq!(after.result["home"], before.result["home"], "{how}");
        assert_eq!(after.result["cwd"], before.result["cwd"], "{how}");
    }
}

#[tokio::test]
async fn interpreters_are_warm_before_the_first_task() {
    let tool = PythonTool::with_config(PythonConfig {
        warm: 3,
        ..PythonConfig::default()
    });
    // Started with the tool, before any task.
    assert_eq!(tool.idle_interpreters(), 3);
    assert_eq!(tool.spawned_interpreters(), 3);
    let warm = tool.idle_interpreter_pids();
    assert_eq!(warm.len(), 3);
    let o = run_with(
        tool.clone(),
        json!({"code": "import os\nresult = os.getpid()"}),
        json!({}),
    )
    .await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    let pid = o.result.as_u64().unwrap() as u32;
    assert!(warm.contains(&pid), "task ran in {pid}, warm were {warm:?}");
    assert_eq!(
        tool.spawned_interpreters(),
        3,
        "no interpreter was started for it"
    );
    assert_eq!(tool.idle_interpreters(), 3);
}

#[test]
fn outside_a_runtime_nothing_is_started() {
    let tool = PythonTool::with_config(PythonConfig {
        warm: 3,
        ..PythonConfig::default()
    });
    assert_eq!(tool.spawned_interpreters(), 0);
}

/// One request line of `code` with `args`.
fn line_of(code: &str, args: &Value) -> Vec<u8> {
    noetl_tool_python::runner::Request {
        code,
        args,
        libs: &[],
        prev: &Value::Null,
        iter: &Value::Null,
        ctx: &Value::Null,
        workload: &Value::Null,
    }
    .to_line()
}

/// An interpreter that served its `max_uses` tasks is killed, and its
/// replacement is started then, beside the tasks: the next task finds it
/// idle and warm rather than waiting for a start.
#[tokio::test]
async fn a_used_up_interpreter_is_replaced_before_the_next_task() {
    use noetl_tool_python::runner::{Pool, PoolLimits};

    let pool = pool_with(PoolLimits {
        max_idle: 4,
        max_uses: 3,
        ..PoolLimits::default()
    });
    let pid = |pool: Pool| async move {
        let out = pool
            .run(
                line_of("import os\nresult = os.getpid()", &json!({})),
                Duration::from_secs(30),
            )
            .await
            .unwrap();
        assert!(out.response.ok, "{:?}", out.response);
        out.response.result.as_u64().unwrap() as u32
    };
    let first: Vec<u32> = [
        pid(pool.clone()).await,
        pid(pool.clone()).await,
        pid(pool.clone()).await,
    ]
    .into();
    assert!(
        first.iter().all(|p| *p == first[0]),
        "one interpreter served three: {first:?}"
    );
    assert_eq!(
        pool.spawned(),
        2,
        "the third task's end started the replacement"
    );
    let idle = pool.idle_pids();
    assert_eq!(idle.len(), 1, "{idle:?}");
    assert_ne!(idle[0], first[0]);
    let next = pid(pool.clone()).await;
    assert_eq!(next, idle[0], "the next task ran in the replacement");
    assert_eq!(pool.spawned(), 2);
    let proc_dir = std::path::Path::new("/proc").join(first[0].to_string());
    let deadline = Instant::now() + Duration::from_secs(5);
    while proc_dir.exists()
        && std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(
            Instant::now() < deadline,
            "the used-up interpreter {} is still running",
            first[0]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A loop's iterations run the same code: it is compiled once per
/// interpreter, and each run still gets its own inputs and globals; code
/// that does not compile fails every time it is sent.
#[tokio::test]
async fn the_same_code_runs_again_with_its_own_inputs_and_a_bad_one_fails_each_time() {
    let tool = PythonTool::new();
    let code = "seen = globals().get('seen', 0) + 1\nresult = [i * i, seen]";
    let top_return = "return i + 1";
    let runs = (0..5)
        .map(|i| (code, i, json!([i * i, 1])))
        .chain((0..3).map(|i| (top_return, i, json!(i + 1))));
    for (code, i, want) in runs {
        let o = run_with(
            tool.clone(),
            json!({"code": code, "args": {"i": i}}),
            json!({}),
        )
        .await;
        assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
        assert_eq!(o.result, want, "{code:?}, run {i}");
    }
    for _ in 0..2 {
        let o = run_with(tool.clone(), json!({"code": "x = ("}), json!({})).await;
        assert_eq!(err_kind(&o), "python.exception", "{o:?}");
        assert!(
            o.error.as_ref().unwrap().message.contains("SyntaxError"),
            "{o:?}"
        );
    }
}

#[tokio::test]
async fn a_timed_out_interpreter_is_killed_and_replaced() {
    let tool = PythonTool::new();
    let pid = json!({"code": "import os\nresult = os.getpid()"});
    let before = run_with(tool.clone(), pid.clone(), json!({})).await.result;
    let slow = run_with(
        tool.clone(),
        json!({"code": "import os, time\nprint(os.getpid())\ntime.sleep(30)"}),
        json!({"timeout": 0.5}),
    )
    .await;
    assert_eq!(err_kind(&slow), "timeout", "{slow:?}");
    // The killed interpreter was the warm one; the next task gets a new one.
    let after = run_with(tool.clone(), pid, json!({})).await;
    assert_eq!(after.status, OutcomeStatus::Ok, "{after:?}");
    assert_ne!(after.result, before, "a fresh interpreter after the kill");
    // Killed and reaped (allow the reaper a moment).
    let proc_dir = std::path::Path::new("/proc").join(before.to_string());
    let deadline = Instant::now() + Duration::from_secs(5);
    while proc_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "the timed-out interpreter {before} is still there"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sealed: an interpreter sees only the variables of its pool's
/// environment, not the executor's secret key or NATS and cloud
/// credentials, and cannot read the executor's own environment or memory
/// through `/proc` either.
#[tokio::test]
async fn interpreters_see_neither_secrets_nor_the_executors_environment() {
    use noetl_tool_python::env::{child_env, seal_process};
    use noetl_tool_python::runner::{Pool, PoolLimits, PoolParams, Request};
    use std::ffi::OsString;

    let key = "5a1e".repeat(16);
    let mut parent: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (k, v) in [
        ("NOETL_SECRET_KEY", key.as_str()),
        ("NOETL_SECRET_KEY_FILE", "/run/secrets/noetl-key"),
        ("AWS_SECRET_ACCESS_KEY", "aws-Secret-8841"),
        ("NOETL_NATS_PASSWORD", "nats-Pw-7713"),
        ("TEAM_SETTING", "blue"),
    ] {
        parent.push((k.into(), v.into()));
    }
    let listed = vec![
        "TEAM_SETTING".to_string(),
        "AWS_SECRET_ACCESS_KEY".to_string(),
    ];
    let sealed = child_env(parent, &listed);
    assert_eq!(sealed.refused, ["AWS_SECRET_ACCESS_KEY"]);
    assert!(seal_process(), "prctl(PR_SET_DUMPABLE) failed");
    let pool = Pool::new(PoolParams {
        interpreter: "python3".into(),
        env: sealed.vars,
        limits: PoolLimits::default(),
    });
    let code = r#"
import os
try:
    parent = open('/proc/%d/environ' % os.getppid(), 'rb').read().decode('utf-8', 'replace')
except OSError as e:
    parent = 'refused: ' + type(e).__name__
try:
    open('/proc/%d/mem' % os.getppid(), 'rb').read(1)
    mem = 'read'
except OSError as e:
    mem = 'refused: ' + type(e).__name__
result = {'env': dict(os.environ), 'parent': parent, 'mem': mem, 'euid': os.geteuid()}
"#;
    let empty = json!({});
    let line = Request {
        code,
        args: &empty,
        libs: &[],
        prev: &Value::Null,
        iter: &Value::Null,
        ctx: &empty,
        workload: &empty,
    }
    .to_line();
    let out = pool.run(line, Duration::from_secs(30)).await.unwrap();
    assert!(out.response.ok, "{:?}", out.response);
    let r = out.response.result;
    let env = r["env"].as_object().unwrap();
    assert_eq!(env["TEAM_SETTING"], "blue", "{r}");
    assert!(env.contains_key("PATH"), "{r}");
    let all = r.to_string();
    for secret in [
        key.as_str(),
        "/run/secrets/noetl-key",
        "aws-Secret-8841",
        "nats-Pw-7713",
        "NOETL_SECRET_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "NOETL_NATS_PASSWORD",
    ] {
        assert!(!all.contains(secret), "{secret} reached the task: {r}");
    }
    // Root (CAP_SYS_PTRACE) reads any process's /proc entries: the image
    // and the chart run the executor as uid 10001, where this holds.
    if r["euid"] != 0 {
        assert_eq!(r["parent"], "refused: PermissionError", "{r}");
        assert_eq!(r["mem"], "refused: PermissionError", "{r}");
    }
}

#[tokio::test]
async fn libs_are_imported_before_the_code_runs() {
    let o = run(json!({
        "code": "result = {'j': json.dumps([1]), 'sep': pp.sep, 'year': dt(2024, 5, 1).year, 'top': os.path.basename('/a/b')}",
        "libs": {"json": "json", "pp": "os.path", "dt": {"from": "datetime", "import": "datetime"}, "os.path": "os.path"},
    }))
    .await;
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    assert_eq!(
        o.result,
        json!({"j": "[1]", "sep": "/", "year": 2024, "top": "b"})
    );
}

#[tokio::test]
async fn a_missing_lib_fails_the_task_naming_every_missing_module() {
    let o = run(json!({
        "code": "result = 'ran'",
        "libs": {"json": "json", "nx": "noetl_no_such_module_1", "g": {"from": "noetl_no_such_pkg.sub", "import": "thing"}},
    }))
    .await;
    assert_eq!(o.status, OutcomeStatus::Error, "{o:?}");
    assert_eq!(err_kind(&o), "python.libs", "{o:?}");
    let msg = &o.error.as_ref().unwrap().message;
    assert!(
        msg.contains("noetl_no_such_module_1") && msg.contains("noetl_no_such_pkg.sub"),
        "{msg}"
    );
    assert!(!msg.contains("json,"), "{msg}");
    assert_eq!(o.result, Value::Null, "the code must not have run: {o:?}");

    let o = run(json!({"code": "result = 1", "libs": {"x": 5}})).await;
    assert_eq!(err_kind(&o), "python.config", "{o:?}");
    assert!(
        o.error.as_ref().unwrap().message.contains("`libs.x`"),
        "{o:?}"
    );
}

/// A pool of `limits` running `python3` with the executor's sealed
/// environment.
fn pool_with(limits: noetl_tool_python::runner::PoolLimits) -> noetl_tool_python::runner::Pool {
    noetl_tool_python::runner::Pool::new(noetl_tool_python::runner::PoolParams {
        interpreter: "python3".into(),
        env: noetl_tool_python::env::child_env(std::env::vars_os(), &[]).vars,
        limits,
    })
}

/// Limits with `lanes` lanes and a line wait long enough that no task
/// leaves the line, however slow the machine.
fn lanes(lanes: usize) -> noetl_tool_python::runner::PoolLimits {
    noetl_tool_python::runner::PoolLimits {
        lanes,
        line_wait: Duration::from_secs(60),
        ..Default::default()
    }
}

const LONG: Duration = Duration::from_secs(60);

/// Submit `code` with `args` to `pool` and return its response (a run
/// error fails the test).
async fn submit(
    pool: &noetl_tool_python::runner::Pool,
    code: &str,
    args: Value,
) -> noetl_tool_python::runner::RunOutput {
    pool.submit(code, line_of(code, &args), LONG)
        .await
        .unwrap_or_else(|e| panic!("{code:?} with {args}: {e}"))
}

/// Run `code` alone until one run is fast (a first run in a new
/// interpreter can be slow on a loaded machine), as a loop's first
/// iterations do.
async fn run_until_fast(
    pool: &noetl_tool_python::runner::Pool,
    code: &str,
    args: Value,
) -> noetl_tool_python::runner::RunOutput {
    for _ in 0..50 {
        let out = submit(pool, code, args.clone()).await;
        if out.took < noetl_tool_python::runner::FAST {
            return out;
        }
    }
    panic!(
        "{code:?} never ran in under {:?}",
        noetl_tool_python::runner::FAST
    );
}

/// After a source ran fast once, its next tasks go to the lanes: a loop's
/// 64 iterations at once run in two interpreters, not 64, and each still
/// gets its own answer and its own fd 2 output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_source_s_tasks_share_the_lanes_and_keep_their_own_answers() {
    let pool = pool_with(lanes(2));
    let code = "import os\nos.write(2, b'<%d>' % n)\nresult = [n * n, os.getpid()]";
    let first = run_until_fast(&pool, code, json!({"n": 0})).await;
    assert_eq!(first.process_stderr, "<0>");
    let outs = futures::future::join_all((1..=64).map(|n| {
        let pool = pool.clone();
        async move { (n, submit(&pool, code, json!({ "n": n })).await) }
    }))
    .await;
    let mut pids = std::collections::BTreeSet::new();
    for (n, out) in outs {
        assert!(out.response.ok, "{:?}", out.response);
        assert_eq!(out.response.result[0], json!(n * n));
        assert_eq!(out.process_stderr, format!("<{n}>"), "task {n}'s own fd 2");
        pids.insert(out.response.result[1].as_u64().unwrap());
    }
    assert!(pids.len() <= 2, "two lanes served 64 tasks: {pids:?}");
    assert!(pool.spawned() <= 2, "spawned {}", pool.spawned());
}

/// A task that turns out slow holds up at most the three tasks sent behind
/// it: the others leave the line after the line wait and run in
/// interpreters of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_task_in_a_lane_does_not_hold_up_the_line() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let pool = pool_with(noetl_tool_python::runner::PoolLimits {
        lanes: 1,
        line_wait: Duration::from_millis(50),
        ..Default::default()
    });
    let code = "import time\ntime.sleep(s)\nresult = n";
    run_until_fast(&pool, code, json!({"s": 0, "n": 0})).await;
    let finished = AtomicUsize::new(0);
    let order = futures::future::join_all((0..=20).map(|n| {
        let (pool, finished) = (pool.clone(), &finished);
        async move {
            let s = if n == 0 { 4.0 } else { 0.0 };
            let out = submit(&pool, code, json!({"s": s, "n": n})).await;
            assert_eq!(out.response.result, json!(n), "{:?}", out.response);
            finished.fetch_add(1, Ordering::SeqCst)
        }
    }))
    .await;
    let before_slow = order[1..].iter().filter(|&&at| at < order[0]).count();
    assert!(
        before_slow >= 17,
        "only {before_slow} of 20 fast tasks ended before the slow one: {order:?}"
    );
}

/// A task that times out in a lane kills its interpreter; the task sent
/// behind it never began, so it goes back in line and runs in the next
/// interpreter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_in_a_lane_sends_the_task_behind_it_back_in_line() {
    let pool = pool_with(lanes(1));
    let code = "import time\ntime.sleep(s)\nresult = n";
    run_until_fast(&pool, code, json!({"s": 0, "n": 0})).await;
    let hung = pool.submit(
        code,
        line_of(code, &json!({"s": 30, "n": 1})),
        Duration::from_millis(300),
    );
    let behind = submit(&pool, code, json!({"s": 0, "n": 2}));
    let after = submit(&pool, code, json!({"s": 0, "n": 3}));
    let (hung, behind, after) = tokio::join!(hung, behind, after);
    assert!(
        matches!(hung, Err(noetl_tool_python::runner::RunError::Timeout(_))),
        "{hung:?}"
    );
    assert_eq!(behind.response.result, json!(2), "{:?}", behind.response);
    assert_eq!(after.response.result, json!(3), "{:?}", after.response);
    assert_eq!(
        pool.spawned(),
        2,
        "the killed interpreter was replaced once"
    );
}

/// A task cancelled while it runs in a lane (its caller gone, as when its
/// execution is cancelled) is stopped: its interpreter is killed, as a
/// task running alone is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_task_in_a_lane_is_stopped() {
    let pool = pool_with(lanes(1));
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let code =
        "import os, time\nopen(path, 'w').write(str(os.getpid()))\ntime.sleep(s)\nresult = n";
    let args = |s: f64, n: u32| json!({"path": pid_file.to_str().unwrap(), "s": s, "n": n});
    run_until_fast(&pool, code, args(0.0, 0)).await;
    let cancelled = tokio::time::timeout(
        Duration::from_millis(500),
        pool.submit(code, line_of(code, &args(30.0, 1)), LONG),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "still running when cancelled: {cancelled:?}"
    );
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let proc_dir = std::path::Path::new("/proc").join(pid.trim());
    let deadline = Instant::now() + Duration::from_secs(5);
    while proc_dir.exists()
        && std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(
            Instant::now() < deadline,
            "the cancelled task's interpreter {pid} runs on"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let next = submit(&pool, code, args(0.0, 2)).await;
    assert_eq!(next.response.result, json!(2), "{:?}", next.response);
}
